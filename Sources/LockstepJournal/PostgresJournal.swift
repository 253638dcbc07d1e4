import Lockstep

/// The journal in a PostgreSQL database, through libpq: the same records, rules and answers as ``SQLiteJournal``,
/// kept by a server. A commit is one transaction with `synchronous_commit = on`, so it returns only once PostgreSQL
/// has made it durable; its statements, the fence first, go to the server in one round trip (libpq's pipeline mode,
/// libpq 14 or newer). Its schema and durability are described in docs/operations.md, "PostgreSQL journal".
///
/// One connection writes (commits are serialized by the journal). Several daemons may open one journal: the one that
/// holds its lease (a row with a term and an expiry by the database's clock) leads, and every commit's first
/// statement checks and extends that lease in the same transaction, so a commit of a daemon whose lease another
/// took is refused with ``JournalError/Code/fenced`` and keeps nothing. Reads go through a small pool of read-only
/// connections of their own, so range reads from other threads never wait for a commit.
public final class PostgresJournal: EngineJournal {
    /// The format this build writes and reads: 2 added the lease. A database of format 1 is upgraded when opened
    /// for writing (once no daemon of an earlier build holds it); one of another format is refused.
    public static let formatVersion = 4

    let engine: JournalEngine<PostgresStorage>
    private var storage: PostgresStorage { engine.storage }

    /// Connects to the database at `connection` and opens the journal in it, creating its tables in the first
    /// schema of the session's `search_path` (normally `public`) when the database has none of them.
    ///
    /// - Parameters:
    ///   - connection: A libpq connection string: `host=/run/postgresql dbname=lockstep` or
    ///     `postgresql://lockstep@db.example/lockstep`. A password is better kept in `~/.pgpass` or `PGPASSFILE`
    ///     than here; it is never shown in errors or ``Journal/location``.
    ///   - policy: When snapshots are due and how much history is kept.
    ///   - readOnly: Open for reading only (the CLI's `verify`, `dump`, `stats` and `state`): nothing is created,
    ///     commits are refused, and a store not yet in the journal cannot be recovered.
    ///   - lease: This journal's name in the lease row and how long its lease lasts.
    ///   - takeLease: Take the lease while opening (a tool, a test), failing with ``JournalError/Code/inUse`` when
    ///     another daemon holds it; `false` opens without it (a daemon that may stand by), and nothing can be
    ///     written until ``acquireLease()`` returns ``LeaseOutcome/leading(term:previousHolder:)``.
    /// - Throws: ``JournalError`` with ``JournalError/Code/unreachable`` when the server cannot be reached,
    ///   ``JournalError/Code/inUse`` when another daemon holds the lease (`takeLease`) or a daemon of an earlier
    ///   build writes to a journal of format 1,
    ///   ``JournalError/Code/formatVersionMismatch`` when the database holds a journal of another format,
    ///   ``JournalError/Code/notAJournal`` when it holds tables of the same names that are no journal, and
    ///   ``JournalError/Code/notFound`` when a read-only open finds no journal.
    public init(
        connection: String,
        policy: JournalPolicy = JournalPolicy(),
        readOnly: Bool = false,
        lease: PostgresLease = PostgresLease(),
        takeLease: Bool = true
    ) throws(JournalError) {
        let storage = try PostgresStorage(conninfo: connection, readOnly: readOnly, lease: lease)
        engine = JournalEngine(storage: storage, policy: policy)
        guard takeLease, !readOnly else { return }
        do {
            if case let .standingBy(leader) = try storage.acquireLease() {
                throw JournalError(
                    code: .inUse,
                    file: storage.location,
                    operation: "open",
                    term: leader.term,
                    message: "another daemon leads this journal (\(leader.holder), term \(leader.term), its lease "
                        + "expires at \(leader.expiresAt) unless renewed): stop it, or open the journal read-only "
                        + "(journal verify, dump, stats and state do)"
                )
            }
        } catch let error as JournalError {
            try? storage.close()
            throw error
        } catch {
            try? storage.close()
            throw PostgresStorage.map(error, location: storage.location, operation: "open")
        }
    }

    /// Takes the lease when it is free or has expired, in one statement that increments its term; otherwise says
    /// who holds it. The statement waits for a commit of the current holder in flight (its fence holds the row's
    /// lock) and then judges the row as that commit left it. Recover the stores after taking it: the previous
    /// leader may have committed more than this process knows.
    public func acquireLease() throws(JournalError) -> LeaseOutcome {
        try storage.acquireLease()
    }

    /// Extends the lease alone, as every commit does first: what a leader does when it has committed nothing for a
    /// while. Throws ``JournalError/Code/fenced`` when another daemon took the lease; the journal leads no more.
    public func renewLease() throws(JournalError) {
        try storage.renewLease()
    }

    /// Lets the lease go, if this journal holds it, so that another daemon takes it at once: what a daemon that cannot
    /// recover after taking it does. The journal leads no more.
    public func releaseLease() throws(JournalError) {
        try storage.releaseLease()
    }

    /// The term of the lease this journal holds, or `nil` when it does not lead.
    public var leaseTerm: UInt64? { storage.leaseTerm.withLockedValue { $0.map(UInt64.init) } }

    /// This journal's name in the lease row and its lease's duration.
    public var lease: PostgresLease { storage.lease }

    /// The lease row as it stands now (read on a connection of its own): who leads, with which term, until when.
    public func leader() throws(JournalError) -> JournalLeader {
        try storage.leader()
    }

    /// Lets the lease go if this journal holds it (so a standby takes over at once), then closes every connection.
    /// Later calls fail; closing twice is harmless.
    public func close() throws(JournalError) {
        try storage.close()
    }

    /// A commit is durable when it returns (`synchronous_commit = on`): nothing to do.
    public func sync() throws(JournalError) {}

    /// The server process of the writer's session, for tests that end it with `pg_terminate_backend`.
    package var writerBackendPID: Int32 { storage.writerBackendPID }

    /// How long a session may sit idle before its next use first asks the server whether it still answers
    /// (`SELECT 1`): one second, so that a busy journal pays no round trip for it. A test sets it to `.zero` to ask
    /// before every use, or far past its own length never to ask, rather than wait past a second or race it.
    package var idleBeforeCheck: Duration {
        get { storage.idleBeforeCheck.withLockedValue { $0 } }
        set { storage.idleBeforeCheck.withLockedValue { $0 = newValue } }
    }

    /// Runs `sql` on a connection of its own to `connection` and returns the first column of its rows as text:
    /// for tests and `PostgresServer`, which must reach under the journal (create a database, damage a row).
    @discardableResult
    package static func execute(_ sql: String, connection: String) throws(JournalError) -> [String?] {
        let location = PostgresStorage.location(of: connection)
        do {
            let session = try PostgresConnection(conninfo: connection)
            defer { session.close() }
            let rows = try session.execute(sql)
            return (0..<rows.count).map { rows.text($0, 0) }
        } catch {
            throw PostgresStorage.map(error, location: location, operation: "execute")
        }
    }

    /// A session of its own on `connection` that stays open between statements: for tests that hold a lock or a
    /// transaction open while the journal works.
    package final class Session {
        private let session: PostgresConnection
        private let location: String

        package init(connection: String) throws(JournalError) {
            location = PostgresStorage.location(of: connection)
            do {
                session = try PostgresConnection(conninfo: connection)
            } catch {
                throw PostgresStorage.map(error, location: location, operation: "connect")
            }
        }

        /// Runs `sql`; the first column of its rows as text.
        @discardableResult
        package func execute(_ sql: String) throws(JournalError) -> [String?] {
            do {
                let rows = try session.execute(sql)
                return (0..<rows.count).map { rows.text($0, 0) }
            } catch {
                throw PostgresStorage.map(error, location: location, operation: "execute")
            }
        }

        package func close() { session.close() }
    }

    /// Whether a PostgreSQL server accepts connections at `connection` (libpq's `PQping`).
    package static func serverAnswers(_ connection: String) -> Bool {
        postgresAnswers(connection)
    }
}

/// The PostgreSQL tables behind ``PostgresJournal``. Integers are `bigint`: a `UInt64` (epoch, request number) is
/// kept as its `Int64` bit pattern, as ``SQLiteStorage`` does; binary values are `bytea`. Every statement sends
/// and receives binary values.
final class PostgresStorage: JournalStorage {
    let location: String
    let isReadOnly: Bool
    let formatVersion: Int
    private let conninfo: String
    /// `nil` when read-only. Held for the whole of a write, so statements of two commits never interleave.
    private let writer: LockedValue<PostgresConnection>?
    /// This journal's name and duration in the lease row.
    let lease: PostgresLease
    /// The term of the lease this journal holds; `nil` when it does not lead.
    let leaseTerm = LockedValue<Int64?>(nil)
    /// Idle read-only connections; a read takes one (or opens one) and gives it back.
    private let readers = LockedValue<[PostgresConnection]>([])
    /// How long a session may sit idle before its next use asks whether it still answers
    /// (``PostgresJournal/idleBeforeCheck``).
    let idleBeforeCheck = LockedValue(Duration.seconds(1))
    private let closed = LockedValue(false)
    /// More idle readers than this are closed when given back: the daemon reads from a few threads at most.
    private static let idleReadersKept = 4

    /// The session advisory lock the writer of format 1 held ("LKSP", with the hash of the journal's schema as the
    /// second key): taken now only to upgrade such a journal, so that no daemon of that build writes to it then.
    static let writerLockKey: Int64 = 0x4C4B_5350

    /// The transaction advisory lock a writer's open holds while it looks for the journal and creates it: "LKSO",
    /// with the hash of the journal's schema as the second key.
    static let openLockKey: Int64 = 0x4C4B_534F

    static let tableNames = [
        "journal_format", "stores", "events", "snapshots", "idempotency", "store_versions", "leadership", "effects",
        "timers",
    ]

    static let schema = """
        CREATE TABLE journal_format (
            version bigint NOT NULL
        );
        CREATE TABLE stores (
            name text PRIMARY KEY,
            domain_version bigint NOT NULL,
            epoch bigint NOT NULL
        );
        CREATE TABLE events (
            store text NOT NULL REFERENCES stores (name),
            seq bigint NOT NULL,
            action bytea NOT NULL,
            client_id bytea NOT NULL,
            request_number bigint NOT NULL,
            checksum bigint NOT NULL,
            author text NOT NULL DEFAULT '',
            PRIMARY KEY (store, seq)
        );
        CREATE TABLE snapshots (
            store text NOT NULL REFERENCES stores (name),
            seq bigint NOT NULL,
            state bytea NOT NULL,
            digest bytea NOT NULL,
            PRIMARY KEY (store, seq)
        );
        CREATE TABLE idempotency (
            position bigint PRIMARY KEY,
            client_id bytea NOT NULL,
            request_number bigint NOT NULL,
            fingerprint bytea NOT NULL,
            reply bytea NOT NULL,
            UNIQUE (request_number, client_id)
        );
        CREATE TABLE store_versions (
            store text NOT NULL REFERENCES stores (name),
            version bigint NOT NULL,
            since_seq bigint NOT NULL,
            PRIMARY KEY (store, version)
        );
        """ + LeaseStatement.table + outboxTables

    /// The outbox (format 3, docs/effects.md): effects to run, journaled with their action, and the timers not
    /// fired, each with a CRC-32C checked when it is read back.
    static let outboxTables = """
        CREATE TABLE IF NOT EXISTS effects (
            store text NOT NULL REFERENCES stores (name),
            seq bigint NOT NULL,
            idx bigint NOT NULL,
            body bytea NOT NULL,
            attempts bigint NOT NULL,
            last_error text NOT NULL,
            dead bigint NOT NULL,
            checksum bigint NOT NULL,
            PRIMARY KEY (store, seq, idx)
        );
        CREATE TABLE IF NOT EXISTS timers (
            store text NOT NULL REFERENCES stores (name),
            key text NOT NULL,
            due_ms bigint NOT NULL,
            action bytea NOT NULL,
            seq bigint NOT NULL,
            idx bigint NOT NULL,
            checksum bigint NOT NULL,
            PRIMARY KEY (store, key)
        );
        """

    /// The statements of the commit path, prepared once per writer session.
    enum Statement {
        /// Rows one multi-row statement writes at most: a commit is one round trip per table per 1,000 rows, not
        /// one per row, and 6 parameters a row stay far below PostgreSQL's 65,535.
        static let rowsPerStatement = 1_000

        /// `rows` events in one INSERT: parameters store, seq, action, client id, request number, checksum, author
        /// each.
        static func insertEvents(rows: Int) -> String {
            "INSERT INTO events (store, seq, action, client_id, request_number, checksum, author) VALUES "
                + placeholders(rows: rows, columns: 7)
        }

        /// `rows` idempotency entries (keys distinct) in one statement: parameters client id, request number,
        /// fingerprint, reply each. An entry whose key is kept replaces it in place; the others get positions
        /// max + 1, max + 2, … in batch order. Positions are never a sequence: a sequence skips the numbers of
        /// rolled-back transactions, and the trim below keeps exactly the newest N only while positions are
        /// contiguous. One writer, so no race.
        static func upsertIdempotency(rows: Int) -> String {
            let values = (0..<rows).map { row in
                "(\(row), $\(4 * row + 1), $\(4 * row + 2), $\(4 * row + 3), $\(4 * row + 4))"
            }
            return """
                WITH entries (k, client_id, request_number, fingerprint, reply) AS (
                    VALUES \(values.joined(separator: ", "))
                ),
                replaced AS (
                    UPDATE idempotency AS kept SET fingerprint = entries.fingerprint, reply = entries.reply
                    FROM entries
                    WHERE kept.client_id = entries.client_id AND kept.request_number = entries.request_number
                    RETURNING entries.k
                )
                INSERT INTO idempotency (position, client_id, request_number, fingerprint, reply)
                SELECT (SELECT coalesce(max(position), 0) FROM idempotency) + row_number() OVER (ORDER BY k),
                    client_id, request_number, fingerprint, reply
                FROM entries WHERE k NOT IN (SELECT k FROM replaced)
                """
        }

        /// `($1, $2, …), ($n+1, …)`: `rows` rows of `columns` parameters.
        private static func placeholders(rows: Int, columns: Int) -> String {
            (0..<rows).map { row in
                "(" + (1...columns).map { "$\(row * columns + $0)" }.joined(separator: ", ") + ")"
            }.joined(separator: ", ")
        }

        static let trimIdempotency = (
            "trim_idempotency",
            "DELETE FROM idempotency WHERE position <= (SELECT max(position) FROM idempotency) - $1"
        )
        static let insertSnapshot = (
            "insert_snapshot", "INSERT INTO snapshots (store, seq, state, digest) VALUES ($1, $2, $3, $4)"
        )
        static let compactSnapshots = ("compact_snapshots", "DELETE FROM snapshots WHERE store = $1 AND seq < $2")
        static let compactEvents = ("compact_events", "DELETE FROM events WHERE store = $1 AND seq <= $2")
    }

    /// `postgres host=… port=… dbname=… user=…`: where the journal is, without the password.
    static func location(of conninfo: String) -> String {
        "postgres " + (redactedConnectionString(conninfo) ?? "(a connection string libpq cannot parse)")
    }

    init(conninfo: String, readOnly: Bool, lease: PostgresLease) throws(JournalError) {
        let location = Self.location(of: conninfo)
        self.location = location
        self.conninfo = conninfo
        self.lease = lease
        isReadOnly = readOnly
        let fail = { (code: JournalError.Code, message: String) in
            JournalError(code: code, file: location, operation: "open", message: message)
        }
        guard redactedConnectionString(conninfo) != nil else {
            throw fail(
                .invalidArgument,
                "the PostgreSQL connection string cannot be parsed; give key=value pairs "
                    + "('host=/run/postgresql dbname=lockstep') or a postgresql:// URI"
            )
        }
        let session: PostgresConnection
        do {
            session = try Self.connect(conninfo, writer: readOnly ? nil : lease, location: location)
        } catch {
            throw Self.map(error, location: location, operation: "open")
        }
        var found: Int?
        do {
            try session.execute("BEGIN")
            if !readOnly {
                // Two daemons started at once on an empty database would both create the schema, and one would fail:
                // the second waits here until the first has committed it, then finds the journal.
                try session.execute(
                    "SELECT pg_advisory_xact_lock($1::integer, hashtext(current_schema()))",
                    [.int64(Self.openLockKey)]
                )
            }
            let names = try session.execute(
                """
                SELECT table_name::text FROM information_schema.tables
                WHERE table_schema = current_schema() AND table_name::text = ANY (string_to_array($1, ','))
                """,
                [.text(Self.tableNames.joined(separator: ","))]
            )
            let tables = Set((0..<names.count).compactMap { names.text($0, 0) })
            if tables.contains("journal_format") {
                let rows = try session.execute("SELECT version FROM journal_format")
                found = rows.count == 1 ? rows.int64(0, 0).map(Int.init) : -1
            } else if tables.isEmpty, !readOnly {
                try session.executeScript(Self.schema)
                try session.execute(
                    "INSERT INTO journal_format (version) VALUES ($1)",
                    [.int64(Int64(PostgresJournal.formatVersion))]
                )
                found = PostgresJournal.formatVersion
            } else if tables.isEmpty {
                let schema = try session.execute("SELECT coalesce(current_schema(), '(none)')").text(0, 0) ?? "?"
                throw fail(
                    .notFound,
                    "the database has no Lockstep journal (no journal_format table in schema \(schema)); check the "
                        + "connection string, or start the daemon on it once to create the journal"
                )
            } else {
                throw fail(
                    .notAJournal,
                    "the database has tables named like the journal's (\(tables.sorted().joined(separator: ", "))) "
                        + "but no journal_format table: it is not a Lockstep journal; give the journal a database "
                        + "(or a schema, by search_path) of its own"
                )
            }
            try session.execute("COMMIT")
            if let old = found, (1..<PostgresJournal.formatVersion).contains(old), !readOnly {
                try Self.upgrade(session, location: location)
                found = PostgresJournal.formatVersion
            }
        } catch let error as JournalError {
            session.close()
            throw error
        } catch {
            session.close()
            throw Self.map(error, location: location, operation: "open")
        }
        // Format 1 is format 2 without the lease, format 2 format 3 without the outbox, format 3 format 4 without
        // authors: a read-only open reads them as they are.
        guard found == PostgresJournal.formatVersion || (readOnly && (1...3).contains(found ?? 0)) else {
            session.close()
            throw fail(
                .formatVersionMismatch,
                "the journal has format version \(found.map(String.init) ?? "?"), but this build reads format "
                    + "version \(PostgresJournal.formatVersion); run the Lockstep release that wrote it, or give the "
                    + "daemon another database to start afresh"
            )
        }
        formatVersion = found ?? PostgresJournal.formatVersion
        if readOnly {
            writer = nil
            readers.withLockedValue { $0.append(session) }
        } else {
            do {
                try Self.prepareCommitStatements(session)
            } catch {
                session.close()
                throw Self.map(error, location: location, operation: "open")
            }
            writer = LockedValue(session)
        }
    }

    /// A session set up for its role: the writer (given its lease) commits synchronously (checked, not assumed);
    /// readers are read-only, so a mistake in a read can never write.
    private static func connect(
        _ conninfo: String,
        writer lease: PostgresLease?,
        location: String
    ) throws(PostgresFailure) -> PostgresConnection {
        let session = try PostgresConnection(conninfo: conninfo)
        if let lease {
            try setUpWriter(session, lease: lease)
        } else {
            try session.execute("SET default_transaction_read_only = on")
        }
        return session
    }

    /// Synchronous commits, and a transaction left idle for longer than a lease ended by the server: the writer of
    /// a paused or stranded daemon, stopped in the middle of a commit, holds the lease row's lock, and a standby's
    /// takeover would otherwise wait on it for as long as the pause lasts.
    private static func setUpWriter(_ session: PostgresConnection, lease: PostgresLease) throws(PostgresFailure) {
        try requireSynchronousCommit(session)
        try session.execute("SET idle_in_transaction_session_timeout = \(lease.milliseconds)")
    }

    /// Adds the lease to a journal of format 1 and makes it format 2, in one transaction, holding the advisory lock
    /// a daemon of that build holds while it writes: with one running, the upgrade is refused with
    /// ``JournalError/Code/inUse``, since that daemon would write unfenced beside a leader. A daemon of that build
    /// started later refuses the journal (format 2).
    private static func upgrade(_ session: PostgresConnection, location: String) throws {
        try takeWriterLock(session, location: location)
        defer {
            _ = try? session.execute(
                "SELECT pg_advisory_unlock($1::integer, hashtext(current_schema()))",
                [.int64(writerLockKey)]
            )
        }
        try session.execute("BEGIN")
        do {
            let version = try session.execute("SELECT version FROM journal_format FOR UPDATE").int64(0, 0)
            if version == 1 {
                try session.executeScript(LeaseStatement.table)
                try session.execute("UPDATE journal_format SET version = $1", [.int64(2)])
            }
            if version == 1 || version == 2 {
                try session.executeScript(outboxTables)
                try session.execute("UPDATE journal_format SET version = $1", [.int64(3)])
            }
            if (1...3).contains(version ?? 0) {
                // Format 4: each event's author (docs/security.md); the events before it have none.
                try session.execute("ALTER TABLE events ADD COLUMN IF NOT EXISTS author text NOT NULL DEFAULT ''")
                try session.execute("UPDATE journal_format SET version = $1", [.int64(4)])
            }
            try session.execute("COMMIT")
        } catch {
            if session.inTransaction { _ = try? session.execute("ROLLBACK") }
            throw error
        }
    }

    /// Sets `synchronous_commit = on` and checks that it took: a commit returns once PostgreSQL made it durable.
    private static func requireSynchronousCommit(_ session: PostgresConnection) throws(PostgresFailure) {
        try session.execute("SET synchronous_commit = on")
        let setting = try session.execute("SHOW synchronous_commit").text(0, 0)
        guard setting == "on" else {
            throw PostgresFailure(
                sqlState: nil,
                message: "synchronous_commit is '\(setting ?? "?")' after SET synchronous_commit = on",
                isConnectionLost: false
            )
        }
    }

    /// Takes the writer's session advisory lock, or throws ``JournalError/Code/inUse`` naming the holder.
    private static func takeWriterLock(_ session: PostgresConnection, location: String) throws(JournalError) {
        do {
            // Tried for up to a second: the session of a writer that just went away (closed without unlocking, or
            // killed) may still be ending on the server.
            let deadline = ContinuousClock.now + .seconds(1)
            while true {
                let taken = try session.execute(
                    "SELECT pg_try_advisory_lock($1::integer, hashtext(current_schema()))",
                    [.int64(writerLockKey)]
                ).bool(0, 0)
                if taken == true { return }
                guard ContinuousClock.now < deadline else { break }
                try session.execute("SELECT pg_sleep(0.01)")
            }
            let holder = try session.execute(
                """
                SELECT a.pid::text || coalesce(' (' || nullif(a.application_name, '') || ')', '')
                    || coalesce(' from ' || host(a.client_addr), '')
                FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                WHERE l.locktype = 'advisory' AND l.granted AND l.database = (
                    SELECT oid FROM pg_database WHERE datname = current_database()
                ) AND l.classid::bigint = $1 AND l.objid = hashtext(current_schema())::oid AND l.objsubid = 2
                """,
                [.int64(writerLockKey)]
            )
            let who = holder.count > 0 ? holder.text(0, 0).map { "server process \($0)" } : nil
            session.close()
            throw JournalError(
                code: .inUse,
                file: location,
                operation: "open",
                message:
                    "a daemon of an earlier build (journal format 1) writes to this journal (\(who ?? "a session") "
                    + "holds its advisory lock \(writerLockKey)), and it would write beside a leader without the "
                    + "lease: stop it, then start this build, which upgrades the journal to format 2 once"
            )
        } catch let error as JournalError {
            throw error
        } catch {
            throw map(error, location: location, operation: "open")
        }
    }

    private static func prepareCommitStatements(_ session: PostgresConnection) throws(PostgresFailure) {
        let store = PostgresValue.text("")
        let number = PostgresValue.int64(0)
        let bytes = PostgresValue.bytes([])
        try session.prepare(Statement.trimIdempotency.0, Statement.trimIdempotency.1, [number])
        try session.prepare(Statement.insertSnapshot.0, Statement.insertSnapshot.1, [store, number, bytes, bytes])
        try session.prepare(Statement.compactSnapshots.0, Statement.compactSnapshots.1, [store, number])
        try session.prepare(Statement.compactEvents.0, Statement.compactEvents.1, [store, number])
        try session.prepare(LeaseStatement.fence.0, LeaseStatement.fence.1, [number, store, number])
    }

    var writerBackendPID: Int32 { writer?.withLockedValue { $0.backendPID } ?? 0 }

    func close() throws(JournalError) {
        closed.withLockedValue { $0 = true }
        writer?.withLockedValue { session in
            if session.isUsable { releaseLease(session) }
            session.close()
        }
        let idle = readers.withLockedValue { readers in
            defer { readers = [] }
            return readers
        }
        for reader in idle { reader.close() }
    }

    // MARK: Errors

    static func map(_ error: any Error, location: String, operation: String, store: String? = nil) -> JournalError {
        if let error = error as? JournalError { return error }
        guard let failure = error as? PostgresFailure else {
            return JournalError(
                code: .postgres,
                file: location,
                operation: operation,
                store: store,
                message: "\(error)"
            )
        }
        let code: JournalError.Code
        let advice: String
        switch failure.sqlState {
        case _ where failure.isConnectionLost:
            code = .unreachable
            advice =
                operation == "open"
                ? "could not connect to PostgreSQL at '\(location.dropFirst("postgres ".count))'; is the server "
                    + "running, and does the connection string name it and a database this user may use?"
                : "the connection to PostgreSQL was lost; nothing of the operation was kept unless PostgreSQL had "
                    + "committed it — the journal reconnects at its next call; check the server"
        case "53100":
            code = .storageFull
            advice =
                "the PostgreSQL server's disk is full; free space on it, then retry — nothing of the failed "
                + "operation was kept"
        case "25006", "42501":
            code = .readOnly
            advice =
                "PostgreSQL refused the write (a read-only transaction or server, or a role without the "
                + "privilege); check the role's grants and that the server is a primary"
        case "XX001", "XX002":
            code = .corrupt
            advice = "PostgreSQL found its data damaged; restore the database from a backup"
        case let state? where state.hasPrefix("58"):
            code = .ioError
            advice = "the PostgreSQL server reported an I/O error; check its disk and its log"
        default:
            code = .postgres
            advice = "PostgreSQL refused the statement"
        }
        return JournalError(
            code: code,
            file: location,
            operation: operation,
            store: store,
            postgresState: failure.sqlState,
            postgresMessage: failure.message,
            message: advice
        )
    }

    private func corrupt(_ operation: String, store: String?, _ message: String) -> JournalError {
        JournalError(code: .corrupt, file: location, operation: operation, store: store, message: message)
    }

    // MARK: Connections

    /// Runs `body` on the writer's session, reconnecting first when the last call lost it.
    func withWriter(
        _ operation: String,
        store: String? = nil,
        _ body: (PostgresConnection) throws -> Void
    ) throws(JournalError) {
        guard let writer, !closed.withLockedValue({ $0 }) else {
            throw JournalError(
                code: closed.withLockedValue { $0 } ? .invalidArgument : .readOnly,
                file: location,
                operation: operation,
                message: writer == nil ? "the journal is open read-only" : "the journal is closed"
            )
        }
        let lease = lease
        let idle = idleBeforeCheck.withLockedValue { $0 }
        do {
            try writer.withLockedValue { (session: inout PostgresConnection) throws in
                if !session.answers(ifIdleFor: idle) {
                    do {
                        // The lease is in the row, not the session: the next fence says whether it is still ours.
                        try session.reset()
                        try Self.setUpWriter(session, lease: lease)
                    } catch {
                        // Half set up is not set up: the next call connects and sets up from scratch.
                        session.close()
                        throw error
                    }
                }
                try body(session)
            }
        } catch {
            throw Self.map(error, location: location, operation: operation, store: store)
        }
    }

    /// Runs `body` on a read-only connection taken from the pool (or a new one), and gives it back unless it broke.
    func withReader<T>(
        _ operation: String,
        store: String? = nil,
        _ body: (PostgresConnection) throws -> T
    ) throws(JournalError) -> T {
        guard !closed.withLockedValue({ $0 }) else {
            throw JournalError(
                code: .invalidArgument,
                file: location,
                operation: operation,
                message: "the journal is closed"
            )
        }
        var idle = readers.withLockedValue { $0.popLast() }
        if let stale = idle, !stale.answers(ifIdleFor: idleBeforeCheck.withLockedValue { $0 }) {
            // The server went away since (a restart, a failover): the other idle readers are as stale.
            stale.close()
            for reader in readers.withLockedValue({ readers in
                defer { readers = [] }
                return readers
            }) {
                reader.close()
            }
            idle = nil
        }
        let session: PostgresConnection
        do {
            session = try idle ?? Self.connect(conninfo, writer: nil, location: location)
        } catch {
            throw Self.map(error, location: location, operation: operation, store: store)
        }
        do {
            let result = try body(session)
            giveBack(session)
            return result
        } catch {
            if session.inTransaction { _ = try? session.execute("ROLLBACK") }
            giveBack(session)
            throw Self.map(error, location: location, operation: operation, store: store)
        }
    }

    private func giveBack(_ session: PostgresConnection) {
        guard session.isUsable, !session.inTransaction, !closed.withLockedValue({ $0 }) else { return session.close() }
        let kept = readers.withLockedValue { readers -> Bool in
            guard readers.count < Self.idleReadersKept else { return false }
            readers.append(session)
            return true
        }
        if !kept { session.close() }
    }

    /// `body` in one read-only transaction that sees one snapshot of the database throughout (REPEATABLE READ), so
    /// that a compaction committed meanwhile cannot slip between two of its statements.
    private func withSnapshot<T>(
        _ operation: String,
        store: String? = nil,
        _ body: (PostgresConnection) throws -> T
    ) throws(JournalError) -> T {
        try withReader(operation, store: store) { session in
            try session.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            let result = try body(session)
            try session.execute("COMMIT")
            return result
        }
    }

    // MARK: Values

    private func int64(
        _ rows: PostgresRows,
        _ row: Int,
        _ column: Int,
        _ operation: String,
        _ store: String?
    ) throws(JournalError) -> Int64 {
        guard let value = rows.int64(row, column) else {
            throw corrupt(operation, store: store, "column \(column) is NULL or not a bigint")
        }
        return value
    }

    private func bytes(
        _ rows: PostgresRows,
        _ row: Int,
        _ column: Int,
        _ operation: String,
        _ store: String?
    ) throws(JournalError) -> [UInt8] {
        guard let value = rows.bytes(row, column) else {
            throw corrupt(operation, store: store, "column \(column) is NULL where bytes belong")
        }
        return value
    }

    private func seq(_ number: Int64, _ operation: String, _ store: String?) throws(JournalError) -> UInt64 {
        guard number >= 0 else { throw corrupt(operation, store: store, "a seq is negative (\(number))") }
        return UInt64(number)
    }

    /// A seq bound for a query: seqs are below 2⁶³.
    private static func bound(_ seq: UInt64) -> PostgresValue { .int64(Int64(min(seq, UInt64(Int64.max)))) }

    // MARK: Stores

    private func records(_ rows: PostgresRows, _ operation: String) throws(JournalError) -> [StoreRecord] {
        var records: [StoreRecord] = []
        for row in 0..<rows.count {
            guard let name = rows.text(row, 0) else { throw corrupt(operation, store: nil, "a store name is NULL") }
            let version = try int64(rows, row, 1, operation, name)
            guard let domainVersion = UInt32(exactly: version) else {
                throw corrupt(operation, store: name, "the domain version \(version) is out of range")
            }
            let epoch = UInt64(bitPattern: try int64(rows, row, 2, operation, name))
            records.append(StoreRecord(name: name, domainVersion: domainVersion, epoch: epoch))
        }
        return records
    }

    func storeRecord(named name: String) throws(JournalError) -> StoreRecord? {
        let rows = try withReader("recover", store: name) {
            try $0.execute("SELECT name, domain_version, epoch FROM stores WHERE name = $1", [.text(name)])
        }
        return try records(rows, "recover").first
    }

    func storeRecords() throws(JournalError) -> [StoreRecord] {
        let rows = try withReader("read stores") {
            try $0.execute("SELECT name, domain_version, epoch FROM stores ORDER BY name")
        }
        return try records(rows, "read stores")
    }

    func register(_ record: StoreRecord) throws(JournalError) {
        try withWriter("register store", store: record.name) { session in
            try fencedTransaction(
                session,
                operation: "registration",
                [
                    .sql(
                        "INSERT INTO stores (name, domain_version, epoch) VALUES ($1, $2, $3)",
                        [
                            .text(record.name), .int64(Int64(record.domainVersion)),
                            .int64(Int64(bitPattern: record.epoch)),
                        ]
                    ),
                    .sql(
                        "INSERT INTO store_versions (store, version, since_seq) VALUES ($1, $2, 0)",
                        [.text(record.name), .int64(Int64(record.domainVersion))]
                    ),
                ]
            )
        }
    }

    func versionHistory(store: String) throws(JournalError) -> [JournalDomainVersion] {
        let operation = "read versions"
        let rows = try withReader(operation, store: store) {
            try $0.execute(
                "SELECT version, since_seq FROM store_versions WHERE store = $1 ORDER BY version",
                [.text(store)]
            )
        }
        var versions: [JournalDomainVersion] = []
        for row in 0..<rows.count {
            let version = try int64(rows, row, 0, operation, store)
            let since = try int64(rows, row, 1, operation, store)
            guard let version = UInt32(exactly: version), let since = UInt64(exactly: since) else {
                throw corrupt(operation, store: store, "a version row (\(version), \(since)) is out of range")
            }
            versions.append(JournalDomainVersion(store: store, version: version, sinceSeq: since))
        }
        return versions
    }

    // MARK: Snapshots and events

    func snapshotSeqs(store: String) throws(JournalError) -> [UInt64] {
        let operation = "read snapshots"
        let rows = try withReader(operation, store: store) {
            try $0.execute("SELECT seq FROM snapshots WHERE store = $1 ORDER BY seq", [.text(store)])
        }
        var seqs: [UInt64] = []
        for row in 0..<rows.count { seqs.append(try seq(try int64(rows, row, 0, operation, store), operation, store)) }
        return seqs
    }

    func snapshot(store: String, seq snapshotSeq: UInt64) throws(JournalError) -> JournalSnapshot? {
        let operation = "read snapshot"
        let rows = try withReader(operation, store: store) {
            try $0.execute(
                "SELECT state, digest FROM snapshots WHERE store = $1 AND seq = $2",
                [.text(store), Self.bound(snapshotSeq)]
            )
        }
        guard rows.count > 0 else { return nil }
        let digestBytes = try bytes(rows, 0, 1, operation, store)
        guard let digest = StateDigest(bytes: digestBytes) else {
            throw JournalError(
                code: .digestMismatch,
                file: location,
                operation: operation,
                store: store,
                seq: snapshotSeq,
                message: "the stored digest has \(digestBytes.count) bytes, not 32; the snapshot is damaged"
            )
        }
        let state = try bytes(rows, 0, 0, operation, store)
        return JournalSnapshot(store: store, seq: snapshotSeq, state: state, digest: digest)
    }

    /// The events' columns; a journal before format 4, opened read-only, has no author.
    private var eventColumns: String {
        "SELECT seq, action, client_id, request_number, checksum, \(formatVersion >= 4 ? "author" : "''") FROM events"
    }

    private func event(
        _ rows: PostgresRows,
        _ row: Int,
        store: String,
        _ operation: String
    ) throws(JournalError)
        -> StoredEvent
    {
        StoredEvent(
            event: JournalEvent(
                store: store,
                seq: try seq(try int64(rows, row, 0, operation, store), operation, store),
                action: try bytes(rows, row, 1, operation, store),
                clientID: try bytes(rows, row, 2, operation, store),
                requestNumber: UInt64(bitPattern: try int64(rows, row, 3, operation, store)),
                author: rows.text(row, 5) ?? ""
            ),
            storedChecksum: try int64(rows, row, 4, operation, store)
        )
    }

    /// Rows are fetched a page at a time by seq (keyset paging on the primary key) in one snapshot, so a long
    /// history is never held in memory at once.
    func forEachEvent(
        store: String,
        from: UInt64,
        through: UInt64,
        _ body: (StoredEvent) throws(JournalError) -> Void
    ) throws(JournalError) {
        let operation = "read events"
        let page = 1_000
        try withSnapshot(operation, store: store) { session in
            var next = from
            while next <= min(through, UInt64(Int64.max)) {
                let rows = try session.execute(
                    eventColumns + " WHERE store = $1 AND seq >= $2 AND seq <= $3 ORDER BY seq LIMIT $4",
                    [.text(store), Self.bound(next), Self.bound(through), .int64(Int64(page))]
                )
                for row in 0..<rows.count {
                    let stored = try event(rows, row, store: store, operation)
                    try body(stored)
                    next = stored.event.seq + 1
                }
                if rows.count < page { break }
            }
        }
    }

    func eventSummary(store: String) throws(JournalError) -> (first: UInt64, last: UInt64, count: Int)? {
        let operation = "read events"
        let rows = try withReader(operation, store: store) {
            try $0.execute("SELECT min(seq), max(seq), count(*) FROM events WHERE store = $1", [.text(store)])
        }
        guard let first = rows.int64(0, 0), let last = rows.int64(0, 1) else { return nil }
        return (
            try seq(first, operation, store), try seq(last, operation, store),
            Int(try int64(rows, 0, 2, operation, store))
        )
    }

    func readRange(
        store: String,
        from: UInt64,
        to: UInt64,
        limit: Int,
        maximumBytes: Int
    ) throws(JournalError) -> StoredRange {
        let operation = "range"
        // One snapshot, so a compaction cannot slip between the bounds and the events; pages of 64 rows, so a
        // reply of large actions stops at the byte budget instead of reading all of them.
        return try withSnapshot(operation, store: store) { session in
            let bounds = try session.execute(
                """
                SELECT (SELECT min(seq) FROM events WHERE store = $1), (SELECT max(seq) FROM events WHERE store = $1),
                       (SELECT max(seq) FROM snapshots WHERE store = $1)
                """,
                [.text(store)]
            )
            var events: [StoredEvent] = []
            var budget = ByteBudget(maximumBytes)
            var next = from
            reading: while events.count < limit, next <= to {
                let page = min(64, limit - events.count)
                let rows = try session.execute(
                    eventColumns + " WHERE store = $1 AND seq >= $2 AND seq <= $3 ORDER BY seq LIMIT $4",
                    [.text(store), Self.bound(next), Self.bound(to), .int64(Int64(page))]
                )
                for row in 0..<rows.count {
                    let stored = try event(rows, row, store: store, operation)
                    guard budget.admit(stored.event.action.count) else { break reading }
                    events.append(stored)
                    next = stored.event.seq + 1
                }
                if rows.count < page { break }
            }
            let snapshotSeq = UInt64(max(bounds.int64(0, 2) ?? 0, 0))
            let first = bounds.int64(0, 0).map { UInt64(max($0, 0)) } ?? snapshotSeq + 1
            let last = max(UInt64(max(bounds.int64(0, 1) ?? 0, 0)), snapshotSeq)
            return StoredRange(firstAvailable: first, lastSeq: last, events: events, stoppedAtBytes: budget.exhausted)
        }
    }

    // MARK: Commit

    /// BEGIN, the fence, `writes` and COMMIT, sent together in one pipeline: one round trip to the server, which
    /// runs them in order. The fence comes first in the transaction: it locks the lease row until the transaction
    /// ends, so a takeover waits for this commit, and it fails when a takeover came first — the server then runs
    /// none of the writes and not the COMMIT, and the transaction is rolled back. Returns once the COMMIT's answer
    /// is in: with `synchronous_commit = on`, PostgreSQL has made the transaction durable.
    private func fencedTransaction(
        _ session: PostgresConnection,
        operation: String,
        _ writes: [PostgresStatement]
    ) throws {
        let term = try heldTerm(operation)
        let statements = [.sql("BEGIN"), fenceStatement(term: term)] + writes + [.sql("COMMIT")]
        let commit = statements.count - 1
        let results: [PostgresRows]
        do {
            results = try session.execute(pipeline: statements)
        } catch {
            if error.statement == 1, Self.isFenceRefusal(error.failure) {
                throw fenced(session, term: term, operation: operation)
            }
            if session.inTransaction { _ = try? session.execute("ROLLBACK") }
            guard error.failure.isConnectionLost, error.laterMayHaveRun || error.statement >= commit else {
                throw error.failure
            }
            var unknown = Self.map(error.failure, location: location, operation: operation)
            // Sent together, the COMMIT may have run even when the answers to the statements before it were lost.
            unknown.message =
                "the connection to PostgreSQL was lost before PostgreSQL answered this \(operation)'s COMMIT, so "
                + "whether it was kept is not known: recover the stores again before going on (the daemon does)"
            throw unknown
        }
        // A COMMIT of a transaction that failed is answered ROLLBACK, without an error.
        let tag = results[commit].commandTag
        guard tag == "COMMIT" else {
            throw PostgresFailure(
                sqlState: nil,
                message: "COMMIT ended the transaction with \(tag): nothing of the \(operation) was kept",
                isConnectionLost: false
            )
        }
    }

    /// One transaction for the whole plan, committed with `synchronous_commit = on`: when this returns, PostgreSQL
    /// has made it durable (its WAL flushed). The hot statements are prepared once per session, before the
    /// pipeline that runs them.
    func write(_ plan: CommitPlan) throws(JournalError) {
        try withWriter("commit") { session in
            try fencedTransaction(session, operation: "commit", try writes(plan, on: session) + outboxWrites(plan.batch))
        }
    }

    /// The statements that write `plan`, in order.
    private func writes(_ plan: CommitPlan, on session: PostgresConnection) throws -> [PostgresStatement] {
        var statements = try writes(plan.batch.events, on: session, "insert_events", Statement.insertEvents) {
            event in
            [
                .text(event.store), .int64(Int64(event.seq)), .bytes(event.action), .bytes(event.clientID),
                .int64(Int64(bitPattern: event.requestNumber)), .int64(Int64(event.checksum)), .text(event.author),
            ]
        }
        for snapshot in plan.batch.snapshots {
            let values: [PostgresValue] = [
                .text(snapshot.store), .int64(Int64(snapshot.seq)), .bytes(snapshot.state),
                .bytes(snapshot.digest.bytes),
            ]
            if plan.upgrades.isEmpty {
                statements.append(.prepared(Statement.insertSnapshot.0, values))
            } else {
                // Only an upgrade replaces a snapshot: the older version's at the same seq. Any other must be new,
                // and the primary key says so if it is not.
                let replace = " ON CONFLICT (store, seq) DO UPDATE SET state = excluded.state, digest = excluded.digest"
                statements.append(.sql(Statement.insertSnapshot.1 + replace, values))
            }
        }
        for compaction in plan.compactions {
            let values: [PostgresValue] = [.text(compaction.store), .int64(Int64(compaction.throughSeq))]
            statements.append(.prepared(Statement.compactSnapshots.0, values))
            statements.append(.prepared(Statement.compactEvents.0, values))
        }
        for upgrade in plan.upgrades {
            statements.append(
                .sql(
                    "UPDATE stores SET domain_version = $1 WHERE name = $2",
                    [.int64(Int64(upgrade.version)), .text(upgrade.store)]
                )
            )
            statements.append(
                .sql(
                    "INSERT INTO store_versions (store, version, since_seq) VALUES ($1, $2, $3)",
                    [.text(upgrade.store), .int64(Int64(upgrade.version)), .int64(Int64(upgrade.sinceSeq))]
                )
            )
        }
        guard !plan.batch.idempotency.isEmpty else { return statements }
        // A key twice in one batch is one entry, the later one, in the first one's place.
        var entries: [IdempotencyRecord] = []
        var index: [IdempotencyKey: Int] = [:]
        for record in plan.batch.idempotency {
            if let at = index[record.key] {
                entries[at] = record
            } else {
                index[record.key] = entries.count
                entries.append(record)
            }
        }
        statements += try writes(entries, on: session, "upsert_idempotency", Statement.upsertIdempotency) { record in
            [
                .bytes(record.key.clientID), .int64(Int64(bitPattern: record.key.requestNumber)),
                .bytes(record.fingerprint), .bytes(record.reply),
            ]
        }
        statements.append(.prepared(Statement.trimIdempotency.0, [.int64(Int64(plan.idempotencyKept))]))
        return statements
    }

    /// The statements that write the batch's outbox changes, in the same transaction as its events.
    private func outboxWrites(_ batch: JournalBatch) -> [PostgresStatement] {
        var statements: [PostgresStatement] = []
        for effect in batch.effects {
            statements.append(
                .sql(
                    """
                    INSERT INTO effects (store, seq, idx, body, attempts, last_error, dead, checksum)
                    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                    """,
                    [
                        .text(effect.store), .int64(Int64(effect.seq)), .int64(Int64(effect.index)),
                        .bytes(effect.body), .int64(Int64(effect.attempts)), .text(effect.lastError ?? ""),
                        .int64(effect.dead ? 1 : 0), .int64(Int64(effect.checksum)),
                    ]
                )
            )
        }
        for update in batch.effectUpdates {
            let id: [PostgresValue] = [.text(update.id.store), .int64(Int64(update.id.seq)), .int64(Int64(update.id.index))]
            let sql: String
            var values = id
            switch update.change {
            case .done, .drop:
                sql = "DELETE FROM effects WHERE store = $1 AND seq = $2 AND idx = $3"
            case let .failed(attempts, error, dead):
                sql = "UPDATE effects SET attempts = $4, last_error = $5, dead = $6 WHERE store = $1 AND seq = $2 AND idx = $3"
                values += [.int64(Int64(attempts)), .text(error), .int64(dead ? 1 : 0)]
            case .retry:
                sql = "UPDATE effects SET attempts = 0, dead = 0 WHERE store = $1 AND seq = $2 AND idx = $3"
            }
            statements.append(.sql(sql, values))
        }
        for change in batch.timerChanges {
            switch change {
            case let .set(timer):
                statements.append(
                    .sql(
                        """
                        INSERT INTO timers (store, key, due_ms, action, seq, idx, checksum)
                        VALUES ($1, $2, $3, $4, $5, $6, $7)
                        ON CONFLICT (store, key) DO UPDATE SET due_ms = excluded.due_ms, action = excluded.action,
                            seq = excluded.seq, idx = excluded.idx, checksum = excluded.checksum
                        """,
                        [
                            .text(timer.store), .text(timer.key), .int64(timer.dueMilliseconds), .bytes(timer.action),
                            .int64(Int64(timer.seq)), .int64(Int64(timer.index)), .int64(Int64(timer.checksum)),
                        ]
                    )
                )
            case let .remove(store, key):
                statements.append(.sql("DELETE FROM timers WHERE store = $1 AND key = $2", [.text(store), .text(key)]))
            }
        }
        return statements
    }

    func storedOutbox() throws(JournalError) -> (
        effects: [(JournalEffect, Int64)], timers: [(JournalTimer, Int64)]
    ) {
        guard formatVersion >= 3 else { return ([], []) }
        let operation = "read outbox"
        let (effectRows, timerRows) = try withReader(operation) { session in
            (
                try session.execute(
                    """
                    SELECT store, seq, idx, body, attempts, last_error, dead, checksum FROM effects
                    ORDER BY store, seq, idx
                    """
                ),
                try session.execute(
                    "SELECT store, key, due_ms, action, seq, idx, checksum FROM timers ORDER BY store, key"
                )
            )
        }
        var effects: [(JournalEffect, Int64)] = []
        for row in 0..<effectRows.count {
            let effect = JournalEffect(
                store: effectRows.text(row, 0) ?? "",
                seq: UInt64(max(try int64(effectRows, row, 1, operation, nil), 0)),
                index: Int(try int64(effectRows, row, 2, operation, nil)),
                body: effectRows.bytes(row, 3) ?? [],
                attempts: Int(try int64(effectRows, row, 4, operation, nil)),
                lastError: effectRows.text(row, 5).flatMap { $0.isEmpty ? nil : $0 },
                dead: try int64(effectRows, row, 6, operation, nil) != 0
            )
            effects.append((effect, try int64(effectRows, row, 7, operation, nil)))
        }
        var timers: [(JournalTimer, Int64)] = []
        for row in 0..<timerRows.count {
            let timer = JournalTimer(
                store: timerRows.text(row, 0) ?? "",
                key: timerRows.text(row, 1) ?? "",
                dueMilliseconds: try int64(timerRows, row, 2, operation, nil),
                action: timerRows.bytes(row, 3) ?? [],
                seq: UInt64(max(try int64(timerRows, row, 4, operation, nil), 0)),
                index: Int(try int64(timerRows, row, 5, operation, nil))
            )
            timers.append((timer, try int64(timerRows, row, 6, operation, nil)))
        }
        return (effects, timers)
    }

    /// The statements that write `rows`, ``Statement/rowsPerStatement`` at a time, each the statement `sql` makes
    /// for a chunk of that many; `parameters` gives a row's values.
    private func writes<Row>(
        _ rows: [Row],
        on session: PostgresConnection,
        _ name: String,
        _ sql: (Int) -> String,
        _ parameters: (Row) -> [PostgresValue]
    ) throws -> [PostgresStatement] {
        try stride(from: 0, to: rows.count, by: Statement.rowsPerStatement).map { start in
            let chunk = rows[start..<min(start + Statement.rowsPerStatement, rows.count)]
            return try statement(session, name, rows: chunk.count, sql, chunk.flatMap(parameters))
        }
    }

    /// The statement `sql` makes for `rows` rows: prepared once per session (`NAME_ROWS`) for up to 64 rows, so a
    /// commit of a few requests — the common one — skips the planner; unprepared beyond. A statement is prepared
    /// here, before the pipeline it goes in, the first time a session needs it.
    private func statement(
        _ session: PostgresConnection,
        _ name: String,
        rows: Int,
        _ sql: (Int) -> String,
        _ values: [PostgresValue]
    ) throws -> PostgresStatement {
        guard rows <= 64 else { return .sql(sql(rows), values) }
        let statement = "\(name)_\(rows)"
        if !session.isPrepared(statement) { try session.prepare(statement, sql(rows), values) }
        return .prepared(statement, values)
    }

    // MARK: Idempotency

    private func idempotency(
        _ rows: PostgresRows,
        _ row: Int,
        _ operation: String
    ) throws(JournalError)
        -> IdempotencyRecord
    {
        IdempotencyRecord(
            key: IdempotencyKey(
                clientID: try bytes(rows, row, 0, operation, nil),
                requestNumber: UInt64(bitPattern: try int64(rows, row, 1, operation, nil))
            ),
            fingerprint: try bytes(rows, row, 2, operation, nil),
            reply: try bytes(rows, row, 3, operation, nil)
        )
    }

    func idempotencyRecord(for key: IdempotencyKey) throws(JournalError) -> IdempotencyRecord? {
        let operation = "read idempotency"
        let rows = try withReader(operation) {
            try $0.execute(
                """
                SELECT client_id, request_number, fingerprint, reply FROM idempotency
                WHERE client_id = $1 AND request_number = $2
                """,
                [.bytes(key.clientID), .int64(Int64(bitPattern: key.requestNumber))]
            )
        }
        guard rows.count > 0 else { return nil }
        return try idempotency(rows, 0, operation)
    }

    func forEachIdempotencyRecord(
        _ body: (IdempotencyRecord) throws(JournalError) -> Void
    ) throws(JournalError) {
        let operation = "read idempotency"
        let page = 1_000
        try withSnapshot(operation) { session in
            var after = Int64.min
            while true {
                let rows = try session.execute(
                    """
                    SELECT client_id, request_number, fingerprint, reply, position FROM idempotency
                    WHERE position > $1 ORDER BY position LIMIT $2
                    """,
                    [.int64(after), .int64(Int64(page))]
                )
                for row in 0..<rows.count {
                    try body(try idempotency(rows, row, operation))
                    after = try int64(rows, row, 4, operation, nil)
                }
                if rows.count < page { break }
            }
        }
    }

    func idempotencyCount() throws(JournalError) -> Int {
        let rows = try withReader("read idempotency") { try $0.execute("SELECT count(*) FROM idempotency") }
        return Int(try int64(rows, 0, 0, "read idempotency", nil))
    }

    /// The database's size on the server's disk.
    func fileBytes() -> Int64? {
        try? withReader("stats") { try $0.execute("SELECT pg_database_size(current_database())").int64(0, 0) }
    }

    /// PostgreSQL checks its own pages (and data checksums when the cluster has them on); the journal's checks
    /// are the engine's.
    func integrityProblems() throws(JournalError) -> [String] { [] }
}
