import Foundation
import Lockstep
import LockstepExamples
import LockstepProtocol
import Testing

@Suite struct CodecRoundTripTests {
    @Test(arguments: CodecSamples.requests)
    func requestRoundTrips(_ sample: Sample<Request>) throws {
        let body = sample.message.encode()
        try expectCommonHeader(body[0])
        #expect(try Request.decode(body) == sample.message)
        #expect(Request.requestID(in: body) == sample.message.requestID)
    }

    @Test(arguments: CodecSamples.replies)
    func replyRoundTrips(_ sample: Sample<Reply>) throws {
        let body = sample.message.encode()
        try expectCommonHeader(body[0])
        #expect(try Reply.decode(body) == sample.message)
    }

    @Test(arguments: CodecSamples.events)
    func eventRoundTrips(_ sample: Sample<Event>) throws {
        let frames = sample.message.encode()
        switch sample.message {
        case .events: #expect(frames[0] == Event.runTopic(for: sample.message.store))
        case .trace: #expect(frames[0] == Event.traceTopic(for: sample.message.store))
        default: #expect(frames[0] == Event.topic(for: sample.message.store))
        }
        try expectCommonHeader(frames[1])
        #expect(try Event.decode(frames) == sample.message)
        // Every message reads the same on the stream in runs (an EVENT is refused there, and a TRACE has its own).
        switch sample.message {
        case .event, .trace:
            #expect(throws: ProtocolError.self) { try Event.decode(sample.message.encodeForRuns()) }
        default:
            #expect(try Event.decode(sample.message.encodeForRuns()) == sample.message)
        }
    }

    /// Every kind of message has a sample, so a new kind cannot slip past the round trip.
    @Test func samplesCoverEveryMessageKind() {
        let requestKinds = Set(CodecSamples.requests.map { $0.message.encode()[0][3] })
        let replyKinds = Set(CodecSamples.replies.map { $0.message.encode()[0][3] })
        let eventKinds = Set(CodecSamples.events.map { $0.message.encode()[1][3] })
        #expect(requestKinds == [0x01, 0x02, 0x03, 0x04, 0x05, 0x06])
        #expect(replyKinds == [0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x8F])
        #expect(eventKinds == [0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48])
    }

    @Test func largerLimitsAdmitLargerBatches() throws {
        let request = Request.dispatch(
            DispatchRequest(
                requestID: 1,
                domainVersion: 1,
                clientID: CodecSamples.clientID,
                store: CodecSamples.counter,
                actions: Array(repeating: CodecSamples.increment, count: 1001)
            )
        )
        #expect(try Request.decode(request.encode(), limits: Limits(maximumBatch: 1001)) == request)
        #expect(throws: ProtocolError.self) { try Request.decode(request.encode()) }
    }

    @Test func actionsFromTheExampleDomainsTravelUnchanged() throws {
        let action = Array(try CanonicalEncoding.encode(Todos.Action.add(text: "Eat food")))
        let event = Event.event(
            store: CodecSamples.store(Todos.name),
            epoch: CodecSamples.epoch,
            seq: 1,
            action: action
        )
        guard case let .event(_, _, _, decoded, _) = try Event.decode(event.encode()) else {
            Issue.record("an EVENT did not decode as an EVENT")
            return
        }
        #expect(try CanonicalEncoding.decode(Todos.Action.self, from: Data(decoded)) == .add(text: "Eat food"))
    }

    // MARK: - What the encoder does with values the wire cannot carry as they are

    @Test(arguments: [
        ("out-of-range", "out_of_range"),
        ("", "invalid_action"),
        ("ünïcode", "__n__code"),
        (String(repeating: "a", count: 70), String(repeating: "a", count: 64)),
    ])
    func rejectionCodesAreMadeWireSafe(given: String, sent: String) throws {
        let reply = Reply.rejected(requestID: 1, actionIndex: 0, Rejection(code: given, "why"))
        let body = reply.encode()
        #expect(body[1] == Array(sent.utf8))
        #expect(try Reply.decode(body) == .rejected(requestID: 1, actionIndex: 0, Rejection(code: sent, "why")))
    }

    @Test func longReasonsAreCutAtACharacterBoundary() throws {
        // 2-byte characters after one ASCII byte, so byte 4096 falls inside a character.
        let reason = "x" + String(repeating: "é", count: 3000)
        let body = Reply.error(requestID: 5, ProtocolError(code: .internal, reason)).encode()
        #expect(body[1].count == 4095)
        guard case let .error(_, error) = try Reply.decode(body) else {
            Issue.record("an ERROR did not decode as an ERROR")
            return
        }
        #expect(error.reason == "x" + String(repeating: "é", count: 2047))
        #expect(error.code == .internal)
    }

    // MARK: - Request ids of requests that cannot be decoded

    @Test func requestIDIsReadFromAnyVersionWithTheRightMagic() {
        var body = GoldenVectors.dispatch
        body[0][2] = 7
        body[0][3] = 0x77
        #expect(Request.requestID(in: body) == 1)
        #expect(Request.requestID(in: [Array(GoldenVectors.dispatch[0].prefix(12))]) == 1)
    }

    @Test(arguments: [
        Sample<[Frame]>("no frames", []),
        Sample<[Frame]>("11-byte header", [Array(GoldenVectors.dispatch[0].prefix(11))]),
        Sample<[Frame]>("wrong magic", [[0x4C, 0x54] + GoldenVectors.dispatch[0].dropFirst(2)]),
    ])
    func requestIDIsZeroWhenUnreadable(_ sample: Sample<[Frame]>) {
        #expect(Request.requestID(in: sample.message) == 0)
    }

    // MARK: - Topics

    @Test func noStoresTopicIsAPrefixOfAnothers() {
        let todo = Event.topic(for: CodecSamples.store("todo"))
        let todos = Event.topic(for: CodecSamples.store("todos"))
        #expect(todo == Array("todo".utf8) + [0])
        #expect(!todos.starts(with: todo))
    }

    private func expectCommonHeader(_ header: Frame) throws {
        try #require(header.count >= 4)
        #expect(Array(header[0..<3]) == [0x4C, 0x53, 0x01])
    }
}
