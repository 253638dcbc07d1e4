import Foundation
import Lockstep
import LockstepExamples
import LockstepJournal
import LockstepTesting
import TestSupport
import Testing

/// What only the PostgreSQL journal has: a server, a connection that can be lost, other sessions on the same
/// database, and a schema it shares a database with.
@Suite struct PostgresJournalTests {
    /// A journal with `count` counter increments, closed; returns its fixture.
    private func journal(withIncrements count: Int) async throws -> JournalFixture {
        let fixture = try await JournalFixture(.postgres)
        let journal = try fixture.open()
        _ = try journal.recover(Counter.self)
        let batch = events(Counter.name, from: 1, count: count) { _ in Counter.Action.increment }
        try journal.commit(JournalBatch(events: batch, idempotency: idempotency(for: batch)))
        try journal.close()
        return fixture
    }

    /// A statement that fails in the middle of a commit (a row put there behind the journal's back makes the
    /// second of three inserts violate the primary key; then the snapshot's insert, after the events') rolls back
    /// the whole transaction: the first event and the idempotency entries are not kept either. The commit's
    /// statements go in one pipeline, which the failure aborts; the session is rolled back, not replaced, and
    /// takes the next commit.
    @Test func aCommitIsOneTransaction() async throws {
        let fixture = try await journal(withIncrements: 3)
        let journal = try #require(try fixture.open() as? PostgresJournal)
        _ = try journal.recover(Counter.self)
        let session = journal.writerBackendPID
        let stray = JournalEvent(store: Counter.name, seq: 5, action: [1], clientID: clientB, requestNumber: 0)
        try fixture.tamper(
            "INSERT INTO events VALUES ('counter', 5, '\\x01', '\\x\(hex(clientB))', 0, \(stray.checksum))"
        )
        let batch = events(Counter.name, from: 4, count: 3, client: clientB) { _ in Counter.Action.decrement }
        let error = journalError {
            try journal.commit(JournalBatch(events: batch, idempotency: idempotency(for: batch)))
        }
        #expect(error?.code == .postgres)
        #expect(error?.postgresState == "23505", "\(error?.description ?? "")")
        #expect(error?.operation == "commit")
        #expect(journal.lastSeq(store: Counter.name) == 3)
        try fixture.tamper("DELETE FROM events WHERE seq = 5")
        let kept = events(Counter.name, from: 1, count: 3) { _ in Counter.Action.increment }
        #expect(try journal.events(store: Counter.name, from: 1, to: 10, limit: 10) == .events(kept))
        #expect(try journal.idempotencyRecord(for: IdempotencyKey(clientID: clientB, requestNumber: 4)) == nil)
        #expect(try journal.idempotencyRecordCount() == 3)

        let snapshot = try JournalSnapshot(store: Counter.name, seq: 6, encoding: Counter.State(count: 0))
        try fixture.tamper("INSERT INTO snapshots VALUES ('counter', 6, '\\x00', '\\x00')")
        let late = journalError {
            try journal.commit(JournalBatch(events: batch, idempotency: idempotency(for: batch), snapshots: [snapshot]))
        }
        #expect(late?.postgresState == "23505", "\(late?.description ?? "")")
        try fixture.tamper("DELETE FROM snapshots")
        #expect(journal.lastSeq(store: Counter.name) == 3)
        #expect(try journal.events(store: Counter.name, from: 1, to: 10, limit: 10) == .events(kept))
        #expect(try journal.idempotencyRecordCount() == 3)

        try journal.commit(JournalBatch(events: batch, idempotency: idempotency(for: batch), snapshots: [snapshot]))
        #expect(journal.writerBackendPID == session)
        try journal.close()
        let reopened = try fixture.open()
        #expect(try reopened.recover(Counter.self).state.count == 0)
        #expect(try reopened.idempotencyRecordCount() == 6)
        try reopened.close()
    }

    /// The fixture's journal opened for writing, its counter store recovered.
    func recoveredCounter(_ fixture: JournalFixture) throws -> PostgresJournal {
        let journal = try #require(try fixture.open() as? PostgresJournal)
        _ = try journal.recover(Counter.self)
        return journal
    }

    /// Ends the sessions of `fixture`'s database that match `condition` (a condition on `pg_stat_activity`), but
    /// not the one that asks, and waits until their server processes are gone: `pg_terminate_backend` only signals
    /// one unless given a timeout, and a session that ended meanwhile (an earlier journal's) is not there to wait
    /// for, so what counts is that none of them is left. The server process ids ended, or `nil` if one was still
    /// there 10 s later.
    func terminateSessions(_ fixture: JournalFixture, where condition: String = "true") async throws -> [Int32]? {
        let connection = fixture.connection!
        let pids = try PostgresJournal.execute(
            """
            SELECT pid::text FROM pg_stat_activity
            WHERE datname = current_database() AND pid <> pg_backend_pid() AND \(condition)
            """,
            connection: connection
        ).compactMap { $0.flatMap { Int32($0) } }
        guard !pids.isEmpty else { return [] }
        let list = pids.map(String.init).joined(separator: ", ")
        _ = try PostgresJournal.execute(
            "SELECT count(pg_terminate_backend(pid, 10000))::text FROM unnest(ARRAY[\(list)]) AS pid",
            connection: connection
        )
        let gone = try await eventually(within: .seconds(10)) {
            try PostgresJournal.execute(
                "SELECT count(*)::text FROM pg_stat_activity WHERE pid IN (\(list))",
                connection: connection
            ) == ["0"]
        }
        return gone ? pids : nil
    }

    /// The server ends every session of the journal while it is idle (as a restart would): the next read and the
    /// next commit find out before they start, reconnect, and succeed. A session idle for more than a second is
    /// asked whether it still answers before it is used; here every use asks (`idleBeforeCheck` zero), rather than
    /// the test waiting out that second.
    @Test func sessionsTheServerEndedWhileIdleAreReplacedBeforeTheyAreUsed() async throws {
        let fixture = try await journal(withIncrements: 2)
        let journal = try recoveredCounter(fixture)
        journal.idleBeforeCheck = .zero
        #expect(try journal.events(store: Counter.name, from: 1, to: 2, limit: 10) != .events([]))
        let pid = journal.writerBackendPID
        let ended = try await terminateSessions(fixture)
        #expect(ended?.contains(pid) == true, "ended \(String(describing: ended)), the writer's session is \(pid)")
        let expected = events(Counter.name, from: 1, count: 2) { _ in Counter.Action.increment }
        #expect(try journal.events(store: Counter.name, from: 1, to: 2, limit: 10) == .events(expected))
        let batch = events(Counter.name, from: 3, count: 1) { _ in Counter.Action.increment }
        try journal.commit(JournalBatch(events: batch))
        #expect(journal.writerBackendPID != pid)
        #expect(try journal.events(store: Counter.name, from: 1, to: 10, limit: 10) == .events(expected + batch))
        try journal.close()
    }

    /// The server ends the writer's session (as a restart or a failover would) within a second of its last use, so
    /// the journal does not ask it first: the next commit fails with `unreachable` and keeps nothing, and the journal
    /// reconnects for the one after it. The journal never asks here (`idleBeforeCheck` an hour), however slowly the
    /// test runs.
    @Test func aLostConnectionFailsOneCommitClearlyAndTheJournalReconnects() async throws {
        let fixture = try await journal(withIncrements: 2)
        let journal = try recoveredCounter(fixture)
        journal.idleBeforeCheck = .seconds(3_600)
        let pid = journal.writerBackendPID
        #expect(pid > 0)
        let ended = try await terminateSessions(fixture, where: "pid = \(pid)")
        #expect(ended == [pid], "ended \(String(describing: ended)), the writer's session is \(pid)")

        let batch = events(Counter.name, from: 3, count: 2) { _ in Counter.Action.increment }
        let error = journalError { try journal.commit(JournalBatch(events: batch)) }
        #expect(error?.code == .unreachable, "\(error?.description ?? "")")
        #expect(error?.message.contains("connection to PostgreSQL was lost") == true, "\(error?.message ?? "")")
        #expect(journal.lastSeq(store: Counter.name) == 2)

        try journal.commit(JournalBatch(events: batch))
        #expect(journal.writerBackendPID != pid)
        let kept = events(Counter.name, from: 1, count: 2) { _ in Counter.Action.increment } + batch
        #expect(try journal.events(store: Counter.name, from: 1, to: 10, limit: 10) == .events(kept))
        try journal.close()
        let reopened = try fixture.open()
        #expect(try reopened.recover(Counter.self).state.count == 4)
        try reopened.close()
    }

    @Test func aServerThatIsNotThereIsNamedAndThePasswordIsNot() throws {
        let directory = try temporaryDirectory("no-postgres")
        defer { try? FileManager.default.removeItem(at: directory) }
        let error = journalError {
            _ = try PostgresJournal(connection: "host=\(directory.path) port=5 dbname=lockstep password=hunter2")
        }
        #expect(error?.code == .unreachable)
        #expect(error?.operation == "open")
        let text = error?.description ?? ""
        #expect(
            text.contains("could not connect to PostgreSQL at 'host=\(directory.path) port=5 dbname=lockstep'"),
            "\(text)"
        )
        #expect(text.contains("is the server running"), "\(text)")
        #expect(!text.contains("hunter2"), "\(text)")
        #expect(
            journalError { _ = try PostgresJournal(connection: "host=/x password=hunter2 nonsense") }?.code
                == .invalidArgument
        )
    }

    @Test func aJournalOfAnotherFormatVersionIsRefusedNamingBothVersions() async throws {
        let fixture = try await journal(withIncrements: 3)
        try fixture.tamper("UPDATE journal_format SET version = 99")
        let error = journalError { _ = try fixture.open() }
        #expect(error?.code == .formatVersionMismatch)
        #expect(error?.operation == "open")
        #expect(error?.message.contains("format version 99") == true)
        #expect(error?.message.contains("format version \(PostgresJournal.formatVersion)") == true)
        #expect(
            journalError { _ = try PostgresJournal(connection: fixture.connection!, readOnly: true) }?.code
                == .formatVersionMismatch
        )
    }

    /// One writer per journal, the holder of its lease (PostgresLeaseTests); readers are welcome beside it, and so
    /// is the writer of a journal in another schema of the same database.
    @Test func oneWriterPerJournal() async throws {
        let fixture = try await journal(withIncrements: 2)
        let writer = try fixture.open()
        let second = journalError { _ = try fixture.open() }
        #expect(second?.code == .inUse)
        #expect(second?.message.contains("another daemon leads this journal") == true, "\(second?.message ?? "")")
        #expect(second?.message.contains(PostgresLease.defaultHolder()) == true, "\(second?.message ?? "")")
        try fixture.tamper("CREATE SCHEMA other")
        let elsewhere = try PostgresJournal(connection: fixture.connection! + " options='-c search_path=other'")
        #expect(try elsewhere.recover(Counter.self).lastSeq == 0)
        try elsewhere.close()
        let reader = try PostgresJournal(connection: fixture.connection!, readOnly: true)
        #expect(try reader.stats().stores.first?.lastSeq == 2)
        #expect(try reader.recover(Counter.self).state.count == 2)
        #expect(journalError { _ = try reader.recover(Posts.self) }?.code == .unknownStore)
        let batch = JournalBatch(events: events(Counter.name, from: 3, count: 1) { _ in Counter.Action.increment })
        #expect(journalError { try reader.commit(batch) }?.code == .readOnly)
        try reader.close()
        try writer.close()
        let next = try fixture.open()
        #expect(try next.recover(Counter.self).lastSeq == 2)
        try next.close()
    }

    @Test func anotherDatabaseIsNotAJournalAndAnEmptyOneIsNotReadOnly() async throws {
        let fixture = try await JournalFixture(.postgres)
        let reader = journalError { _ = try PostgresJournal(connection: fixture.connection!, readOnly: true) }
        #expect(reader?.code == .notFound)
        #expect(
            try PostgresJournal.execute(
                "SELECT count(*)::text FROM pg_tables WHERE schemaname = 'public'",
                connection: fixture.connection!
            ) == ["0"]
        )
        try fixture.tamper("CREATE TABLE events (id integer PRIMARY KEY)")
        let error = journalError { _ = try fixture.open() }
        #expect(error?.code == .notAJournal)
        #expect(error?.message.contains("events") == true)
    }

    @Test func statsNameTheDatabaseAndItsSize() async throws {
        let fixture = try await journal(withIncrements: 4)
        let journal = try fixture.open()
        let stats = try journal.stats()
        #expect(stats.location.hasPrefix("postgres host="))
        #expect(stats.formatVersion == PostgresJournal.formatVersion)
        #expect((stats.fileBytes ?? 0) > 0)
        #expect(stats.idempotencyEntries == 4)
        try journal.close()
    }
}

/// Damage done to a journal from outside, caught by verify, recovery and range reads alike, in SQLite's file and
/// in PostgreSQL's tables; and the CLI that reports it.
@Suite struct JournalDamageTests {
    static let kinds = [JournalKind.sqlite, .postgres]

    private func journal(_ kind: JournalKind, withIncrements count: Int) async throws -> JournalFixture {
        let fixture = try await JournalFixture(kind)
        let journal = try fixture.open()
        _ = try journal.recover(Counter.self)
        let batch = events(Counter.name, from: 1, count: count) { _ in Counter.Action.increment }
        try journal.commit(JournalBatch(events: batch, idempotency: idempotency(for: batch)))
        try journal.close()
        return fixture
    }

    /// A byte string as an SQL literal of the fixture's database.
    private func literal(_ bytes: [UInt8], _ kind: JournalKind) -> String {
        kind == .postgres ? "'\\x\(hex(bytes))'::bytea" : "X'\(hex(bytes))'"
    }

    /// How the CLI names the fixture's journal.
    private func location(_ fixture: JournalFixture) -> [String] {
        fixture.kind == .postgres ? ["--postgres", fixture.connection!] : [fixture.dataDirectory]
    }

    /// A byte flipped in a stored action, with its checksum left as it was: verify and recovery both name
    /// the store and the seq, and recovery refuses to return a state.
    @Test(arguments: kinds)
    func aFlippedByteInAnActionIsCaughtByVerifyAndRecovery(kind: JournalKind) async throws {
        let fixture = try await journal(kind, withIncrements: 20)
        var flipped = encoded(Counter.Action.increment)
        flipped[2] ^= 0x01
        try fixture.tamper("UPDATE events SET action = \(literal(flipped, kind)) WHERE store = 'counter' AND seq = 7")
        let journal = try fixture.open()
        let problems = try journal.verify()
        #expect(problems.count == 1)
        #expect(problems.first?.code == .checksumMismatch)
        #expect(problems.first?.store == Counter.name)
        #expect(problems.first?.seq == 7)

        let error = journalError { _ = try journal.recover(Counter.self) }
        #expect(error?.code == .checksumMismatch)
        #expect(error?.store == Counter.name)
        #expect(error?.seq == 7)
        #expect(error?.file == journal.location)
        #expect(error?.description.contains("store counter, seq 7") == true)
        #expect(
            journalError { _ = try journal.events(store: Counter.name, from: 5, to: 10, limit: 10) }?.code
                == .checksumMismatch
        )
        try journal.close()

        let output = try await runProduct("lockstep", ["journal", "verify"] + location(fixture))
        #expect(output.status == 5, "\(output.standardOutput) \(output.standardError)")
        #expect(output.standardOutput.contains("store counter, seq 7"), "\(output.standardOutput)")
        #expect(output.standardOutput.contains("checksum_mismatch"), "\(output.standardOutput)")

        let json = try await runProduct("lockstep", ["journal", "verify"] + location(fixture) + ["--json"])
        #expect(json.status == 5)
        let reply = try JSONSerialization.jsonObject(with: Data(json.standardOutput.utf8)) as? [String: Any]
        #expect(reply?["intact"] as? Bool == false)
        let problem = (reply?["problems"] as? [[String: Any]])?.first
        #expect(problem?["store"] as? String == "counter")
        #expect(problem?["seq"] as? Int == 7)
        #expect(problem?["code"] as? String == "checksum_mismatch")
    }

    @Test(arguments: kinds)
    func aMissingEventIsASequenceGap(kind: JournalKind) async throws {
        let fixture = try await journal(kind, withIncrements: 10)
        try fixture.tamper("DELETE FROM events WHERE seq = 4")
        let journal = try fixture.open()
        #expect(
            try journal.verify() == [
                JournalProblem(
                    code: .sequenceGap,
                    store: Counter.name,
                    seq: 4,
                    message: "seq 4 is missing: the next event kept is seq 5"
                )
            ]
        )
        let error = journalError { _ = try journal.recover(Counter.self) }
        #expect(error?.code == .sequenceGap)
        #expect(error?.store == Counter.name)
        #expect(error?.seq == 4)
        try journal.close()
    }

    @Test(arguments: kinds)
    func aDamagedSnapshotIsCaughtByItsDigest(kind: JournalKind) async throws {
        let fixture = try await JournalFixture(kind, policy: JournalPolicy(snapshotEveryEvents: 5))
        let journal = try fixture.open()
        _ = try journal.recover(Counter.self)
        let batch = events(Counter.name, from: 1, count: 5) { _ in Counter.Action.increment }
        try journal.commit(
            JournalBatch(
                events: batch,
                snapshots: [try JournalSnapshot(store: Counter.name, seq: 5, encoding: Counter.State(count: 5))]
            )
        )
        try journal.close()
        try fixture.tamper(
            "UPDATE snapshots SET state = \(literal(encoded(Counter.State(count: 6)), kind)) WHERE seq = 5"
        )
        let reopened = try fixture.open()
        #expect(try reopened.verify().map(\.code) == [.digestMismatch])
        let error = journalError { _ = try reopened.recover(Counter.self) }
        #expect(error?.code == .digestMismatch)
        #expect(error?.seq == 5)
        try reopened.close()
    }

    /// `lockstep journal dump` and `stats` read either journal.
    @Test(arguments: kinds)
    func dumpAndStatsReadEitherJournal(kind: JournalKind) async throws {
        let fixture = try await journal(kind, withIncrements: 3)
        let dump = try await runProduct("lockstep", ["journal", "dump"] + location(fixture) + ["--from", "2"])
        #expect(dump.status == 0, "\(dump.standardError)")
        #expect(
            dump.standardOutput == """
                {"store":"counter","seq":2,"action":{"increment":{}}}
                {"store":"counter","seq":3,"action":{"increment":{}}}

                """
        )
        let stats = try await runProduct("lockstep", ["journal", "stats"] + location(fixture) + ["--json"])
        #expect(stats.status == 0, "\(stats.standardError)")
        #expect(stats.standardOutput.contains("\"lastSeq\":3"), "\(stats.standardOutput)")
        let none = try await runProduct("lockstep", ["journal", "stats"])
        #expect(none.status != 0)
        #expect(none.standardError.contains("--postgres"), "\(none.standardError)")
    }
}

/// Lowercase hex of `bytes`.
func hex(_ bytes: [UInt8]) -> String {
    bytes.map { String(format: "%02x", $0) }.joined()
}
