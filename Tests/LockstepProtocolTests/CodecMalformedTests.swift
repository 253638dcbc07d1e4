import Lockstep
import LockstepProtocol
import Testing

/// One input a decoder must refuse: the error code it must give and words its reason must contain.
struct Malformation: Sendable, CustomTestStringConvertible {
    let name: String
    let frames: [Frame]
    let limits: Limits
    let code: ProtocolError.Code
    /// Words the reason must contain, so it names the field, the value or the limit.
    let reason: [String]

    init(
        _ name: String,
        _ frames: [Frame],
        limits: Limits = .default,
        _ code: ProtocolError.Code,
        _ reason: String...
    ) {
        self.name = name
        self.frames = frames
        self.limits = limits
        self.code = code
        self.reason = reason
    }

    var testDescription: String { name }

    func check(_ decode: ([Frame], Limits) throws(ProtocolError) -> Void) {
        do throws(ProtocolError) {
            try decode(frames, limits)
            Issue.record("\(name): decoded, expected \(code)")
        } catch {
            #expect(error.code == code, "\(name): \(error)")
            for word in reason {
                #expect(error.reason.contains(word), "\(name): reason \"\(error.reason)\" lacks \"\(word)\"")
            }
        }
    }
}

/// `frames` with byte `index` of frame `frame` set to `value`.
private func setting(_ frames: [Frame], frame: Int, byte index: Int, to value: UInt8) -> [Frame] {
    var frames = frames
    frames[frame][index] = value
    return frames
}

/// `frames` with frame `index` replaced.
private func replacing(_ frames: [Frame], frame index: Int, with frame: Frame) -> [Frame] {
    var frames = frames
    frames[index] = frame
    return frames
}

private let dispatch = GoldenVectors.dispatch
private let snapshotRequest = Request.snapshot(requestID: 2, store: CodecSamples.counter).encode()
private let rangeRequest = Request.range(requestID: 3, store: CodecSamples.counter, from: 5, to: 9).encode()
private let statusRequest = Request.status(requestID: 4).encode()
private let effectsRetry = Request.effects(requestID: 5, .retry("reminders/1/0")).encode()
private let epoch = CodecSamples.epoch
private let report = Request.report(
    requestID: 0,
    ReplicaProgress(
        clientID: CodecSamples.clientID,
        store: CodecSamples.counter,
        name: "host:1",
        epoch: epoch,
        appliedSeq: 7,
        interval: .seconds(1)
    )
).encode()

/// A RANGE request header asking for `from...to`.
private func rangeHeader(from: UInt64, to: UInt64) -> Frame {
    Request.range(requestID: 3, store: CodecSamples.counter, from: from, to: to).encode()[0]
}

private let requestMalformations: [Malformation] = [
    Malformation("no frames", [], .malformed, "0 frames"),
    Malformation("header of 3 bytes", [[0x4C, 0x53, 0x01]], .malformed, "3 bytes", "at least 4"),
    Malformation("wrong magic", setting(dispatch, frame: 0, byte: 1, to: 0x54), .malformed, "magic", "0x54", "0x53"),
    Malformation(
        "version 2",
        setting(dispatch, frame: 0, byte: 2, to: 2),
        .unsupportedVersion,
        "protocol version 2 is not spoken here; this peer speaks version 1"
    ),
    Malformation("version 0", setting(dispatch, frame: 0, byte: 2, to: 0), .unsupportedVersion, "version 0"),
    Malformation("type 0x00", setting(dispatch, frame: 0, byte: 3, to: 0x00), .unknownMessageType, "0x00"),
    Malformation("type 0x07", setting(dispatch, frame: 0, byte: 3, to: 0x07), .unknownMessageType, "0x07"),
    Malformation("reply type", setting(dispatch, frame: 0, byte: 3, to: 0x81), .unknownMessageType, "ACCEPTED"),
    Malformation("event type", setting(dispatch, frame: 0, byte: 3, to: 0x41), .unknownMessageType, "EVENT"),
    Malformation(
        "DISPATCH header short",
        replacing(dispatch, frame: 0, with: dispatch[0].dropLast()),
        .malformed,
        "31 bytes",
        "32"
    ),
    Malformation(
        "DISPATCH trace context not key=value",
        replacing(dispatch, frame: 0, with: dispatch[0] + Array("traceparent".utf8)),
        .malformed,
        "trace context",
        "'traceparent'",
        "key=value"
    ),
    Malformation(
        "DISPATCH trace context too long",
        replacing(dispatch, frame: 0, with: dispatch[0] + Array(repeating: UInt8(ascii: "a"), count: 1_025)),
        .malformed,
        "1025 bytes",
        "1 to 1024"
    ),
    Malformation(
        "DISPATCH trace context not UTF-8",
        replacing(dispatch, frame: 0, with: dispatch[0] + [0xC3]),
        .malformed,
        "UTF-8"
    ),
    Malformation("DISPATCH without actions", Array(dispatch.prefix(2)), .malformed, "2 frames", "3 to 1002"),
    Malformation("DISPATCH header only", Array(dispatch.prefix(1)), .malformed, "1 frame"),
    Malformation("empty store name", replacing(dispatch, frame: 1, with: []), .malformed, "store name", "0 bytes"),
    Malformation(
        "65-byte store name",
        replacing(dispatch, frame: 1, with: Array(repeating: 0x61, count: 65)),
        .malformed,
        "store name",
        "65 bytes",
        "1 to 64"
    ),
    Malformation(
        "slash in store name",
        replacing(dispatch, frame: 1, with: Array("a/b".utf8)),
        .malformed,
        "0x2f",
        "offset 1"
    ),
    Malformation("0x00 in store name", replacing(dispatch, frame: 1, with: [0x61, 0x00]), .malformed, "0x00"),
    Malformation("non-ASCII store name", replacing(dispatch, frame: 1, with: Array("café".utf8)), .malformed, "0xc3"),
    Malformation("empty action", dispatch + [[]], .malformed, "action 1 (frame 3)", "empty"),
    Malformation(
        "too many actions",
        dispatch + [dispatch[2], dispatch[2], dispatch[2]],
        limits: Limits(maximumBatch: 3),
        .tooLarge,
        "4 actions",
        "maximumBatch = 3"
    ),
    Malformation(
        "1001 actions",
        Array(dispatch.prefix(2)) + Array(repeating: dispatch[2], count: 1001),
        .tooLarge,
        "1001 actions",
        "maximumBatch = 1000"
    ),
    Malformation(
        "oversized action",
        dispatch + [Array(repeating: 0x20, count: 17)],
        limits: Limits(maximumActionBytes: 16),
        .tooLarge,
        "action 1 (frame 3)",
        "17 bytes",
        "maximumActionBytes = 16"
    ),
    Malformation(
        "action over 1 MiB",
        Array(dispatch.prefix(2)) + [Array(repeating: 0x20, count: (1 << 20) + 1)],
        .tooLarge,
        "1048577 bytes",
        "maximumActionBytes = 1048576"
    ),
    Malformation("SNAPSHOT without store", Array(snapshotRequest.prefix(1)), .malformed, "1 frame", "exactly 2"),
    Malformation("SNAPSHOT extra frames", snapshotRequest + [[], []], .malformed, "4 frames", "exactly 2"),
    Malformation("SNAPSHOT part short", snapshotRequest + [[0]], .malformed, "part (frame 2)", "1 bytes", "exactly 20"),
    Malformation(
        "SNAPSHOT part of no bytes",
        snapshotRequest + [[UInt8](repeating: 0, count: 20)],
        .malformed,
        "maximum bytes",
        "is 0"
    ),
    Malformation(
        "SNAPSHOT part past the first of seq 0",
        snapshotRequest + [[UInt8](repeating: 0, count: 15) + [1, 0, 0, 0, 1]],
        .malformed,
        "offset 1 of seq 0"
    ),
    Malformation(
        "SNAPSHOT header long",
        replacing(snapshotRequest, frame: 0, with: snapshotRequest[0] + [0]),
        .malformed,
        "13 bytes",
        "exactly 12"
    ),
    Malformation(
        "RANGE header short",
        replacing(rangeRequest, frame: 0, with: rangeRequest[0].dropLast()),
        .malformed,
        "27 bytes",
        "28"
    ),
    Malformation(
        "RANGE from 0",
        replacing(rangeRequest, frame: 0, with: rangeHeader(from: 0, to: 9)),
        .invalidRange,
        "from seq",
        "0"
    ),
    Malformation(
        "RANGE from > to",
        replacing(rangeRequest, frame: 0, with: rangeHeader(from: 10, to: 9)),
        .invalidRange,
        "from seq 10 to seq 9"
    ),
    Malformation("RANGE bad store", replacing(rangeRequest, frame: 1, with: Array("x y".utf8)), .malformed, "0x20"),
    Malformation("STATUS extra frame", statusRequest + [Array("counter".utf8)], .malformed, "2 frames", "exactly 1"),
    Malformation("STATUS header short", [Array(statusRequest[0].prefix(11))], .malformed, "11 bytes", "12"),
    Malformation("EFFECTS no command", [effectsRetry[0]], .malformed, "1 frame", "header, list"),
    Malformation(
        "EFFECTS unknown command",
        replacing(effectsRetry, frame: 1, with: Array("purge".utf8)),
        .malformed,
        "'purge'",
        "list, retry or drop"
    ),
    Malformation("EFFECTS retry without id", Array(effectsRetry.prefix(2)), .malformed, "2 frames", "exactly 3"),
    Malformation(
        "EFFECTS list with id",
        [effectsRetry[0], Array("list".utf8), effectsRetry[2]],
        .malformed,
        "3 frames"
    ),
    Malformation(
        "EFFECTS id too long",
        replacing(effectsRetry, frame: 2, with: Array(repeating: 0x61, count: 201)),
        .malformed,
        "201 bytes",
        "1 to 200"
    ),
    Malformation(
        "EFFECTS id not UTF-8",
        replacing(effectsRetry, frame: 2, with: [0xFF, 0xFE]),
        .malformed,
        "UTF-8"
    ),
    Malformation("REPORT without name", Array(report.prefix(2)), .malformed, "2 frames", "exactly 3"),
    Malformation(
        "REPORT header short",
        [Array(report[0].prefix(71))] + report.dropFirst(),
        .malformed,
        "71 bytes",
        "72"
    ),
    Malformation("REPORT empty name", replacing(report, frame: 2, with: []), .malformed, "0 bytes", "1 to 200"),
    Malformation(
        "REPORT name too long",
        replacing(report, frame: 2, with: Array(repeating: 0x61, count: 201)),
        .malformed,
        "201 bytes"
    ),
    Malformation("REPORT name not UTF-8", replacing(report, frame: 2, with: [0xC3]), .malformed, "UTF-8"),
    Malformation(
        "REPORT interval 0",
        [Array(report[0].prefix(44)) + [0, 0, 0, 0] + Array(report[0].dropFirst(48))] + report.dropFirst(),
        .malformed,
        "report interval",
        "0 ms"
    ),
    Malformation("REPORT bad store", replacing(report, frame: 1, with: Array("x y".utf8)), .malformed, "0x20"),
]

private let accepted = GoldenVectors.accepted
private let rejected = Reply.rejected(requestID: 1, actionIndex: 0, Rejection(code: "nope", "why")).encode()
private let snapshotReply = Reply.snapshot(
    requestID: 1,
    SnapshotReply(store: CodecSamples.counter, epoch: epoch, seq: 3, digest: StateDigest(of: [0x33]), state: [0x33])
).encode()
private let rangeReply = Reply.range(
    requestID: 1,
    store: CodecSamples.counter,
    epoch: epoch,
    firstSeq: 5,
    actions: [CodecSamples.increment]
).encode()
private let compacted = Reply.compacted(requestID: 1, store: CodecSamples.counter, epoch: epoch, firstAvailable: 9)
    .encode()
private let statusReply = Reply.status(requestID: 1, json: Array("{}".utf8)).encode()
private let errorReply = GoldenVectors.versionError

/// An ACCEPTED header with these fields.
private func acceptedHeader(firstSeq: UInt64, count: UInt32) -> Frame {
    Reply.accepted(requestID: 1, epoch: epoch, firstSeq: firstSeq, count: count).encode()[0]
}

private let rangeReplyBy = Reply.range(
    requestID: 6,
    store: CodecSamples.counter,
    epoch: epoch,
    firstSeq: 1,
    actions: [CodecSamples.increment, CodecSamples.increment],
    authors: ["a", "b"]
).encode()

private let replyMalformations: [Malformation] = [
    Malformation(
        "RANGE_BY with an odd count",
        Array(rangeReplyBy.prefix(5)),
        .malformed,
        "RANGE_BY",
        "5 frames",
        "even"
    ),
    Malformation(
        "RANGE_BY with an author of other bytes",
        replacing(rangeReplyBy, frame: 5, with: Array("b/".utf8)),
        .malformed,
        "author 1 (frame 5)",
        "0x2f"
    ),
    Malformation("no frames", [], .malformed, "0 frames"),
    Malformation("wrong magic", setting(accepted, frame: 0, byte: 0, to: 0x00), .malformed, "magic", "0x00"),
    Malformation(
        "version 2",
        setting(accepted, frame: 0, byte: 2, to: 2),
        .unsupportedVersion,
        "protocol version 2 is not spoken here; this peer speaks version 1"
    ),
    Malformation("type 0x89", setting(accepted, frame: 0, byte: 3, to: 0x89), .unknownMessageType, "0x89"),
    Malformation("request type", GoldenVectors.dispatch, .unknownMessageType, "0x01", "DISPATCH"),
    Malformation("event header", [GoldenVectors.event[1]], .unknownMessageType, "0x41"),
    Malformation("ACCEPTED header short", [accepted[0].dropLast()], .malformed, "31 bytes", "32"),
    Malformation("ACCEPTED extra frame", accepted + [[]], .malformed, "2 frames", "exactly 1"),
    Malformation(
        "ACCEPTED zero count",
        [acceptedHeader(firstSeq: 42, count: 0)],
        .malformed,
        "count",
        "0",
        "1 or more"
    ),
    Malformation("ACCEPTED first seq 0", [acceptedHeader(firstSeq: 0, count: 1)], .malformed, "first seq", "1 or more"),
    Malformation("ACCEPTED past the last seq", [acceptedHeader(firstSeq: .max, count: 2)], .malformed, "largest seq"),
    Malformation("REJECTED without reason", Array(rejected.prefix(2)), .malformed, "2 frames", "exactly 3"),
    Malformation(
        "REJECTED empty code",
        replacing(rejected, frame: 1, with: []),
        .malformed,
        "rejection code",
        "0 bytes"
    ),
    Malformation("REJECTED code with '-'", replacing(rejected, frame: 1, with: Array("a-b".utf8)), .malformed, "0x2d"),
    Malformation(
        "REJECTED 65-byte code",
        replacing(rejected, frame: 1, with: Array(repeating: 0x61, count: 65)),
        .malformed,
        "65 bytes"
    ),
    Malformation(
        "REJECTED long reason",
        replacing(rejected, frame: 2, with: Array(repeating: 0x61, count: 4097)),
        .tooLarge,
        "4097 bytes",
        "4096"
    ),
    Malformation("REJECTED reason not UTF-8", replacing(rejected, frame: 2, with: [0x61, 0xFF]), .malformed, "UTF-8"),
    Malformation(
        "SNAPSHOT header short",
        replacing(snapshotReply, frame: 0, with: snapshotReply[0].dropLast()),
        .malformed,
        "59 bytes",
        "60"
    ),
    Malformation("SNAPSHOT without state", Array(snapshotReply.prefix(2)), .malformed, "2 frames", "exactly 3"),
    Malformation("SNAPSHOT part short", snapshotReply + [[1]], .malformed, "part (frame 3)", "exactly 24"),
    Malformation(
        "SNAPSHOT part past its total",
        snapshotReply + [
            [UInt8](repeating: 0, count: 7) + [1] + [UInt8](repeating: 0, count: 7) + [1]
                + [UInt8](repeating: 0, count: 8)
        ],
        .malformed,
        "1 bytes at offset 1 passes the state's total of 1"
    ),
    Malformation("SNAPSHOT extra frames", snapshotReply + [[], []], .malformed, "5 frames", "exactly 3"),
    Malformation("SNAPSHOT empty state", replacing(snapshotReply, frame: 2, with: []), .malformed, "state", "empty"),
    Malformation("SNAPSHOT bad store", replacing(snapshotReply, frame: 1, with: []), .malformed, "store name"),
    Malformation("RANGE without store", Array(rangeReply.prefix(1)), .malformed, "1 frame", "at least 2"),
    Malformation("RANGE empty action", rangeReply + [[]], .malformed, "action 1 (frame 3)", "empty"),
    Malformation(
        "RANGE oversized action",
        rangeReply,
        limits: Limits(maximumActionBytes: 15),
        .tooLarge,
        "action 0 (frame 2)",
        "maximumActionBytes = 15"
    ),
    Malformation("COMPACTED extra frame", compacted + [[0x7B]], .malformed, "3 frames", "exactly 2"),
    Malformation(
        "COMPACTED first seq 0",
        replacing(compacted, frame: 0, with: Array(compacted[0].prefix(20)) + Array(repeating: 0, count: 8)),
        .malformed,
        "first available seq"
    ),
    Malformation("STATUS without JSON", Array(statusReply.prefix(1)), .malformed, "1 frame", "exactly 2"),
    Malformation(
        "ERROR header long",
        replacing(errorReply, frame: 0, with: errorReply[0] + [0]),
        .malformed,
        "15 bytes",
        "14"
    ),
    Malformation("ERROR without reason", Array(errorReply.prefix(1)), .malformed, "1 frame", "exactly 2"),
    Malformation(
        "ERROR long reason",
        replacing(errorReply, frame: 1, with: Array(repeating: 0x61, count: 5000)),
        .tooLarge,
        "5000 bytes"
    ),
]

private let event = GoldenVectors.event
private let events = Event.events(
    store: CodecSamples.counter,
    epoch: epoch,
    firstSeq: 42,
    actions: [GoldenVectors.event[2], GoldenVectors.event[2]]
).encode()
private let heartbeat = Event.heartbeat(store: CodecSamples.counter, epoch: epoch, lastSeq: 42).encode()
private let trace = Event.trace(
    store: CodecSamples.counter,
    epoch: epoch,
    firstSeq: 1,
    lastSeq: 2,
    ["traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"]
).encode()
private let digest = Event.digest(store: CodecSamples.counter, epoch: epoch, seq: 9, StateDigest(of: [0x39])).encode()

private let eventBy = Event.event(
    store: CodecSamples.counter,
    epoch: epoch,
    seq: 42,
    action: GoldenVectors.event[2],
    author: "member"
).encode()
private let eventsBy = Event.events(
    store: CodecSamples.counter,
    epoch: epoch,
    firstSeq: 42,
    actions: [GoldenVectors.event[2], GoldenVectors.event[2]],
    authors: ["a", "b"]
).encode()

private let eventMalformations: [Malformation] = [
    Malformation("EVENT_BY without its author", Array(eventBy.prefix(3)), .malformed, "EVENT_BY", "exactly 4"),
    Malformation(
        "EVENT_BY with an author of other bytes",
        replacing(eventBy, frame: 3, with: Array("mem ber".utf8)),
        .malformed,
        "author (frame 3)",
        "0x20"
    ),
    Malformation(
        "EVENT_BY with an author over 64 bytes",
        replacing(eventBy, frame: 3, with: Array(repeating: 0x61, count: 65)),
        .malformed,
        "65 bytes",
        "at most 64"
    ),
    Malformation(
        "EVENTS_BY with an author short",
        Array(eventsBy.prefix(5)),
        .malformed,
        "EVENTS_BY",
        "5 frames",
        "even"
    ),
    Malformation("EVENTS_BY with no action", Array(eventsBy.prefix(2)), .malformed, "EVENTS_BY", "2 frames"),
    Malformation("no frames", [], .malformed, "0 frames", "at least 2"),
    Malformation("topic only", Array(event.prefix(1)), .malformed, "1 frame"),
    Malformation(
        "topic without 0x00",
        replacing(event, frame: 0, with: Array("counter".utf8)),
        .malformed,
        "topic",
        "0x72",
        "0x00"
    ),
    Malformation("empty topic", replacing(event, frame: 0, with: []), .malformed, "topic", "is empty"),
    Malformation("topic of a bare 0x00", replacing(event, frame: 0, with: [0]), .malformed, "topic", "0 bytes"),
    Malformation(
        "topic with two 0x00",
        replacing(event, frame: 0, with: Array("counter".utf8) + [0, 0]),
        .malformed,
        "topic",
        "0x00"
    ),
    Malformation(
        "topic with a bad name",
        replacing(event, frame: 0, with: Array("a b".utf8) + [0]),
        .malformed,
        "topic",
        "0x20"
    ),
    Malformation("header as frame 0", Array(event.dropFirst()), .malformed, "magic"),
    Malformation("wrong magic", setting(event, frame: 1, byte: 0, to: 0x6C), .malformed, "magic", "0x6c"),
    Malformation(
        "version 2",
        setting(event, frame: 1, byte: 2, to: 2),
        .unsupportedVersion,
        "protocol version 2 is not spoken here; this peer speaks version 1"
    ),
    Malformation(
        "version 2 with any topic",
        replacing(setting(event, frame: 1, byte: 2, to: 2), frame: 0, with: []),
        .unsupportedVersion
    ),
    Malformation("type 0x49", setting(event, frame: 1, byte: 3, to: 0x49), .unknownMessageType, "0x49"),
    Malformation(
        "TRACE on the stream in runs",
        replacing(trace, frame: 0, with: Event.runTopic(for: CodecSamples.counter)),
        .malformed,
        "TRACE on a topic ending with 0x01",
        "0x02"
    ),
    Malformation(
        "HEARTBEAT on the trace topic",
        replacing(heartbeat, frame: 0, with: Event.traceTopic(for: CodecSamples.counter)),
        .malformed,
        "0x02",
        "expected 0x00 or 0x01"
    ),
    Malformation(
        "TRACE first after last",
        Event.trace(store: CodecSamples.counter, epoch: epoch, firstSeq: 5, lastSeq: 4, ["k": "v"]).encode(),
        .malformed,
        "seqs 5 to 4"
    ),
    Malformation("TRACE without context", Array(trace.prefix(2)), .malformed, "2 frames", "exactly 3"),
    Malformation(
        "TRACE context not key=value",
        replacing(trace, frame: 2, with: Array("x".utf8)),
        .malformed,
        "key=value"
    ),
    Malformation("TRACE context empty", replacing(trace, frame: 2, with: []), .malformed, "0 bytes", "1 to 1024"),
    Malformation(
        "EVENTS on the one-by-one topic",
        setting(event, frame: 1, byte: 3, to: 0x44),
        .malformed,
        "EVENTS on the topic of the one-by-one stream",
        "expected 0x01"
    ),
    Malformation(
        "EVENT on the topic in runs",
        replacing(event, frame: 0, with: Array(event[0].dropLast()) + [1]),
        .malformed,
        "EVENT on the topic of the stream in runs"
    ),
    Malformation(
        "EVENTS without actions",
        replacing(Array(events.prefix(2)), frame: 0, with: events[0]),
        .malformed,
        "2 frames",
        "expected 3 to 1002"
    ),
    Malformation(
        "EVENTS past the last seq",
        replacing(events, frame: 1, with: Array(events[1].prefix(12)) + Array(repeating: 0xFF, count: 8)),
        .malformed,
        "passes the largest seq"
    ),
    Malformation(
        "EVENTS over the run limit",
        events + Array(repeating: events[2], count: Event.maximumRun),
        .tooLarge,
        "1004 frames"
    ),
    Malformation("request type", setting(event, frame: 1, byte: 3, to: 0x01), .unknownMessageType, "DISPATCH"),
    Malformation("reply type", setting(event, frame: 1, byte: 3, to: 0x8F), .unknownMessageType, "ERROR"),
    Malformation(
        "EVENT header short",
        replacing(event, frame: 1, with: event[1].dropLast()),
        .malformed,
        "19 bytes",
        "20"
    ),
    Malformation("EVENT without action", Array(event.prefix(2)), .malformed, "2 frames", "exactly 3"),
    Malformation("EVENT extra frame", event + [event[2]], .malformed, "4 frames", "exactly 3"),
    Malformation("EVENT empty action", replacing(event, frame: 2, with: []), .malformed, "action", "empty"),
    Malformation(
        "EVENT oversized action",
        event,
        limits: Limits(maximumActionBytes: 8),
        .tooLarge,
        "16 bytes",
        "maximumActionBytes = 8"
    ),
    Malformation(
        "EVENT seq 0",
        replacing(event, frame: 1, with: Array(event[1].prefix(12)) + Array(repeating: 0, count: 8)),
        .malformed,
        "seq",
        "1 or more"
    ),
    Malformation("HEARTBEAT extra frame", heartbeat + [[0x7B]], .malformed, "3 frames", "exactly 2"),
    Malformation(
        "HEARTBEAT header long",
        replacing(heartbeat, frame: 1, with: heartbeat[1] + [0]),
        .malformed,
        "21 bytes",
        "20"
    ),
    Malformation(
        "DIGEST header short",
        replacing(digest, frame: 1, with: digest[1].dropLast()),
        .malformed,
        "51 bytes",
        "52"
    ),
    Malformation("DIGEST extra frame", digest + [[]], .malformed, "3 frames"),
]

@Suite struct CodecMalformedTests {
    @Test(arguments: requestMalformations)
    func requestIsRefused(_ malformation: Malformation) {
        malformation.check { frames, limits throws(ProtocolError) in _ = try Request.decode(frames, limits: limits) }
    }

    @Test(arguments: replyMalformations)
    func replyIsRefused(_ malformation: Malformation) {
        malformation.check { frames, limits throws(ProtocolError) in _ = try Reply.decode(frames, limits: limits) }
    }

    @Test(arguments: eventMalformations)
    func eventIsRefused(_ malformation: Malformation) {
        malformation.check { frames, limits throws(ProtocolError) in _ = try Event.decode(frames, limits: limits) }
    }

    /// The tables above start from valid messages: if those did not decode, every case would pass for the
    /// wrong reason.
    @Test func theMessagesTheTablesBreakAreValid() throws {
        for body in [dispatch, snapshotRequest, rangeRequest, statusRequest] {
            _ = try Request.decode(body)
        }
        for body in [accepted, rejected, snapshotReply, rangeReply, compacted, statusReply, errorReply] {
            _ = try Reply.decode(body)
        }
        for frames in [event, heartbeat, digest] {
            _ = try Event.decode(frames)
        }
    }
}
