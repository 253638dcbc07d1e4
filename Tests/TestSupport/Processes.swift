import Foundation
import LockstepTesting

// Helpers every test target uses to run this package's executables as real processes, with every wait
// bounded and every process killed and reaped when it is done with.

/// A new empty directory under the system's temporary directory; the caller removes it.
public func temporaryDirectory(_ label: String) throws -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("lockstep-\(label)-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}

/// One of this package's executables, built next to the test bundle.
public func productURL(_ name: String) -> URL { packageExecutable(name) }

/// Runs one of this package's executables to its end, waiting at most `timeout`.
public func runProduct(_ name: String, _ arguments: [String], timeout: Duration = .seconds(60)) throws -> ProcessOutput
{
    try ChildProcess(executable: productURL(name), arguments).finish(within: timeout)
}

/// The same, for async tests: the process runs and is waited for on a thread of its own (`offPool`), not on one
/// of the cooperative pool.
public func runProduct(
    _ name: String,
    _ arguments: [String],
    timeout: Duration = .seconds(60)
) async throws -> ProcessOutput {
    try await offPool("runProduct") { try runProduct(name, arguments, timeout: timeout) }
}

extension ChildProcess {
    /// Starts one of this package's executables.
    public convenience init(_ name: String, _ arguments: [String]) throws {
        try self.init(executable: productURL(name), arguments)
    }
}

/// Whether every thread of process `pid` has stopped (state `T` in `/proc/PID/task/*/stat`): the kernel stops a
/// process's threads after `kill(SIGSTOP)` returns, and on a busy machine they may run on for milliseconds — long
/// enough to read a request meant to find the process stopped. `false` when the process is gone.
public func everyThreadStopped(_ pid: Int32) -> Bool {
    let tasks = "/proc/\(pid)/task"
    let threads = (try? FileManager.default.contentsOfDirectory(atPath: tasks)) ?? []
    let states = threads.compactMap { thread in
        // The state is the field after the name, which is in parentheses and may hold spaces.
        (try? String(contentsOfFile: "\(tasks)/\(thread)/stat", encoding: .utf8))
            .flatMap { $0.split(separator: ")").last?.split(separator: " ").first }
    }
    return !states.isEmpty && states.count == threads.count && states.allSatisfy { $0 == "T" }
}

/// The connections `daemon` has accepted on its ipc socket of `endpoint`, each as the number of bytes in its
/// receive queue, which the daemon has not read: from `ss -x -p`, whose Recv-Q of the daemon's end of a
/// connection says so whether or not the daemon runs. That end is a socket of the daemon's process whose local
/// address is the path the daemon bound (relative to its folder unless configured otherwise, so shared by the
/// daemons of other folders: the process tells them apart).
public func acceptedConnections(_ daemon: DaemonProcess, _ endpoint: String) async throws -> [Int] {
    let path = String(endpoint.dropFirst("ipc://".count))
    let process = "pid=\(daemon.processIdentifier),"
    let output = try await ChildProcess(executable: URL(fileURLWithPath: "/usr/bin/ss"), ["-H", "-x", "-p"])
        .finish(within: .seconds(10))
    // `ss -H -x -p`: Netid State Recv-Q Send-Q Local Local-inode Peer Peer-inode users:((name,pid=…,fd=…)).
    return output.standardOutput.split(separator: "\n").compactMap { line in
        let fields = line.split(separator: " ", omittingEmptySubsequences: true)
        guard fields.count >= 9, fields[1] == "ESTAB", fields[8].contains(process),
            path == fields[4] || path.hasSuffix("/" + fields[4])
        else { return nil }
        return Int(fields[2])
    }
}
