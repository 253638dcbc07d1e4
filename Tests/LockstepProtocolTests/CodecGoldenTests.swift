import Foundation
import Lockstep
import LockstepExamples
import LockstepProtocol
import Testing

/// The worked examples of docs/protocol.md, byte for byte. A change here is a change of the wire format:
/// update the document, and the protocol version if old peers would misread the new bytes.
enum GoldenVectors {
    /// `{"increment":{}}`
    static let incrementJSON: Frame = [
        0x7B, 0x22, 0x69, 0x6E, 0x63, 0x72, 0x65, 0x6D, 0x65, 0x6E, 0x74, 0x22, 0x3A, 0x7B, 0x7D, 0x7D,
    ]

    /// `counter`
    static let counterName: Frame = [0x63, 0x6F, 0x75, 0x6E, 0x74, 0x65, 0x72]

    /// DISPATCH, request id 1, domain version 1, client id 00 01 … 0f, store `counter`, one action.
    static let dispatch: [Frame] = [
        [
            0x4C, 0x53, 0x01, 0x01,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
            0x00, 0x00, 0x00, 0x01,
            0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F,
        ],
        counterName,
        incrementJSON,
    ]

    /// ACCEPTED, request id 1, epoch 0123456789abcdef, first seq 42, count 1.
    static let accepted: [Frame] = [
        [
            0x4C, 0x53, 0x01, 0x81,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
            0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2A,
            0x00, 0x00, 0x00, 0x01,
        ]
    ]

    /// EVENT on `counter`, epoch 0123456789abcdef, seq 42, the same action.
    static let event: [Frame] = [
        counterName + [0x00],
        [
            0x4C, 0x53, 0x01, 0x41,
            0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2A,
        ],
        incrementJSON,
    ]

    /// EVENTS: seqs 42 and 43 of `counter`, both `{"increment":{}}`, on the topic of the stream in runs.
    static let events: [Frame] = [
        counterName + [0x01],
        [
            0x4C, 0x53, 0x01, 0x44,
            0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2A,
        ],
        incrementJSON,
        incrementJSON,
    ]

    /// The ERROR that answers the DISPATCH above sent with protocol version 2.
    static let versionError: [Frame] = [
        [
            0x4C, 0x53, 0x01, 0x8F,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
            0x00, 0x02,
        ],
        Array("protocol version 2 is not spoken here; this peer speaks version 1".utf8),
    ]
}

@Suite struct CodecGoldenTests {
    @Test func dispatchMatchesTheDocument() throws {
        let request = Request.dispatch(
            DispatchRequest(
                requestID: 1,
                domainVersion: 1,
                clientID: CodecSamples.clientID,
                store: CodecSamples.counter,
                actions: [GoldenVectors.incrementJSON]
            )
        )
        #expect(request.encode() == GoldenVectors.dispatch)
        #expect(try Request.decode(GoldenVectors.dispatch) == request)
    }

    @Test func acceptedMatchesTheDocument() throws {
        let reply = Reply.accepted(requestID: 1, epoch: CodecSamples.epoch, firstSeq: 42, count: 1)
        #expect(reply.encode() == GoldenVectors.accepted)
        #expect(try Reply.decode(GoldenVectors.accepted) == reply)
    }

    @Test func eventMatchesTheDocument() throws {
        let event = Event.event(
            store: CodecSamples.counter,
            epoch: CodecSamples.epoch,
            seq: 42,
            action: GoldenVectors.incrementJSON
        )
        #expect(event.encode() == GoldenVectors.event)
        #expect(try Event.decode(GoldenVectors.event) == event)
    }

    @Test func eventsMatchTheDocument() throws {
        let events = Event.events(
            store: CodecSamples.counter,
            epoch: CodecSamples.epoch,
            firstSeq: 42,
            actions: [GoldenVectors.incrementJSON, GoldenVectors.incrementJSON]
        )
        #expect(events.encode() == GoldenVectors.events)
        #expect(try Event.decode(GoldenVectors.events) == events)
    }

    /// The daemon's path for a request of another version: the decoder's error, addressed by the request id.
    @Test func aVersion2RequestGetsTheDocumentedError() throws {
        var body = GoldenVectors.dispatch
        body[0][2] = 0x02
        let error = try #require(throws: ProtocolError.self) { try Request.decode(body) }
        let reply = Reply.error(requestID: Request.requestID(in: body), error)
        #expect(reply.encode() == GoldenVectors.versionError)
        #expect(try Reply.decode(GoldenVectors.versionError) == reply)
    }

    @Test func theGoldenActionIsWhatTheCounterDomainWrites() throws {
        #expect(Array(try CanonicalEncoding.encode(Counter.Action.increment)) == GoldenVectors.incrementJSON)
        #expect(Array(Counter.name.utf8) == GoldenVectors.counterName)
    }
}
