import Foundation
import Lockstep
import LockstepExamples
import LockstepJournal
import LockstepTesting
import TestSupport
import Testing

/// The PostgreSQL journal's lease: one row with a term and an expiry by the database's clock, taken only once
/// expired, extended by every commit's first statement, which refuses the commit of a daemon whose term is past.
@Suite struct PostgresLeaseTests {
    /// A journal on `fixture`'s database that does not take the lease at open: as a daemon opens it.
    func daemonJournal(_ fixture: JournalFixture, _ holder: String, lease: Duration) throws -> PostgresJournal {
        try PostgresJournal(
            connection: fixture.connection!,
            lease: PostgresLease(holder: holder, duration: lease),
            takeLease: false
        )
    }

    /// The statement that expires the lease where it stands, by the database's clock, keeping its term and holder:
    /// what waiting out its duration would do, without a test that waits for the clock or depends on how fast the
    /// machine is.
    static let expiry = "UPDATE leadership SET expires_at = clock_timestamp() - interval '1 millisecond'"

    /// Expires the lease of `fixture`'s journal (``expiry``), on a session of its own.
    func expireLease(_ fixture: JournalFixture) throws {
        try fixture.tamper(Self.expiry)
    }

    func increments(from seq: UInt64, count: Int, client: [UInt8] = clientA) -> JournalBatch {
        let batch = events(Counter.name, from: seq, count: count, client: client) { _ in Counter.Action.increment }
        return JournalBatch(events: batch, idempotency: idempotency(for: batch))
    }

    @Test func theLeaseIsTakenOnlyOnceExpiredWithTheNextTermAndAFencedCommitKeepsNothing() async throws {
        let fixture = try await JournalFixture(.postgres)
        // Leases far longer than the test: each expires only when the test expires it.
        let a = try daemonJournal(fixture, "a", lease: .seconds(30))
        let b = try daemonJournal(fixture, "b", lease: .seconds(30))
        defer {
            try? a.close()
            try? b.close()
        }
        // Nothing is written before the lease is held: not even a store's registration.
        #expect(journalError { _ = try a.recover(Counter.self) }?.code == .fenced)
        #expect(try a.acquireLease() == .leading(term: 1, previousHolder: ""))
        #expect(a.leaseTerm == 1)
        _ = try a.recover(Counter.self)
        try a.commit(increments(from: 1, count: 2))

        guard case let .standingBy(leader) = try b.acquireLease() else {
            Issue.record("b took a lease a holds")
            return
        }
        #expect(leader.holder == "a" && leader.term == 1)
        #expect(leader.expiresIn > .zero && leader.expiresIn <= .seconds(30))
        #expect(leader.expiresAt.hasSuffix("Z"), "\(leader.expiresAt)")
        #expect(b.leaseTerm == nil)
        let tool = journalError { _ = try PostgresJournal(connection: fixture.connection!) }
        #expect(tool?.code == .inUse)
        #expect(tool?.message.contains("(a, term 1,") == true, "\(tool?.message ?? "")")

        // Expired, then renewed before anyone took it: the renewal runs for the lease's duration from now, so the
        // lease is a's again.
        try expireLease(fixture)
        try a.renewLease()
        guard case let .standingBy(still) = try b.acquireLease() else {
            Issue.record("b took a lease a had just renewed for 30 s")
            return
        }
        #expect(still.expiresIn > .zero)
        #expect(still.holder == "a" && still.term == 1)
        #expect(b.leaseTerm == nil)
        // Past the lease: b takes it with the next term.
        try expireLease(fixture)
        #expect(try b.acquireLease() == .leading(term: 2, previousHolder: "a"))
        #expect(try b.recover(Counter.self).lastSeq == 2)
        try b.commit(increments(from: 3, count: 1, client: clientB))

        // a still thinks it is at seq 2; its commit of seq 3 is refused, naming term 2, and keeps nothing.
        let fenced = journalError { try a.commit(increments(from: 3, count: 2)) }
        #expect(fenced?.code == .fenced)
        #expect(fenced?.term == 2)
        #expect(fenced?.message.contains("by b with term 2") == true, "\(fenced?.message ?? "")")
        #expect(a.leaseTerm == nil)
        #expect(a.lastSeq(store: Counter.name) == 2)
        #expect(journalError { try a.renewLease() }?.code == .fenced)
        let kept = increments(from: 1, count: 2).events + increments(from: 3, count: 1, client: clientB).events
        #expect(try b.events(store: Counter.name, from: 1, to: 10, limit: 10) == .events(kept))
        #expect(try b.idempotencyRecordCount() == 3)
        #expect(try b.leader().holder == "b")
    }

    /// A commit the lease row refuses keeps nothing even where its writes conflict with nothing: events of a store
    /// only the old leader wrote, their snapshot and their idempotency entries. The fence fails inside the pipeline
    /// that carries the writes, so the server runs none of them nor the COMMIT (a fence that only returned no row
    /// would let them commit). The fenced session is rolled back, not replaced: it commits again once its journal
    /// leads again. A renewal the row refuses names the new term as well.
    @Test func aCommitTheLeaseRowRefusesKeepsNothingAndItsSessionCommitsOnceItLeadsAgain() async throws {
        let fixture = try await JournalFixture(.postgres)
        // Leases far longer than the test: each expires only when the test expires it.
        let a = try daemonJournal(fixture, "a", lease: .seconds(30))
        let b = try daemonJournal(fixture, "b", lease: .seconds(30))
        let c = try daemonJournal(fixture, "c", lease: .seconds(30))
        defer {
            try? a.close()
            try? b.close()
            try? c.close()
        }
        func count(_ query: String) throws -> [String?] {
            try PostgresJournal.execute("SELECT count(*)::text FROM \(query)", connection: fixture.connection!)
        }
        #expect(try a.acquireLease() == .leading(term: 1, previousHolder: ""))
        _ = try a.recover(Counter.self)
        _ = try a.recover(Posts.self)
        try a.commit(increments(from: 1, count: 2))
        let session = a.writerBackendPID
        try expireLease(fixture)
        #expect(try b.acquireLease() == .leading(term: 2, previousHolder: "a"))
        try expireLease(fixture)
        #expect(try c.acquireLease() == .leading(term: 3, previousHolder: "b"))

        let posts = events(Posts.name, from: 1, count: 2, client: clientB) {
            Posts.Action.appendPosts(posts: ["post \($0)"])
        }
        let batch = JournalBatch(
            events: posts,
            idempotency: idempotency(for: posts, replySize: 8),
            snapshots: [try JournalSnapshot(store: Posts.name, seq: 2, encoding: Posts.initialState)]
        )
        let fenced = journalError { try a.commit(batch) }
        #expect(fenced?.code == .fenced)
        #expect(fenced?.term == 3)
        #expect(
            fenced?.message.contains("(term 1, as a) was taken over by c with term 3") == true,
            "\(fenced?.description ?? "")"
        )
        #expect(a.leaseTerm == nil)
        #expect(try count("events WHERE store = 'posts'") == ["0"])
        #expect(try count("snapshots") == ["0"])
        #expect(try count("idempotency") == ["2"])
        #expect(try c.leader().term == 3)

        let renewal = journalError { try b.renewLease() }
        #expect(renewal?.code == .fenced)
        #expect(renewal?.term == 3)
        #expect(
            renewal?.message.contains("(term 2, as b) was taken over by c") == true,
            "\(renewal?.description ?? "")"
        )
        #expect(b.leaseTerm == nil)

        try c.releaseLease()
        #expect(try a.acquireLease() == .leading(term: 4, previousHolder: "c"))
        #expect(try a.recover(Posts.self).lastSeq == 0)
        try a.commit(batch)
        #expect(a.writerBackendPID == session)
        #expect(try a.recover(Posts.self).lastSeq == 2)
        #expect(try count("snapshots") == ["1"])
        #expect(try a.idempotencyRecordCount() == 4)
    }

    /// The fence is the first statement of the transaction of every write: a trigger on every table a commit or a
    /// registration writes refuses a statement unless the lease row was updated earlier in the same transaction.
    /// A write without the fence, or with it after the writes or in a transaction of its own, fails here.
    @Test func theFenceRunsFirstInTheTransactionOfEveryWrite() async throws {
        let fixture = try await JournalFixture(
            .postgres,
            policy: JournalPolicy(snapshotEveryEvents: 2, snapshotsKept: 1)
        )
        let journal = try #require(try fixture.open() as? PostgresJournal)
        defer { try? journal.close() }
        try fixture.tamper(
            """
            CREATE FUNCTION fenced_first() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NOT EXISTS (SELECT FROM leadership WHERE xmin::text::bigint = txid_current() % 4294967296) THEN
                    RAISE EXCEPTION 'a write to % before the fence in its transaction', TG_TABLE_NAME;
                END IF;
                RETURN NULL;
            END $$
            """
        )
        for table in ["stores", "store_versions", "events", "snapshots", "idempotency"] {
            try fixture.tamper(
                """
                CREATE TRIGGER fenced_first BEFORE INSERT OR UPDATE OR DELETE ON \(table)
                FOR EACH STATEMENT EXECUTE PROCEDURE fenced_first()
                """
            )
        }
        let unfenced = journalError { try fixture.tamper("DELETE FROM idempotency") }
        #expect(unfenced?.postgresMessage == "a write to idempotency before the fence in its transaction")

        _ = try journal.recover(Counter.self)
        for first in stride(from: UInt64(1), through: 5, by: 2) {
            let batch = increments(from: first, count: 2)
            let snapshot = try JournalSnapshot(
                store: Counter.name,
                seq: first + 1,
                encoding: Counter.State(count: Int(first + 1))
            )
            // The third snapshot compacts: DELETEs of snapshots and events in the same transaction.
            try journal.commit(
                JournalBatch(events: batch.events, idempotency: batch.idempotency, snapshots: [snapshot])
            )
        }
        #expect(try journal.recover(Counter.self).state.count == 6)
        #expect(try journal.idempotencyRecordCount() == 6)
        #expect(
            try PostgresJournal.execute("SELECT min(seq)::text FROM snapshots", connection: fixture.connection!)
                == ["6"]
        )
    }

    /// An expired lease nobody took is still the holder's: its next commit extends it. A clean close lets it go,
    /// so the next daemon takes it at once instead of waiting for it to expire.
    @Test func anExpiredLeaseNobodyTookIsStillTheHoldersAndCloseLetsItGo() async throws {
        let fixture = try await JournalFixture(.postgres)
        // Leases far longer than the test: a's expires only when the test expires it.
        let a = try daemonJournal(fixture, "a", lease: .seconds(30))
        let b = try daemonJournal(fixture, "b", lease: .seconds(30))
        defer {
            try? a.close()
            try? b.close()
        }
        #expect(try a.acquireLease() == .leading(term: 1, previousHolder: ""))
        _ = try a.recover(Counter.self)
        try expireLease(fixture)
        #expect(try a.leader().expiresIn == .zero)
        try a.commit(increments(from: 1, count: 1))
        #expect(try a.leader().expiresIn > .zero)
        #expect(a.leaseTerm == 1)

        // The commit extended it by 30 s: still a's.
        guard case let .standingBy(leader) = try b.acquireLease() else {
            Issue.record("b took the lease a's commit had just extended")
            return
        }
        #expect(leader.holder == "a" && leader.term == 1)
        try a.close()
        #expect(try b.acquireLease() == .leading(term: 2, previousHolder: "a"))
    }

    /// A takeover waits for the commit in flight: the commit's fence holds the lease row's lock until it ends, so
    /// the acquire, issued once the lease expired by the clock, takes the row only once that commit is durable —
    /// and recovers it — and the old leader's next commit is fenced.
    ///
    /// The lease runs out without waiting for it: expired before the commit (so the acquire finds the row it can
    /// see expired, and waits for the lock instead of standing by), and again inside the commit's transaction after
    /// its fence extended it (so the row the commit leaves has expired, as it would have after a commit slower than
    /// the lease).
    @Test func aTakeoverWaitsForTheCommitInFlight() async throws {
        let fixture = try await JournalFixture(.postgres)
        let a = try daemonJournal(fixture, "a", lease: .seconds(30))
        let b = try daemonJournal(fixture, "b", lease: .seconds(30))
        defer {
            try? a.close()
            try? b.close()
        }
        _ = try a.acquireLease()
        _ = try a.recover(Counter.self)
        // Inserting events expires the lease the fence has just extended, then waits, inside a's transaction, until
        // the test lets it go on.
        try fixture.tamper("CREATE TABLE go (x int)")
        try fixture.tamper(
            """
            CREATE FUNCTION hold() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                \(Self.expiry);
                WHILE NOT EXISTS (SELECT 1 FROM go) LOOP PERFORM pg_sleep(0.01); END LOOP;
                RETURN NULL;
            END $$
            """
        )
        try expireLease(fixture)
        try fixture.tamper("CREATE TRIGGER hold BEFORE INSERT ON events FOR EACH STATEMENT EXECUTE PROCEDURE hold()")
        let results = LockedValue<(commit: Result<Void, JournalError>?, acquire: Result<LeaseOutcome, JournalError>?)>(
            (nil, nil)
        )
        Thread {
            let result = Result { () throws(JournalError) in try a.commit(increments(from: 1, count: 2)) }
            results.withLockedValue { $0.commit = result }
        }.start()
        func waiting(_ condition: String) async throws -> Bool {
            for _ in 0..<500 {
                let rows = try PostgresJournal.execute(
                    "SELECT count(*)::text FROM pg_stat_activity WHERE \(condition)",
                    connection: fixture.connection!
                )
                if rows == ["1"] { return true }
                try await Task.sleep(for: .milliseconds(10))
            }
            return false
        }
        #expect(try await waiting("query LIKE 'INSERT INTO events%' AND state = 'active'"), "a's commit never started")
        Thread {
            let result = Result { () throws(JournalError) in try b.acquireLease() }
            results.withLockedValue { $0.acquire = result }
        }.start()
        #expect(try await waiting("query LIKE '%SET term = term + 1%' AND wait_event_type = 'Lock'"), "b never waited")
        #expect(results.withLockedValue { $0.acquire == nil && $0.commit == nil })
        try fixture.tamper("INSERT INTO go VALUES (1)")
        var done = false
        for _ in 0..<500 where !done {
            try await Task.sleep(for: .milliseconds(10))
            done = results.withLockedValue { $0.acquire != nil && $0.commit != nil }
        }
        try #require(done, "the commit or the acquire never returned")
        let (commit, acquire) = results.withLockedValue { $0 }
        #expect(throws: Never.self) { try commit?.get() }
        #expect(try acquire?.get() == .leading(term: 2, previousHolder: "a"))
        try fixture.tamper("DROP TRIGGER hold ON events")
        #expect(try b.recover(Counter.self).lastSeq == 2)
        #expect(journalError { try a.commit(increments(from: 3, count: 1)) }?.code == .fenced)
        #expect(
            try b.events(store: Counter.name, from: 1, to: 10, limit: 10)
                == .events(increments(from: 1, count: 2).events)
        )
    }

    /// Two daemons opening an empty database at once: one creates the journal, the other waits for it and finds it
    /// (before, both ran CREATE TABLE and one failed). Repeated on fresh databases, since it is a race.
    @Test func twoDaemonsOpeningAnEmptyDatabaseAtOnceBothOpenIt() async throws {
        for _ in 0..<5 {
            let fixture = try await JournalFixture(.postgres)
            let connection = fixture.connection!
            let opened = LockedValue<[Result<PostgresJournal, JournalError>]>([])
            let start = DispatchSemaphore(value: 0)
            let done = DispatchGroup()
            for holder in ["a", "b"] {
                done.enter()
                Thread {
                    start.wait()
                    let result = Result { () throws(JournalError) in
                        try PostgresJournal(
                            connection: connection,
                            lease: PostgresLease(holder: holder),
                            takeLease: false
                        )
                    }
                    opened.withLockedValue { $0.append(result) }
                    done.leave()
                }.start()
            }
            start.signal()
            start.signal()
            #expect(await offPool("opening") { done.wait(timeout: .now() + 30) } == .success)
            let journals = opened.withLockedValue { $0 }.compactMap { result -> PostgresJournal? in
                switch result {
                case let .success(journal): return journal
                case let .failure(error):
                    Issue.record("an open failed: \(error)")
                    return nil
                }
            }
            #expect(journals.count == 2)
            let outcomes = try journals.map { try $0.acquireLease() }
            #expect(outcomes.filter { if case .leading = $0 { true } else { false } }.count == 1, "\(outcomes)")
            for journal in journals { try journal.close() }
        }
    }

    /// A journal of format 1 (step 1: no lease, an advisory lock per writer) is upgraded when opened for writing,
    /// but not while a daemon of that build holds its lock: it would write beside a leader unfenced.
    @Test func aJournalOfFormat1IsUpgradedOnceNoEarlierDaemonWritesToIt() async throws {
        let fixture = try await JournalFixture(.postgres)
        let first = try fixture.open()
        _ = try first.recover(Counter.self)
        try first.commit(increments(from: 1, count: 3))
        try first.close()
        try fixture.tamper("DROP TABLE leadership")
        try fixture.tamper("UPDATE journal_format SET version = 1")
        let reader = try PostgresJournal(connection: fixture.connection!, readOnly: true)
        #expect(try reader.stats().stores.first?.lastSeq == 3)
        try reader.close()

        let earlier = try PostgresJournal.Session(connection: fixture.connection!)
        try earlier.execute("SELECT pg_advisory_lock(1280004944, hashtext(current_schema()))")
        let refused = journalError { _ = try fixture.open() }
        #expect(refused?.code == .inUse)
        #expect(refused?.message.contains("earlier build") == true, "\(refused?.message ?? "")")
        earlier.close()

        let upgraded = try fixture.open()
        #expect(try upgraded.recover(Counter.self).lastSeq == 3)
        #expect(
            try PostgresJournal.execute("SELECT version::text FROM journal_format", connection: fixture.connection!)
                == ["\(PostgresJournal.formatVersion)"]
        )
        #expect((upgraded as? PostgresJournal)?.leaseTerm == 1)
        try upgraded.close()
    }
}
