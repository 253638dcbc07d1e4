import Lockstep

/// A kanban board: named columns in order, each with a work-in-progress limit and the cards in it.
///
/// Actions on the wire (the JSON `board run` and `board dispatch` take):
/// `{"addColumn":{"name":"todo","wipLimit":5}}`, `{"addCard":{"title":"Write docs","column":"todo"}}`,
/// `{"moveCard":{"id":1,"to":"doing"}}`, `{"renameCard":{"id":1,"title":"Write the docs"}}`,
/// `{"removeCard":{"id":1}}`.
///
/// The daemon validates every action against the state it holds when the action's turn comes, so two
/// clients racing for the last slot of a column both pass their own replica's check and the daemon refuses
/// the second: the validator is the one place rules are enforced.
public enum Board: Domain {
    /// One card. Its id comes from ``State/nextCardID``, never from the client, so every replica agrees.
    public struct Card: Codable, Equatable, Sendable {
        /// Unique on the board, and never reused.
        public var id: Int
        /// 1...``Board/maximumTitleLength`` bytes, not only spaces.
        public var title: String

        public init(id: Int, title: String) {
            self.id = id
            self.title = title
        }
    }

    /// One column: its cards in the order they arrived, at most ``wipLimit`` of them.
    public struct Column: Codable, Equatable, Sendable {
        /// Unique on the board; actions name columns by it.
        public var name: String
        /// The most cards the column may hold, 1...``Board/maximumWIPLimit``.
        public var wipLimit: Int
        /// Oldest arrival first.
        public var cards: [Card]

        public init(name: String, wipLimit: Int, cards: [Card] = []) {
            self.name = name
            self.wipLimit = wipLimit
            self.cards = cards
        }

        /// Whether another card would break the column's limit.
        public var isFull: Bool { cards.count >= wipLimit }
    }

    /// The board. Columns are an array, not a dictionary keyed by name: their order is part of the board, and
    /// an array encodes and iterates the same way in every process.
    public struct State: Codable, Equatable, Sendable {
        /// Left to right, in the order they were added.
        public var columns: [Column]
        /// The id the next card gets; ids are never reused, even after a card is removed.
        public var nextCardID: Int

        public init(columns: [Column] = [], nextCardID: Int = 1) {
            self.columns = columns
            self.nextCardID = nextCardID
        }
    }

    /// Every change a board can go through.
    public enum Action: Codable, Equatable, Sendable {
        /// Appends an empty column on the right.
        case addColumn(name: String, wipLimit: Int)
        /// Puts a new card at the bottom of `column`.
        case addCard(title: String, column: String)
        /// Moves a card to the bottom of another column.
        case moveCard(id: Int, to: String)
        /// Gives a card a new title; it keeps its id and its place.
        case renameCard(id: Int, title: String)
        /// Takes a card off the board; its id is not given out again.
        case removeCard(id: Int)
    }

    /// The store's name on the wire, in the journal and on the command line (`board state board`).
    public static let name = "board"
    /// Bump when the state, the actions or the reducer change meaning; a daemon refuses peers of another version.
    public static let version: UInt32 = 1
    /// An empty board: no columns, and the first card will get id 1.
    public static var initialState: State { State() }

    /// The longest column name, in bytes of UTF-8: names are typed on the command line and shown as headers.
    public static let maximumNameLength = 32
    /// The longest card title, in bytes of UTF-8: it bounds what one action can add to every replica's memory.
    public static let maximumTitleLength = 200
    /// The largest WIP limit: a limit is a promise to finish work, and a huge one promises nothing.
    public static let maximumWIPLimit = 100

    // MARK: - Reducers

    /// The rules every title follows, whichever action carries it. Stateless, so it is checked first and a bad
    /// title is reported as such even when the column or card is also wrong.
    static let titleRules = Reducer<State, Action>(
        validate: { action, _ throws(Rejection) in
            switch action {
            case let .addCard(title, _): try checkTitle(title, in: "addCard")
            case let .renameCard(_, title): try checkTitle(title, in: "renameCard")
            case .addColumn, .moveCard, .removeCard: break
            }
        },
        reduce: { _, _ in }
    )

    /// The column list: only `addColumn` changes it, and it needs nothing but the columns, so it works on that
    /// part of the state and is lifted into it.
    static let columnsReducer = Reducer<[Column], Action>(
        validate: { action, columns throws(Rejection) in
            guard case let .addColumn(name, wipLimit) = action else { return }
            if name.allSatisfy(\.isWhitespace) {
                throw Rejection(code: "empty_name", "board: addColumn needs a name with something besides spaces")
            }
            if name.utf8.count > maximumNameLength {
                throw Rejection(
                    code: "name_too_long",
                    "board: addColumn name '\(name)' is \(name.utf8.count) bytes; at most \(maximumNameLength) "
                        + "are allowed, so shorten it"
                )
            }
            if columns.contains(where: { $0.name == name }) {
                throw Rejection(
                    code: "duplicate_column",
                    "board: addColumn names '\(name)', but the board already has a column of that name; pick "
                        + "another name"
                )
            }
            if !(1...maximumWIPLimit).contains(wipLimit) {
                throw Rejection(
                    code: "invalid_wip_limit",
                    "board: addColumn '\(name)' has wipLimit \(wipLimit); it must be 1...\(maximumWIPLimit)"
                )
            }
        },
        reduce: { columns, action in
            guard case let .addColumn(name, wipLimit) = action else { return }
            columns.append(Column(name: name, wipLimit: wipLimit))
        }
    )

    /// The cards: they need the columns (to find one and check its limit) and the id counter, so this reducer
    /// works on the whole state.
    static let cardsReducer = Reducer<State, Action>(
        validate: { action, state throws(Rejection) in
            switch action {
            case .addColumn:
                break
            case let .addCard(_, column):
                let target = try state.requireColumn(column, in: "addCard")
                try state.requireRoom(in: target, in: "addCard")
            case let .moveCard(id, to):
                let (from, _) = try state.requireCard(id, in: "moveCard")
                let target = try state.requireColumn(to, in: "moveCard")
                if from == target {
                    throw Rejection(
                        code: "same_column",
                        "board: moveCard \(id) to '\(to)', but card \(id) is already there; name another column"
                    )
                }
                try state.requireRoom(in: target, in: "moveCard")
            case let .renameCard(id, _):
                _ = try state.requireCard(id, in: "renameCard")
            case let .removeCard(id):
                _ = try state.requireCard(id, in: "removeCard")
            }
        },
        reduce: { state, action in
            // Total, as a reducer must be: the validator already refused what cannot be found, so the lookups
            // below succeed for every action that gets here, and do nothing otherwise.
            switch action {
            case .addColumn:
                break
            case let .addCard(title, column):
                guard let target = state.columnIndex(column) else { return }
                state.columns[target].cards.append(Card(id: state.nextCardID, title: title))
                state.nextCardID += 1
            case let .moveCard(id, to):
                guard let (from, position) = state.cardIndex(id), let target = state.columnIndex(to) else { return }
                let card = state.columns[from].cards.remove(at: position)
                state.columns[target].cards.append(card)
            case let .renameCard(id, title):
                guard let (column, position) = state.cardIndex(id) else { return }
                state.columns[column].cards[position].title = title
            case let .removeCard(id):
                guard let (column, position) = state.cardIndex(id) else { return }
                state.columns[column].cards.remove(at: position)
            }
        }
    )

    /// The whole domain: title rules, then columns, then cards. Every validator sees the state from before the
    /// action, and all must accept it before any reducer runs, so a refused action changes nothing.
    public static let reducer = Reducer<State, Action>(
        combining: titleRules,
        columnsReducer.lifted(into: \State.columns),
        cardsReducer
    )

    /// Refuses what the rules forbid, with a code (`unknown_column`, `column_full`, …) and a reason naming the
    /// value; the daemon runs it on every action before sequencing, replicas never need to.
    public static func validate(_ action: Action, in state: State) throws(Rejection) {
        try reducer.validate(action, state)
    }

    /// Applies an action the validator accepted; pure, so every replica reaches the same board.
    public static func reduce(into state: inout State, _ action: Action) {
        reducer.reduce(&state, action)
    }

    static func checkTitle(_ title: String, in action: String) throws(Rejection) {
        if title.allSatisfy(\.isWhitespace) {
            throw Rejection(code: "empty_title", "board: \(action) needs a title with something besides spaces")
        }
        if title.utf8.count > maximumTitleLength {
            throw Rejection(
                code: "title_too_long",
                "board: \(action) title is \(title.utf8.count) bytes; at most \(maximumTitleLength) are allowed, "
                    + "so shorten it"
            )
        }
    }
}

extension Board.State {
    /// The index of the column called `name`. A linear search: boards have a handful of columns, and an array
    /// keeps their order without a second index to keep in step.
    public func columnIndex(_ name: String) -> Int? {
        columns.firstIndex { $0.name == name }
    }

    /// Where card `id` is: its column's index and its position in that column.
    public func cardIndex(_ id: Int) -> (column: Int, position: Int)? {
        for (column, entry) in columns.enumerated() {
            if let position = entry.cards.firstIndex(where: { $0.id == id }) { return (column, position) }
        }
        return nil
    }

    /// The index of column `name`, or a rejection listing the columns there are.
    func requireColumn(_ name: String, in action: String) throws(Rejection) -> Int {
        if let index = columnIndex(name) { return index }
        let known =
            columns.isEmpty
            ? "the board has no columns yet; add one with addColumn"
            : "the columns are " + columns.map { "'\($0.name)'" }.joined(separator: ", ")
        throw Rejection(
            code: "unknown_column",
            "board: \(action) names column '\(name)', which does not exist: \(known)"
        )
    }

    /// Refuses a card for a column that is at its WIP limit.
    func requireRoom(in column: Int, in action: String) throws(Rejection) {
        let target = columns[column]
        guard target.isFull else { return }
        throw Rejection(
            code: "column_full",
            "board: \(action) into '\(target.name)', but it is at its WIP limit of \(target.wipLimit) "
                + (target.wipLimit == 1 ? "card" : "cards") + "; move or remove a card there first"
        )
    }

    /// Where card `id` is, or a rejection saying which ids exist.
    func requireCard(_ id: Int, in action: String) throws(Rejection) -> (column: Int, position: Int) {
        if let found = cardIndex(id) { return found }
        let hint =
            if (1..<nextCardID).contains(id) {
                "card \(id) was removed"
            } else if nextCardID == 1 {
                "the board has no cards yet; add one with addCard"
            } else {
                "the ids given so far are 1...\(nextCardID - 1)"
            }
        throw Rejection(code: "unknown_card", "board: \(action) names card \(id), but no card has that id (\(hint))")
    }
}
