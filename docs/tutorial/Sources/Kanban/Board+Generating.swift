import Lockstep

/// Plausible actions for demos, `board-client`, `board replay --generate` and ``DeterminismCheck``.
///
/// Mostly valid ones, and now and then one the validator refuses (a duplicate column, an unknown card or
/// column, a move into a full column, an empty title), so the rejection path runs too. Column names come from
/// a short fixed list, so the number of columns — and with the WIP limits, of cards — stays bounded however
/// long a run is.
extension Board: ActionGenerating {
    /// The names generated columns get.
    static let generatedColumnNames = ["todo", "doing", "review", "done", "blocked", "icebox"]

    /// An action to try on `state`: draws only from `random`, so a seed gives the same actions everywhere.
    public static func randomAction(for state: State, using random: inout SplitMix64) -> Action {
        // No column yet: nothing else could pass.
        guard let anyColumn = state.columns.randomElement(using: &random)?.name else {
            return .addColumn(name: "todo", wipLimit: Int.random(in: 2...8, using: &random))
        }
        // Mostly a column with room and a card that exists; now and then whatever comes, which the validator
        // may refuse (a full column, the card's own column, a removed id).
        let careless = Int.random(in: 0..<10, using: &random) == 0
        let roomy = careless ? anyColumn : state.columns.filter { !$0.isFull }.randomElement(using: &random)?.name
        let card = careless ? nil : state.columns.flatMap(\.cards).randomElement(using: &random)?.id
        let target = roomy ?? anyColumn
        let id = card ?? Int.random(in: 1...state.nextCardID, using: &random)
        // Every column full: make room, or the board would only ever refuse cards from here on.
        if roomy == nil, let card { return .removeCard(id: card) }
        let unused = generatedColumnNames.filter { state.columnIndex($0) == nil }
        switch Int.random(in: 0..<20, using: &random) {
        case 0..<2 where careless || !unused.isEmpty:
            let name = careless ? nil : unused.randomElement(using: &random)
            return .addColumn(
                name: name ?? generatedColumnNames.randomElement(using: &random)!,
                wipLimit: Int.random(in: 1...8, using: &random)
            )
        case 0..<9:
            return .addCard(title: "card \(random.next() % 10_000)", column: target)
        case 9..<14:
            return .moveCard(id: id, to: target)
        case 14..<17:
            return .renameCard(id: id, title: "renamed \(random.next() % 10_000)")
        case 17..<19:
            return .removeCard(id: id)
        default:
            // Refused on purpose: an empty title, or a column no generated board has.
            return Bool.random(using: &random)
                ? .addCard(title: "", column: target) : .moveCard(id: id, to: "archive")
        }
    }
}
