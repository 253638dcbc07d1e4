import Foundation
import Lockstep
import LockstepClient
import LockstepProtocol
import ZeroMQ

#if canImport(Glibc)
import Glibc
#endif

/// A daemon (`lockstepd`, or one made with `LockstepDaemonMain`) run as a child process on a folder: started,
/// waited for until it answers STATUS, signalled, stopped gracefully or killed, and its log kept — the one way
/// the tests, the fault suite, the demo and the bench run a daemon. It is killed, if it still runs, when released.
///
/// Each ``start(arguments:environment:)`` runs the executable in ``folder`` (so its default journal and
/// sockets are `.lockstep/data` and `.lockstep/run` there) and writes its standard output and error to a log
/// of its own, `daemon-N.log` for the N-th start. Each blocking wait has an async overload of the same name, for
/// async callers, which waits without holding a thread of the cooperative pool.
///
/// Built on ``ChildProcess`` rather than swift-subprocess: a daemon here outlives the scope that started it (a
/// fault class kills and restarts it from synchronous code, a test holds it across awaits), and it must be killed
/// when its owner goes away even if no one awaits it, which swift-subprocess's closure-scoped `run` does not do.
public final class DaemonProcess {
    /// The executable.
    public let executable: URL
    /// The folder it runs in.
    public let folder: URL
    /// Its command (ROUTER) endpoint.
    public let command: String
    /// Its events (PUB) endpoint.
    public let events: String
    /// Arguments and environment given to every start, before each start's own.
    public let arguments: [String]
    /// Environment variables added to every start; a start's own win over these.
    public let environment: [String: String]
    private let curve: ClientCurve?
    private var child: ChildProcess?
    /// How many times it was started.
    public private(set) var starts = 0

    /// A daemon of `executable` on `folder` (created if missing), not started yet. `command` and `events` are the
    /// endpoints to reach it at: by default the daemon's own defaults in `folder`; give them when `arguments`
    /// or a configuration file move them, and `curve` when they are `tcp://` with CURVE.
    public init(
        executable: URL,
        folder: URL,
        arguments: [String] = [],
        environment: [String: String] = [:],
        command: String? = nil,
        events: String? = nil,
        curve: ClientCurve? = nil
    ) throws {
        self.executable = executable
        self.folder = folder
        self.arguments = arguments
        self.environment = environment
        self.command = command ?? "ipc://\(folder.path)/.lockstep/run/command"
        self.events = events ?? "ipc://\(folder.path)/.lockstep/run/events"
        self.curve = curve
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
    }

    deinit { child?.kill() }

    /// The log of the current (or last) start.
    public var log: URL { folder.appendingPathComponent("daemon-\(starts).log") }
    /// What the current (or last) start has written so far.
    public var output: String { (try? String(contentsOf: log, encoding: .utf8)) ?? "" }
    /// Whether the process runs now.
    public var isRunning: Bool { child?.process.isRunning == true }
    /// Its process id; 0 before the first start.
    public var processIdentifier: Int32 { child?.process.processIdentifier ?? 0 }

    /// Starts the daemon with these arguments and environment added to the daemon's own; it must not be running.
    /// Returns at once: `waitUntilServing(within:)`, blocking or async, waits until it answers.
    public func start(arguments extra: [String] = [], environment extraEnvironment: [String: String] = [:]) throws {
        precondition(!isRunning, "start the daemon again only once it has stopped")
        starts += 1
        child = try ChildProcess(
            executable: executable,
            arguments + extra,
            directory: folder,
            errorFile: log,
            environment: environment.merging(extraEnvironment) { $1 },
            outputToErrorFile: true
        )
    }

    /// The daemon's STATUS, or `nil` when it does not answer within `timeout`.
    public func status(timeout: Duration = .milliseconds(300)) -> DaemonStatus? {
        guard let context = try? Context() else { return nil }
        let client = CommandClient(context: context, endpoint: command, timeout: timeout, retries: 0, curve: curve)
        return (try? client.call(.status(requestID: 1))).flatMap(DaemonStatus.init)
    }

    /// The same, for async callers: it waits on a thread of its own (``offPool(_:lending:_:)``), not on one of the
    /// cooperative pool.
    public func status(timeout: Duration = .milliseconds(300)) async -> DaemonStatus? {
        await offPool("daemon status", lending: self) { $0.status(timeout: timeout) }
    }

    /// Waits until the daemon answers STATUS; throws, naming the log, if it exits first or `timeout` passes.
    @discardableResult
    public func waitUntilServing(within timeout: Duration = .seconds(30)) throws -> DaemonStatus {
        let deadline = ContinuousClock.now + timeout
        while true {
            if let status = status() { return status }
            try checkStillStarting(deadline: deadline, timeout: timeout)
            Thread.sleep(forTimeInterval: 0.02)
        }
    }

    /// The same, for async callers: it asks and waits on a thread of its own (``offPool(_:lending:_:)``), not on
    /// one of the cooperative pool, so a busy pool does not use up `timeout` between two questions.
    @discardableResult
    public func waitUntilServing(within timeout: Duration = .seconds(30)) async throws -> DaemonStatus {
        try await offPool("daemon serving", lending: self) { try $0.waitUntilServing(within: timeout) }
    }

    private func checkStillStarting(deadline: ContinuousClock.Instant, timeout: Duration) throws {
        guard isRunning else {
            throw DaemonProcessError(
                "\(executable.lastPathComponent) exited before it answered; its log, \(log.path):\n\(output)"
            )
        }
        guard ContinuousClock.now < deadline else {
            throw DaemonProcessError(
                "\(executable.lastPathComponent) did not answer within \(timeout); see \(log.path)"
            )
        }
    }

    /// Each store's seq and state digest, from the daemon's SNAPSHOT replies. Each try waits 30 s, twice at most: a
    /// whole SNAPSHOT of a large store is encoded on a reader thread, and a debug build just started (its recovery
    /// checkpoint and a replica's join encoding beside it) took more than 5 s for 10 MB; each try sent again starts
    /// one more encoding, so 4 tries of 5 s made each slower and gave up after 20 s.
    public func digests(of stores: [String]) throws -> [String: (seq: SequenceNumber, digest: StateDigest)] {
        let client = CommandClient(
            context: try Context(),
            endpoint: command,
            timeout: .seconds(30),
            retries: 1,
            curve: curve
        )
        var digests: [String: (seq: SequenceNumber, digest: StateDigest)] = [:]
        for store in stores {
            let reply = try client.call(.snapshot(requestID: 1, store: try StoreName(store)))
            guard case let .snapshot(_, snapshot) = reply else {
                throw DaemonProcessError("the daemon answered a SNAPSHOT of \(store) with \(reply)")
            }
            digests[store] = (snapshot.seq, snapshot.digest)
        }
        return digests
    }

    /// The same, for async callers: it waits on a thread of its own (``offPool(_:lending:_:)``), not on one of the
    /// cooperative pool.
    public func digests(of stores: [String]) async throws -> [String: (seq: SequenceNumber, digest: StateDigest)] {
        try await offPool("daemon digests", lending: self) { try $0.digests(of: stores) }
    }

    /// Sends `signal` if the daemon runs.
    public func signal(_ signal: Int32) { child?.signal(signal) }

    /// The exit status once the daemon has exited, waiting at most `timeout`; `nil` if it still runs.
    public func waitForExit(within timeout: Duration) -> Int32? { child?.waitForExit(within: timeout) }

    /// The same, for async callers: it waits on a thread of its own (``offPool(_:lending:_:)``), not on one of the
    /// cooperative pool.
    public func waitForExit(within timeout: Duration) async -> Int32? {
        await offPool("daemon wait", lending: self) { $0.waitForExit(within: timeout) }
    }

    /// SIGTERM, then the exit status within `timeout` (0 after a clean stop); SIGKILL after that, and `nil`.
    @discardableResult
    public func stop(within timeout: Duration = .seconds(10)) -> Int32? {
        guard let child else { return nil }
        guard child.process.isRunning else { return child.waitForExit(within: .zero) }
        child.signal(SIGTERM)
        let status = child.waitForExit(within: timeout)
        child.kill()
        return status
    }

    /// The same, for async callers: it waits on a thread of its own (``offPool(_:lending:_:)``), not on one of the
    /// cooperative pool, so a busy pool does not use up `timeout` before the daemon is seen to exit.
    @discardableResult
    public func stop(within timeout: Duration = .seconds(10)) async -> Int32? {
        await offPool("daemon stop", lending: self) { $0.stop(within: timeout) }
    }

    /// SIGKILL, and reaped.
    public func kill() { child?.kill() }

    /// Its resident memory now and at its peak, in KiB, from /proc; zeros when it does not run.
    public func memory() -> (residentKiB: Int, peakKiB: Int) { residentMemory(of: processIdentifier) }
}

/// The resident memory of process `pid` now and at its peak, in KiB, from /proc; zeros when there is no such
/// process.
public func residentMemory(of pid: Int32) -> (residentKiB: Int, peakKiB: Int) {
    let text = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
    func field(_ name: String) -> Int {
        let line = text.split(separator: "\n").first { $0.hasPrefix(name) } ?? ""
        return Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0
    }
    return (field("VmRSS:"), field("VmHWM:"))
}

/// A daemon that would not start or answer: the message names the executable and its log.
public struct DaemonProcessError: Error, CustomStringConvertible {
    /// What went wrong, naming the executable and its log.
    public var description: String
    /// An error with this message.
    public init(_ description: String) { self.description = description }
}

/// The CPU time (user + system) the thread named `name` of process `pid` has used, from
/// `/proc/PID/task/*/stat`; `nil` when no thread has that name (Linux keeps the first 15 bytes of a name). The
/// bench reads the daemon's `lockstepd loop` and `lockstepd journal` with it, so per-action CPU shows without a
/// profiler.
public func cpuTime(ofThreadNamed name: String, in pid: Int32) -> Duration? {
    let tasks = "/proc/\(pid)/task"
    guard let threads = try? FileManager.default.contentsOfDirectory(atPath: tasks) else { return nil }
    let wanted = String(name.utf8.prefix(15))!
    for thread in threads {
        guard let comm = try? String(contentsOfFile: "\(tasks)/\(thread)/comm", encoding: .utf8),
            comm.trimmingCharacters(in: .newlines) == wanted
        else { continue }
        return cpuTime(statFile: "\(tasks)/\(thread)/stat")
    }
    return nil
}

/// The CPU time (user + system, every thread) process `pid` has used, from `/proc/PID/stat`; `nil` when it is
/// gone.
public func cpuTime(ofProcess pid: Int32) -> Duration? {
    cpuTime(statFile: "/proc/\(pid)/stat")
}

/// utime + stime of a `/proc` stat file, in the kernel's ticks (10 ms here).
private func cpuTime(statFile path: String) -> Duration? {
    guard let stat = try? String(contentsOfFile: path, encoding: .utf8), let end = stat.lastIndex(of: ")") else {
        return nil
    }
    // Fields after the name, which may hold spaces: state is field 3, utime 14 and stime 15.
    let fields = stat[stat.index(after: end)...].split(separator: " ")
    guard fields.count > 12, let user = Int64(fields[11]), let system = Int64(fields[12]) else { return nil }
    let ticks = Int64(sysconf(Int32(_SC_CLK_TCK)))
    return .nanoseconds((user + system) * 1_000_000_000 / max(1, ticks))
}

/// The CPU time (user + system, every thread) this process has used.
public func processCPUTime() -> Duration {
    var time = timespec()
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &time)
    return .seconds(time.tv_sec) + .nanoseconds(time.tv_nsec)
}

/// An empty folder `name` in the temporary directory, made anew (whatever was there before is removed): where
/// the demo and the bench keep their daemons' journals and logs.
public func freshTemporaryFolder(_ name: String) throws -> URL {
    let folder = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent(name)
    try? FileManager.default.removeItem(at: folder)
    try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
    return folder
}
