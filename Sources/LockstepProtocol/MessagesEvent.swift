import Lockstep

/// A message the daemon publishes on the events socket: frame 0 is the store's topic, frame 1 the header.
///
/// Each store has two streams, one topic each: *one by one* (``topic(for:)``: an EVENT per action) and *in runs*
/// (``runTopic(for:)``: one EVENTS per store per commit, up to ``maximumRun`` actions). Both carry the HEARTBEATs,
/// DIGESTs and CHECKPOINTs. The daemon publishes a stream only while someone subscribes to it.
public enum Event: Hashable, Sendable {
    /// The action that got `seq` (the one-by-one stream), dispatched by `author`: an EVENT, or an EVENT_BY when the
    /// author is known.
    case event(store: StoreName, epoch: Epoch, seq: SequenceNumber, action: Frame, author: Author = .unknown)
    /// Actions that got seqs `firstSeq`, `firstSeq + 1`, … in one commit (the stream in runs); never empty. `authors`
    /// is empty when nobody was identified (an EVENTS), else each action's author (an EVENTS_BY).
    case events(store: StoreName, epoch: Epoch, firstSeq: SequenceNumber, actions: [Frame], authors: [Author] = [])
    /// The store is idle and stands at `lastSeq`; a replica behind it has lost events.
    case heartbeat(store: StoreName, epoch: Epoch, lastSeq: SequenceNumber)
    /// The digest of the daemon's canonical state at `seq`, for replicas to compare with their own. It follows the
    /// event of `seq` at once, or — for a state too large to encode on the daemon's loop — comes later, after a
    /// ``checkpoint(store:epoch:seq:)`` for the same seq.
    case digest(store: StoreName, epoch: Epoch, seq: SequenceNumber, StateDigest)
    /// The daemon is taking the digest of its state at `seq` off its loop: a DIGEST for `seq` follows, later. It comes
    /// right after the event of `seq`, so a replica can keep its own state at `seq` to compare with it.
    case checkpoint(store: StoreName, epoch: Epoch, seq: SequenceNumber)
    /// The trace context of the daemon's span of the dispatch that got seqs `firstSeq...lastSeq` (a TRACE, on the
    /// store's trace topic, ``traceTopic(for:)``, just before those events): a replica that traces continues it
    /// with its span of applying them.
    case trace(store: StoreName, epoch: Epoch, firstSeq: SequenceNumber, lastSeq: SequenceNumber, [String: String])

    /// The store the message is about.
    public var store: StoreName {
        switch self {
        case let .event(store, _, _, _, _), let .heartbeat(store, _, _), let .digest(store, _, _, _),
            let .events(store, _, _, _, _), let .checkpoint(store, _, _), let .trace(store, _, _, _, _):
            store
        }
    }

    /// The most actions one EVENTS carries; a longer commit is published as several.
    public static let maximumRun = 1_000

    /// The topic frame of `store`'s messages, and the exact subscription for them: the name, then one 0x00.
    ///
    /// ZeroMQ matches subscriptions by prefix; the 0x00, which no name contains, keeps `todo` from
    /// receiving `todos`.
    public static func topic(for store: StoreName) -> Frame {
        Array(store.rawValue.utf8) + [0]
    }

    /// The topic of `store`'s stream in runs (EVENTS, HEARTBEAT, DIGEST, CHECKPOINT): the name, then one 0x01. Neither topic
    /// of a store is a prefix of the other's, nor of another store's.
    public static func runTopic(for store: StoreName) -> Frame {
        Array(store.rawValue.utf8) + [1]
    }

    /// The topic of `store`'s TRACEs: the name, then one 0x02. Only a replica that traces subscribes to it.
    public static func traceTopic(for store: StoreName) -> Frame {
        Array(store.rawValue.utf8) + [2]
    }

    /// The frames of this message with `store`'s topic of the stream in runs instead of the one-by-one stream's
    /// (an EVENTS has no other).
    public func encodeForRuns() -> [Frame] {
        var frames = encode()
        frames[0] = Self.runTopic(for: store)
        return frames
    }

    /// The frames of this message, topic first.
    public func encode() -> [Frame] {
        switch self {
        case let .event(store, epoch, seq, action, author):
            var header = ByteWriter(author.isUnknown ? .event : .eventBy)
            header.write(epoch.rawValue)
            header.write(seq)
            let frames = [Self.topic(for: store), header.bytes, action]
            return author.isUnknown ? frames : frames + [Array(author.name.utf8)]
        case let .events(store, epoch, firstSeq, actions, authors):
            let authored = authors.contains { !$0.isUnknown }
            var header = ByteWriter(authored ? .eventsBy : .events)
            header.write(epoch.rawValue)
            header.write(firstSeq)
            let frames = [Self.runTopic(for: store), header.bytes] + actions
            return authored ? frames + authors.map { Array($0.name.utf8) } : frames
        case let .heartbeat(store, epoch, lastSeq):
            var header = ByteWriter(.heartbeat)
            header.write(epoch.rawValue)
            header.write(lastSeq)
            return [Self.topic(for: store), header.bytes]
        case let .digest(store, epoch, seq, digest):
            var header = ByteWriter(.digest)
            header.write(epoch.rawValue)
            header.write(seq)
            header.write(bytes: digest.bytes)
            return [Self.topic(for: store), header.bytes]
        case let .checkpoint(store, epoch, seq):
            var header = ByteWriter(.checkpoint)
            header.write(epoch.rawValue)
            header.write(seq)
            return [Self.topic(for: store), header.bytes]
        case let .trace(store, epoch, firstSeq, lastSeq, context):
            var header = ByteWriter(.trace)
            header.write(epoch.rawValue)
            header.write(firstSeq)
            header.write(lastSeq)
            return [Self.traceTopic(for: store), header.bytes, TraceContext.encode(context)]
        }
    }

    /// Reads one published message, refusing anything docs/protocol.md does not allow, or an action over
    /// `limits`.
    public static func decode(_ frames: [Frame], limits: Limits = .default) throws(ProtocolError) -> Event {
        guard frames.count >= 2 else {
            throw ProtocolError(
                code: .malformed,
                "event message has \(Wire.frames(frames.count)); expected at least 2 (topic, header)"
            )
        }
        // The header first: a message of another version must fail as such, whatever its topic looks like.
        let type = try Wire.messageType(of: frames[1], frameIndex: 1, family: .event)
        var header = try Wire.headerReader(frames[1], type: type, frameIndex: 1)
        let (store, stream) = try topicStore(frames[0])
        let inRuns = stream == 1
        guard (type == .trace) == (stream == 2) else {
            throw ProtocolError(
                code: .malformed,
                "\(type.name) on a topic ending with \(Wire.hex(stream)) (frame 0); expected "
                    + (type == .trace ? "0x02, the trace topic" : "0x00 or 0x01")
            )
        }
        let epoch = Epoch(rawValue: try header.read(UInt64.self, field: "epoch"))
        let seq = try header.read(
            UInt64.self,
            field: type == .heartbeat ? "last seq" : type == .events || type == .trace ? "first seq" : "seq"
        )
        let isRun = type == .events || type == .eventsBy
        if type == .event || type == .eventBy || isRun, inRuns != isRun {
            throw ProtocolError(
                code: .malformed,
                "\(type.name) on the topic of the \(inRuns ? "stream in runs" : "one-by-one stream") "
                    + "(frame 0 ends with \(Wire.hex(frames[0].last ?? 0))); "
                    + "expected \(isRun ? "0x01" : "0x00")"
            )
        }
        switch type {
        case .events:
            guard (3...Self.maximumRun + 2).contains(frames.count) else {
                throw ProtocolError(
                    code: frames.count > Self.maximumRun + 2 ? .tooLarge : .malformed,
                    "EVENTS has \(Wire.frames(frames.count)); expected 3 to \(Self.maximumRun + 2) (topic, header, "
                        + "1 to \(Self.maximumRun) actions)"
                )
            }
            let actions = try Wire.actionRun(frames, from: 2, firstSeq: seq, type: type, limits: limits)
            return .events(store: store, epoch: epoch, firstSeq: seq, actions: actions)
        case .eventsBy:
            guard (4...2 * Self.maximumRun + 2).contains(frames.count), frames.count % 2 == 0 else {
                throw ProtocolError(
                    code: frames.count > 2 * Self.maximumRun + 2 ? .tooLarge : .malformed,
                    "EVENTS_BY has \(Wire.frames(frames.count)); expected an even count of 4 to "
                        + "\(2 * Self.maximumRun + 2) (topic, header, 1 to \(Self.maximumRun) actions, an author each)"
                )
            }
            let count = (frames.count - 2) / 2
            let actions = try Wire.actionRun(
                Array(frames[..<(2 + count)]),
                from: 2,
                firstSeq: seq,
                type: type,
                limits: limits
            )
            let authors = try Wire.authors(frames, from: 2 + count, count: count, type: type)
            return .events(store: store, epoch: epoch, firstSeq: seq, actions: actions, authors: authors)
        case .event, .eventBy:
            let authored = type == .eventBy
            try Wire.requireFrames(
                frames,
                exactly: authored ? 4 : 3,
                type: type,
                layout: authored ? "topic, header, action, author" : "topic, header, action"
            )
            try Wire.positiveSeq(seq, field: "seq", type: type)
            let action = try Wire.action(frames[2], field: "action (frame 2)", limits: limits)
            let author = authored ? try Wire.author(frames[3], field: "author (frame 3)") : .unknown
            return .event(store: store, epoch: epoch, seq: seq, action: action, author: author)
        case .heartbeat:
            try Wire.requireFrames(frames, exactly: 2, type: type, layout: "topic, header")
            return .heartbeat(store: store, epoch: epoch, lastSeq: seq)
        case .digest:
            let digestBytes = try header.readBytes(32, field: "digest")
            guard let digest = StateDigest(bytes: digestBytes) else {
                throw ProtocolError(code: .malformed, "digest is \(digestBytes.count) bytes; expected 32")
            }
            try Wire.requireFrames(frames, exactly: 2, type: type, layout: "topic, header")
            return .digest(store: store, epoch: epoch, seq: seq, digest)
        case .checkpoint:
            try Wire.requireFrames(frames, exactly: 2, type: type, layout: "topic, header")
            try Wire.positiveSeq(seq, field: "seq", type: type)
            return .checkpoint(store: store, epoch: epoch, seq: seq)
        case .trace:
            let lastSeq = try header.read(UInt64.self, field: "last seq")
            try Wire.requireFrames(frames, exactly: 3, type: type, layout: "topic, header, trace context")
            try Wire.positiveSeq(seq, field: "first seq", type: type)
            guard seq <= lastSeq else {
                throw ProtocolError(
                    code: .malformed,
                    "TRACE names seqs \(seq) to \(lastSeq); expected first seq <= last seq"
                )
            }
            let context = try TraceContext.decode(frames[2][...], field: "trace context (frame 2) of TRACE")
            return .trace(store: store, epoch: epoch, firstSeq: seq, lastSeq: lastSeq, context)
        default:
            // `messageType` returned an event type; the others cannot reach here.
            throw ProtocolError(code: .unknownMessageType, "\(type.fullName) is not an event")
        }
    }

    /// The store a topic frame names — a valid name followed by exactly one 0x00 (one by one), 0x01 (in runs) or
    /// 0x02 (traces) — and that last byte.
    private static func topicStore(_ topic: Frame) throws(ProtocolError) -> (StoreName, stream: UInt8) {
        guard let last = topic.last, last <= 2 else {
            let last = topic.last.map { "ends with \(Wire.hex($0))" } ?? "is empty"
            throw ProtocolError(
                code: .malformed,
                "topic (frame 0) \(last); expected the store name followed by one 0x00, 0x01 or 0x02 byte"
            )
        }
        return (try Wire.storeName(Array(topic.dropLast()), field: "store name in topic (frame 0)"), last)
    }
}
