import Foundation
import LockstepTesting
import Testing

/// A child process, once gone, leaves nothing open in the process that started it: the fault suite starts
/// thousands.
@Suite struct ChildProcessTests {
    static func openDescriptors() -> Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? 0
    }

    @Test func aFinishedChildLeavesNoDescriptorOpen() throws {
        // One first: what Foundation keeps once made (its child-watching source) is not a leak.
        _ = try ChildProcess(executable: URL(fileURLWithPath: "/bin/true"), []).finish(within: .seconds(10))
        let before = Self.openDescriptors()
        for _ in 0..<40 {
            let child = try ChildProcess(executable: URL(fileURLWithPath: "/bin/true"), [])
            #expect(try child.finish(within: .seconds(10)).status == 0)
        }
        for _ in 0..<40 {
            let child = try ChildProcess(executable: URL(fileURLWithPath: "/bin/sleep"), ["30"], input: true)
            child.kill()
        }
        #expect(Self.openDescriptors() - before <= 4, "\(Self.openDescriptors() - before) more descriptors open")
    }
}
