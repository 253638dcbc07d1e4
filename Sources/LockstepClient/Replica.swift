import Foundation
import Lockstep
import LockstepProtocol
import Logging
import ServiceLifecycle
import Synchronization
import ZeroMQ

/// A store in this process that stays in lockstep with the daemon's store of domain `D`.
///
/// It runs the domain's reducer over the actions the daemon sequenced, in seq order, and nothing else: it
/// joins without loss (subscribe, keep what arrives, install a snapshot, apply the rest), repairs a gap by
/// range (or by snapshot when the journal was compacted), and starts over on a new epoch, a digest mismatch
/// or a silent daemon. Its state is never a mix: a batch is applied whole before anyone sees it.
///
/// ``run()`` is the replica's life: its two sockets, driven by its hub's thread (``ReplicaHub``: its own, or one
/// shared by the process's replicas), until the task is cancelled or the service group shuts down.
/// ``dispatch(_:)`` may be called from any task, many at once; the requests pipeline on one DEALER socket.
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
    /// Its name in the daemon's STATUS and metrics: ``ReplicaConfiguration/name``, or `HOST:PID`.
    public let name: String
    let logger: Logger
    /// The confirmed state: changed only by the replica's thread, through ``Change``.
    let local: Store<Replicated<D.State>, Change>
    /// The optimistic side (``OptimisticLedger``): its base, the pending dispatches and the optimistic state, under
    /// one lock so that every read of them agrees.
    let ledger: LockedValue<OptimisticLedger<D>>
    /// Whether the ledger holds a pending dispatch, set under its lock (``withLedger(restoring:_:)``): the replica's
    /// thread asks for the ledger's next deadline only then, not on every turn.
    let ledgerHasPending = Atomic<Bool>(false)
    /// The optimistic reads handed to subscribers, newest version kept: what ``subscribe(optimistic:onChange:)`` and
    /// ``reads(bufferingPolicy:)`` observe.
    let published: Store<OptimisticRead<D>, Publication>
    let shared = LockedValue(Shared())
    let wakeup: Wakeup
    /// The thread and ZeroMQ context it runs on: its own, or one it shares with other replicas of the process.
    public let hub: ReplicaHub

    /// A read made under the ledger's lock, handed to the store of published reads.
    struct Publication: Encodable, Sendable {
        var read: OptimisticRead<D>

        func encode(to encoder: any Encoder) throws {
            var container = encoder.singleValueContainer()
            try container.encode("read \(read.version)")
        }
    }

    /// What the replica's thread does to the local store: the only two ways its state changes.
    enum Change: Encodable, Sendable {
        case install(Replicated<D.State>)
        /// Actions from `firstSeq` on, by `authors` (empty: every one unknown).
        case apply(firstSeq: SequenceNumber, [D.Action], authors: [Author])
    }

    /// A replica of `domain`'s store, reaching the daemon as `configuration` says; not running until ``run()``.
    /// Replicas given the same `hub` share its thread and ZeroMQ context; without one, it has its own.
    ///
    /// It logs through `logger` (by default the task-local `Logger.current`, so an application's `withLogger`
    /// scope and its metadata apply), with the store's name as `store` metadata.
    public init(
        _ domain: D.Type = D.self,
        configuration: ReplicaConfiguration = ReplicaConfiguration(),
        hub: ReplicaHub? = nil,
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
        name = configuration.name ?? "\(ProcessInfo.processInfo.hostName):\(getpid())"
        guard (1...ReplicaProgress.maximumNameLength).contains(name.utf8.count) else {
            throw ClientError(
                code: .badRequest,
                "ReplicaConfiguration.name is \(name.utf8.count) bytes; give 1 to \(ReplicaProgress.maximumNameLength)"
            )
        }
        if let interval = configuration.reportInterval, interval < .milliseconds(1) || interval > .seconds(3_600) {
            throw ClientError(
                code: .badRequest,
                "ReplicaConfiguration.reportInterval is \(interval); give 1 ms to 1 hour, or nil to report nothing"
            )
        }
        self.logger = logger.forStore(D.name)
        wakeup = try Wakeup()
        self.hub = try hub ?? ReplicaHub()
        let initial = Replicated(epoch: nil, seq: 0, state: D.initialState)
        local = Store(
            name: D.name,
            initialState: initial,
            reducer: Reducer { replicated, change in
                switch change {
                case let .install(snapshot):
                    replicated = snapshot
                case let .apply(firstSeq, actions, authors):
                    for (index, action) in actions.enumerated() {
                        D.reduce(into: &replicated.state, action, by: authors.isEmpty ? .unknown : authors[index])
                    }
                    replicated.seq = firstSeq + SequenceNumber(actions.count) - 1
                }
            },
            observers: ActionObservers()
        )
        var ledger = OptimisticLedger<D>(
            base: initial,
            pendingTimeout: configuration.pendingTimeout,
            maximumPending: configuration.maximumPending
        )
        ledger.letsIdleStateGo = true
        self.ledger = LockedValue(ledger)
        published = Store(
            name: D.name,
            initialState: ledger.read,
            // Reads are made under the ledger's lock and handed over after it, perhaps by two threads at once:
            // the newest stands.
            reducer: Reducer { current, publication in
                if publication.read.version > current.version { current = publication.read }
            },
            observers: ActionObservers()
        )
    }

    // MARK: - Observation

    /// The confirmed state with its epoch and seq, read at once.
    public var current: Replicated<D.State> { local.state }

    /// The optimistic side in one read: the confirmed state it is built on, the pending dispatches, and the
    /// optimistic state, which always agree with each other. Read it once when a UI shows more than one of them
    /// (pending badges beside the state); ``state`` and ``pending`` are each one read.
    public var optimistic: OptimisticRead<D> {
        var read: OptimisticRead<D>?
        carryOut(
            withLedger(restoring: true) { ledger in
                let actions = ledger.catchUp()
                read = ledger.read
                return actions
            }
        )
        return read!
    }

    /// The optimistic state: the confirmed one with this replica's pending optimistic dispatches on top (equal to
    /// ``confirmedState`` when none is pending). See ``ReplicaView`` and ``optimistic``.
    public var state: D.State {
        // With nothing pending the optimistic state is the confirmed one; read it there, so a `dispatch` that
        // returned is in `state` (read-your-writes) even before the optimistic side has taken the change.
        let state = ledger.withLockedValue { $0.entries.isEmpty ? nil : $0.state }
        return state ?? local.state.state
    }

    /// The confirmed state: the daemon's, after exactly the actions up to ``seq``.
    public var confirmedState: D.State { local.state.state }

    /// The seq of the confirmed state.
    public var seq: SequenceNumber { local.state.seq }

    /// The optimistic dispatches the optimistic state's base does not hold yet, oldest first: ``optimistic``'s
    /// `pending`.
    public var pending: [PendingDispatch<D>] { optimistic.pending }

    /// Where the replica stands.
    public var status: ReplicaStatus {
        var status = shared.withLockedValue { $0.status }
        status.pendingActions = ledger.withLockedValue { $0.pendingActions }
        return status
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
        case .optimistic: subscribe(optimistic: { select($0.state) }, onChange: onChange)
        }
    }

    /// Calls `onChange` with the selected part of the optimistic side now, and once each time it changes: `select`
    /// gets one ``OptimisticRead``, whose base, pending dispatches and state agree. Callbacks run one at a time, in
    /// the order of the reads, on the thread whose change made the read: the replica's own for the daemon's
    /// events and answers, a dispatching task's for its own optimistic dispatch.
    @discardableResult
    public func subscribe<Value: Equatable & Sendable>(
        optimistic select: @escaping @Sendable (OptimisticRead<D>) -> Value,
        onChange: @escaping @Sendable (Value) -> Void
    ) -> Cancellation {
        // Watching first, so the read the subscription starts on is rebuilt on the newest confirmed state.
        var version: UInt64 = 0
        carryOut(
            withLedger(restoring: true) { ledger in
                let actions = ledger.watch()
                version = ledger.version
                return actions
            }
        )
        // Nothing older than the catch-up: a read made before it may still be on its way to the store.
        let since = version
        let subscription = published.subscribe({ $0.version >= since ? select($0) : nil }) { value in
            if let value { onChange(value) }
        }
        return Cancellation { [ledger] in
            subscription.cancel()
            ledger.withLockedValue { $0.unwatch() }
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
            let subscription = subscribe(optimistic: { $0 }) { read in
                continuation.yield(Replicated(epoch: read.base.epoch, seq: read.base.seq, state: read.state))
            }
            continuation.onTermination = { _ in subscription.cancel() }
            return stream
        }
    }

    /// Every ``OptimisticRead`` from now on, starting with the current one: the optimistic side's base, pending
    /// dispatches and state, always agreeing.
    public func reads(
        bufferingPolicy: AsyncStream<OptimisticRead<D>>.Continuation.BufferingPolicy = .unbounded
    ) -> AsyncStream<OptimisticRead<D>> {
        let (stream, continuation) = AsyncStream.makeStream(
            of: OptimisticRead<D>.self,
            bufferingPolicy: bufferingPolicy
        )
        let subscription = subscribe(optimistic: { $0 }) { continuation.yield($0) }
        continuation.onTermination = { _ in subscription.cancel() }
        return stream
    }

    /// The optimistic dispatches rolled back from now on: rejected by the daemon, given up, or lost. Each also
    /// fails its dispatch's handle.
    public func rollbacks() -> AsyncStream<OptimisticRollback<D>> {
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

    /// Its ``status`` now, and then each time it changes (phase, seqs, counts), newest first when a reader falls
    /// behind (`.bufferingNewest(1)` by default); the stream ends once the replica has stopped.
    public func statuses(
        bufferingPolicy: AsyncStream<ReplicaStatus>.Continuation.BufferingPolicy = .bufferingNewest(1)
    ) -> AsyncStream<ReplicaStatus> {
        let (stream, continuation) = AsyncStream.makeStream(of: ReplicaStatus.self, bufferingPolicy: bufferingPolicy)
        let (id, stopped) = shared.withLockedValue { shared in
            shared.nextListener += 1
            shared.statusListeners[shared.nextListener] = continuation
            return (shared.nextListener, shared.stopped)
        }
        continuation.onTermination = { [shared] _ in
            _ = shared.withLockedValue { $0.statusListeners.removeValue(forKey: id) }
        }
        continuation.yield(status)
        if stopped { continuation.finish() }
        return stream
    }

    /// Returns once the replica is live (joined and caught up with what it heard), or throws
    /// ``ClientError/Code/unavailable`` after `timeout`.
    public func waitUntilLive(timeout: Duration = .seconds(10)) async throws {
        let reached = try await firstStatus(within: timeout) { $0.phase == .live || $0.phase == .stopped }
        guard reached?.phase != .live else { return }
        let status = self.status
        throw ClientError(
            code: .unavailable,
            "the replica of '\(store)' is still \(status.phase) after \(timeout) (at seq \(status.lastSeq)"
                + "\(status.problem.map { "; \($0)" } ?? "")); is the daemon running at "
                + "\(configuration.commandEndpoints) and hosting '\(store)'?"
        )
    }

    /// The first status within `timeout` that `condition` holds for; `nil` when none did.
    private func firstStatus(
        within timeout: Duration,
        where condition: @escaping @Sendable (ReplicaStatus) -> Bool
    ) async throws -> ReplicaStatus? {
        let statuses = self.statuses()
        return try await withThrowingTaskGroup(of: ReplicaStatus?.self) { group in
            group.addTask {
                for await status in statuses where condition(status) { return status }
                return nil
            }
            group.addTask {
                try await Task.sleep(for: timeout)
                return nil
            }
            defer { group.cancelAll() }
            return try await group.next() ?? nil
        }
    }

    // MARK: - Read barriers

    /// Returns once this replica's confirmed state holds seq `seq` — what a dispatch returned, in this process or in
    /// another — with that state (or a later one): a write acknowledged anywhere is then visible here. A process
    /// that dispatched tells another the seq; the other waits for it before it reads.
    ///
    /// Throws ``ClientError/Code/notApplied`` when the replica has not reached `seq` within `timeout` (the daemon has
    /// not sequenced it, or this replica cannot follow), ``ClientError/Code/stopped`` when it stops first.
    @discardableResult
    public func wait(for seq: SequenceNumber, timeout: Duration = .seconds(10)) async throws -> Replicated<D.State> {
        let outcome = DispatchOutcome()
        let queued = shared.withLockedValue { shared in
            guard !shared.stopped else { return false }
            shared.waiters.append(
                Waiter(epoch: nil, seqs: seq...seq, deadline: .now + timeout, outcome: outcome, barrier: timeout)
            )
            return true
        }
        guard queued else { throw ClientError(code: .stopped, "the replica of '\(store)' has stopped") }
        // It may hold the seq already.
        let current = local.state
        if let epoch = current.epoch, current.seq >= seq { applied(epoch: epoch, seq: current.seq) }
        _ = try await outcome.value
        return local.state
    }

    /// Asks the daemon that leads for the store's seq now, and returns once this replica holds it, with that state
    /// (or a later one): every write the daemon acknowledged before the call — from any process — is then visible
    /// here, without passing a seq around. Costs one round trip to the daemon more than ``wait(for:timeout:)``.
    ///
    /// Throws as ``wait(for:timeout:)`` does, and ``ClientError/Code/unavailable`` when no daemon that leads
    /// answered.
    @discardableResult
    public func sync(timeout: Duration = .seconds(10)) async throws -> Replicated<D.State> {
        let outcome = DispatchOutcome()
        let wake = shared.withLockedValue { shared -> Bool? in
            guard shared.takesDispatches else { return nil }
            shared.lastRequestID += 1
            return shared.queue(
                Outgoing(number: shared.lastRequestID, actions: [], outcome: outcome, barrier: .now + timeout)
            )
        }
        guard let wake else { throw ClientError(code: .stopped, "the replica of '\(store)' has stopped") }
        if wake { wakeup.signal() }
        _ = try await outcome.value
        return local.state
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
        let frames = try canonicalFrames(actions, for: "dispatch(batch:)")
        return try await queueAndAwait(
            frames,
            to: store,
            in: shared,
            waking: wakeup,
            stopped: "the replica of '\(store)' has stopped"
        )
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
    /// cannot be encoded (`badRequest`), when the replica has stopped (`stopped`) or not joined yet
    /// (`unavailable`), or when it already holds ``ReplicaConfiguration/maximumPending`` actions the daemon has not
    /// confirmed (`tooManyPending`).
    ///
    /// Until the confirmed state holds them they stay pending: applied again on top of each new confirmed state,
    /// and sent again with the same idempotency key after a silence or a daemon restart — until a daemon accepts
    /// them, or ``ReplicaConfiguration/pendingTimeout`` after this call, when they are rolled back `unavailable`
    /// and sent no more — so the daemon applies them at most once. When the daemon rejects them, they leave the
    /// optimistic state, the handle throws the rejection and ``rollbacks()`` tells. docs/optimistic.md has the
    /// whole model.
    public func dispatchOptimistically(batch actions: [D.Action]) async throws -> OptimisticDispatch {
        let frames = try canonicalFrames(actions, for: "dispatchOptimistically(batch:)")
        let outcome = DispatchOutcome()
        let number = try shared.withLockedValue { shared throws(ClientError) in
            guard !shared.stopped else { throw ClientError(code: .stopped, "the replica of '\(store)' has stopped") }
            shared.lastRequestID += 1
            return shared.lastRequestID
        }
        do throws(OptimisticLedger<D>.Refusal) {
            carryOut(
                try withLedger(restoring: true) { ledger throws(OptimisticLedger<D>.Refusal) in
                    try ledger.dispatch(number, actions, outcome: outcome, now: .now)
                }
            )
        } catch let .rejected(rejection) {
            throw rejection
        } catch .notJoined {
            throw ClientError(
                code: .unavailable,
                "the replica of '\(store)' has not joined the daemon yet, so it cannot validate an action against "
                    + "its state; wait for waitUntilLive() first"
            )
        } catch let .tooMany(pending, adding) {
            throw ClientError(
                code: .tooManyPending,
                "the replica of '\(store)' holds \(pending) optimistic actions the daemon has not confirmed, and "
                    + "\(adding) more would pass the bound of \(configuration.maximumPending) "
                    + "(ReplicaConfiguration.maximumPending); wait for some to be confirmed"
            )
        }
        let wake = shared.withLockedValue { shared -> Bool? in
            guard shared.takesDispatches else { return nil }
            return shared.queue(Outgoing(number: number, actions: frames, outcome: outcome, optimistic: true))
        }
        if let wake {
            if wake { wakeup.signal() }
        } else {
            // Stopped meanwhile: the stop may have failed what was pending before this dispatch was.
            rolledBack(number, ClientError(code: .stopped, "the replica of '\(store)' has stopped"))
        }
        return OptimisticDispatch(requestNumber: number, outcome: outcome) { [ledger] in
            ledger.withLockedValue { $0.status(of: number) }
        }
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
                try await hub.run { [self] sockets in try ReplicaDriver(self, hub: sockets) }
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

    // MARK: - The replica's turns on the hub's thread

    /// One turn after a poll: `ready` is what its command socket and its wake-up descriptor got
    /// (``ReplicaDriver/pollItems``); the hub has put its store's events in `link.events`. `false` once a stop was asked for: what is in flight is failed.
    func turn(
        _ engine: inout Engine<D>,
        _ link: inout Link,
        _ ready: ArraySlice<PollEvents>,
        resumedAt: ContinuousClock.Instant?
    ) throws -> Bool {
        let (replies, woken) = (ready[ready.startIndex], ready[ready.startIndex + 1])
        if let resumedAt { engine.sync.resumed(now: resumedAt) }
        if woken.contains(.readable) { wakeup.drain() }
        let (outbox, stopRequested) = shared.withLockedValue { shared in
            defer { shared.outbox.removeAll() }
            return (shared.outbox, shared.stopRequested)
        }
        if stopRequested {
            engine.failAll(outbox, ClientError(code: .stopped, "the replica of '\(store)' stopped"))
            return false
        }
        try engine.send(outbox, on: &link)
        try engine.checkDigests(
            shared.withLockedValue { shared in
                defer { shared.digestsTaken.removeAll() }
                return shared.digestsTaken
            },
            on: &link
        )
        if !link.events.isEmpty { try engine.readEvents(from: &link) }
        if replies.contains(.readable) { try engine.readReplies(from: &link) }
        try engine.tick(on: &link)
        publish(engine.status)
        return true
    }

    /// After its last turn: nothing more will be answered.
    func finish() {
        let (outbox, waiters, listeners, rollbackListeners) = shared.withLockedValue { shared in
            shared.stopped = true
            shared.status.phase = .stopped
            defer {
                shared.outbox.removeAll()
                shared.waiters.removeAll()
                shared.listeners.removeAll()
                shared.rollbackListeners.removeAll()
            }
            return (shared.outbox, shared.waiters, shared.listeners, shared.rollbackListeners)
        }
        let error = ClientError(code: .stopped, "the replica of '\(store)' stopped before the action was applied here")
        for outgoing in outbox { outgoing.outcome.fail(error) }
        for waiter in waiters { waiter.outcome.fail(error) }
        // What was never confirmed leaves the optimistic state: it shows the daemon's last word.
        carryOut(withLedger { $0.stop(error) }, telling: false)
        for listener in listeners.values { listener.finish() }
        for listener in rollbackListeners.values { listener.finish() }
        let stopped = shared.withLockedValue { $0.status }
        for listener in shared.withLockedValue({ Array($0.statusListeners.values) }) { listener.yield(stopped) }
        finishStatusListeners()
    }

    private func finishStatusListeners() {
        let listeners = shared.withLockedValue { shared in
            defer { shared.statusListeners.removeAll() }
            return shared.statusListeners
        }
        for listener in listeners.values { listener.finish() }
    }

    /// The replica's thread made `status`: kept for ``status``, and told to the ``statuses()`` streams if it changed.
    func publish(_ status: ReplicaStatus) {
        let listeners = shared.withLockedValue { shared -> [AsyncStream<ReplicaStatus>.Continuation] in
            guard shared.status != status else { return [] }
            shared.status = status
            return Array(shared.statusListeners.values)
        }
        guard !listeners.isEmpty else { return }
        let status = self.status
        for listener in listeners { listener.yield(status) }
    }

    /// The local store reached `seq` of `epoch`: wake the dispatches waiting for it. Runs on whichever thread
    /// applied the change.
    func applied(epoch: Epoch, seq: SequenceNumber) {
        let ready = shared.withLockedValue { shared in
            var ready: [Waiter] = []
            shared.waiters.removeAll { waiter in
                guard waiter.epoch == nil || waiter.epoch == epoch, waiter.seqs.upperBound <= seq else { return false }
                ready.append(waiter)
                return true
            }
            return ready
        }
        for waiter in ready { waiter.outcome.resolve(.success(waiter.seqs)) }
    }

    func notify(_ notice: ReplicaNotice) {
        for listener in shared.withLockedValue({ Array($0.listeners.values) }) { listener.yield(notice) }
    }

    /// Hands `change` (the confirmed change `number`) to the local store; once applied, the dispatches waiting for
    /// it are answered and the optimistic side takes it.
    func apply(_ change: Change, number: UInt64, epoch: Epoch, seq: SequenceNumber) {
        local.send(change) { [self] _ in
            // Still on the thread that applied the change, before the store takes its next one: this is its state.
            let confirmed = local.state
            takeDigestIfWanted(of: confirmed)
            carryOut(withLedger { $0.confirmed(number, confirmed) })
            applied(epoch: epoch, seq: seq)
        }
    }

    /// Takes the digest of the local state at `seq` of `epoch` off the replica's thread, as soon as the local store
    /// holds that state (now, or when it applies the change that ends there).
    func wantDigest(_ wanted: DigestWanted) {
        shared.withLockedValue { $0.digestWanted = wanted }
        takeDigestIfWanted(of: local.state)
    }

    /// Whether `D`'s states have a digest form that condenses part of them (a `DigestedDictionary` in its initial
    /// state): a large state installed from a snapshot then has its members' sums taken at once, off this thread.
    private static var condensesDigests: Bool {
        (try? CanonicalEncoding.digestForm(of: D.initialState))?.isCanonicalForm == false
    }

    /// Takes the sums of the `DigestedDictionary`s of `state`, just decoded from a snapshot of `bytes` bytes, on the
    /// digest thread: each hashes all its members once, and would otherwise do it at the first digest the daemon
    /// asks for — while actions are coming. Only for a large state of a domain whose digests condense it.
    func takeDigestSums(of state: D.State, bytes: Int) {
        let install = shared.withLockedValue { $0.digestForm.installed(bytes: bytes) }
        guard bytes >= DigestFormSize.large, Self.condensesDigests else { return }
        hub.digests.submit { [self] in
            let form = try? CanonicalEncoding.digestForm(of: state)
            shared.withLockedValue { $0.digestForm.written(form?.bytes.count, of: install) }
        }
    }

    /// Whether the state's digest form was small when last written: its digest may be taken on the replica's thread.
    var digestFormIsSmall: Bool { shared.withLockedValue { $0.digestForm.isSmall } }

    /// Hands `state` to the digest thread if it is the one wanted: the thread keeps a reference, so the store's next
    /// change copies what it changes (all of an array; a path of a `TreeDictionary`).
    private func takeDigestIfWanted(of state: Replicated<D.State>) {
        let wanted = shared.withLockedValue { shared -> DigestWanted? in
            guard let wanted = shared.digestWanted, wanted.seq == state.seq, wanted.epoch == state.epoch else {
                return nil
            }
            shared.digestWanted = nil
            return wanted
        }
        guard let wanted else { return }
        let keepState = configuration.evidenceDirectory != nil
        let install = shared.withLockedValue { $0.digestForm.latestInstall }
        hub.digests.submit { [self] in
            var taken = DigestTaken(seq: wanted.seq, generation: wanted.generation)
            let expected = shared.withLockedValue { $0.digestForm.bytes }
            var written: Int?
            // A large digest form is hashed as it is written, never held whole, unless evidence keeps it.
            if !keepState, expected >= DigestFormSize.large,
                let streamed = CanonicalEncoding.streamed(state.state, digestForm: true)
            {
                taken.digest = streamed.digest
                written = streamed.bytes
            } else if let form = try? CanonicalEncoding.digestForm(
                of: state.state,
                reservingCapacity: CanonicalEncoding.capacity(forLastSize: expected)
            ) {
                taken.digest = form.digest
                written = form.bytes.count
                if keepState {
                    taken.state = form.isCanonicalForm ? form.bytes : try? CanonicalEncoding.bytes(of: state.state)
                }
            }
            shared.withLockedValue {
                $0.digestsTaken.append(taken)
                $0.digestForm.written(written, of: install)
            }
            wakeup.signal()
        }
    }

    // MARK: - The optimistic side

    /// Runs `event` on the ledger under its lock. Handles are resolved or failed there, so a handle's status and
    /// the pending list never disagree; the rest of what the ledger decided is returned, to carry out after the
    /// lock (``carryOut(_:telling:)``). With `restoring`, for an event that builds on the newest confirmed state (a
    /// dispatch, a read, a watch), the ledger first takes that state back from the local store if it let it go.
    func withLedger<E: Error>(
        restoring: Bool = false,
        _ event: (inout OptimisticLedger<D>) throws(E) -> [OptimisticLedger<D>.Action]
    ) throws(E) -> [OptimisticLedger<D>.Action] {
        try ledger.withLockedValue { ledger throws(E) in
            if restoring { ledger.restore(local.state) }
            defer { ledgerHasPending.store(!ledger.entries.isEmpty, ordering: .releasing) }
            let actions = try event(&ledger)
            for action in actions {
                switch action {
                case let .resolve(outcome, seqs): outcome.resolve(.success(seqs))
                case let .rollBack(_, _, outcome, error): outcome.fail(error)
                case .abandon, .publish: break
                }
            }
            return actions
        }
    }

    /// Carries out what the ledger decided, after its lock: new reads go to the subscribers, rollbacks are logged
    /// and told (unless `telling` is false: the replica stopped). Returns the dispatches to send no more.
    @discardableResult
    func carryOut(_ actions: [OptimisticLedger<D>.Action], telling: Bool = true) -> [UInt64] {
        var abandoned: [UInt64] = []
        for action in actions {
            switch action {
            case .resolve: break
            case let .rollBack(number, actions, _, error) where telling:
                tell(OptimisticRollback(requestNumber: number, actions: actions, error: error))
            case .rollBack: break
            case let .abandon(number): abandoned.append(number)
            case let .publish(read): published.send(Publication(read: read))
            }
        }
        return abandoned
    }

    /// Optimistic dispatch `number` will not be confirmed: its handle throws `error`, it leaves the pending list and
    /// the optimistic state, and ``rollbacks()`` tells.
    func rolledBack(_ number: UInt64, _ error: any Error) {
        carryOut(withLedger { $0.rolledBack(number, error) })
    }

    /// Logs a rollback and hands it to every ``rollbacks()`` stream.
    private func tell(_ rollback: OptimisticRollback<D>) {
        logger.notice(
            "rolled back an optimistic dispatch",
            metadata: ["request": "\(rollback.requestNumber)", "error": "\(rollback.error)"]
        )
        for listener in shared.withLockedValue({ Array($0.rollbackListeners.values) }) { listener.yield(rollback) }
    }

    func nextRequestID() -> UInt64 {
        shared.withLockedValue { shared in
            shared.lastRequestID += 1
            return shared.lastRequestID
        }
    }

    // MARK: - Shared between the loop and callers

    struct Shared: QueuesDispatches {
        var started = false
        var stopRequested = false
        var stopped = false
        var lastRequestID: UInt64 = 0
        var outbox: [Outgoing] = []
        var takesDispatches: Bool { !stopped }
        var waiters: [Waiter] = []
        var status = ReplicaStatus()
        var nextListener: UInt64 = 0
        var listeners: [UInt64: AsyncStream<ReplicaNotice>.Continuation] = [:]
        var rollbackListeners: [UInt64: AsyncStream<OptimisticRollback<D>>.Continuation] = [:]
        var statusListeners: [UInt64: AsyncStream<ReplicaStatus>.Continuation] = [:]
        /// The seq whose state the replica's thread wants a digest of, once the local store has it.
        var digestWanted: DigestWanted?
        /// Digests taken off the replica's thread, for it to check.
        var digestsTaken: [DigestTaken] = []
        /// The size of the digest form last written, or of the large snapshot installed since.
        var digestForm = DigestFormSize()
    }
}

/// A seq of an epoch whose state's digest the replica's thread asked for (``DigestChecks``).
struct DigestWanted: Sendable {
    var epoch: Epoch
    var seq: SequenceNumber
    var generation: UInt64
}

/// The digest of the local state at `seq`, taken off the replica's thread; with the canonical state when divergence
/// evidence is kept. `digest` is `nil` when the state did not encode.
struct DigestTaken: Sendable {
    var seq: SequenceNumber
    var generation: UInt64
    var digest: StateDigest?
    var state: Frame?
}

// What the replica's thread and its callers share, outside the generic `Replica<D>`: types nested in a generic
// type are generic themselves, and unspecialized code looks up their metadata at run time on every use.

/// An accepted dispatch waiting for this replica to apply its seqs, or a read barrier waiting for a seq of any epoch.
struct Waiter: Sendable {
    var epoch: Epoch?
    var seqs: ClosedRange<SequenceNumber>
    var deadline: ContinuousClock.Instant
    var outcome: DispatchOutcome
    /// A read barrier's timeout (``Replica/wait(for:timeout:)``, ``Replica/sync(timeout:)``); `nil` for a dispatch.
    var barrier: Duration? = nil
}

extension ReplicaConfiguration {
    /// "the daemon at X", or "any of the daemons at X, Y": for messages.
    var daemonsPhrase: String { LockstepClient.daemonsPhrase(daemons.map(\.command)) }

    /// The daemons' command endpoints, comma-separated: for messages.
    var commandEndpoints: String { daemons.map(\.command).joined(separator: ", ") }
}
