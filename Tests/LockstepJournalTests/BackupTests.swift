import Foundation
import Lockstep
import LockstepExamples
import LockstepJournal
import TestSupport
import Testing

/// `lockstep journal backup`: a copy of a local journal taken while it is open for writing.
@Suite struct BackupTests {
    let policy = JournalPolicy(snapshotEveryEvents: 20, snapshotsKept: 2, idempotencyEntriesKept: 50)

    /// `batches` commits of 5 increments to the counter after `seq`, a snapshot when due; returns the last seq.
    func commit(_ journal: any Journal, after seq: UInt64, state: inout Counter.State, batches: Int) throws -> UInt64 {
        var seq = seq
        for _ in 0..<batches {
            let batch = events(Counter.name, from: seq + 1, count: 5) { _ in Counter.Action.increment }
            for _ in batch { Counter.reduce(into: &state, .increment) }
            seq += 5
            var commit = JournalBatch(events: batch, idempotency: idempotency(for: batch))
            if journal.snapshotDue(store: Counter.name, in: commit) {
                commit.snapshots = [try JournalSnapshot(store: Counter.name, seq: seq, encoding: state)]
            }
            try journal.commit(commit)
        }
        return seq
    }

    /// The copy holds what was committed when it was taken — snapshots, the events after the older one, the
    /// idempotency entries — opens on its own as the same kind of journal, verifies, and recovers the same state;
    /// the journal goes on meanwhile. A destination that holds anything is refused, naming what it holds.
    @Test(arguments: [JournalKind.sqlite, .log])
    func aCopyTakenWhileTheJournalIsOpenRecoversTheSameStore(kind: JournalKind) async throws {
        let fixture = try await JournalFixture(kind, policy: policy)
        let journal = try fixture.open()
        var state = try journal.recover(Counter.self).state
        let copied = try commit(journal, after: 0, state: &state, batches: 30)
        let copiedState = state
        let copy = fixture.directory.appendingPathComponent("copy").path
        try backupLocalJournal(directory: fixture.dataDirectory, to: copy)
        let last = try commit(journal, after: copied, state: &state, batches: 3)
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
}
