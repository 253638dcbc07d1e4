import Foundation
import Lockstep

/// Why one store refused a batch: an action it could not decode, or one its validator refused.
public enum BatchFailure: Error, Hashable, Sendable {
    /// Action `index` (from 0) is not one of the domain's actions in a form it would keep as sent; `reason` says why.
    case undecodable(index: Int, reason: String)
    /// The domain's validator refused action `index` (from 0), with the domain's rejection.
    case rejected(index: Int, Rejection)
}

/// One store's authoritative state and sequence, as the daemon keeps it: decode, validate, reduce, number.
///
/// The daemon holds one per store behind this protocol, so stores of different domains sit in one table.
public protocol SequencedStore: Sendable {
    /// The store's name on the wire.
    var name: StoreName { get }
    /// The domain version the store runs; dispatches of any other are refused.
    var domainVersion: UInt32 { get }
    /// The epoch of the store's journal.
    var epoch: Epoch { get }
    /// The seq of the last action applied.
    var lastSeq: SequenceNumber { get }

    /// Decodes `actions` into their canonical bytes (`CanonicalEncoding.normalize(_:_:with:)`), asks `admit`
    /// whether to go on with those (the caller's idempotency check; `false` returns `nil` and changes nothing),
    /// then validates and applies them as one batch, all or none: each action is validated against the state
    /// the ones before it left, as sent by `author`. On success the actions have seqs `lastSeq + 1…` in order, in
    /// canonical form.
    mutating func sequence(
        _ actions: [Frame],
        by author: Author,
        admit: (_ canonical: [Frame]) -> Bool
    ) -> Result<[SequencedAction], BatchFailure>?

    /// Applies an action already sequenced (journal recovery); `seq` must be `lastSeq + 1`.
    mutating func replay(_ event: SequencedAction) throws

    /// The canonical bytes of the current state, for snapshots and digests, written into room for `expectedBytes`
    /// (`CanonicalEncoding.capacity(forLastSize:)` of a large state's last size; 0 when not known).
    func encodedState(expectedBytes: Int) throws -> Frame

    /// The bytes the state's digest is taken over (`CanonicalEncoding.digestForm(of:reservingCapacity:)`): its
    /// canonical bytes, unless it holds a `DigestedDictionary`; written into room for `expectedBytes`.
    func digestForm(expectedBytes: Int) throws -> CanonicalEncoding.DigestForm

    /// The state's digest form — with `digestForm: false`, its canonical form — handed to `sink` a chunk at a time as
    /// it is written, and hashed on the way (`CanonicalEncoding.streamed`): a large state's checkpoint without its
    /// bytes held whole. `nil` when the state does not stream (the sink's bytes are void).
    func streamed(digestForm: Bool, into sink: (UnsafeRawBufferPointer) -> Void) -> CanonicalEncoding.Streamed?

    /// About how many bytes ``encodedState(expectedBytes:)`` gave when the store was recovered (0 when not known): the daemon
    /// decides by it where to take the store's first checkpoint.
    var stateBytesHint: Int { get }
}

extension SequencedStore {
    /// The canonical bytes of the current state, when its size is not known.
    public func encodedState() throws -> Frame {
        try encodedState(expectedBytes: 0)
    }
}

/// A ``SequencedStore`` for domain `D`.
public struct DomainStore<D: Domain>: SequencedStore {
    /// The domain's name, checked as a store name.
    public let name: StoreName
    /// The domain's version, `D.version`.
    public var domainVersion: UInt32 { D.version }
    /// The epoch of the store's journal.
    public let epoch: Epoch
    /// The seq of the last action applied; 0 before the first.
    public private(set) var lastSeq: SequenceNumber
    /// The state after `lastSeq`.
    public private(set) var state: D.State
    /// About how many bytes the state's canonical form had when the store was recovered (0 when not known).
    public let stateBytesHint: Int
    private let coder = CanonicalEncoding.Coder()

    /// The store at `lastSeq` with `state` (a recovered snapshot, or the domain's initial state at 0), whose canonical
    /// form has about `stateBytesHint` bytes.
    public init(
        _ domain: D.Type,
        epoch: Epoch,
        lastSeq: SequenceNumber = 0,
        state: D.State = D.initialState,
        stateBytesHint: Int = 0
    ) throws(ProtocolError) {
        self.name = try StoreName(D.name)
        self.epoch = epoch
        self.lastSeq = lastSeq
        self.state = state
        self.stateBytesHint = stateBytesHint
    }

    /// Why an action was refused, naming the domain's actions when it named a case the domain does not have (as far
    /// as its generator tells, when it has one).
    static func explain(_ error: CanonicalEncoding.NormalizationError) -> String {
        guard error.unknownCase != nil, let generating = D.self as? any ActionGenerating.Type else {
            return error.reason
        }
        let names = generating.generatedCaseNames()
        guard !names.isEmpty else { return error.reason }
        return "\(error.reason); its actions include \(names.map { "'\($0)'" }.joined(separator: ", "))"
    }

    /// Normalizes, validates and applies `frames` as one batch, as ``SequencedStore/sequence(_:by:admit:)`` says. A batch
    /// of one is validated and reduced in place; a longer batch works on a copy of the state, kept only when every
    /// action passed.
    public mutating func sequence(
        _ frames: [Frame],
        by author: Author,
        admit: (_ canonical: [Frame]) -> Bool
    ) -> Result<[SequencedAction], BatchFailure>? {
        var actions: [D.Action] = []
        var canonical: [Frame] = []
        actions.reserveCapacity(frames.count)
        canonical.reserveCapacity(frames.count)
        for (index, frame) in frames.enumerated() {
            do {
                let (action, bytes) = try CanonicalEncoding.normalize(D.Action.self, frame, with: coder)
                actions.append(action)
                canonical.append(bytes)
            } catch {
                return .failure(.undecodable(index: index, reason: Self.explain(error)))
            }
        }
        guard admit(canonical) else { return nil }
        let first = lastSeq + 1
        // Empty, with nothing allocated, unless an action sets something going; then one list per action.
        var effects: [[EffectRecord]] = []
        func keep(_ records: [EffectRecord], of offset: Int) {
            guard !records.isEmpty else { return }
            if effects.isEmpty { effects = Array(repeating: [], count: actions.count) }
            effects[offset] = records
        }
        if actions.count == 1 {
            // The common case validates and reduces in place, with no copy of the state.
            do throws(Rejection) {
                try D.validate(actions[0], in: state, by: author)
            } catch {
                return .failure(.rejected(index: 0, error))
            }
            D.reduce(into: &state, actions[0], by: author)
            keep(effectRecords(actions[0], in: state, seq: first), of: 0)
        } else {
            var scratch = state
            for (index, action) in actions.enumerated() {
                do throws(Rejection) {
                    try D.validate(action, in: scratch, by: author)
                } catch {
                    return .failure(.rejected(index: index, error))
                }
                D.reduce(into: &scratch, action, by: author)
                keep(effectRecords(action, in: scratch, seq: first + SequenceNumber(index)), of: index)
            }
            state = scratch
        }
        lastSeq += SequenceNumber(frames.count)
        return .success(
            canonical.enumerated().map {
                SequencedAction(
                    seq: first + SequenceNumber($0.offset),
                    action: $0.element,
                    author: author,
                    effects: effects.isEmpty ? [] : effects[$0.offset]
                )
            }
        )
    }

    /// The effects `action` set going on `after`, the state it left, as records (none, for most domains and actions).
    private func effectRecords(_ action: D.Action, in after: D.State, seq: SequenceNumber) -> [EffectRecord] {
        let effects = D.effects(of: action, in: after)
        return effects.isEmpty ? [] : EffectRecord.records(of: effects, seq: seq, coder: coder)
    }

    /// Applies one journaled event; throws a ``ProtocolError`` when its seq does not follow ``lastSeq``, and the
    /// decoding error when its action does not decode.
    public mutating func replay(_ event: SequencedAction) throws {
        guard event.seq == lastSeq + 1 else {
            throw ProtocolError(
                code: .internal,
                "store \(name): event seq \(event.seq) does not follow seq \(lastSeq)"
            )
        }
        let action = try coder.decode(D.Action.self, from: event.action)
        D.reduce(into: &state, action, by: event.author)
        lastSeq = event.seq
    }

    /// The canonical bytes of ``state``, written into room for `expectedBytes`.
    public func encodedState(expectedBytes: Int) throws -> Frame {
        try coder.encode(state, reservingCapacity: expectedBytes)
    }

    /// The digest form of ``state``, written into room for `expectedBytes`.
    public func digestForm(expectedBytes: Int) throws -> CanonicalEncoding.DigestForm {
        try CanonicalEncoding.digestForm(of: state, reservingCapacity: expectedBytes)
    }

    /// The digest form or the canonical form of ``state``, streamed.
    public func streamed(
        digestForm: Bool,
        into sink: (UnsafeRawBufferPointer) -> Void
    ) -> CanonicalEncoding.Streamed? {
        CanonicalEncoding.streamed(state, digestForm: digestForm, into: sink)
    }
}

/// The daemon's dispatch logic as a value: version check, idempotency, validation and sequencing, with no
/// sockets and no journal. The owner journals each ``DispatchDecision/commit(_:)`` before it sends any
/// reply of the turn or publishes any event.
public struct Sequencer: Sendable {
    /// What the daemon must do with one dispatch request.
    public enum DispatchDecision: Sendable {
        /// Journal this, then reply and publish.
        case commit(Commit)
        /// Reply; nothing changed.
        case reply(Reply)
    }

    /// A sequenced batch waiting to be made durable.
    public struct Commit: Sendable, Hashable {
        /// The store the batch goes to.
        public var store: StoreName
        /// The store's epoch when the batch was sequenced.
        public var epoch: Epoch
        /// The client that sent the dispatch: with ``requestNumber``, the idempotency key the journal keeps with the
        /// reply.
        public var clientID: ClientID
        /// The request's number (its request id), the second half of the idempotency key.
        public var requestNumber: UInt64
        /// A digest of the request, so a retry with other content is told apart.
        public var fingerprint: StateDigest
        /// The batch's actions with their new seqs, in canonical form: what the journal records and the daemon
        /// publishes.
        public var events: [SequencedAction]
        /// The ACCEPTED reply to send once the commit is durable.
        public var reply: Reply
    }

    /// Every hosted store by name, each at its last seq.
    public private(set) var stores: [StoreName: any SequencedStore] = [:]
    /// The replies given so far, by idempotency key, so a retry gets its first reply again.
    public private(set) var idempotency: IdempotencyCache

    /// A sequencer over `stores` (each recovered to its last seq) that remembers the newest `idempotencyCapacity`
    /// replies; ``remember(_:_:)`` fills the cache from the journal.
    public init(stores: [any SequencedStore], idempotencyCapacity: Int = 100_000) {
        for store in stores { self.stores[store.name] = store }
        idempotency = IdempotencyCache(capacity: idempotencyCapacity)
    }

    /// Decides what to do with `request`, sent by `author`. The store decodes its actions into their canonical form
    /// first; with `allowedCases`, an action whose case (``actionCase(of:)``) is not among them makes the whole
    /// request `forbidden`; a retried key (same canonical actions) gets its first reply again, the same key with other
    /// actions is refused; otherwise the store validates and sequences the batch.
    public mutating func dispatch(
        _ request: DispatchRequest,
        by author: Author = .unknown,
        allowedCases: Set<String>? = nil
    ) -> DispatchDecision {
        func error(_ code: ProtocolError.Code, _ reason: String) -> DispatchDecision {
            .reply(.error(requestID: request.requestID, ProtocolError(code: code, reason)))
        }
        // Out of the table while it sequences: the store's state is then referenced once and the reducer
        // changes it in place, and `admit` may read the idempotency cache beside it.
        guard var store = stores.removeValue(forKey: request.store) else {
            let hosted = stores.keys.sorted().map(\.rawValue).joined(separator: ", ")
            return error(.unknownStore, "no store named '\(request.store)'; this daemon hosts \(hosted)")
        }
        defer { stores[request.store] = store }
        guard request.domainVersion == store.domainVersion else {
            return error(
                .domainVersionMismatch,
                "store '\(request.store)' runs domain version \(store.domainVersion), the client sent "
                    + "version \(request.domainVersion); build the client with the daemon's domain"
            )
        }
        let key = IdempotencyCache.Key(client: request.clientID, requestNumber: request.requestID)
        // Set by `admit`, which the store calls before it validates: every branch below that validated has it.
        var admitted: StateDigest?
        var known: DispatchDecision?
        let result = store.sequence(request.actions, by: author) { canonical in
            if let allowedCases {
                for action in canonical {
                    let actionCase = Self.actionCase(of: action)
                    guard let actionCase, allowedCases.contains(actionCase) else {
                        known = error(
                            .forbidden,
                            "\(author.isUnknown ? "this peer" : "identity '\(author.name)'") may not dispatch "
                                + (actionCase.map { "action '\($0)'" } ?? "this action") + " to store "
                                + "'\(request.store)'; nothing was applied (ask the daemon's operator for the grant)"
                        )
                        return false
                    }
                }
            }
            let digest = Self.fingerprint(store: request.store, actions: canonical)
            admitted = digest
            guard let entry = idempotency[key] else { return true }
            known =
                entry.fingerprint == digest
                ? .reply(entry.reply)
                : error(
                    .idempotencyConflict,
                    "request number \(request.requestID) of client \(request.clientID) was already used for "
                        + "other actions; use a new request number for a new dispatch"
                )
            return false
        }
        switch result {
        case nil:
            return known!
        case let .failure(.undecodable(index, reason))?:
            return error(
                .undecodableAction,
                "action \(index) is not an action of '\(request.store)': \(reason); nothing was applied"
            )
        case let .failure(.rejected(index, rejection))?:
            let reply = Reply.rejected(requestID: request.requestID, actionIndex: UInt32(index), rejection)
            idempotency.insert(key, IdempotencyCache.Entry(fingerprint: admitted!, reply: reply))
            return .reply(reply)
        case let .success(events)?:
            let reply = Reply.accepted(
                requestID: request.requestID,
                epoch: store.epoch,
                firstSeq: events[0].seq,
                count: UInt32(events.count)
            )
            idempotency.insert(key, IdempotencyCache.Entry(fingerprint: admitted!, reply: reply))
            return .commit(
                Commit(
                    store: request.store,
                    epoch: store.epoch,
                    clientID: request.clientID,
                    requestNumber: request.requestID,
                    fingerprint: admitted!,
                    events: events,
                    reply: reply
                )
            )
        }
    }

    /// The case of an action in canonical form — the one key of its JSON object, as Swift's `Codable` writes an enum
    /// case — or `nil` for an action of another shape. A policy grants action cases by this name.
    public static func actionCase(of action: Frame) -> String? {
        // `{"name":…}`: canonical JSON has no blank, and a key is escaped only for a quote, a backslash or a
        // control character, which no Swift case name holds.
        guard action.count > 4, action[0] == UInt8(ascii: "{"), action[1] == UInt8(ascii: "\"") else { return nil }
        var end = 2
        while end < action.count, action[end] != UInt8(ascii: "\""), action[end] != UInt8(ascii: "\\") { end += 1 }
        guard end < action.count, action[end] == UInt8(ascii: "\""), end + 1 < action.count,
            action[end + 1] == UInt8(ascii: ":"), action.last == UInt8(ascii: "}")
        else { return nil }
        // One key only: the value after it must run to the object's end; a second top-level key means a struct.
        var depth = 0
        var inString = false
        var index = end + 2
        while index < action.count - 1 {
            let byte = action[index]
            if inString {
                if byte == UInt8(ascii: "\\") {
                    index += 1
                } else if byte == UInt8(ascii: "\"") {
                    inString = false
                }
            } else if byte == UInt8(ascii: "\"") {
                inString = true
            } else if byte == UInt8(ascii: "{") || byte == UInt8(ascii: "[") {
                depth += 1
            } else if byte == UInt8(ascii: "}") || byte == UInt8(ascii: "]") {
                depth -= 1
            } else if byte == UInt8(ascii: ","), depth == 0 {
                return nil
            }
            index += 1
        }
        return String(decoding: action[2..<end], as: UTF8.self)
    }

    /// Makes room for `count` idempotency entries before recovery loads them.
    public mutating func reserveIdempotency(_ count: Int) {
        idempotency.reserve(count)
    }

    /// Remembers a reply made durable earlier (journal recovery), so a retry after a restart gets it again.
    public mutating func remember(_ key: IdempotencyCache.Key, _ entry: IdempotencyCache.Entry) {
        idempotency.insert(key, entry)
    }

    /// SHA-256 over the store name and each action (in canonical form), each preceded by its length as a
    /// `u64`: what tells a retry from another request under the same idempotency key.
    public static func fingerprint(store: StoreName, actions: [Frame]) -> StateDigest {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(actions.reduce(store.rawValue.utf8.count + 8) { $0 + $1.count + 8 })
        withUnsafeBytes(of: UInt64(store.rawValue.utf8.count).bigEndian) { bytes.append(contentsOf: $0) }
        bytes.append(contentsOf: store.rawValue.utf8)
        for action in actions {
            withUnsafeBytes(of: UInt64(action.count).bigEndian) { bytes.append(contentsOf: $0) }
            bytes.append(contentsOf: action)
        }
        return StateDigest(of: bytes)
    }
}

/// The replies the daemon gave, by (client id, request number), so a retry is answered and never applied
/// twice. It keeps the newest `capacity` entries: retries come within seconds, far inside that.
public struct IdempotencyCache: Sendable {
    /// An idempotency key: the dispatcher's client id and its request number.
    public struct Key: Hashable, Sendable {
        /// The client that sent the dispatch.
        public var client: ClientID
        /// The request's number, which the client never reuses for another dispatch.
        public var requestNumber: UInt64

        /// The key of request `requestNumber` from `client`.
        public init(client: ClientID, requestNumber: UInt64) {
            self.client = client
            self.requestNumber = requestNumber
        }
    }

    /// What a key was answered with, and which request it answered.
    public struct Entry: Hashable, Sendable {
        /// The ``Sequencer/fingerprint(store:actions:)`` of the request; a retry must match it.
        public var fingerprint: StateDigest
        /// The reply given (ACCEPTED or REJECTED), sent again to a retry.
        public var reply: Reply {
            switch outcome {
            case let .accepted(epoch, firstSeq, count):
                .accepted(requestID: requestID, epoch: epoch, firstSeq: firstSeq, count: count)
            case let .rejected(index, rejection):
                .rejected(requestID: requestID, actionIndex: index, rejection)
            case let .other(reply):
                reply
            }
        }

        /// Only what the reply needs: the daemon keeps 100,000 entries by default, and a whole `Reply` is wider
        /// than either answer a dispatch gets (its SNAPSHOT case holds a digest and a state). A rejection (two
        /// strings, 36 bytes) is boxed too: inline it made every entry 24 bytes wider than an acceptance needs —
        /// 6 MB of the cache's 29 at 100,000 entries, for the rare entry that is one.
        private enum Outcome: Hashable, Sendable {
            case accepted(epoch: Epoch, firstSeq: SequenceNumber, count: UInt32)
            indirect case rejected(index: UInt32, Rejection)
            indirect case other(Reply)
        }

        private var requestID: UInt64
        private var outcome: Outcome

        /// The entry for a request with `fingerprint`, answered with `reply`.
        public init(fingerprint: StateDigest, reply: Reply) {
            self.fingerprint = fingerprint
            requestID = reply.requestID
            switch reply {
            case let .accepted(_, epoch, firstSeq, count):
                outcome = .accepted(epoch: epoch, firstSeq: firstSeq, count: count)
            case let .rejected(_, index, rejection): outcome = .rejected(index: index, rejection)
            default: outcome = .other(reply)
            }
        }
    }

    /// How many entries are kept at most; inserting one more evicts the oldest.
    public let capacity: Int
    private var entries: [Key: Entry] = [:]
    /// Keys in insertion order from `head` on; the prefix before `head` is already evicted.
    private var order: [Key] = []
    private var head = 0

    /// An empty cache that keeps the newest `capacity` entries; `capacity` must be at least 1.
    public init(capacity: Int) {
        precondition(capacity > 0, "an idempotency cache needs room for at least one entry")
        self.capacity = capacity
    }

    /// Makes room for `count` entries (at most ``capacity``) at once, before a daemon loads them.
    public mutating func reserve(_ count: Int) {
        let wanted = min(count, capacity)
        entries.reserveCapacity(wanted)
        order.reserveCapacity(wanted)
    }

    /// How many entries are kept now, at most ``capacity``.
    public var count: Int { entries.count }

    /// The entry for `key`, or `nil` when it was never inserted or has been evicted.
    public subscript(key: Key) -> Entry? { entries[key] }

    /// Keeps `entry` for `key`, then evicts the oldest entries beyond ``capacity``. An entry that replaces another
    /// under the same key keeps that key's place in the eviction order.
    public mutating func insert(_ key: Key, _ entry: Entry) {
        if entries.updateValue(entry, forKey: key) == nil { order.append(key) }
        while entries.count > capacity {
            entries.removeValue(forKey: order[head])
            head += 1
        }
        if head > capacity {
            order.removeFirst(head)
            head = 0
        }
    }
}
