import Lockstep
import Testing

@Suite struct CompositionTests {
    struct Log: Equatable, Sendable { var entries: [String] = [] }

    enum Step: Codable, Equatable, Sendable { case go, refuseSecond }

    static func appending(_ name: String, refuseOn refused: Step? = nil) -> Reducer<Log, Step> {
        Reducer(
            validate: { step, _ throws(Rejection) in
                if step == refused { throw Rejection(code: "refused", "\(name) refuses") }
            },
            reduce: { log, _ in log.entries.append(name) }
        )
    }

    @Test func combinedReducersRunInOrder() {
        let reducer = Reducer(combining: Self.appending("first"), Self.appending("second"), Self.appending("third"))
        var log = Log()
        reducer.reduce(&log, .go)
        #expect(log.entries == ["first", "second", "third"])
    }

    @Test func anyRefusalInACombinationRefusesTheWholeAction() async {
        let reducer = Reducer(combining: Self.appending("first"), Self.appending("second", refuseOn: .refuseSecond))
        let store = Store(name: "log", initialState: Log(), reducer: reducer, observers: ActionObservers())
        await #expect(throws: Rejection(code: "refused", "second refuses")) {
            try await store.dispatch(.refuseSecond)
        }
        #expect(store.state == Log())
    }

    struct Parent: Equatable, Sendable {
        var left = Log()
        var right = Log()
        var untouched = 42
    }

    enum ParentAction: Codable, Equatable, Sendable {
        case left(Step)
        case right(Step)
    }

    @Test func liftedReducerChangesOnlyItsPart() {
        let reducer = Reducer<Parent, Step>(
            combining: Self.appending("L").lifted(into: \Parent.left),
            Self.appending("R").lifted(into: \Parent.right)
        )
        var parent = Parent()
        reducer.reduce(&parent, .go)
        #expect(parent == Parent(left: Log(entries: ["L"]), right: Log(entries: ["R"]), untouched: 42))
    }

    @Test func liftedReducerSeesOnlyTheActionsMappedToIt() throws {
        let left = Self.appending("L", refuseOn: .refuseSecond).lifted(into: \Parent.left) { (action: ParentAction) in
            if case let .left(step) = action { step } else { nil }
        }
        let right = Self.appending("R").lifted(into: \Parent.right) { (action: ParentAction) in
            if case let .right(step) = action { step } else { nil }
        }
        let reducer = Reducer(combining: left, right)
        var parent = Parent()
        reducer.reduce(&parent, .left(.go))
        reducer.reduce(&parent, .right(.go))
        reducer.reduce(&parent, .right(.go))
        #expect(parent == Parent(left: Log(entries: ["L"]), right: Log(entries: ["R", "R"]), untouched: 42))
        #expect(throws: Rejection.self) { try reducer.validate(.left(.refuseSecond), parent) }
        try reducer.validate(.right(.refuseSecond), parent)
    }
}
