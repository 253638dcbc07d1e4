import Foundation
import GRDB
import Lockstep
import LockstepExamples
import LockstepJournal
import LockstepTesting
import TestSupport
import Testing

/// `lockstep replay --journal DIR` against a real journal: clean, and with a snapshot the reducers do not
/// reproduce (what a changed reducer looks like from the journal's side).
@Suite struct ReplayJournalTests {
    @Test func replayReproducesTheJournalsSnapshotsAndNamesTheSeqWhenItCannot() throws {
        let fixture = try JournalFixture(.sqlite, policy: JournalPolicy(snapshotEveryEvents: 10, snapshotsKept: 3))
        let journal = try fixture.open()
        _ = try journal.recover(Counter.self)
        var state = Counter.initialState
        for start in stride(from: UInt64(1), through: 41, by: 10) {
            let batch = events(Counter.name, from: start, count: 10) { seq in
                seq % 3 == 0 ? Counter.Action.decrement : .increment
            }
            var commit = JournalBatch(events: batch, idempotency: idempotency(for: batch))
            for event in batch {
                Counter.reduce(into: &state, try JSONDecoder().decode(Counter.Action.self, from: Data(event.action)))
            }
            if journal.snapshotDue(store: Counter.name, in: commit) {
                commit.snapshots = [try JournalSnapshot(store: Counter.name, seq: batch.last!.seq, encoding: state)]
            }
            try journal.commit(commit)
        }
        try journal.close()

        let clean = try runProduct("lockstep", ["replay", "--journal", fixture.dataDirectory, "--processes", "1"])
        #expect(clean.status == 0, "\(clean.standardOutput)\(clean.standardError)")
        #expect(clean.standardOutput.contains("journal snapshots reproduced"))

        // A snapshot whose bytes and digest agree, but whose state the reducers never produce.
        let forged = Array(#"{"count":999}"#.utf8)
        try tamper(fixture) { db in
            try db.execute(
                sql: "UPDATE snapshots SET state = ?, digest = ? WHERE seq = 50",
                arguments: [Data(forged), Data(StateDigest(of: forged).bytes)]
            )
        }
        let diverged = try runProduct("lockstep", ["replay", "--journal", fixture.dataDirectory, "--json"])
        #expect(diverged.status == 4, "\(diverged.standardOutput)\(diverged.standardError)")
        let object = try JSONSerialization.jsonObject(with: Data(diverged.standardOutput.utf8)) as? [String: Any]
        let divergence = object?["divergence"] as? [String: Any]
        #expect(divergence?["seq"] as? Int == 50)
        let differences = divergence?["differences"] as? [[String: Any]]
        #expect(differences?.first?["path"] as? String == "count")
    }
}
