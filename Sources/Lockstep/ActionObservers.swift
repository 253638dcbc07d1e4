import Synchronization

/// One action as a store saw it: which store, its place in that store's order, the action, and whether it
/// was applied.
public struct ObservedAction: Sendable {
    /// The name of the store the action went through.
    public let store: String
    /// 1 for the first action this store handled, then 2, 3… — rejected actions take a number too, so an
    /// observer sees one gap-free order per store.
    public let index: UInt64
    /// The action itself; cast it to the store's `Action` type, or encode it for a log.
    public let action: any Encodable & Sendable
    /// `nil` when the action was applied, the validator's reason when it was refused.
    public let rejection: Rejection?

    @usableFromInline
    init(store: String, index: UInt64, action: any Encodable & Sendable, rejection: Rejection?) {
        self.store = store
        self.index = index
        self.action = action
        self.rejection = rejection
    }
}

/// Observers that see every action through every store attached to them (seed 001's subscribe-to-all-stores):
/// the hook for logging and recording.
///
/// Stores attach to ``shared`` unless they are given another hub. Observers run on the thread that applied
/// the action, after the state changed and before the dispatcher is told; stores run in parallel, so an
/// observer must be safe to call from several threads at once.
public final class ActionObservers: Sendable {
    /// The hub every store uses by default.
    public static let shared = ActionObservers()

    private struct Registry {
        var nextID: UInt64 = 0
        var observers: [UInt64: @Sendable (ObservedAction) -> Void] = [:]
        var cached: [@Sendable (ObservedAction) -> Void]? = []
    }

    private let registry = LockedValue(Registry())
    private let count = Atomic<Int>(0)

    /// A hub of its own, apart from ``shared``: for stores whose actions must not reach the process-wide observers,
    /// such as a replica's local store or a test that counts only its own store's actions.
    public init() {}

    /// Calls `observer` for every action through every attached store until the returned token is cancelled.
    @discardableResult
    public func observe(_ observer: @escaping @Sendable (ObservedAction) -> Void) -> Cancellation {
        let id = registry.withLockedValue { registry in
            registry.nextID += 1
            registry.observers[registry.nextID] = observer
            registry.cached = nil
            return registry.nextID
        }
        count.add(1, ordering: .releasing)
        return Cancellation { [weak self] in
            guard let self else { return }
            let removed = self.registry.withLockedValue { registry in
                guard registry.observers.removeValue(forKey: id) != nil else { return false }
                registry.cached = nil
                return true
            }
            if removed { self.count.subtract(1, ordering: .releasing) }
        }
    }

    /// Whether anyone is listening: stores skip building an ``ObservedAction`` when nobody is.
    @usableFromInline var isEmpty: Bool { count.load(ordering: .acquiring) == 0 }

    @usableFromInline
    func notify(_ observed: @autoclosure () -> ObservedAction) {
        guard !isEmpty else { return }
        let observers = registry.withLockedValue { registry in
            if let cached = registry.cached { return cached }
            let list = registry.observers.sorted { $0.key < $1.key }.map(\.value)
            registry.cached = list
            return list
        }
        let observed = observed()
        for observer in observers { observer(observed) }
    }
}

/// Ends a subscription or an observation. Cancelling twice is harmless; dropping the token does not cancel.
public final class Cancellation: Sendable {
    private let action: LockedValue<(@Sendable () -> Void)?>

    package init(_ action: @escaping @Sendable () -> Void) {
        self.action = LockedValue(action)
    }

    /// Stops further callbacks. A callback already running on another thread finishes.
    public func cancel() {
        let action = self.action.withLockedValue { action in
            let taken = action
            action = nil
            return taken
        }
        action?()
    }
}
