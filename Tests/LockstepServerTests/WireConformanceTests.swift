import Foundation
import LockstepJournal
import LockstepProtocol
import LockstepTesting
import TestSupport
import Testing
import ZeroMQ

/// Requests a client written from docs/protocol.md might send, against a real lockstepd: each gets exactly the
/// error the spec names, in the spec's order of checks, and the daemon stays up.
@Suite struct WireConformanceTests {
    /// Whether `subscriber` sees a heartbeat (each receive waits up to its timeout), skipping what comes before;
    /// the receives wait on a thread of their own, not on one of the cooperative pool.
    func seesAHeartbeat(_ subscriber: Socket) async throws -> Bool {
        try await offPool("heartbeat", lending: subscriber) { subscriber in
            var live = false
            while !live, let frames = try subscriber.receive() {
                if case .heartbeat = try Event.decode(frames) { live = true }
            }
            return live
        }
    }

    @Test func theHeaderIsCheckedBeforeTheFrameCountWhateverTheSize() async throws {
        let directory = try temporaryDirectory("conformance").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let daemon = try DaemonProcess(directory: directory, arguments: ["--domain", "counter"])
        let context = try Context()
        let client = try Client(context, endpoint: daemon.command)
        let valid = Request.dispatch(
            DispatchRequest(
                requestID: 9,
                domainVersion: 1,
                clientID: client.clientID,
                store: try StoreName("counter"),
                actions: [Array(#"{"increment":{}}"#.utf8)]
            )
        ).encode()
        let padding = [Frame](repeating: Array(#"{"increment":{}}"#.utf8), count: 1_001)
        var badMagic = valid[0]
        badMagic[0] = 0x00
        var badVersion = valid[0]
        badVersion[2] = 9
        var badType = valid[0]
        badType[3] = 0x7e
        let cases: [(String, Frame, ProtocolError.Code)] = [
            ("wrong magic", badMagic, .malformed),
            ("wrong version", badVersion, .unsupportedVersion),
            ("unknown type", badType, .unknownMessageType),
            ("a valid header", valid[0], .tooLarge),
        ]
        /// The reply to `frames`, waited for on a thread of its own (the first waits for the daemon to bind).
        func call(_ frames: [Frame]) async throws -> Reply {
            try await offPool("call", lending: client) { try $0.call(frames) }
        }
        for (label, header, code) in cases {
            // 1,003 frames: over the frame limit, so only the header decides which error comes first.
            guard case let .error(_, error) = try await call([header, valid[1]] + padding) else {
                Issue.record("\(label): expected ERROR")
                continue
            }
            #expect(error.code == code, "\(label): \(error)")
        }
        // An action over the 1 MiB limit is read and answered too_large, not dropped with the connection.
        let oversized =
            Array(#"{"increment":{"pad":""#.utf8) + [UInt8](repeating: 0x61, count: 1 << 20) + Array(#""}}"#.utf8)
        guard case let .error(_, tooLarge) = try await call([valid[0], valid[1], oversized]) else {
            Issue.record("expected ERROR for an oversized action")
            return
        }
        #expect(tooLarge.code == .tooLarge, "\(tooLarge)")
        #expect(daemon.output.contains("refused a request"), "\(daemon.output)")
        // Counted by code in the daemon's status.
        let stats = try await runProduct("lockstep", ["stats", "--json", "--command-endpoint", daemon.command])
        let status = try JSONSerialization.jsonObject(with: Data(stats.standardOutput.utf8)) as? [String: Any]
        let refused = status?["refused"] as? [String: Int]
        #expect(
            refused == ["malformed": 1, "unsupported_version": 1, "unknown_message_type": 1, "too_large": 2],
            "\(stats.standardOutput)"
        )
        // Still serving, and nothing was applied.
        guard case let .accepted(_, _, first, _) = try client.dispatch("counter", [#"{"increment":{}}"#], number: 1)
        else {
            Issue.record("the daemon did not accept a valid dispatch afterwards")
            return
        }
        #expect(first == 1)
        #expect(await daemon.stop() == 0)
    }

    /// Two requests that mean the same action are one action: journaled, published and fingerprinted in its
    /// canonical form; what the domain would not keep as sent is refused and changes nothing.
    @Test func actionsAreJournaledAndPublishedInCanonicalForm() async throws {
        let directory = try temporaryDirectory("canonical").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let daemon = try DaemonProcess(directory: directory, arguments: ["--domain", "counter", "--domain", "numbers"])
        let context = try Context()
        let client = try Client(context, endpoint: daemon.command)
        let subscriber = try Socket(context, type: .subscriber)
        try subscriber.set(.receiveTimeout, 5_000)
        try subscriber.subscribe(Event.topic(for: try StoreName("numbers")))
        try subscriber.connect(daemon.events)
        let refusals = [
            (#"{"add":{"number":5,"by":"me"}}"#, "member 'add.by' is not part of the type"),
            (#"{"add":{"number":5,"number":6}}"#, "member 'number' appears twice"),
            (#"{"add":{"number":5.5}}"#, "a number in it does not fit the member"),
            (#"{"add":{"number":"5"}}"#, "expected Int at add.number"),
        ]
        /// What the subscriber and the client got, for the test to check.
        struct Seen: Sendable {
            var live = false
            var refused: [Reply] = []
            var first, again, conflict: Reply?
            var event: [Frame]?
        }
        // From the heartbeat to the message after the dispatches, the subscriber and the client run back to back on
        // a thread of their own: that message must be the EVENT, and an idle store's heartbeat (one a second) would
        // come first after a wait for a thread of the cooperative pool in between. Each step is taken only if the
        // test goes on past the one before.
        let seen = try await offPool("canonical", lending: (client, subscriber)) { lent in
            let (client, subscriber) = lent
            var seen = Seen()
            while !seen.live, let frames = try subscriber.receive() {
                if case .heartbeat = try Event.decode(frames) { seen.live = true }
            }
            guard seen.live else { return seen }
            seen.refused = try refusals.map { sent, _ in try client.dispatch("numbers", [sent], number: 100) }
            seen.first = try client.dispatch("numbers", [#"{ "add" : { "number" : 5.0 } }"#], number: 1)
            guard case .accepted = seen.first else { return seen }
            seen.again = try client.dispatch("numbers", [#"{"add":{"number":5}}"#], number: 1)
            guard case .accepted = seen.again else { return seen }
            seen.conflict = try client.dispatch("numbers", [#"{"add":{"number":6}}"#], number: 1)
            guard case .error = seen.conflict else { return seen }
            seen.event = try subscriber.receive()
            return seen
        }
        try #require(seen.live, "the subscriber saw no heartbeat; log:\n\(daemon.output)")

        // Refused, each naming what the domain would not keep: nothing sequenced.
        for ((sent, says), reply) in zip(refusals, seen.refused) {
            guard case let .error(_, error) = reply else {
                Issue.record("\(sent): expected ERROR")
                continue
            }
            #expect(error.code == .undecodableAction, "\(sent): \(error)")
            #expect(error.reason.contains(says), "\(sent): \(error.reason)")
        }
        // Accepted in canonical form; a retry written otherwise is the same request.
        guard case let .accepted(_, _, first, _) = seen.first else {
            Issue.record("expected ACCEPTED")
            return
        }
        #expect(first == 1)
        guard case let .accepted(_, _, again, _) = seen.again else {
            Issue.record("expected the first ACCEPTED again")
            return
        }
        #expect(again == 1)
        guard case let .error(_, conflict) = seen.conflict else {
            Issue.record("expected idempotency_conflict")
            return
        }
        #expect(conflict.code == .idempotencyConflict)

        guard let frames = seen.event, case let .event(_, _, seq, action, _) = try Event.decode(frames) else {
            Issue.record("expected the EVENT of seq 1")
            return
        }
        #expect(seq == 1)
        #expect(String(decoding: action, as: UTF8.self) == #"{"add":{"number":5}}"#)
        #expect(await daemon.stop() == 0)
        let journal = try openLocalJournal(directory: "\(directory)/.lockstep/data", readOnly: true)
        defer { try? journal.close() }
        guard case let .events(events) = try journal.events(store: "numbers", from: 1, to: 10, limit: 10) else {
            Issue.record("the journal's history was compacted")
            return
        }
        #expect(events.map { String(decoding: $0.action, as: UTF8.self) } == [#"{"add":{"number":5}}"#])
    }

    /// Each store has two streams: one by one (EVENT per action, what the first protocol had) and in runs (one
    /// EVENTS per commit). A subscriber of either gets every action, in order, with the heartbeats; a daemon only
    /// publishes the streams someone follows.
    @Test func aCommitIsOneEventsOnTheStreamInRunsAndAnEventEachOnTheOther() async throws {
        let directory = try temporaryDirectory("streams").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let daemon = try DaemonProcess(directory: directory, arguments: ["--domain", "counter"])
        let context = try Context()
        let client = try Client(context, endpoint: daemon.command)
        let counter = try StoreName("counter")
        var subscribers: [Socket] = []
        for topic in [Event.topic(for: counter), Event.runTopic(for: counter)] {
            let subscriber = try Socket(context, type: .subscriber)
            try subscriber.set(.receiveTimeout, 5_000)
            try subscriber.subscribe(topic)
            try subscriber.connect(daemon.events)
            let live = try await seesAHeartbeat(subscriber)
            try #require(live, "a subscriber of \(topic) saw no heartbeat; log:\n\(daemon.output)")
            subscribers.append(subscriber)
        }
        let increment = #"{"increment":{}}"#
        guard case .accepted = try client.dispatch("counter", [increment, increment, increment], number: 1) else {
            Issue.record("expected ACCEPTED")
            return
        }

        var oneByOne: [SequenceNumber] = []
        while oneByOne.count < 3, let frames = try subscribers[0].receive() {
            #expect(frames[0] == Event.topic(for: counter))
            switch try Event.decode(frames) {
            case let .event(_, _, seq, action, _):
                oneByOne.append(seq)
                #expect(action == Array(increment.utf8))
            case .heartbeat, .digest, .checkpoint: continue
            case .events: Issue.record("EVENTS on the one-by-one stream")
            case .trace: Issue.record("TRACE on the one-by-one stream")
            }
        }
        #expect(oneByOne == [1, 2, 3])
        var run: (SequenceNumber, [Frame])?
        while run == nil, let frames = try subscribers[1].receive() {
            #expect(frames[0] == Event.runTopic(for: counter))
            switch try Event.decode(frames) {
            case let .events(_, _, firstSeq, actions, _): run = (firstSeq, actions)
            case .heartbeat, .digest, .checkpoint: continue
            case .event: Issue.record("EVENT on the stream in runs")
            case .trace: Issue.record("TRACE on the stream in runs")
            }
        }
        #expect(run?.0 == 1)
        #expect(run?.1 == Array(repeating: Array(increment.utf8), count: 3))
        #expect(await daemon.stop() == 0)
    }
}
