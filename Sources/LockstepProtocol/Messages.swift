import Lockstep

/// The constants of the wire format that every message shares (docs/protocol.md).
public enum WireFormat {
    /// Bytes 0 and 1 of every header frame: "LS".
    public static let magic: [UInt8] = [0x4C, 0x53]
    /// The protocol version this peer speaks and writes into byte 2 of every header frame.
    public static let version: UInt8 = 1
    /// The longest reason, in UTF-8 bytes, that a REJECTED or ERROR reply may carry.
    public static let maximumReasonBytes = 4096
    /// The longest rejection code, in bytes.
    public static let maximumRejectionCodeBytes = 64
}

/// How much a decoder accepts before it refuses a message as too large.
///
/// The daemon decodes every request with its configured limits; a client may pass larger ones to read
/// replies and events from a daemon configured with larger limits.
public struct Limits: Hashable, Sendable {
    /// The most actions one DISPATCH may carry.
    public var maximumBatch: Int
    /// The most bytes one action's JSON may take, in a request, a RANGE reply or an EVENT.
    public var maximumActionBytes: Int

    /// Limits with the given values; the defaults are those of ``default``.
    public init(maximumBatch: Int = 1000, maximumActionBytes: Int = 1 << 20) {
        self.maximumBatch = maximumBatch
        self.maximumActionBytes = maximumActionBytes
    }

    /// 1000 actions per batch, 1 MiB per action.
    public static let `default` = Limits()
}

/// Byte 3 of a header frame.
enum MessageType: UInt8, Sendable {
    case dispatch = 0x01
    case snapshotRequest = 0x02
    case rangeRequest = 0x03
    case statusRequest = 0x04
    case effectsRequest = 0x05
    case report = 0x06

    case accepted = 0x81
    case rejected = 0x82
    case snapshotReply = 0x83
    case rangeReply = 0x84
    case compacted = 0x85
    case statusReply = 0x86
    case effectsReply = 0x87
    case rangeReplyBy = 0x88
    case error = 0x8F

    case event = 0x41
    case heartbeat = 0x42
    case digest = 0x43
    case events = 0x44
    case eventBy = 0x45
    case eventsBy = 0x46
    case checkpoint = 0x47
    case trace = 0x48

    /// Which decoder reads a type: requests and replies share the command socket but never a direction.
    enum Family: String, Sendable {
        case request
        case reply
        case event

        /// "a request", "a reply", "an event".
        var withArticle: String { self == .event ? "an event" : "a \(rawValue)" }

        /// The types a decoder of this family accepts, for error reasons.
        var expected: String {
            switch self {
            case .request: "0x01 DISPATCH, 0x02 SNAPSHOT, 0x03 RANGE, 0x04 STATUS, 0x05 EFFECTS or 0x06 REPORT"
            case .reply:
                "0x81 ACCEPTED, 0x82 REJECTED, 0x83 SNAPSHOT, 0x84 RANGE, 0x85 COMPACTED, 0x86 STATUS, 0x87 EFFECTS, "
                    + "0x88 RANGE_BY or 0x8f ERROR"
            case .event:
                "0x41 EVENT, 0x42 HEARTBEAT, 0x43 DIGEST, 0x44 EVENTS, 0x45 EVENT_BY, 0x46 EVENTS_BY, 0x47 CHECKPOINT or "
                    + "0x48 TRACE"
            }
        }
    }

    var family: Family {
        switch self {
        case .dispatch, .snapshotRequest, .rangeRequest, .statusRequest, .effectsRequest, .report: .request
        case .accepted, .rejected, .snapshotReply, .rangeReply, .compacted, .statusReply, .effectsReply, .rangeReplyBy,
            .error:
            .reply
        case .event, .heartbeat, .digest, .events, .eventBy, .eventsBy, .checkpoint, .trace: .event
        }
    }

    /// The name docs/protocol.md uses.
    var name: String {
        switch self {
        case .dispatch: "DISPATCH"
        case .snapshotRequest, .snapshotReply: "SNAPSHOT"
        case .rangeRequest, .rangeReply: "RANGE"
        case .statusRequest, .statusReply: "STATUS"
        case .effectsRequest, .effectsReply: "EFFECTS"
        case .report: "REPORT"
        case .accepted: "ACCEPTED"
        case .rejected: "REJECTED"
        case .compacted: "COMPACTED"
        case .error: "ERROR"
        case .event: "EVENT"
        case .heartbeat: "HEARTBEAT"
        case .digest: "DIGEST"
        case .events: "EVENTS"
        case .eventBy: "EVENT_BY"
        case .eventsBy: "EVENTS_BY"
        case .checkpoint: "CHECKPOINT"
        case .trace: "TRACE"
        case .rangeReplyBy: "RANGE_BY"
        }
    }

    /// The name with its direction, since SNAPSHOT, RANGE, STATUS and EFFECTS each name a request and a reply.
    var fullName: String { family == .event ? name : "\(name) \(family.rawValue)" }

    /// The exact length of the header frame.
    var headerSize: Int {
        switch self {
        case .snapshotRequest, .statusRequest, .statusReply, .effectsRequest, .effectsReply: 12
        case .error: 14
        case .rejected: 16
        case .event, .heartbeat, .events, .eventBy, .eventsBy, .checkpoint: 20
        case .rangeRequest, .rangeReply, .compacted, .rangeReplyBy, .trace: 28
        case .dispatch, .accepted: 32
        case .digest: 52
        case .report: 72
        case .snapshotReply: 60
        }
    }
}

/// The checks every decoder shares; each reason names the field, the value found and the value expected.
enum Wire {
    /// Reads the common header of `frame` and returns its type, which must belong to `family`.
    static func messageType(
        of frame: Frame,
        frameIndex: Int,
        family: MessageType.Family
    ) throws(ProtocolError) -> MessageType {
        guard frame.count >= 4 else {
            throw ProtocolError(
                code: .malformed,
                "header (frame \(frameIndex)) is \(frame.count) bytes; expected at least 4 (magic, version, type)"
            )
        }
        guard frame[0] == WireFormat.magic[0], frame[1] == WireFormat.magic[1] else {
            throw ProtocolError(
                code: .malformed,
                "magic (frame \(frameIndex), bytes 0-1) is \(hex(frame[0])) \(hex(frame[1])); "
                    + "expected 0x4c 0x53 (\"LS\")"
            )
        }
        guard frame[2] == WireFormat.version else {
            throw ProtocolError(
                code: .unsupportedVersion,
                "protocol version \(frame[2]) is not spoken here; this peer speaks version \(WireFormat.version)"
            )
        }
        guard let type = MessageType(rawValue: frame[3]) else {
            throw ProtocolError(
                code: .unknownMessageType,
                "message type \(hex(frame[3])) is unknown; expected \(family.withArticle): \(family.expected)"
            )
        }
        guard type.family == family else {
            throw ProtocolError(
                code: .unknownMessageType,
                "message type \(hex(frame[3])) (\(type.fullName)) is not \(family.withArticle); "
                    + "expected \(family.expected)"
            )
        }
        return type
    }

    /// A reader positioned after the common header, once the frame has exactly the type's length.
    static func headerReader(_ frame: Frame, type: MessageType, frameIndex: Int) throws(ProtocolError) -> ByteReader {
        guard frame.count == type.headerSize else {
            throw ProtocolError(
                code: .malformed,
                "header (frame \(frameIndex)) of \(type.fullName) is \(frame.count) bytes; "
                    + "expected exactly \(type.headerSize)"
            )
        }
        return ByteReader(frame, from: 4, frameIndex: frameIndex, type: type)
    }

    /// Refuses a message whose frame count differs from `count`; `layout` lists the frames for the reason.
    static func requireFrames(
        _ frames: [Frame],
        exactly count: Int,
        type: MessageType,
        layout: String
    ) throws(ProtocolError) {
        guard frames.count == count else {
            throw ProtocolError(
                code: .malformed,
                "\(type.fullName) has \(Wire.frames(frames.count)); expected exactly \(count) (\(layout))"
            )
        }
    }

    /// The text in `frame`: 1 to `maximum` bytes of UTF-8, or `malformed` naming `field`, its size, and (`holding`)
    /// what it should hold.
    static func text(_ frame: Frame, field: String, maximum: Int, holding: String = "") throws(ProtocolError) -> String
    {
        guard (1...maximum).contains(frame.count), let text = String(validating: frame, as: UTF8.self) else {
            throw ProtocolError(
                code: .malformed,
                "\(field) is \(frame.count) bytes; expected 1 to \(maximum) bytes of UTF-8\(holding)"
            )
        }
        return text
    }

    /// "1 frame", "2 frames".
    static func frames(_ count: Int) -> String { count == 1 ? "1 frame" : "\(count) frames" }

    /// The store name in `frame`: 1 to 64 bytes of ASCII letters, digits, `-`, `_` and `.`.
    static func storeName(_ frame: Frame, field: String) throws(ProtocolError) -> StoreName {
        guard (1...StoreName.maximumLength).contains(frame.count) else {
            throw ProtocolError(
                code: .malformed,
                "\(field) is \(frame.count) bytes; expected 1 to \(StoreName.maximumLength) bytes"
            )
        }
        if let index = frame.firstIndex(where: { !StoreName.isAllowed($0) }) {
            throw ProtocolError(
                code: .malformed,
                "\(field) has byte \(hex(frame[index])) at offset \(index); "
                    + "expected only ASCII letters, digits, '-', '_' and '.'"
            )
        }
        return try StoreName(String(decoding: frame, as: UTF8.self))
    }

    /// An action's JSON: not empty, and no larger than the limit.
    static func action(_ frame: Frame, field: String, limits: Limits) throws(ProtocolError) -> Frame {
        guard !frame.isEmpty else {
            throw ProtocolError(
                code: .malformed,
                "\(field) is empty; expected 1 to \(limits.maximumActionBytes) bytes of action JSON"
            )
        }
        guard frame.count <= limits.maximumActionBytes else {
            throw ProtocolError(
                code: .tooLarge,
                "\(field) is \(frame.count) bytes; over the limit maximumActionBytes = \(limits.maximumActionBytes)"
            )
        }
        return frame
    }

    /// A sequence number that must be at least 1, because seq 0 names the state before any action.
    static func positiveSeq(_ value: SequenceNumber, field: String, type: MessageType) throws(ProtocolError) {
        guard value >= 1 else {
            throw ProtocolError(code: .malformed, "\(field) of \(type.fullName) is 0; expected 1 or more")
        }
    }

    /// Refuses a run of `count` seqs from `first` that would pass 2^64 - 1.
    static func requireSeqRun(
        first: SequenceNumber,
        count: UInt64,
        field: String,
        type: MessageType
    ) throws(ProtocolError) {
        guard count == 0 || first <= UInt64.max - (count - 1) else {
            throw ProtocolError(
                code: .malformed,
                "\(field) \(first) of \(type.fullName) with \(count) actions passes the largest seq "
                    + "\(UInt64.max); expected at most \(UInt64.max - (count - 1))"
            )
        }
    }

    /// The actions in `frames[start...]`, the k-th of which has seq `firstSeq + k` (RANGE reply, EVENTS): the
    /// first seq is at least 1 and the run does not pass the largest seq; each action is checked.
    static func actionRun(
        _ frames: [Frame],
        from start: Int,
        firstSeq: SequenceNumber,
        type: MessageType,
        limits: Limits
    ) throws(ProtocolError) -> [Frame] {
        try positiveSeq(firstSeq, field: "first seq", type: type)
        try requireSeqRun(first: firstSeq, count: UInt64(frames.count - start), field: "first seq", type: type)
        var actions: [Frame] = []
        actions.reserveCapacity(frames.count - start)
        for index in start..<frames.count {
            actions.append(try action(frames[index], field: "action \(index - start) (frame \(index))", limits: limits))
        }
        return actions
    }

    /// The authors of a run of `count` actions, `frames[start...]`: exactly `count` of them.
    static func authors(
        _ frames: [Frame],
        from start: Int,
        count: Int,
        type: MessageType
    ) throws(ProtocolError) -> [Author] {
        guard frames.count - start == count else {
            throw ProtocolError(
                code: .malformed,
                "\(type.fullName) has \(frames.count - start) author frames for \(count) actions; expected one each"
            )
        }
        var authors: [Author] = []
        authors.reserveCapacity(count)
        for index in start..<frames.count {
            authors.append(try author(frames[index], field: "author \(index - start) (frame \(index))"))
        }
        return authors
    }

    /// An author: empty (nobody identified), or 1 to 64 bytes of ASCII letters, digits, `-` and `_` (a name of the
    /// daemon's policy, or `lockstepd`).
    static func author(_ frame: Frame, field: String) throws(ProtocolError) -> Author {
        guard frame.count <= Author.maximumLength else {
            throw ProtocolError(
                code: .malformed,
                "\(field) is \(frame.count) bytes; expected at most \(Author.maximumLength)"
            )
        }
        for byte in frame where !Author.isAllowed(byte) {
            throw ProtocolError(
                code: .malformed,
                "\(field) contains byte \(hex(byte)); an author has only ASCII letters, digits, '-' and '_'"
            )
        }
        return Author(String(decoding: frame, as: UTF8.self))
    }

    /// A reason: valid UTF-8 of at most ``WireFormat/maximumReasonBytes`` bytes.
    static func reason(_ frame: Frame, field: String) throws(ProtocolError) -> String {
        guard frame.count <= WireFormat.maximumReasonBytes else {
            throw ProtocolError(
                code: .tooLarge,
                "\(field) is \(frame.count) bytes; over the limit of \(WireFormat.maximumReasonBytes) bytes"
            )
        }
        guard let text = String(validating: frame, as: UTF8.self) else {
            throw ProtocolError(code: .malformed, "\(field) is not valid UTF-8; expected UTF-8 text")
        }
        return text
    }

    /// `text` as UTF-8, cut at a character boundary so it fits ``WireFormat/maximumReasonBytes``.
    ///
    /// Encoders never fail, and a reason too long for the wire is still worth its first 4 KiB.
    static func encodeReason(_ text: String) -> Frame {
        let bytes = Array(text.utf8)
        guard bytes.count > WireFormat.maximumReasonBytes else { return bytes }
        var end = WireFormat.maximumReasonBytes
        // Step back over UTF-8 continuation bytes (0b10xxxxxx) so the cut lands before a whole scalar.
        while end > 0, bytes[end] & 0xC0 == 0x80 { end -= 1 }
        return Array(bytes[..<end])
    }

    /// A rejection code: 1 to 64 ASCII letters, digits and `_`.
    static func rejectionCode(_ frame: Frame, field: String) throws(ProtocolError) -> String {
        guard (1...WireFormat.maximumRejectionCodeBytes).contains(frame.count) else {
            throw ProtocolError(
                code: .malformed,
                "\(field) is \(frame.count) bytes; expected 1 to \(WireFormat.maximumRejectionCodeBytes) bytes"
            )
        }
        if let index = frame.firstIndex(where: { !isRejectionCodeByte($0) }) {
            throw ProtocolError(
                code: .malformed,
                "\(field) has byte \(hex(frame[index])) at offset \(index); "
                    + "expected only ASCII letters, digits and '_'"
            )
        }
        return String(decoding: frame, as: UTF8.self)
    }

    /// `code` in the form the wire allows, so a domain's careless code still reaches the client.
    ///
    /// Every other byte becomes `_`, the result is cut at 64 bytes, and an empty code becomes
    /// `invalid_action` (``Rejection``'s default).
    static func encodeRejectionCode(_ code: String) -> Frame {
        let bytes = code.utf8.prefix(WireFormat.maximumRejectionCodeBytes).map { byte in
            isRejectionCodeByte(byte) ? byte : UInt8(ascii: "_")
        }
        return bytes.isEmpty ? Array("invalid_action".utf8) : bytes
    }

    static func isRejectionCodeByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "_"):
            true
        default:
            false
        }
    }

    /// `0x4c`: a byte as docs/protocol.md writes it.
    static func hex(_ byte: UInt8) -> String {
        let digits = Array("0123456789abcdef")
        return "0x\(digits[Int(byte >> 4)])\(digits[Int(byte & 0x0F)])"
    }
}
