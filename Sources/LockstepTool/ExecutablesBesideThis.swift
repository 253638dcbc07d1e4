import ArgumentParser
import Foundation

/// This `lockstep` and the `lockstepd` built beside it, for the commands that run the daemon (demo, bench).
package func executablesBesideThis(build: String) throws -> (lockstep: URL, lockstepd: URL) {
    let lockstep = currentExecutable()
    let lockstepd = lockstep.deletingLastPathComponent().appendingPathComponent("lockstepd")
    guard FileManager.default.isExecutableFile(atPath: lockstepd.path) else {
        throw CommandFailure("no lockstepd next to this lockstep (\(lockstepd.path)); build both: \(build)")
    }
    return (lockstep, lockstepd)
}
