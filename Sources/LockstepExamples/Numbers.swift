import Lockstep

/// Seed 002's number list, fetched, added to and deleted from — where the seed crashes on a bad index,
/// this domain rejects it with a reason.
///
/// Actions on the wire: `{"fetched":{"numbers":[3,1]}}`, `{"add":{"number":5}}`, `{"delete":{"index":0}}`.
public enum Numbers: Domain {
    public struct State: Codable, Equatable, Sendable {
        public var numbers: [Int] = []

        public init(numbers: [Int] = []) { self.numbers = numbers }
    }

    public enum Action: Codable, Equatable, Sendable {
        /// Replaces the list with what a fetch returned.
        case fetched(numbers: [Int])
        case add(number: Int)
        case delete(index: Int)
    }

    public static let name = "numbers"
    public static let version: UInt32 = 1
    public static var initialState: State { State() }

    public static func validate(_ action: Action, in state: State) throws(Rejection) {
        guard case let .delete(index) = action, !state.numbers.indices.contains(index) else { return }
        let valid = state.numbers.isEmpty ? "the list is empty" : "valid indices are 0...\(state.numbers.count - 1)"
        throw Rejection(
            code: "out_of_range",
            "numbers: delete index \(index) is out of range: the list has \(state.numbers.count) numbers, so \(valid)"
        )
    }

    public static func reduce(into state: inout State, _ action: Action) {
        switch action {
        case let .fetched(numbers): state.numbers = numbers
        case let .add(number): state.numbers.append(number)
        case let .delete(index): state.numbers.remove(at: index)
        }
    }
}
