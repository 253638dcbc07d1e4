import Lockstep
import LockstepProtocol
import Testing

/// A value with a short name, so parameterized tests list their cases readably.
struct Sample<Message: Sendable>: Sendable, CustomTestStringConvertible {
    let name: String
    let message: Message
    var testDescription: String { name }

    init(_ name: String, _ message: Message) {
        self.name = name
        self.message = message
    }
}

/// Values the codec tests share: fixed ones for tables, random ones for fuzzing.
enum CodecSamples {
    static let counter = store("counter")
    static let epoch = Epoch(rawValue: 0x0123_4567_89AB_CDEF)
    static let clientID = client(Array(0..<16))
    /// `{"increment":{}}`, as `Counter.Action.increment` encodes.
    static let increment: Frame = Array(#"{"increment":{}}"#.utf8)

    /// A name the test knows is valid; a typo in a test is a test bug, so it stops the run.
    static func store(_ name: String) -> StoreName {
        do {
            return try StoreName(name)
        } catch {
            preconditionFailure("test store name \"\(name)\" is invalid: \(error)")
        }
    }

    static func client(_ bytes: [UInt8]) -> ClientID {
        guard let id = ClientID(bytes: bytes) else { preconditionFailure("a client id takes 16 bytes") }
        return id
    }

    static func json(_ text: String) -> Frame { Array(text.utf8) }

    // MARK: - Fixed samples, one or more per message kind

    static let requests: [Sample<Request>] = [
        Sample(
            "DISPATCH traced",
            .dispatch(
                DispatchRequest(
                    requestID: 7,
                    domainVersion: 1,
                    clientID: clientID,
                    store: counter,
                    actions: [increment],
                    trace: [
                        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                        "tracestate": "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
                    ]
                )
            )
        ),
        Sample(
            "DISPATCH one action",
            .dispatch(
                DispatchRequest(
                    requestID: 1,
                    domainVersion: 1,
                    clientID: clientID,
                    store: counter,
                    actions: [increment]
                )
            )
        ),
        Sample(
            "DISPATCH three actions",
            .dispatch(
                DispatchRequest(
                    requestID: 99,
                    domainVersion: 3,
                    clientID: client(Array(repeating: 0xAB, count: 16)),
                    store: store("todos"),
                    actions: [
                        json(#"{"add":{"text":"Eat food"}}"#), json(#"{"toggle":{"id":1}}"#),
                        json(#"{"setFilter":{"filter":"showCompleted"}}"#),
                    ]
                )
            )
        ),
        Sample(
            "DISPATCH largest fields",
            .dispatch(
                DispatchRequest(
                    requestID: .max,
                    domainVersion: .max,
                    clientID: client(Array(repeating: 0xFF, count: 16)),
                    store: store(String(repeating: "z", count: 64)),
                    actions: [json("0")]
                )
            )
        ),
        Sample("SNAPSHOT", .snapshot(requestID: 2, store: counter)),
        Sample(
            "SNAPSHOT first part",
            .snapshot(requestID: 2, store: counter, part: SnapshotPartRequest(seq: 0, offset: 0, maximumBytes: 1))
        ),
        Sample(
            "SNAPSHOT next part",
            .snapshot(
                requestID: .max,
                store: counter,
                part: SnapshotPartRequest(seq: .max, offset: .max, maximumBytes: .max)
            )
        ),
        Sample("RANGE one seq", .range(requestID: 3, store: store("posts"), from: 1, to: 1)),
        Sample("RANGE widest", .range(requestID: .max, store: store("a.b-c_d"), from: 1, to: .max)),
        Sample("STATUS", .status(requestID: 0)),
        Sample("EFFECTS list", .effects(requestID: 9, .list)),
        Sample("EFFECTS retry", .effects(requestID: 10, .retry("reminders/12/1"))),
        Sample("EFFECTS drop longest id", .effects(requestID: .max, .drop(String(repeating: "é", count: 100)))),
        Sample(
            "REPORT joined",
            .report(
                requestID: 0,
                ReplicaProgress(
                    clientID: clientID,
                    store: counter,
                    name: "host:42",
                    epoch: epoch,
                    appliedSeq: 1_234,
                    interval: .seconds(1),
                    repairs: 2,
                    resyncs: 1,
                    divergences: .max
                )
            )
        ),
        Sample(
            "REPORT before joining, longest name",
            .report(
                requestID: .max,
                ReplicaProgress(
                    clientID: clientID,
                    store: counter,
                    name: String(repeating: "é", count: 100),
                    epoch: nil,
                    appliedSeq: 0,
                    interval: .milliseconds(1)
                )
            )
        ),
    ]

    static let replies: [Sample<Reply>] = [
        Sample("ACCEPTED", .accepted(requestID: 1, epoch: epoch, firstSeq: 42, count: 1)),
        Sample(
            "ACCEPTED last seqs",
            .accepted(requestID: .max, epoch: Epoch(rawValue: .max), firstSeq: .max - 9, count: 10)
        ),
        Sample(
            "REJECTED",
            .rejected(
                requestID: 7,
                actionIndex: 2,
                Rejection(code: "out_of_range", "index 9 is past the end (3 items)")
            )
        ),
        Sample(
            "REJECTED non-ASCII reason",
            .rejected(requestID: 8, actionIndex: .max, Rejection(code: "x", "ça ✓ 🚀"))
        ),
        Sample("REJECTED empty reason", .rejected(requestID: 9, actionIndex: 0, Rejection(code: "Z9_", ""))),
        Sample(
            "SNAPSHOT",
            .snapshot(
                requestID: 4,
                SnapshotReply(
                    store: counter,
                    epoch: epoch,
                    seq: 42,
                    digest: StateDigest(of: json(#"{"count":42}"#)),
                    state: json(#"{"count":42}"#)
                )
            )
        ),
        Sample(
            "SNAPSHOT part",
            .snapshot(
                requestID: 4,
                SnapshotReply(
                    store: counter,
                    epoch: epoch,
                    seq: 42,
                    digest: StateDigest(of: json(#"{"count":42}"#)),
                    state: json(#"unt":4"#),
                    part: SnapshotReply.Part(total: 12, offset: 3, storeSeq: 45)
                )
            )
        ),
        Sample(
            "SNAPSHOT at seq 0",
            .snapshot(
                requestID: 5,
                SnapshotReply(
                    store: counter,
                    epoch: epoch,
                    seq: 0,
                    digest: StateDigest(of: json(#"{"count":0}"#)),
                    state: json(#"{"count":0}"#)
                )
            )
        ),
        Sample("RANGE empty", .range(requestID: 6, store: counter, epoch: epoch, firstSeq: 43, actions: [])),
        Sample(
            "RANGE three",
            .range(
                requestID: 6,
                store: counter,
                epoch: epoch,
                firstSeq: 1,
                actions: [increment, increment, json("[]")]
            )
        ),
        Sample(
            "RANGE_BY",
            .range(
                requestID: 6,
                store: counter,
                epoch: epoch,
                firstSeq: 1,
                actions: [increment, increment],
                authors: ["a-b_C9", String(repeating: "x", count: 64)].map { Author($0) }
            )
        ),
        Sample(
            "RANGE ending at the last seq",
            .range(requestID: 6, store: counter, epoch: epoch, firstSeq: .max, actions: [increment])
        ),
        Sample("COMPACTED", .compacted(requestID: 7, store: counter, epoch: epoch, firstAvailable: 1001)),
        Sample("STATUS", .status(requestID: 8, json: json(#"{"stores":[]}"#))),
        Sample("STATUS empty", .status(requestID: 8, json: [])),
        Sample("EFFECTS", .effects(requestID: 9, json: json(#"{"effects":[],"timers":[]}"#))),
        Sample("ERROR", .error(requestID: 0, ProtocolError(code: .malformed, "magic is wrong"))),
        Sample(
            "ERROR unknown code",
            .error(requestID: 1, ProtocolError(code: .init(rawValue: 0xFFFF), "from the future"))
        ),
    ]

    static let events: [Sample<Event>] = [
        Sample("EVENT", .event(store: counter, epoch: epoch, seq: 42, action: increment)),
        Sample("EVENT last seq", .event(store: store("x"), epoch: Epoch(rawValue: 0), seq: .max, action: json("1"))),
        Sample("HEARTBEAT", .heartbeat(store: counter, epoch: epoch, lastSeq: 42)),
        Sample(
            "TRACE",
            .trace(
                store: counter,
                epoch: epoch,
                firstSeq: 7,
                lastSeq: 9,
                ["traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "a=b=c"]
            )
        ),
        Sample("HEARTBEAT empty store", .heartbeat(store: counter, epoch: epoch, lastSeq: 0)),
        Sample("DIGEST", .digest(store: counter, epoch: epoch, seq: 1000, StateDigest(of: json(#"{"count":7}"#)))),
        Sample("CHECKPOINT", .checkpoint(store: counter, epoch: epoch, seq: 1000)),
        Sample("EVENTS", .events(store: counter, epoch: epoch, firstSeq: 42, actions: [increment, increment])),
        Sample(
            "EVENTS one",
            .events(store: store("x"), epoch: Epoch(rawValue: 0), firstSeq: .max, actions: [json("1")])
        ),
        Sample("EVENT_BY", .event(store: counter, epoch: epoch, seq: 42, action: increment, author: "member")),
        Sample(
            "EVENTS_BY, one author unknown",
            .events(
                store: counter,
                epoch: epoch,
                firstSeq: 42,
                actions: [increment, increment],
                authors: ["lockstepd", .unknown]
            )
        ),
    ]

    // MARK: - Random valid messages, for the fuzz test's corpus

    static let nameBytes = Array("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.".utf8)
    static let codeBytes = Array("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_".utf8)

    static func randomBytes(_ count: Int, using random: inout SplitMix64) -> [UInt8] {
        // Eight bytes from each draw: generating inputs is half the fuzz test's time in a debug build.
        var bytes: [UInt8] = []
        bytes.reserveCapacity(count)
        var word: UInt64 = 0
        for index in 0..<count {
            if index % 8 == 0 { word = random.next() }
            bytes.append(UInt8(truncatingIfNeeded: word))
            word >>= 8
        }
        return bytes
    }

    static func randomStore(using random: inout SplitMix64) -> StoreName {
        let count = random.next() % 8 == 0 ? 64 : Int.random(in: 1...12, using: &random)
        let bytes = (0..<count).map { _ in nameBytes[Int.random(in: 0..<nameBytes.count, using: &random)] }
        return store(String(decoding: bytes, as: UTF8.self))
    }

    /// Field values near the edges the decoder checks.
    static func randomUInt64(using random: inout SplitMix64) -> UInt64 {
        switch random.next() % 5 {
        case 0: [0, 1, 2, .max - 1, .max][Int(random.next() % 5)]
        case 1: random.next() % 100
        default: random.next()
        }
    }

    static func randomSeq(using random: inout SplitMix64) -> SequenceNumber {
        max(1, randomUInt64(using: &random))
    }

    static func randomActions(_ range: ClosedRange<Int>, limits: Limits, using random: inout SplitMix64) -> [Frame] {
        (0..<Int.random(in: range, using: &random)).map { _ in
            randomBytes(Int.random(in: 1...limits.maximumActionBytes, using: &random), using: &random)
        }
    }

    static func randomReason(using random: inout SplitMix64) -> String {
        let pieces = ["a", "seq ", "42", " é", "✓", "🚀", "\n", "\"", "\u{0}"]
        return (0..<Int.random(in: 0...6, using: &random)).map { _ in
            pieces[Int.random(in: 0..<pieces.count, using: &random)]
        }.joined()
    }

    static func randomRequest(limits: Limits, using random: inout SplitMix64) -> Request {
        let requestID = randomUInt64(using: &random)
        switch random.next() % 6 {
        case 0:
            return .dispatch(
                DispatchRequest(
                    requestID: requestID,
                    domainVersion: UInt32(truncatingIfNeeded: randomUInt64(using: &random)),
                    clientID: client(randomBytes(16, using: &random)),
                    store: randomStore(using: &random),
                    actions: randomActions(1...limits.maximumBatch, limits: limits, using: &random)
                )
            )
        case 1:
            let part = SnapshotPartRequest(
                seq: randomSeq(using: &random),
                offset: randomUInt64(using: &random),
                maximumBytes: UInt32.random(in: 1...UInt32.max, using: &random)
            )
            return .snapshot(
                requestID: requestID,
                store: randomStore(using: &random),
                part: random.next() % 2 == 0 ? part : nil
            )
        case 2:
            let from = randomSeq(using: &random)
            let to = from + min(randomUInt64(using: &random), .max - from)
            return .range(requestID: requestID, store: randomStore(using: &random), from: from, to: to)
        case 3:
            return .status(requestID: requestID)
        case 4:
            let epoch = randomUInt64(using: &random)
            return .report(
                requestID: requestID,
                ReplicaProgress(
                    clientID: client(randomBytes(16, using: &random)),
                    store: randomStore(using: &random),
                    name: String(
                        decoding: randomBytes(Int.random(in: 1...200, using: &random), using: &random).map {
                            0x21 + $0 % 90
                        },
                        as: UTF8.self
                    ),
                    epoch: epoch == 0 ? nil : Epoch(rawValue: epoch),
                    appliedSeq: randomUInt64(using: &random),
                    interval: .milliseconds(Int64(UInt32.random(in: 1...UInt32.max, using: &random))),
                    repairs: randomUInt64(using: &random),
                    resyncs: randomUInt64(using: &random),
                    divergences: randomUInt64(using: &random)
                )
            )
        default:
            let id = String(
                decoding: randomBytes(Int.random(in: 1...40, using: &random), using: &random).map { 0x61 + $0 % 26 },
                as: UTF8.self
            )
            let commands: [EffectsCommand] = [.list, .retry(id), .drop(id)]
            return .effects(requestID: requestID, commands[Int.random(in: 0...2, using: &random)])
        }
    }

    static func randomReply(limits: Limits, using random: inout SplitMix64) -> Reply {
        let requestID = randomUInt64(using: &random)
        let epoch = Epoch(rawValue: randomUInt64(using: &random))
        switch random.next() % 8 {
        case 0:
            let count = UInt32.random(in: 1...1000, using: &random)
            let first = min(randomSeq(using: &random), .max - UInt64(count - 1))
            return .accepted(requestID: requestID, epoch: epoch, firstSeq: first, count: count)
        case 1:
            let code = (0..<Int.random(in: 1...12, using: &random)).map { _ in
                codeBytes[Int.random(in: 0..<codeBytes.count, using: &random)]
            }
            return .rejected(
                requestID: requestID,
                actionIndex: UInt32(truncatingIfNeeded: randomUInt64(using: &random)),
                Rejection(code: String(decoding: code, as: UTF8.self), randomReason(using: &random))
            )
        case 2:
            let state = randomBytes(Int.random(in: 1...40, using: &random), using: &random)
            let offset = randomUInt64(using: &random) % (UInt64.max - 64)
            let snapshot = SnapshotReply(
                store: randomStore(using: &random),
                epoch: epoch,
                seq: randomUInt64(using: &random),
                digest: StateDigest(of: state),
                state: state,
                part: random.next() % 2 == 0
                    ? SnapshotReply.Part(
                        total: offset + UInt64(state.count) + random.next() % 9,
                        offset: offset,
                        storeSeq: randomUInt64(using: &random)
                    ) : nil
            )
            return .snapshot(requestID: requestID, snapshot)
        case 3:
            let actions = randomActions(0...4, limits: limits, using: &random)
            let first = min(randomSeq(using: &random), .max - UInt64(max(actions.count, 1) - 1))
            return .range(
                requestID: requestID,
                store: randomStore(using: &random),
                epoch: epoch,
                firstSeq: first,
                actions: actions
            )
        case 4:
            return .compacted(
                requestID: requestID,
                store: randomStore(using: &random),
                epoch: epoch,
                firstAvailable: randomSeq(using: &random)
            )
        case 5:
            return .status(
                requestID: requestID,
                json: randomBytes(Int.random(in: 0...40, using: &random), using: &random)
            )
        case 6:
            return .effects(
                requestID: requestID,
                json: randomBytes(Int.random(in: 0...40, using: &random), using: &random)
            )
        default:
            let code = ProtocolError.Code(rawValue: UInt16.random(in: 1...13, using: &random))
            return .error(requestID: requestID, ProtocolError(code: code, randomReason(using: &random)))
        }
    }

    static func randomEvent(limits: Limits, using random: inout SplitMix64) -> Event {
        let store = randomStore(using: &random)
        let epoch = Epoch(rawValue: randomUInt64(using: &random))
        switch random.next() % 4 {
        case 0:
            let action = randomActions(1...1, limits: limits, using: &random)[0]
            return .event(store: store, epoch: epoch, seq: randomSeq(using: &random), action: action)
        case 3:
            let actions = randomActions(1...4, limits: limits, using: &random)
            let first = min(randomSeq(using: &random), .max - UInt64(actions.count - 1))
            return .events(store: store, epoch: epoch, firstSeq: first, actions: actions)
        case 1:
            return .heartbeat(store: store, epoch: epoch, lastSeq: randomUInt64(using: &random))
        default:
            let digest = StateDigest(of: randomBytes(8, using: &random))
            return .digest(store: store, epoch: epoch, seq: randomUInt64(using: &random), digest)
        }
    }
}
