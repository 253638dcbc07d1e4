import Synchronization

/// An in-process store: one state, changed only by actions, one action at a time in arrival order.
///
/// `dispatch` may be called from any thread or task. The first caller to find the store idle applies the
/// queued work on its own thread until the queue is empty; everyone else enqueues and waits for their
/// turn. A dispatch made from inside a subscriber or an observer is queued behind the current action, never
/// re-entered. A rejected action changes nothing and its error goes to the caller.
///
/// Subscribers, observers and completions run on the applying thread: keep them short.
public final class Store<State: Equatable & Sendable, Action: Encodable & Sendable>: Sendable {
    /// The store's name, as observers see it.
    public let name: String
    @usableFromInline let reducer: Reducer<State, Action>
    @usableFromInline let observers: ActionObservers
    @usableFromInline let core: LockedValue<Core>

    /// A store over `initialState` changed by `reducer`, reporting to `observers`.
    public init(
        name: String,
        initialState: State,
        reducer: Reducer<State, Action>,
        observers: ActionObservers = .shared
    ) {
        self.name = name
        self.reducer = reducer
        self.observers = observers
        self.core = LockedValue(Core(state: initialState))
    }

    /// The current state: every action dispatched before this call returned has been applied to it, none
    /// half-way.
    public var state: State {
        core.withLockedValue { $0.state }
    }

    /// How many actions this store has applied.
    public var appliedCount: UInt64 {
        core.withLockedValue { $0.applied }
    }

    /// Applies `action` and returns once it is applied (and subscribers have seen the result), or throws
    /// the validator's ``Rejection``, in which case nothing changed.
    public func dispatch(_ action: Action) async throws(Rejection) {
        let result: Result<Void, Rejection> = await withCheckedContinuation { continuation in
            send(action) { continuation.resume(returning: $0) }
        }
        try result.get()
    }

    /// Queues `action` and returns at once; `completion`, if any, learns the outcome after the action is
    /// applied or refused (seed 002's dispatch with completion). This is the form to use inside a subscriber.
    ///
    /// This path and the ones it takes are `@inlinable`, so they are compiled for the caller's state and
    /// action types: unspecialized, they looked up generic metadata at run time on every dispatch.
    @inlinable
    public func send(_ action: Action, completion: (@Sendable (Result<Void, Rejection>) -> Void)? = nil) {
        submit(.action(action, completion))
    }

    /// Calls `onChange` with the selected part of the state now (replay-last), and then once each time it
    /// changes, never for changes elsewhere in the state.
    @discardableResult @inlinable
    public func subscribe<Value: Equatable & Sendable>(
        _ select: @escaping @Sendable (State) -> Value,
        onChange: @escaping @Sendable (Value) -> Void
    ) -> Cancellation {
        let last = LockedValue<Value?>(nil)
        return addSubscriber { state in
            let value = select(state)
            let changed = last.withLockedValue { last in
                if last == value { return false }
                last = value
                return true
            }
            if changed { onChange(value) }
        }
    }

    /// Every distinct state from now on, starting with the current one.
    ///
    /// The default buffer keeps every state a slow reader has not taken yet; pass `.bufferingNewest(1)` to
    /// see only the latest. Ending the iteration ends the subscription.
    public func states(
        bufferingPolicy: AsyncStream<State>.Continuation.BufferingPolicy = .unbounded
    ) -> AsyncStream<State> {
        let (stream, continuation) = AsyncStream.makeStream(of: State.self, bufferingPolicy: bufferingPolicy)
        let subscription = subscribe({ $0 }, onChange: { continuation.yield($0) })
        continuation.onTermination = { _ in subscription.cancel() }
        return stream
    }

    // MARK: - The queue

    @usableFromInline
    final class Subscriber: Sendable {
        @usableFromInline let deliver: @Sendable (State) -> Void
        @usableFromInline let active = Atomic<Bool>(true)

        @usableFromInline
        init(_ deliver: @escaping @Sendable (State) -> Void) {
            self.deliver = deliver
        }
    }

    @usableFromInline
    enum Work: Sendable {
        case action(Action, (@Sendable (Result<Void, Rejection>) -> Void)?)
        case subscribe(UInt64, Subscriber)
    }

    @usableFromInline
    struct Core: Sendable {
        @usableFromInline var state: State
        @usableFromInline var applied: UInt64 = 0
        @usableFromInline var handled: UInt64 = 0
        @usableFromInline var queue: [Work] = []
        @usableFromInline var head = 0
        @usableFromInline var draining = false
        @usableFromInline var nextSubscriberID: UInt64 = 0
        @usableFromInline var subscribers: [UInt64: Subscriber] = [:]
        /// The subscribers in subscription order, rebuilt only after a change, so notifying takes no copy.
        @usableFromInline var subscriberList: [Subscriber]? = []

        @usableFromInline
        init(state: State) {
            self.state = state
        }

        @inlinable
        mutating func next() -> Work? {
            guard head < queue.count else {
                queue.removeAll(keepingCapacity: true)
                head = 0
                draining = false
                return nil
            }
            defer { head += 1 }
            return queue[head]
        }

        @inlinable
        mutating func currentSubscribers() -> [Subscriber] {
            if let list = subscriberList { return list }
            let list = subscribers.sorted { $0.key < $1.key }.map(\.value)
            subscriberList = list
            return list
        }
    }

    @usableFromInline
    func addSubscriber(_ deliver: @escaping @Sendable (State) -> Void) -> Cancellation {
        let subscriber = Subscriber(deliver)
        let id = core.withLockedValue { core in
            core.nextSubscriberID += 1
            return core.nextSubscriberID
        }
        submit(.subscribe(id, subscriber))
        return Cancellation { [weak self] in
            subscriber.active.store(false, ordering: .releasing)
            self?.core.withLockedValue { core in
                if core.subscribers.removeValue(forKey: id) != nil { core.subscriberList = nil }
            }
        }
    }

    @inlinable
    func submit(_ work: Work) {
        let mustDrain = core.withLockedValue { core in
            core.queue.append(work)
            if core.draining { return false }
            core.draining = true
            return true
        }
        if mustDrain { drain() }
    }

    @inlinable
    func drain() {
        while let work = core.withLockedValue({ $0.next() }) {
            switch work {
            case let .action(action, completion):
                apply(action, completion: completion)
            case let .subscribe(id, subscriber):
                let state = core.withLockedValue { core in
                    if subscriber.active.load(ordering: .acquiring) {
                        core.subscribers[id] = subscriber
                        core.subscriberList = nil
                    }
                    return core.state
                }
                if subscriber.active.load(ordering: .acquiring) { subscriber.deliver(state) }
            }
        }
    }

    @inlinable
    func apply(_ action: Action, completion: (@Sendable (Result<Void, Rejection>) -> Void)?) {
        let reducer = self.reducer
        let outcome: (index: UInt64, result: Result<(State, [Subscriber])?, Rejection>) = core.withLockedValue {
            core in
            core.handled += 1
            do throws(Rejection) {
                try reducer.validate(action, core.state)
            } catch {
                return (core.handled, .failure(error))
            }
            reducer.reduce(&core.state, action)
            core.applied += 1
            // Taking a copy of the state costs nothing until the next action writes to it; skip it when no
            // one would read it, so a store without subscribers keeps mutating its state in place.
            let subscribers = core.currentSubscribers()
            return (core.handled, .success(subscribers.isEmpty ? nil : (core.state, subscribers)))
        }
        switch outcome.result {
        case let .success(notify):
            observers.notify(ObservedAction(store: name, index: outcome.index, action: action, rejection: nil))
            if let (state, subscribers) = notify {
                for subscriber in subscribers where subscriber.active.load(ordering: .acquiring) {
                    subscriber.deliver(state)
                }
            }
            completion?(.success(()))
        case let .failure(rejection):
            observers.notify(ObservedAction(store: name, index: outcome.index, action: action, rejection: rejection))
            completion?(.failure(rejection))
        }
    }
}

extension Store {
    /// A store for domain `D`, named after it, starting from its initial state.
    public convenience init<D: Domain>(_ domain: D.Type, observers: ActionObservers = .shared)
    where D.State == State, D.Action == Action {
        self.init(name: D.name, initialState: D.initialState, reducer: D.reducer, observers: observers)
    }
}
