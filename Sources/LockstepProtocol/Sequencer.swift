import Foundation
import Lockstep

/// Why one store refused a batch: an action it could not decode, or one its validator refused.
public enum BatchFailure: Error, Hashable, Sendable {
    case undecodable(index: Int, reason: String)
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

    /// Decodes, validates and applies `actions` as one batch, all or none: each action is validated against
    /// the state the ones before it left. On success the actions have seqs `lastSeq + 1…` in order.
    mutating func sequence(_ actions: [Frame]) -> Result<[SequencedAction], BatchFailure>

    /// Applies an action already sequenced (journal recovery); `seq` must be `lastSeq + 1`.
    mutating func replay(_ event: SequencedAction) throws

    /// The canonical bytes of the current state, for snapshots and digests.
    func encodedState() throws -> Frame
}

/// A ``SequencedStore`` for domain `D`.
public struct DomainStore<D: Domain>: SequencedStore {
    public let name: StoreName
    public var domainVersion: UInt32 { D.version }
    public let epoch: Epoch
    public private(set) var lastSeq: SequenceNumber
    /// The state after `lastSeq`.
    public private(set) var state: D.State

    /// The store at `lastSeq` with `state` (a recovered snapshot, or the domain's initial state at 0).
    public init(
        _ domain: D.Type,
        epoch: Epoch,
        lastSeq: SequenceNumber = 0,
        state: D.State = D.initialState
    ) throws(ProtocolError) {
        self.name = try StoreName(D.name)
        self.epoch = epoch
        self.lastSeq = lastSeq
        self.state = state
    }

    public mutating func sequence(_ frames: [Frame]) -> Result<[SequencedAction], BatchFailure> {
        var actions: [D.Action] = []
        actions.reserveCapacity(frames.count)
        let decoder = JSONDecoder()
        for (index, frame) in frames.enumerated() {
            do {
                actions.append(try decoder.decode(D.Action.self, from: Data(frame)))
            } catch {
                return .failure(.undecodable(index: index, reason: "\(CanonicalEncoding.describe(error))"))
            }
        }
        if actions.count == 1 {
            // The common case validates and reduces in place, with no copy of the state.
            do throws(Rejection) {
                try D.validate(actions[0], in: state)
            } catch {
                return .failure(.rejected(index: 0, error))
            }
            D.reduce(into: &state, actions[0])
        } else {
            var scratch = state
            for (index, action) in actions.enumerated() {
                do throws(Rejection) {
                    try D.validate(action, in: scratch)
                } catch {
                    return .failure(.rejected(index: index, error))
                }
                D.reduce(into: &scratch, action)
            }
            state = scratch
        }
        let first = lastSeq + 1
        lastSeq += SequenceNumber(frames.count)
        return .success(
            frames.enumerated().map { SequencedAction(seq: first + SequenceNumber($0.offset), action: $0.element) }
        )
    }

    public mutating func replay(_ event: SequencedAction) throws {
        guard event.seq == lastSeq + 1 else {
            throw ProtocolError(
                code: .internal,
                "store \(name): event seq \(event.seq) does not follow seq \(lastSeq)"
            )
        }
        let action = try JSONDecoder().decode(D.Action.self, from: Data(event.action))
        D.reduce(into: &state, action)
        lastSeq = event.seq
    }

    public func encodedState() throws -> Frame {
        Array(try CanonicalEncoding.encode(state))
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
        public var store: StoreName
        public var epoch: Epoch
        public var clientID: ClientID
        public var requestNumber: UInt64
        /// A digest of the request, so a retry with other content is told apart.
        public var fingerprint: StateDigest
        public var events: [SequencedAction]
        /// The ACCEPTED reply to send once the commit is durable.
        public var reply: Reply
    }

    public private(set) var stores: [StoreName: any SequencedStore] = [:]
    public private(set) var idempotency: IdempotencyCache

    public init(stores: [any SequencedStore], idempotencyCapacity: Int = 100_000) {
        for store in stores { self.stores[store.name] = store }
        idempotency = IdempotencyCache(capacity: idempotencyCapacity)
    }

    /// Decides what to do with `request`. A retried key gets its first reply again; the same key with other
    /// actions is refused; otherwise the store validates and sequences the batch.
    public mutating func dispatch(_ request: DispatchRequest) -> DispatchDecision {
        let fingerprint = Self.fingerprint(of: request)
        let key = IdempotencyCache.Key(client: request.clientID, requestNumber: request.requestID)
        if let entry = idempotency[key] {
            if entry.fingerprint == fingerprint { return .reply(entry.reply) }
            return .reply(
                .error(
                    requestID: request.requestID,
                    ProtocolError(
                        code: .idempotencyConflict,
                        "request number \(request.requestID) of client \(request.clientID) was already used for "
                            + "other actions; use a new request number for a new dispatch"
                    )
                )
            )
        }
        guard let domainVersion = stores[request.store]?.domainVersion else {
            let hosted = stores.keys.sorted().map(\.rawValue).joined(separator: ", ")
            return .reply(
                .error(
                    requestID: request.requestID,
                    ProtocolError(
                        code: .unknownStore,
                        "no store named '\(request.store)'; this daemon hosts \(hosted)"
                    )
                )
            )
        }
        guard request.domainVersion == domainVersion else {
            return .reply(
                .error(
                    requestID: request.requestID,
                    ProtocolError(
                        code: .domainVersionMismatch,
                        "store '\(request.store)' runs domain version \(domainVersion), the client sent "
                            + "version \(request.domainVersion); build the client with the daemon's domain"
                    )
                )
            )
        }
        // Through the dictionary in place: a local copy would hold a second reference to the state, and the
        // reducer's first write would copy all of it.
        let result = stores[request.store]!.sequence(request.actions)
        switch result {
        case let .failure(.undecodable(index, reason)):
            return .reply(
                .error(
                    requestID: request.requestID,
                    ProtocolError(
                        code: .undecodableAction,
                        "action \(index) is not a '\(request.store)' action: \(reason); nothing was applied"
                    )
                )
            )
        case let .failure(.rejected(index, rejection)):
            let reply = Reply.rejected(requestID: request.requestID, actionIndex: UInt32(index), rejection)
            idempotency.insert(key, IdempotencyCache.Entry(fingerprint: fingerprint, reply: reply))
            return .reply(reply)
        case let .success(events):
            let epoch = stores[request.store]!.epoch
            let reply = Reply.accepted(
                requestID: request.requestID,
                epoch: epoch,
                firstSeq: events[0].seq,
                count: UInt32(events.count)
            )
            idempotency.insert(key, IdempotencyCache.Entry(fingerprint: fingerprint, reply: reply))
            return .commit(
                Commit(
                    store: request.store,
                    epoch: epoch,
                    clientID: request.clientID,
                    requestNumber: request.requestID,
                    fingerprint: fingerprint,
                    events: events,
                    reply: reply
                )
            )
        }
    }

    /// Remembers a reply made durable earlier (journal recovery), so a retry after a restart gets it again.
    public mutating func remember(_ key: IdempotencyCache.Key, _ entry: IdempotencyCache.Entry) {
        idempotency.insert(key, entry)
    }

    /// SHA-256 over the store name and each action, each preceded by its length.
    public static func fingerprint(of request: DispatchRequest) -> StateDigest {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(request.actions.reduce(request.store.rawValue.utf8.count + 8) { $0 + $1.count + 8 })
        for part in [Array(request.store.rawValue.utf8)] + request.actions {
            withUnsafeBytes(of: UInt64(part.count).bigEndian) { bytes.append(contentsOf: $0) }
            bytes.append(contentsOf: part)
        }
        return StateDigest(of: bytes)
    }
}

/// The replies the daemon gave, by (client id, request number), so a retry is answered and never applied
/// twice. It keeps the newest `capacity` entries: retries come within seconds, far inside that.
public struct IdempotencyCache: Sendable {
    public struct Key: Hashable, Sendable {
        public var client: ClientID
        public var requestNumber: UInt64

        public init(client: ClientID, requestNumber: UInt64) {
            self.client = client
            self.requestNumber = requestNumber
        }
    }

    public struct Entry: Hashable, Sendable {
        public var fingerprint: StateDigest
        public var reply: Reply

        public init(fingerprint: StateDigest, reply: Reply) {
            self.fingerprint = fingerprint
            self.reply = reply
        }
    }

    public let capacity: Int
    private var entries: [Key: Entry] = [:]
    /// Keys in insertion order from `head` on; the prefix before `head` is already evicted.
    private var order: [Key] = []
    private var head = 0

    public init(capacity: Int) {
        precondition(capacity > 0, "an idempotency cache needs room for at least one entry")
        self.capacity = capacity
    }

    public var count: Int { entries.count }

    public subscript(key: Key) -> Entry? { entries[key] }

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
