import Foundation
import Lockstep
import LockstepExamples
import TestSupport
import Testing

@testable import LockstepJournal

/// `lockstep journal backup`: a copy of a local journal taken while it is open for writing.
@Suite struct BackupTests {
    let policy = JournalPolicy(snapshotEveryEvents: 20, snapshotsKept: 2, idempotencyEntriesKept: 50)

    /// The copy holds what was committed when it was taken — snapshots, the events after the older one, the
    /// idempotency entries — opens on its own as the same kind of journal, verifies, and recovers the same state;
    /// the journal goes on meanwhile. A destination that holds anything is refused, naming what it holds.
    @Test(arguments: [JournalKind.sqlite, .log])
    func aCopyTakenWhileTheJournalIsOpenRecoversTheSameStore(kind: JournalKind) async throws {
        let fixture = try await JournalFixture(kind, policy: policy)
        let journal = try fixture.open()
        var state = try journal.recover(Counter.self).state
        let copied = try commitIncrements(journal, after: 0, state: &state, batches: 30)
        let copiedState = state
        let copy = fixture.directory.appendingPathComponent("copy").path
        try backupLocalJournal(directory: fixture.dataDirectory, to: copy)
        let last = try commitIncrements(journal, after: copied, state: &state, batches: 3)
        #expect(last == copied + 15)
        try journal.close()

        let restored = try openLocalJournal(directory: copy, policy: policy, readOnly: false)
        #expect((restored is LogJournal) == (kind == .log))
        #expect(try restored.verify() == [])
        let recovered = try restored.recover(Counter.self)
        #expect(recovered.lastSeq == copied)
        #expect(recovered.state == copiedState)
        #expect(try restored.idempotencyRecords().count == 50)
        #expect(try restored.stats().stores.first?.snapshotSeqs.count == 2)
        try restored.close()

        let error = #expect(throws: JournalError.self) {
            try backupLocalJournal(directory: fixture.dataDirectory, to: copy)
        }
        #expect(error?.code == .invalidArgument)
        #expect(error?.message.contains("is not empty") == true, "\(String(describing: error))")
    }

    /// A snapshot file a commit compacts away between reading the log and copying it: that copy is refused
    /// (`not_found`) and what it wrote is removed, the destination kept; the backup reads the log again and copies
    /// the newer snapshots. The copy carries a closed mark: cut short later, it is refused.
    @Test func aSnapshotCompactedAwayMeanwhileMakesTheBackupReadTheLogAgain() throws {
        let directory = try temporaryDirectory("backup-compacted")
        defer { try? FileManager.default.removeItem(at: directory) }
        let data = directory.appendingPathComponent("data").path
        let writer = try LogJournal(directory: data, policy: policy)
        var state = try writer.recover(Counter.self).state
        var seq = try commitIncrements(writer, after: 0, state: &state, batches: 10)
        let reader = try LogJournal(directory: data, readOnly: true)
        // Snapshots at 20 and 40 when the reader read the log; by 100, those at 80 and 100 are the ones kept.
        seq = try commitIncrements(writer, after: seq, state: &state, batches: 10)
        let destination = directory.appendingPathComponent("copy").path
        try FileManager.default.createDirectory(atPath: destination, withIntermediateDirectories: false)
        let error = #expect(throws: JournalError.self) { try reader.engine.storage.copy(to: destination) }
        #expect(error?.code == .notFound, "\(String(describing: error))")
        try reader.close()
        LogStorage.removeCopy(in: destination)
        #expect(try FileManager.default.contentsOfDirectory(atPath: destination) == [])

        try LogJournal.backup(data, to: destination)
        try writer.close()
        let copied = try FileManager.default.contentsOfDirectory(atPath: destination + "/snapshots")
        #expect(copied.count == 2, "\(copied)")
        let copy = try LogJournal(directory: destination, policy: policy)
        #expect(try copy.verify() == [])
        #expect(try copy.recover(Counter.self).lastSeq == seq)
        try copy.close()

        // The copy's closed mark: the same copy cut short by one byte is refused, naming the offsets.
        let log = destination + "/" + LogJournal.fileName
        let size = try #require(FileManager.default.attributesOfItem(atPath: log)[.size] as? Int)
        #expect(truncate(log, off_t(size - 1)) == 0)
        let cut = #expect(throws: JournalError.self) { try LogJournal(directory: destination, readOnly: true) }
        #expect(cut?.code == .corrupt, "\(String(describing: cut))")
    }

    /// An SQLite journal written as a log journal: the stores with their epochs and versions, the snapshots, events
    /// and idempotency entries — the same stats, reads and state — and the SQLite journal left as it was. While a
    /// writer holds it, it is refused `in_use`; with a damaged event, refused naming it, nothing left in the
    /// destination.
    @Test func anSQLiteJournalConvertsToALogJournalThatReadsTheSame() async throws {
        let fixture = try await JournalFixture(.sqlite, policy: policy)
        let journal = try fixture.open()
        var state = try journal.recover(Counter.self).state
        let last = try commitIncrements(journal, after: 0, state: &state, batches: 30)
        let destination = fixture.directory.appendingPathComponent("converted").path
        let held = #expect(throws: JournalError.self) {
            try LogJournal.convert(sqliteIn: fixture.dataDirectory, to: destination)
        }
        #expect(held?.code == .inUse, "\(String(describing: held))")
        let stats = try journal.stats().stores
        let records = try journal.idempotencyRecords()
        // From the first event kept (those before the older snapshot are compacted away): every field compared.
        let first = try #require(stats.first?.firstSeq)
        let range = try journal.events(store: Counter.name, from: first, to: last, limit: 10_000)
        guard case let .events(kept) = range else {
            Issue.record("the events from seq \(first) were compacted: \(range)")
            return
        }
        #expect(kept.count == Int(last - first + 1) && kept.count >= 20)
        try journal.close()

        try LogJournal.convert(sqliteIn: fixture.dataDirectory, to: destination)
        let converted = try LogJournal(directory: destination, policy: policy)
        #expect(try converted.verify() == [])
        #expect(try converted.stats().stores == stats)
        #expect(try converted.idempotencyRecords() == records)
        #expect(try converted.events(store: Counter.name, from: first, to: last, limit: 10_000) == range)
        let recovered = try converted.recover(Counter.self)
        #expect(recovered.lastSeq == last)
        #expect(recovered.state == state)
        try converted.close()
        let reopened = try fixture.open()
        #expect(try reopened.stats().stores == stats)
        try reopened.close()

        // An event damaged in the SQLite journal: refused, naming it; the destination is left empty.
        try fixture.tamper("UPDATE events SET action = X'00' WHERE seq = \(last - 1)")
        let other = fixture.directory.appendingPathComponent("other").path
        let damaged = #expect(throws: JournalError.self) {
            try LogJournal.convert(sqliteIn: fixture.dataDirectory, to: other)
        }
        #expect(damaged?.code == .checksumMismatch && damaged?.seq == last - 1, "\(String(describing: damaged))")
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: other)) ?? []) == [])
    }
}
