import Lockstep

/// Plausible actions for demos, `board-client`, `board replay --generate` and ``DeterminismCheck``.
///
/// Mostly valid ones, and now and then one the validator refuses (a duplicate column, an unknown card or
/// column, a move into a full column, an empty title), so the rejection path runs too. Column names come from
/// a short fixed list, so the number of columns — and with the WIP limits, of cards — stays bounded however
/// long a run is.
///
/// Due times come from a fixed base, never from the clock, so a seed gives the same actions on any day. The
/// base is in the past: against a daemon, every timer a generated due time sets fires at once. The actions the
/// daemon sends itself, `flagOverdue` (a timer's) and `notified` (a handler's result), are generated too, now and
/// then, so that ``DeterminismCheck`` replays their reducers as a journal holds them.
extension Board: ActionGenerating {
    /// The names generated columns get.
    static let generatedColumnNames = ["todo", "doing", "review", "done", "blocked", "icebox"]
    /// The earliest generated due time: 2024-01-01T00:00:00Z, in milliseconds since 1970.
    static let generatedDueBase: Int64 = 1_704_067_200_000

    /// A due time within 30 days of ``generatedDueBase``.
    static func generatedDue(using random: inout SplitMix64) -> Int64 {
        generatedDueBase + Int64(random.next() % 2_592_000_000)
    }

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
        switch Int.random(in: 0..<25, using: &random) {
        case 0..<2 where careless || !unused.isEmpty:
            let name = careless ? nil : unused.randomElement(using: &random)
            return .addColumn(
                name: name ?? generatedColumnNames.randomElement(using: &random)!,
                wipLimit: Int.random(in: 1...8, using: &random)
            )
        case 0..<7:
            return .addCard(title: "card \(random.next() % 10_000)", column: target)
        case 7..<10:
            let due = generatedDue(using: &random)
            return .addCard(title: "due \(random.next() % 10_000)", column: target, dueMilliseconds: due)
        case 10..<15:
            return .moveCard(id: id, to: target)
        case 15..<18:
            return .renameCard(id: id, title: "renamed \(random.next() % 10_000)")
        case 18..<20:
            // Mostly a due time, now and then none (which cancels the card's timer).
            let due = Int.random(in: 0..<4, using: &random) == 0 ? nil : generatedDue(using: &random)
            return .setDue(id: id, dueMilliseconds: due)
        case 20..<22:
            return .removeCard(id: id)
        case 22:
            return .flagOverdue(id: id)
        case 23:
            return .notified(id: id, receipt: "receipt \(random.next() % 10_000)")
        default:
            // Refused on purpose: an empty title, or a column no generated board has.
            return Bool.random(using: &random)
                ? .addCard(title: "", column: target) : .moveCard(id: id, to: "archive")
        }
    }
}
