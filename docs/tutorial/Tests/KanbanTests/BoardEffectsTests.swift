import Foundation
import Kanban
import Lockstep
import Testing

/// `sample` with a `done` column (limit 2) holding card 4, due at `due`.
let withDone = Board.State(
    columns: sample.columns + [
        Board.Column(name: "done", wipLimit: 2, cards: [.init(id: 4, title: "Design", dueMilliseconds: due)])
    ],
    nextCardID: 5
)

/// A due time: 2026-01-01T00:00:00Z.
let due: Int64 = 1_767_225_600_000

/// `action` validated and applied to `state`, as the daemon does: the state it left, and what it sets going.
func apply(_ action: Board.Action, to state: Board.State) throws -> (Board.State, [DomainEffect<Board>]) {
    var state = state
    try Board.validate(action, in: state)
    Board.reduce(into: &state, action)
    return (state, Board.effects(of: action, in: state))
}

/// The timer a due time sets.
func timer(_ id: Int, _ milliseconds: Int64) -> DomainEffect<Board> {
    .schedule(.flagOverdue(id: id), atMilliseconds: milliseconds, key: "due-\(id)")
}

@Suite struct BoardEffectsTests {
    @Test func aCardAddedWithADueTimeGetsATimerThatFlagsItOverdue() throws {
        let (state, effects) = try apply(.addCard(title: "Ship", column: "todo", dueMilliseconds: due), to: sample)
        #expect(state.card(5) == Board.Card(id: 5, title: "Ship", dueMilliseconds: due))
        #expect(effects == [timer(5, due)])
    }

    @Test func aCardWithoutADueTimeOrAddedIntoDoneGetsNone() throws {
        #expect(try apply(.addCard(title: "Ship", column: "todo"), to: sample).1 == [])
        #expect(try apply(.addCard(title: "Ship", column: "done", dueMilliseconds: due), to: withDone).1 == [])
    }

    @Test func setDueReplacesTheTimerOrCancelsItAndClearsOverdue() throws {
        var overdue = sample
        Board.reduce(into: &overdue, .setDue(id: 1, dueMilliseconds: due))
        Board.reduce(into: &overdue, .flagOverdue(id: 1))
        #expect(overdue.card(1)?.overdue == true)

        let (later, setting) = try apply(.setDue(id: 1, dueMilliseconds: due + 1_000), to: overdue)
        #expect(later.card(1) == Board.Card(id: 1, title: "Plan", dueMilliseconds: due + 1_000))
        // The same key: the daemon replaces the timer the first due time set.
        #expect(setting == [timer(1, due + 1_000)])

        let (none, clearing) = try apply(.setDue(id: 1, dueMilliseconds: nil), to: overdue)
        #expect(none.card(1) == Board.Card(id: 1, title: "Plan"))
        #expect(clearing == [.cancel(key: "due-1")])

        // A card in done keeps no timer: a due time set there sets none.
        #expect(try apply(.setDue(id: 4, dueMilliseconds: due), to: withDone).1 == [.cancel(key: "due-4")])
    }

    @Test func aMoveIntoDoneCancelsTheTimerAndNotifies() throws {
        var dueCard = withDone
        Board.reduce(into: &dueCard, .setDue(id: 1, dueMilliseconds: due))
        let (state, effects) = try apply(.moveCard(id: 1, to: "done"), to: dueCard)
        #expect(state.isDone(1))
        #expect(effects == [.cancel(key: "due-1"), .run(.notify(card: 1, title: "Plan"))])
        // Without a due time there is no timer to cancel.
        #expect(try apply(.moveCard(id: 2, to: "done"), to: withDone).1 == [.run(.notify(card: 2, title: "Write"))])
    }

    @Test func otherMovesRenamesAndColumnsSetNothingGoing() throws {
        #expect(try apply(.moveCard(id: 3, to: "todo"), to: sample).1 == [])
        #expect(try apply(.moveCard(id: 4, to: "todo"), to: withDone).1 == [], "out of done: no timer again")
        #expect(try apply(.renameCard(id: 1, title: "Plan more"), to: sample).1 == [])
        #expect(try apply(.addColumn(name: "review", wipLimit: 2), to: sample).1 == [])
    }

    @Test func aRemovedCardsTimerIsCancelled() throws {
        #expect(try apply(.removeCard(id: 1), to: sample).1 == [.cancel(key: "due-1")])
    }

    @Test func theTimersActionFlagsACardOverdueUnlessItIsDone() throws {
        let (flagged, effects) = try apply(.flagOverdue(id: 1), to: withDone)
        #expect(flagged.card(1)?.overdue == true)
        #expect(effects == [])
        #expect(try apply(.flagOverdue(id: 4), to: withDone).0 == withDone, "done in time: not overdue")
        #expect(rejection(.flagOverdue(id: 9)) == "unknown_card")
    }

    @Test func theReceiptIsRecordedOnTheCard() throws {
        let (state, effects) = try apply(.notified(id: 4, receipt: "notified:board/7/1"), to: withDone)
        #expect(state.card(4)?.receipt == "notified:board/7/1")
        #expect(effects == [])
        // Card 4 of `sample` was removed after it was given out: its receipt is taken, and kept nowhere.
        #expect(try apply(.notified(id: 4, receipt: "r"), to: sample).0 == sample)
        #expect(rejection(.notified(id: 5, receipt: "r")) == "unknown_card", "never given out")
    }

    @Test(arguments: [-1, Board.maximumDueMilliseconds + 1, Int64.max, Int64.min])
    func aDueTimeThatIsNoDateIsRefused(_ milliseconds: Int64) {
        #expect(rejection(.addCard(title: "Ship", column: "todo", dueMilliseconds: milliseconds)) == "invalid_due")
        #expect(rejection(.setDue(id: 1, dueMilliseconds: milliseconds)) == "invalid_due")
    }

    /// The actions of the board before due times existed (the Makefile's systemd test sends the first three) read as
    /// they did, and are the same bytes canonically: nothing about them changed.
    @Test(
        arguments: [
            #"{"addColumn":{"name":"todo","wipLimit":1}}"#,
            #"{"addCard":{"column":"todo","title":"Write the tutorial"}}"#,
            #"{"renameCard":{"id":1,"title":"Ship the tutorial"}}"#,
            #"{"moveCard":{"id":1,"to":"done"}}"#,
            #"{"removeCard":{"id":1}}"#,
        ]
    )
    func anActionFromBeforeDueTimesReadsAsItDid(_ json: String) throws {
        let action = try CanonicalEncoding.decode(Board.Action.self, from: Data(json.utf8))
        #expect(String(decoding: try CanonicalEncoding.encode(action), as: UTF8.self) == json)
    }

    @Test func anAddCardWithoutADueTimeHasNone() throws {
        let json = #"{"addCard":{"title":"Write the tutorial","column":"todo"}}"#
        let action = try CanonicalEncoding.decode(Board.Action.self, from: Data(json.utf8))
        #expect(action == .addCard(title: "Write the tutorial", column: "todo", dueMilliseconds: nil))
    }

    /// A board written before due times (a snapshot in an older journal) reads as cards without them, and encodes to
    /// the very same bytes, so its recorded digests still hold; the new fields round-trip.
    @Test func aBoardFromBeforeDueTimesKeepsItsBytes() throws {
        let old = #"{"columns":[{"cards":[{"id":1,"title":"Plan"}],"name":"todo","wipLimit":3}],"nextCardID":2}"#
        let state = try CanonicalEncoding.decode(Board.State.self, from: Data(old.utf8))
        #expect(
            state
                == Board.State(
                    columns: [.init(name: "todo", wipLimit: 3, cards: [.init(id: 1, title: "Plan")])],
                    nextCardID: 2
                )
        )
        #expect(String(decoding: try CanonicalEncoding.encode(state), as: UTF8.self) == old)

        let card = Board.Card(id: 2, title: "Ship", dueMilliseconds: due, overdue: true, receipt: "notified:board/9/1")
        let bytes = try CanonicalEncoding.encode(card)
        let json = #"{"dueMilliseconds":1767225600000,"id":2,"overdue":true,"receipt":"notified:board/9/1","#
        #expect(String(decoding: bytes, as: UTF8.self) == json + #""title":"Ship"}"#)
        #expect(try CanonicalEncoding.decode(Board.Card.self, from: bytes) == card)
    }

    /// The stand-in service sends a notification once per key, and answers every send of it with the same receipt:
    /// the handler may run twice, the notification is sent once.
    @Test func theServiceSendsANotificationOncePerKey() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("board-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let service = Board.Notifications(directory: directory)
        let first = try service.send(.notify(card: 1, title: "Plan"), key: "board/7/1")
        let again = try service.send(.notify(card: 1, title: "Plan"), key: "board/7/1")
        #expect(first == "notified:board/7/1" && again == first)
        _ = try service.send(.notify(card: 2, title: "Write"), key: "board/9/0")
        #expect(
            try service.sent() == [
                .init(key: "board/7/1", card: 1, title: "Plan"), .init(key: "board/9/0", card: 2, title: "Write"),
            ]
        )
        let files = try FileManager.default.contentsOfDirectory(atPath: directory).sorted()
        #expect(files == ["board-7-1.json", "board-9-0.json"], "no partial file left behind")
    }

    @Test func aServiceThatCannotWriteThrowsAndSaysWhere() throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("board-\(UUID().uuidString)").path
        try Data("not a directory".utf8).write(to: URL(fileURLWithPath: file))
        defer { try? FileManager.default.removeItem(atPath: file) }
        let error = try #require(throws: Board.Notifications.Failure.self) {
            try Board.Notifications(directory: file).send(.notify(card: 1, title: "Plan"), key: "board/7/1")
        }
        #expect(error.description.contains(file) && error.description.contains("board/7/1"))
    }
}
