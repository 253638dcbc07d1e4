import Foundation
import Lockstep

/// A kanban board: named columns in order, each with a work-in-progress limit and the cards in it.
///
/// Actions on the wire (the JSON `board run` and `board dispatch` take):
/// `{"addColumn":{"name":"todo","wipLimit":5}}`, `{"addCard":{"title":"Write docs","column":"todo"}}`,
/// `{"addCard":{"title":"Ship","column":"todo","dueMilliseconds":1798761600000}}`,
/// `{"setDue":{"id":1,"dueMilliseconds":1798761600000}}` (without `dueMilliseconds`: no due time),
/// `{"moveCard":{"id":1,"to":"doing"}}`, `{"renameCard":{"id":1,"title":"Write the docs"}}`,
/// `{"removeCard":{"id":1}}`; and the two the daemon sends itself, `{"flagOverdue":{"id":1}}` (a due time's
/// timer) and `{"notified":{"id":1,"receipt":"…"}}` (the notification service's answer).
///
/// The daemon validates every action against the state it holds when the action's turn comes, so two
/// clients racing for the last slot of a column both pass their own replica's check and the daemon refuses
/// the second: the validator is the one place rules are enforced.
///
/// It acts on the world through ``effects(of:in:)`` (docs/effects.md): a card's due time sets a timer that flags
/// it overdue, and a card moved into the column named ``doneColumn`` is notified to an outside service, whose
/// receipt comes back as an action.
public enum Board: Domain {
    /// One card. Its id comes from ``State/nextCardID``, never from the client, so every replica agrees.
    public struct Card: Equatable, Sendable {
        /// Unique on the board, and never reused.
        public var id: Int
        /// 1...``Board/maximumTitleLength`` bytes, not only spaces.
        public var title: String
        /// When it is due, in milliseconds since 1970 (UTC), if it has a due time: a time the client put in the
        /// action (a domain never reads the clock). The timer it sets flags the card ``overdue`` then.
        public var dueMilliseconds: Int64?
        /// Whether its due time came while it was not in the done column.
        public var overdue: Bool
        /// The notification service's receipt for its last move into the done column, once the service answered.
        public var receipt: String?

        public init(
            id: Int,
            title: String,
            dueMilliseconds: Int64? = nil,
            overdue: Bool = false,
            receipt: String? = nil
        ) {
            self.id = id
            self.title = title
            self.dueMilliseconds = dueMilliseconds
            self.overdue = overdue
            self.receipt = receipt
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
        /// Puts a new card at the bottom of `column`, due at `dueMilliseconds` if given (left out of the JSON,
        /// it is `nil`: `{"addCard":{"title":"Write docs","column":"todo"}}` is still a card without a due time).
        case addCard(title: String, column: String, dueMilliseconds: Int64? = nil)
        /// Gives card `id` a due time, or takes its due time away (`nil`); either way it is not overdue any more.
        case setDue(id: Int, dueMilliseconds: Int64?)
        /// Moves a card to the bottom of another column.
        case moveCard(id: Int, to: String)
        /// Gives a card a new title; it keeps its id and its place.
        case renameCard(id: Int, title: String)
        /// Takes a card off the board; its id is not given out again.
        case removeCard(id: Int)
        /// Card `id`'s due time came: the timer its due time set dispatches this. It flags the card overdue unless
        /// the card is in the done column.
        case flagOverdue(id: Int)
        /// The notification of card `id`'s move into the done column was sent; `receipt` is the service's. The
        /// daemon dispatches it with what the effect's handler returned.
        case notified(id: Int, receipt: String)
    }

    /// What the board asks the outside world to do: run by the daemon that leads (boardd's handler), never by
    /// a replica.
    public enum Effect: Codable, Equatable, Sendable {
        /// Tell the notification service that card `card`, titled `title`, was moved into the done column.
        case notify(card: Int, title: String)
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
    /// The column whose cards are finished: a card moved into it is notified, and its due time no longer counts.
    /// A name, not a flag on the column, to keep the board simple: add a column called `done` to use it.
    public static let doneColumn = "done"
    /// The latest due time, in milliseconds since 1970: the last millisecond of the year 9999. A due time must be
    /// a date (0 or more, up to this); a timer's time must be one the daemon can keep.
    public static let maximumDueMilliseconds: Int64 = 253_402_300_799_999

    // MARK: - Reducers

    /// The rules every title follows, whichever action carries it. Stateless, so it is checked first and a bad
    /// title is reported as such even when the column or card is also wrong.
    static let titleRules = Reducer<State, Action>(
        validate: { action, _ throws(Rejection) in
            switch action {
            case let .addCard(title, _, _): try checkTitle(title, in: "addCard")
            case let .renameCard(_, title): try checkTitle(title, in: "renameCard")
            case .addColumn, .setDue, .moveCard, .removeCard, .flagOverdue, .notified: break
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
            case let .addCard(_, column, due):
                try checkDue(due, in: "addCard")
                let target = try state.requireColumn(column, in: "addCard")
                try state.requireRoom(in: target, in: "addCard")
            case let .setDue(id, due):
                try checkDue(due, in: "setDue")
                _ = try state.requireCard(id, in: "setDue")
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
            case let .flagOverdue(id):
                _ = try state.requireCard(id, in: "flagOverdue")
            case let .notified(id, _):
                // A card removed after its move into done may still get its receipt: the service was told, and
                // the receipt is simply not kept. Only an id never given out is refused.
                if !(1..<state.nextCardID).contains(id) { _ = try state.requireCard(id, in: "notified") }
            }
        },
        reduce: { state, action in
            // Total, as a reducer must be: the validator already refused what cannot be found, so the lookups
            // below succeed for every action that gets here, and do nothing otherwise.
            switch action {
            case .addColumn:
                break
            case let .addCard(title, column, due):
                guard let target = state.columnIndex(column) else { return }
                state.columns[target].cards.append(Card(id: state.nextCardID, title: title, dueMilliseconds: due))
                state.nextCardID += 1
            case let .setDue(id, due):
                guard let (column, position) = state.cardIndex(id) else { return }
                state.columns[column].cards[position].dueMilliseconds = due
                state.columns[column].cards[position].overdue = false
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
            case let .flagOverdue(id):
                guard let (column, position) = state.cardIndex(id), state.columns[column].name != doneColumn
                else { return }
                state.columns[column].cards[position].overdue = true
            case let .notified(id, receipt):
                guard let (column, position) = state.cardIndex(id) else { return }
                state.columns[column].cards[position].receipt = receipt
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

    // MARK: - Effects and timers

    /// What an action sets going, given the state it left (docs/effects.md). Pure, like the reducer: the due time
    /// comes from the action, never from the clock.
    ///
    /// - a card added with a due time, or given one by `setDue`, gets a timer under the key `due-ID` (a new due
    ///   time replaces it) that dispatches `flagOverdue(id:)` then; `setDue` without a time cancels it;
    /// - a card moved into the done column has its timer cancelled, and the service is notified: boardd's handler
    ///   answers with `notified(id:receipt:)`;
    /// - a removed card's timer is cancelled.
    ///
    /// A card in the done column has no timer: added there, it gets none; moved out again, it gets one only from
    /// a new `setDue`.
    public static func effects(of action: Action, in state: State) -> [DomainEffect<Board>] {
        switch action {
        case let .addCard(_, column, due?) where column != doneColumn:
            // The card this action added is the last id handed out.
            return [dueTimer(state.nextCardID - 1, at: due)]
        case let .setDue(id, due?) where !state.isDone(id):
            return [dueTimer(id, at: due)]
        case let .setDue(id, _):
            return [.cancel(key: dueKey(id))]
        case let .moveCard(id, to) where to == doneColumn:
            guard let card = state.card(id) else { return [] }
            let notify = DomainEffect<Board>.run(.notify(card: id, title: card.title))
            // A card without a due time has no timer to cancel.
            return card.dueMilliseconds == nil ? [notify] : [.cancel(key: dueKey(id)), notify]
        case let .removeCard(id):
            return [.cancel(key: dueKey(id))]
        case .addColumn, .addCard, .moveCard, .renameCard, .flagOverdue, .notified:
            return []
        }
    }

    /// The key of card `id`'s due-time timer: one per card, so a new due time replaces the old one.
    public static func dueKey(_ id: Int) -> String { "due-\(id)" }

    /// The timer that flags card `id` overdue at `due` (milliseconds since 1970).
    static func dueTimer(_ id: Int, at due: Int64) -> DomainEffect<Board> {
        .schedule(.flagOverdue(id: id), atMilliseconds: due, key: dueKey(id))
    }

    static func checkDue(_ due: Int64?, in action: String) throws(Rejection) {
        guard let due, !(0...maximumDueMilliseconds).contains(due) else { return }
        throw Rejection(
            code: "invalid_due",
            "board: \(action) has dueMilliseconds \(due); a due time is milliseconds since 1970, "
                + "0...\(maximumDueMilliseconds) (the end of the year 9999)"
        )
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

extension Board.Card: Codable {
    private enum CodingKeys: String, CodingKey {
        case id, title, dueMilliseconds, overdue, receipt
    }

    /// A card as JSON; the fields a card without a due time, not overdue and never notified does not need may be
    /// left out (`{"id":1,"title":"Plan"}`), as the board's journals from before due times have them.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        id = try container.decode(Int.self, forKey: .id)
        title = try container.decode(String.self, forKey: .title)
        dueMilliseconds = try container.decodeIfPresent(Int64.self, forKey: .dueMilliseconds)
        overdue = try container.decodeIfPresent(Bool.self, forKey: .overdue) ?? false
        receipt = try container.decodeIfPresent(String.self, forKey: .receipt)
    }

    /// Writes only what the card has: a card without a due time, not overdue and never notified is
    /// `{"id":1,"title":"Plan"}`, the very bytes it had before due times existed, so the state digests of
    /// journals written then stay what they were.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(id, forKey: .id)
        try container.encode(title, forKey: .title)
        try container.encodeIfPresent(dueMilliseconds, forKey: .dueMilliseconds)
        if overdue { try container.encode(overdue, forKey: .overdue) }
        try container.encodeIfPresent(receipt, forKey: .receipt)
    }
}

extension Board.State {
    /// Card `id`, if it is on the board.
    public func card(_ id: Int) -> Board.Card? {
        cardIndex(id).map { columns[$0.column].cards[$0.position] }
    }

    /// Whether card `id` is in the done column.
    public func isDone(_ id: Int) -> Bool {
        cardIndex(id).map { columns[$0.column].name == Board.doneColumn } ?? false
    }

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
