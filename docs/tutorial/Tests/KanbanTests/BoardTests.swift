import Kanban
import Lockstep
import LockstepTesting
import Testing

/// A board with two columns: `todo` (limit 3) holding cards 1 and 2, and `doing` (limit 1) holding card 3.
let sample = Board.State(
    columns: [
        Board.Column(name: "todo", wipLimit: 3, cards: [.init(id: 1, title: "Plan"), .init(id: 2, title: "Write")]),
        Board.Column(name: "doing", wipLimit: 1, cards: [.init(id: 3, title: "Review")]),
    ],
    nextCardID: 5  // card 4 was added and removed
)

/// The rejection code `action` gets on `state`, or `nil` when it passes.
func rejection(_ action: Board.Action, on state: Board.State = sample) -> String? {
    do {
        try Board.validate(action, in: state)
        return nil
    } catch {
        return error.code
    }
}

@Suite struct BoardTests {
    /// The replay harness over 20 seeded sequences of generated actions, here and in child processes of the
    /// package's own tool: the reducer is deterministic, whatever the process's hash seed, and the state survives
    /// encode/decode round trips.
    @Test func isDeterministic() async throws {
        try await offPool { try DeterminismCheck(Board.self, children: [.packageTool("board")]).run() }
    }

    @Test func aShortSequenceGivesExactlyThisBoard() throws {
        var state = Board.initialState
        let actions: [Board.Action] = [
            .addColumn(name: "todo", wipLimit: 3),
            .addColumn(name: "done", wipLimit: 2),
            .addCard(title: "Plan", column: "todo"),
            .addCard(title: "Write", column: "todo"),
            .moveCard(id: 1, to: "done"),
            .renameCard(id: 2, title: "Write the tutorial"),
            .addCard(title: "Typo", column: "todo"),
            .removeCard(id: 3),
            .addCard(title: "Publish", column: "todo"),
        ]
        for action in actions {
            try Board.validate(action, in: state)
            Board.reduce(into: &state, action)
        }
        #expect(
            state
                == Board.State(
                    columns: [
                        Board.Column(
                            name: "todo",
                            wipLimit: 3,
                            cards: [.init(id: 2, title: "Write the tutorial"), .init(id: 4, title: "Publish")]
                        ),
                        Board.Column(name: "done", wipLimit: 2, cards: [.init(id: 1, title: "Plan")]),
                    ],
                    // Id 3 was removed and is not given out again.
                    nextCardID: 5
                )
        )
    }

    @Test(
        arguments: [
            (Board.Action.addColumn(name: "", wipLimit: 2), "empty_name"),
            (.addColumn(name: "   ", wipLimit: 2), "empty_name"),
            (.addColumn(name: String(repeating: "x", count: 33), wipLimit: 2), "name_too_long"),
            (.addColumn(name: "todo", wipLimit: 2), "duplicate_column"),
            (.addColumn(name: "done", wipLimit: 0), "invalid_wip_limit"),
            (.addColumn(name: "done", wipLimit: 101), "invalid_wip_limit"),
            (.addCard(title: "", column: "todo"), "empty_title"),
            (.addCard(title: String(repeating: "y", count: 201), column: "todo"), "title_too_long"),
            (.renameCard(id: 1, title: " "), "empty_title"),
            (.addCard(title: "Ship", column: "done"), "unknown_column"),
            (.moveCard(id: 1, to: "done"), "unknown_column"),
            (.addCard(title: "Ship", column: "doing"), "column_full"),
            (.moveCard(id: 1, to: "doing"), "column_full"),
            (.moveCard(id: 1, to: "todo"), "same_column"),
            (.moveCard(id: 4, to: "doing"), "unknown_card"),
            (.renameCard(id: 9, title: "Ship"), "unknown_card"),
            (.removeCard(id: 0), "unknown_card"),
        ]
    )
    func refuses(_ action: Board.Action, with code: String) {
        #expect(rejection(action) == code)
    }

    @Test func aTitleIsCheckedBeforeTheColumn() {
        // Both are wrong; the title is reported, since it is wrong whatever the board holds.
        #expect(rejection(.addCard(title: "", column: "nowhere")) == "empty_title")
    }

    @Test func reasonsNameTheValueAndWhatToDo() throws {
        let error = try #require(throws: Rejection.self) {
            try Board.validate(.moveCard(id: 1, to: "doing"), in: sample)
        }
        #expect(
            error.reason
                == "board: moveCard into 'doing', but it is at its WIP limit of 1 card; move or remove a card there "
                + "first"
        )
        let unknown = try #require(throws: Rejection.self) {
            try Board.validate(.addCard(title: "Ship", column: "done"), in: sample)
        }
        #expect(unknown.reason.contains("'done'") && unknown.reason.contains("'todo', 'doing'"))
    }

    @Test func validActionsPass() {
        #expect(rejection(.addColumn(name: "done", wipLimit: 5)) == nil)
        #expect(rejection(.addCard(title: "Ship", column: "todo")) == nil)
        #expect(rejection(.moveCard(id: 3, to: "todo")) == nil)
        #expect(rejection(.renameCard(id: 2, title: "Write more")) == nil)
        #expect(rejection(.removeCard(id: 3)) == nil)
    }

    @Test func mostGeneratedActionsPass() {
        // A generator that mostly makes refused actions would test the rejection path and little else.
        var random = SplitMix64(seed: 7)
        var state = Board.initialState
        var passed = 0
        for _ in 0..<1_000 {
            let action = Board.randomAction(for: state, using: &random)
            guard rejection(action, on: state) == nil else { continue }
            Board.reduce(into: &state, action)
            passed += 1
        }
        #expect(passed > 700)
    }

    @Test func theGeneratorMakesEveryKindOfAction() {
        // What DeterminismCheck replays is what the generator makes: each action, with a due time and without,
        // and the two the daemon sends itself, must come up.
        var random = SplitMix64(seed: 7)
        var state = Board.initialState
        var kinds = Set<String>()
        for _ in 0..<1_000 {
            let action = Board.randomAction(for: state, using: &random)
            guard rejection(action, on: state) == nil else { continue }
            Board.reduce(into: &state, action)
            let kind =
                switch action {
                case .addColumn: "addColumn"
                case .addCard(_, _, nil): "addCard"
                case .addCard: "addCard with a due time"
                case .setDue(_, nil): "setDue without a time"
                case .setDue: "setDue"
                case .moveCard(_, Board.doneColumn): "moveCard into done"
                case .moveCard: "moveCard"
                case .renameCard: "renameCard"
                case .removeCard: "removeCard"
                case .flagOverdue: "flagOverdue"
                case .notified: "notified"
                }
            kinds.insert(kind)
        }
        #expect(kinds.count == 11, "\(kinds.sorted())")
    }
}
