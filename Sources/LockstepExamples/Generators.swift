import Lockstep

extension Counter: ActionGenerating {
    public static func randomAction(for state: State, using random: inout SplitMix64) -> Action {
        Bool.random(using: &random) ? .increment : .decrement
    }
}

extension Todos: ActionGenerating {
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
    public static func randomAction(for state: State, using random: inout SplitMix64) -> Action {
        let posts = (0..<Int.random(in: 1...3, using: &random)).map { _ in "p\(random.next() % 500)" }
        return Int.random(in: 0..<20, using: &random) == 0 ? .setPosts(posts: posts) : .appendPosts(posts: posts)
    }
}

extension Numbers: ActionGenerating {
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
