import Foundation
import GRDB
import Lockstep
import LockstepJournal
import ReplayFixtures
import Testing

/// Journals written by one version of the `shelf` domain, opened by the next: upgraded by the rule the domain
/// states, or refused with a message and nothing changed.
@Suite struct DomainUpgradeTests {
    static let names = (1...12).map { "item \($0)" }

    /// A journal with the 12 adds of ``names`` written by version 1 in commits of 4, a snapshot due every 5 events
    /// (so at 8 and 12; the first compacts events 1…8 away).
    func versionOneJournal(
        _ kind: JournalKind,
        snapshotEvery: Int = 5
    ) async throws -> (JournalFixture, ShelfV1.State) {
        let fixture = try await JournalFixture(kind, policy: JournalPolicy(snapshotEveryEvents: snapshotEvery))
        let journal = try fixture.open()
        var state = try journal.recover(ShelfV1.self).state
        for (offset, chunk) in stride(from: 0, to: 12, by: 4).map({ ($0, Self.names[$0..<$0 + 4]) }) {
            var batch = JournalBatch(
                events: events("shelf", from: UInt64(offset) + 1, count: 4) {
                    ShelfV1.Action.add(name: Self.names[Int($0) - 1])
                }
            )
            for name in chunk { ShelfV1.reduce(into: &state, .add(name: name)) }
            if journal.snapshotDue(store: "shelf", in: batch) {
                batch.snapshots = [try JournalSnapshot(store: "shelf", seq: UInt64(offset) + 4, encoding: state)]
            }
            try journal.commit(batch)
        }
        try journal.close()
        return (fixture, state)
    }

    /// Everything a journal holds of the shelf store, to prove a refused start changed nothing.
    func contents(_ journal: any Journal) throws -> String {
        let stats = try journal.stats()
        var text = "\(stats.stores)"
        if case let .events(list) = try journal.events(store: "shelf", from: 1, to: 100, limit: 100) {
            text += "\(list)"
        }
        for seq in stats.stores.first?.snapshotSeqs ?? [] {
            text += "\(try journal.snapshot(store: "shelf", seq: seq)!)"
        }
        return text
    }

    @Test(arguments: JournalKind.allCases)
    func aVersionOneStoreIsUpgradedByTheDomainsRuleAndJournaled(_ kind: JournalKind) async throws {
        let (fixture, old) = try await versionOneJournal(kind)
        let journal = try fixture.open()
        let recovered = try journal.recover(ShelfV2.self)
        #expect(recovered.upgradedFrom == 1)
        #expect(recovered.domainVersion == 2)
        #expect(recovered.lastSeq == 12)
        #expect(recovered.state == ShelfV2.State(items: old.items.map { ShelfV2.Item(name: $0, count: 1) }))
        let store = try #require(try journal.stats().stores.first)
        #expect(store.domainVersion == 2)
        #expect(store.snapshotSeqs == [12])
        #expect(store.eventCount == 0)
        #expect(
            store.versions == [
                JournalDomainVersion(store: "shelf", version: 1, sinceSeq: 0),
                JournalDomainVersion(store: "shelf", version: 2, sinceSeq: 12),
            ]
        )
        // Version 1's events are gone: a replica asking for them is sent to the snapshot.
        #expect(try journal.events(store: "shelf", from: 1, to: 12, limit: 100) == .compacted(firstAvailable: 13))
        try journal.commit(
            JournalBatch(
                events: events("shelf", from: 13, count: 1) { _ in ShelfV2.Action.setCount(name: "item 3", count: 7) }
            )
        )
        try journal.close()

        let reopened = try fixture.open()
        let again = try reopened.recover(ShelfV2.self)
        #expect(again.upgradedFrom == nil)
        #expect(again.lastSeq == 13)
        #expect(again.state.items[2] == ShelfV2.Item(name: "item 3", count: 7))
        #expect(try reopened.state(of: ShelfV2.self, at: 12) == recovered.state)
        let refused = journalError { _ = try reopened.state(of: ShelfV2.self, at: 11) }
        #expect(refused?.code == .domainVersionMismatch)
        #expect(refused?.message.contains("comes before its upgrade to version 2 at seq 12") == true)
        let older = journalError { _ = try reopened.state(of: ShelfV1.self, at: 12) }
        #expect(older?.message.contains("'shelf' is now written by domain version 2") == true)
        try reopened.close()
    }

    @Test(arguments: JournalKind.allCases)
    func anUpgradeAtAVersionOneSnapshotReplacesIt(_ kind: JournalKind) async throws {
        // A snapshot every 4 events in commits of 4: version 1's newest snapshot is at the last seq, 12.
        let (fixture, old) = try await versionOneJournal(kind, snapshotEvery: 4)
        var journal = try fixture.open()
        #expect(try journal.stats().stores.first?.snapshotSeqs == [8, 12])
        let upgraded = try journal.recover(ShelfV2.self)
        #expect(upgraded.upgradedFrom == 1)
        #expect(upgraded.state.items.map(\.name) == old.items)
        #expect(try journal.stats().stores.first?.snapshotSeqs == [12])
        let snapshot = try #require(try journal.snapshot(store: "shelf", seq: 12))
        #expect(try JSONDecoder().decode(ShelfV2.State.self, from: Data(snapshot.state)) == upgraded.state)
        try journal.close()
        journal = try fixture.open()
        #expect(try journal.recover(ShelfV2.self).state == upgraded.state)
        #expect(try journal.verify().isEmpty)
        try journal.close()
    }

    @Test(arguments: JournalKind.allCases)
    func anEmptyStoreStartsFromTheNewVersionsInitialState(_ kind: JournalKind) async throws {
        let fixture = try await JournalFixture(kind)
        var journal = try fixture.open()
        _ = try journal.recover(ShelfV1.self)
        try journal.close()
        journal = try fixture.open()
        let upgraded = try journal.recover(ShelfV2.self)
        #expect(upgraded.upgradedFrom == 1)
        #expect(upgraded.state == ShelfV2.initialState)
        #expect(try journal.stats().stores.first?.versions.map(\.sinceSeq) == [0, 0])
        try journal.close()
    }

    @Test(arguments: JournalKind.allCases)
    func aChainOfUpgradesTakesVersionOneToVersionThree(_ kind: JournalKind) async throws {
        let (fixture, old) = try await versionOneJournal(kind)
        let journal = try fixture.open()
        let recovered = try journal.recover(ShelfV3.self)
        #expect(recovered.upgradedFrom == 1)
        #expect(recovered.state.entries.map(\.name) == old.items)
        #expect(try journal.stats().stores.first?.versions.map(\.version) == [1, 3])
        try journal.close()
    }

    /// `lockstep journal convert`: an upgraded SQLite store written as a log journal keeps its version history, its
    /// upgrade's snapshot and the state the new version recovers.
    @Test func anUpgradedStoreKeepsItsVersionsWhenConvertedToALogJournal() async throws {
        let (fixture, old) = try await versionOneJournal(.sqlite)
        let journal = try fixture.open()
        _ = try journal.recover(ShelfV3.self)
        let before = try contents(journal)
        try journal.close()
        let destination = fixture.directory.appendingPathComponent("converted").path
        try LogJournal.convert(sqliteIn: fixture.dataDirectory, to: destination)
        let converted = try LogJournal(directory: destination)
        #expect(try contents(converted) == before)
        #expect(try converted.stats().stores.first?.versions.map(\.version) == [1, 3])
        let recovered = try converted.recover(ShelfV3.self)
        #expect(recovered.upgradedFrom == nil)
        #expect(recovered.state.entries.map(\.name) == old.items)
        try converted.close()
    }

    @Test(arguments: JournalKind.allCases)
    func aVersionWithoutAnUpgradeIsRefusedAndChangesNothing(_ kind: JournalKind) async throws {
        let (fixture, _) = try await versionOneJournal(kind)
        let journal = try fixture.open()
        let before = try contents(journal)
        let error = journalError { _ = try journal.recover(ShelfV2WithoutUpgrade.self) }
        #expect(error?.code == .domainVersionMismatch)
        #expect(error?.store == "shelf")
        let message = error?.message ?? ""
        #expect(message.contains("written by shelf domain version 1"), "\(message)")
        #expect(message.contains("this build has version 2"), "\(message)")
        #expect(message.contains("add a DomainUpgrade from version 1"), "\(message)")
        #expect(try contents(journal) == before)
        // The build that wrote it still reads it.
        #expect(try journal.recover(ShelfV1.self).lastSeq == 12)
        try journal.close()
    }

    @Test(arguments: JournalKind.allCases)
    func aNewerStoreIsRefusedByAnOlderBuild(_ kind: JournalKind) async throws {
        let (fixture, _) = try await versionOneJournal(kind)
        var journal = try fixture.open()
        _ = try journal.recover(ShelfV2.self)
        try journal.close()
        journal = try fixture.open()
        let before = try contents(journal)
        let error = journalError { _ = try journal.recover(ShelfV1.self) }
        #expect(error?.code == .domainVersionMismatch)
        #expect(error?.message.contains("newer than this build's version 1") == true, "\(error?.message ?? "")")
        #expect(try contents(journal) == before)
        try journal.close()
    }

    @Test func aReadOnlyJournalIsNotUpgraded() async throws {
        let (fixture, _) = try await versionOneJournal(.sqlite)
        let reader = try SQLiteJournal(directory: fixture.dataDirectory, readOnly: true)
        let error = journalError { _ = try reader.recover(ShelfV2.self) }
        #expect(error?.code == .domainVersionMismatch)
        #expect(error?.message.contains("open read-only") == true)
        try reader.close()
        let writer = try fixture.open()
        #expect(try writer.stats().stores.first?.domainVersion == 1)
        try writer.close()
    }

    @Test func aFormatTwoJournalGainsItsVersionHistoryWhenOpenedForWriting() async throws {
        let (fixture, _) = try await versionOneJournal(.sqlite)
        try tamper(fixture) { db in
            try db.execute(
                sql:
                    "DROP TABLE store_versions; ALTER TABLE events DROP COLUMN author; UPDATE journal_format SET version = 2"
            )
        }
        let reader = try SQLiteJournal(directory: fixture.dataDirectory, readOnly: true)
        #expect(try reader.stats().formatVersion == 2)
        #expect(
            try reader.stats().stores.first?.versions == [JournalDomainVersion(store: "shelf", version: 1, sinceSeq: 0)]
        )
        try reader.close()
        let writer = try SQLiteJournal(directory: fixture.dataDirectory)
        #expect(try writer.stats().formatVersion == SQLiteJournal.formatVersion)
        #expect(try writer.recover(ShelfV2.self).upgradedFrom == 1)
        #expect(try writer.stats().stores.first?.versions.map(\.version) == [1, 2])
        try writer.close()
    }
}

/// The state of a store at any seq the journal keeps, from a read-only journal.
@Suite struct StateAtSeqTests {
    @Test(arguments: JournalKind.allCases)
    func everyKeptSeqGivesTheStateAfterExactlyItsEvents(_ kind: JournalKind) async throws {
        let (fixture, _) = try await DomainUpgradeTests().versionOneJournal(kind)
        let journal = try fixture.open()
        for seq in UInt64(8)...12 {
            let expected = ShelfV1.State(items: Array(DomainUpgradeTests.names.prefix(Int(seq))))
            #expect(try journal.state(of: ShelfV1.self, at: seq) == expected, "seq \(seq)")
        }
        for seq in UInt64(0)...7 {
            let compacted = journalError { _ = try journal.state(of: ShelfV1.self, at: seq) }
            #expect(compacted?.message.contains("the oldest state the journal keeps is at seq 8") == true)
        }
        let past = journalError { _ = try journal.state(of: ShelfV1.self, at: 13) }
        #expect(past?.code == .invalidArgument)
        #expect(past?.message.contains("past the end of 'shelf': its last seq is 12") == true, "\(past?.message ?? "")")
        let unknown = journalError { _ = try journal.state(of: CounterV2.self, at: 1) }
        #expect(unknown?.code == .unknownStore)
        try journal.close()
    }

    @Test func aStoreWhoseFirstEventIsKeptIsReadFromTheInitialState() async throws {
        let fixture = try await JournalFixture(.memory)
        let journal = try fixture.open()
        _ = try journal.recover(ShelfV1.self)
        try journal.commit(
            JournalBatch(events: events("shelf", from: 1, count: 3) { ShelfV1.Action.add(name: "n\($0)") })
        )
        #expect(try journal.state(of: ShelfV1.self, at: 0) == ShelfV1.initialState)
        #expect(try journal.state(of: ShelfV1.self, at: 2) == ShelfV1.State(items: ["n1", "n2"]))
    }

    @Test func compactedSeqsAreRefusedWithTheOldestStateKept() async throws {
        let fixture = try await JournalFixture(.sqlite, policy: JournalPolicy(snapshotEveryEvents: 5, snapshotsKept: 1))
        let journal = try fixture.open()
        var state = try journal.recover(ShelfV1.self).state
        for seq in UInt64(1)...12 {
            ShelfV1.reduce(into: &state, .add(name: "n\(seq)"))
            var batch = JournalBatch(
                events: events("shelf", from: seq, count: 1) { _ in ShelfV1.Action.add(name: "n\(seq)") }
            )
            if journal.snapshotDue(store: "shelf", in: batch) {
                batch.snapshots = [try JournalSnapshot(store: "shelf", seq: seq, encoding: state)]
            }
            try journal.commit(batch)
        }
        try journal.close()
        let reader = try SQLiteJournal(directory: fixture.dataDirectory, readOnly: true)
        #expect(try reader.state(of: ShelfV1.self, at: 12) == state)
        #expect(try reader.state(of: ShelfV1.self, at: 10).items.count == 10)
        let error = journalError { _ = try reader.state(of: ShelfV1.self, at: 9) }
        #expect(error?.code == .invalidArgument)
        #expect(error?.message.contains("compacted away: the oldest state the journal keeps is at seq 10") == true)
        try reader.close()
    }
}
