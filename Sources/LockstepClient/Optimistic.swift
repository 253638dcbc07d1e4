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
    /// The request number of the dispatch's idempotency key: how ``OptimisticRead/pending`` and
    /// ``Replica/rollbacks()`` name it.
    public let requestNumber: UInt64
    let outcome: DispatchOutcome
    /// Where it stands in the replica's pending list, while it is there.
    let pendingStatus: @Sendable () -> PendingStatus?

    /// Where a dispatch stands, read at once.
    public enum Status: Sendable, CustomStringConvertible {
        /// In the pending list: queued, sent, or accepted and not yet in the confirmed state.
        case pending(PendingStatus)
        /// In the confirmed state, at these seqs.
        case confirmed(ClosedRange<SequenceNumber>)
        /// Rolled back: the domain's `Rejection` or a ``ClientError``, as ``seqs`` throws it.
        case rolledBack(any Error)

        /// `pending: sent (2 tries)`, `confirmed at seqs 4...4`, `rolled back: …`.
        public var description: String {
            switch self {
            case let .pending(status): "pending: \(status)"
            case let .confirmed(seqs): "confirmed at seqs \(seqs)"
            case let .rolledBack(error): "rolled back: \(error)"
            }
        }
    }

    /// Where the dispatch stands now, without waiting: a handle leaves the pending list in the same step that
    /// resolves it, so this and ``OptimisticRead/pending`` never disagree.
    public var status: Status {
        if let answer = outcome.answer { return Self.status(answer) }
        if let pending = pendingStatus() { return .pending(pending) }
        // It left the list since the first look: its answer was set before it did.
        return outcome.answer.map(Self.status) ?? .pending(.queued)
    }

    private static func status(_ answer: Result<ClosedRange<SequenceNumber>, any Error>) -> Status {
        switch answer {
        case let .success(seqs): .confirmed(seqs)
        case let .failure(error): .rolledBack(error)
        }
    }

    /// The seqs of the actions, once they are in this replica's confirmed state. Throws the domain's `Rejection`
    /// when the daemon refused them, a ``ClientError`` when they were rolled back for another reason
    /// (`unavailable`: no daemon accepted them within ``ReplicaConfiguration/pendingTimeout``; `refused`: another
    /// domain version or an unknown store; `notApplied`: the daemon's journal was lost after it accepted them;
    /// `stopped`: the replica stopped first). Any number of tasks may wait.
    public var seqs: ClosedRange<SequenceNumber> {
        get async throws { try await outcome.value }
    }

    /// The seq of the last action, as ``seqs`` says.
    public var seq: SequenceNumber {
        get async throws { try await outcome.value.upperBound }
    }
}

/// Where a pending optimistic dispatch stands.
public enum PendingStatus: Sendable, Hashable, CustomStringConvertible {
    /// Applied locally, not sent yet.
    case queued
    /// Sent; `tries` counts the sends, the first one included (more than one: a retry after a silence, with the
    /// same idempotency key).
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

/// One of a replica's optimistic dispatches that the confirmed state does not hold yet.
public struct PendingDispatch<D: Domain>: Sendable, CustomStringConvertible {
    /// The request number of its idempotency key.
    public var requestNumber: UInt64
    /// Its actions, in order.
    public var actions: [D.Action]
    /// When it was dispatched.
    public var dispatchedAt: ContinuousClock.Instant
    /// Where it stands.
    public var status: PendingStatus
    /// Whether it is left out of the optimistic state: on the base it now follows, it no longer passes the
    /// domain's validator (another process's action came first), so none of its actions are applied until the
    /// daemon decides it — almost always a rejection.
    public var isLeftOut: Bool

    /// How long ago it was dispatched.
    public var age: Duration { .now - dispatchedAt }

    /// `#7 {"add":…} sent (2 tries), 1200 ms old`, for logs.
    public var description: String {
        let texts = actions.map {
            (try? CanonicalEncoding.encode($0)).map { String(decoding: $0, as: UTF8.self) } ?? "?"
        }
        let out = isLeftOut ? ", left out" : ""
        return
            "#\(requestNumber) \(texts.joined(separator: " ")) \(status)\(out), \(Int(age / .milliseconds(1))) ms old"
    }
}

/// One consistent read of a replica's optimistic side: the confirmed state it is built on, the pending dispatches,
/// and the optimistic state — ``base`` with every pending dispatch not ``PendingDispatch/isLeftOut`` applied, in
/// order. The three are made together, under one lock, so they always agree: re-applying ``pending`` to ``base``
/// with the domain's own validate and reduce gives ``state``. ``Replica/optimistic`` reads one;
/// ``Replica/reads(bufferingPolicy:)`` and ``Replica/subscribe(optimistic:onChange:)`` deliver each new one.
public struct OptimisticRead<D: Domain>: Sendable, Equatable {
    /// The confirmed state the optimistic one is built on, with its epoch and seq.
    public var base: Replicated<D.State>
    /// The optimistic dispatches the base does not hold, oldest first.
    public var pending: [PendingDispatch<D>]
    /// The optimistic state: what a UI shows.
    public var state: D.State
    /// One more at every change: a later read has a higher version.
    public var version: UInt64

    /// Reads of the same version are the same read.
    public static func == (left: Self, right: Self) -> Bool { left.version == right.version }
}

/// An optimistic dispatch taken back out of the optimistic state: the daemon rejected it, or it could not be
/// confirmed. ``Replica/rollbacks()`` tells a UI, which may say so to its user.
public struct OptimisticRollback<D: Domain>: Sendable, CustomStringConvertible {
    /// The request number of its idempotency key.
    public var requestNumber: UInt64
    /// Its actions.
    public var actions: [D.Action]
    /// Why: the domain's `Rejection` (with the daemon's reason) or a ``ClientError``.
    public var error: any Error

    /// `#7 {"delete":…} rolled back: …`, for logs.
    public var description: String {
        let texts = actions.map {
            (try? CanonicalEncoding.encode($0)).map { String(decoding: $0, as: UTF8.self) } ?? "?"
        }
        return "#\(requestNumber) \(texts.joined(separator: " ")) rolled back: \(error)"
    }
}

/// Where a dispatch's answer arrives: resolved once, awaited by any number of tasks.
package final class DispatchOutcome: Sendable {
    private typealias Answer = Result<ClosedRange<SequenceNumber>, any Error>
    private let state = LockedValue<
        (answer: Answer?, waiting: [CheckedContinuation<ClosedRange<SequenceNumber>, any Error>])
    >(
        (nil, [])
    )

    /// An outcome nobody has settled yet.
    package init() {}

    /// Settles the outcome; later calls change nothing.
    package func resolve(_ answer: Result<ClosedRange<SequenceNumber>, any Error>) {
        let waiting = state.withLockedValue { state in
            guard state.answer == nil else { return [CheckedContinuation<ClosedRange<SequenceNumber>, any Error>]() }
            state.answer = answer
            defer { state.waiting.removeAll() }
            return state.waiting
        }
        for continuation in waiting { continuation.resume(with: answer) }
    }

    package func fail(_ error: any Error) { resolve(.failure(error)) }

    /// The answer, once settled.
    package var answer: Result<ClosedRange<SequenceNumber>, any Error>? { state.withLockedValue { $0.answer } }

    package var value: ClosedRange<SequenceNumber> {
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
