import Foundation
import Lockstep
import LockstepExamples
import LockstepJournal
import Testing

/// The outbox (docs/effects.md): effects and timers journaled in the same transaction as their action, on every
/// journal alike.
@Suite struct OutboxTests {
    let due: Int64 = 1_764_234_000_000

    func effect(_ seq: UInt64, _ index: Int, _ json: String) -> JournalEffect {
        JournalEffect(store: Reminders.name, seq: seq, index: index, body: Array(json.utf8))
    }

    func timer(_ key: String, seq: UInt64, due: Int64) -> JournalTimer {
        JournalTimer(
            store: Reminders.name,
            key: key,
            dueMilliseconds: due,
            action: Array(#"{"flagOverdue":{"id":1}}"#.utf8),
            seq: seq,
            index: 0
        )
    }

    /// Two reminders added (each sets a timer), the first completed (cancels its timer, sets an effect going).
    func history(_ journal: any Journal) throws {
        _ = try journal.recover(Reminders.self)
        let batch = events(Reminders.name, from: 1, count: 3) { seq in
            seq == 3 ? Reminders.Action.complete(id: 1) : .add(text: "r\(seq)", dueMilliseconds: due)
        }
        try journal.commit(
            JournalBatch(
                events: batch,
                idempotency: idempotency(for: batch),
                effects: [effect(3, 1, #"{"notify":{"id":1,"text":"r1"}}"#)],
                timerChanges: [
                    .set(timer("due-1", seq: 1, due: due)), .set(timer("due-2", seq: 2, due: due + 1)),
                    .remove(store: Reminders.name, key: "due-1"),
                ]
            )
        )
    }

    @Test(arguments: JournalKind.allCases)
    func effectsAndTimersAreKeptWithTheirActionAndSurviveAReopen(kind: JournalKind) async throws {
        let fixture = try await JournalFixture(kind)
        let journal = try fixture.open()
        try history(journal)
        let expected = JournalOutbox(
            effects: [effect(3, 1, #"{"notify":{"id":1,"text":"r1"}}"#)],
            timers: [timer("due-2", seq: 2, due: due + 1)]
        )
        #expect(try journal.outbox() == expected)
        try journal.close()
        let reopened = kind == .memory ? journal : try fixture.open()
        #expect(try reopened.outbox() == expected)
        #expect(try reopened.verify().isEmpty)
    }

    /// `lockstep journal convert`: the effects — one given up after its attempts — and timers go with an SQLite journal
    /// written as a log journal.
    @Test func theOutboxGoesWithAnSQLiteJournalConvertedToALogJournal() async throws {
        let fixture = try await JournalFixture(.sqlite)
        let journal = try fixture.open()
        try history(journal)
        let id = JournalEffectID(store: Reminders.name, seq: 3, index: 1)
        try journal.commit(
            JournalBatch(effectUpdates: [JournalEffectUpdate(id, .failed(attempts: 5, error: "timeout", dead: true))])
        )
        let expected = try journal.outbox()
        #expect(expected.effects.map { "\($0.attempts) \($0.lastError ?? "-") \($0.dead)" } == ["5 timeout true"])
        #expect(expected.timers.count == 1)
        try journal.close()
        let destination = fixture.directory.appendingPathComponent("converted").path
        try LogJournal.convert(sqliteIn: fixture.dataDirectory, to: destination)
        let converted = try LogJournal(directory: destination)
        #expect(try converted.outbox() == expected)
        #expect(try converted.verify().isEmpty)
        try converted.close()
    }

    @Test(arguments: JournalKind.allCases)
    func anEffectFailsIsGivenUpSentBackAndDoneAndATimerIsReplacedAndFired(kind: JournalKind) async throws {
        let fixture = try await JournalFixture(kind)
        let journal = try fixture.open()
        try history(journal)
        let id = JournalEffectID(store: Reminders.name, seq: 3, index: 1)
        try journal.commit(
            JournalBatch(effectUpdates: [JournalEffectUpdate(id, .failed(attempts: 1, error: "503", dead: false))])
        )
        #expect(
            try journal.outbox().effects.map { "\($0.attempts) \($0.lastError ?? "-") \($0.dead)" } == ["1 503 false"]
        )
        try journal.commit(
            JournalBatch(effectUpdates: [JournalEffectUpdate(id, .failed(attempts: 5, error: "timeout", dead: true))])
        )
        #expect(try journal.outbox().effects.map(\.dead) == [true])
        try journal.commit(JournalBatch(effectUpdates: [JournalEffectUpdate(id, .retry)]))
        #expect(try journal.outbox().effects.map { "\($0.attempts) \($0.dead)" } == ["0 false"])
        // The effect's result comes back as an action, and the effect is done in the same commit; the timer of key
        // due-2 is set again, later, then fired by the action it holds.
        let result = events(Reminders.name, from: 4, count: 2) { seq in
            seq == 4 ? Reminders.Action.notified(id: 1, receipt: "x") : .flagOverdue(id: 2)
        }
        try journal.commit(
            JournalBatch(
                events: Array(result.prefix(1)),
                effectUpdates: [JournalEffectUpdate(id, .done)],
                timerChanges: [.set(timer("due-2", seq: 4, due: due + 5))]
            )
        )
        #expect(try journal.outbox() == JournalOutbox(timers: [timer("due-2", seq: 4, due: due + 5)]))
        try journal.commit(
            JournalBatch(
                events: Array(result.suffix(1)),
                timerChanges: [.remove(store: Reminders.name, key: "due-2")]
            )
        )
        #expect(try journal.outbox() == JournalOutbox())
    }

    /// An effect is journaled with the action that set it going, or not at all.
    @Test(arguments: JournalKind.allCases)
    func anEffectWithoutItsActionIsRefusedAndNothingIsKept(kind: JournalKind) async throws {
        let fixture = try await JournalFixture(kind)
        let journal = try fixture.open()
        try history(journal)
        let error = journalError {
            try journal.commit(JournalBatch(effects: [effect(2, 0, #"{"notify":{"id":2,"text":"r2"}}"#)]))
        }
        #expect(error?.code == .invalidBatch)
        #expect(try journal.outbox().effects.map(\.seq) == [3])
    }

    /// A journal of the format before the outbox (SQLite 3) reads as it is, with an empty outbox, and gains the outbox
    /// when opened read-write.
    @Test func aJournalOfTheFormatBeforeTheOutboxGainsItWhenOpenedForWriting() async throws {
        let fixture = try await JournalFixture(.sqlite)
        let journal = try fixture.open()
        try history(journal)
        try journal.close()
        try fixture.tamper(
            "DROP TABLE effects; DROP TABLE timers; ALTER TABLE events DROP COLUMN author; UPDATE journal_format SET version = 3"
        )
        let reader = try SQLiteJournal(directory: fixture.dataDirectory, readOnly: true)
        #expect(try reader.outbox() == JournalOutbox())
        #expect(try reader.stats().formatVersion == 3)
        try reader.close()
        let writer = try SQLiteJournal(directory: fixture.dataDirectory)
        #expect(try writer.stats().formatVersion == SQLiteJournal.formatVersion)
        _ = try writer.recover(Reminders.self)
        let next = events(Reminders.name, from: 4, count: 1) { _ in Reminders.Action.complete(id: 2) }
        try writer.commit(JournalBatch(events: next, effects: [effect(4, 1, #"{"notify":{"id":2,"text":"r2"}}"#)]))
        #expect(try writer.outbox().effects.map(\.seq) == [4])
    }

    /// A damaged effect is never run: reading the outbox refuses it, and verify names it.
    @Test(arguments: [JournalKind.sqlite, .postgres])
    func aDamagedEffectIsCaughtByItsChecksum(kind: JournalKind) async throws {
        let fixture = try await JournalFixture(kind)
        let journal = try fixture.open()
        try history(journal)
        try journal.close()
        try fixture.tamper(
            kind == .sqlite
                ? "UPDATE effects SET body = CAST('{\"notify\":{\"id\":9,\"text\":\"r1\"}}' AS BLOB)"
                : "UPDATE effects SET body = convert_to('{\"notify\":{\"id\":9,\"text\":\"r1\"}}', 'UTF8')"
        )
        let reopened = try fixture.open()
        let error = journalError { _ = try reopened.outbox() }
        #expect(error?.code == .checksumMismatch, "\(String(describing: error))")
        #expect(try reopened.verify().map(\.code) == [.checksumMismatch])
    }
}
