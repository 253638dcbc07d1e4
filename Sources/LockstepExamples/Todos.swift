import Lockstep

/// Redux's classic todo list (seed 001), built as seed 002 builds stores: two reducers over one state,
/// each lifted onto its own part of it.
///
/// Actions on the wire: `{"add":{"text":"Eat food"}}`, `{"toggle":{"id":1}}`,
/// `{"setFilter":{"filter":"showCompleted"}}`.
public enum Todos: Domain {
    public struct Todo: Codable, Equatable, Sendable {
        public var id: Int
        public var text: String
        public var completed: Bool

        public init(id: Int, text: String, completed: Bool = false) {
            self.id = id
            self.text = text
            self.completed = completed
        }
    }

    /// Which todos a view shows.
    public enum Filter: String, Codable, Equatable, Sendable, CaseIterable {
        case showAll, showCompleted, showActive
    }

    /// The list and the id the next todo gets, kept together because `add` needs both.
    public struct List: Codable, Equatable, Sendable {
        public var items: [Todo] = []
        public var nextID = 1

        public init(items: [Todo] = [], nextID: Int = 1) {
            self.items = items
            self.nextID = nextID
        }
    }

    public struct State: Codable, Equatable, Sendable {
        public var list = List()
        public var filter = Filter.showAll

        public init(list: List = List(), filter: Filter = .showAll) {
            self.list = list
            self.filter = filter
        }
    }

    public enum Action: Codable, Equatable, Sendable {
        case add(text: String)
        case toggle(id: Int)
        case setFilter(filter: Filter)
    }

    public static let name = "todos"
    public static let version: UInt32 = 1
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

    public static let reducer = Reducer<State, Action>(
        combining: listReducer.lifted(into: \State.list),
        filterReducer.lifted(into: \State.filter)
    )

    public static func validate(_ action: Action, in state: State) throws(Rejection) {
        try reducer.validate(action, state)
    }

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
