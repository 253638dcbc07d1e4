import Lockstep

extension Counter: ActionGenerating {
    /// Up or down, with even odds.
    public static func randomAction(for state: State, using random: inout SplitMix64) -> Action {
        Bool.random(using: &random) ? .increment : .decrement
    }
}

extension Todos: ActionGenerating {
    /// Mostly adds; half the time, once a todo exists, a toggle of an id up to the next one (which exists for none, so
    /// the validator refuses it now and then); one time in ten, a new filter.
    public static func randomAction(for state: State, using random: inout SplitMix64) -> Action {
        switch Int.random(in: 0..<10, using: &random) {
        case 0..<5 where !state.list.items.isEmpty:
            // Mostly ids that exist, now and then one that does not.
            .toggle(id: Int.random(in: 1...state.list.nextID, using: &random))
        case 5:
            .setFilter(filter: Filter.allCases.randomElement(using: &random)!)
        default:
            .add(text: "todo \(random.next() % 10_000)")
        }
    }
}

extension Posts: ActionGenerating {
    /// One to three post ids out of 500, appended; one time in twenty the list is replaced by them.
    public static func randomAction(for state: State, using random: inout SplitMix64) -> Action {
        let posts = (0..<Int.random(in: 1...3, using: &random)).map { _ in "p\(random.next() % 500)" }
        return Int.random(in: 0..<20, using: &random) == 0 ? .setPosts(posts: posts) : .appendPosts(posts: posts)
    }
}

extension Numbers: ActionGenerating {
    /// Mostly adds a number below 1,000; three times in ten deletes an index up to one past the end (which the
    /// validator refuses); one time in ten replaces the list with up to five numbers, as a fetch would.
    public static func randomAction(for state: State, using random: inout SplitMix64) -> Action {
        switch Int.random(in: 0..<10, using: &random) {
        case 0:
            .fetched(numbers: (0..<Int.random(in: 0...5, using: &random)).map { _ in Int(random.next() % 100) })
        case 1..<4:
            // Sometimes one past the end, which the validator refuses.
            .delete(index: Int.random(in: 0...state.numbers.count, using: &random))
        default:
            .add(number: Int(random.next() % 1_000))
        }
    }
}

extension Reminders: ActionGenerating {
    /// Mostly adds, due within a day of a fixed time (never the clock); then completions, flags and receipts of ids up
    /// to the next one (which exists for none, so the validator refuses it now and then).
    public static func randomAction(for state: State, using random: inout SplitMix64) -> Action {
        let id = Int.random(in: 1...max(1, state.nextID), using: &random)
        switch Int.random(in: 0..<10, using: &random) {
        case 0..<3 where state.nextID > 1: return .complete(id: id)
        case 3 where state.nextID > 1: return .flagOverdue(id: id)
        case 4 where state.nextID > 1: return .notified(id: id, receipt: "r\(random.next() % 1_000)")
        default:
            let due = 1_764_200_000_000 + Int64(random.next() % 86_400_000)
            return .add(text: "reminder \(random.next() % 1_000)", dueMilliseconds: due)
        }
    }
}
