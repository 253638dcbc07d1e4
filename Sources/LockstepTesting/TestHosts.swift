import Foundation
import Lockstep

#if canImport(Glibc)
import Glibc
#endif

/// Hosts for a test, made of Linux network namespaces: each host is a namespace with `lo` up and one veth
/// (`eth0`) plugged into a bridge that lives in a namespace of its own (the switch), all in one private /24. A
/// process started on a host (``run(on:_:_:directory:errorFile:environment:outputToErrorFile:)``) sees only that
/// host's network: the other hosts are reached over tcp at their addresses, and the machine's own network not at
/// all. The file system is shared, so every host reads the same files.
///
/// ```swift
/// let hosts = try TestHosts(["db", "a", "b", "c"])
/// defer { hosts.tearDown() }
/// let stats = try hosts.run(on: "c", lockstep, ["stats", "--command-endpoint", "tcp://\(hosts["a"].address):7400"])
/// ```
///
/// An async test makes them with `try await TestHosts.make(names)` and ends with `await hosts.tearDown()`, which
/// run the `ip` commands without holding a thread of the cooperative pool.
///
/// Namespaces are named `lockstep-PID-N` (the switch) and `lockstep-PID-N-HOST`, with this process's id and a
/// number of its own, so parallel runs and several sets in one process never meet; the subnet is `10.231.X.0/24`
/// with `X` from the process id, and since no route leads out of the switch, two sets on one subnet never meet
/// either. `tearDown()` (also run when the object is released) kills, by id, whatever still runs on them and
/// deletes every namespace; the veths and the bridge go with them. A run killed with SIGKILL leaves its namespaces,
/// and the processes it started in them: the next set made on the machine deletes those whose process is gone and
/// in which nothing runs, and says which it deleted and which it left (with the ids of what runs there).
///
/// Making namespaces needs root (or `CAP_SYS_ADMIN` and `CAP_NET_ADMIN`), iproute2's `ip`, and veth and bridge
/// support in the kernel; where one is missing the initializer throws ``TestHostsUnavailable`` saying which, for
/// the test to report as skipped. Every `ip` call goes through ``ip(_:)``, whose failure names the command, its
/// exit status and what it wrote to standard error.
public final class TestHosts {
    /// One host: its name in the test, its namespace and its address on the switch.
    public struct Host: Sendable, Hashable {
        /// The name the test gave it (`a`, `db`).
        public let name: String
        /// The network namespace (`lockstep-PID-N-NAME`).
        public let namespace: String
        /// Its IPv4 address on the switch, e.g. `10.231.7.2`.
        public let address: String
    }

    /// The hosts, in the order they were named.
    public let hosts: [Host]
    /// The hosts' subnet, e.g. `10.231.7.0/24`.
    public let subnet: String
    /// The namespace holding the bridge (`lockstep-PID-N`).
    public let switchNamespace: String
    /// What making the hosts found left by earlier runs: namespaces it deleted, and those it left because a process
    /// still runs in them. Empty when there were none.
    public private(set) var leftovers: [String] = []
    private var made: [String] = []
    private let ipPath: URL

    /// The prefix of every namespace this type makes.
    public static let prefix = "lockstep"
    private static let sets = LockedValue(0)

    /// Makes a host for each of `names` (lowercase letters and digits, at most 12 characters), with addresses
    /// `.1`, `.2`… in that order, and the switch between them.
    ///
    /// - Throws: ``TestHostsUnavailable`` when namespaces cannot be made here (not root, no `ip`, no veth or bridge
    ///   in the kernel); ``TestHostsError`` for anything else, after deleting what it had made.
    public init(_ names: [String]) throws {
        precondition(!names.isEmpty && names.count < 250, "between 1 and 249 hosts")
        precondition(Set(names).count == names.count, "host names must differ: \(names)")
        for name in names {
            precondition(
                (1...12).contains(name.utf8.count)
                    && name.utf8.allSatisfy { (97...122).contains($0) || (48...57).contains($0) },
                "a host name is 1 to 12 lowercase letters and digits, not '\(name)'"
            )
        }
        ipPath = try Self.findIP()
        try Self.checkPrivileges()
        let pid = getpid()
        let existing = try Self.namespaces(ip: ipPath)
        var number = Self.sets.withLockedValue { number in
            defer { number += 1 }
            return number
        }
        // A leftover of an earlier run whose process had this id: never reuse its names.
        while existing.contains(where: {
            $0 == "\(Self.prefix)-\(pid)-\(number)" || $0.hasPrefix("\(Self.prefix)-\(pid)-\(number)-")
        }) {
            number = Self.sets.withLockedValue { next in
                defer { next += 1 }
                return next
            }
        }
        switchNamespace = "\(Self.prefix)-\(pid)-\(number)"
        let third = Int(pid) % 250 + 1
        subnet = "10.231.\(third).0/24"
        hosts = names.enumerated().map { index, name in
            Host(
                name: name,
                namespace: "\(Self.prefix)-\(pid)-\(number)-\(name)",
                address: "10.231.\(third).\(index + 1)"
            )
        }
        leftovers = sweep(existing)
        do {
            try addNamespace(switchNamespace)
            try ip(["-n", switchNamespace, "link", "set", "lo", "up"])
            try ip(["-n", switchNamespace, "link", "add", "br0", "type", "bridge"])
            try ip(["-n", switchNamespace, "link", "set", "br0", "up"])
            for host in hosts {
                try addNamespace(host.namespace)
                try ip(["-n", host.namespace, "link", "set", "lo", "up"])
                // Made inside the switch, with its peer made inside the host: neither name is ever in this
                // process's namespace, where an `eth0` is likely.
                let port = "to-\(host.name)"
                try ip([
                    "-n", switchNamespace, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns",
                    host.namespace,
                ])
                try ip(["-n", switchNamespace, "link", "set", port, "master", "br0"])
                try ip(["-n", switchNamespace, "link", "set", port, "up"])
                try ip(["-n", host.namespace, "addr", "add", "\(host.address)/24", "dev", "eth0"])
                try ip(["-n", host.namespace, "link", "set", "eth0", "up"])
            }
        } catch let error as TestHostsError {
            tearDown()
            if let unavailable = TestHostsUnavailable(error) { throw unavailable }
            throw error
        }
    }

    /// Makes the hosts as ``init(_:)`` does, for async callers: the `ip` commands run on a thread of their own
    /// (``offPool(_:_:)``), and the calling task waits for them without holding a thread of the cooperative pool.
    public static func make(_ names: [String]) async throws -> sending TestHosts {
        try await offPool("test hosts") { try TestHosts(names) }
    }

    deinit { tearDown() }

    /// The host named `name`; it must be one of those made.
    public subscript(name: String) -> Host {
        guard let host = hosts.first(where: { $0.name == name }) else {
            preconditionFailure("no host '\(name)'; the hosts are \(hosts.map(\.name))")
        }
        return host
    }

    /// The executable and arguments that run `executable` with `arguments` on host `name`: `ip netns exec
    /// NAMESPACE EXECUTABLE ARGUMENTS…`. `ip` enters the namespace and then replaces itself with the executable,
    /// so the process's id is the executable's own: a signal to it reaches the program, not a wrapper.
    public func command(
        on name: String,
        _ executable: URL,
        _ arguments: [String]
    ) -> (executable: URL, arguments: [String]) {
        (ipPath, ["netns", "exec", self[name].namespace, executable.path] + arguments)
    }

    /// Runs `body` on the calling thread as if on host `name`: the thread enters the host's network namespace
    /// (`setns`) for the call and returns to its own after it. Sockets made meanwhile are the host's for good, and
    /// so are threads started meanwhile — ZeroMQ's I/O threads, which a context starts with its first socket,
    /// included — while the process's other threads stay where they were.
    ///
    /// - Throws: ``TestHostsError`` when the namespace cannot be entered; whatever `body` throws.
    public func within<Result>(_ name: String, _ body: () throws -> Result) throws -> Result {
        let own = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)
        let host = open("/run/netns/\(self[name].namespace)", O_RDONLY | O_CLOEXEC)
        defer {
            if own >= 0 { close(own) }
            if host >= 0 { close(host) }
        }
        guard own >= 0, host >= 0, Self.enterNetworkNamespace(host) == 0 else {
            throw TestHostsError(
                command: "setns(/run/netns/\(self[name].namespace), CLONE_NEWNET)",
                status: nil,
                standardError: String(cString: strerror(errno))
            )
        }
        defer {
            // A thread left on the host would make every later socket of it there: nothing sound goes on after.
            precondition(
                Self.enterNetworkNamespace(own) == 0,
                "cannot return to this thread's own network namespace: \(String(cString: strerror(errno)))"
            )
        }
        return try body()
    }

    /// glibc's `setns(fd, CLONE_NEWNET)` for the calling thread, found at run time: Swift's Glibc module leaves out
    /// what `_GNU_SOURCE` declares, `setns` and `CLONE_NEWNET` among it. 0, or -1 with `errno` set.
    private static func enterNetworkNamespace(_ descriptor: Int32) -> Int32 {
        typealias SetNS = @convention(c) (Int32, Int32) -> Int32
        let cloneNewNet: Int32 = 0x4000_0000
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "setns") else {
            errno = ENOSYS
            return -1
        }
        return unsafeBitCast(symbol, to: SetNS.self)(descriptor, cloneNewNet)
    }

    /// Starts `executable` on host `name` as a ``ChildProcess`` (killed by its id when released, or by
    /// `tearDown()`), with the other parameters as ``ChildProcess`` takes them.
    public func run(
        on name: String,
        _ executable: URL,
        _ arguments: [String],
        directory: URL? = nil,
        errorFile: URL? = nil,
        environment: [String: String] = [:],
        outputToErrorFile: Bool = false
    ) throws -> ChildProcess {
        let (wrapper, wrapped) = command(on: name, executable, arguments)
        return try ChildProcess(
            executable: wrapper,
            wrapped,
            directory: directory,
            errorFile: errorFile,
            environment: environment,
            outputToErrorFile: outputToErrorFile
        )
    }

    /// The ids of the processes that run on host `name` now (`ip netns pids`).
    public func processes(on name: String) throws -> [Int32] {
        try ip(["netns", "pids", self[name].namespace]).split(separator: "\n").compactMap { Int32($0) }
    }

    /// Runs `ip` with `arguments` to its end (at most ``ipTimeout``) and returns its standard output.
    ///
    /// - Throws: ``TestHostsError`` naming the command, its exit status and its standard error when it fails or
    ///   does not finish.
    @discardableResult
    public func ip(_ arguments: [String]) throws -> String {
        try Self.ip(arguments, at: ipPath)
    }

    /// Kills every process still running on a host or on the switch (SIGKILL, by id, each reaped by its parent)
    /// and deletes the namespaces; their veths and the bridge go with them. Harmless twice. A process the test
    /// started should have been stopped already: what this finds is printed, since a clean test leaves nothing.
    public func tearDown() {
        for namespace in made.reversed() {
            let pids = (try? Self.ip(["netns", "pids", namespace], at: ipPath))?.split(separator: "\n") ?? []
            for pid in pids.compactMap({ pid_t($0) }) where pid != getpid() {
                print("TestHosts: killing process \(pid), still running in \(namespace) at tear-down")
                _ = Glibc.kill(pid, SIGKILL)
            }
            do {
                try Self.ip(["netns", "delete", namespace], at: ipPath)
            } catch {
                print("TestHosts: could not delete \(namespace): \(error)")
            }
        }
        made = []
    }

    /// The same, for async callers: it runs on a thread of its own (``offPool(_:lending:_:)``), not on one of the
    /// cooperative pool.
    public func tearDown() async {
        await offPool("hosts teardown", lending: self) { $0.tearDown() }
    }

    private func addNamespace(_ namespace: String) throws {
        try ip(["netns", "add", namespace])
        made.append(namespace)
    }

    /// Deletes the namespaces of earlier runs whose process is gone and in which nothing runs; returns a line for
    /// each leftover found.
    private func sweep(_ existing: [String]) -> [String] {
        var found: [String] = []
        for namespace in existing {
            let parts = namespace.split(separator: "-", maxSplits: 3)
            guard parts.count >= 3, parts[0] == Self.prefix, let owner = pid_t(parts[1]), owner != getpid() else {
                continue
            }
            guard Glibc.kill(owner, 0) == -1, errno == ESRCH else { continue }
            let inside = (try? ip(["netns", "pids", namespace]))?.split(separator: "\n") ?? []
            if inside.isEmpty, (try? ip(["netns", "delete", namespace])) != nil {
                found.append("deleted \(namespace), left by process \(owner), which is gone")
            } else {
                found.append(
                    "left \(namespace) of process \(owner), which is gone: processes \(inside.joined(separator: ", ")) "
                        + "still run in it (kill them and 'ip netns delete \(namespace)' to remove it)"
                )
            }
        }
        for line in found { print("TestHosts: \(line)") }
        return found
    }

    /// Every named namespace (`ip netns list` prints `NAME` or `NAME (id: N)` per line).
    private static func namespaces(ip path: URL) throws -> [String] {
        try ip(["netns", "list"], at: path).split(separator: "\n").compactMap {
            $0.split(separator: " ").first.map(String.init)
        }
    }

    /// How long one `ip` command may take. It normally takes milliseconds, but every change to links and namespaces
    /// waits for the kernel's one routing lock (rtnl), which the clean-up of deleted namespaces — other tests', in
    /// parallel — holds for seconds at a time: 10 s was passed once in a whole `swift test` (`ip link set lo up`).
    public static let ipTimeout = Duration.seconds(60)

    @discardableResult
    private static func ip(_ arguments: [String], at path: URL) throws -> String {
        let command = (["ip"] + arguments).joined(separator: " ")
        let output: ProcessOutput
        do {
            output = try ChildProcess(executable: path, arguments).finish(within: ipTimeout)
        } catch let timeout as ProcessTimeout {
            throw TestHostsError(command: command, status: nil, standardError: "\(timeout)")
        }
        guard output.status == 0 else {
            throw TestHostsError(command: command, status: output.status, standardError: output.standardError)
        }
        return output.standardOutput
    }

    /// iproute2's `ip`, where Debian puts it or on `$PATH`.
    private static func findIP() throws -> URL {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? ""
        for directory in ["/usr/sbin", "/sbin", "/usr/bin", "/bin"] + path.split(separator: ":").map(String.init) {
            let ip = URL(fileURLWithPath: directory).appendingPathComponent("ip")
            if FileManager.default.isExecutableFile(atPath: ip.path) { return ip }
        }
        throw TestHostsUnavailable(reason: "no 'ip' (iproute2) in /usr/sbin, /sbin or on PATH; install iproute2")
    }

    /// Root, or `CAP_SYS_ADMIN` (namespaces, and the mounts of `ip netns`) and `CAP_NET_ADMIN` (links and
    /// addresses) in the effective set.
    private static func checkPrivileges() throws {
        let status = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("CapEff:") }
        let effective = line.flatMap {
            UInt64($0.dropFirst("CapEff:".count).trimmingCharacters(in: .whitespaces), radix: 16)
        }
        let sysAdmin: UInt64 = 1 << 21
        let netAdmin: UInt64 = 1 << 12
        guard let effective else {
            guard geteuid() == 0 else {
                throw TestHostsUnavailable(reason: "not root, and /proc/self/status shows no capabilities to check")
            }
            return
        }
        guard effective & sysAdmin != 0, effective & netAdmin != 0 else {
            throw TestHostsUnavailable(
                reason: "this process lacks CAP_SYS_ADMIN or CAP_NET_ADMIN (CapEff \(String(effective, radix: 16)), "
                    + "euid \(geteuid())), which network namespaces need; run the tests as root with both"
            )
        }
    }
}

/// An `ip` command failed while test hosts were made or removed: the command, its exit status and its standard
/// error.
public struct TestHostsError: Error, CustomStringConvertible {
    /// The command line, e.g. `ip netns add lockstep-42-0-a`.
    public var command: String
    /// Its exit status; `nil` when it did not finish in ``TestHosts/ipTimeout`` and was killed.
    public var status: Int32?
    /// What it wrote to standard error.
    public var standardError: String

    /// `COMMAND failed (exit status N): STDERR`, and what to look at.
    public var description: String {
        let ending =
            status.map { "failed (exit status \($0))" } ?? "did not finish within \(TestHosts.ipTimeout) and was killed"
        let said = standardError.trimmingCharacters(in: .whitespacesAndNewlines)
        return "'\(command)' \(ending): \(said.isEmpty ? "(nothing on standard error)" : said); 'ip netns list' "
            + "shows the namespaces that exist"
    }
}

/// Test hosts cannot be made on this machine; ``reason`` says what is missing. A test reports this as skipped,
/// never as passed.
public struct TestHostsUnavailable: Error, CustomStringConvertible {
    /// What is missing, and what would provide it.
    public var reason: String

    /// Unavailable for `reason`.
    public init(reason: String) { self.reason = reason }

    /// An `ip` failure that says the kernel or the privileges are missing, as unavailability; `nil` for others.
    init?(_ error: TestHostsError) {
        let refusals = [
            "Operation not permitted", "Permission denied", "Operation not supported", "Unknown device type",
            "Read-only file system", "not supported",
        ]
        guard refusals.contains(where: error.standardError.contains) else { return nil }
        let said = error.standardError.trimmingCharacters(in: .whitespacesAndNewlines)
        reason = "'\(error.command)' was refused (exit status \(error.status.map(String.init) ?? "none")): \(said)"
    }

    /// `test hosts (network namespaces) cannot be made here: REASON`.
    public var description: String { "test hosts (network namespaces) cannot be made here: \(reason)" }
}
