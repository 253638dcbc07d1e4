import Lockstep
import LockstepProtocol

/// A replica's optimistic side as a value: the confirmed state it is built on, the pending optimistic dispatches in
/// dispatch order, and the optimistic state — the base with every pending dispatch that still validates applied on
/// top (docs/optimistic.md). No socket, no lock and no clock in it: every event carries what it needs (`now`, the
/// confirmed change's number) and every decision comes back as an ``Action`` — resolve a handle, roll a dispatch
/// back, stop sending one, publish a new read — for the replica to carry out.
///
/// The replica keeps it under one lock, so the three parts of a read (``read``) always agree.
package struct OptimisticLedger<D: Domain>: Sendable {
    /// One pending optimistic dispatch.
    package struct Entry: Sendable {
        package var number: UInt64
        package var actions: [D.Action]
        package var dispatchedAt: ContinuousClock.Instant
        package var outcome: DispatchOutcome
        /// How many confirmed changes the replica had heard of when it last sent the dispatch after a time it could
        /// not be in the daemon's history (its first send, or a send after `unavailable`); `nil` while unsent.
        package var heardAtSend: UInt64?
        package var tries = 0
        package var accepted: (epoch: Epoch, seqs: ClosedRange<SequenceNumber>)?
        /// When it is rolled back `notApplied` if the confirmed state does not hold it by then.
        package var confirmBy: ContinuousClock.Instant?
        /// Whether the confirmed state was of the epoch it was accepted in since: leaving that epoch loses it.
        package var epochSeen = false
        /// Whether it is left out of the optimistic state: it no longer validates on what is before it.
        package var leftOut = false

        /// Whether it holds up a rebase onto confirmed change `number`: unanswered, and sent before that change
        /// arrived, so the change may hold it.
        func holdsUp(_ number: UInt64) -> Bool {
            guard accepted == nil, let heard = heardAtSend else { return false }
            return heard < number
        }

        var status: PendingStatus {
            if let (epoch, seqs) = accepted { return .accepted(epoch: epoch, seqs: seqs) }
            return tries > 0 ? .sent(tries: tries) : .queued
        }
    }

    /// What the replica must do, in order.
    package enum Action: Sendable {
        /// The dispatch is in the confirmed state at `seqs`: its handle resolves.
        case resolve(DispatchOutcome, ClosedRange<SequenceNumber>)
        /// The dispatch is rolled back: its handle throws `error`, and ``Replica/rollbacks()`` tells.
        case rollBack(number: UInt64, actions: [D.Action], outcome: DispatchOutcome, error: any Error)
        /// Send the dispatch no more, and make sure nothing of it already queued goes out (it was rolled back).
        case abandon(UInt64)
        /// The read changed and someone watches the optimistic state: hand it to the subscribers.
        case publish(OptimisticRead<D>)
    }

    /// Why a new dispatch cannot be taken.
    package enum Refusal: Error, Sendable {
        /// The domain's validator refused it on the optimistic state.
        case rejected(Rejection)
        /// There is no confirmed state to validate it against yet.
        case notJoined
        /// It would take the pending actions past the bound: `pending` now, `adding` more.
        case tooMany(pending: Int, adding: Int)
    }

    /// How long a dispatch without an acceptance stays pending, counted from the dispatch.
    package let pendingTimeout: Duration
    /// The most pending actions.
    package let maximumPending: Int
    /// The confirmed state the optimistic one is built on.
    package private(set) var base: Replicated<D.State>
    /// The number of the confirmed change ``base`` is (0 before any).
    package private(set) var baseNumber: UInt64 = 0
    /// The pending dispatches, oldest first.
    package private(set) var entries: [Entry] = []
    /// ``base`` with every entry not left out applied.
    package private(set) var state: D.State
    /// One more at every change of the read.
    package private(set) var version: UInt64 = 0
    /// Subscriptions to the optimistic state: while there are some, it is rebuilt even with nothing pending.
    package private(set) var watchers = 0
    /// The newest confirmed change heard of, and its state — not kept (`nil`) while nothing needs it: nothing pending,
    /// nobody watching. Kept, it would make the local store's next change copy the whole state (an array of 10⁵ todos
    /// at every event); ``restore(_:)`` reads it from the local store when something does.
    private var newest: (number: UInt64, base: Replicated<D.State>?)?
    /// Confirmed changes that arrived while a rebase onto them waited for an answer, oldest first, at most
    /// ``maximumHeldBases`` (each keeps a copy of the state alive).
    private var held: [(number: UInt64, base: Replicated<D.State>)] = []

    package static var maximumHeldBases: Int { 64 }

    /// Whether the newest confirmed state is let go while nothing needs it; the owner then calls ``restore(_:)``
    /// before every event that builds on it — ``dispatch(_:_:outcome:now:)``, ``watch()``, ``catchUp()`` — and only
    /// then (a `Replica` does): a state taken back and kept across the local store's next change costs a copy.
    package var letsIdleStateGo = false

    /// A ledger with nothing pending, on `base`.
    package init(base: Replicated<D.State>, pendingTimeout: Duration, maximumPending: Int) {
        self.base = base
        state = base.state
        self.pendingTimeout = pendingTimeout
        self.maximumPending = maximumPending
    }

    /// How many actions are pending.
    package var pendingActions: Int { entries.reduce(0) { $0 + $1.actions.count } }

    /// The three parts together.
    package var read: OptimisticRead<D> {
        OptimisticRead(
            base: base,
            pending: entries.map {
                PendingDispatch(
                    requestNumber: $0.number,
                    actions: $0.actions,
                    dispatchedAt: $0.dispatchedAt,
                    status: $0.status,
                    isLeftOut: $0.leftOut
                )
            },
            state: state,
            version: version
        )
    }

    /// The status of pending dispatch `number`; `nil` once it left the list.
    package func status(of number: UInt64) -> PendingStatus? {
        entries.first { $0.number == number }?.status
    }

    // MARK: - Events

    /// A new optimistic dispatch: validated on the optimistic state (rebuilt first on the newest confirmed state
    /// it may take), applied on top, pending from `now`.
    package mutating func dispatch(
        _ number: UInt64,
        _ actions: [D.Action],
        outcome: DispatchOutcome,
        now: ContinuousClock.Instant
    ) throws(Refusal) -> [Action] {
        guard newest?.base?.epoch != nil || base.epoch != nil else { throw .notJoined }
        let pending = pendingActions
        guard pending + actions.count <= maximumPending else { throw .tooMany(pending: pending, adding: actions.count) }
        var output = rebase()
        do {
            try Self.validate(actions, on: state)
        } catch {
            throw .rejected(error)
        }
        for action in actions { D.reduce(into: &state, action, by: .unknown) }
        entries.append(Entry(number: number, actions: actions, dispatchedAt: now, outcome: outcome))
        output += changed()
        return output
    }

    /// Dispatch `number` went out (again), the replica having heard of `heard` confirmed changes.
    package mutating func sent(_ number: UInt64, heard: UInt64) -> [Action] {
        guard let index = entries.firstIndex(where: { $0.number == number }) else { return [] }
        entries[index].tries += 1
        if entries[index].heardAtSend == nil { entries[index].heardAtSend = heard }
        return changed()
    }

    /// The daemon accepted dispatch `number` at `seqs` of `epoch`; it is confirmed by the rebase onto a confirmed
    /// state that holds them, which may be one its answer held up — or rolled back `notApplied` after `confirmBy`.
    package mutating func accepted(
        _ number: UInt64,
        epoch: Epoch,
        seqs: ClosedRange<SequenceNumber>,
        confirmBy: ContinuousClock.Instant
    ) -> [Action] {
        guard let index = entries.firstIndex(where: { $0.number == number }) else { return [] }
        entries[index].accepted = (epoch, seqs)
        entries[index].confirmBy = confirmBy
        entries[index].epochSeen = ((newest?.base).flatMap { $0 } ?? base).epoch == epoch
        let output = rebase()
        return output.isEmpty ? changed() : output
    }

    /// The daemon could not take dispatch `number` for now (`unavailable`, `not_leader`): nothing of it was
    /// applied, so until it is sent again it is in no history and holds no rebase up.
    package mutating func notTaken(_ number: UInt64) -> [Action] {
        guard let index = entries.firstIndex(where: { $0.number == number }) else { return [] }
        entries[index].heardAtSend = nil
        return rebase()
    }

    /// Dispatch `number` will not be confirmed (`error`: the daemon's rejection, a refusal, a lost history): it
    /// leaves the pending list and the optimistic state.
    package mutating func rolledBack(_ number: UInt64, _ error: any Error) -> [Action] {
        guard let index = entries.firstIndex(where: { $0.number == number }) else { return [] }
        let entry = entries.remove(at: index)
        return [.rollBack(number: number, actions: entry.actions, outcome: entry.outcome, error: error)]
            + rebase(removed: true)
    }

    /// The replica applied confirmed change `number`, whose state is `confirmed`. The optimistic state is rebuilt
    /// on it — unless nothing is pending and nobody watches: it would equal the confirmed state, which readers of
    /// the optimistic state then read; it catches up when a dispatch or a subscription starts (``catchUp()``).
    package mutating func confirmed(_ number: UInt64, _ confirmed: Replicated<D.State>) -> [Action] {
        newest = (number, confirmed)
        for index in entries.indices where entries[index].accepted?.epoch == confirmed.epoch {
            entries[index].epochSeen = true
        }
        if entries.isEmpty, watchers == 0 {
            if letsIdleStateGo { newest = (number, nil) }
            return []
        }
        // A rebase onto this change waits for an answer: keep it, so the rebase can go as far as it may before the
        // next answers come (under a steady stream of dispatches, never all answered).
        if entries.contains(where: { $0.holdsUp(number) }) {
            held.append((number, confirmed))
            if held.count > Self.maximumHeldBases { held.removeFirst() }
        }
        return rebase()
    }

    /// Time passed: a dispatch not accepted within ``pendingTimeout`` of its dispatch is rolled back `unavailable`
    /// and sent no more; one accepted but not in the confirmed state by its `confirmBy` is rolled back
    /// `notApplied`.
    package mutating func tick(now: ContinuousClock.Instant) -> [Action] {
        var output: [Action] = []
        var index = entries.startIndex
        while index < entries.endIndex {
            let entry = entries[index]
            let error: ClientError
            if let (_, seqs) = entry.accepted {
                guard let confirmBy = entry.confirmBy, confirmBy <= now else {
                    index += 1
                    continue
                }
                error = ClientError(
                    code: .notApplied,
                    "the daemon committed seqs \(seqs), but this replica has not applied them by the time "
                        + "ReplicaConfiguration.readYourWritesTimeout allowed (it is at seq \(base.seq))"
                )
            } else {
                guard now - entry.dispatchedAt >= pendingTimeout else {
                    index += 1
                    continue
                }
                output.append(.abandon(entry.number))
                error = ClientError(
                    code: .unavailable,
                    "no daemon accepted the dispatch within \(pendingTimeout) of it "
                        + "(ReplicaConfiguration.pendingTimeout; sent \(entry.tries) times): given up and sent no "
                        + "more, its outcome unknown (the confirmed state holds it if a daemon applied it); is the "
                        + "daemon running?"
                )
            }
            entries.remove(at: index)
            output.append(.rollBack(number: entry.number, actions: entry.actions, outcome: entry.outcome, error: error))
        }
        return output.isEmpty ? [] : output + rebase(removed: true)
    }

    /// When ``tick(now:)`` has something to do: the earliest bound of a pending dispatch.
    package var nextDeadline: ContinuousClock.Instant? {
        entries.lazy.map { $0.confirmBy ?? ($0.dispatchedAt + self.pendingTimeout) }.min()
    }

    /// The newest confirmed change's state, when it was not kept (see `newest`): `current`, the local store's state now
    /// — that change's, or a later one's whose change has yet to be told (which only makes a rebase wait less long
    /// than it could, never go past a dispatch it holds up: nothing was pending when the state was let go).
    package mutating func restore(_ current: @autoclosure () -> Replicated<D.State>) {
        if let (number, state) = newest, state == nil { newest = (number, current()) }
    }

    /// A subscription to the optimistic state starts: the state is rebuilt on the newest confirmed state now, and
    /// on every confirmed change while it lasts.
    package mutating func watch() -> [Action] {
        watchers += 1
        // The newest read goes out whether or not the rebase made one: the published one may be older.
        return rebase().filter {
            if case .publish = $0 { return false }
            return true
        } + [.publish(read)]
    }

    /// A subscription to the optimistic state ended.
    package mutating func unwatch() {
        watchers -= 1
    }

    /// Rebuilds the optimistic state on the newest confirmed state it may take, if it lags.
    package mutating func catchUp() -> [Action] {
        rebase()
    }

    /// The replica stopped: every pending dispatch fails with `error`, and the optimistic state is the last
    /// confirmed one.
    package mutating func stop(_ error: ClientError) -> [Action] {
        let output: [Action] = entries.map {
            .rollBack(number: $0.number, actions: $0.actions, outcome: $0.outcome, error: error)
        }
        entries.removeAll()
        held.removeAll()
        return output + rebase(removed: true)
    }

    // MARK: - The rebase

    /// Rebuilds the optimistic state on the newest confirmed change no unanswered dispatch holds up: the
    /// dispatches it holds leave the pending list and their handles resolve; those accepted in an epoch the replica
    /// has since left (the daemon lost that history) are rolled back `notApplied`; the others are applied again on
    /// top. With `removed` (a dispatch left the list), the state is rebuilt on the same base when no rebase can go.
    ///
    /// A rebase onto a confirmed change waits while a dispatch sent before that change arrived is unanswered: the
    /// change may hold it (events do not say who sent them), and rebuilding then would show the action twice.
    private mutating func rebase(removed: Bool = false) -> [Action] {
        let limit = entries.compactMap { $0.accepted == nil ? $0.heardAtSend : nil }.min()
        var target = newest.flatMap { newest in newest.base.map { (number: newest.number, base: $0) } }
        if let limit, let last = target, last.number > limit {
            target = held.last { $0.number <= limit }
        }
        guard let (number, confirmed) = target, number > baseNumber else {
            guard removed else { return [] }
            replay()
            return changed()
        }
        held.removeAll { $0.number <= number }
        base = confirmed
        baseNumber = number
        var output: [Action] = []
        entries.removeAll { entry in
            guard let (epoch, seqs) = entry.accepted else { return false }
            if epoch == confirmed.epoch {
                guard seqs.upperBound <= confirmed.seq else { return false }
                output.append(.resolve(entry.outcome, seqs))
                return true
            }
            guard entry.epochSeen else { return false }
            let error = ClientError(
                code: .notApplied,
                "the daemon accepted the action at seqs \(seqs) of epoch \(epoch), then started a new history "
                    + "(epoch \(confirmed.epoch.map { "\($0)" } ?? "none")): its journal was lost or replaced, and "
                    + "the new one does not hold the action; dispatch it again if it still applies"
            )
            output.append(.rollBack(number: entry.number, actions: entry.actions, outcome: entry.outcome, error: error))
            return true
        }
        replay()
        return output + changed()
    }

    /// The optimistic state again: the base and every pending entry that still validates on what is before it. An
    /// entry the base no longer allows is left out, whole, until the daemon decides it (a reducer only ever sees
    /// actions its validator accepted on that very state).
    private mutating func replay() {
        state = base.state
        for index in entries.indices {
            let leftOut = (try? Self.validate(entries[index].actions, on: state)) == nil
            entries[index].leftOut = leftOut
            guard !leftOut else { continue }
            for action in entries[index].actions { D.reduce(into: &state, action, by: .unknown) }
        }
    }

    /// The read changed: a new version, published when someone watches.
    private mutating func changed() -> [Action] {
        version += 1
        return watchers > 0 ? [.publish(read)] : []
    }

    /// Validates `actions` in turn, each on the state the ones before it leave: as the daemon validates a batch.
    static func validate(_ actions: [D.Action], on state: D.State) throws(Rejection) {
        guard actions.count > 1 else {
            if let action = actions.first { try D.validate(action, in: state, by: .unknown) }
            return
        }
        var scratch = state
        for (index, action) in actions.enumerated() {
            do throws(Rejection) {
                try D.validate(action, in: scratch, by: .unknown)
            } catch {
                throw Rejection(code: error.code, "action \(index) of the batch: \(error.reason)")
            }
            D.reduce(into: &scratch, action, by: .unknown)
        }
    }
}
