import Foundation

/// The unit both the daemon and every replica compile in: a state, its actions, a validator and a reducer.
///
/// A domain is a type, never an instance: everything about it is static, so the same code gives the same
/// result in every process. The reducer must be pure and deterministic — no clock, no randomness, no
/// iteration over `Set` or `Dictionary` order, no reference types shared between states. Values from the
/// outside world (a time, an identifier) travel inside the action.
public protocol Domain: Sendable {
    /// The whole state of one store: a value type that survives an encode/decode round trip unchanged.
    associatedtype State: Codable & Equatable & Sendable
    /// The closed set of changes, usually an enum with synthesized `Codable`.
    associatedtype Action: Codable & Sendable
    /// What the domain asks the outside world to do — send a mail, call a payment service — as data: a closed
    /// `Codable` enum, run by the daemon that leads (docs/effects.md). `Never` (the default) for a domain without
    /// effects; such a domain may still set timers.
    associatedtype Effect: Codable & Sendable = Never

    /// The store's name on the wire and in the journal. Letters, digits, `-`, `_` and `.`, at most 64 bytes.
    static var name: String { get }
    /// Bump it whenever the state, the actions or the reducer change meaning; peers of another version are refused.
    static var version: UInt32 { get }
    /// The state before the first action.
    static var initialState: State { get }

    /// Decides whether `action` may be applied to `state`. Pure and read-only; a rejected action is never
    /// sequenced, so replicas never need to validate.
    static func validate(_ action: Action, in state: State) throws(Rejection)

    /// Applies an action that passed ``validate(_:in:)``. Total: it never fails.
    static func reduce(into state: inout State, _ action: Action)

    /// ``validate(_:in:)`` knowing who sent the action: its ``Author``, the identity the daemon's policy names
    /// (docs/security.md). The default asks ``validate(_:in:)``; implement this one to decide by author — only a
    /// card's owner may move it.
    static func validate(_ action: Action, in state: State, by author: Author) throws(Rejection)

    /// ``reduce(into:_:)`` knowing who sent the action, the same in every process: the journal and every event carry
    /// the author. The default calls ``reduce(into:_:)``; implement this one to record the author — a card's
    /// owner is who added it. Then ``reduce(into:_:)`` is what an action by ``Author/unknown`` does (a daemon
    /// without a policy): usually `reduce(into: &state, action, by: .unknown)`.
    static func reduce(into state: inout State, _ action: Action, by author: Author)

    /// What `action` sets going, given `state`, the state it left (after ``reduce(into:_:)``): effects to run, timers
    /// to set or cancel. Pure and deterministic, as the reducer is — every process must compute the same list at the
    /// same seq — and called only by the daemon, which journals the list with the action, in the same transaction;
    /// replicas never call it. The default is none. docs/effects.md.
    static func effects(of action: Action, in state: State) -> [DomainEffect<Self>]

    /// How this version takes over a store written by an earlier one; empty (the default) refuses such a store.
    ///
    /// A daemon that finds a store written by an earlier version recovers it with that version's own domain
    /// type (its snapshot, and its reducer over the events after it), migrates the state through the upgrades
    /// up to this version, and journals the result as a snapshot of this version at the same seq. See
    /// ``DomainUpgrade`` and docs/domains.md, "Versions and upgrades".
    static var upgrades: [DomainUpgrade<Self>] { get }
}

extension Domain {
    /// A domain that accepts every action needs no validator.
    public static func validate(_ action: Action, in state: State) throws(Rejection) {}

    /// A domain that does not decide by author validates as ``validate(_:in:)`` does.
    public static func validate(_ action: Action, in state: State, by author: Author) throws(Rejection) {
        try validate(action, in: state)
    }

    /// A domain that does not record authors reduces as ``reduce(into:_:)`` does.
    public static func reduce(into state: inout State, _ action: Action, by author: Author) {
        reduce(into: &state, action)
    }

    /// No upgrades: a store written by another version is refused.
    public static var upgrades: [DomainUpgrade<Self>] { [] }

    /// No effects.
    public static func effects(of action: Action, in state: State) -> [DomainEffect<Self>] { [] }

    /// Whether the domain declares effects (an ``Effect`` type other than `Never`): the daemon then needs a handler
    /// for them. A domain may set timers without.
    public static var hasEffects: Bool { Effect.self != Never.self }

    /// Whether a store written by domain version `version` can be taken over by this one: it is this version,
    /// or one of ``upgrades`` starts from it or from a version that can (each step to a higher version).
    public static func canTakeOver(version: UInt32) -> Bool {
        version == Self.version || upgrade(from: version) != nil
    }

    /// The first of ``upgrades`` that leads from a store written by `version` to this one (each step to a higher
    /// version), or `nil`.
    public static func upgrade(from version: UInt32) -> DomainUpgrade<Self>? {
        upgrades.first { $0.from.version < Self.version && $0.from.canTakeOver(version: version) }
    }

    /// The domain's validator and reducer as one composable value.
    public static var reducer: Reducer<State, Action> {
        Reducer(validate: { action, state throws(Rejection) in try validate(action, in: state) }, reduce: reduce)
    }
}

/// Why an action was refused: a short machine-readable code and a sentence for the person who sent it.
public struct Rejection: Error, Hashable, Sendable, Codable, CustomStringConvertible {
    /// A stable identifier such as `out_of_range`, for programs; letters, digits and `_`.
    public var code: String
    /// What failed, with which value, and what to do instead.
    public var reason: String

    /// A rejection with a ``code`` programs can match (`invalid_action` unless given) and a ``reason`` for people.
    public init(code: String = "invalid_action", _ reason: String) {
        self.code = code
        self.reason = reason
    }

    /// The reason followed by the code in brackets, as logs and the command-line tool show it.
    public var description: String { "\(reason) [\(code)]" }
}

/// How a domain takes over a store that an earlier version of it wrote: that version's domain type (kept in the
/// code base under another type name, e.g. `BoardV1`, with its state, actions and reducer as they were) and a
/// pure function from its state to this version's state.
///
/// The old type's own ``Domain/upgrades`` chain on: `Board` (version 3) lists an upgrade from `BoardV2`, which
/// lists one from `BoardV1`, and a store of version 1 is recovered as `BoardV1`, migrated to `BoardV2` and then
/// to `Board`. The migration runs once, when the daemon opens the journal; its result is journaled.
public struct DomainUpgrade<D: Domain>: Sendable {
    /// The earlier version's domain type; its `name` is the store's name and its `version` is below `D.version`.
    public let from: any Domain.Type
    private let migrateState: @Sendable (Any) -> D.State?

    /// An upgrade from `old`: `migrate` turns the state `old` reached into this version's state. It must be pure
    /// and total, as a reducer is.
    public init<Old: Domain>(from old: Old.Type, migrate: @escaping @Sendable (Old.State) -> D.State) {
        from = old
        migrateState = { state in (state as? Old.State).map(migrate) }
    }

    /// The migrated state, or `nil` when `Old` is not ``from``.
    public func migrate<Old: Domain>(_ state: Old.State, from _: Old.Type) -> D.State? {
        migrateState(state)
    }
}

/// One thing an action sets going (``Domain/effects(of:in:)``): an effect for the leading daemon to run, or a timer
/// that sequences an action at a time, or the cancelling of one.
public enum DomainEffect<D: Domain>: Sendable {
    /// Run `effect` once the action is durable: the daemon hands it to the domain's handler, at least once, with
    /// its stable id (store, seq, index) to pass on as an idempotency key; what the handler returns comes back as
    /// actions, applied exactly once.
    case run(D.Effect)
    /// Sequence `action` at `dueMilliseconds` (milliseconds since 1970 on the wall clock, from the action's own data:
    /// never read the clock in a domain), under `key`: a timer with the same key is replaced. The daemon that leads
    /// dispatches it when it is due — at once, at start, when that time passed while no daemon ran.
    case schedule(D.Action, atMilliseconds: Int64, key: String)
    /// Cancel the timer set under `key`, if it has not fired.
    case cancel(key: String)

    /// A timer at `date`, to the millisecond below (``schedule(_:atMilliseconds:key:)``). A date no `Int64` of
    /// milliseconds holds — not finite, or hundreds of millions of years away — is taken as the farthest one on its
    /// side: such a timer never fires, or fires at once.
    public static func schedule(_ action: D.Action, at date: Date, key: String) -> Self {
        let milliseconds = (date.timeIntervalSince1970 * 1_000).rounded(.down)
        let due: Int64 =
            if milliseconds.isNaN || milliseconds >= 9.2e18 {
                .max
            } else if milliseconds <= -9.2e18 {
                .min
            } else {
                Int64(milliseconds)
            }
        return .schedule(action, atMilliseconds: due, key: key)
    }
}

extension DomainEffect: Equatable where D.Effect: Equatable, D.Action: Equatable {}
