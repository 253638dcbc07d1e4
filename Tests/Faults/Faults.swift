import Foundation
import Lockstep
import LockstepBench
import LockstepClient
import LockstepExamples
import LockstepJournal
import LockstepProtocol
import LockstepTesting
import ZeroMQ

#if canImport(Glibc)
import Glibc
#endif

/// The fault classes. Each starts its own daemon in its own folder.
final class Faults {
    let folder: URL
    let long: Bool
    var random: SplitMix64

    init(folder: URL, long: Bool, seed: UInt64) {
        self.folder = folder
        self.long = long
        random = SplitMix64(seed: seed)
    }

    /// No snapshot (so no compaction) for a long while: the suite checks the whole history.
    static let keepHistory = "[snapshots]\nevery_events = 100000000\n"

    /// The daemon's setting for Lockstep's own journal (the default in a new data directory): first in its file,
    /// before any table.
    static let logJournal = "journal = \"log\"\n"
    /// The daemon's setting for the SQLite journal, which the journal's classes name as the log journal's are named.
    static let sqliteJournal = "journal = \"sqlite\"\n"

    func pause(_ range: ClosedRange<Int>) {
        Thread.sleep(forTimeInterval: Double(Int.random(in: range, using: &random)) / 1_000)
    }

    /// Waits until `load` has more acknowledgements than `count`; false after `timeout`.
    func progresses(_ load: Load, beyond count: Int, within timeout: Duration = .seconds(10)) -> Bool {
        let deadline = ContinuousClock.now + timeout
        while load.acks.count <= count {
            guard ContinuousClock.now < deadline else { return false }
            Thread.sleep(forTimeInterval: 0.01)
        }
        return true
    }

    /// Waits until every watcher is at `daemon`'s todos (seq, digest), with the load paused or stopped; what went
    /// wrong, if anything.
    func converge(_ watchers: [ReplicaClient], on daemon: Daemon) throws -> String? {
        let expected = try daemon.digests(["todos"])
        var failure: String?
        for (index, watcher) in watchers.enumerated() {
            if !watcher.converge(on: expected, within: .seconds(30)) {
                failure = "replica \(index + 1) did not reach the daemon's \(expected["todos"]!)"
            }
            if let divergences = watcher.store("todos")?.divergences, divergences > 0 {
                failure = "replica \(index + 1) diverged \(divergences) times"
            }
        }
        return failure
    }

    /// Stops the load, checks the watchers against the daemon, and the journal against the load's
    /// acknowledgements.
    private func settle(
        _ daemon: Daemon,
        _ load: Load,
        watchers: [ReplicaClient],
        from first: SequenceNumber = 1,
        into result: inout FaultResult
    ) throws {
        try settle(load, leader: daemon, watchers: watchers, from: first, into: &result) {
            try openLocalJournal(directory: daemon.data, readOnly: true)
        }
    }

    /// The same for a leader and its standbys: they are stopped, standbys first, and `journal` is read once they
    /// are; none of `absent` (texts of refused dispatches) may be in it.
    func settle(
        _ load: Load,
        leader: Daemon,
        standbys: [Daemon] = [],
        watchers: [ReplicaClient],
        absent: Set<String> = [],
        from first: SequenceNumber = 1,
        into result: inout FaultResult,
        journal: () throws -> any Journal
    ) throws {
        load.stop()
        if let failure = try converge(watchers, on: leader) { result.failure = failure }
        for (index, watcher) in watchers.enumerated() where (try? watcher.stop())?.status != 0 {
            result.failure = "replica \(index + 1) did not exit cleanly"
        }
        for daemon in standbys + [leader] where daemon.stop() != 0 {
            result.failure = result.failure ?? "lockstepd did not exit 0 on SIGTERM; see \(daemon.log.path)"
        }
        let opened = try journal()
        defer { try? opened.close() }
        let check = try checkJournal(opened, acks: load.acks, absent: absent, from: first)
        result.lost += check.lost + check.duplicated + check.unexpected
        result.notes += check.problems
        if check.holes > 0 { result.failure = result.failure ?? "the journal's seqs have \(check.holes) holes" }
        result.notes.append(
            "\(load.acks.count) dispatches acknowledged and found once at their seq; \(load.unanswered) gave up "
                + "(allowed: at most once)"
        )
        if !load.refused.isEmpty { result.notes.append("refusals: \(Set(load.refused).sorted().prefix(3))") }
    }

    // MARK: - kill -9

    func killUnderLoad() throws -> FaultResult {
        try killUnderLoad(in: "kill", configuration: Self.sqliteJournal + Self.keepHistory)
    }

    /// The same with the log journal.
    func killUnderLoadOnTheLogJournal() throws -> FaultResult {
        try killUnderLoad(in: "kill-log", configuration: Self.logJournal + Self.keepHistory)
    }

    /// The same on a store of ~10 MB: every checkpoint is taken off the loop (a snapshot every 2,000 events, written by
    /// a later commit at its own seq; a digest every 500, published after later events), and each restart recovers
    /// the large state.
    func killUnderLoadOnALargeStore() throws -> FaultResult {
        try killUnderLoad(in: "kill-large", configuration: Self.sqliteJournal + Self.largeStore, prefill: true)
    }

    /// The same with the log journal: its snapshots' files written on the checkpoint thread, ahead of their commit.
    func killUnderLoadOnALargeStoreOnTheLogJournal() throws -> FaultResult {
        try killUnderLoad(in: "kill-large-log", configuration: Self.logJournal + Self.largeStore, prefill: true)
    }

    /// A store of ~10 MB checkpointed off the loop often, its events kept (but those of the prefill).
    static let largeStore = "[snapshots]\nevery_events = 2000\nkeep = 1000\n[intervals]\ndigest_every_events = 500\n"

    /// ~`megabytes` of `todos` written into `daemon`'s journal before it starts, with one snapshot at the end — as a
    /// daemon that has run a long time leaves it — so the store is checkpointed off the loop from its first
    /// checkpoint on.
    @discardableResult
    func prefillLargeStore(_ daemon: Daemon, megabytes: Int = 10) throws -> SequenceNumber {
        let todos = megabytes << 20 / 220
        let policy = JournalPolicy(snapshotEveryEvents: todos, snapshotEveryBytes: .max)
        let journal: any Journal =
            daemon.configuration.contains(Self.logJournal)
            ? try LogJournal(directory: daemon.data, policy: policy)
            : try SQLiteJournal(directory: daemon.data, policy: policy, relaxed: true)
        _ = try fill(journal, Todos.self, events: todos, batchSize: 10_000) { seq in
            (.add(text: BenchWorker.todoText(seq)), BenchWorker.todoAdd(seq))
        }
        try journal.sync()
        try journal.close()
        return SequenceNumber(todos)
    }

    private func killUnderLoad(in name: String, configuration: String, prefill: Bool = false) throws -> FaultResult {
        let daemon = try Daemon(folder: folder.appendingPathComponent(name), configuration: configuration)
        // The prefill's history is compacted by the daemon's first snapshot: the load's is checked from after it.
        let first = prefill ? try prefillLargeStore(daemon) + 1 : 1
        try daemon.start()
        let watchers = try (0..<2).map { _ in try ReplicaClient(watching: [daemon], stores: ["todos"]) }
        let load = Load(endpoints: [daemon.command], label: "kill")
        load.start()
        defer { load.stop() }
        var result = FaultResult(injected: 0, survived: 0, lost: 0)
        try crashCycles(
            daemon,
            points: ["before-commit", "after-commit", "after-reply"],
            upTo: 10,
            // Each restart recovers the large state (seconds in a test build): 8 cycles in the quick mode.
            quickCycles: prefill ? 8 : 20,
            into: &result
        ) {
            // Counted after the restart, so only the new daemon's answers show it serves again.
            (progresses(load, beyond: load.acks.count), nil)
        }
        try settle(daemon, load, watchers: watchers, from: first, into: &result)
        return result
    }

    /// The kill -9 cycles (quick `quickCycles`, 20 unless said; long 200): in turn, a SIGKILL at a random moment and a restart with each of
    /// `points` as `LOCKSTEP_FAILPOINT` (reached at its 1st to `upTo`-th pass), then a restart; a cycle survives
    /// when `serves` says the restarted daemon serves again, and the cycles end at the first failure it names. How
    /// many of each are noted.
    func crashCycles(
        _ daemon: Daemon,
        points: [String],
        upTo passes: Int,
        quickCycles: Int = 20,
        into result: inout FaultResult,
        serves: () throws -> (serves: Bool, failure: String?)
    ) throws {
        var byPoint: [String: Int] = [:]
        for cycle in 0..<(long ? 200 : quickCycles) {
            if cycle % (points.count + 1) == 0 {
                pause(20...400)
                daemon.kill()
                byPoint["random moment", default: 0] += 1
            } else {
                let point = points[cycle % (points.count + 1) - 1]
                daemon.kill()
                try daemon.start(
                    environment: ["LOCKSTEP_FAILPOINT": "\(point):\(Int.random(in: 1...passes, using: &random))"],
                    waitForReady: false
                )
                let deadline = ContinuousClock.now + .seconds(20)
                while daemon.isRunning, ContinuousClock.now < deadline { Thread.sleep(forTimeInterval: 0.005) }
                guard !daemon.isRunning else {
                    result.failure = "the failpoint \(point) was never reached"
                    break
                }
                byPoint[point, default: 0] += 1
            }
            result.injected += 1
            try daemon.start()
            let (served, failure) = try serves()
            if served { result.survived += 1 }
            result.failure = result.failure ?? failure
            if result.failure != nil { break }
        }
        result.notes.append(
            byPoint.sorted { $0.key < $1.key }.map { "\($0.value) × \($0.key)" }.joined(separator: ", ")
        )
    }

    // MARK: - SIGSTOP of the daemon

    func stopDaemon() throws -> FaultResult {
        let daemon = try Daemon(folder: folder.appendingPathComponent("stop"), configuration: Self.keepHistory)
        try daemon.start()
        let watchers = [try ReplicaClient(watching: [daemon], stores: ["todos"])]
        // A 200 ms timeout: a 1 s stop makes every client retry several times, on fresh sockets.
        let load = Load(
            endpoints: [daemon.command],
            label: "stop",
            threads: 2,
            timeout: .milliseconds(200),
            retries: 30
        )
        load.start()
        defer { load.stop() }
        var result = FaultResult(injected: 0, survived: 0, lost: 0)
        for _ in 0..<(long ? 20 : 3) {
            pause(100...300)
            daemon.signal(SIGSTOP)
            Thread.sleep(forTimeInterval: 1)
            // Counted while it is stopped: only answers after SIGCONT (to retries, mostly) show it survived.
            let before = load.acks.count
            daemon.signal(SIGCONT)
            result.injected += 1
            if progresses(load, beyond: before) { result.survived += 1 }
        }
        try settle(daemon, load, watchers: watchers, into: &result)
        return result
    }

    // MARK: - Failover

    /// Two daemons on one PostgreSQL journal (docs/operations.md, "Leader and standby") under load from clients
    /// that hold both command endpoints, followed by replicas that hold both daemons; whichever leads is killed -9
    /// or stopped, in turn. The other must lead within 5 s; a killed leader comes back as a standby; a stopped one,
    /// woken, must commit nothing — not even a dispatch queued at its own socket while it slept — and stand by.
    func failover() throws -> FaultResult {
        // Effects and timers pending through every takeover: a reminders load beside the todos one.
        let service = folder.appendingPathComponent("failover-service")
        let (server, connection, daemons) = try pair(
            "failover",
            domains: ["todos", "reminders"],
            environment: ["LOCKSTEP_NOTIFICATIONS": service.path]
        )
        defer { server.stop() }
        // Killed (stopped ones too) before the server stops, whatever happens.
        defer { for daemon in daemons { daemon.kill() } }
        let watchers = try (0..<4).map { _ in try ReplicaClient(watching: daemons, stores: ["todos"]) }
        let load = Load(endpoints: daemons.map(\.command), label: "failover")
        load.start()
        defer { load.stop() }
        let reminders = ReminderLoad(endpoints: daemons.map(\.command), label: "failover")
        reminders.start(seed: random.next())
        defer { reminders.stop() }
        var result = FaultResult(injected: 0, survived: 0, lost: 0)
        var takeovers: (kill: [Duration], stop: [Duration]) = ([], [])
        var woken = Woken()
        for cycle in 1...(long ? 40 : 4) {
            guard let (killing, fault, leading, term, successor) = takeover(cycle, of: daemons) else {
                result.failure = result.failure ?? "no daemon said it leads within 10 s before cycle \(cycle)"
                break
            }
            guard progresses(load, beyond: load.acks.count) else {
                result.failure = "no dispatch was acknowledged before cycle \(cycle)"
                break
            }
            pause(20...300)
            let acked = load.acks.count
            var queued: QueuedDispatch?
            let injected = ContinuousClock.now
            if killing {
                leading.kill()
            } else {
                guard leading.pause() else {
                    leading.signal(SIGCONT)
                    result.failure = result.failure ?? "cycle \(cycle): lockstepd did not stop within 2 s of SIGSTOP"
                    break
                }
                queued = try QueuedDispatch(to: leading, text: "fenced-\(cycle)")
            }
            result.injected += 1
            // Timed by a wait that holds this thread, polling every 20 ms.
            let led = successor.waitForStatus(within: .seconds(20)) { $0.role == "leader" && $0.leader != nil }
            let takeover = ContinuousClock.now - injected
            guard let led, let newLeader = led.leader, newLeader.term > term else {
                if !killing { leading.signal(SIGCONT) }
                result.failure =
                    result.failure ?? "cycle \(cycle): the standby did not lead within 20 s of the \(fault); see "
                    + "\(successor.log.path)"
                break
            }
            var problems: [String] = []
            let logged = leading.output.utf8.count
            if let queued {
                takeovers.stop.append(takeover)
                leading.signal(SIGCONT)
                if let problem = try woken.check(queued) { problems.append(problem) }
            } else {
                takeovers.kill.append(takeover)
                try leading.start()
            }
            if takeover > .seconds(5) {
                problems.append("the standby led \(seconds(takeover)) after the \(fault) (the target is 5 s)")
            }
            let standing = leading.waitForStatus(within: .seconds(15)) {
                $0.role == "standby" && $0.leader?.name == newLeader.name && $0.leader?.term == newLeader.term
            }
            if standing == nil {
                problems.append(
                    "after the \(fault) it did not stand by under \(newLeader.name), term \(newLeader.term); see "
                        + "\(leading.log.path)"
                )
            }
            if queued != nil, !woken.readLog(leading, since: logged) {
                problems.append("woken, it logged no commit or renewal refused by the fence; see \(leading.log.path)")
            }
            if !progresses(load, beyond: acked) { problems.append("no dispatch was acknowledged after the takeover") }
            // A quiet moment: nothing in flight, so the leader's state is the one every replica must reach.
            if !load.pause() { problems.append("a dispatch was still in flight after all its tries") }
            if let failure = try converge(watchers, on: successor) { problems.append(failure) }
            load.resume()
            if problems.isEmpty {
                result.survived += 1
            } else {
                // Every cycle's problems are kept: the first is the class's failure, the others are notes.
                let failure = "cycle \(cycle) (\(fault)): " + problems.joined(separator: "; ")
                if result.failure == nil { result.failure = failure } else { result.notes.append(failure) }
            }
        }
        func figures(_ durations: [Duration]) -> String {
            "median \(seconds(median(durations))), worst \(seconds(durations.max())), best \(seconds(durations.min()))"
        }
        result.notes.append(
            "takeover, fault to the other's STATUS saying leader (target 5 s): "
                + "\(figures(takeovers.kill + takeovers.stop)) over \(takeovers.kill.count + takeovers.stop.count); "
                + "kill -9 \(figures(takeovers.kill)); SIGSTOP \(figures(takeovers.stop))"
        )
        result.notes.append(woken.summary)
        let stores = watchers.compactMap { $0.store("todos") }
        result.notes.append(
            "replicas: \(stores.map(\.divergences).reduce(0, +)) divergences, \(stores.map(\.resyncs).reduce(0, +)) "
                + "resyncs, \(stores.map(\.repairs).reduce(0, +)) gaps repaired by range"
        )
        let leader = leader(of: daemons)?.daemon ?? daemons[0]
        reminders.stop()
        drainEffects(reminders, leader: leader, into: &result)
        try settle(
            load,
            leader: leader,
            standbys: daemons.filter { $0 !== leader },
            watchers: watchers,
            absent: woken.texts,
            into: &result
        ) {
            try PostgresJournal(connection: connection, readOnly: true)
        }
        try checkEffects(reminders, service: service, into: &result) {
            try PostgresJournal(connection: connection, readOnly: true)
        }
        return result
    }

    /// A PostgreSQL server of its own and two daemons, `a` and `b`, serving `todos` on one journal in it, started (a
    /// leads): the failover classes' set-up. The caller stops the server and kills the daemons.
    func pair(
        _ label: String,
        domains: [String] = ["todos"],
        environment: [String: String] = [:]
    ) throws -> (server: PostgresServer, connection: String, daemons: [Daemon]) {
        let server = try PostgresServer.start()
        do {
            let connection = try server.createDatabase()
            let hosted = domains.map { "\"\($0)\"" }.joined(separator: ", ")
            let daemons = try ["a", "b"].map { name in
                try Daemon(
                    folder: folder.appendingPathComponent("\(label)-\(name)"),
                    configuration: "journal = \"postgres\"\npostgres = \"\(connection)\"\ndomains = [\(hosted)]\n"
                        + "[lease]\nname = \"\(name)\"\n" + Self.keepHistory,
                    environment: environment
                )
            }
            do {
                try daemons[0].start()
                try daemons[1].start()
            } catch {
                for daemon in daemons { daemon.kill() }
                throw error
            }
            return (server, connection, daemons)
        } catch {
            server.stop()
            throw error
        }
    }

    /// The daemon whose STATUS says it leads, and its term: each is asked in turn, with a second to answer (a
    /// leader busy with a commit and a digest can take longer than the usual 300 ms), for at most 10 s.
    /// Cycle `cycle` of a takeover class: an odd one kills the leader with -9, an even one stops it; the daemon that
    /// leads (asked for 10 s), its term, and the one that is to take over. `nil` when no daemon leads.
    func takeover(
        _ cycle: Int,
        of daemons: [Daemon]
    ) -> (
        killing: Bool, fault: String, leading: Daemon, term: UInt64, successor: Daemon
    )? {
        guard let (leading, term) = leader(of: daemons) else { return nil }
        let killing = cycle % 2 == 1
        return (killing, killing ? "kill -9" : "SIGSTOP", leading, term, daemons.first { $0 !== leading }!)
    }

    func leader(of daemons: [Daemon]) -> (daemon: Daemon, term: UInt64)? {
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline {
            for daemon in daemons {
                if let status = daemon.status(timeout: .seconds(1)), status.role == "leader", let leader = status.leader
                {
                    return (daemon, leader.term)
                }
            }
            Thread.sleep(forTimeInterval: 0.05)
        }
        return nil
    }

    // MARK: - SIGSTOP of a replica

    func stopReplica() throws -> FaultResult {
        try stopReplica(in: "replica", store: "counter", action: #"{"increment":{}}"#)
    }

    /// The same with a replica of a store of ~10 MB, checkpointed off the loop.
    func stopReplicaOfALargeStore() throws -> FaultResult {
        // 180-character texts, like the prefill's: 2,000 commits of 20 are ~8 MB, far more than any buffer holds.
        let text = "while it sleeps " + String(repeating: "z", count: 164)
        return try stopReplica(
            in: "replica-large",
            store: "todos",
            action: #"{"add":{"text":"\#(text)"}}"#,
            prefill: true
        )
    }

    private func stopReplica(
        in name: String,
        store: String,
        action: String,
        prefill: Bool = false
    ) throws
        -> FaultResult
    {
        let daemon = try Daemon(
            folder: folder.appendingPathComponent(name),
            configuration: (prefill ? Self.largeStore : Self.keepHistory) + "[limits]\nevents_queue = 100\n"
        )
        if prefill { try prefillLargeStore(daemon) }
        try daemon.start()
        let watcher = try ReplicaClient(watching: [daemon], stores: [store], eventsQueue: 100)
        let client = CommandClient(context: try Context(), endpoint: daemon.command, timeout: .seconds(5), retries: 2)
        var result = FaultResult(injected: 0, survived: 0, lost: 0)
        var number: UInt64 = 0
        let clientID = ClientID.random()
        for round in 0..<(long ? 5 : 1) {
            // One event first, seen by the replica: its subscription is in place before it is stopped.
            number += 1
            try client.mustAccept(store, action, number: number, clientID: clientID)
            guard watcher.converge(on: try daemon.digests([store]), within: .seconds(60)),
                watcher.store(store)?.phase == "live"
            else {
                result.failure = "the replica did not catch up before round \(round + 1)"
                break
            }
            let repairsBefore = watcher.store(store)?.repairs ?? 0
            watcher.child.signal(SIGSTOP)
            // 40,000 events in 2,000 commits (2,000 EVENTS messages) while it sleeps: far more than both queues and
            // the socket buffers hold.
            for _ in 0..<2_000 {
                number += 1
                try client.mustAccept(store, action, count: 20, number: number, clientID: clientID)
            }
            watcher.child.signal(SIGCONT)
            result.injected += 1
            let expected = try daemon.digests([store])
            guard watcher.converge(on: expected, within: .seconds(60)) else {
                result.failure = "the replica did not repair to \(expected[store]!)"
                break
            }
            let repairs = watcher.store(store)?.repairs ?? 0
            if let resyncs = watcher.store(store)?.resyncs, resyncs > 0 {
                result.failure = "the replica resynced \(resyncs) times instead of repairing the gap"
            } else if repairs > repairsBefore {
                result.survived += 1
            } else {
                result.failure = "no gap formed: the replica lost no events while stopped"
            }
            if let divergences = watcher.store(store)?.divergences, divergences > 0 {
                result.lost += divergences
            }
        }
        result.notes.append(
            "\(result.injected * 40_000) events published while it was stopped; gaps repaired: "
                + "\(watcher.store(store)?.repairs ?? 0)"
        )
        _ = try? watcher.stop()
        if daemon.stop() != 0 { result.failure = "lockstepd did not exit 0 on SIGTERM" }
        return result
    }

    // MARK: - Journal surgery

    /// A stopped daemon's journal cut, padded with garbage or with a byte flipped (a copy each time): the daemon on it
    /// either refuses to start, saying why, or serves exactly the state it had. With `log`, the log journal — and one
    /// copy more with a snapshot file removed.
    func journalSurgery(log: Bool = false) throws -> FaultResult {
        let base = folder.appendingPathComponent(log ? "surgery-log" : "surgery")
        let pristine = try Daemon(
            folder: base.appendingPathComponent("pristine"),
            configuration: (log ? Self.logJournal : Self.sqliteJournal) + "[snapshots]\nevery_events = 500\n"
        )
        try pristine.start()
        let client = CommandClient(context: try Context(), endpoint: pristine.command, timeout: .seconds(5), retries: 2)
        let clientID = ClientID.random()
        for number in 1...30 {
            let store = number % 2 == 0 ? "counter" : "todos"
            let action = store == "counter" ? #"{"increment":{}}"# : #"{"add":{"text":"surgery \#(number)"}}"#
            try client.mustAccept(store, action, count: 100, number: UInt64(number), clientID: clientID)
        }
        let stores = ["counter", "todos", "posts", "numbers"]
        let before = try pristine.digests(stores)
        guard pristine.stop() == 0 else { throw SuiteError("the pristine daemon did not stop cleanly") }
        let fileName = log ? LogJournal.fileName : SQLiteJournal.fileName
        let file = URL(fileURLWithPath: pristine.data).appendingPathComponent(fileName)
        let size = try FileManager.default.attributesOfItem(atPath: file.path)[.size] as! Int
        /// Each cut is made on a copy of the data directory.
        func onFile(_ change: @escaping (FileHandle) throws -> Void) -> (URL) throws -> Void {
            { data in
                let handle = try FileHandle(forUpdating: data.appendingPathComponent(fileName))
                try change(handle)
                try handle.close()
            }
        }
        var cuts: [(String, (URL) throws -> Void)] = [
            ("truncated to 50%", onFile { try $0.truncate(atOffset: UInt64(size / 2)) }),
            ("truncated by one page", onFile { try $0.truncate(atOffset: UInt64(size - 4_096)) }),
            ("truncated mid-page", onFile { try $0.truncate(atOffset: UInt64(size - 1_000)) }),
            (
                "4 KiB of garbage appended",
                onFile { handle in
                    try handle.seekToEnd()
                    handle.write(Data((0..<4_096).map { _ in UInt8.random(in: 0...255) }))
                }
            ),
        ]
        if log {
            cuts.append(
                (
                    "a snapshot file removed",
                    { data in
                        let snapshots = data.appendingPathComponent("snapshots")
                        for name in try FileManager.default.contentsOfDirectory(atPath: snapshots.path).prefix(1) {
                            try FileManager.default.removeItem(at: snapshots.appendingPathComponent(name))
                        }
                    }
                )
            )
        }
        for _ in 0..<(long ? 40 : 6) {
            let offset = UInt64(Int.random(in: 100..<size, using: &random))
            let bit = UInt8(1) << UInt8.random(in: 0..<8, using: &random)
            cuts.append(
                (
                    "byte \(offset) flipped",
                    onFile { handle in
                        try handle.seek(toOffset: offset)
                        let byte = try handle.read(upToCount: 1)![0]
                        try handle.seek(toOffset: offset)
                        handle.write(Data([byte ^ bit]))
                    }
                )
            )
        }
        var result = FaultResult(injected: 0, survived: 0, lost: 0)
        var outcomes: [String: Int] = [:]
        for (index, (name, cut)) in cuts.enumerated() {
            let copy = base.appendingPathComponent("cut-\(index)")
            try FileManager.default.createDirectory(
                at: copy.appendingPathComponent(".lockstep"),
                withIntermediateDirectories: true
            )
            try FileManager.default.copyItem(
                at: URL(fileURLWithPath: pristine.data),
                to: copy.appendingPathComponent(".lockstep/data")
            )
            try cut(copy.appendingPathComponent(".lockstep/data"))
            result.injected += 1
            let damaged = try Daemon(folder: copy, configuration: pristine.configuration)
            try damaged.start(waitForReady: false)
            let deadline = ContinuousClock.now + .seconds(15)
            while damaged.isRunning, damaged.status() == nil, ContinuousClock.now < deadline {
                Thread.sleep(forTimeInterval: 0.02)
            }
            if damaged.isRunning, damaged.status() != nil {
                // It serves: only the state it had is acceptable.
                let now = try damaged.digests(stores)
                if now == before {
                    result.survived += 1
                    outcomes["served the same state", default: 0] += 1
                } else {
                    result.lost += 1
                    result.notes.append("\(name): served \(now) instead of \(before)")
                }
                damaged.kill()
            } else {
                damaged.kill()
                let said = (try? String(contentsOf: damaged.log, encoding: .utf8)) ?? ""
                if said.contains("cannot run"), said.contains("journal") || said.contains(fileName) {
                    result.survived += 1
                    outcomes["refused to start", default: 0] += 1
                    if outcomes["refused to start"] == 1 {
                        result.notes.append(
                            "\(name): " + (said.split(separator: "\n").last { $0.contains("cannot run") } ?? "")
                        )
                    }
                } else {
                    result.failure = "\(name): lockstepd stopped without a clear reason: \(said.suffix(300))"
                }
            }
        }
        result.notes.insert(
            outcomes.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", "),
            at: 0
        )
        return result
    }

    // MARK: - Disk full

    func diskFull(log: Bool = false) throws -> FaultResult {
        let base = folder.appendingPathComponent(log ? "diskfull-log" : "diskfull")
        let mountPoint = base.appendingPathComponent("data")
        try FileManager.default.createDirectory(at: mountPoint, withIntermediateDirectories: true)
        guard run("/bin/mount", ["-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", mountPoint.path]) == 0 else {
            throw SuiteError("cannot mount a 1 MiB tmpfs at \(mountPoint.path) (the suite needs root for this)")
        }
        defer { _ = run("/bin/umount", ["-l", mountPoint.path]) }
        let daemon = try Daemon(
            folder: base,
            configuration: "data_dir = \"\(mountPoint.path)\"\n" + (log ? Self.logJournal : Self.sqliteJournal)
                + Self.keepHistory,
            data: mountPoint.path
        )
        try daemon.start()
        let load = Load(endpoints: [daemon.command], label: "full", threads: 2)
        load.start()
        defer { load.stop() }
        var result = FaultResult(injected: 0, survived: 0, lost: 0)
        let deadline = ContinuousClock.now + .seconds(60)
        while load.refused.isEmpty, ContinuousClock.now < deadline { Thread.sleep(forTimeInterval: 0.01) }
        guard let refusal = load.refused.first else {
            load.stop()
            daemon.kill()
            throw SuiteError("1 MiB never filled up in 60 s")
        }
        result.injected = 1
        result.notes.append("full after \(load.acks.count) dispatches; refused with: \(refusal)")
        // Up with the disk full: it answers ten more dispatches (each refused) and a STATUS.
        let refusedWhenFull = load.refused.count
        let answering = ContinuousClock.now + .seconds(30)
        while load.refused.count < refusedWhenFull + 10, daemon.isRunning, ContinuousClock.now < answering {
            Thread.sleep(forTimeInterval: 0.01)
        }
        guard load.refused.count >= refusedWhenFull + 10, daemon.isRunning, daemon.status(timeout: .seconds(5)) != nil
        else {
            result.failure = "lockstepd did not stay up with a full disk"
            load.stop()
            return result
        }
        let whileFull = load.acks.count
        guard run("/bin/mount", ["-o", "remount,size=64m", mountPoint.path]) == 0 else {
            throw SuiteError("cannot grow the tmpfs")
        }
        if progresses(load, beyond: whileFull) {
            result.survived = 1
        } else {
            result.failure = "lockstepd did not serve again once space returned"
        }
        try settle(daemon, load, watchers: [], into: &result)
        return result
    }

    // MARK: - Power cut

    /// The daemon's journal on the power-cut filesystem; under load it is killed at random moments and the power
    /// cut (everything not fsynced forgotten, all of it, a random prefix, or with a torn last write), then it is
    /// started again on what the disk holds. With `syncOff` (the failpoint `no-sync`: SQLite never fsyncs) the
    /// class must lose acknowledged actions: the proof that it can see a missing fsync.
    /// The power cut on a store of ~10 MB, prefilled through the filesystem (and fsynced) before the daemon starts:
    /// every checkpoint off the loop, a snapshot written at its own seq by a later commit; quick 3 cuts, long 200.
    func powerCutOnALargeStore() throws -> FaultResult {
        try powerCut(largeStore: true)
    }

    func powerCut(syncOff: Bool = false, largeStore: Bool = false, log: Bool = false) throws -> FaultResult {
        let base = folder.appendingPathComponent(
            (syncOff ? "power-nosync" : largeStore ? "power-large" : "power") + (log ? "-log" : "")
        )
        let disk = try UnsyncedFileSystem(folder: base.appendingPathComponent("disk"))
        defer { disk.unmount() }
        // Two levels the daemon must create (and make durable) itself.
        let data = disk.mountPoint.appendingPathComponent("var/lockstep").path
        let daemon = try Daemon(
            folder: base.appendingPathComponent("daemon"),
            configuration: "data_dir = \"\(data)\"\n" + (log ? Self.logJournal : Self.sqliteJournal)
                + (largeStore ? Self.largeStore : Self.keepHistory),
            environment: syncOff ? ["LOCKSTEP_FAILPOINT": "no-sync"] : [:],
            data: data
        )
        let first = largeStore ? try prefillLargeStore(daemon) + 1 : 1
        try daemon.start()
        let watchers = syncOff ? [] : [try ReplicaClient(watching: [daemon], stores: ["todos"])]
        let load = Load(endpoints: [daemon.command], label: syncOff ? "nosync" : "power")
        load.start()
        defer { load.stop() }
        let cycles = syncOff || (largeStore && !long) ? 3 : long ? 200 : 10
        let modes = ["all", "prefix", "torn"]
        var result = FaultResult(injected: 0, survived: 0, lost: 0)
        for cycle in 0..<cycles {
            guard progresses(load, beyond: load.acks.count) else {
                result.failure = "no dispatch was acknowledged before cut \(cycle + 1)"
                break
            }
            pause(20...300)
            daemon.kill()
            try disk.cut(mode: modes[cycle % modes.count], seed: random.next())
            result.injected += 1
            do {
                try daemon.start()
            } catch  where syncOff {
                // Unsynced, the cut can leave SQLite's file itself damaged: then nothing acknowledged is served.
                load.stop()
                result.survived += 1
                result.lost = load.acks.count
                result.control = .loss
                result.notes.append(
                    "with \(log ? "the log journal" : "SQLite") never fsyncing, cut \(cycle + 1) left the journal "
                        + "damaged and lockstepd refused to start on it: all \(load.acks.count) acknowledged "
                        + "dispatches lost, as they must be"
                )
                return result
            }
            if progresses(load, beyond: load.acks.count) { result.survived += 1 }
        }
        try settle(daemon, load, watchers: watchers, from: first, into: &result)
        let journal = try openLocalJournal(directory: data, readOnly: true)
        let problems = try journal.verify()
        try? journal.close()
        if !problems.isEmpty { result.failure = "journal verify after the last cut: \(problems.prefix(3))" }
        if syncOff {
            // Expected: the class proves itself by losing what was never synced.
            result.notes.insert(
                "with \(log ? "the log journal" : "SQLite") never fsyncing: \(result.lost) acknowledged dispatches "
                    + "lost, as they must be",
                at: 0
            )
            result.control = .loss
        } else {
            result.notes.insert("\(cycles) cuts (all, prefix and torn in turn) of what was not fsynced", at: 0)
        }
        return result
    }

    /// The journal's WAL fsync fails with EIO under load: nothing of that batch is acknowledged, the daemon stops
    /// (exit 1, saying why) instead of trusting the page cache, and after a power cut and a restart every
    /// dispatch acknowledged before it is there.
    func fsyncFailure(log: Bool = false) throws -> FaultResult {
        let base = folder.appendingPathComponent(log ? "eio-log" : "eio")
        let disk = try UnsyncedFileSystem(folder: base.appendingPathComponent("disk"))
        defer { disk.unmount() }
        let data = disk.mountPoint.appendingPathComponent("data").path
        // The notification service is off the failing disk, as an outside service is.
        let service = base.appendingPathComponent("service")
        let daemon = try Daemon(
            folder: base.appendingPathComponent("daemon"),
            configuration: "data_dir = \"\(data)\"\ndomains = [\"todos\", \"reminders\"]\n"
                + (log ? Self.logJournal : Self.sqliteJournal)
                + Self.keepHistory,
            environment: ["LOCKSTEP_NOTIFICATIONS": service.path],
            data: data
        )
        try daemon.start()
        let load = Load(endpoints: [daemon.command], label: "eio")
        load.start()
        defer { load.stop() }
        let reminders = ReminderLoad(endpoints: [daemon.command], label: "eio")
        reminders.start(seed: random.next())
        defer { reminders.stop() }
        var result = FaultResult(injected: 0, survived: 0, lost: 0)
        let rounds = long ? 10 : 2
        for round in 0..<rounds {
            guard progresses(load, beyond: load.acks.count) else {
                result.failure = "no dispatch was acknowledged before fault \(round + 1)"
                break
            }
            try disk.failFsync(matching: log ? "*\(LogJournal.fileName)" : "*journal.sqlite-wal", count: 1)
            result.injected += 1
            let deadline = ContinuousClock.now + .seconds(20)
            while daemon.isRunning, ContinuousClock.now < deadline { Thread.sleep(forTimeInterval: 0.01) }
            let log = (try? String(contentsOf: daemon.log, encoding: .utf8)) ?? ""
            guard !daemon.isRunning, daemon.stop() == 1, log.contains("failed a write or an fsync") else {
                result.failure =
                    "after a failed fsync the daemon did not stop with exit 1 and the reason; see \(daemon.log.path)"
                break
            }
            // The worst case: the power goes right after. What the disk holds is what counts.
            try disk.clearFaults()
            try disk.cut(mode: "all", seed: random.next())
            try daemon.start()
            if progresses(load, beyond: load.acks.count) { result.survived += 1 }
        }
        reminders.stop()
        drainEffects(reminders, leader: daemon, into: &result)
        try settle(daemon, load, watchers: [], into: &result)
        try checkEffects(reminders, service: service, into: &result) {
            try openLocalJournal(directory: data, readOnly: true)
        }
        result.notes.insert(
            "each fault: the daemon stopped (exit 1) naming the failed fsync; power cut; restarted",
            at: 0
        )
        return result
    }

    // MARK: - Bad input

    func badInput() throws -> FaultResult {
        // Under a policy (docs/security.md) that lets this process read every store and add todos, nothing else: the
        // bad messages go through its checks too, and dispatches of what it does not grant are answered forbidden.
        let policy = """
            [identities]
            suite = ["uid:\(getuid())"]
            [read]
            suite = ["*"]
            [dispatch]
            suite = ["todos:add"]

            """
        let daemon = try Daemon(
            folder: folder.appendingPathComponent("input"),
            configuration: Self.keepHistory + "[limits]\nmax_message_bytes = 65536\n" + policy
        )
        try daemon.start()
        let stores = ["counter", "todos", "posts", "numbers"]
        let before = try daemon.digests(stores)
        // The baseline once the daemon has settled: two readings 20 ms apart that agree (for at most 5 s).
        var memoryBefore = daemon.memory()
        for _ in 0..<250 {
            Thread.sleep(forTimeInterval: 0.02)
            let again = daemon.memory()
            if again.residentKiB == memoryBefore.residentKiB { break }
            memoryBefore = again
        }
        let count = long ? 100_000 : 10_000
        let context = try Context()
        let socket = try Socket(context, type: .dealer)
        try socket.set(.linger, 0)
        try socket.connect(daemon.command)
        var replies = 0
        var kinds: [String: Int] = [:]
        for index in 0..<count {
            let (kind, frames) = badMessage(index)
            kinds[kind, default: 0] += 1
            // A daemon that died stops taking messages: give up on it rather than wait for ever.
            let deadline = ContinuousClock.now + .seconds(10)
            while try !socket.send(frames, wait: false) {
                while try socket.receive(wait: false) != nil { replies += 1 }
                guard daemon.isRunning, ContinuousClock.now < deadline else { break }
                Thread.sleep(forTimeInterval: 0.001)
            }
            guard daemon.isRunning else { break }
            if index % 256 == 0 { while try socket.receive(wait: false) != nil { replies += 1 } }
        }
        let deadline = ContinuousClock.now + .seconds(5)
        while ContinuousClock.now < deadline {
            guard try socket.receive(wait: false) != nil else {
                Thread.sleep(forTimeInterval: 0.05)
                continue
            }
            replies += 1
        }
        socket.close()
        var result = FaultResult(injected: count, survived: 0, lost: 0)
        result.notes.append(kinds.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", "))
        guard daemon.isRunning, daemon.status() != nil else {
            result.failure = "lockstepd did not survive; see \(daemon.log.path)"
            return result
        }
        let after = try daemon.digests(stores)
        let memoryAfter = daemon.memory()
        let forbidden = daemon.status()?.refused?["forbidden"] ?? 0
        let sentForbidden = (kinds["forbidden store"] ?? 0) + (kinds["forbidden action case"] ?? 0)
        if forbidden < UInt64(sentForbidden) {
            result.failure = "\(sentForbidden) forbidden dispatches sent, but STATUS counts \(forbidden) forbidden"
        }
        result.notes.append("\(forbidden) answered forbidden (counted in STATUS)")
        result.notes.append(
            "\(replies) ERROR replies read (an oversized part is answered too_large: it is under 4 × the limit); "
                + "resident memory \(memoryBefore.residentKiB / 1024) → \(memoryAfter.residentKiB / 1024) MiB "
                + "(peak \(memoryAfter.peakKiB / 1024) MiB)"
        )
        if after != before {
            result.lost = 1
            result.failure = "the state changed: \(before) → \(after)"
        } else if result.failure != nil {
            // Set above.
        } else if memoryAfter.residentKiB - memoryBefore.residentKiB > 64 * 1024 {
            result.failure =
                "resident memory grew by \((memoryAfter.residentKiB - memoryBefore.residentKiB) / 1024) MiB"
        } else {
            result.survived = count
        }
        if daemon.stop() != 0 { result.failure = "lockstepd did not exit 0 on SIGTERM" }
        return result
    }

    /// The `index`-th bad message: never a dispatch the daemon may apply — malformed, or forbidden by its policy — so
    /// nothing may change.
    private func badMessage(_ index: Int) -> (String, [Frame]) {
        func bytes(_ count: Int) -> Frame { (0..<count).map { _ in UInt8(truncatingIfNeeded: random.next()) } }
        func dispatch(_ store: String, _ actions: [String]) -> [Frame] {
            Request.dispatch(
                DispatchRequest(
                    requestID: UInt64(index + 1),
                    domainVersion: 1,
                    clientID: ClientID.random(),
                    store: try! StoreName(store),
                    actions: actions.map { Array($0.utf8) }
                )
            ).encode()
        }
        let valid = dispatch("counter", [#"{"increment":{}}"#])
        switch index % 14 {
        case 0: return ("random single frame", [bytes(Int.random(in: 0...64, using: &random))])
        case 1:
            let frames = (0..<Int.random(in: 1...8, using: &random)).map { _ in
                bytes(Int.random(in: 0...32, using: &random))
            }
            return ("random frames", frames)
        case 2:
            let header = valid[0]
            return (
                "truncated header",
                [Array(header.prefix(Int.random(in: 0..<header.count, using: &random)))] + valid.dropFirst()
            )
        case 3: return ("header only", [valid[0]])
        case 4:
            var header = valid[0]
            header[2] = 9
            return ("wrong protocol version", [header] + valid.dropFirst())
        case 5: return ("unknown store", [valid[0], Array("no-such-store".utf8), valid[2]])
        case 6: return ("undecodable action", [valid[0], valid[1], Array(#"{"bogus":1}"#.utf8)])
        case 7: return ("random action bytes", [valid[0], valid[1], bytes(Int.random(in: 0...100, using: &random))])
        case 8:
            var header = valid[0]
            header[15] ^= 0xFF  // inside the domain version
            return ("wrong domain version", [header] + valid.dropFirst())
        case 9: return ("empty frame", [[]])
        case 12: return ("forbidden store", valid)
        case 13:
            return (
                "forbidden action case", dispatch("todos", [#"{"add":{"text":"granted"}}"#, #"{"toggle":{"id":1}}"#])
            )
        case 10 where index % 140 == 10:
            return ("too many frames", [valid[0], valid[1]] + Array(repeating: valid[2], count: 1_500))
        case 11 where index % 140 == 11:
            return ("oversized part", [valid[0], valid[1], bytes(70_000)])
        default:
            var header = valid[0]
            header[3] = UInt8.random(in: 0x05...0x7F, using: &random)
            return ("unknown message type", [header] + valid.dropFirst())
        }
    }

    // MARK: - CURVE

    func curve() throws -> FaultResult {
        let base = folder.appendingPathComponent("curve")
        try FileManager.default.createDirectory(at: base, withIntermediateDirectories: true)
        let keys = try SuiteCurve(in: base)
        let (server, listed) = (keys.server, keys.client)
        let unlisted = try CurveKeyPair.generate()
        let port = Int.random(in: 30_000..<60_000, using: &random)
        let daemon = try Daemon(
            folder: base,
            configuration: """
                command_endpoint = "tcp://127.0.0.1:\(port)"
                events_endpoint = "tcp://127.0.0.1:\(port + 1)"

                """ + keys.configuration
        )
        try daemon.start(waitForReady: false)
        let endpoint = "tcp://127.0.0.1:\(port)"
        func dispatch(_ curve: ClientCurve?, timeout: Duration) throws -> Reply? {
            let client = CommandClient(
                context: try Context(),
                endpoint: endpoint,
                timeout: timeout,
                retries: 0,
                curve: curve
            )
            return try? client.dispatch("counter", #"{"increment":{}}"#, number: 1, clientID: ClientID.random())
        }
        // The listed key gets through (asking until the daemon is up).
        var accepted = false
        for _ in 0..<30 where !accepted {
            if case .accepted? = try dispatch(
                ClientCurve(keys: listed, serverPublicKey: server.publicKey),
                timeout: .milliseconds(500)
            ) {
                accepted = true
            }
        }
        guard accepted else { throw SuiteError("the listed CURVE client never got through; see \(daemon.log.path)") }
        var result = FaultResult(injected: 0, survived: 0, lost: 0)
        let wrongServer = try CurveKeyPair.generate()
        let attempts: [(String, ClientCurve?)] = [
            ("an unlisted key", ClientCurve(keys: unlisted, serverPublicKey: server.publicKey)),
            ("no encryption", nil),
            ("the wrong server key", ClientCurve(keys: listed, serverPublicKey: wrongServer.publicKey)),
        ]
        for (name, curve) in attempts {
            result.injected += 1
            if let reply = try dispatch(curve, timeout: .seconds(1)) {
                result.lost += 1
                result.notes.append("\(name) was answered: \(reply)")
            } else {
                result.survived += 1
            }
        }
        // Random bytes straight at the TCP port.
        let connections = long ? 10_000 : 300
        for _ in 0..<connections {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = in_port_t(UInt16(port).bigEndian)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            if connected == 0 {
                let junk = (0..<Int.random(in: 1...512, using: &random)).map { _ in
                    UInt8(truncatingIfNeeded: random.next())
                }
                _ = junk.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            }
            close(fd)
        }
        result.injected += 1
        if case .accepted(_, _, let seq, _)? = try dispatch(
            ClientCurve(keys: listed, serverPublicKey: server.publicKey),
            timeout: .seconds(5)
        ) {
            // Only the listed client's two dispatches ever landed.
            if seq == 2 { result.survived += 1 } else { result.lost += 1 }
            result.notes.append("\(connections) connections of random bytes; the listed client's next seq: \(seq)")
        } else {
            result.failure = "lockstepd stopped answering after random bytes on its port"
        }
        if daemon.stop() != 0 { result.failure = "lockstepd did not exit 0 on SIGTERM" }
        return result
    }

    // MARK: - Clock jump

    /// libfaketime's path (Debian's faketime), which fakes the clocks of a process it is preloaded into.
    static func libfaketime() throws -> String {
        let candidates = [
            "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
            "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
            "/usr/lib/faketime/libfaketime.so.1",
        ]
        guard let library = candidates.first(where: { FileManager.default.fileExists(atPath: $0) }) else {
            throw SuiteError("libfaketime is not installed (apt-get install faketime)")
        }
        return library
    }

    func clockJump() throws -> FaultResult {
        let library = try Self.libfaketime()
        let base = folder.appendingPathComponent("clock")
        try FileManager.default.createDirectory(at: base, withIntermediateDirectories: true)
        let clock = base.appendingPathComponent("faketime")
        try "+0\n".write(to: clock, atomically: true, encoding: .utf8)
        // The wall clock jumps, as when NTP steps it; the monotonic clock never does.
        let daemon = try Daemon(
            folder: base,
            configuration: "domains = [\"todos\", \"reminders\"]\n" + Self.keepHistory,
            environment: [
                "LD_PRELOAD": library, "FAKETIME_TIMESTAMP_FILE": clock.path, "FAKETIME_NO_CACHE": "1",
                "DONT_FAKE_MONOTONIC": "1",
            ]
        )
        try daemon.start()
        // Timers on the daemon's wall clock (docs/effects.md, "Which clock"): reminders due in 10 days must not
        // fire on the -2d jump, must all fire on the +365d one; those added then, due in a day, fire at once; those
        // added after the -1y jump, due in an hour, never fire here.
        let reminders = CommandClient(context: try Context(), endpoint: daemon.command)
        let timerClient = ClientID.random()
        var reminder = 0
        func addReminders(dueIn milliseconds: Int64) throws {
            for _ in 0..<5 {
                reminder += 1
                let due = Int64(Date().timeIntervalSince1970 * 1_000) + milliseconds
                try reminders.mustAccept(
                    "reminders",
                    #"{"add":{"dueMilliseconds":\#(due),"text":"clock-\#(reminder)"}}"#,
                    number: UInt64(reminder),
                    clientID: timerClient
                )
            }
        }
        func timers(_ status: DaemonStatus?) -> Int? {
            status?.stores.first { $0.name == "reminders" }?.effects?.timers
        }
        func timersSet() -> Int? { timers(daemon.status()) }
        try addReminders(dueIn: 10 * 86_400_000)
        let watcher = try ReplicaClient(watching: [daemon], stores: ["todos"])
        let load = Load(endpoints: [daemon.command], label: "clock", threads: 2)
        load.start()
        defer { load.stop() }
        var result = FaultResult(injected: 0, survived: 0, lost: 0)
        for jump in ["-2d", "+365d", "-1y", "+0"] {
            Thread.sleep(forTimeInterval: 0.3)
            let before = load.acks.count
            try "\(jump)\n".write(to: clock, atomically: true, encoding: .utf8)
            result.injected += 1
            if progresses(load, beyond: before) { result.survived += 1 }
            switch jump {
            case "-2d":
                if timersSet() != 5 {
                    result.failure = "a timer due in 10 days fired 2 days back: \(timersSet() ?? -1) set"
                }
            case "+365d":
                // Early by the jump: all five fire; five more, due in a day, are due at once.
                if daemon.waitForStatus(within: .seconds(10), until: { timers($0) == 0 }) == nil {
                    result.failure = "the +365d jump left \(timersSet() ?? -1) timers due in 10 days unfired"
                }
                try addReminders(dueIn: 86_400_000)
                if daemon.waitForStatus(within: .seconds(10), until: { timers($0) == 0 }) == nil {
                    result.failure = "at +365d, \(timersSet() ?? -1) timers due in a day did not fire at once"
                }
            case "-1y":
                try addReminders(dueIn: 3_600_000)
            default:
                break
            }
        }
        // Idle for more than the silence limit: heartbeats must keep coming across the jumps.
        load.stop()
        try "-3d\n".write(to: clock, atomically: true, encoding: .utf8)
        Thread.sleep(forTimeInterval: 4)
        watcher.wait(within: .milliseconds(100)) { _ in false }
        if let resyncs = watcher.store("todos")?.resyncs, resyncs > 0 {
            result.failure = "the replica resynced \(resyncs) times across the jumps"
        }
        try settle(daemon, load, watchers: [watcher], into: &result)
        // Each timer once, or (those due in an hour) never; the latter still set.
        let journal = try openLocalJournal(directory: daemon.data, readOnly: true)
        defer { try? journal.close() }
        guard case let .events(events) = try journal.events(store: "reminders", from: 1, to: .max, limit: 1_000) else {
            throw SuiteError("the reminders history was compacted")
        }
        var fired: [Int: Int] = [:]
        for event in events {
            if case let .flagOverdue(id) = try JSONDecoder().decode(Reminders.Action.self, from: Data(event.action)) {
                fired[id, default: 0] += 1
            }
        }
        let expected = Dictionary(uniqueKeysWithValues: (1...10).map { ($0, 1) })
        let left = try journal.outbox().timers.count
        if fired != expected || left != 5 {
            result.lost += 1
            result.notes.append(
                "timers fired \(fired.sorted { $0.key < $1.key }) (expected 1…10 once each), \(left) left (5)"
            )
        } else {
            result.notes.append(
                "timers: 5 due in 10 days fired once each on the +365d jump, 5 due in a day at once, 5 due in an hour "
                    + "after the -1y jump never (still set)"
            )
        }
        return result
    }

    private func run(_ executable: String, _ arguments: [String]) -> Int32 {
        guard let child = try? ChildProcess(executable: URL(fileURLWithPath: executable), arguments),
            let output = try? child.finish(within: .seconds(30))
        else { return -1 }
        return output.status
    }
}
