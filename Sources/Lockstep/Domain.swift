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
}

extension Domain {
    /// A domain that accepts every action needs no validator.
    public static func validate(_ action: Action, in state: State) throws(Rejection) {}

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

    public init(code: String = "invalid_action", _ reason: String) {
        self.code = code
        self.reason = reason
    }

    public var description: String { "\(reason) [\(code)]" }
}
