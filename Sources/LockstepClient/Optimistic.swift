import Lockstep
import LockstepProtocol

/// Which of a replica's two states to read or observe.
///
/// The *confirmed* state is the daemon's: the state after exactly the actions it sequenced up to a seq, checked
/// against its digests, the same in every replica. The *optimistic* state is the confirmed state with this
/// replica's own pending optimistic actions (``Replica/dispatchOptimistically(_:)``) applied on top, in the order
/// it dispatched them: what a UI shows. With nothing pending the two are equal.
public enum ReplicaView: Sendable, Hashable {
    /// The daemon's state at a seq.
    case confirmed
    /// The confirmed state and this replica's pending optimistic actions on top of it.
    case optimistic
}

/// The answer to an optimistic dispatch, on its way: the seqs the daemon gives the actions, once this replica's
/// confirmed state holds them, or why they were rolled back.
public struct OptimisticDispatch: Sendable {
    /// The request number of the dispatch's idempotency key: how ``Replica/pending`` and
    /// ``Replica/rollbacks()`` name it.
    public let requestNumber: UInt64
    let outcome: DispatchOutcome

    /// The seqs of the actions, once they are in this replica's confirmed state. Throws the domain's `Rejection`
    /// when the daemon refused them, a ``ClientError`` when they were rolled back for another reason
    /// (`refused`: another domain version or an unknown store; `notApplied`: the daemon's journal was lost after
    /// it accepted them; `stopped`: the replica stopped first). Any number of tasks may wait.
    public var seqs: ClosedRange<SequenceNumber> {
        get async throws { try await outcome.value }
    }

    /// The seq of the last action, as ``seqs`` says.
    public var seq: SequenceNumber {
        get async throws { try await outcome.value.upperBound }
    }
}

/// One of a replica's optimistic dispatches that the confirmed state does not hold yet.
public struct PendingAction: Sendable, Hashable, CustomStringConvertible {
    /// Where it stands.
    public enum Status: Sendable, Hashable, CustomStringConvertible {
        /// Applied locally, not sent yet.
        case queued
        /// Sent; `tries` counts the sends, the first one included (more than one: a retry after a silence, with
        /// the same idempotency key).
        case sent(tries: Int)
        /// Accepted by the daemon at `seqs` of `epoch`; confirmed once the replica applies those seqs.
        case accepted(epoch: Epoch, seqs: ClosedRange<SequenceNumber>)

        /// `queued`, `sent (2 tries)` or `accepted at seqs 4...4`.
        public var description: String {
            switch self {
            case .queued: "queued"
            case let .sent(tries): tries == 1 ? "sent" : "sent (\(tries) tries)"
            case let .accepted(_, seqs): "accepted at seqs \(seqs)"
            }
        }
    }

    /// The request number of its idempotency key.
    public var requestNumber: UInt64
    /// Its actions in canonical JSON.
    public var actions: [String]
    /// When it was dispatched.
    public var dispatchedAt: ContinuousClock.Instant
    /// Where it stands.
    public var status: Status

    /// How long ago it was dispatched.
    public var age: Duration { .now - dispatchedAt }

    /// `#7 {"add":…} sent (2 tries), 1200 ms old`, for logs.
    public var description: String {
        "#\(requestNumber) \(actions.joined(separator: " ")) \(status), \(Int(age / .milliseconds(1))) ms old"
    }
}

/// An optimistic dispatch taken back out of the optimistic state: the daemon rejected it, or it could not be
/// confirmed. ``Replica/rollbacks()`` tells a UI, which may say so to its user.
public struct OptimisticRollback: Sendable, CustomStringConvertible {
    /// The request number of its idempotency key.
    public var requestNumber: UInt64
    /// Its actions in canonical JSON.
    public var actions: [String]
    /// Why: the domain's `Rejection` (with the daemon's reason) or a ``ClientError``.
    public var error: any Error

    /// `#7 {"delete":…} rolled back: …`, for logs.
    public var description: String {
        "#\(requestNumber) \(actions.joined(separator: " ")) rolled back: \(error)"
    }
}

/// Where a dispatch's answer arrives: resolved once, awaited by any number of tasks.
final class DispatchOutcome: Sendable {
    private typealias Answer = Result<ClosedRange<SequenceNumber>, any Error>
    private let state = LockedValue<
        (answer: Answer?, waiting: [CheckedContinuation<ClosedRange<SequenceNumber>, any Error>])
    >(
        (nil, [])
    )

    /// Settles the outcome; later calls change nothing.
    func resolve(_ answer: Result<ClosedRange<SequenceNumber>, any Error>) {
        let waiting = state.withLockedValue { state in
            guard state.answer == nil else { return [CheckedContinuation<ClosedRange<SequenceNumber>, any Error>]() }
            state.answer = answer
            defer { state.waiting.removeAll() }
            return state.waiting
        }
        for continuation in waiting { continuation.resume(with: answer) }
    }

    func fail(_ error: any Error) { resolve(.failure(error)) }

    var value: ClosedRange<SequenceNumber> {
        get async throws {
            try await withCheckedThrowingContinuation { continuation in
                let answer = state.withLockedValue { state in
                    if state.answer == nil { state.waiting.append(continuation) }
                    return state.answer
                }
                if let answer { continuation.resume(with: answer) }
            }
        }
    }
}

/// The optimistic state and what it is made of: a confirmed state (the base) and the pending dispatches applied on
/// top of it, in dispatch order. Only changed through ``Change``, in the order of a ``Store``.
struct Projection<D: Domain>: Equatable, Sendable {
    struct Entry: Sendable {
        var requestNumber: UInt64
        var actions: [D.Action]
    }

    /// The confirmed state it is built on.
    var base: Replicated<D.State>
    /// Rebases applied; one that arrives before the one due waits in `early`, so they apply in the order the
    /// replica worked them out even when two threads send them.
    var rebases: UInt64 = 0
    var early: [UInt64: (base: Replicated<D.State>, settled: Set<UInt64>)] = [:]
    var pending: [Entry] = []
    /// `base` with `pending` applied: what the optimistic view shows, with the base's epoch and seq.
    var view: Replicated<D.State>

    init(base: Replicated<D.State>) {
        self.base = base
        view = base
    }

    static func == (left: Self, right: Self) -> Bool {
        left.view == right.view && left.rebases == right.rebases
            && left.pending.map(\.requestNumber) == right.pending.map(\.requestNumber)
    }

    enum Change: Encodable, Sendable {
        /// A new optimistic dispatch, validated against the optimistic state and applied to it.
        case add(Entry)
        /// The confirmed state moved to `base`: `settled` (confirmed in it, or lost) leave the pending list and the
        /// rest are applied again on top. Rebase `sequence` applies after rebase `sequence - 1`.
        case rebase(Replicated<D.State>, sequence: UInt64, settled: Set<UInt64>)
        /// Rolled back: rejected by the daemon, refused, lost.
        case remove(Set<UInt64>)

        func encode(to encoder: any Encoder) throws {
            var container = encoder.singleValueContainer()
            switch self {
            case let .add(entry): try container.encode("add #\(entry.requestNumber)")
            case let .rebase(base, sequence, settled):
                try container.encode("rebase \(sequence) on seq \(base.seq), \(settled.sorted()) settled")
            case let .remove(numbers): try container.encode("remove \(numbers.sorted())")
            }
        }
    }

    static var reducer: Reducer<Projection, Change> {
        Reducer(
            validate: { change, projection throws(Rejection) in
                guard case let .add(entry) = change else { return }
                try validate(entry.actions, on: projection.view.state)
            },
            reduce: { projection, change in
                switch change {
                case let .add(entry):
                    projection.pending.append(entry)
                    for action in entry.actions { D.reduce(into: &projection.view.state, action) }
                case let .rebase(base, sequence, settled):
                    projection.early[sequence] = (base, settled)
                    while let (base, settled) = projection.early.removeValue(forKey: projection.rebases + 1) {
                        projection.rebases += 1
                        projection.base = base
                        projection.pending.removeAll { settled.contains($0.requestNumber) }
                    }
                    projection.replay()
                case let .remove(numbers):
                    projection.pending.removeAll { numbers.contains($0.requestNumber) }
                    projection.replay()
                }
            }
        )
    }

    /// Validates `actions` in turn, each on the state the ones before it leave: as the daemon validates a batch.
    static func validate(_ actions: [D.Action], on state: D.State) throws(Rejection) {
        guard actions.count > 1 else {
            if let action = actions.first { try D.validate(action, in: state) }
            return
        }
        var scratch = state
        for (index, action) in actions.enumerated() {
            do throws(Rejection) {
                try D.validate(action, in: scratch)
            } catch {
                throw Rejection(code: error.code, "action \(index) of the batch: \(error.reason)")
            }
            D.reduce(into: &scratch, action)
        }
    }

    /// The view again: the base and every pending entry that still validates on what is before it. An entry the
    /// new base no longer allows is left out, whole, until the daemon decides it (a reducer only ever sees actions
    /// its validator accepted on that very state).
    mutating func replay() {
        view = base
        for entry in pending {
            guard (try? Self.validate(entry.actions, on: view.state)) != nil else { continue }
            for action in entry.actions { D.reduce(into: &view.state, action) }
        }
    }
}
