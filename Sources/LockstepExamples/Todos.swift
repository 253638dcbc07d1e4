import Lockstep

/// Redux's classic todo list (seed 001), built as seed 002 builds stores: two reducers over one state,
/// each lifted onto its own part of it.
///
/// Actions on the wire: `{"add":{"text":"Eat food"}}`, `{"toggle":{"id":1}}`,
/// `{"setFilter":{"filter":"showCompleted"}}`.
public enum Todos: Domain {
    /// One todo.
    public struct Todo: Codable, Equatable, Sendable {
        /// Its id: 1 for the first todo added, then 2, 3…; never reused.
        public var id: Int
        /// What to do: not empty, at most ``Todos/maximumTextLength`` bytes of UTF-8.
        public var text: String
        /// Whether it is done; `toggle` flips it.
        public var completed: Bool

        /// A todo with these values, not completed unless said.
        public init(id: Int, text: String, completed: Bool = false) {
            self.id = id
            self.text = text
            self.completed = completed
        }
    }

    /// Which todos a view shows.
    public enum Filter: String, Codable, Equatable, Sendable, CaseIterable {
        /// `showAll` shows every todo, `showCompleted` the completed ones, `showActive` those not completed.
        case showAll, showCompleted, showActive
    }

    /// The list and the id the next todo gets, kept together because `add` needs both.
    public struct List: Codable, Equatable, Sendable {
        /// The todos in the order they were added, which is the order of their ids.
        public var items: [Todo] = []
        /// The id the next `add` gives its todo.
        public var nextID = 1

        /// A list of `items` whose next todo gets `nextID`; `items` must be sorted by id, every id below `nextID`.
        public init(items: [Todo] = [], nextID: Int = 1) {
            self.items = items
            self.nextID = nextID
        }
    }

    /// The todo list and the filter a view applies to it: `{"filter":"showAll","list":{"items":[],"nextID":1}}` on the
    /// wire at first.
    public struct State: Codable, Equatable, Sendable {
        /// The todos, with the next id.
        public var list = List()
        /// Which todos a view shows; it changes nothing in ``list``.
        public var filter = Filter.showAll

        /// A state of `list` and `filter`, by default empty and showing all.
        public init(list: List = List(), filter: Filter = .showAll) {
            self.list = list
            self.filter = filter
        }
    }

    /// What a user can do to the list.
    public enum Action: Codable, Equatable, Sendable {
        /// Adds a todo with `text`, not completed, under the next id; refused with `empty_text` or `text_too_long`.
        case add(text: String)
        /// Flips whether todo `id` is completed; refused with `unknown_id` when no todo has that id.
        case toggle(id: Int)
        /// Shows the todos `filter` selects; always accepted.
        case setFilter(filter: Filter)
    }

    /// The store's name: `todos`.
    public static let name = "todos"
    /// The first and only version of the domain.
    public static let version: UInt32 = 1
    /// No todos, showing all, the first id 1.
    public static var initialState: State { State() }

    /// The longest text `add` accepts, in bytes of UTF-8.
    public static let maximumTextLength = 1024

    static let listReducer = Reducer<List, Action>(
        validate: { action, list throws(Rejection) in
            switch action {
            case let .add(text):
                if text.isEmpty { throw Rejection(code: "empty_text", "todos: add needs a non-empty text") }
                if text.utf8.count > maximumTextLength {
                    throw Rejection(
                        code: "text_too_long",
                        "todos: add text is \(text.utf8.count) bytes; at most \(maximumTextLength) are allowed"
                    )
                }
            case let .toggle(id):
                if list.index(of: id) == nil {
                    throw Rejection(code: "unknown_id", "todos: toggle names id \(id), but no todo has that id")
                }
            case .setFilter:
                break
            }
        },
        reduce: { list, action in
            switch action {
            case let .add(text):
                list.items.append(Todo(id: list.nextID, text: text, completed: false))
                list.nextID += 1
            case let .toggle(id):
                if let index = list.index(of: id) { list.items[index].completed.toggle() }
            case .setFilter:
                break
            }
        }
    )

    static let filterReducer = Reducer<Filter, Action> { filter, action in
        if case let .setFilter(newFilter) = action { filter = newFilter }
    }

    /// Two reducers over one state: one for the list, lifted onto ``State/list``, one for the filter, lifted onto
    /// ``State/filter``. The domain's ``validate(_:in:)`` and ``reduce(into:_:)`` are this value's.
    public static let reducer = Reducer<State, Action>(
        combining: listReducer.lifted(into: \State.list),
        filterReducer.lifted(into: \State.filter)
    )

    /// Validates through ``reducer``: an `add` of an empty or too long text, or a `toggle` of an unknown id, is
    /// refused.
    public static func validate(_ action: Action, in state: State) throws(Rejection) {
        try reducer.validate(action, state)
    }

    /// Applies the action through ``reducer``.
    public static func reduce(into state: inout State, _ action: Action) {
        reducer.reduce(&state, action)
    }
}

extension Todos.List {
    /// Ids are handed out in increasing order and never reused, so the list is sorted by id.
    func index(of id: Int) -> Int? {
        var low = 0
        var high = items.count
        while low < high {
            let mid = (low + high) / 2
            if items[mid].id < id { low = mid + 1 } else { high = mid }
        }
        return low < items.count && items[low].id == id ? low : nil
    }
}
