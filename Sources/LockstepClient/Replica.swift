import Foundation
import Lockstep
import LockstepProtocol
import Logging
import ServiceLifecycle
import ZeroMQ

/// A store in this process that stays in lockstep with the daemon's store of domain `D`.
///
/// It runs the domain's reducer over the actions the daemon sequenced, in seq order, and nothing else: it
/// joins without loss (subscribe, keep what arrives, install a snapshot, apply the rest), repairs a gap by
/// range (or by snapshot when the journal was compacted), and starts over on a new epoch, a digest mismatch
/// or a silent daemon. Its state is never a mix: a batch is applied whole before anyone sees it.
///
/// ``run()`` is the replica's life: a thread that owns its two sockets until the task is cancelled or the
/// service group shuts down. ``dispatch(_:)`` may be called from any task, many at once; the requests
/// pipeline on one DEALER socket.
///
/// ```swift
/// let replica = try Replica(Todos.self)
/// try await withThrowingDiscardingTaskGroup { group in
///     group.addTask { try await replica.run() }
///     let seq = try await replica.dispatch(.add(text: "milk"))
///     print(seq, replica.state.list)  // the todo is there: read-your-writes
///     group.cancelAll()
/// }
/// ```
public final class Replica<D: Domain>: Service, Sendable {
    /// The store on the daemon this replica follows: the domain's name.
    public let store: StoreName
    /// The endpoints, timeouts and sync settings the replica was made with.
    public let configuration: ReplicaConfiguration
    /// The first half of this replica's idempotency keys.
    public let clientID: ClientID
    fileprivate let logger: Logger
    fileprivate let local: Store<Replicated<D.State>, Change>
    /// The optimistic view: the confirmed state and this replica's pending optimistic dispatches on top. Its base
    /// lags while nothing is pending and no subscription watches it (see ``rebase(removing:)``).
    fileprivate let optimistic: Store<Projection<D>, Projection<D>.Change>
    fileprivate let shared = LockedValue(Shared())
    private let wakeup: Wakeup

    /// What the replica's thread does to the local store: the only two ways its state changes.
    enum Change: Encodable, Sendable {
        case install(Replicated<D.State>)
        case apply(firstSeq: SequenceNumber, [D.Action])
    }

    /// A replica of `domain`'s store, reaching the daemon as `configuration` says; not running until ``run()``.
    ///
    /// It logs through `logger` (by default the task-local `Logger.current`, so an application's `withLogger`
    /// scope and its metadata apply), with the store's name as `store` metadata.
    public init(
        _ domain: D.Type = D.self,
        configuration: ReplicaConfiguration = ReplicaConfiguration(),
        logger: Logger = .current
    ) throws {
        guard !configuration.daemons.isEmpty,
            !configuration.daemons.contains(where: { $0.command.isEmpty || $0.events.isEmpty })
        else {
            throw ClientError(
                code: .badRequest,
                "ReplicaConfiguration.daemons must name at least one daemon, each with a command and an events "
                    + "endpoint; it is \(configuration.daemons)"
            )
        }
        store = try StoreName(D.name)
        self.configuration = configuration
        clientID = configuration.clientID ?? .random()
        var logger = logger
        logger[metadataKey: "store"] = "\(D.name)"
        self.logger = logger
        wakeup = try Wakeup()
        local = Store(
            name: D.name,
            initialState: Replicated(epoch: nil, seq: 0, state: D.initialState),
            reducer: Reducer { replicated, change in
                switch change {
                case let .install(snapshot):
                    replicated = snapshot
                case let .apply(firstSeq, actions):
                    for action in actions { D.reduce(into: &replicated.state, action) }
                    replicated.seq = firstSeq + SequenceNumber(actions.count) - 1
                }
            },
            observers: ActionObservers()
        )
        optimistic = Store(
            name: D.name,
            initialState: Projection(base: Replicated(epoch: nil, seq: 0, state: D.initialState)),
            reducer: Projection<D>.reducer,
            observers: ActionObservers()
        )
    }

    // MARK: - Observation

    /// The confirmed state with its epoch and seq, read at once.
    public var current: Replicated<D.State> { local.state }

    /// The optimistic state: the confirmed one with this replica's pending optimistic dispatches on top (equal to
    /// ``confirmedState`` when none is pending). See ``ReplicaView``.
    public var state: D.State {
        // With nothing pending the optimistic state is the confirmed one; read it there, so a `dispatch` that
        // returned is in `state` (read-your-writes) even before the optimistic view has taken the change.
        let projection = optimistic.state
        return projection.pending.isEmpty ? local.state.state : projection.view.state
    }

    /// The confirmed state: the daemon's, after exactly the actions up to ``seq``.
    public var confirmedState: D.State { local.state.state }

    /// The seq of the confirmed state.
    public var seq: SequenceNumber { local.state.seq }

    /// The optimistic dispatches the confirmed state does not hold yet, oldest first.
    public var pending: [PendingAction] {
        shared.withLockedValue { shared in
            shared.pending.keys.sorted().map { number in
                let record = shared.pending[number]!
                let status: PendingAction.Status =
                    if let (epoch, seqs) = record.accepted {
                        .accepted(epoch: epoch, seqs: seqs)
                    } else if record.tries > 0 {
                        .sent(tries: record.tries)
                    } else {
                        .queued
                    }
                return PendingAction(
                    requestNumber: number,
                    actions: record.actions.map { String(decoding: $0, as: UTF8.self) },
                    dispatchedAt: record.dispatchedAt,
                    status: status
                )
            }
        }
    }

    /// Where the replica stands.
    public var status: ReplicaStatus {
        shared.withLockedValue { shared in
            var status = shared.status
            status.pendingActions = shared.pendingActions
            return status
        }
    }

    /// Calls `onChange` with the selected part of the state now, and once each time it changes: of the optimistic
    /// state unless `view` says `.confirmed`.
    @discardableResult
    public func subscribe<Value: Equatable & Sendable>(
        _ select: @escaping @Sendable (D.State) -> Value,
        view: ReplicaView = .optimistic,
        onChange: @escaping @Sendable (Value) -> Void
    ) -> Cancellation {
        switch view {
        case .confirmed: local.subscribe({ select($0.state) }, onChange: onChange)
        case .optimistic: watchingOptimistic({ select($0.view.state) }, onChange: onChange)
        }
    }

    /// Every (epoch, seq, state) the replica reaches from now on, starting with the current one. In the optimistic
    /// view (the default) the epoch and seq are the confirmed state's that the optimistic one is built on.
    public func states(
        view: ReplicaView = .optimistic,
        bufferingPolicy: AsyncStream<Replicated<D.State>>.Continuation.BufferingPolicy = .unbounded
    ) -> AsyncStream<Replicated<D.State>> {
        switch view {
        case .confirmed:
            return local.states(bufferingPolicy: bufferingPolicy)
        case .optimistic:
            let (stream, continuation) = AsyncStream.makeStream(
                of: Replicated<D.State>.self,
                bufferingPolicy: bufferingPolicy
            )
            let subscription = watchingOptimistic({ $0.view }, onChange: { continuation.yield($0) })
            continuation.onTermination = { _ in subscription.cancel() }
            return stream
        }
    }

    /// A subscription to the optimistic store (``subscribe(_:view:onChange:)``, ``states(view:bufferingPolicy:)``)
    /// that starts on the newest confirmed state; while it lasts, the store is rebuilt on every confirmed change
    /// (see ``rebase(removing:)``).
    private func watchingOptimistic<Value: Equatable & Sendable>(
        _ select: @escaping @Sendable (Projection<D>) -> Value,
        onChange: @escaping @Sendable (Value) -> Void
    ) -> Cancellation {
        shared.withLockedValue { $0.optimisticWatchers += 1 }
        // Nothing from before the catch-up: a rebase decided on another thread may still be on its way to the store.
        let due = rebase()
        let subscription = optimistic.subscribe({ $0.rebases >= due ? select($0) : nil }) { value in
            if let value { onChange(value) }
        }
        return Cancellation { [shared] in
            subscription.cancel()
            shared.withLockedValue { $0.optimisticWatchers -= 1 }
        }
    }

    /// The optimistic dispatches rolled back from now on: rejected by the daemon, or lost. Each also fails its
    /// dispatch's handle.
    public func rollbacks() -> AsyncStream<OptimisticRollback> {
        listen(\.rollbackListeners)
    }

    /// Resyncs and divergences from now on. Each is also logged and counted in ``status``.
    public func notices() -> AsyncStream<ReplicaNotice> {
        listen(\.listeners)
    }

    /// A stream of what the replica hands to the listeners at `listeners`; ending it ends the listening.
    private func listen<Element>(
        _ listeners: WritableKeyPath<Shared, [UInt64: AsyncStream<Element>.Continuation]> & Sendable
    ) -> AsyncStream<Element> {
        let (stream, continuation) = AsyncStream.makeStream(of: Element.self)
        let id = shared.withLockedValue { shared in
            shared.nextListener += 1
            shared[keyPath: listeners][shared.nextListener] = continuation
            return shared.nextListener
        }
        continuation.onTermination = { [shared] _ in
            _ = shared.withLockedValue { $0[keyPath: listeners].removeValue(forKey: id) }
        }
        return stream
    }

    /// Returns once the replica is live (joined and caught up with what it heard), or throws
    /// ``ClientError/Code/unavailable`` after `timeout`.
    public func waitUntilLive(timeout: Duration = .seconds(10)) async throws {
        let deadline = ContinuousClock.now + timeout
        while status.phase != .live {
            guard ContinuousClock.now < deadline, status.phase != .stopped else {
                let status = self.status
                throw ClientError(
                    code: .unavailable,
                    "the replica of '\(store)' is still \(status.phase) after \(timeout) (at seq \(status.lastSeq)"
                        + "\(status.problem.map { "; \($0)" } ?? "")); is the daemon running at "
                        + "\(configuration.commandEndpoints) and hosting '\(store)'?"
                )
            }
            try await Task.sleep(for: .milliseconds(5))
        }
    }

    // MARK: - Dispatch

    /// Sends `action` to the daemon and returns its seq once this replica has applied it.
    ///
    /// Throws the domain's `Rejection` (with the daemon's reason) when the validator refused it, or a
    /// ``ClientError``: `unavailable` after every retry went unanswered, `refused` when the daemon would not
    /// take the request (another domain version, an unknown store), `notApplied` when it was committed but
    /// this replica could not apply it in time. A retry after a silence carries the same idempotency key, so
    /// the action is applied at most once.
    @discardableResult
    public func dispatch(_ action: D.Action) async throws -> SequenceNumber {
        try await dispatch(batch: [action]).upperBound
    }

    /// Sends `actions` as one batch, sequenced together or not at all, and returns their seqs once this
    /// replica has applied them. A rejection names the action's index in the batch.
    @discardableResult
    public func dispatch(batch actions: [D.Action]) async throws -> ClosedRange<SequenceNumber> {
        let frames = try Self.encode(actions, "dispatch(batch:)")
        let outcome = DispatchOutcome()
        let queued = shared.withLockedValue { shared in
            guard !shared.stopped else { return false }
            shared.lastRequestID += 1
            shared.outbox.append(Outgoing(number: shared.lastRequestID, actions: frames, outcome: outcome))
            return true
        }
        guard queued else { throw ClientError(code: .stopped, "the replica of '\(store)' has stopped") }
        wakeup.signal()
        return try await outcome.value
    }

    /// Applies `action` to the optimistic state at once and sends it to the daemon; returns at once with a handle
    /// to the seq it gets. See ``dispatchOptimistically(batch:)``.
    @discardableResult
    public func dispatchOptimistically(_ action: D.Action) async throws -> OptimisticDispatch {
        try await dispatchOptimistically(batch: [action])
    }

    /// Validates `actions` against the optimistic state and applies them to it at once, then sends them to the
    /// daemon as one batch; returns without waiting for the daemon, with a handle to the seqs they get.
    ///
    /// Throws at once, sending nothing, when the domain's validator refuses them here (its `Rejection`), when they
    /// cannot be encoded (`badRequest`), when the replica has stopped (`stopped`), or when it already holds
    /// ``ReplicaConfiguration/maximumPending`` actions the daemon has not confirmed (`tooManyPending`).
    ///
    /// Until the confirmed state holds them they stay pending: applied again on top of each new confirmed state,
    /// sent again with the same idempotency key after a silence or a daemon restart for as long as the replica
    /// runs, so the daemon applies them at most once. When the daemon rejects them, they leave the optimistic
    /// state, the handle throws the rejection and ``rollbacks()`` tells. docs/optimistic.md has the whole model.
    public func dispatchOptimistically(batch actions: [D.Action]) async throws -> OptimisticDispatch {
        let frames = try Self.encode(actions, "dispatchOptimistically(batch:)")
        let outcome = DispatchOutcome()
        let number = try shared.withLockedValue { shared throws(ClientError) in
            guard !shared.stopped else { throw ClientError(code: .stopped, "the replica of '\(store)' has stopped") }
            // Validated against the optimistic state, which means nothing before the first confirmed state is here.
            guard shared.lastConfirmed?.base.epoch != nil else {
                throw ClientError(
                    code: .unavailable,
                    "the replica of '\(store)' has not joined the daemon yet, so it cannot validate an action "
                        + "against its state; wait for waitUntilLive() first"
                )
            }
            guard shared.pendingActions + actions.count <= configuration.maximumPending else {
                throw ClientError(
                    code: .tooManyPending,
                    "the replica of '\(store)' holds \(shared.pendingActions) optimistic actions the daemon has not "
                        + "confirmed, and \(actions.count) more would pass the bound of "
                        + "\(configuration.maximumPending) (ReplicaConfiguration.maximumPending); wait for some to be "
                        + "confirmed"
                )
            }
            shared.lastRequestID += 1
            shared.pendingActions += actions.count
            shared.pending[shared.lastRequestID] = PendingRecord(
                actions: frames,
                dispatchedAt: .now,
                outcome: outcome
            )
            return shared.lastRequestID
        }
        // Pending now, so the optimistic state is rebuilt on the newest confirmed one (it may not have been, while
        // nothing was pending and no one watched it) before the actions are validated on top.
        await optimisticRebased(through: rebase())
        do {
            try await optimistic.dispatch(.add(Projection.Entry(requestNumber: number, actions: actions)))
        } catch {
            _ = shared.withLockedValue { $0.forget(number) }
            throw error
        }
        let queued = shared.withLockedValue { shared in
            guard !shared.stopped else { return false }
            shared.outbox.append(Outgoing(number: number, actions: frames, outcome: outcome, optimistic: true))
            return true
        }
        if queued {
            wakeup.signal()
        } else {
            // Stopped meanwhile: the stop may have taken the dispatch out before it was in the optimistic state.
            optimistic.send(.remove([number]))
            outcome.fail(ClientError(code: .stopped, "the replica of '\(store)' has stopped"))
        }
        return OptimisticDispatch(requestNumber: number, outcome: outcome)
    }

    /// The actions in canonical JSON, or a `badRequest` naming the one that cannot be encoded.
    private static func encode(_ actions: [D.Action], _ function: String) throws(ClientError) -> [Frame] {
        guard !actions.isEmpty else {
            throw ClientError(code: .badRequest, "\(function) needs at least one action; it got none")
        }
        var frames: [Frame] = []
        frames.reserveCapacity(actions.count)
        for (index, action) in actions.enumerated() {
            do {
                frames.append(Array(try CanonicalEncoding.encode(action)))
            } catch {
                throw ClientError(
                    code: .badRequest,
                    "action \(index) cannot be encoded as JSON: \(CanonicalEncoding.describe(error))"
                )
            }
        }
        return frames
    }

    // MARK: - Life

    /// Runs the replica until the task is cancelled or a graceful shutdown begins; then fails what is still
    /// waiting with ``ClientError/Code/stopped`` and returns. A replica runs once.
    public func run() async throws {
        let first = shared.withLockedValue { shared in
            defer { shared.started = true }
            return !shared.started
        }
        guard first else { throw ClientError(code: .stopped, "this replica of '\(store)' already ran; make a new one") }
        try await withTaskCancellationHandler {
            try await withGracefulShutdownHandler {
                try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                    let thread = Thread { [self] in
                        nameCurrentThread("replica \(D.name)")
                        do {
                            try self.loop()
                            continuation.resume()
                        } catch {
                            continuation.resume(throwing: error)
                        }
                    }
                    thread.name = "lockstep replica \(D.name)"
                    thread.start()
                }
            } onGracefulShutdown: {
                self.stop()
            }
        } onCancel: {
            self.stop()
        }
    }

    private func stop() {
        shared.withLockedValue { $0.stopRequested = true }
        wakeup.signal()
    }

    // MARK: - The replica's thread

    /// The loop: it alone touches the sockets and the sync machine.
    private func loop() throws {
        defer { finish() }
        let context = try Context()
        defer { context.shutdown() }
        var link = try Link(context: context, configuration: configuration, topic: Event.runTopic(for: store))
        defer { link.close() }
        var engine = Engine(replica: self, sync: ReplicaSync(settings: configuration.sync, now: .now))
        let start = engine.sync.start(now: .now)
        try engine.perform(start, on: &link)
        do {
            try turns(&engine, &link)
        } catch {
            engine.failAll([], ClientError(code: .stopped, "the replica of '\(store)' stopped: \(error)"))
            throw error
        }
    }

    /// Turns until a stop is asked for; what is in flight is failed on the way out.
    private func turns(_ engine: inout Engine<D>, _ link: inout Link) throws {
        while true {
            let now = ContinuousClock.now
            let timeout = min(engine.nextDeadline(after: now), now + .milliseconds(100)) - now
            let ready = try Poller([
                .socket(link.events, .readable), .socket(link.commands, .readable),
                .fileDescriptor(wakeup.descriptor, .readable),
            ]).poll(timeout: max(.zero, timeout))
            // Woken far later than asked: this process was stopped, and the silence meanwhile is not the daemon's.
            let woke = ContinuousClock.now
            if woke - now > max(.zero, timeout) + .seconds(1) { engine.sync.resumed(now: woke) }
            if ready[2].contains(.readable) { wakeup.drain() }
            let (outbox, stopRequested) = shared.withLockedValue { shared in
                defer { shared.outbox.removeAll() }
                return (shared.outbox, shared.stopRequested)
            }
            if stopRequested {
                engine.failAll(outbox, ClientError(code: .stopped, "the replica of '\(store)' stopped"))
                return
            }
            try engine.send(outbox, on: &link)
            if ready[0].contains(.readable) { try engine.readEvents(from: &link) }
            if ready[1].contains(.readable) { try engine.readReplies(from: &link) }
            try engine.tick(on: &link)
            shared.withLockedValue { $0.status = engine.status }
        }
    }

    /// After the loop: nothing more will be answered.
    private func finish() {
        let (outbox, waiters, listeners, rollbackListeners, pending) = shared.withLockedValue { shared in
            shared.stopped = true
            shared.status.phase = .stopped
            defer {
                shared.outbox.removeAll()
                shared.waiters.removeAll()
                shared.listeners.removeAll()
                shared.rollbackListeners.removeAll()
                shared.pending.removeAll()
                shared.pendingActions = 0
            }
            return (shared.outbox, shared.waiters, shared.listeners, shared.rollbackListeners, shared.pending)
        }
        let error = ClientError(code: .stopped, "the replica of '\(store)' stopped before the action was applied here")
        for outgoing in outbox { outgoing.outcome.fail(error) }
        for waiter in waiters { waiter.outcome.fail(error) }
        for record in pending.values { record.outcome.fail(error) }
        for listener in listeners.values { listener.finish() }
        for listener in rollbackListeners.values { listener.finish() }
        // What was never confirmed leaves the optimistic state: it shows the daemon's last word.
        if !pending.isEmpty { optimistic.send(.remove(Set(pending.keys))) }
    }

    /// The local store reached `seq` of `epoch`: wake the dispatches waiting for it. Runs on whichever thread
    /// applied the change.
    fileprivate func applied(epoch: Epoch, seq: SequenceNumber) {
        let ready = shared.withLockedValue { shared in
            var ready: [Waiter] = []
            shared.waiters.removeAll { waiter in
                guard waiter.epoch == epoch, waiter.seqs.upperBound <= seq else { return false }
                ready.append(waiter)
                return true
            }
            return ready
        }
        for waiter in ready { waiter.outcome.resolve(.success(waiter.seqs)) }
    }

    fileprivate func notify(_ notice: ReplicaNotice) {
        for listener in shared.withLockedValue({ Array($0.listeners.values) }) { listener.yield(notice) }
    }

    /// Hands `change` (the confirmed change `number`) to the local store; once applied, the dispatches waiting for
    /// it are answered and the optimistic state is rebuilt on it (when something is pending or watches it).
    fileprivate func apply(_ change: Change, number: UInt64, epoch: Epoch, seq: SequenceNumber) {
        local.send(change) { [self] _ in
            // Still on the thread that applied the change, before the store takes its next one: this is its state.
            let base = local.state
            shared.withLockedValue { shared in
                shared.lastConfirmed = (number, base)
                for (requestNumber, record) in shared.pending where record.accepted?.epoch == base.epoch {
                    shared.pending[requestNumber]?.epochSeen = true
                }
                // A rebase onto this change waits for an answer: keep the change, so the rebase can go as far as it
                // may before the next answers come (under a steady stream of dispatches, never all answered).
                if shared.pending.values.contains(where: { $0.holdsUp(number) }) {
                    shared.heldBases.append((number, base))
                    if shared.heldBases.count > Shared.maximumHeldBases { shared.heldBases.removeFirst() }
                }
            }
            rebase()
            applied(epoch: epoch, seq: seq)
        }
    }

    /// Rebuilds the optimistic state on the newest confirmed state: the optimistic dispatches it holds leave the
    /// pending list and their handles resolve; those accepted in an epoch the replica has since left (the daemon
    /// lost that history) are rolled back, `notApplied`; the others are applied again on top.
    ///
    /// Not while an optimistic dispatch sent before that confirmed change arrived is still unanswered: the change
    /// may hold it, and the replica cannot tell until the answer names its seqs (events do not say who sent them).
    /// Rebuilding then would show the action twice; the optimistic state waits, on the older base, for the answer.
    /// A dispatch sent after the change arrived cannot be in it and never holds a rebase up.
    ///
    /// `removing` (a rollback) leaves the optimistic state in the same change, or alone when no rebase can go.
    ///
    /// Not either while nothing is pending and no subscription watches the optimistic state: it would equal the
    /// confirmed state, which ``state`` then reads. The rebuilding waits until a subscription or an optimistic
    /// dispatch starts, and spares a replica that only follows the daemon a second store change per event.
    ///
    /// Returns the number of rebases decided by now, by this call or another. Each is sent to the optimistic store
    /// right after the lock that decided it, so one may still be on its way: ``optimisticRebased(through:)`` waits.
    @discardableResult
    fileprivate func rebase(removing removed: Set<UInt64> = []) -> UInt64 {
        let (rebase, decided) = shared.withLockedValue { shared -> (Rebase?, UInt64) in
            if removed.isEmpty, shared.pending.isEmpty, shared.optimisticWatchers == 0 { return (nil, shared.rebases) }
            // The newest confirmed change no unanswered dispatch holds up: the last one, or one kept meanwhile.
            let limit = shared.pending.values.compactMap { $0.accepted == nil ? $0.heardAtSend : nil }.min()
            var target = shared.lastConfirmed
            if let limit, let last = target, last.number > limit {
                target = shared.heldBases.last { $0.number <= limit }
            }
            guard let (number, base) = target, number > shared.rebasedThrough else { return (nil, shared.rebases) }
            shared.heldBases.removeAll { $0.number <= number }
            shared.rebasedThrough = number
            shared.rebases += 1
            var rebase = Rebase(base: base, sequence: shared.rebases)
            for (requestNumber, record) in shared.pending {
                guard let (epoch, seqs) = record.accepted else { continue }
                if epoch == base.epoch {
                    if seqs.upperBound <= base.seq { rebase.settled.append((requestNumber, seqs, record.outcome)) }
                } else if record.epochSeen {
                    rebase.lost.append((requestNumber, record))
                }
            }
            for (requestNumber, _, _) in rebase.settled { shared.forget(requestNumber) }
            for (requestNumber, _) in rebase.lost { shared.forget(requestNumber) }
            return (rebase, shared.rebases)
        }
        guard let rebase else {
            if !removed.isEmpty { optimistic.send(.remove(removed)) }
            return decided
        }
        // Closures, not key paths: a key path into a tuple of generic types is built at run time on every call.
        var leaving = removed
        for (requestNumber, _, _) in rebase.settled { leaving.insert(requestNumber) }
        for (requestNumber, _) in rebase.lost { leaving.insert(requestNumber) }
        optimistic.send(.rebase(rebase.base, sequence: rebase.sequence, settled: leaving))
        for (_, seqs, outcome) in rebase.settled { outcome.resolve(.success(seqs)) }
        for (requestNumber, record) in rebase.lost {
            guard let (epoch, seqs) = record.accepted else { continue }
            let error = ClientError(
                code: .notApplied,
                "the daemon accepted the action at seqs \(seqs) of epoch \(epoch), then started a new history "
                    + "(epoch \(rebase.base.epoch.map { "\($0)" } ?? "none")): its journal was lost or replaced, and "
                    + "the new one does not hold the action; dispatch it again if it still applies"
            )
            record.outcome.fail(error)
            tell(OptimisticRollback(requestNumber: requestNumber, actions: record.texts, error: error))
        }
        return decided
    }

    /// Returns once the optimistic store has applied rebase `sequence` and every one before it.
    private func optimisticRebased(through sequence: UInt64) async {
        guard optimistic.state.rebases < sequence else { return }
        for await projection in optimistic.states(bufferingPolicy: .bufferingNewest(1))
        where projection.rebases >= sequence {
            return
        }
    }

    /// What one rebase does, worked out under the lock and carried out after it.
    private struct Rebase {
        var base: Replicated<D.State>
        var sequence: UInt64
        var settled: [(UInt64, ClosedRange<SequenceNumber>, DispatchOutcome)] = []
        var lost: [(UInt64, PendingRecord)] = []
    }

    /// Optimistic dispatch `number` will not be confirmed: its handle throws `error`, it leaves the pending list and
    /// the optimistic state, and ``rollbacks()`` tells. A rebase it held up may go on.
    fileprivate func rolledBack(_ number: UInt64, _ error: any Error) {
        guard let record = shared.withLockedValue({ $0.forget(number) }) else { return }
        // Out of the optimistic state, on the newest base it may take, before the handle throws.
        rebase(removing: [number])
        record.outcome.fail(error)
        tell(OptimisticRollback(requestNumber: number, actions: record.texts, error: error))
    }

    /// Logs a rollback and hands it to every ``rollbacks()`` stream.
    private func tell(_ rollback: OptimisticRollback) {
        logger.notice(
            "rolled back an optimistic dispatch",
            metadata: ["request": "\(rollback.requestNumber)", "error": "\(rollback.error)"]
        )
        for listener in shared.withLockedValue({ Array($0.rollbackListeners.values) }) { listener.yield(rollback) }
    }

    fileprivate func nextRequestID() -> UInt64 {
        shared.withLockedValue { shared in
            shared.lastRequestID += 1
            return shared.lastRequestID
        }
    }

    // MARK: - Shared between the loop and callers

    fileprivate struct Shared: Sendable {
        var started = false
        var stopRequested = false
        var stopped = false
        var lastRequestID: UInt64 = 0
        var outbox: [Outgoing] = []
        var waiters: [Waiter] = []
        var status = ReplicaStatus()
        var nextListener: UInt64 = 0
        var listeners: [UInt64: AsyncStream<ReplicaNotice>.Continuation] = [:]
        var rollbackListeners: [UInt64: AsyncStream<OptimisticRollback>.Continuation] = [:]
        /// The optimistic dispatches not confirmed yet, by request number, and how many actions they hold.
        var pending: [UInt64: PendingRecord] = [:]
        var pendingActions = 0
        /// The newest confirmed state and its change's number; the number the optimistic state is built on.
        var lastConfirmed: (number: UInt64, base: Replicated<D.State>)?
        var rebasedThrough: UInt64 = 0
        /// Confirmed changes that arrived while a rebase onto them waited, oldest first, at most
        /// ``maximumHeldBases`` (each keeps a copy of the state alive).
        var heldBases: [(number: UInt64, base: Replicated<D.State>)] = []
        static var maximumHeldBases: Int { 64 }
        /// Rebases sent to the optimistic store, which applies them in this order.
        var rebases: UInt64 = 0
        /// Subscriptions to the optimistic state: while there are some, it is rebuilt even with nothing pending.
        var optimisticWatchers = 0

        @discardableResult
        mutating func forget(_ number: UInt64) -> PendingRecord? {
            guard let record = pending.removeValue(forKey: number) else { return nil }
            pendingActions -= record.actions.count
            return record
        }
    }
}

// What the replica's thread and its callers share, outside the generic `Replica<D>`: types nested in a generic
// type are generic themselves, and unspecialized code looks up their metadata at run time on every use.

private struct Outgoing: Sendable {
    /// The request number of its idempotency key.
    var number: UInt64
    var actions: [Frame]
    var outcome: DispatchOutcome
    var optimistic = false
}

/// An accepted dispatch waiting for this replica to apply its seqs.
private struct Waiter: Sendable {
    var epoch: Epoch
    var seqs: ClosedRange<SequenceNumber>
    var deadline: ContinuousClock.Instant
    var outcome: DispatchOutcome
}

/// An optimistic dispatch the confirmed state does not hold yet.
private struct PendingRecord: Sendable {
    var actions: [Frame]
    var dispatchedAt: ContinuousClock.Instant
    var outcome: DispatchOutcome
    /// How many confirmed changes the replica had handed to its store when it last sent the dispatch after a
    /// time it could not be in the daemon's history (its first send, or a send after `unavailable`).
    var heardAtSend: UInt64?
    var tries = 0
    var accepted: (epoch: Epoch, seqs: ClosedRange<SequenceNumber>)?
    /// When it is rolled back `notApplied` if the confirmed state does not hold it by then.
    var confirmBy: ContinuousClock.Instant?
    /// Whether the confirmed state was of the epoch it was accepted in since: leaving it then loses it.
    var epochSeen = false

    var texts: [String] { actions.map { String(decoding: $0, as: UTF8.self) } }

    /// Whether it holds up a rebase onto confirmed change `number`: unanswered, and sent before that change
    /// arrived, so the change may hold it.
    func holdsUp(_ number: UInt64) -> Bool {
        guard accepted == nil, let heard = heardAtSend else { return false }
        return heard < number
    }
}

/// The replica's two sockets: SUB for events, connected to every daemon (only a leader publishes), and DEALER
/// for requests, connected to the one ``search`` points at. Owned by the replica's thread.
private struct Link {
    let context: Context
    let configuration: ReplicaConfiguration
    var search: LeaderSearch
    var events: Socket
    var commands: Socket

    init(context: Context, configuration: ReplicaConfiguration, topic: [UInt8]) throws {
        self.context = context
        self.configuration = configuration
        search = LeaderSearch(endpoints: configuration.daemons.map(\.command))
        events = try Socket(context, type: .subscriber)
        try events.set(.linger, 0)
        try events.set(.receiveHighWaterMark, Int32(clamping: configuration.eventsQueue))
        try configuration.curve?.configure(events)
        try events.subscribe(topic)
        for daemon in configuration.daemons { try events.connect(daemon.events) }
        commands = try Self.commandSocket(context, configuration, search.endpoint)
        // Every other command endpoint is tried now: one libzmq cannot connect to (a typo) fails the start, not the
        // first failover.
        for endpoint in search.endpoints.dropFirst() {
            try Self.commandSocket(context, configuration, endpoint).close()
        }
    }

    static func commandSocket(
        _ context: Context,
        _ configuration: ReplicaConfiguration,
        _ endpoint: String
    ) throws
        -> Socket
    {
        let socket = try Socket(context, type: .dealer)
        try socket.set(.linger, 0)
        try configuration.curve?.configure(socket)
        try socket.connect(endpoint)
        return socket
    }

    /// Lazy Pirate: a socket whose peer went silent may hold lost requests; start a fresh one, to the daemon
    /// ``search`` points at now.
    mutating func renewCommandSocket() throws {
        commands.close()
        commands = try Self.commandSocket(context, configuration, search.endpoint)
    }

    func send(_ request: Request) {
        // A full queue (no daemon for a long while) counts as lost; the request's timeout sends it again.
        _ = try? commands.send(request.encode(), wait: false)
    }

    func close() {
        events.close()
        commands.close()
    }
}

/// What a dispatch in flight waits with: how many actions it sent, who to answer, and whether it is optimistic
/// (its request number then).
private struct Dispatch {
    var count: Int
    var outcome: DispatchOutcome
    var optimistic: UInt64?
    /// When it was first sent: an optimistic dispatch is sent again until ``ReplicaConfiguration/pendingTimeout``.
    var firstSent: ContinuousClock.Instant
}

/// The replica thread's state: the sync machine, the requests in flight, and what they wait for.
private struct Engine<D: Domain> {
    unowned let replica: Replica<D>
    var sync: ReplicaSync
    /// The dispatches waiting for their reply, retried the Lazy Pirate way.
    var inFlight: LazyPirate<Dispatch>
    var repairs = 0
    var divergences = 0
    var disconnected = false
    var problem: String?
    var divergenceDetail: String?
    /// Actions read in this pass over the events socket and not yet handed to the local store: a pass
    /// applies its in-order events as one change, so the store (and its subscribers) see one run per pass,
    /// not one change per event. Anything else the sync machine asks for hands them over first.
    var unapplied: (epoch: Epoch, firstSeq: SequenceNumber, lastSeq: SequenceNumber, actions: [D.Action])?
    var batching = false
    /// Reads the events' actions: the canonical form's own coder, with Foundation's behind it for anything else.
    let coder = CanonicalEncoding.Coder()
    /// With ``ReplicaConfiguration/evidenceDirectory``: what a divergence's evidence file is made of.
    var evidence: EvidenceRecorder?
    /// How many confirmed changes were handed to the local store: the number of the next one, less one.
    var handed: UInt64 = 0
    /// The optimistic dispatches waiting for a reply, by request number.
    var optimisticInFlight: Set<UInt64> = []
    /// Optimistic dispatches the daemon could not take for now (`unavailable`), sent again at their time.
    var retryLater: [(at: ContinuousClock.Instant, request: Request, dispatch: Dispatch)] = []
    /// When the sync machine's request goes out again, after a `not_leader` from every daemon that answers.
    var syncResendAt: ContinuousClock.Instant?
    /// The request id of the sync machine's newest snapshot or range request: an ERROR answers it only with this id
    /// (an ERROR to an earlier try, or to a dispatch sent twice, says nothing about the store now).
    var lastSyncRequest: UInt64 = 0

    init(replica: Replica<D>, sync: ReplicaSync) {
        self.replica = replica
        self.sync = sync
        inFlight = LazyPirate(
            LazyPirate.Settings(timeout: replica.configuration.requestTimeout, retries: replica.configuration.retries)
        )
        evidence = replica.configuration.evidenceDirectory.map {
            EvidenceRecorder(
                directory: $0,
                maximumFiles: replica.configuration.maximumEvidenceFiles,
                maximumBytes: replica.configuration.maximumEvidenceBytes
            )
        }
    }

    var store: StoreName { replica.store }
    var configuration: ReplicaConfiguration { replica.configuration }

    var status: ReplicaStatus {
        var status = ReplicaStatus()
        switch sync.phase {
        case _ where disconnected: status.phase = .disconnected
        case .joining: status.phase = .joining
        case .live: status.phase = .live
        case .repairing: status.phase = .repairing
        }
        status.epoch = sync.epoch
        status.lastSeq = sync.lastSeq
        status.daemonSeq = sync.daemonSeq
        status.resyncs = sync.resyncCount
        status.repairs = repairs
        status.divergences = divergences
        status.problem = problem
        return status
    }

    func nextDeadline(after now: ContinuousClock.Instant) -> ContinuousClock.Instant {
        let next = min(inFlight.nextDeadline ?? now + .seconds(1), syncResendAt ?? now + .seconds(1))
        return retryLater.reduce(next) { min($0, $1.at) }
    }

    // MARK: Dispatches

    mutating func send(_ outbox: [Outgoing], on link: inout Link) throws {
        let now = ContinuousClock.now
        for outgoing in outbox {
            let request = Request.dispatch(
                DispatchRequest(
                    requestID: outgoing.number,
                    domainVersion: D.version,
                    clientID: replica.clientID,
                    store: store,
                    actions: outgoing.actions
                )
            )
            let dispatch = Dispatch(
                count: outgoing.actions.count,
                outcome: outgoing.outcome,
                optimistic: outgoing.optimistic ? outgoing.number : nil,
                firstSent: now
            )
            if outgoing.optimistic { optimisticInFlight.insert(outgoing.number) }
            try perform(inFlight.submit(request, dispatch, now: now), on: &link)
        }
    }

    /// Carries out what the Lazy Pirate machine asks for.
    mutating func perform(_ outputs: [LazyPirate<Dispatch>.Output], on link: inout Link) throws {
        var again: [(Request, Dispatch)] = []
        for output in outputs {
            switch output {
            case let .send(request):
                link.send(request)
                if optimisticInFlight.contains(request.requestID) { sentOptimistic(request.requestID) }
            case .renewSocket:
                try moveOn(.dispatchUnanswered, &link, now: .now)
            case let .gaveUp(request, dispatch, _)
            where dispatch.optimistic != nil && .now - dispatch.firstSent < configuration.pendingTimeout:
                // An optimistic dispatch stays pending through a daemon restart: sent again, with its key.
                again.append((request, dispatch))
            case let .gaveUp(_, dispatch, tries):
                guard let number = dispatch.optimistic else {
                    dispatch.outcome.fail(
                        ClientError(
                            code: .unavailable,
                            "no reply from \(configuration.daemonsPhrase) after \(tries) tries of "
                                + "\(configuration.requestTimeout) each; is the daemon running, and is the endpoint "
                                + "right?"
                        )
                    )
                    continue
                }
                optimisticInFlight.remove(number)
                replica.rolledBack(
                    number,
                    ClientError(
                        code: .unavailable,
                        "no reply from \(configuration.daemonsPhrase) for "
                            + "\(configuration.pendingTimeout) (ReplicaConfiguration.pendingTimeout): given up, its "
                            + "outcome unknown (the confirmed state holds it if the daemon applied it); is the daemon "
                            + "running?"
                    )
                )
            }
        }
        // After the outputs above, so on the renewed socket.
        let now = ContinuousClock.now
        for (request, dispatch) in again { try perform(inFlight.submit(request, dispatch, now: now), on: &link) }
    }

    /// Why requests move to another daemon's command socket.
    enum Move {
        /// A dispatch's try timed out (the Lazy Pirate machine sends what is in flight again itself).
        case dispatchUnanswered
        /// A snapshot or range request timed out (the sync machine sends it again itself).
        case syncUnanswered
        /// The daemon answered `not_leader`.
        case notLeader
    }

    /// Requests go to the next daemon (``LeaderSearch``) on a fresh socket, and what was out on the old one is sent
    /// again there; after a `not_leader` from every daemon that answers, after a pause.
    mutating func moveOn(_ move: Move, _ link: inout Link, now: ContinuousClock.Instant) throws {
        let from = link.search.endpoint
        let because =
            switch move {
            case .notLeader: "not the leader"
            case _ where link.search.currentIsStandingBy: "a standby, and a request's try ran out"
            default: "no answer in time"
            }
        var pause = Duration.zero
        if move == .notLeader {
            pause = link.search.notLeader()
        } else {
            link.search.timedOut()
        }
        try link.renewCommandSocket()
        if link.search.endpoint != from {
            replica.logger.notice(
                "sending to another daemon",
                metadata: [
                    "from": "\(from)", "to": "\(link.search.endpoint)",
                    "because": "\(because)",
                ]
            )
        }
        if move != .dispatchUnanswered { try perform(inFlight.redirect(now: now, pause: pause), on: &link) }
        guard move != .syncUnanswered else { return }
        if pause > .zero {
            syncResendAt = now + pause
        } else {
            try perform(sync.resendRequest(now: now), on: &link)
        }
    }

    /// Optimistic dispatch `number` went out (again): counted, and the first time, when.
    func sentOptimistic(_ number: UInt64) {
        replica.shared.withLockedValue { [handed] shared in
            shared.pending[number]?.tries += 1
            if shared.pending[number]?.heardAtSend == nil { shared.pending[number]?.heardAtSend = handed }
        }
    }

    mutating func failAll(_ outbox: [Outgoing], _ error: ClientError) {
        for outgoing in outbox { outgoing.outcome.fail(error) }
        for (_, dispatch) in inFlight.removeAll() { dispatch.outcome.fail(error) }
        for (_, _, dispatch) in retryLater { dispatch.outcome.fail(error) }
        retryLater.removeAll()
        optimisticInFlight.removeAll()
    }

    /// Answers a dispatch: a rejection or refusal at once (an optimistic one rolled back), an acceptance once this
    /// replica applied it.
    mutating func complete(_ request: Request, _ flight: Dispatch, with reply: Reply) {
        if let number = flight.optimistic { optimisticInFlight.remove(number) }
        let error: any Error
        switch reply {
        case let .accepted(_, epoch, firstSeq, count) where count == flight.count && count > 0:
            let seqs = firstSeq...(firstSeq + SequenceNumber(count) - 1)
            let deadline = ContinuousClock.now + configuration.readYourWritesTimeout
            if let number = flight.optimistic {
                // Confirmed by the rebase onto a confirmed state that holds its seqs; that may be the one this
                // answer held up.
                replica.shared.withLockedValue { shared in
                    shared.pending[number]?.accepted = (epoch, seqs)
                    shared.pending[number]?.confirmBy = deadline
                    shared.pending[number]?.epochSeen = shared.lastConfirmed?.base.epoch == epoch
                }
                replica.rebase()
                return
            }
            let waiter = Waiter(epoch: epoch, seqs: seqs, deadline: deadline, outcome: flight.outcome)
            replica.shared.withLockedValue { $0.waiters.append(waiter) }
            // It may have been applied already (the event can overtake the reply).
            let current = replica.local.state
            if let applied = current.epoch, applied == epoch, current.seq >= seqs.upperBound {
                replica.applied(epoch: applied, seq: current.seq)
            }
            return
        case let .rejected(_, index, rejection):
            error =
                flight.count == 1
                ? rejection : Rejection(code: rejection.code, "action \(index) of the batch: \(rejection.reason)")
        case let .error(_, refusal) where refusal.code == .unavailable || refusal.code == .notLeader:
            // Nothing was applied and a retry with the same key is safe: an optimistic dispatch is sent again after
            // a request's timeout; the caller of another may try again later.
            if let number = flight.optimistic {
                retryLater.append((.now + configuration.requestTimeout, request, flight))
                // Not in any history until it is sent again: it holds no rebase up meanwhile.
                replica.shared.withLockedValue { $0.pending[number]?.heardAtSend = nil }
                replica.rebase()
                return
            }
            error = ClientError(code: .unavailable, "the daemon could not take the dispatch now: \(refusal)")
        case let .error(_, refusal):
            error = ClientError(code: .refused, "the daemon refused the dispatch to '\(store)': \(refusal)")
        default:
            error = ClientError(code: .protocolViolation, "the daemon answered a dispatch with \(reply)")
        }
        if let number = flight.optimistic { replica.rolledBack(number, error) } else { flight.outcome.fail(error) }
    }

    // MARK: Inputs

    mutating func readEvents(from link: inout Link) throws {
        batching = true
        defer {
            batching = false
            handOver()
        }
        for _ in 0..<10_000 {
            guard let frames = try link.events.receive(wait: false) else { return }
            let now = ContinuousClock.now
            disconnected = false
            let event: Event
            do {
                event = try Event.decode(frames)
            } catch {
                // A daemon of a later protocol would be refused here, by name, not followed blindly.
                replica.logger.warning(
                    "ignored an unreadable message on the events socket",
                    metadata: ["frames": "\(frames.count)", "error": "\(error)"]
                )
                continue
            }
            guard event.store == store else { continue }
            switch event {
            case let .events(_, epoch, firstSeq, actions):
                try perform(sync.events(epoch: epoch, firstSeq: firstSeq, actions: actions, now: now), on: &link)
            case let .event(_, epoch, seq, action):
                try perform(sync.event(epoch: epoch, seq: seq, action: action, now: now), on: &link)
            case let .heartbeat(_, epoch, lastSeq):
                try perform(sync.heartbeat(epoch: epoch, lastSeq: lastSeq, now: now), on: &link)
            case let .digest(_, epoch, seq, digest):
                try perform(sync.digest(epoch: epoch, seq: seq, digest: digest, now: now), on: &link)
            }
        }
    }

    mutating func readReplies(from link: inout Link) throws {
        for _ in 0..<10_000 {
            guard let frames = try link.commands.receive(wait: false) else { return }
            let now = ContinuousClock.now
            let reply: Reply
            do {
                reply = try Reply.decode(frames)
            } catch {
                replica.logger.warning(
                    "ignored an unreadable reply",
                    metadata: ["endpoint": "\(link.search.endpoint)", "error": "\(error)"]
                )
                continue
            }
            if case let .error(_, error) = reply, error.code == .notLeader, link.search.endpoints.count > 1 {
                // A standby: nothing was applied; the request goes on at the next daemon that may lead.
                try moveOn(.notLeader, &link, now: now)
                continue
            }
            link.search.answered()
            if let (request, dispatch) = inFlight.answered(reply.requestID) {
                complete(request, dispatch, with: reply)
                continue
            }
            switch reply {
            case let .snapshot(_, snapshot) where snapshot.store == store:
                problem = nil
                try perform(
                    sync.snapshot(
                        epoch: snapshot.epoch,
                        seq: snapshot.seq,
                        digest: snapshot.digest,
                        state: snapshot.state,
                        now: now
                    ),
                    on: &link
                )
            case let .range(_, name, epoch, firstSeq, actions) where name == store:
                try perform(sync.range(epoch: epoch, firstSeq: firstSeq, actions: actions, now: now), on: &link)
            case let .compacted(_, name, epoch, firstAvailable) where name == store:
                try perform(sync.compacted(epoch: epoch, firstAvailable: firstAvailable, now: now), on: &link)
            case let .error(requestID, error) where error.code == .invalidRange && requestID == lastSyncRequest:
                try perform(sync.rangeRefused(now: now), on: &link)
            case let .error(requestID, error) where requestID == lastSyncRequest:
                if problem == nil {
                    replica.logger.error(
                        "the daemon refused to serve the store",
                        metadata: ["store": "\(store)", "error": "\(error)"]
                    )
                }
                problem = "the daemon refused to serve '\(store)': \(error)"
            default:
                break  // the answer to a dispatch that already timed out, or to an older request (a resend's twin)
            }
        }
    }

    /// Resends what went unanswered, gives up on what ran out of tries, and lets the sync machine see time pass.
    mutating func tick(on link: inout Link) throws {
        let now = ContinuousClock.now
        try perform(inFlight.tick(now: now), on: &link)
        if let at = syncResendAt, at <= now {
            syncResendAt = nil
            try perform(sync.resendRequest(now: now), on: &link)
        }
        if retryLater.contains(where: { $0.at <= now }) {
            let due = retryLater.filter { $0.at <= now }
            retryLater.removeAll { $0.at <= now }
            for (_, request, dispatch) in due {
                if let number = dispatch.optimistic { optimisticInFlight.insert(number) }
                try perform(inFlight.submit(request, dispatch, now: now), on: &link)
            }
        }
        let late = replica.shared.withLockedValue { shared in
            var late: [Waiter] = []
            shared.waiters.removeAll { waiter in
                guard waiter.deadline <= now else { return false }
                late.append(waiter)
                return true
            }
            return late
        }
        let lateOptimistic = replica.shared.withLockedValue { shared in
            shared.pending.compactMap { number, record -> (UInt64, ClosedRange<SequenceNumber>)? in
                guard let confirmBy = record.confirmBy, confirmBy <= now, let (_, seqs) = record.accepted else {
                    return nil
                }
                return (number, seqs)
            }
        }
        func notApplied(_ seqs: ClosedRange<SequenceNumber>) -> ClientError {
            ClientError(
                code: .notApplied,
                "the daemon committed seqs \(seqs), but this replica has not applied them within "
                    + "\(configuration.readYourWritesTimeout) (it is \(status.phase) at seq \(sync.lastSeq))"
            )
        }
        for waiter in late { waiter.outcome.fail(notApplied(waiter.seqs)) }
        for (number, seqs) in lateOptimistic { replica.rolledBack(number, notApplied(seqs)) }
        try perform(sync.tick(now: now), on: &link)
    }

    // MARK: Outputs

    /// Does what the sync machine asked, in order. A check that fails hands the machine the mismatch and
    /// drops the rest: the machine has started over, so what followed is void.
    mutating func perform(_ outputs: [ReplicaSync.Output], on link: inout Link) throws {
        for output in outputs {
            if case .apply = output {} else { handOver() }
            switch output {
            case .requestSnapshot:
                syncResendAt = nil
                lastSyncRequest = replica.nextRequestID()
                link.send(.snapshot(requestID: lastSyncRequest, store: store))
            case let .requestRange(from, to):
                repairs += 1
                syncResendAt = nil
                lastSyncRequest = replica.nextRequestID()
                link.send(.range(requestID: lastSyncRequest, store: store, from: from, to: to))
            case let .install(epoch, seq, digest, bytes):
                guard StateDigest(of: bytes) == digest else {
                    return try mismatch(seq, "the snapshot's bytes do not match its digest \(digest)", on: &link)
                }
                let state: D.State
                do {
                    state = try coder.decode(D.State.self, from: bytes)
                } catch {
                    let reason = CanonicalEncoding.describe(error)
                    return try mismatch(
                        seq,
                        "the snapshot is not a \(D.name) v\(D.version) state: \(reason)",
                        on: &link
                    )
                }
                handed += 1
                replica.apply(
                    .install(Replicated(epoch: epoch, seq: seq, state: state)),
                    number: handed,
                    epoch: epoch,
                    seq: seq
                )
                evidence?.agree(epoch: epoch, seq: seq, state: bytes)
            case let .apply(events):
                guard let epoch = sync.epoch, let first = events.first, let last = events.last else { continue }
                evidence?.applied(events)
                if let pending = unapplied, pending.epoch != epoch || pending.lastSeq + 1 != first.seq { handOver() }
                var actions = unapplied?.actions ?? []
                actions.reserveCapacity(actions.count + events.count)
                for event in events {
                    do {
                        actions.append(try coder.decode(D.Action.self, from: event.action))
                    } catch {
                        let reason = CanonicalEncoding.describe(error)
                        return try mismatch(
                            event.seq,
                            "the action is not a \(D.name) v\(D.version) action (\(reason)); does the daemon run "
                                + "another version of the domain?",
                            on: &link
                        )
                    }
                }
                unapplied = (epoch, unapplied?.firstSeq ?? first.seq, last.seq, actions)
                if !batching { handOver() }
            case let .verifyDigest(seq, digest):
                let current = replica.local.state
                // Not applied yet when another thread is draining the local store; the next digest checks.
                guard current.seq == seq, let epoch = current.epoch,
                    let bytes = try? Array(CanonicalEncoding.encode(current.state))
                else { continue }
                let mine = StateDigest(of: bytes)
                guard mine != digest else {
                    evidence?.agree(epoch: epoch, seq: seq, state: bytes)
                    continue
                }
                var location = ""
                do {
                    if let file = try evidence?.write(
                        store: store.rawValue,
                        domainVersion: D.version,
                        seq: seq,
                        daemonDigest: digest,
                        replicaState: bytes
                    ) {
                        location = "; evidence in \(file.path)"
                        replica.logger.error(
                            "wrote the evidence of a divergence",
                            metadata: ["store": "\(store)", "seq": "\(seq)", "file": "\(file.path)"]
                        )
                    }
                } catch {
                    replica.logger.error(
                        "could not write the evidence of a divergence",
                        metadata: [
                            "store": "\(store)", "directory": "\(evidence?.directory ?? "")", "error": "\(error)",
                        ]
                    )
                }
                return try mismatch(
                    seq,
                    "the daemon's digest is \(digest), this replica's is \(mine)\(location)",
                    on: &link
                )
            case let .reportDivergence(seq):
                divergences += 1
                let detail = divergenceDetail ?? "the state differs from the daemon's"
                divergenceDetail = nil
                replica.logger.error(
                    "diverged from the daemon; resyncing",
                    metadata: ["store": "\(store)", "seq": "\(seq)", "detail": "\(detail)"]
                )
                replica.notify(.diverged(seq: seq, detail: detail))
            case let .resync(reason):
                replica.logger.warning("replica resyncs", metadata: ["store": "\(store)", "reason": "\(reason)"])
                replica.notify(.resynced(reason))
            case let .silent(duration):
                disconnected = true
                replica.logger.warning(
                    "no word from the daemon; keeping the state and asking after it",
                    metadata: ["store": "\(store)", "silent": "\(duration)", "seq": "\(sync.lastSeq)"]
                )
            case .requestUnanswered:
                // With one daemon the request goes out again on the same socket, where a slow reply still lands.
                if link.search.endpoints.count > 1 { try moveOn(.syncUnanswered, &link, now: .now) }
            }
        }
    }

    /// Gives the local store the actions read so far, as one change.
    mutating func handOver() {
        guard let pending = unapplied else { return }
        unapplied = nil
        handed += 1
        replica.apply(
            .apply(firstSeq: pending.firstSeq, pending.actions),
            number: handed,
            epoch: pending.epoch,
            seq: pending.lastSeq
        )
    }

    private mutating func mismatch(_ seq: SequenceNumber, _ detail: String, on link: inout Link) throws {
        divergenceDetail = detail
        try perform(sync.digestMismatch(at: seq, now: .now), on: &link)
    }
}

extension ReplicaConfiguration {
    /// "the daemon at X", or "any of the daemons at X, Y": for messages.
    var daemonsPhrase: String {
        daemons.count == 1 ? "the daemon at \(commandEndpoint)" : "any of the daemons at \(commandEndpoints)"
    }

    /// The daemons' command endpoints, comma-separated: for messages.
    var commandEndpoints: String { daemons.map(\.command).joined(separator: ", ") }
}
