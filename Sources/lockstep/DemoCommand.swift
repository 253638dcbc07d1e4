import ArgumentParser
import Foundation
import Lockstep
import LockstepClient
import LockstepDemo
import LockstepProtocol
import LockstepTesting
import LockstepTool
import ZeroMQ

#if canImport(Glibc)
import Glibc
#endif

/// The whole system on one machine: a daemon in a temporary folder, client processes that dispatch to the
/// example stores while holding replicas, one daemon crash and one stalled replica on the way, an optimistic
/// conflict between two clients that one of them rolls back, and a check that every replica ends on the daemon's
/// digest.
struct DemoCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo",
        abstract: "Run lockstepd and client processes with replicas; crash the daemon midway; check convergence.",
        discussion: """
            Starts lockstepd (found next to this executable) on its defaults in a temporary folder, then \
            --clients processes, each holding a replica of every example store and dispatching --actions \
            generated actions. At 20% one client is stopped (SIGSTOP) until the daemon has dropped events for \
            it, so its replicas must repair a gap; at 50% the daemon is killed (SIGKILL) and restarted. Then \
            clients 1 and 2, holding the same numbers list, each delete its last number optimistically at one \
            instant: the daemon accepts one delete and rejects the other, which its client rolls back. Exits 0 \
            only if the rejected delete was rolled back and every replica of every client ends on the daemon's \
            digest.
            """
    )

    @Option(help: "How many client processes.")
    var clients = 4

    @Option(help: "How many actions each client dispatches.")
    var actions = 2_500

    @Option(help: "Seed of the clients' action generators.")
    var seed: UInt64 = 1

    @Flag(help: "Keep the temporary folder (journal and logs) afterwards.")
    var keep = false

    @Flag(help: "Print the summary as one JSON object.")
    var json = false

    func validate() throws {
        guard (1...64).contains(clients) else { throw ValidationError("--clients must be 1...64, got \(clients)") }
        guard (1...10_000_000).contains(actions) else {
            throw ValidationError("--actions must be 1...10000000, got \(actions)")
        }
    }

    func run() async throws {
        let (lockstep, lockstepd) = try executablesBesideThis(build: "swift build")
        let run = try DemoRun(
            lockstep: lockstep,
            lockstepd: lockstepd,
            clients: clients,
            actions: actions,
            seed: seed,
            quiet: json
        )
        let summary: DemoSummary
        do {
            summary = try run.play()
        } catch {
            printError("lockstep demo: \(error); the journal and logs are in \(run.folder.path)")
            throw ExitCode.failure
        }
        if json {
            print(String(decoding: try JSONEncoder().encode(summary), as: UTF8.self))
        } else {
            summary.print()
        }
        if summary.converged, !keep {
            try? FileManager.default.removeItem(at: run.folder)
        } else {
            printError("lockstep demo: the journal and logs are in \(run.folder.path)")
        }
        if !summary.converged { throw ExitCodes.diverged }
    }
}
