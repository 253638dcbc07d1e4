import Lockstep

/// Seed 003's counter: one number, up and down.
///
/// Actions on the wire: `{"increment":{}}`, `{"decrement":{}}`.
public enum Counter: Domain {
    /// The counter's whole state: `{"count":0}` on the wire.
    public struct State: Codable, Equatable, Sendable {
        /// The current value; it never overflows, as the validator refuses a step past `Int.max` or `Int.min`.
        public var count: Int
        /// A counter at `count`, 0 unless given.
        public init(count: Int = 0) { self.count = count }
    }

    /// The two changes: one up, one down.
    public enum Action: Codable, Equatable, Sendable {
        /// Adds 1; refused with `overflow` at `Int.max`.
        case increment
        /// Subtracts 1; refused with `overflow` at `Int.min`.
        case decrement
    }

    /// The store's name: `counter`.
    public static let name = "counter"
    /// The first and only version of the domain.
    public static let version: UInt32 = 1
    /// A count of 0.
    public static var initialState: State { State() }

    /// Refuses, with the code `overflow`, a step that would leave `Int`'s range; accepts every other.
    public static func validate(_ action: Action, in state: State) throws(Rejection) {
        switch action {
        case .increment where state.count == .max:
            throw Rejection(code: "overflow", "counter: cannot increment past \(Int.max)")
        case .decrement where state.count == .min:
            throw Rejection(code: "overflow", "counter: cannot decrement below \(Int.min)")
        default:
            break
        }
    }

    /// Adds or subtracts 1.
    public static func reduce(into state: inout State, _ action: Action) {
        switch action {
        case .increment: state.count += 1
        case .decrement: state.count -= 1
        }
    }
}
