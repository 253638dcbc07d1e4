/// A validator and a reducer over one state and one action type, as a value that composes.
///
/// `Reducer(combining:)` runs several reducers over one state in order (seed 002's list);
/// ``lifted(into:)`` and ``lifted(into:action:)`` move a child's reducer onto a part of a parent state
/// (seed 000's sub-state).
public struct Reducer<State, Action>: Sendable {
    /// Throws when the action must not be applied to the state; never changes anything.
    public let validate: @Sendable (Action, State) throws(Rejection) -> Void
    /// Applies an action that passed `validate`; never fails.
    public let reduce: @Sendable (inout State, Action) -> Void

    /// A reducer from its two halves; without `validate`, every action is accepted.
    public init(
        validate: @escaping @Sendable (Action, State) throws(Rejection) -> Void = { _, _ in },
        reduce: @escaping @Sendable (inout State, Action) -> Void
    ) {
        self.validate = validate
        self.reduce = reduce
    }

    /// Several reducers over one state, in order.
    ///
    /// Every validator sees the state as it was before the action, and all of them must accept it before
    /// any reducer runs, so a rejected action changes nothing.
    public init(combining reducers: [Reducer]) {
        self.init(
            validate: { action, state throws(Rejection) in
                for reducer in reducers { try reducer.validate(action, state) }
            },
            reduce: { state, action in
                for reducer in reducers { reducer.reduce(&state, action) }
            }
        )
    }

    /// Several reducers over one state, in order.
    public init(combining reducers: Reducer...) {
        self.init(combining: reducers)
    }

    /// This reducer working on the part of a larger state at `keyPath`, for the same actions.
    public func lifted<Parent>(into keyPath: WritableKeyPath<Parent, State> & Sendable) -> Reducer<Parent, Action> {
        Reducer<Parent, Action>(
            validate: { action, parent throws(Rejection) in try validate(action, parent[keyPath: keyPath]) },
            reduce: { parent, action in reduce(&parent[keyPath: keyPath], action) }
        )
    }

    /// This reducer working on the part of a larger state at `keyPath`, for the parent actions that
    /// `extract` maps to one of ours; the others pass by untouched.
    public func lifted<Parent, ParentAction>(
        into keyPath: WritableKeyPath<Parent, State> & Sendable,
        action extract: @escaping @Sendable (ParentAction) -> Action?
    ) -> Reducer<Parent, ParentAction> {
        Reducer<Parent, ParentAction>(
            validate: { parentAction, parent throws(Rejection) in
                guard let action = extract(parentAction) else { return }
                try validate(action, parent[keyPath: keyPath])
            },
            reduce: { parent, parentAction in
                guard let action = extract(parentAction) else { return }
                reduce(&parent[keyPath: keyPath], action)
            }
        )
    }
}
