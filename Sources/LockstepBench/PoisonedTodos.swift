import Lockstep
import LockstepExamples

/// The todos domain with one planted bug: an `add` whose text is ``poison`` is added with another text. A replica
/// built with it diverges from a daemon running `Todos` at that action's seq; P7 times how long it takes to find out
/// in a large state, where the digest is taken off the daemon's and the replica's loops.
package enum PoisonedTodos: Domain {
    package typealias State = Todos.State
    package typealias Action = Todos.Action

    package static let name = Todos.name
    package static let version = Todos.version
    package static var initialState: State { Todos.initialState }
    /// The text the bug is planted on.
    package static let poison = "poison"

    package static func validate(_ action: Action, in state: State) throws(Rejection) {
        try Todos.validate(action, in: state)
    }

    package static func reduce(into state: inout State, _ action: Action) {
        if case let .add(text) = action, text == poison {
            Todos.reduce(into: &state, .add(text: "not \(poison)"))
        } else {
            Todos.reduce(into: &state, action)
        }
    }
}
