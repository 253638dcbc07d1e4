import Foundation
import Lockstep
import LockstepClient
import LockstepExamples
import LockstepProtocol
import LockstepTesting
import Synchronization
import TestSupport
import Testing
import ZeroMQ

#if canImport(Glibc)
import Glibc
#endif

/// Optimistic dispatch: a replica in this process against a real `lockstepd` (and, where said, other processes
/// writing to it). An optimistic dispatch is sent again for a minute before it is given up, so a broken one would
/// keep a handle waiting: the time limit ends such a test as a failure.
@Suite(.timeLimit(.minutes(3))) struct OptimisticTests {
    /// A daemon in a new directory, serving.
    func startDaemon(_ label: String) async throws -> (DaemonProcess, String) {
        let directory = try TestSupport.temporaryDirectory(label).path
        let daemon = try DaemonProcess(directory: directory)
        try await daemon.waitUntilServing()
        return (daemon, directory)
    }

    /// Runs `body` with a replica of `D` that is running against `daemon` (its configuration changed by `adjust`),
    /// and stops it afterwards.
    func withReplica<D: Domain, T>(
        _ domain: D.Type,
        _ daemon: DaemonProcess,
        _ adjust: (inout ReplicaConfiguration) -> Void = { _ in },
        _ body: (Replica<D>) async throws -> T
    ) async throws -> T {
        var configuration = ReplicaConfiguration(commandEndpoint: daemon.command, eventsEndpoint: daemon.events)
        configuration.requestTimeout = .milliseconds(500)
        // Generous on a loaded machine: catching up after a daemon restart must not count as "not applied".
        configuration.readYourWritesTimeout = .seconds(60)
        adjust(&configuration)
        let replica = try Replica(D.self, configuration: configuration)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await replica.run() }
            try await replica.waitUntilLive(timeout: .seconds(60))
            let result = try await body(replica)
            group.cancelAll()
            try await group.waitForAll()
            return result
        }
    }

    /// The daemon's (seq, digest) of `store`, asked on a thread of its own.
    func daemonDigest(
        _ daemon: DaemonProcess,
        _ store: String
    ) async throws -> (seq: SequenceNumber, digest: StateDigest)? {
        let endpoint = daemon.command
        return try await offPool("daemon digest") { () throws -> (seq: SequenceNumber, digest: StateDigest)? in
            let client = CommandClient(context: try Context(), endpoint: endpoint, timeout: .seconds(1), retries: 10)
            guard
                case let .snapshot(_, snapshot) = try client.call(.snapshot(requestID: 1, store: try StoreName(store)))
            else { return nil }
            return (snapshot.seq, snapshot.digest)
        }
    }

    /// Whether the replica's confirmed state is the daemon's, digest for digest.
    func agrees<D: Domain>(_ replica: Replica<D>, with daemon: DaemonProcess) async throws -> Bool {
        try await eventually(within: .seconds(30)) {
            guard let (seq, digest) = try await daemonDigest(daemon, D.name) else { return false }
            let current = replica.current
            let mine = StateDigest(of: Array(try CanonicalEncoding.encode(current.state)))
            return current.seq == seq && mine == digest
        }
    }

    @Test func nothingIsDispatchedOptimisticallyBeforeTheReplicaJoined() async throws {
        let replica = try Replica(Numbers.self, configuration: ReplicaConfiguration())
        let early = await #expect(throws: ClientError.self) {
            try await replica.dispatchOptimistically(.add(number: 1))
        }
        #expect(early?.code == .unavailable)
        #expect(early?.reason.contains("has not joined") == true, "\(String(describing: early))")
        #expect(replica.pending.isEmpty)
    }

    @Test func aLocalRejectionThrowsAtOnceAndTheQueueIsBounded() async throws {
        let (daemon, directory) = try await startDaemon("optimistic-local")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // This replica hears no events, so what it dispatches is accepted but never confirmed here: it stays pending.
        try await withReplica(
            Numbers.self,
            daemon,
            {
                $0.eventsEndpoint = "ipc://\(directory)/no-events-here"
                $0.sync.silenceLimit = .seconds(120)
                $0.maximumPending = 2
            }
        ) { replica in
            let refused = await #expect(throws: Rejection.self) {
                try await replica.dispatchOptimistically(.delete(index: 0))
            }
            #expect(refused?.code == "out_of_range", "\(String(describing: refused))")
            #expect(replica.pending.isEmpty)
            #expect(replica.state == Numbers.initialState)

            try await replica.dispatchOptimistically(.add(number: 7))
            try await replica.dispatchOptimistically(.delete(index: 0))
            #expect(replica.state.numbers == [])
            #expect(replica.confirmedState == Numbers.initialState)
            #expect(replica.pending.map(\.actions) == [[.add(number: 7)], [.delete(index: 0)]])
            let full = await #expect(throws: ClientError.self) {
                try await replica.dispatchOptimistically(.add(number: 8))
            }
            #expect(full?.code == .tooManyPending)
            #expect(full?.reason.contains("bound of 2") == true, "\(String(describing: full))")
            #expect(replica.pending.count == 2)
            #expect(replica.status.pendingActions == 2)
            #expect(try await eventually(within: .seconds(10)) { replica.pending.allSatisfy { $0.status != .queued } })
        }
        #expect(await daemon.stop() == 0)
    }

    @Test func theOptimisticStateShowsTheActionBeforeTheDaemonAnswers() async throws {
        let (daemon, directory) = try await startDaemon("optimistic-first")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await withReplica(Counter.self, daemon) { replica in
            // What the optimistic view showed first, and the confirmed state at that moment.
            let seen = Mutex<[(optimistic: Int, confirmed: Int)]>([])
            let subscription = replica.subscribe({ $0.count }) { count in
                seen.withLock { $0.append((count, replica.confirmedState.count)) }
            }
            defer { subscription.cancel() }
            let handle = try await replica.dispatchOptimistically(.increment)
            // The subscriber ran while the action was applied here, before it was even handed to the replica's
            // thread to send: the confirmed state cannot hold it then.
            let first = seen.withLock { $0.first { $0.optimistic == 1 } }
            #expect(first?.confirmed == 0)
            #expect(replica.state.count == 1)
            #expect(try await handle.seq == 1)
            #expect(replica.confirmedState.count == 1)
            #expect(try await eventually(within: .seconds(10)) { replica.pending.isEmpty })
            #expect(replica.state == replica.confirmedState)
        }
        #expect(await daemon.stop() == 0)
    }

    @Test func aRejectionByTheDaemonRollsBack() async throws {
        let (daemon, directory) = try await startDaemon("optimistic-rejected")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        func lockstep(_ arguments: [String]) async throws {
            let result = try await runProduct("lockstep", arguments + ["--command-endpoint", daemon.command])
            #expect(result.status == 0, "lockstep \(arguments): \(result.standardError)")
        }
        try await lockstep(["dispatch", "numbers", #"{"add":{"number":1}}"#])
        try await lockstep(["dispatch", "numbers", #"{"add":{"number":2}}"#])
        // This replica hears no events: after joining it keeps [1, 2] while another process deletes the 2.
        try await withReplica(
            Numbers.self,
            daemon,
            {
                $0.eventsEndpoint = "ipc://\(directory)/no-events-here"
                $0.sync.silenceLimit = .seconds(120)
            }
        ) { replica in
            #expect(replica.state.numbers == [1, 2])
            let rollbacks = replica.rollbacks()
            let seen = Mutex<[[Int]]>([])
            let subscription = replica.subscribe({ $0.numbers }) { numbers in seen.withLock { $0.append(numbers) } }
            defer { subscription.cancel() }
            try await lockstep(["dispatch", "numbers", #"{"delete":{"index":1}}"#])
            let handle = try await replica.dispatchOptimistically(.delete(index: 1))
            let rejection = await #expect(throws: Rejection.self) { try await handle.seq }
            #expect(rejection?.code == "out_of_range", "\(String(describing: rejection))")
            // Shown at once, then rolled back: the optimistic state is the confirmed one again, and it was told.
            #expect(try await eventually(within: .seconds(10)) { seen.withLock { $0 } == [[1, 2], [1], [1, 2]] })
            #expect(replica.state.numbers == [1, 2])
            #expect(replica.pending.isEmpty)
            let told = await collect(rollbacks, within: .seconds(10)) { !$0.isEmpty }
            #expect(told.first?.requestNumber == handle.requestNumber)
            #expect(told.first?.actions == [.delete(index: 1)])
            #expect(told.first?.error is Rejection)
        }
        #expect(await daemon.stop() == 0)
    }

    /// While nothing is pending and no subscription watches it, the optimistic state is not rebuilt on each
    /// confirmed change; an optimistic dispatch, a subscription and a `states()` stream each start on the newest one.
    /// (The replica's own `dispatch` returns once its change is applied here, so each step starts from a known state;
    /// another process writes in between.)
    @Test func theOptimisticStateCatchesUpWhenADispatchOrASubscriptionStarts() async throws {
        let (daemon, directory) = try await startDaemon("optimistic-catch-up")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        func lockstep(_ action: String) async throws {
            let result = try await runProduct(
                "lockstep",
                ["dispatch", "numbers", action, "--command-endpoint", daemon.command]
            )
            #expect(result.status == 0, "lockstep dispatch \(action): \(result.standardError)")
        }
        try await withReplica(Numbers.self, daemon) { replica in
            try await lockstep(#"{"add":{"number":1}}"#)
            #expect(try await replica.dispatch(.add(number: 2)) == 2)
            // Valid only on the newest confirmed state: index 1 is out of range on any older one.
            let handle = try await replica.dispatchOptimistically(.delete(index: 1))
            #expect(replica.state.numbers == [1])
            #expect(try await handle.seq == 3)
            #expect(try await eventually(within: .seconds(10)) { replica.pending.isEmpty })

            try await lockstep(#"{"add":{"number":4}}"#)
            #expect(try await replica.dispatch(.add(number: 6)) == 5)
            let seen = Mutex<[[Int]]>([])
            let subscription = replica.subscribe({ $0.numbers }) { numbers in seen.withLock { $0.append(numbers) } }
            defer { subscription.cancel() }
            let states = replica.states()
            try await lockstep(#"{"add":{"number":5}}"#)
            #expect(try await eventually(within: .seconds(10)) { seen.withLock { $0 } == [[1, 4, 6], [1, 4, 6, 5]] })
            let streamed = await collect(states, within: .seconds(10)) { $0.last?.seq == 6 }
            #expect(streamed.map(\.seq) == [5, 6])
            #expect(streamed.map(\.state.numbers) == [[1, 4, 6], [1, 4, 6, 5]])
        }
        #expect(await daemon.stop() == 0)
    }

    /// Where the optimistic state's base stands, for a subscriber: its seq, how many of this replica's todos it
    /// holds, and whether any of them is still pending on it.
    struct BaseOfMine: Equatable, Sendable {
        var seq: SequenceNumber
        var mine: Int
        var pending: Bool
    }

    @Test func rebasingUnderAnotherWritingProcessCountsNothingTwice() async throws {
        let (daemon, directory) = try await startDaemon("optimistic-rebase")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var other: ReplicaClient?
        let mine = 150
        try await withReplica(Todos.self, daemon) { replica in
            // Every optimistic state: none of this replica's todos twice (the other process's texts may repeat),
            // and none once shown then gone (nothing of it is rejected: one that left would be a rebase losing it).
            let problems = Mutex<[String]>([])
            let shown = Mutex<Set<String>>([])
            let subscription = replica.subscribe({ $0.list.items.map(\.text).filter { $0.hasPrefix("mine ") } }) {
                texts in
                let own = Set(texts)
                if own.count != texts.count {
                    problems.withLock { $0.append("one of mine twice: \(texts.sorted().suffix(5))") }
                }
                shown.withLock { shown in
                    if !shown.isSubset(of: own) {
                        problems.withLock { $0.append("gone: \(shown.subtracting(own).sorted())") }
                    }
                    shown = own
                }
            }
            defer { subscription.cancel() }
            // What the test is about: a rebase onto another process's changes while some of this replica's todos are
            // pending. A subscriber sees it as a base that moved on by more changes than it took todos of mine, with
            // some of mine still pending on it.
            let rebasedOntoOthers = Mutex(false)
            let lastBase = Mutex<BaseOfMine?>(nil)
            let bases = replica.subscribe(optimistic: { read in
                BaseOfMine(
                    seq: read.base.seq,
                    mine: read.base.state.list.items.count(where: { $0.text.hasPrefix("mine ") }),
                    pending: !read.pending.isEmpty
                )
            }) { base in
                let others = lastBase.withLock { last in
                    defer { last = base }
                    guard let previous = last, base.seq > previous.seq else { return false }
                    return base.seq - previous.seq > UInt64(max(0, base.mine - previous.mine))
                }
                if others, base.pending { rebasedOntoOthers.withLock { $0 = true } }
            }
            defer { bases.cancel() }
            // The other process writes 1,000 actions from now on; once its first is confirmed here, this replica
            // dispatches its own at once, and ten more at each poll until a rebase onto the other's changes with
            // some of mine pending was seen — fewer while many are pending, so that a slow daemon (a busy machine)
            // does not bring the replica to its bound of pending dispatches.
            let writer = try ReplicaClient(daemon, stores: ["todos"], actions: 1_000)
            other = writer
            let writing = try await eventually(within: .seconds(60)) { replica.seq > 0 }
            try #require(writing, "the other process wrote nothing in 60 s")
            var handles: [OptimisticDispatch] = []
            let interleaved = try await eventually(within: .seconds(60)) {
                let more = handles.isEmpty ? mine : (replica.pending.count < 300 ? 10 : 0)
                for _ in 0..<more {
                    handles.append(try await replica.dispatchOptimistically(.add(text: "mine \(handles.count)")))
                }
                return rebasedOntoOthers.withLock { $0 }
            }
            #expect(interleaved, "no rebase onto the other process's changes with some of mine pending")
            var seqs: [SequenceNumber] = []
            for handle in handles { seqs.append(try await handle.seq) }
            #expect(Set(seqs).count == handles.count)
            let written = await writer.wait(within: .seconds(60)) { $0.done }
            #expect(written?.done == true && written?.failed == 0, "\(String(describing: written))")
            #expect(try await agrees(replica, with: daemon))
            #expect(try await eventually(within: .seconds(10)) { replica.pending.isEmpty })
            #expect(replica.state == replica.confirmedState)
            let texts = replica.confirmedState.list.items.map(\.text)
            #expect(texts.filter { $0.hasPrefix("mine ") }.count == handles.count)
            #expect(problems.withLock { $0 }.isEmpty, "\(problems.withLock { $0.prefix(2) })")
        }
        _ = try await other?.stop()
        #expect(await daemon.stop() == 0)
    }

    /// Where the optimistic state's base stands, for a subscriber: its seq, and whether a dispatch on it is still
    /// unanswered (queued or sent, not accepted).
    struct BaseAndUnanswered: Equatable, Sendable {
        var seq: SequenceNumber
        var unanswered: Bool
    }

    @Test func aSteadyStreamOfDispatchesIsConfirmedWhileItFlows() async throws {
        let (daemon, directory) = try await startDaemon("optimistic-steady")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let least = 3_000
        try await withReplica(Counter.self, daemon, { $0.maximumPending = 100_000 }) { replica in
            // Dispatched ten at a time, whatever has been answered, so several are always in flight: whenever a
            // confirmed change arrives, some dispatch sent before it is likely unanswered. The optimistic state must
            // still move onto the newest confirmed change none of them holds up, settling what it holds while the
            // stream flows. A subscriber sees that as a base that moved on while a dispatch on it was still
            // unanswered; the stream flows until it has (and at least 3,000 were dispatched), for at most a minute.
            // The poll's millisecond spreads the stream; what is checked does not depend on it.
            let settledWhileFlowing = Mutex(false)
            let lastBase = Mutex<SequenceNumber?>(nil)
            let bases = replica.subscribe(optimistic: { read in
                BaseAndUnanswered(
                    seq: read.base.seq,
                    unanswered: read.pending.contains {
                        if case .accepted = $0.status { false } else { true }
                    }
                )
            }) { base in
                let moved = lastBase.withLock { last in
                    defer { last = base.seq }
                    return last.map { base.seq > $0 } ?? false
                }
                if moved, base.unanswered { settledWhileFlowing.withLock { $0 = true } }
            }
            defer { bases.cancel() }
            var handles: [OptimisticDispatch] = []
            let flowed = try await eventually(within: .seconds(60), every: .milliseconds(1)) {
                for _ in 0..<10 { handles.append(try await replica.dispatchOptimistically(.increment)) }
                return handles.count >= least && settledWhileFlowing.withLock { $0 }
            }
            #expect(flowed, "\(handles.count) dispatched, and none settled while another was unanswered")
            for handle in handles { _ = try await handle.seq }
            #expect(replica.confirmedState.count == handles.count)
            #expect(try await eventually(within: .seconds(10)) { replica.pending.isEmpty })
            #expect(replica.state == replica.confirmedState)
        }
        #expect(await daemon.stop() == 0)
    }

    @Test func aDaemonKilledWithActionsPendingAppliesEachOnceAfterItsRestart() async throws {
        let directory = try TestSupport.temporaryDirectory("optimistic-kill").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var daemon = try DaemonProcess(directory: directory)
        try await daemon.waitUntilServing()
        let total = 300
        /// Whether the daemon answered the dispatch: accepted, or confirmed since.
        func answered(_ handle: OptimisticDispatch) -> Bool {
            switch handle.status {
            case .confirmed, .pending(.accepted): true
            default: false
            }
        }
        let restarted = try await withReplica(Todos.self, daemon, { $0.maximumPending = total }) { replica in
            var handles: [OptimisticDispatch] = []
            var restarted: DaemonProcess?
            for index in 0..<total {
                handles.append(try await replica.dispatchOptimistically(.add(text: "item \(index)")))
                if index == 49 {
                    // Once one of the first fifty is answered, the daemon stops: each of them answered, committed
                    // but unanswered, or not yet committed.
                    let one = try await eventually(within: .seconds(30)) { handles.contains(where: answered) }
                    try #require(one, "none of the first fifty was answered; log:\n\(daemon.output)")
                    daemon.signal(SIGSTOP)
                    let stopped = try await eventually(within: .seconds(10), every: .milliseconds(1)) {
                        everyThreadStopped(daemon.processIdentifier)
                    }
                    try #require(stopped, "the daemon's threads did not all stop")
                }
                if index == 99 {
                    // The next fifty went to the stopped daemon, which never read them: kill -9.
                    let answeredAtKill = handles.filter(answered).count
                    #expect((1...50).contains(answeredAtKill), "\(answeredAtKill) of the first hundred answered")
                    daemon.kill()
                }
                if index == 199 {
                    let again = try DaemonProcess(directory: directory)
                    try await again.waitUntilServing()
                    restarted = again
                }
            }
            // Every one is confirmed once: resent with its key, the daemon answers what it had from its journal.
            var seqs: [SequenceNumber] = []
            for handle in handles { seqs.append(try await handle.seq) }
            #expect(Set(seqs).count == total)
            let texts = replica.confirmedState.list.items.map(\.text)
            #expect(texts.count == total)
            #expect(Set(texts) == Set((0..<total).map { "item \($0)" }))
            #expect(
                try await eventually(within: .seconds(10)) { replica.pending.isEmpty },
                "\(replica.pending.prefix(3))"
            )
            let same = try await eventually(within: .seconds(10)) { replica.state == replica.confirmedState }
            let counts = (replica.state.list.items.count, replica.confirmedState.list.items.count)
            #expect(same, "optimistic \(counts.0) todos, confirmed \(counts.1)")
            if let restarted { #expect(try await agrees(replica, with: restarted)) }
            // Nothing is counted as pending any more: a batch of the whole bound is taken.
            let again = try await replica.dispatchOptimistically(batch: (0..<total).map { .add(text: "again \($0)") })
            #expect(try await again.seqs.count == total)
            return restarted
        }
        daemon = try #require(restarted)
        #expect(await daemon.stop() == 0)
    }

    /// `pendingTimeout` is a bound: with the daemon down longer than it, every optimistic dispatch made meanwhile is
    /// rolled back `unavailable` within the bound of its dispatch (plus a stated slack), is sent no more, and is
    /// neither in the journal nor applied once the daemon is back.
    @Test func aDispatchNotAcceptedWithinThePendingTimeoutIsRolledBackInTimeAndNeverApplied() async throws {
        let directory = try TestSupport.temporaryDirectory("optimistic-timeout").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let daemon = try DaemonProcess(directory: directory)
        try await daemon.waitUntilServing()
        let bound = Duration.seconds(2)
        // The replica's thread wakes at the earliest bound (it is one of its deadlines); the slack covers its wake-up
        // and the handing over of the read on a loaded 2-core machine, and is far from the next bound a missed one
        // would wait for (the LazyPirate's give-up, 3 tries of 500 ms, or the restart).
        let slack = Duration.milliseconds(500)
        try await withReplica(
            Todos.self,
            daemon,
            {
                $0.pendingTimeout = bound
                $0.retries = 2
            }
        ) { replica in
            _ = try await replica.dispatchOptimistically(.add(text: "before")).seq
            // When each dispatch left the pending list, seen by a subscriber, which the replica's thread calls at the
            // change.
            let left = LockedValue([UInt64: ContinuousClock.Instant]())
            let present = LockedValue(Set<UInt64>())
            let watching = replica.subscribe(optimistic: { $0.pending.map(\.requestNumber) }) { numbers in
                let now = ContinuousClock.now
                let gone = present.withLockedValue { present in
                    let gone = present.subtracting(numbers)
                    present.formUnion(numbers)
                    return gone
                }
                left.withLockedValue { left in for number in gone where left[number] == nil { left[number] = now } }
            }
            defer { watching.cancel() }
            daemon.kill()
            var handles: [(handle: OptimisticDispatch, at: ContinuousClock.Instant)] = []
            for index in 0..<20 {
                let at = ContinuousClock.now
                handles.append((try await replica.dispatchOptimistically(.add(text: "down \(index)")), at))
            }
            for (handle, at) in handles {
                let error = await #expect(throws: ClientError.self) { try await handle.seqs }
                #expect(error?.code == .unavailable, "\(String(describing: error))")
                // The handle fails under the ledger's lock; the read without it reaches the subscriber just after.
                _ = try await eventually(within: .seconds(10)) {
                    left.withLockedValue { $0[handle.requestNumber] != nil }
                }
                let gone = try #require(left.withLockedValue { $0[handle.requestNumber] })
                #expect(gone - at >= bound, "rolled back \(gone - at) after its dispatch, before the bound")
                #expect(gone - at <= bound + slack, "rolled back \(gone - at) after its dispatch")
                guard case .rolledBack = handle.status else {
                    Issue.record("#\(handle.requestNumber) is \(handle.status)")
                    continue
                }
            }
            #expect(replica.pending.isEmpty && replica.state == replica.confirmedState)
            // Back: nothing queued for the rolled-back dispatches reaches it. A dispatch made now goes after anything
            // still on the replica's socket, so once it is confirmed, nothing older can come.
            try daemon.start()
            try await daemon.waitUntilServing()
            _ = try await replica.dispatchOptimistically(.add(text: "after")).seq
            #expect(try await agrees(replica, with: daemon))
            #expect(replica.confirmedState.list.items.map(\.text) == ["before", "after"])
        }
        #expect(await daemon.stop() == 0)
    }

    @Test func aNewEpochLosesWhatWasAcceptedAndTakesWhatWasNeverAnswered() async throws {
        let directory = try TestSupport.temporaryDirectory("optimistic-epoch").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let first = try DaemonProcess(directory: directory)
        try await first.waitUntilServing()
        let second = try await withReplica(
            Todos.self,
            first,
            {
                // No events: the replica learns the daemon's state from snapshots only, after each silence.
                $0.eventsEndpoint = "ipc://\(directory)/no-events-here"
                $0.sync.silenceLimit = .seconds(2)
            }
        ) { replica in
            let rollbacks = replica.rollbacks()
            // Accepted by the daemon, not yet confirmed here when the daemon dies. A silence's snapshot may confirm
            // it first on a slow machine (it would then be in the history that is lost): try again, at most 3 times.
            var daemon = first
            var accepted: OptimisticDispatch?
            for attempt in 0..<3 where accepted == nil {
                let handle = try await replica.dispatchOptimistically(.add(text: "accepted, then lost \(attempt)"))
                // Answered: pending as accepted, or already confirmed and gone (then the loop tries again).
                let answered = try await eventually(within: .seconds(10), every: .milliseconds(1)) {
                    !replica.pending.contains {
                        if case .accepted = $0.status { false } else { $0.requestNumber == handle.requestNumber }
                    }
                }
                try #require(answered, "\(replica.pending)")
                daemon.kill()
                if replica.pending.contains(where: { $0.requestNumber == handle.requestNumber }) {
                    accepted = handle
                } else {
                    daemon = try DaemonProcess(directory: directory)
                    try await daemon.waitUntilServing()
                }
            }
            let lostOne = try #require(accepted, "a silence's snapshot confirmed the action before every kill")
            // The journal is lost: the data removed, a new daemon with a new epoch.
            try FileManager.default.removeItem(atPath: "\(directory)/.lockstep/data")
            let unanswered = try await replica.dispatchOptimistically(.add(text: "never answered"))
            #expect(replica.state.list.items.map(\.text).last == "never answered")
            let second = try DaemonProcess(directory: directory)
            try await second.waitUntilServing()

            let lost = await #expect(throws: ClientError.self) { try await lostOne.seq }
            #expect(lost?.code == .notApplied)
            #expect(lost?.reason.contains("new history") == true, "\(String(describing: lost))")
            #expect(try await unanswered.seq == 1)
            #expect(replica.confirmedState.list.items.map(\.text) == ["never answered"])
            #expect(try await eventually(within: .seconds(10)) { replica.state == replica.confirmedState })
            #expect(replica.pending.isEmpty)
            let told = await collect(rollbacks, within: .seconds(10)) { !$0.isEmpty }
            #expect(told.map(\.requestNumber) == [lostOne.requestNumber])
            return second
        }
        #expect(await second.stop() == 0)
    }
}
