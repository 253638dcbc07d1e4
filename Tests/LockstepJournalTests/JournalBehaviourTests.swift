import Foundation
import GRDB
import Lockstep
import LockstepExamples
import LockstepJournal
import Testing

/// What every journal must do alike: every test runs against SQLite, memory and PostgreSQL.
@Suite struct JournalBehaviourTests {
    @Test(arguments: JournalKind.allCases)
    func aNewStoreStartsEmptyWithAnEpoch(kind: JournalKind) async throws {
        let fixture = try await JournalFixture(kind)
        let journal = try fixture.open()
        let counter = try journal.recover(Counter.self)
        #expect(counter.state == Counter.initialState)
        #expect(counter.lastSeq == 0)
        #expect(counter.epoch != 0)
        #expect(counter.domainVersion == Counter.version)
        #expect(counter.snapshotSeq == nil)
        #expect(counter.replayedEvents == 0)
        #expect(journal.lastSeq(store: Counter.name) == 0)
        #expect(journal.lastSeq(store: Posts.name) == nil)
        #expect(try journal.events(store: Counter.name, from: 1, to: 10, limit: 10) == .events([]))

        // The epoch is the store's for the journal's lifetime: reopening keeps it.
        try journal.close()
        let reopened = try fixture.open()
        #expect(try reopened.recover(Counter.self).epoch == counter.epoch)
    }

    /// A range read stops at its byte budget — but always holds at least one event, however large.
    /// Each event keeps its author, read back by range and through a restart, and recovery's checksums cover it.
    @Test(arguments: JournalKind.allCases)
    func eventsKeepTheirAuthors(kind: JournalKind) async throws {
        let fixture = try await JournalFixture(kind)
        let journal = try fixture.open()
        _ = try journal.recover(Counter.self)
        var batch = events(Counter.name, from: 1, count: 3) { _ in Counter.Action.increment }
        batch[0].author = "member"
        batch[2].author = "lockstepd"
        try journal.commit(JournalBatch(events: batch, idempotency: idempotency(for: batch)))
        try journal.close()
        let reopened = try fixture.open()
        #expect(try reopened.recover(Counter.self).lastSeq == 3)
        guard case let .events(read) = try reopened.events(store: Counter.name, from: 1, to: 3, limit: 10) else {
            Issue.record("no events")
            return
        }
        #expect(read.map(\.author) == ["member", "", "lockstepd"])
        #expect(read == batch)
    }

    @Test(arguments: JournalKind.allCases)
    func aRangeStopsAtItsByteBudgetWithAtLeastOneEvent(kind: JournalKind) async throws {
        let fixture = try await JournalFixture(kind)
        let journal = try fixture.open()
        _ = try journal.recover(Posts.self)
        // Ten appends of 1,000 posts each: about 4 KiB of action per event.
        let batch = events(Posts.name, from: 1, count: 10) { seq in
            Posts.Action.appendPosts(posts: (0..<1_000).map { "p\(seq)-\($0)" })
        }
        try journal.commit(JournalBatch(events: batch, idempotency: idempotency(for: batch)))
        let size = batch[0].action.count
        guard
            case let .events(some) = try journal.events(
                store: Posts.name,
                from: 1,
                to: 10,
                limit: 100,
                maximumBytes: 3 * size + size / 2
            )
        else {
            Issue.record("expected events")
            return
        }
        #expect(some.map(\.seq) == [1, 2, 3])
        guard
            case let .events(one) = try journal.events(store: Posts.name, from: 4, to: 10, limit: 100, maximumBytes: 1)
        else {
            Issue.record("expected events")
            return
        }
        #expect(one.map(\.seq) == [4])
        guard case let .events(all) = try journal.events(store: Posts.name, from: 1, to: 10, limit: 100) else {
            Issue.record("expected events")
            return
        }
        #expect(all.count == 10)
    }

    /// Six commits, each with events for two stores; the counter is due a snapshot every 10 events, and
    /// keeps 2, so at the end it has snapshots at 20 and 30 and events 21…30 only.
    @Test(arguments: JournalKind.allCases)
    func groupCommitSnapshotsCompactionAndRanges(kind: JournalKind) async throws {
        let fixture = try await JournalFixture(kind, policy: JournalPolicy(snapshotEveryEvents: 10, snapshotsKept: 2))
        let journal = try fixture.open()
        let counterEpoch = try journal.recover(Counter.self).epoch
        _ = try journal.recover(Posts.self)

        var counter = Counter.initialState
        var posts = Posts.initialState
        var allCounter: [JournalEvent] = []
        var allPosts: [JournalEvent] = []
        var dueAt: [Int] = []
        for round in 0..<6 {
            let counterEvents = events(Counter.name, from: UInt64(round * 5 + 1), count: 5) { _ in
                Counter.Action.increment
            }
            let postEvents = events(Posts.name, from: UInt64(round + 1), count: 1, client: clientB) { seq in
                Posts.Action.appendPosts(posts: ["p\(seq)"])
            }
            var batch = JournalBatch(
                events: counterEvents + postEvents,
                idempotency: idempotency(for: counterEvents + postEvents)
            )
            for _ in counterEvents { Counter.reduce(into: &counter, .increment) }
            Posts.reduce(into: &posts, .appendPosts(posts: ["p\(round + 1)"]))
            #expect(!journal.snapshotDue(store: Posts.name, in: batch))
            if journal.snapshotDue(store: Counter.name, in: batch) {
                dueAt.append(round)
                batch.snapshots.append(
                    try JournalSnapshot(store: Counter.name, seq: UInt64(round * 5 + 5), encoding: counter)
                )
            }
            try journal.commit(batch)
            allCounter += counterEvents
            allPosts += postEvents
            #expect(journal.lastSeq(store: Counter.name) == UInt64(round * 5 + 5))
            #expect(journal.lastSeq(store: Posts.name) == UInt64(round + 1))
        }
        #expect(dueAt == [1, 3, 5])
        #expect(!journal.snapshotDue(store: Counter.name))

        #expect(try journal.events(store: Counter.name, from: 1, to: 30, limit: 100) == .compacted(firstAvailable: 21))
        #expect(try journal.events(store: Counter.name, from: 20, to: 30, limit: 100) == .compacted(firstAvailable: 21))
        #expect(
            try journal.events(store: Counter.name, from: 21, to: 30, limit: 100) == .events(Array(allCounter[20...]))
        )
        #expect(
            try journal.events(store: Counter.name, from: 25, to: 100, limit: 3) == .events(Array(allCounter[24..<27]))
        )
        #expect(
            try journal.events(store: Counter.name, from: 29, to: 100, limit: 100) == .events(Array(allCounter[28...]))
        )
        #expect(try journal.events(store: Counter.name, from: 31, to: 40, limit: 10) == .events([]))
        #expect(try journal.events(store: Posts.name, from: 1, to: 6, limit: 10) == .events(allPosts))
        #expect(
            try journal.newestSnapshot(store: Counter.name)
                == JournalSnapshot(store: Counter.name, seq: 30, encoding: counter)
        )
        #expect(try journal.newestSnapshot(store: Posts.name) == nil)

        let stats = try journal.stats()
        #expect(stats.stores.map(\.name) == [Counter.name, Posts.name])
        #expect(stats.stores[0].epoch == counterEpoch)
        #expect(stats.stores[0].firstSeq == 21)
        #expect(stats.stores[0].lastSeq == 30)
        #expect(stats.stores[0].eventCount == 10)
        #expect(stats.stores[0].snapshotSeqs == [20, 30])
        #expect(stats.stores[1].firstSeq == 1)
        #expect(stats.stores[1].lastSeq == 6)
        #expect(stats.stores[1].eventCount == 6)
        #expect(stats.stores[1].snapshotSeqs == [])
        #expect(stats.idempotencyEntries == 36)
        #expect(try journal.verify() == [])

        try journal.close()
        let reopened = try fixture.open()
        let recoveredCounter = try reopened.recover(Counter.self)
        #expect(recoveredCounter.state == counter)
        #expect(recoveredCounter.state.count == 30)
        #expect(recoveredCounter.lastSeq == 30)
        #expect(recoveredCounter.snapshotSeq == 30)
        #expect(recoveredCounter.replayedEvents == 0)
        #expect(recoveredCounter.epoch == counterEpoch)
        let recoveredPosts = try reopened.recover(Posts.self)
        #expect(recoveredPosts.state == posts)
        #expect(recoveredPosts.state.posts == (1...6).map { "p\($0)" })
        #expect(recoveredPosts.lastSeq == 6)
        #expect(recoveredPosts.snapshotSeq == nil)
        #expect(recoveredPosts.replayedEvents == 6)

        // Recovery resumes the snapshot count: 9 more events are not due, the 10th is.
        let nine = events(Counter.name, from: 31, count: 9) { _ in Counter.Action.decrement }
        try reopened.commit(JournalBatch(events: nine))
        #expect(!reopened.snapshotDue(store: Counter.name))
        #expect(reopened.snapshotDue(store: Counter.name, pendingEvents: 1, pendingBytes: 0))
    }

    @Test(arguments: JournalKind.allCases)
    func aSnapshotIsDueAfterEnoughBytes(kind: JournalKind) async throws {
        let fixture = try await JournalFixture(
            kind,
            policy: JournalPolicy(snapshotEveryEvents: 1_000, snapshotEveryBytes: 100)
        )
        let journal = try fixture.open()
        _ = try journal.recover(Todos.self)
        let long = events(Todos.name, from: 1, count: 1) { _ in
            Todos.Action.add(text: String(repeating: "x", count: 60))
        }
        #expect(!journal.snapshotDue(store: Todos.name, in: JournalBatch(events: long)))
        try journal.commit(JournalBatch(events: long))
        let second = events(Todos.name, from: 2, count: 1) { _ in
            Todos.Action.add(text: String(repeating: "y", count: 60))
        }
        #expect(journal.snapshotDue(store: Todos.name, in: JournalBatch(events: second)))
    }

    @Test(arguments: JournalKind.allCases)
    func aBatchThatBreaksTheRulesIsRefusedWhole(kind: JournalKind) async throws {
        let fixture = try await JournalFixture(kind)
        let journal = try fixture.open()
        _ = try journal.recover(Counter.self)
        let first = events(Counter.name, from: 1, count: 3) { _ in Counter.Action.increment }
        try journal.commit(JournalBatch(events: first))

        let cases: [(JournalBatch, JournalError.Code, String)] = [
            (
                JournalBatch(events: events(Counter.name, from: 5, count: 2) { _ in Counter.Action.increment }),
                .invalidBatch, "a gap"
            ),
            (
                JournalBatch(events: events(Counter.name, from: 3, count: 2) { _ in Counter.Action.increment }),
                .invalidBatch, "a seq already used"
            ),
            (
                JournalBatch(
                    events: events(Counter.name, from: 4, count: 1) { _ in Counter.Action.increment }
                        + events(Posts.name, from: 1, count: 1) { _ in Posts.Action.appendPosts(posts: ["a"]) }
                ),
                .unknownStore, "a store not recovered"
            ),
            (
                JournalBatch(
                    events: events(Counter.name, from: 4, count: 1, client: [1, 2, 3]) { _ in Counter.Action.increment }
                ),
                .invalidBatch, "a short client id"
            ),
            (
                JournalBatch(
                    events: events(Counter.name, from: 4, count: 2) { _ in Counter.Action.increment },
                    snapshots: [try JournalSnapshot(store: Counter.name, seq: 6, encoding: Counter.State(count: 6))]
                ),
                .invalidBatch, "a snapshot above the batch's last seq"
            ),
            (
                JournalBatch(
                    events: events(Counter.name, from: 4, count: 2) { _ in Counter.Action.increment },
                    snapshots: [try JournalSnapshot(store: Counter.name, seq: 0, encoding: Counter.State(count: 0))]
                ),
                .invalidBatch, "a snapshot not past the newest"
            ),
            (
                JournalBatch(
                    events: events(Counter.name, from: 4, count: 2) { _ in Counter.Action.increment },
                    snapshots: [
                        JournalSnapshot(
                            store: Counter.name,
                            seq: 5,
                            state: encoded(Counter.State(count: 5)),
                            digest: StateDigest(of: encoded(Counter.State(count: 6)))
                        )
                    ]
                ),
                .digestMismatch, "a snapshot whose digest is wrong"
            ),
        ]
        for (batch, code, label) in cases {
            let error = journalError { try journal.commit(batch) }
            #expect(error?.code == code, "\(label)")
            #expect(error?.file == journal.location, "\(label)")
            #expect(error?.operation == "commit", "\(label)")
            #expect(journal.lastSeq(store: Counter.name) == 3, "\(label)")
            #expect(try journal.events(store: Counter.name, from: 1, to: 10, limit: 10) == .events(first), "\(label)")
        }
        #expect(try journal.idempotencyRecords() == [])
        let next = events(Counter.name, from: 4, count: 2) { _ in Counter.Action.decrement }
        try journal.commit(JournalBatch(events: next))
        #expect(try journal.events(store: Counter.name, from: 1, to: 10, limit: 10) == .events(first + next))
    }

    @Test(arguments: JournalKind.allCases)
    func rangeArgumentsAreChecked(kind: JournalKind) async throws {
        let fixture = try await JournalFixture(kind)
        let journal = try fixture.open()
        _ = try journal.recover(Counter.self)
        #expect(
            journalError { _ = try journal.events(store: Counter.name, from: 5, to: 4, limit: 10) }?.code
                == .invalidArgument
        )
        #expect(
            journalError { _ = try journal.events(store: Counter.name, from: 1, to: 4, limit: 0) }?.code
                == .invalidArgument
        )
        #expect(journalError { _ = try journal.events(store: "nope", from: 1, to: 4, limit: 1) }?.code == .unknownStore)
    }

    @Test(arguments: JournalKind.allCases)
    func idempotencyEntriesSurviveReopenAndOnlyTheNewestAreKept(kind: JournalKind) async throws {
        let fixture = try await JournalFixture(kind, policy: JournalPolicy(idempotencyEntriesKept: 3))
        let journal = try fixture.open()
        _ = try journal.recover(Counter.self)
        let applied = events(Counter.name, from: 1, count: 3) { _ in Counter.Action.increment }
        let appliedRecords = idempotency(for: applied)
        try journal.commit(JournalBatch(events: applied, idempotency: appliedRecords))
        // A rejected request has an entry and no event.
        let rejected = IdempotencyRecord(
            key: IdempotencyKey(clientID: clientB, requestNumber: 9),
            fingerprint: [9],
            reply: Array("rejected".utf8)
        )
        let fifth = IdempotencyRecord(
            key: IdempotencyKey(clientID: clientB, requestNumber: 10),
            fingerprint: [10],
            reply: [1]
        )
        try journal.commit(JournalBatch(idempotency: [rejected, fifth]))
        try journal.close()

        let reopened = try fixture.open()
        #expect(try reopened.idempotencyRecords() == [appliedRecords[2], rejected, fifth])
        #expect(try reopened.idempotencyRecord(for: rejected.key) == rejected)
        #expect(try reopened.idempotencyRecord(for: appliedRecords[2].key) == appliedRecords[2])
        #expect(try reopened.idempotencyRecord(for: appliedRecords[0].key) == nil)
        #expect(try reopened.idempotencyRecord(for: appliedRecords[1].key) == nil)
        #expect(try reopened.stats().idempotencyEntries == 3)

        // An entry for a key already kept replaces it in place; the count of entries kept stays exact.
        let replacement = IdempotencyRecord(key: appliedRecords[2].key, fingerprint: [3], reply: Array("again".utf8))
        try reopened.commit(JournalBatch(idempotency: [replacement]))
        #expect(try reopened.idempotencyRecords() == [replacement, rejected, fifth])
        let sixth = IdempotencyRecord(
            key: IdempotencyKey(clientID: clientB, requestNumber: 11),
            fingerprint: [11],
            reply: [2]
        )
        try reopened.commit(JournalBatch(idempotency: [sixth]))
        #expect(try reopened.idempotencyRecords() == [rejected, fifth, sixth])

        // One batch of several: a kept key replaced in place, a new key twice (the later entry, in the first one's
        // place), another new key; then the newest 3 are kept.
        func entry(_ number: UInt64, _ reply: UInt8) -> IdempotencyRecord {
            IdempotencyRecord(
                key: IdempotencyKey(clientID: clientB, requestNumber: number),
                fingerprint: [1],
                reply: [reply]
            )
        }
        let (fifthAgain, seventh, seventhAgain, eighth) = (entry(10, 5), entry(12, 6), entry(12, 7), entry(13, 8))
        try reopened.commit(JournalBatch(idempotency: [seventh, fifthAgain, seventhAgain, eighth]))
        #expect(try reopened.idempotencyRecords() == [sixth, seventhAgain, eighth])
        #expect(try reopened.idempotencyRecord(for: fifth.key) == nil)
        #expect(try reopened.stats().idempotencyEntries == 3)
    }

    @Test(arguments: JournalKind.allCases)
    func aStoreWrittenByAnotherDomainVersionIsRefused(kind: JournalKind) async throws {
        let fixture = try await JournalFixture(kind)
        let journal = try fixture.open()
        _ = try journal.recover(Counter.self)
        try journal.commit(
            JournalBatch(events: events(Counter.name, from: 1, count: 2) { _ in Counter.Action.increment })
        )
        try journal.close()

        let reopened = try fixture.open()
        let error = journalError { _ = try reopened.recover(CounterV2.self) }
        #expect(error?.code == .domainVersionMismatch)
        #expect(error?.store == Counter.name)
        #expect(error?.file == reopened.location)
        #expect(error?.message.contains("version 1") == true)
        #expect(error?.message.contains("version 2") == true)
        // Nothing was changed: the right version still recovers.
        #expect(try reopened.recover(Counter.self).state.count == 2)
    }

    /// A full disk (SQLite's max_page_count, or the in-memory journal's capacity) fails the commit with a
    /// typed error; the journal stays valid; once there is room, commits work and nothing of the failed
    /// batch is there. (A PostgreSQL server's disk cannot be filled from a test this cheaply; its commit's
    /// all-or-nothing is PostgresJournalTests'.)
    @Test(arguments: [JournalKind.sqlite, .memory])
    func aFullDiskFailsTheCommitCleanly(kind: JournalKind) async throws {
        let fixture = try await JournalFixture(kind)
        let journal = try fixture.open()
        _ = try journal.recover(Counter.self)
        let before = events(Counter.name, from: 1, count: 10) { _ in Counter.Action.increment }
        try journal.commit(JournalBatch(events: before, idempotency: idempotency(for: before)))

        let limit = try fill(journal)
        let failed = events(Counter.name, from: 11, count: 300, client: clientB) { _ in Counter.Action.decrement }
        let error = journalError {
            try journal.commit(JournalBatch(events: failed, idempotency: idempotency(for: failed, replySize: 1_000)))
        }
        #expect(error?.code == .storageFull)
        #expect(error?.file == journal.location)
        #expect(error?.operation == "commit")
        if kind == .sqlite {
            #expect(error?.sqliteCode == 13)
            #expect(error?.sqliteMessage != nil)
        }
        #expect(journal.lastSeq(store: Counter.name) == 10)
        #expect(try journal.events(store: Counter.name, from: 1, to: 400, limit: 400) == .events(before))
        #expect(try journal.idempotencyRecord(for: IdempotencyKey(clientID: clientB, requestNumber: 11)) == nil)
        #expect(try journal.verify() == [])

        try limit(false)
        let after = events(Counter.name, from: 11, count: 300) { _ in Counter.Action.increment }
        try journal.commit(JournalBatch(events: after, idempotency: idempotency(for: after, replySize: 1_000)))
        try journal.close()

        let reopened = try fixture.open()
        let recovered = try reopened.recover(Counter.self)
        #expect(recovered.lastSeq == 310)
        #expect(recovered.state.count == 310)
        #expect(try reopened.events(store: Counter.name, from: 1, to: 400, limit: 400) == .events(before + after))
        #expect(try reopened.idempotencyRecord(for: IdempotencyKey(clientID: clientB, requestNumber: 11)) == nil)
        #expect(try reopened.idempotencyRecords().count == 310)
        #expect(try reopened.verify() == [])
    }

    /// Makes the journal full; the returned function turns the limit off (false) again.
    private func fill(_ journal: any Journal) throws -> (Bool) throws -> Void {
        if let memory = journal as? InMemoryJournal {
            memory.capacityBytes = 2_000
            return { full in memory.capacityBytes = full ? 2_000 : nil }
        }
        let sqlite = try #require(journal as? SQLiteJournal)
        let pages = try sqlite.databaseQueue.writeWithoutTransaction { db in
            try Int.fetchOne(db, sql: "PRAGMA page_count") ?? 0
        }
        try sqlite.databaseQueue.writeWithoutTransaction { db in
            _ = try Int.fetchOne(db, sql: "PRAGMA max_page_count = \(pages)")
        }
        return { full in
            try sqlite.databaseQueue.writeWithoutTransaction { db in
                _ = try Int.fetchOne(db, sql: "PRAGMA max_page_count = \(full ? pages : 1_073_741_823)")
            }
        }
    }
}
