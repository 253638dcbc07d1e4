import Lockstep

/// Seed 003's counter: one number, up and down.
///
/// Actions on the wire: `{"increment":{}}`, `{"decrement":{}}`.
public enum Counter: Domain {
    public struct State: Codable, Equatable, Sendable {
        public var count: Int
        public init(count: Int = 0) { self.count = count }
    }

    public enum Action: Codable, Equatable, Sendable {
        case increment
        case decrement
    }

    public static let name = "counter"
    public static let version: UInt32 = 1
    public static var initialState: State { State() }

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

    public static func reduce(into state: inout State, _ action: Action) {
        switch action {
        case .increment: state.count += 1
        case .decrement: state.count -= 1
        }
    }
}
