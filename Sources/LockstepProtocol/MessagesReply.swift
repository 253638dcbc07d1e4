import Lockstep

/// The daemon's answer to one ``Request``, as the body frames after any envelope.
public enum Reply: Hashable, Sendable {
    /// The whole batch was sequenced: its actions got seqs `firstSeq ..< firstSeq + count`.
    case accepted(requestID: UInt64, epoch: Epoch, firstSeq: SequenceNumber, count: UInt32)
    /// The domain's validator refused the action at `actionIndex` of the batch; nothing was sequenced.
    case rejected(requestID: UInt64, actionIndex: UInt32, Rejection)
    /// The store's state and the seq it stands at.
    case snapshot(requestID: UInt64, SnapshotReply)
    /// Events from the journal: the k-th action (from 0) has seq `firstSeq + k`. It may hold fewer than were
    /// asked for, even none; the client asks again from the next seq.
    case range(
        requestID: UInt64,
        store: StoreName,
        epoch: Epoch,
        firstSeq: SequenceNumber,
        actions: [Frame],
        authors: [Author] = []
    )
    /// The journal no longer holds seqs below `firstAvailable`: take a snapshot instead.
    case compacted(requestID: UInt64, store: StoreName, epoch: Epoch, firstAvailable: SequenceNumber)
    /// The daemon's status as a JSON object, whose fields docs/operations.md defines.
    case status(requestID: UInt64, json: Frame)
    /// The effects and timers as a JSON object, ``EffectsListing``; after a retry or drop, as it left them.
    case effects(requestID: UInt64, json: Frame)
    /// The request could not be served; its id is 0 when it could not be read.
    case error(requestID: UInt64, ProtocolError)

    /// The id of the request this answers.
    public var requestID: UInt64 {
        switch self {
        case let .accepted(requestID, _, _, _), let .rejected(requestID, _, _), let .snapshot(requestID, _),
            let .range(requestID, _, _, _, _, _), let .compacted(requestID, _, _, _), let .status(requestID, _),
            let .effects(requestID, _), let .error(requestID, _):
            requestID
        }
    }

    /// The body frames of this reply.
    ///
    /// Never fails: a rejection code with bytes the wire does not allow has them replaced by `_`, and a
    /// reason longer than 4096 bytes is cut, so every encoded reply decodes.
    public func encode() -> [Frame] {
        switch self {
        case let .accepted(requestID, epoch, firstSeq, count):
            var header = ByteWriter(.accepted)
            header.write(requestID)
            header.write(epoch.rawValue)
            header.write(firstSeq)
            header.write(count)
            return [header.bytes]
        case let .rejected(requestID, actionIndex, rejection):
            var header = ByteWriter(.rejected)
            header.write(requestID)
            header.write(actionIndex)
            return [header.bytes, Wire.encodeRejectionCode(rejection.code), Wire.encodeReason(rejection.reason)]
        case let .snapshot(requestID, snapshot):
            var header = ByteWriter(.snapshotReply)
            header.write(requestID)
            header.write(snapshot.epoch.rawValue)
            header.write(snapshot.seq)
            header.write(bytes: snapshot.digest.bytes)
            let frames = [header.bytes, Array(snapshot.store.rawValue.utf8), snapshot.state]
            guard let part = snapshot.part else { return frames }
            var placed = ByteWriter()
            placed.write(part.total)
            placed.write(part.offset)
            placed.write(part.storeSeq)
            return frames + [placed.bytes]
        case let .range(requestID, store, epoch, firstSeq, actions, authors):
            let authored = authors.contains { !$0.isUnknown }
            var header = ByteWriter(authored ? .rangeReplyBy : .rangeReply)
            header.write(requestID)
            header.write(epoch.rawValue)
            header.write(firstSeq)
            let frames = [header.bytes, Array(store.rawValue.utf8)] + actions
            return authored ? frames + authors.map { Array($0.name.utf8) } : frames
        case let .compacted(requestID, store, epoch, firstAvailable):
            var header = ByteWriter(.compacted)
            header.write(requestID)
            header.write(epoch.rawValue)
            header.write(firstAvailable)
            return [header.bytes, Array(store.rawValue.utf8)]
        case let .status(requestID, json):
            var header = ByteWriter(.statusReply)
            header.write(requestID)
            return [header.bytes, json]
        case let .effects(requestID, json):
            var header = ByteWriter(.effectsReply)
            header.write(requestID)
            return [header.bytes, json]
        case let .error(requestID, error):
            var header = ByteWriter(.error)
            header.write(requestID)
            header.write(error.code.rawValue)
            return [header.bytes, Wire.encodeReason(error.reason)]
        }
    }

    /// Reads a reply body, refusing anything docs/protocol.md does not allow, or any action over `limits`.
    public static func decode(_ body: [Frame], limits: Limits = .default) throws(ProtocolError) -> Reply {
        guard let first = body.first else {
            throw ProtocolError(code: .malformed, "reply has 0 frames; expected at least 1 (header)")
        }
        let type = try Wire.messageType(of: first, frameIndex: 0, family: .reply)
        var header = try Wire.headerReader(first, type: type, frameIndex: 0)
        let requestID = try header.read(UInt64.self, field: "request id")
        switch type {
        case .accepted:
            let epoch = Epoch(rawValue: try header.read(UInt64.self, field: "epoch"))
            let firstSeq = try header.read(UInt64.self, field: "first seq")
            let count = try header.read(UInt32.self, field: "count")
            try Wire.requireFrames(body, exactly: 1, type: type, layout: "header")
            try Wire.positiveSeq(firstSeq, field: "first seq", type: type)
            guard count >= 1 else {
                throw ProtocolError(code: .malformed, "count of ACCEPTED reply is 0; expected 1 or more")
            }
            try Wire.requireSeqRun(first: firstSeq, count: UInt64(count), field: "first seq", type: type)
            return .accepted(requestID: requestID, epoch: epoch, firstSeq: firstSeq, count: count)
        case .rejected:
            let actionIndex = try header.read(UInt32.self, field: "action index")
            try Wire.requireFrames(body, exactly: 3, type: type, layout: "header, code, reason")
            let code = try Wire.rejectionCode(body[1], field: "rejection code (frame 1)")
            let reason = try Wire.reason(body[2], field: "rejection reason (frame 2)")
            return .rejected(requestID: requestID, actionIndex: actionIndex, Rejection(code: code, reason))
        case .snapshotReply:
            let epoch = Epoch(rawValue: try header.read(UInt64.self, field: "epoch"))
            let seq = try header.read(UInt64.self, field: "seq")
            let digestBytes = try header.readBytes(32, field: "digest")
            guard let digest = StateDigest(bytes: digestBytes) else {
                throw ProtocolError(code: .malformed, "digest is \(digestBytes.count) bytes; expected 32")
            }
            if body.count != 4 {
                try Wire.requireFrames(body, exactly: 3, type: type, layout: "header, store name, state[, part]")
            }
            let store = try Wire.storeName(body[1], field: "store name (frame 1)")
            guard !body[2].isEmpty else {
                throw ProtocolError(code: .malformed, "state (frame 2) of SNAPSHOT reply is empty; expected JSON")
            }
            var snapshot = SnapshotReply(store: store, epoch: epoch, seq: seq, digest: digest, state: body[2])
            if body.count == 4 {
                guard body[3].count == SnapshotReply.Part.byteCount else {
                    throw ProtocolError(
                        code: .malformed,
                        "part (frame 3) of SNAPSHOT reply is \(body[3].count) bytes; expected exactly "
                            + "\(SnapshotReply.Part.byteCount) (total, offset, store's seq)"
                    )
                }
                var placed = ByteReader(body[3], from: 0, frameIndex: 3, type: type)
                let part = SnapshotReply.Part(
                    total: try placed.read(UInt64.self, field: "total"),
                    offset: try placed.read(UInt64.self, field: "offset"),
                    storeSeq: try placed.read(UInt64.self, field: "store's seq")
                )
                guard part.offset + UInt64(body[2].count) <= part.total else {
                    throw ProtocolError(
                        code: .malformed,
                        "SNAPSHOT reply's part of \(body[2].count) bytes at offset \(part.offset) passes the state's "
                            + "total of \(part.total)"
                    )
                }
                snapshot.part = part
            }
            return .snapshot(requestID: requestID, snapshot)
        case .rangeReply:
            let epoch = Epoch(rawValue: try header.read(UInt64.self, field: "epoch"))
            let firstSeq = try header.read(UInt64.self, field: "first seq")
            guard body.count >= 2 else {
                throw ProtocolError(
                    code: .malformed,
                    "RANGE reply has \(Wire.frames(body.count)); expected at least 2 (header, store name, actions)"
                )
            }
            let store = try Wire.storeName(body[1], field: "store name (frame 1)")
            let actions = try Wire.actionRun(body, from: 2, firstSeq: firstSeq, type: type, limits: limits)
            return .range(requestID: requestID, store: store, epoch: epoch, firstSeq: firstSeq, actions: actions)
        case .rangeReplyBy:
            let epoch = Epoch(rawValue: try header.read(UInt64.self, field: "epoch"))
            let firstSeq = try header.read(UInt64.self, field: "first seq")
            guard body.count >= 4, body.count % 2 == 0 else {
                throw ProtocolError(
                    code: .malformed,
                    "RANGE_BY reply has \(Wire.frames(body.count)); expected an even count of at least 4 (header, store "
                        + "name, actions, an author each)"
                )
            }
            let store = try Wire.storeName(body[1], field: "store name (frame 1)")
            let count = (body.count - 2) / 2
            let actions = try Wire.actionRun(
                Array(body[..<(2 + count)]),
                from: 2,
                firstSeq: firstSeq,
                type: type,
                limits: limits
            )
            let authors = try Wire.authors(body, from: 2 + count, count: count, type: type)
            return .range(
                requestID: requestID,
                store: store,
                epoch: epoch,
                firstSeq: firstSeq,
                actions: actions,
                authors: authors
            )
        case .compacted:
            let epoch = Epoch(rawValue: try header.read(UInt64.self, field: "epoch"))
            let firstAvailable = try header.read(UInt64.self, field: "first available seq")
            try Wire.requireFrames(body, exactly: 2, type: type, layout: "header, store name")
            let store = try Wire.storeName(body[1], field: "store name (frame 1)")
            try Wire.positiveSeq(firstAvailable, field: "first available seq", type: type)
            return .compacted(requestID: requestID, store: store, epoch: epoch, firstAvailable: firstAvailable)
        case .statusReply:
            try Wire.requireFrames(body, exactly: 2, type: type, layout: "header, status JSON")
            return .status(requestID: requestID, json: body[1])
        case .effectsReply:
            try Wire.requireFrames(body, exactly: 2, type: type, layout: "header, effects JSON")
            return .effects(requestID: requestID, json: body[1])
        case .error:
            let code = ProtocolError.Code(rawValue: try header.read(UInt16.self, field: "error code"))
            try Wire.requireFrames(body, exactly: 2, type: type, layout: "header, reason")
            let reason = try Wire.reason(body[1], field: "error reason (frame 1)")
            return .error(requestID: requestID, ProtocolError(code: code, reason))
        default:
            // `messageType` returned a reply type; the others cannot reach here.
            throw ProtocolError(code: .unknownMessageType, "\(type.fullName) is not a reply")
        }
    }
}

/// A store's state at one seq, with the digest that lets the receiver check it arrived whole.
public struct SnapshotReply: Hashable, Sendable {
    /// The store the state belongs to.
    public var store: StoreName
    /// The journal lifetime the state belongs to.
    public var epoch: Epoch
    /// The seq of the last action applied to the state; 0 for a store that has applied none.
    public var seq: SequenceNumber
    /// SHA-256 of exactly ``state``'s bytes, sent by the daemon; the codec does not check it, the replica does.
    public var digest: StateDigest
    /// The state's canonical JSON (`CanonicalEncoding`, in the `Lockstep` module: sorted keys); with ``part``, the
    /// part of it that starts at the part's offset.
    public var state: Frame
    /// Where ``state`` lies in the whole, for a state sent in parts (a reply to a SNAPSHOT request with a part):
    /// ``digest`` is then the SHA-256 of the whole state.
    public var part: Part?

    /// Where a part lies in its state.
    public struct Part: Hashable, Sendable {
        /// The frame's size: total, offset, store's seq.
        public static let byteCount = 24
        /// The whole state's size in bytes.
        public var total: UInt64
        /// Where the part starts in it.
        public var offset: UInt64
        /// The store's last seq when the part was read: the snapshot's seq may be older (the replica repairs the
        /// events between by RANGE).
        public var storeSeq: SequenceNumber

        /// A part at `offset` of a state of `total` bytes, read when the store was at `storeSeq`.
        public init(total: UInt64, offset: UInt64, storeSeq: SequenceNumber) {
            self.total = total
            self.offset = offset
            self.storeSeq = storeSeq
        }
    }

    /// A snapshot as it goes on the wire.
    public init(
        store: StoreName,
        epoch: Epoch,
        seq: SequenceNumber,
        digest: StateDigest,
        state: Frame,
        part: Part? = nil
    ) {
        self.store = store
        self.epoch = epoch
        self.seq = seq
        self.digest = digest
        self.state = state
        self.part = part
    }
}
