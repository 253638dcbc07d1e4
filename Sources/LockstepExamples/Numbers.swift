import Lockstep

/// Seed 002's number list, fetched, added to and deleted from — where the seed crashes on a bad index,
/// this domain rejects it with a reason.
///
/// Actions on the wire: `{"fetched":{"numbers":[3,1]}}`, `{"add":{"number":5}}`, `{"delete":{"index":0}}`.
public enum Numbers: Domain {
    /// The list, in order: `{"numbers":[3,1]}` on the wire.
    public struct State: Codable, Equatable, Sendable {
        /// The numbers, in the order they were fetched and added.
        public var numbers: [Int] = []

        /// A list holding `numbers`, empty unless given.
        public init(numbers: [Int] = []) { self.numbers = numbers }
    }

    /// What can happen to the list.
    public enum Action: Codable, Equatable, Sendable {
        /// Replaces the list with what a fetch returned.
        case fetched(numbers: [Int])
        /// Appends `number`.
        case add(number: Int)
        /// Removes the number at `index`, from 0; refused with `out_of_range` when there is no such index.
        case delete(index: Int)
    }

    /// The store's name: `numbers`.
    public static let name = "numbers"
    /// The first and only version of the domain.
    public static let version: UInt32 = 1
    /// An empty list.
    public static var initialState: State { State() }

    /// Refuses, with the code `out_of_range`, a delete of an index the list does not have; accepts every other action.
    public static func validate(_ action: Action, in state: State) throws(Rejection) {
        guard case let .delete(index) = action, !state.numbers.indices.contains(index) else { return }
        let valid = state.numbers.isEmpty ? "the list is empty" : "valid indices are 0...\(state.numbers.count - 1)"
        throw Rejection(
            code: "out_of_range",
            "numbers: delete index \(index) is out of range: the list has \(state.numbers.count) numbers, so \(valid)"
        )
    }

    /// Replaces, appends to or removes from the list.
    public static func reduce(into state: inout State, _ action: Action) {
        switch action {
        case let .fetched(numbers): state.numbers = numbers
        case let .add(number): state.numbers.append(number)
        case let .delete(index): state.numbers.remove(at: index)
        }
    }
}
