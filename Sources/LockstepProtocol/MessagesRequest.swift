import Instrumentation
import Lockstep

/// A request a client sends on the command socket, as the body frames after any envelope.
public enum Request: Hashable, Sendable {
    /// Apply a batch of actions to a store, all or none.
    case dispatch(DispatchRequest)
    /// Send the store's state and the seq it stands at; with `part`, a part of a snapshot's state.
    case snapshot(requestID: UInt64, store: StoreName, part: SnapshotPartRequest? = nil)
    /// Send the events `from...to` (inclusive) out of the journal.
    case range(requestID: UInt64, store: StoreName, from: SequenceNumber, to: SequenceNumber)
    /// Send the daemon's status.
    case status(requestID: UInt64)
    /// List the effects and timers, or send a dead letter back to run, or drop an effect (docs/effects.md).
    case effects(requestID: UInt64, EffectsCommand)
    /// A replica's word on how far it has applied its store; the daemon sends no reply.
    case report(requestID: UInt64, ReplicaProgress)

    /// The id the reply echoes, so a client with several requests in flight can match replies.
    public var requestID: UInt64 {
        switch self {
        case let .dispatch(request): request.requestID
        case let .snapshot(requestID, _, _), let .range(requestID, _, _, _), let .status(requestID),
            let .effects(requestID, _), let .report(requestID, _):
            requestID
        }
    }

    /// The body frames of this request.
    public func encode() -> [Frame] {
        switch self {
        case let .dispatch(request):
            var header = ByteWriter(.dispatch)
            header.write(request.requestID)
            header.write(request.domainVersion)
            header.write(bytes: request.clientID.bytes)
            if !request.trace.isEmpty { header.write(bytes: TraceContext.encode(request.trace)) }
            return [header.bytes, Array(request.store.rawValue.utf8)] + request.actions
        case let .snapshot(requestID, store, part):
            var header = ByteWriter(.snapshotRequest)
            header.write(requestID)
            guard let part else { return [header.bytes, Array(store.rawValue.utf8)] }
            var asked = ByteWriter()
            asked.write(part.seq)
            asked.write(part.offset)
            asked.write(part.maximumBytes)
            return [header.bytes, Array(store.rawValue.utf8), asked.bytes]
        case let .range(requestID, store, from, to):
            var header = ByteWriter(.rangeRequest)
            header.write(requestID)
            header.write(from)
            header.write(to)
            return [header.bytes, Array(store.rawValue.utf8)]
        case let .status(requestID):
            var header = ByteWriter(.statusRequest)
            header.write(requestID)
            return [header.bytes]
        case let .effects(requestID, command):
            var header = ByteWriter(.effectsRequest)
            header.write(requestID)
            switch command {
            case .list: return [header.bytes, Array("list".utf8)]
            case let .retry(id): return [header.bytes, Array("retry".utf8), Array(id.utf8)]
            case let .drop(id): return [header.bytes, Array("drop".utf8), Array(id.utf8)]
            }
        case let .report(requestID, report):
            var header = ByteWriter(.report)
            header.write(requestID)
            header.write(bytes: report.clientID.bytes)
            header.write(report.epoch?.rawValue ?? 0)
            header.write(report.appliedSeq)
            header.write(
                UInt32(
                    clamping: report.interval.components.seconds * 1_000 + report.interval.components.attoseconds
                        / 1_000_000_000_000_000
                )
            )
            header.write(report.repairs)
            header.write(report.resyncs)
            header.write(report.divergences)
            return [header.bytes, Array(report.store.rawValue.utf8), Array(report.name.utf8)]
        }
    }

    /// Reads a request body, refusing anything docs/protocol.md does not allow, or anything over `limits`.
    ///
    /// `droppedFrames` counts frames the receiver discarded unread beyond the ones in `body` (it keeps at most
    /// `maximumBatch + 2`): such a request is `too_large`, but only after its header frame passed the checks that
    /// come first in docs/protocol.md (magic, version, type), so a wrong magic is `malformed` at any size.
    public static func decode(
        _ body: [Frame],
        droppedFrames: Int = 0,
        limits: Limits = .default
    ) throws(ProtocolError) -> Request {
        guard let first = body.first else {
            throw ProtocolError(code: .malformed, "request has 0 frames; expected at least 1 (header)")
        }
        // docs/protocol.md's order: magic, version, type; the request id; the frame count; the rest.
        let type = try Wire.messageType(of: first, frameIndex: 0, family: .request)
        // Every request's header is 12 bytes or more: a shorter one is refused as the wrong size it is.
        if first.count < 12 { _ = try Wire.headerReader(first, type: type, frameIndex: 0) }
        var idReader = ByteReader(first, from: 4, frameIndex: 0, type: type)
        let requestID = try idReader.read(UInt64.self, field: "request id")
        guard droppedFrames == 0 else {
            throw ProtocolError(
                code: .tooLarge,
                "\(type.fullName) has \(body.count + droppedFrames) frames; a request has at most "
                    + "\(limits.maximumBatch + 2) (header, store name, \(limits.maximumBatch) actions)"
            )
        }
        // A DISPATCH's header may go on past its 32 bytes with a trace context.
        let traced = type == .dispatch && first.count > type.headerSize
        var header = try Wire.headerReader(
            traced ? Array(first.prefix(type.headerSize)) : first,
            type: type,
            frameIndex: 0
        )
        _ = try header.read(UInt64.self, field: "request id")
        switch type {
        case .dispatch:
            let domainVersion = try header.read(UInt32.self, field: "domain version")
            let clientBytes = try header.readBytes(ClientID.byteCount, field: "client id")
            guard let clientID = ClientID(bytes: clientBytes) else {
                throw ProtocolError(code: .malformed, "client id is \(clientBytes.count) bytes; expected 16")
            }
            guard body.count >= 3 else {
                throw ProtocolError(
                    code: .malformed,
                    "DISPATCH request has \(Wire.frames(body.count)); expected 3 to \(limits.maximumBatch + 2) "
                        + "(header, store name, 1 to \(limits.maximumBatch) actions)"
                )
            }
            let store = try Wire.storeName(body[1], field: "store name (frame 1)")
            let actionCount = body.count - 2
            guard actionCount <= limits.maximumBatch else {
                throw ProtocolError(
                    code: .tooLarge,
                    "DISPATCH request holds \(actionCount) actions; "
                        + "over the limit maximumBatch = \(limits.maximumBatch)"
                )
            }
            var actions: [Frame] = []
            actions.reserveCapacity(actionCount)
            for index in 2..<body.count {
                actions.append(
                    try Wire.action(body[index], field: "action \(index - 2) (frame \(index))", limits: limits)
                )
            }
            return .dispatch(
                DispatchRequest(
                    requestID: requestID,
                    domainVersion: domainVersion,
                    clientID: clientID,
                    store: store,
                    actions: actions,
                    trace: traced ? try TraceContext.decode(first[type.headerSize...]) : [:]
                )
            )
        case .snapshotRequest:
            if body.count != 3 {
                try Wire.requireFrames(body, exactly: 2, type: type, layout: "header, store name[, part]")
            }
            let store = try Wire.storeName(body[1], field: "store name (frame 1)")
            guard body.count == 3 else { return .snapshot(requestID: requestID, store: store) }
            guard body[2].count == SnapshotPartRequest.byteCount else {
                throw ProtocolError(
                    code: .malformed,
                    "part (frame 2) of SNAPSHOT request is \(body[2].count) bytes; expected exactly "
                        + "\(SnapshotPartRequest.byteCount) (seq, offset, maximum bytes)"
                )
            }
            var asked = ByteReader(body[2], from: 0, frameIndex: 2, type: type)
            let part = SnapshotPartRequest(
                seq: try asked.read(UInt64.self, field: "seq"),
                offset: try asked.read(UInt64.self, field: "offset"),
                maximumBytes: try asked.read(UInt32.self, field: "maximum bytes")
            )
            guard part.maximumBytes > 0 else {
                throw ProtocolError(
                    code: .malformed,
                    "maximum bytes of SNAPSHOT request's part is 0; expected 1 or more"
                )
            }
            guard part.seq > 0 || part.offset == 0 else {
                throw ProtocolError(
                    code: .malformed,
                    "SNAPSHOT request asks for offset \(part.offset) of seq 0; a part past the first names the seq "
                        + "of the snapshot the first came from"
                )
            }
            return .snapshot(requestID: requestID, store: store, part: part)
        case .rangeRequest:
            let from = try header.read(UInt64.self, field: "from seq")
            let to = try header.read(UInt64.self, field: "to seq")
            try Wire.requireFrames(body, exactly: 2, type: type, layout: "header, store name")
            let store = try Wire.storeName(body[1], field: "store name (frame 1)")
            // A range names seqs that exist, and seq 0 never does: it is the state before the first action.
            guard from >= 1 else {
                throw ProtocolError(code: .invalidRange, "from seq of RANGE request is 0; expected 1 or more")
            }
            guard from <= to else {
                throw ProtocolError(
                    code: .invalidRange,
                    "RANGE request asks from seq \(from) to seq \(to); expected from <= to"
                )
            }
            return .range(requestID: requestID, store: store, from: from, to: to)
        case .statusRequest:
            try Wire.requireFrames(body, exactly: 1, type: type, layout: "header")
            return .status(requestID: requestID)
        case .effectsRequest:
            return .effects(requestID: requestID, try EffectsCommand(body))
        case .report:
            let clientBytes = try header.readBytes(ClientID.byteCount, field: "client id")
            let epoch = try header.read(UInt64.self, field: "epoch")
            let applied = try header.read(UInt64.self, field: "applied seq")
            let interval = try header.read(UInt32.self, field: "report interval")
            let repairs = try header.read(UInt64.self, field: "repairs")
            let resyncs = try header.read(UInt64.self, field: "resyncs")
            let divergences = try header.read(UInt64.self, field: "divergences")
            try Wire.requireFrames(body, exactly: 3, type: type, layout: "header, store name, replica name")
            let store = try Wire.storeName(body[1], field: "store name (frame 1)")
            let name = try Wire.text(
                body[2],
                field: "replica name (frame 2) of REPORT request",
                maximum: ReplicaProgress.maximumNameLength
            )
            guard interval > 0 else {
                throw ProtocolError(code: .malformed, "report interval of REPORT request is 0 ms; expected 1 or more")
            }
            return .report(
                requestID: requestID,
                ReplicaProgress(
                    clientID: ClientID(bytes: clientBytes)!,
                    store: store,
                    name: name,
                    epoch: epoch == 0 ? nil : Epoch(rawValue: epoch),
                    appliedSeq: applied,
                    interval: .milliseconds(interval),
                    repairs: repairs,
                    resyncs: resyncs,
                    divergences: divergences
                )
            )
        default:
            // `messageType` returned a request type; the others cannot reach here.
            throw ProtocolError(code: .unknownMessageType, "\(type.fullName) is not a request")
        }
    }

    /// The request id in `body`, or 0 when it cannot be read: the id to put on the ERROR that refuses it.
    ///
    /// Reads bytes 4-11 of frame 0 whenever the magic is right and the frame is long enough, whatever the
    /// version and type, because every version keeps the request id there.
    public static func requestID(in body: [Frame]) -> UInt64 {
        guard let first = body.first, first.count >= 12,
            first[0] == WireFormat.magic[0], first[1] == WireFormat.magic[1]
        else { return 0 }
        var reader = ByteReader(first, from: 4, frameIndex: 0, type: nil)
        return (try? reader.read(UInt64.self, field: "request id")) ?? 0
    }
}

/// What an EFFECTS request asks (docs/protocol.md, "EFFECTS").
public enum EffectsCommand: Hashable, Sendable {
    /// Every effect waiting, running or given up, and every timer set.
    case list
    /// Send dead letter `id` (`store/seq/index`) back to run, its tries counted afresh.
    case retry(String)
    /// Drop effect `id`, waiting or given up, without running it.
    case drop(String)

    /// The longest effect id, in bytes.
    public static let maximumIDLength = 200

    init(_ body: [Frame]) throws(ProtocolError) {
        guard body.count >= 2 else {
            throw ProtocolError(
                code: .malformed,
                "EFFECTS request has \(Wire.frames(body.count)); expected 2 (header, list) or 3 (header, retry or drop, "
                    + "effect id)"
            )
        }
        let verb = String(decoding: body[1], as: UTF8.self)
        switch verb {
        case "list":
            try Wire.requireFrames(body, exactly: 2, type: .effectsRequest, layout: "header, list")
            self = .list
        case "retry", "drop":
            try Wire.requireFrames(body, exactly: 3, type: .effectsRequest, layout: "header, \(verb), effect id")
            let id = try Wire.text(
                body[2],
                field: "effect id (frame 2) of EFFECTS request",
                maximum: Self.maximumIDLength,
                holding: ", store/seq/index"
            )
            self = verb == "retry" ? .retry(id) : .drop(id)
        default:
            throw ProtocolError(
                code: .malformed,
                "command (frame 1) of EFFECTS request is '\(verb.prefix(64))'; expected list, retry or drop"
            )
        }
    }
}

/// A batch of actions for one store, with the idempotency key that makes retrying it safe.
public struct DispatchRequest: Hashable, Sendable {
    /// The request number: with ``clientID`` it forms the idempotency key, and the reply echoes it.
    public var requestID: UInt64
    /// The client's `Domain.version` for the store; a daemon of another version refuses the batch.
    public var domainVersion: UInt32
    /// The client that sent the batch, the first half of the idempotency key.
    public var clientID: ClientID
    /// The store the actions are for.
    public var store: StoreName
    /// Each action's JSON as the domain's `Codable` conformance writes it; sequenced in this order.
    public var actions: [Frame]
    /// The trace context of the client's span, as its tracer injected it (W3C's `traceparent` and `tracestate` with
    /// swift-otel); empty when it traces nothing, and then nothing of it goes on the wire.
    public var trace: [String: String]

    /// A batch as it goes on the wire.
    public init(
        requestID: UInt64,
        domainVersion: UInt32,
        clientID: ClientID,
        store: StoreName,
        actions: [Frame],
        trace: [String: String] = [:]
    ) {
        self.requestID = requestID
        self.domainVersion = domainVersion
        self.clientID = clientID
        self.store = store
        self.actions = actions
        self.trace = trace
    }
}

/// What a replica tells the daemon it follows, about once per ``interval`` (REPORT, docs/protocol.md): who it is, how
/// far it has applied its store, and how often it repaired, resynced and diverged. The daemon keeps the replicas it
/// hears from, and their lag, for STATUS and its metrics.
public struct ReplicaProgress: Hashable, Sendable {
    /// The longest replica name, in bytes of UTF-8.
    public static let maximumNameLength = 200

    /// The replica's client id: two replicas of one name stay apart.
    public var clientID: ClientID
    /// The store it follows.
    public var store: StoreName
    /// Its name for people, e.g. `HOST:PID`.
    public var name: String
    /// The epoch of its state; `nil` before it has one.
    public var epoch: Epoch?
    /// The last seq it has applied to its local store.
    public var appliedSeq: SequenceNumber
    /// How often it reports: the daemon counts a report later than twice this as overdue.
    public var interval: Duration
    /// Gaps it repaired by RANGE, resyncs, and divergences found, since it started.
    public var repairs: UInt64
    public var resyncs: UInt64
    public var divergences: UInt64

    /// A report; every count since the replica started.
    public init(
        clientID: ClientID,
        store: StoreName,
        name: String,
        epoch: Epoch?,
        appliedSeq: SequenceNumber,
        interval: Duration,
        repairs: UInt64 = 0,
        resyncs: UInt64 = 0,
        divergences: UInt64 = 0
    ) {
        self.clientID = clientID
        self.store = store
        self.name = name
        self.epoch = epoch
        self.appliedSeq = appliedSeq
        self.interval = interval
        self.repairs = repairs
        self.resyncs = resyncs
        self.divergences = divergences
    }
}

/// A trace context on the wire (docs/protocol.md, "DISPATCH"): the fields a tracer injects — `traceparent` and
/// `tracestate` for W3C Trace Context — as `key=value` lines, sorted by key, joined by `\n`.
public enum TraceContext {
    /// The most bytes a trace context may take.
    public static let maximumBytes = 1_024

    /// `fields` as they go on the wire.
    public static func encode(_ fields: [String: String]) -> [UInt8] {
        Array(fields.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: "\n").utf8)
    }

    /// The fields of a trace context read off the wire, or `malformed` naming what is wrong, and where (`field`).
    public static func decode(
        _ bytes: ArraySlice<UInt8>,
        field: String = "trace context (frame 0 past byte 32) of DISPATCH request"
    ) throws(ProtocolError) -> [String: String] {
        let text = try Wire.text(Array(bytes), field: field, maximum: maximumBytes)
        var fields: [String: String] = [:]
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            guard let equals = line.firstIndex(of: "="), equals != line.startIndex else {
                throw ProtocolError(
                    code: .malformed,
                    "\(field) has the line '\(line.prefix(64))'; expected key=value"
                )
            }
            fields[String(line[..<equals])] = String(line[line.index(after: equals)...])
        }
        return fields
    }
}

/// A trace context as the fields of a dictionary: what a tracer injects into a DISPATCH, and extracts from one.
package struct TraceFields: Injector, Extractor {
    package init() {}

    package func inject(_ value: String, forKey key: String, into carrier: inout [String: String]) {
        carrier[key] = value
    }

    package func extract(key: String, from carrier: [String: String]) -> String? { carrier[key] }
}

/// A SNAPSHOT request's part (frame 2): a state sent in parts, each a reply of its own, so that neither side holds a
/// large one twice on the way (docs/protocol.md, "SNAPSHOT in parts").
public struct SnapshotPartRequest: Hashable, Sendable {
    /// The frame's size: seq, offset, maximum bytes.
    public static let byteCount = 20
    /// The seq of the snapshot the first part came from; 0 for the first, when the daemon chooses.
    public var seq: SequenceNumber
    /// Where in the state the part starts; 0 for the first.
    public var offset: UInt64
    /// The most bytes of state a reply may carry.
    public var maximumBytes: UInt32

    /// The part of the snapshot at `seq` from byte `offset`, of at most `maximumBytes`.
    public init(seq: SequenceNumber, offset: UInt64, maximumBytes: UInt32) {
        self.seq = seq
        self.offset = offset
        self.maximumBytes = maximumBytes
    }
}
