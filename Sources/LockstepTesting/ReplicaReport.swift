import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// One line of `lockstep demo-client`'s output: what the client dispatched and where each of its replicas
/// stands. The demo, the integration tests and the fault suite read these lines from client processes.
public struct ReplicaReport: Codable, Sendable {
    /// One replica.
    public struct Store: Codable, Sendable {
        /// The store's name.
        public var store: String
        /// `joining`, `live`, `repairing` or `disconnected`.
        public var phase: String
        /// The epoch of the replica's state in 16 hex digits; `nil` before its first snapshot.
        public var epoch: String?
        /// The seq of the replica's state.
        public var seq: UInt64
        /// The SHA-256 of the replica's state, in hex.
        public var digest: String
        /// How many actions the replica is behind the daemon's last word (``ReplicaReport/Store/seq`` against the
        /// daemon's announced seq).
        public var lag: UInt64
        /// Times the replica threw its state away and joined again.
        public var resyncs: Int
        /// Gaps it filled by range.
        public var repairs: Int
        /// Times its state's digest differed from the daemon's.
        public var divergences: Int
        /// The state's canonical JSON, in the final report when asked for.
        public var state: String?
        /// Its optimistic dispatches the confirmed state does not hold yet, one line each (`PendingDispatch`'s
        /// description: request number, actions, status, age); `nil` when there are none.
        public var pending: [String]?
        /// With `--check-reads`: the optimistic reads its subscriber checked (``OptimisticReadCheck``).
        public var checkedReads: Int?
        /// With `--check-reads`: the problems the check found in them (0 is right).
        public var readProblems: Int?
        /// With `--check-reads`: the first problem found, if any.
        public var firstReadProblem: String?

        /// A report of one replica, field by field.
        public init(
            store: String,
            phase: String,
            epoch: String?,
            seq: UInt64,
            digest: String,
            lag: UInt64,
            resyncs: Int,
            repairs: Int,
            divergences: Int,
            state: String?,
            pending: [String]? = nil,
            checkedReads: (reads: Int, problems: Int, first: String?)? = nil
        ) {
            self.store = store
            self.phase = phase
            self.epoch = epoch
            self.seq = seq
            self.digest = digest
            self.lag = lag
            self.resyncs = resyncs
            self.repairs = repairs
            self.divergences = divergences
            self.state = state
            self.pending = pending
            self.checkedReads = checkedReads?.reads
            readProblems = checkedReads?.problems
            firstReadProblem = checkedReads?.first
        }
    }

    /// The client's process id.
    public var pid: Int32
    /// Dispatches answered so far: accepted, rejected or failed.
    public var dispatched = 0
    /// Accepted by the daemon and applied by the client's own replica.
    public var accepted = 0
    /// Refused by the domain's validator.
    public var rejected = 0
    /// No answer, or another error.
    public var failed = 0
    /// Every dispatch has been answered.
    public var done = false
    /// The last line, printed on SIGTERM.
    public var final = false
    /// Each of the client's replicas, one per store.
    public var stores: [Store] = []

    /// An empty report for process `pid`: nothing dispatched, no store yet.
    public init(pid: Int32) {
        self.pid = pid
    }

    /// The replica of `name`.
    public func store(_ name: String) -> Store? { stores.first { $0.store == name } }

    /// Whether every store in `expected` is at that (seq, digest).
    public func matches(_ expected: [String: (seq: UInt64, digest: String)]) -> Bool {
        expected.allSatisfy { name, want in store(name).map { $0.seq == want.seq && $0.digest == want.digest } ?? false
        }
    }
}

extension ChildProcess {
    /// Reads what arrives within `timeout` and returns the newest report among the complete lines, if any.
    public func newestReport(waiting timeout: Duration) -> ReplicaReport? {
        read(for: timeout)
        return takeLines().reversed().lazy.compactMap {
            try? JSONDecoder().decode(ReplicaReport.self, from: Data($0.utf8))
        }.first
    }

    /// The same, for async callers: it waits on a thread of its own (``offPool(_:lending:_:)``), not on one of the
    /// cooperative pool.
    public func newestReport(waiting timeout: Duration) async -> ReplicaReport? {
        await offPool("child report", lending: self) { $0.newestReport(waiting: timeout) }
    }
}

/// A `lockstep demo-client` process (replicas of some example stores, dispatching or only watching) whose
/// report lines are read with bounded waits.
public final class ReplicaClient {
    /// The `lockstep demo-client` process.
    public let child: ChildProcess
    /// The newest report read.
    public private(set) var last: ReplicaReport?

    /// Starts `lockstep demo-client` following the daemons at these (command, events) endpoints (one, or a leader and
    /// its standbys), reporting every 50 ms; on host `host` of `hosts` when they are given (`extra` then usually holds
    /// `--curve-server-key` and `--curve-key-file`).
    public init(
        lockstep: URL,
        daemons: [(command: String, events: String)],
        stores: [String],
        actions: Int,
        extra: [String] = [],
        on hosts: TestHosts? = nil,
        host: String? = nil
    ) throws {
        precondition((hosts == nil) == (host == nil), "give the hosts and the host's name together")
        let endpoints = daemons.flatMap { ["--command-endpoint", $0.command, "--events-endpoint", $0.events] }
        let arguments =
            [
                "demo-client", "--stores", stores.joined(separator: ","), "--actions", "\(actions)",
                "--report-ms", "50",
            ] + endpoints + extra
        if let hosts, let host {
            child = try hosts.run(on: host, lockstep, arguments)
        } else {
            child = try ChildProcess(executable: lockstep, arguments)
        }
    }

    /// The newest report's replica of `name`.
    public func store(_ name: String) -> ReplicaReport.Store? { last?.store(name) }

    /// Reads reports until one satisfies `condition`, for at most `timeout` (or until the client's output
    /// ends); the newest report either way.
    @discardableResult
    public func wait(within timeout: Duration, until condition: (ReplicaReport) -> Bool) -> ReplicaReport? {
        let deadline = ContinuousClock.now + timeout
        repeat {
            if let report = child.newestReport(waiting: .milliseconds(50)) { last = report }
            if let last, condition(last) { return last }
        } while ContinuousClock.now < deadline && !child.reachedEndOfOutput
        return last
    }

    /// The same, for async callers: it waits on a thread of its own (``offPool(_:lending:_:)``), not on one of the
    /// cooperative pool, and calls `condition` there.
    @discardableResult
    public func wait(
        within timeout: Duration,
        until condition: @escaping @Sendable (ReplicaReport) -> Bool
    ) async -> ReplicaReport? {
        await offPool("replica wait", lending: self) { $0.wait(within: timeout, until: condition) }
    }

    /// Whether every store reaches the given (seq, digest) within `timeout`.
    public func converge(on expected: [String: (seq: UInt64, digest: String)], within timeout: Duration) -> Bool {
        wait(within: timeout) { $0.matches(expected) }?.matches(expected) == true
    }

    /// The same, for async callers: it waits on a thread of its own (``offPool(_:lending:_:)``), not on one of the
    /// cooperative pool.
    public func converge(
        on expected: [String: (seq: UInt64, digest: String)],
        within timeout: Duration
    ) async -> Bool {
        await offPool("replica wait", lending: self) { $0.converge(on: expected, within: timeout) }
    }

    /// SIGTERM, then the final report and the exit status (within 15 s, else it is killed and this throws).
    public func stop() throws -> (report: ReplicaReport?, status: Int32) {
        child.signal(SIGTERM)
        let output = try child.finish(within: .seconds(15))
        let final = output.standardOutput.split(separator: "\n").compactMap {
            try? JSONDecoder().decode(ReplicaReport.self, from: Data($0.utf8))
        }.last
        return (final ?? last, output.status)
    }

    /// The same, for async callers: it waits on a thread of its own (``offPool(_:lending:_:)``), not on one of the
    /// cooperative pool.
    public func stop() async throws -> (report: ReplicaReport?, status: Int32) {
        try await offPool("replica stop", lending: self) { try $0.stop() }
    }
}
