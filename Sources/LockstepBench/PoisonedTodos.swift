import Lockstep
import LockstepExamples

/// A todos domain whose actions include adding a todo by its text: ``Poisoned`` plants its bug on one.
package protocol AddsTodos: Domain {
    /// The action that adds a todo with `text`.
    static func adding(_ text: String) -> Action
    /// The text `action` adds a todo with; `nil` for any other action.
    static func textAdded(by action: Action) -> String?
}

extension Todos: AddsTodos {
    package static func adding(_ text: String) -> Action { .add(text: text) }
    package static func textAdded(by action: Action) -> String? {
        if case let .add(text) = action { text } else { nil }
    }
}

extension TreeTodos: AddsTodos {
    package static func adding(_ text: String) -> Action { .add(text: text) }
    package static func textAdded(by action: Action) -> String? {
        if case let .add(text) = action { text } else { nil }
    }
}

/// `Base` with one planted bug: an add whose text is ``poison`` is added with another text. A replica built with it
/// diverges from a daemon running `Base` at that action's seq; P7 times how long it takes to find out in a large
/// state, where the digest is taken off the daemon's and the replica's loops (for `todos`), or over a digest form that
/// condenses the todos (for `tree-todos`).
package enum Poisoned<Base: AddsTodos>: Domain {
    package typealias State = Base.State
    package typealias Action = Base.Action

    package static var name: String { Base.name }
    package static var version: UInt32 { Base.version }
    package static var initialState: State { Base.initialState }
    /// The text the bug is planted on.
    package static var poison: String { "poison" }

    package static func validate(_ action: Action, in state: State) throws(Rejection) {
        try Base.validate(action, in: state)
    }

    package static func reduce(into state: inout State, _ action: Action) {
        if Base.textAdded(by: action) == poison {
            Base.reduce(into: &state, Base.adding("not \(poison)"))
        } else {
            Base.reduce(into: &state, action)
        }
    }
}
