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
    @Test func replayReproducesTheJournalsSnapshotsAndNamesTheSeqWhenItCannot() async throws {
        let fixture = try await JournalFixture(
            .sqlite,
            policy: JournalPolicy(snapshotEveryEvents: 10, snapshotsKept: 3)
        )
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

        let clean = try await runProduct(
            "lockstep",
            ["replay", "--journal", fixture.dataDirectory, "--processes", "1"]
        )
        #expect(clean.status == 0, "\(clean.standardOutput)\(clean.standardError)")
        #expect(
            clean.standardOutput.contains("every digest the journal recorded matched (2 snapshots)"),
            "\(clean.standardOutput)"
        )

        // A snapshot whose bytes and digest agree, but whose state the reducers never produce.
        let forged = Array(#"{"count":999}"#.utf8)
        try tamper(fixture) { db in
            try db.execute(
                sql: "UPDATE snapshots SET state = ?, digest = ? WHERE seq = 50",
                arguments: [Data(forged), Data(StateDigest(of: forged).bytes)]
            )
        }
        let diverged = try await runProduct("lockstep", ["replay", "--journal", fixture.dataDirectory, "--json"])
        #expect(diverged.status == 4, "\(diverged.standardOutput)\(diverged.standardError)")
        let object = try JSONSerialization.jsonObject(with: Data(diverged.standardOutput.utf8)) as? [String: Any]
        let divergence = object?["divergence"] as? [String: Any]
        #expect(divergence?["seq"] as? Int == 50)
        let differences = divergence?["differences"] as? [[String: Any]]
        #expect(differences?.first?["path"] as? String == "count")
    }

    /// A reducer change checked against real history through the library: the journal a ledger wrote, replayed
    /// through the same reducer, matches every recorded digest; through a changed one (same name and version, as a
    /// careless change would be), it names the first snapshot the new code no longer reaches.
    @Test func aChangedReducerIsCaughtAtTheFirstRecordedDigestItMisses() async throws {
        let fixture = try await JournalFixture(
            .sqlite,
            policy: JournalPolicy(snapshotEveryEvents: 10, snapshotsKept: 10)
        )
        let journal = try fixture.open()
        _ = try journal.recover(Ledger.self)
        var state = Ledger.initialState
        for start in stride(from: UInt64(1), through: 41, by: 10) {
            // Amounts of 1 … 9, and one of 500 at seq 23: the changed reducer caps it.
            let batch = events(Ledger.name, from: start, count: 10) { seq in
                Ledger.Action.add(seq == 23 ? 500 : Int(seq % 10))
            }
            var commit = JournalBatch(events: batch, idempotency: idempotency(for: batch))
            for event in batch {
                Ledger.reduce(into: &state, try JSONDecoder().decode(Ledger.Action.self, from: Data(event.action)))
            }
            if journal.snapshotDue(store: Ledger.name, in: commit) {
                commit.snapshots = [try JournalSnapshot(store: Ledger.name, seq: batch.last!.seq, encoding: state)]
            }
            try journal.commit(commit)
        }
        try journal.close()
        let reader = try SQLiteJournal(directory: fixture.dataDirectory, readOnly: true)
        defer { try? reader.close() }

        let same = try ReplayHarness<Ledger>().replay(try ReplayLog<Ledger>(history: reader))
        #expect(same.recordedDigestsMatched == 4)
        #expect(same.finalSeq == 50)

        do {
            _ = try ReplayHarness<CappedLedger>().replay(try ReplayLog<CappedLedger>(history: reader))
            Issue.record("the changed reducer matched history")
        } catch let divergence as Divergence {
            // Replay starts from the oldest kept snapshot, seq 10; the first one after seq 23 is at seq 30.
            #expect(divergence.seq == 30)
            #expect(divergence.left == "the journal's snapshot")
            #expect(divergence.differences.map(\.path) == ["total"])
        }
    }
}

/// A running total, as history wrote it.
enum Ledger: Domain {
    struct State: Codable, Equatable, Sendable { var total = 0 }
    enum Action: Codable, Equatable, Sendable { case add(Int) }
    static let name = "ledger"
    static let version: UInt32 = 1
    static var initialState: State { State() }
    static func reduce(into state: inout State, _ action: Action) {
        guard case let .add(amount) = action else { return }
        state.total += amount
    }
}

/// The same store with a changed reducer (amounts capped at 100) that forgot to bump the version.
enum CappedLedger: Domain {
    typealias State = Ledger.State
    typealias Action = Ledger.Action
    static let name = "ledger"
    static let version: UInt32 = 1
    static var initialState: State { State() }
    static func reduce(into state: inout State, _ action: Action) {
        guard case let .add(amount) = action else { return }
        state.total += min(amount, 100)
    }
}
