import Foundation
import Lockstep
import LockstepClient
import LockstepExamples
import LockstepProtocol
import LockstepTesting
import TestSupport
import Testing
import ZeroMQ

/// `Replica<D>` in this process against a real `lockstepd`.
@Suite struct ReplicaTests {
    /// Runs `body` with a replica of `D` that is running against `daemon`, and stops it afterwards.
    func withReplica<D: Domain, T: Sendable>(
        _ domain: D.Type,
        _ daemon: DaemonProcess,
        evidenceDirectory: String? = nil,
        snapshotPartBytes: UInt32? = nil,
        commandEndpoint: String? = nil,
        waitUntilLive: Bool = true,
        _ body: @Sendable (Replica<D>) async throws -> T
    ) async throws -> T {
        var configuration = ReplicaConfiguration(
            commandEndpoint: commandEndpoint ?? daemon.command,
            eventsEndpoint: daemon.events
        )
        configuration.requestTimeout = .seconds(1)
        configuration.retries = 10
        configuration.evidenceDirectory = evidenceDirectory
        if let snapshotPartBytes { configuration.snapshotPartBytes = snapshotPartBytes }
        let replica = try Replica(D.self, configuration: configuration)
        return try await withThrowingTaskGroup(of: T?.self) { group in
            group.addTask {
                try await replica.run()
                return nil
            }
            // Generous: run() needs a thread of the cooperative pool just to start the replica's thread, and on a
            // 2-core machine other suites' tests once held both for many seconds with blocking waits (one CI run in
            // four timed out at 15 s with all three replicas never started; later, 4 tests here at 60 s). Tests now
            // wait for processes and daemons off the pool (`offPool`) and run their long synchronous checks on
            // the run's check thread (`onCheckThread`), so run() soon gets a thread; the bound stays.
            if waitUntilLive { try await replica.waitUntilLive(timeout: .seconds(60)) }
            let result = try await body(replica)
            group.cancelAll()
            while let next = try await group.next() { _ = next }
            return result
        }
    }

    func startDaemon(_ label: String, _ configuration: String = "") throws -> (DaemonProcess, String) {
        let directory = try TestSupport.temporaryDirectory(label).path
        let file = URL(fileURLWithPath: directory).appendingPathComponent("lockstepd.toml")
        try configuration.write(to: file, atomically: true, encoding: .utf8)
        return (try DaemonProcess(directory: directory, arguments: ["--config", file.path]), directory)
    }

    @Test func dispatchReturnsTheSeqOnceThisReplicaAppliedIt() async throws {
        let (daemon, directory) = try startDaemon("replica-ryw")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await withReplica(Todos.self, daemon) { replica in
            let states = replica.states()
            // Many tasks at once: each sees its own todo in the state the moment dispatch returns.
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<40 {
                    group.addTask {
                        let seq = try await replica.dispatch(.add(text: "task \(index)"))
                        let current = replica.current
                        #expect(current.seq >= seq)
                        #expect(current.state.list.items.contains { $0.text == "task \(index)" })
                    }
                }
                try await group.waitForAll()
            }
            let batch = try await replica.dispatch(batch: [.toggle(id: 1), .setFilter(filter: .showCompleted)])
            #expect(batch == 41...42)
            #expect(replica.state.filter == .showCompleted)
            #expect(replica.status.phase == .live)
            // The local store has it (read-your-writes); the status is the sync machine's, written each turn.
            #expect(replica.seq == 42)
            // The stream saw seqs in order and ended at 42.
            let seen = await collect(states, within: .seconds(10)) { $0.last?.seq == 42 }.map(\.seq)
            #expect(seen == seen.sorted())
            #expect(seen.last == 42)
        }
        #expect(await daemon.stop() == 0)
    }

    @Test func aRejectionCarriesTheDaemonsReasonAndChangesNothing() async throws {
        let (daemon, directory) = try startDaemon("replica-reject")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await withReplica(Numbers.self, daemon) { replica in
            try await replica.dispatch(.add(number: 7))
            await #expect(throws: Rejection.self) { try await replica.dispatch(.delete(index: 5)) }
            do {
                try await replica.dispatch(batch: [.add(number: 1), .delete(index: 9)])
                Issue.record("the batch was accepted")
            } catch let rejection as Rejection {
                #expect(rejection.reason.hasPrefix("action 1 of the batch: "), "\(rejection)")
                #expect(rejection.reason.contains("delete index 9 is out of range"), "\(rejection)")
            }
            #expect(replica.state.numbers == [7])
            #expect(replica.seq == 1)
        }
        #expect(await daemon.stop() == 0)
    }

    /// Process A (`lockstep dispatch`) writes and tells this process the seq; a replica started here afterwards —
    /// at seq 0 until it has joined — returns from its barrier holding A's writes. `sync()` the same without a seq,
    /// and a seq nobody sequenced times out naming it.
    @Test func aBarrierOnASeqFromAnotherProcessReturnsWithItsWriteAndSyncWithoutOne() async throws {
        let (daemon, directory) = try startDaemon("replica-barrier")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        /// Increments the counter `times` times from a `lockstep dispatch` process; the last seq it printed.
        func dispatchElsewhere(_ times: Int) async throws -> SequenceNumber {
            let arguments = [
                "dispatch", "counter", #"{"increment":{}}"#, "--repeat", "\(times)", "--command-endpoint",
                daemon.command,
                "--json",
            ]
            let output = try await offPool("lockstep dispatch") { try runProduct("lockstep", arguments) }
            try #require(output.status == 0, "\(output.standardError)")
            let last = output.standardOutput.split(separator: "\n").last.map(String.init) ?? ""
            let object = try JSONSerialization.jsonObject(with: Data(last.utf8)) as? [String: Any]
            return try #require((object?["seq"] as? Int).map { SequenceNumber($0) }, "\(output.standardOutput)")
        }
        try await daemon.waitUntilServing()
        let written = try await dispatchElsewhere(5)
        #expect(written == 5)
        try await withReplica(Counter.self, daemon, waitUntilLive: false) { replica in
            let state = try await replica.wait(for: written, timeout: .seconds(30))
            #expect(state.seq >= written && state.state.count == Int(written), "\(state)")
        }
        let more = try await dispatchElsewhere(4)
        try await withReplica(Counter.self, daemon, waitUntilLive: false) { replica in
            let state = try await replica.sync(timeout: .seconds(30))
            #expect(state.seq >= more && state.state.count == Int(more), "\(state)")
            let start = ContinuousClock.now
            do {
                try await replica.wait(for: 1_000, timeout: .milliseconds(300))
                Issue.record("a barrier on seq 1000 of a store at seq \(more) returned")
            } catch let error as ClientError {
                #expect(error.code == .notApplied && error.reason.contains("seq 1000"), "\(error)")
                #expect(ContinuousClock.now - start < .seconds(10))
            }
        }
        #expect(await daemon.stop() == 0)
    }

    /// A large store (checkpointed off the loop) goes to a joiner in parts read from the journal's newest snapshot
    /// (docs/protocol.md, "SNAPSHOT in parts"): each part says where it lies, the digest is the whole state's; a part
    /// of a snapshot no longer kept is refused (`invalid_range`); a request without a part still gets the state now,
    /// whole. A replica joins through the parts — many, here — and repairs the events since by RANGE.
    @Test func aLargeStoreGoesToAJoinerInParts() async throws {
        let (daemon, directory) = try startDaemon(
            "snapshot-parts",
            "[intervals]\ncheckpoint_off_loop_bytes = 0\n\n[snapshots]\nevery_events = 20\n"
        )
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let context = try Context()
        let client = try Client(context, endpoint: daemon.command)
        let todos = try StoreName("todos")
        struct Seen: Sendable {
            var first: SnapshotReply?
            var whole: Reply?
            var refused: Reply?
            var assembled: [UInt8] = []
            var dispatched: UInt64 = 0
        }
        let seen = try await offPool("snapshot parts", lending: client) { (client: Client) throws -> Seen in
            var dispatched: UInt64 = 0
            func add() throws {
                dispatched += 1
                _ = try client.dispatch("todos", [#"{"add":{"text":"todo \#(dispatched)"}}"#], number: dispatched)
            }
            for _ in 1...45 { try add() }
            func part(_ seq: SequenceNumber, _ offset: UInt64, id: UInt64) throws -> Reply {
                let part = SnapshotPartRequest(seq: seq, offset: offset, maximumBytes: 100)
                return try client.call(Request.snapshot(requestID: id, store: todos, part: part).encode())
            }
            // The second snapshot, due at seq 40, is taken off the loop at a commit once the checkpoints' pace allows
            // (a tenth of a core): one more add at a time until its first part is the newest's.
            var first: SnapshotReply?
            let deadline = ContinuousClock.now + .seconds(30)
            while first == nil, ContinuousClock.now < deadline {
                if case let .snapshot(_, reply) = try part(0, 0, id: 1), reply.part != nil, reply.seq >= 40 {
                    first = reply
                } else {
                    try add()
                }
            }
            guard let first, let total = first.part?.total else { return Seen(first: first) }
            var bytes = first.state
            var id: UInt64 = 2
            while UInt64(bytes.count) < total {
                guard case let .snapshot(_, next) = try part(first.seq, UInt64(bytes.count), id: id),
                    next.seq == first.seq, next.digest == first.digest, next.part?.offset == UInt64(bytes.count),
                    next.part?.total == total
                else { break }
                bytes += next.state
                id += 1
            }
            let whole = try client.call(Request.snapshot(requestID: id, store: todos).encode())
            let refused = try part(first.seq - 1, 0, id: id + 1)
            return Seen(first: first, whole: whole, refused: refused, assembled: bytes, dispatched: dispatched)
        }
        let (first, whole, refused, assembled) = (seen.first, seen.whole, seen.refused, seen.assembled)
        let snapshot = try #require(first, "no SNAPSHOT part at seq 40 or later within 30 s; log:\n\(daemon.output)")
        #expect(snapshot.state.count == 100)
        #expect(StateDigest(of: assembled) == snapshot.digest && UInt64(assembled.count) == snapshot.part?.total)
        let state = try CanonicalEncoding.decode(Todos.State.self, from: Data(assembled))
        #expect(state.list.items.count == Int(snapshot.seq) && snapshot.seq <= seen.dispatched)
        guard case let .snapshot(_, now)? = whole else {
            Issue.record("expected the whole SNAPSHOT, got \(String(describing: whole))")
            return
        }
        #expect(now.part == nil && now.seq == seen.dispatched && StateDigest(of: now.state) == now.digest)
        guard case let .error(_, error)? = refused else {
            Issue.record("expected invalid_range, got \(String(describing: refused))")
            return
        }
        #expect(error.code == ProtocolError.Code.invalidRange, "\(error)")
        #expect(error.reason.contains("ask for its first part again"), "\(error)")

        try await withReplica(Todos.self, daemon, snapshotPartBytes: 64) { replica in
            let synced = try await replica.sync(timeout: .seconds(30))
            #expect(synced.seq == seen.dispatched && synced.state.list.items.count == Int(seen.dispatched))
        }
        #expect(await daemon.stop() == 0)
    }

    /// Between one replica and a daemon, a daemon older than SNAPSHOT in parts: it refuses a SNAPSHOT request with a
    /// part as malformed (frame count), and passes everything else on. Its sockets live on its thread.
    final class PartlessProxy: Sendable {
        let endpoint: String
        /// SNAPSHOT requests refused (with a part) and passed on (without).
        let counts = LockedValue((refused: 0, whole: 0))
        private let stopping = LockedValue(false)
        /// Signalled by the thread as it ends.
        private let finished = DispatchSemaphore(value: 0)

        init(in directory: String, daemon: String) throws {
            endpoint = "ipc://\(directory)/partless"
            let context = try Context()
            let front = try Socket(context, type: .router)
            try front.set(.linger, 0)
            try front.bind(endpoint)
            let back = try Socket(context, type: .dealer)
            try back.set(.linger, 0)
            try back.connect(daemon)
            // Made here and handed over: from the next line on only the thread touches them (it closes them too).
            nonisolated(unsafe) let sockets = (front, back)
            Thread { [counts, stopping, finished] in
                let (front, back) = sockets
                defer {
                    front.close()
                    back.close()
                    finished.signal()
                }
                var client: Frame?
                while !stopping.withLockedValue({ $0 }) {
                    guard
                        let ready = try? Poller([.socket(front, .readable), .socket(back, .readable)])
                            .poll(timeout: .milliseconds(20))
                    else { continue }
                    if ready[0].contains(.readable), let frames = try? front.receive(wait: false), frames.count > 1 {
                        client = frames[0]
                        let body = Array(frames.dropFirst())
                        if case let .snapshot(requestID, _, part)? = try? Request.decode(body) {
                            guard part == nil else {
                                counts.withLockedValue { $0.refused += 1 }
                                let refusal = Reply.error(
                                    requestID: requestID,
                                    ProtocolError(code: .malformed, "SNAPSHOT request has 3 frames; expected exactly 2")
                                )
                                _ = try? front.send([frames[0]] + refusal.encode(), wait: false)
                                continue
                            }
                            counts.withLockedValue { $0.whole += 1 }
                        }
                        _ = try? back.send(body, wait: false)
                    }
                    if ready[1].contains(.readable), let reply = try? back.receive(wait: false), let client {
                        _ = try? front.send([client] + reply, wait: false)
                    }
                }
            }.start()
        }

        /// Stops its thread and waits for it to end, at most 5 s.
        func stop() {
            stopping.withLockedValue { $0 = true }
            _ = finished.wait(timeout: .now() + 5)
        }
    }

    /// A replica that meets a daemon older than SNAPSHOT in parts (it refuses the part as malformed) asks for the
    /// state whole from then on, and joins.
    @Test func aReplicaAsksADaemonThatRefusesPartsForTheWholeState() async throws {
        let (daemon, directory) = try startDaemon(
            "snapshot-partless",
            "[intervals]\ncheckpoint_off_loop_bytes = 0\n\n[snapshots]\nevery_events = 5\n"
        )
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let context = try Context()
        let client = try Client(context, endpoint: daemon.command)
        try await offPool("dispatches", lending: client) { client in
            for number: UInt64 in 1...12 {
                _ = try client.dispatch("todos", [#"{"add":{"text":"todo \#(number)"}}"#], number: number)
            }
        }
        let proxy = try PartlessProxy(in: directory, daemon: daemon.command)
        defer { proxy.stop() }
        try await withReplica(Todos.self, daemon, commandEndpoint: proxy.endpoint) { replica in
            let synced = try await replica.sync(timeout: .seconds(30))
            #expect(synced.seq == 12 && synced.state.list.items.count == 12)
        }
        let counts = proxy.counts.withLockedValue { $0 }
        #expect(counts.refused == 1 && counts.whole >= 1, "\(counts)")
        #expect(await daemon.stop() == 0)
    }

    /// A counter that counts twice: same name, version and wire form as the daemon's, another reducer.
    enum DoubleCounter: Domain {
        typealias State = Counter.State
        typealias Action = Counter.Action
        static let name = "counter"
        static let version: UInt32 = 1
        static var initialState: State { State() }
        static func reduce(into state: inout State, _ action: Action) {
            state.count += action == .increment ? 2 : -2
        }
    }

    /// A replica whose reducer does not match the daemon's leaves the evidence of its divergence before it
    /// repairs itself, and the harness command turns the file into a report — with the digest taken on the daemon's
    /// loop (after the events), and off it (a CHECKPOINT after the events, the DIGEST later, as for a large state).
    @Test(arguments: [false, true])
    func aLiveDivergenceLeavesEvidenceTheHarnessReportsFrom(offLoop: Bool) async throws {
        let (daemon, directory) = try startDaemon(
            "replica-evidence",
            "[intervals]\ndigest_every_events = 3\ncheckpoint_off_loop_bytes = \(offLoop ? 0 : 1 << 20)\n"
        )
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let evidence = URL(fileURLWithPath: directory).appendingPathComponent("evidence")
        try await withReplica(DoubleCounter.self, daemon, evidenceDirectory: evidence.path) { replica in
            for _ in 0..<3 { _ = try await replica.dispatch(.increment) }
            #expect(try await eventually(within: .seconds(10)) { replica.status.divergences >= 1 })
        }
        #expect(await daemon.stop() == 0)
        let files = try FileManager.default.contentsOfDirectory(atPath: evidence.path).filter { $0.hasSuffix(".json") }
        try #require(files.count >= 1, "no evidence file in \(evidence.path)")
        let file = evidence.appendingPathComponent(files.sorted()[0])
        let written = try DivergenceEvidence(contentsOf: file)
        #expect(written.store == "counter")
        #expect(written.agreedSeq == 0)
        #expect(written.actions == [#"{"increment":{}}"#, #"{"increment":{}}"#, #"{"increment":{}}"#])
        #expect(written.divergentSeq == 3)
        #expect(written.replicaState == #"{"count":6}"#)

        // lockstep's counter is the daemon's: a replay here reaches its digest, the replica's state did not.
        let report = try await runProduct("lockstep", ["replay", "--evidence", file.path, "--json"])
        #expect(report.status == 4, "\(report.standardOutput)\(report.standardError)")
        let object = try JSONSerialization.jsonObject(with: Data(report.standardOutput.utf8)) as? [String: Any]
        let divergence = try #require(object?["divergence"] as? [String: Any], "\(report.standardOutput)")
        #expect(divergence["seq"] as? Int == 3)
        #expect(divergence["reproduced"] as? Bool == false)
        #expect(divergence["right"] as? String == "the replica that wrote the evidence")
        let differences = divergence["differences"] as? [[String: Any]]
        #expect(differences?.first?["path"] as? String == "count")
        #expect(differences?.first?["left"] as? Int == 3)
        #expect(differences?.first?["right"] as? Int == 6)
    }

    @Test(arguments: [false, true])
    func aDivergenceIsLoggedCountedAnnouncedAndRepairedByResync(offLoop: Bool) async throws {
        // A digest after every event, so the first wrong state is caught at once.
        let (daemon, directory) = try startDaemon(
            "replica-diverge",
            "[intervals]\ndigest_every_events = 1\ncheckpoint_off_loop_bytes = \(offLoop ? 0 : 1 << 20)\n"
        )
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await withReplica(DoubleCounter.self, daemon) { replica in
            @Sendable func isDivergence(_ notice: ReplicaNotice) -> Bool {
                if case .diverged = notice { true } else { false }
            }
            // A subscription takes a moment to reach the daemon (docs/protocol.md): an event and its DIGEST published
            // before it did are not delivered, and the replica repairs the event by RANGE without the digest. So
            // one more increment at a time, until a digest is heard.
            var dispatched: SequenceNumber = 0
            var announced: [ReplicaNotice] = []
            while dispatched < 5, !announced.contains(where: isDivergence) {
                let notices = replica.notices()
                dispatched = try await replica.dispatch(.increment)
                announced = await collect(notices, within: .seconds(dispatched < 5 ? 4 : 10)) { seen in
                    seen.contains(where: isDivergence) && seen.contains { !isDivergence($0) }
                }
            }
            guard case let .diverged(divergedAt, detail)? = announced.first(where: isDivergence),
                let resynced = announced.first(where: { !isDivergence($0) })
            else {
                Issue.record("after \(dispatched) increments the replica announced only \(announced)")
                return
            }
            #expect(divergedAt >= 1 && divergedAt <= dispatched)
            #expect(detail.contains("the daemon's digest is"), "\(detail)")
            #expect("\(resynced)".contains("digest differed from the daemon's at seq \(divergedAt)"))
            // After the resync it holds the daemon's state, from the snapshot.
            _ = try await eventually(within: .seconds(10)) {
                replica.status.phase == .live && replica.state.count == Int(dispatched)
            }
            #expect(replica.state.count == Int(dispatched))
            #expect(replica.status.divergences >= 1)
            #expect(replica.status.resyncs >= 1)
        }
        #expect(await daemon.stop() == 0)
    }
}

/// What `stream` yields until `enough` holds, or until `timeout` passes (counted as ``eventually(within:every:_:)``
/// counts it): never a wait without end.
func collect<Element: Sendable>(
    _ stream: AsyncStream<Element>,
    within timeout: Duration,
    until enough: @escaping @Sendable ([Element]) -> Bool
) async -> [Element] {
    await withTaskGroup(of: [Element]?.self) { group in
        group.addTask {
            var seen: [Element] = []
            for await element in stream {
                seen.append(element)
                if enough(seen) { break }
            }
            return seen
        }
        group.addTask {
            _ = try? await eventually(within: timeout) { Task.isCancelled }
            return nil
        }
        // The first to finish ends the other; the collector returns what it has when cancelled.
        var collected: [Element] = []
        for await result in group {
            group.cancelAll()
            if let result {
                collected = result
                break
            }
        }
        return collected
    }
}
