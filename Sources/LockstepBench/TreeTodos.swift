import Lockstep

/// The todos example's domain with its state shaped as docs/domains.md recommends for a large state: the todos in a
/// `DigestedDictionary` by id (a `TreeDictionary` that keeps its members' digest sum), so a toggle copies one path of
/// the tree (not the whole list) when someone holds the state before it, subscribers compare untouched subtrees by
/// identity, and a digest of the state costs what `nextID` costs. P5 and P7 measure it beside the array-shaped
/// example.
package enum TreeTodos: Domain {
    package struct Todo: Codable, Equatable, Sendable {
        package var id: Int
        package var text: String
        package var completed: Bool
    }

    package struct State: Codable, Equatable, Sendable {
        /// By id; on the wire an object whose members are the ids, sorted (the canonical form sorts every object).
        package var todos = DigestedDictionary<Int, Todo>()
        package var nextID = 1
    }

    package enum Action: Codable, Equatable, Sendable {
        case add(text: String)
        case toggle(id: Int)
    }

    package static let name = "tree-todos"
    package static let version: UInt32 = 1
    package static var initialState: State { State() }

    package static func validate(_ action: Action, in state: State) throws(Rejection) {
        if case let .toggle(id) = action, state.todos[id] == nil {
            throw Rejection(code: "unknown_id", "tree-todos: toggle names id \(id), but no todo has that id")
        }
    }

    package static func reduce(into state: inout State, _ action: Action) {
        switch action {
        case let .add(text):
            state.todos[state.nextID] = Todo(id: state.nextID, text: text, completed: false)
            state.nextID += 1
        case let .toggle(id):
            state.todos[id]?.completed.toggle()
        }
    }
}
