import Foundation
import GRDB
import Lockstep
import LockstepExamples
import LockstepJournal
import LockstepTesting
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// What only the SQLite journal has: a file, its modes and pragmas, its format version, and damage done to
/// it from outside.
@Suite struct SQLiteJournalTests {
    /// A journal with `count` counter increments, closed; returns its fixture.
    private func journal(
        withIncrements count: Int,
        policy: JournalPolicy = JournalPolicy()
    ) async throws -> JournalFixture {
        let fixture = try await JournalFixture(.sqlite, policy: policy)
        let journal = try fixture.open()
        _ = try journal.recover(Counter.self)
        let batch = events(Counter.name, from: 1, count: count) { _ in Counter.Action.increment }
        try journal.commit(JournalBatch(events: batch, idempotency: idempotency(for: batch)))
        try journal.close()
        return fixture
    }

    private func mode(_ path: String) -> mode_t? {
        var info = stat()
        return stat(path, &info) == 0 ? info.st_mode & 0o777 : nil
    }

    /// Reading a stopped daemon's journal leaves its directory as it was (SQLite makes a `-wal` and a `-shm` to read a
    /// WAL database; the reader takes them away again), and a reader beside a writer leaves the writer's alone.
    @Test func aReaderLeavesTheDirectoryAsItFoundIt() async throws {
        let fixture = try await journal(withIncrements: 3)
        let path = file(fixture)
        let others = { ["-wal", "-shm"].filter { FileManager.default.fileExists(atPath: path + $0) } }
        #expect(others() == [])
        for _ in 0..<2 {
            let reader = try SQLiteJournal(directory: fixture.dataDirectory, readOnly: true)
            guard case let .events(read) = try reader.events(store: Counter.name, from: 1, to: 3, limit: 10) else {
                Issue.record("the reader found the history compacted")
                return
            }
            #expect(read.count == 3)
            try reader.close()
            #expect(others() == [], "a read left \(others()) beside the journal")
        }
        let writer = try fixture.open()
        _ = try writer.recover(Counter.self)
        let reader = try SQLiteJournal(directory: fixture.dataDirectory, readOnly: true)
        _ = try reader.events(store: Counter.name, from: 1, to: 3, limit: 10)
        try reader.close()
        #expect(others() == ["-wal", "-shm"], "the writer's files went with the reader")
        try writer.close()
    }

    @Test func theFileIsPrivateInWALModeWithFullSync() async throws {
        let fixture = try await JournalFixture(.sqlite)
        let journal = try SQLiteJournal(directory: fixture.dataDirectory)
        _ = try journal.recover(Counter.self)
        try journal.commit(
            JournalBatch(events: events(Counter.name, from: 1, count: 1) { _ in Counter.Action.increment })
        )
        let path = file(fixture)
        #expect(journal.location == path)
        #expect(mode(fixture.dataDirectory) == 0o700)
        #expect(mode(path) == 0o600)
        #expect(mode(path + "-wal") == 0o600)
        #expect(mode(path + "-shm") == 0o600)
        let (journalMode, synchronous, foreignKeys) = try await journal.databaseQueue.read { db in
            (
                try String.fetchOne(db, sql: "PRAGMA journal_mode"), try Int.fetchOne(db, sql: "PRAGMA synchronous"),
                try Int.fetchOne(db, sql: "PRAGMA foreign_keys")
            )
        }
        #expect(journalMode == "wal")
        #expect(synchronous == 2)
        #expect(foreignKeys == 1)
        try journal.close()
    }

    @Test func aRelaxedJournalCommitsWithoutSyncAndSyncsOnRequest() async throws {
        let fixture = try await JournalFixture(.sqlite)
        let journal = try SQLiteJournal(directory: fixture.dataDirectory, relaxed: true)
        _ = try journal.recover(Counter.self)
        try journal.commit(
            JournalBatch(events: events(Counter.name, from: 1, count: 3) { _ in Counter.Action.increment })
        )
        #expect(try await journal.databaseQueue.read { try Int.fetchOne($0, sql: "PRAGMA synchronous") } == 1)
        try journal.sync()
        try journal.close()
        let reopened = try SQLiteJournal(directory: fixture.dataDirectory)
        #expect(try reopened.recover(Counter.self).lastSeq == 3)
        try reopened.close()
    }

    @Test func aJournalOfAnotherFormatVersionIsRefusedNamingTheFileAndBothVersions() async throws {
        let fixture = try await journal(withIncrements: 3)
        try tamper(fixture) { try $0.execute(sql: "UPDATE journal_format SET version = 99") }
        let error = journalError { _ = try SQLiteJournal(directory: fixture.dataDirectory) }
        #expect(error?.code == .formatVersionMismatch)
        #expect(error?.file == file(fixture))
        #expect(error?.operation == "open")
        #expect(error?.message.contains("format version 99") == true)
        #expect(error?.message.contains("format version \(SQLiteJournal.formatVersion)") == true)
        #expect(error?.description.contains(file(fixture)) == true)
        // Read-only opens are refused alike.
        #expect(
            journalError { _ = try SQLiteJournal(directory: fixture.dataDirectory, readOnly: true) }?.code
                == .formatVersionMismatch
        )
    }

    @Test func aFormat1JournalIsReadAsItIsAndRebuiltAsTheCurrentFormatWhenOpenedForWriting() async throws {
        let fixture = try await journal(withIncrements: 3)
        let original = try fixture.open()
        let records = try original.idempotencyRecords()
        try original.close()
        // Format 1: no store_versions, the idempotency entries indexed by (client_id, request_number).
        try tamper(fixture) { db in
            try db.execute(
                sql: """
                    CREATE TABLE idempotency_1 (
                        position INTEGER PRIMARY KEY, client_id BLOB NOT NULL, request_number INTEGER NOT NULL,
                        fingerprint BLOB NOT NULL, reply BLOB NOT NULL, UNIQUE (client_id, request_number));
                    INSERT INTO idempotency_1 SELECT * FROM idempotency;
                    DROP TABLE idempotency;
                    ALTER TABLE idempotency_1 RENAME TO idempotency;
                    DROP TABLE store_versions;
                    ALTER TABLE events DROP COLUMN author;
                    UPDATE journal_format SET version = 1;
                    """
            )
        }
        let schema = { () throws -> String? in
            let queue = try DatabaseQueue(path: file(fixture))
            defer { try? queue.close() }
            return try queue.read {
                try String.fetchOne($0, sql: "SELECT sql FROM sqlite_master WHERE name = 'idempotency'")
            }
        }
        let reader = try SQLiteJournal(directory: fixture.dataDirectory, readOnly: true)
        #expect(try reader.idempotencyRecords() == records)
        try reader.close()
        #expect(try schema()?.contains("UNIQUE (client_id, request_number)") == true)

        let writer = try SQLiteJournal(directory: fixture.dataDirectory)
        #expect(try writer.recover(Counter.self).lastSeq == 3)
        #expect(try writer.idempotencyRecords() == records)
        #expect(
            try await writer.databaseQueue.read { try Int.fetchOne($0, sql: "SELECT version FROM journal_format") }
                == SQLiteJournal.formatVersion
        )
        #expect(
            try writer.stats().stores.map(\.versions) == [
                [JournalDomainVersion(store: "counter", version: 1, sinceSeq: 0)]
            ]
        )
        try writer.close()
        #expect(try schema()?.contains("UNIQUE (request_number, client_id)") == true)
    }

    /// A journal of format 4 (before authors) reads as it is, its events by nobody identified; opened for writing
    /// it gains the column, its old events' checksums still match, and new events keep their authors.
    @Test func aFormat4JournalGainsAuthorsWhenOpenedForWriting() async throws {
        let fixture = try await journal(withIncrements: 3)
        try tamper(fixture) { db in
            try db.execute(sql: "ALTER TABLE events DROP COLUMN author; UPDATE journal_format SET version = 4")
        }
        let reader = try SQLiteJournal(directory: fixture.dataDirectory, readOnly: true)
        #expect(try reader.stats().formatVersion == 4)
        guard case let .events(old) = try reader.events(store: "counter", from: 1, to: 3, limit: 10) else {
            Issue.record("no events")
            return
        }
        #expect(old.map(\.author) == ["", "", ""])
        try reader.close()
        let writer = try SQLiteJournal(directory: fixture.dataDirectory)
        #expect(try writer.stats().formatVersion == SQLiteJournal.formatVersion)
        #expect(try writer.recover(Counter.self).lastSeq == 3)
        let authored = JournalEvent(
            store: "counter",
            seq: 4,
            action: Array(#"{"increment":{}}"#.utf8),
            clientID: clientA,
            requestNumber: 4,
            author: "member"
        )
        try writer.commit(JournalBatch(events: [authored]))
        try writer.close()
        let again = try SQLiteJournal(directory: fixture.dataDirectory)
        #expect(try again.recover(Counter.self).lastSeq == 4)
        guard case let .events(all) = try again.events(store: "counter", from: 1, to: 4, limit: 10) else {
            Issue.record("no events")
            return
        }
        #expect(all.map(\.author) == ["", "", "", "member"])
        try again.close()
    }

    @Test func oneWriterPerDataDirectory() async throws {
        let fixture = try await journal(withIncrements: 2)
        let writer = try fixture.open()
        let second = journalError { _ = try SQLiteJournal(directory: fixture.dataDirectory) }
        #expect(second?.code == .inUse)
        #expect(second?.message.contains("one daemon per data directory") == true, "\(second?.message ?? "")")
        // Readers are welcome beside the writer.
        let reader = try SQLiteJournal(directory: fixture.dataDirectory, readOnly: true)
        #expect(try reader.stats().stores.first?.lastSeq == 2)
        try reader.close()
        try writer.close()
        // Closed, the directory takes the next writer.
        let next = try SQLiteJournal(directory: fixture.dataDirectory)
        #expect(try next.recover(Counter.self).lastSeq == 2)
        try next.close()
    }

    @Test func anotherDatabaseIsNotAJournal() throws {
        let directory = try temporaryDirectory("not-a-journal")
        defer { try? FileManager.default.removeItem(at: directory) }
        let queue = try DatabaseQueue(path: directory.appendingPathComponent(SQLiteJournal.fileName).path)
        try queue.write { try $0.execute(sql: "CREATE TABLE player (id INTEGER PRIMARY KEY)") }
        try queue.close()
        #expect(journalError { _ = try SQLiteJournal(directory: directory.path) }?.code == .notAJournal)
    }

    @Test func aMissingJournalIsNotCreatedWhenOpenedReadOnly() throws {
        let directory = try temporaryDirectory("missing")
        defer { try? FileManager.default.removeItem(at: directory) }
        let error = journalError { _ = try SQLiteJournal(directory: directory.path, readOnly: true) }
        #expect(error?.code == .notFound)
        #expect(!FileManager.default.fileExists(atPath: directory.appendingPathComponent(SQLiteJournal.fileName).path))
    }

    @Test func aReadOnlyJournalReadsButRefusesCommitsAndNewStores() async throws {
        let fixture = try await journal(withIncrements: 4)
        let journal = try SQLiteJournal(directory: fixture.dataDirectory, readOnly: true)
        #expect(try journal.recover(Counter.self).state.count == 4)
        let batch = JournalBatch(events: events(Counter.name, from: 5, count: 1) { _ in Counter.Action.increment })
        #expect(journalError { try journal.commit(batch) }?.code == .readOnly)
        #expect(journalError { _ = try journal.recover(Posts.self) }?.code == .unknownStore)
        try journal.close()
    }

    @Test func dumpPrintsEachEventsActionAsJSONAndStatsDescribesTheStores() async throws {
        let fixture = try await JournalFixture(.sqlite)
        let journal = try fixture.open()
        _ = try journal.recover(Counter.self)
        _ = try journal.recover(Todos.self)
        let todo = events(Todos.name, from: 1, count: 2) { seq in Todos.Action.add(text: "todo \(seq)") }
        let counter = events(Counter.name, from: 1, count: 3) { seq in seq == 2 ? Counter.Action.decrement : .increment
        }
        try journal.commit(JournalBatch(events: todo + counter))
        try journal.close()

        let dump = try await runProduct("lockstep", ["journal", "dump", fixture.dataDirectory])
        #expect(dump.status == 0, "\(dump.standardError)")
        #expect(
            dump.standardOutput == """
                {"store":"counter","seq":1,"action":{"increment":{}}}
                {"store":"counter","seq":2,"action":{"decrement":{}}}
                {"store":"counter","seq":3,"action":{"increment":{}}}
                {"store":"todos","seq":1,"action":{"add":{"text":"todo 1"}}}
                {"store":"todos","seq":2,"action":{"add":{"text":"todo 2"}}}

                """
        )
        let some = try await runProduct(
            "lockstep",
            ["journal", "dump", fixture.dataDirectory, "--store", "counter", "--from", "3"]
        )
        #expect(some.standardOutput == "{\"store\":\"counter\",\"seq\":3,\"action\":{\"increment\":{}}}\n")

        let stats = try await runProduct("lockstep", ["journal", "stats", fixture.dataDirectory, "--json"])
        #expect(stats.status == 0, "\(stats.standardError)")
        let reply = try JSONSerialization.jsonObject(with: Data(stats.standardOutput.utf8)) as? [String: Any]
        let stores = reply?["stores"] as? [[String: Any]]
        #expect(stores?.map { $0["name"] as? String } == ["counter", "todos"])
        #expect(stores?.map { $0["lastSeq"] as? Int } == [3, 2])
        #expect(stores?.map { $0["eventCount"] as? Int } == [3, 2])
        #expect(stores?.map { $0["domainVersion"] as? Int } == [1, 1])
        #expect((reply?["fileBytes"] as? Int ?? 0) > 0)

        let verify = try await runProduct("lockstep", ["journal", "verify", fixture.dataDirectory])
        #expect(verify.status == 0, "\(verify.standardOutput) \(verify.standardError)")
        #expect(verify.standardOutput.contains("intact"))
    }

    @Test func dumpFromBelowTheCompactedHistoryNamesTheFirstSeqKept() async throws {
        let fixture = try await JournalFixture(.sqlite, policy: JournalPolicy(snapshotEveryEvents: 5, snapshotsKept: 1))
        let journal = try fixture.open()
        _ = try journal.recover(Counter.self)
        let batch = events(Counter.name, from: 1, count: 5) { _ in Counter.Action.increment }
        try journal.commit(
            JournalBatch(
                events: batch,
                snapshots: [try JournalSnapshot(store: Counter.name, seq: 5, encoding: Counter.State(count: 5))]
            )
        )
        try journal.commit(
            JournalBatch(events: events(Counter.name, from: 6, count: 2) { _ in Counter.Action.increment })
        )
        try journal.close()
        let dump = try await runProduct("lockstep", ["journal", "dump", fixture.dataDirectory, "--from", "2"])
        #expect(dump.status == 1)
        #expect(dump.standardError.contains("compacted below seq 6"), "\(dump.standardError)")
    }
}

@Suite struct ChecksumTests {
    @Test func crc32cMatchesTheStandardCheckValue() {
        #expect(CRC32C.checksum(Array("123456789".utf8)) == 0xE306_9283)
        #expect(CRC32C.checksum([UInt8]()) == 0)
        var incremental = CRC32C()
        incremental.update(Array("1234".utf8))
        incremental.update(Array("56789".utf8))
        #expect(incremental.value == 0xE306_9283)
    }

    /// Eight bytes a step and the byte-at-a-time tail give what the polynomial gives bit by bit, at every length and
    /// at every alignment of the start.
    @Test func crc32cOfEveryLengthAndAlignmentMatchesTheBitwiseOne() {
        func bitwise(_ bytes: ArraySlice<UInt8>) -> UInt32 {
            var crc = ~UInt32(0)
            for byte in bytes {
                crc ^= UInt32(byte)
                for _ in 0..<8 { crc = crc & 1 == 1 ? (crc >> 1) ^ 0x82F6_3B78 : crc >> 1 }
            }
            return ~crc
        }
        var generator = SplitMix64(seed: 35)
        let bytes = (0..<80).map { _ in UInt8.random(in: 0...255, using: &generator) }
        for start in 0..<8 {
            for end in start...bytes.count {
                #expect(CRC32C.checksum(bytes[start..<end]) == bitwise(bytes[start..<end]), "\(start)..<\(end)")
            }
        }
    }

    @Test func theEventChecksumCoversEveryField() {
        let event = JournalEvent(store: "counter", seq: 7, action: [1, 2, 3], clientID: clientA, requestNumber: 9)
        var changed = [event, event, event, event, event]
        changed[0].store = "counteR"
        changed[1].seq = 8
        changed[2].action = [1, 2, 4]
        changed[3].clientID = clientB
        changed[4].requestNumber = 10
        for other in changed { #expect(other.checksum != event.checksum) }
        // An author counts once there is one; without one the checksum is what journals before authors stored.
        var authored = event
        authored.author = "member"
        var other = authored
        other.author = "membe"
        #expect(authored.checksum != event.checksum && other.checksum != authored.checksum)
        // Length prefixes: moving a byte from the store name into the action changes the checksum.
        let shifted = JournalEvent(
            store: "counte",
            seq: 7,
            action: [UInt8(ascii: "r"), 1, 2, 3],
            clientID: clientA,
            requestNumber: 9
        )
        #expect(shifted.checksum != event.checksum)
    }
}
