import Foundation
import LockstepTesting
import Testing

/// A child process, once gone, leaves nothing open in the process that started it: the fault suite starts
/// thousands.
@Suite struct ChildProcessTests {
    /// What every open descriptor of this process is open on. Other tests run beside this one, so it looks for the
    /// children's own pipes (each `pipe:[N]` a new inode) and error files (each a new path), not at a count.
    static func openTargets() -> Set<String> {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        return Set(
            names.compactMap { try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\($0)") }
        )
    }

    @Test func aFinishedChildLeavesNoDescriptorOpen() throws {
        var targets: [String] = []
        for index in 0..<40 {
            let child = try ChildProcess(
                executable: URL(fileURLWithPath: index.isMultiple(of: 2) ? "/bin/true" : "/bin/sleep"),
                index.isMultiple(of: 2) ? [] : ["30"],
                input: !index.isMultiple(of: 2)
            )
            targets += child.descriptorTargets
            if index.isMultiple(of: 2) {
                #expect(try child.finish(within: .seconds(10)).status == 0)
            } else {
                child.kill()
            }
        }
        // An output pipe and an error file each, and an input pipe for the sleepers: all open while they lived.
        #expect(targets.count == 40 * 2 + 20, "\(targets.count) descriptors seen")
        let left = Self.openTargets().intersection(targets)
        #expect(left.isEmpty, "still open: \(left.sorted().prefix(5))")
    }
}
