#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// How a daemon holds the lease of a PostgreSQL journal that several daemons share: its name in the lease row, and
/// how long a lease lasts unless it is renewed. Time is the database's (`clock_timestamp()`), never a host's.
public struct PostgresLease: Hashable, Sendable {
    /// The name the lease row shows while this journal leads: the host name and the process id unless set.
    public var holder: String
    /// How long a lease lasts from its last renewal; a standby takes it once it has expired. At least 100 ms.
    public var duration: Duration

    #if LOCKSTEP_FAILPOINTS
    /// The failpoint `unfenced`, in test (debug) builds only: the fence checks nothing, so a commit or a renewal
    /// goes through whoever holds the lease row. Only for the fault suite's proof that it catches two leaders.
    package var unfencedForTesting = false
    #endif

    /// Three seconds: a standby that tries every second takes over within about four after a leader dies.
    public static let defaultDuration = Duration.seconds(3)

    /// A lease held as `holder` for `duration` at a time.
    public init(holder: String = PostgresLease.defaultHolder(), duration: Duration = PostgresLease.defaultDuration) {
        self.holder = holder
        self.duration = max(duration, .milliseconds(100))
    }

    /// `HOSTNAME:PID`: unique among the daemons of one database unless two hosts share a name.
    public static func defaultHolder() -> String {
        var name = [UInt8](repeating: 0, count: 256)
        let host =
            gethostname(&name, name.count - 1) == 0
            ? String(decoding: name.prefix { $0 != 0 }, as: UTF8.self) : "localhost"
        return "\(host):\(getpid())"
    }

    /// The duration in whole milliseconds, as the statements take it.
    var milliseconds: Int64 { Int64(duration / .milliseconds(1)) }
}

/// The lease of a PostgreSQL journal as the database holds it.
public struct JournalLeader: Hashable, Sendable {
    /// The holder's name (``PostgresLease/holder``); empty before any daemon led the journal.
    public var holder: String
    /// The lease's term: 1 for the first leader, one more at every takeover; 0 before any.
    public var term: UInt64
    /// When the lease expires unless renewed, by the database's clock: ISO 8601 in UTC, milliseconds.
    public var expiresAt: String
    /// How long the lease still had to run by the database's clock when it was read; zero once expired.
    public var expiresIn: Duration

    /// A leader as read from the lease row.
    public init(holder: String, term: UInt64, expiresAt: String, expiresIn: Duration) {
        self.holder = holder
        self.term = term
        self.expiresAt = expiresAt
        self.expiresIn = expiresIn
    }
}

/// What ``PostgresJournal/acquireLease()`` found.
public enum LeaseOutcome: Hashable, Sendable {
    /// The journal took the lease, free or expired, with this term; `previousHolder` had the term before (empty
    /// when none did).
    case leading(term: UInt64, previousHolder: String)
    /// Another daemon holds an unexpired lease.
    case standingBy(JournalLeader)
}

extension PostgresStorage {
    /// The lease's statements; the commit's fence is prepared once per writer session.
    enum LeaseStatement {
        static let table = """
            CREATE TABLE leadership (
                one boolean PRIMARY KEY DEFAULT true CHECK (one),
                term bigint NOT NULL,
                holder text NOT NULL,
                expires_at timestamptz NOT NULL,
                previous_holder text NOT NULL
            );
            INSERT INTO leadership (term, holder, expires_at, previous_holder)
            VALUES (0, '', '1970-01-01 00:00:00+00', '');
            """

        /// Takes the row when its lease has expired, with the next term: parameters holder, duration in ms. The
        /// row lock makes it wait for a commit in flight, whose fence holds that lock until it ends; it then sees
        /// the row as that commit left it.
        static let acquire = """
            UPDATE leadership
            SET term = term + 1, holder = $1, previous_holder = holder,
                expires_at = clock_timestamp() + $2::float8 * interval '1 millisecond'
            WHERE expires_at <= clock_timestamp()
            RETURNING term, previous_holder
            """

        /// The fence: the first statement of every commit, and the idle leader's renewal. Extends the lease while
        /// it still has this journal's term and holder — parameters term, holder, duration in ms — and locks the
        /// row until the transaction ends. An expired lease that nobody took is still this journal's: a takeover
        /// always goes through the row lock and a new term, so no other daemon can have committed meanwhile.
        ///
        /// When no row matched, the statement fails rather than return no row, so that the server runs nothing
        /// after it in a commit's pipeline and the transaction can only roll back. SQL has no RAISE outside
        /// PL/pgSQL: the failure is a cast of a text to bigint (SQLSTATE 22P02, the text quoted in the message,
        /// ``fenceRefusal`` recognizes it). The text includes `count(*)`, so the planner cannot fold the cast into
        /// a constant and fail while planning a fence that matches.
        static let fence = (
            "fence",
            """
            WITH renewed AS (
                UPDATE leadership SET expires_at = clock_timestamp() + $3::float8 * interval '1 millisecond'
                WHERE term = $1 AND holder = $2
                RETURNING term
            )
            SELECT CASE count(*) WHEN 1 THEN min(term)
                ELSE ('\(fenceRefusal) no lease of term ' || $1 || ' held by ' || $2 || ' (' || count(*) || ' rows)')
                    ::bigint
            END
            FROM renewed
            """
        )

        /// What the fence's failure quotes when the lease is no longer this journal's.
        static let fenceRefusal = "lockstep fence:"

        /// Lets the lease go at once (a clean stop), so a standby need not wait for it to expire.
        static let release = "UPDATE leadership SET expires_at = clock_timestamp() WHERE term = $1 AND holder = $2"

        /// The lease as it stands: term, holder, expiry as text, milliseconds left.
        static let read = """
            SELECT term, holder,
                to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                greatest(0, (extract(epoch FROM expires_at - clock_timestamp()) * 1000))::bigint
            FROM leadership
            """
    }

    /// The lease row as it stands, read on `session`.
    static func readLeader(_ session: PostgresConnection) throws -> JournalLeader {
        let rows = try session.execute(LeaseStatement.read)
        guard rows.count == 1, let term = rows.int64(0, 0), let left = rows.int64(0, 3) else {
            throw PostgresFailure(
                sqlState: nil,
                message: "the leadership table has \(rows.count) rows, not the one it must have",
                isConnectionLost: false
            )
        }
        return JournalLeader(
            holder: rows.text(0, 1) ?? "",
            term: UInt64(max(term, 0)),
            expiresAt: rows.text(0, 2) ?? "",
            expiresIn: .milliseconds(left)
        )
    }

    /// The term of the lease this journal holds, or ``JournalError/Code/fenced`` when it holds none.
    func heldTerm(_ operation: String) throws(JournalError) -> Int64 {
        guard let term = leaseTerm.withLockedValue({ $0 }) else {
            throw JournalError(
                code: .fenced,
                file: location,
                operation: operation,
                message: "this journal does not hold the lease (never acquired, or lost to another daemon), so "
                    + "it may not write: acquire the lease first"
            )
        }
        return term
    }

    /// The fence (``LeaseStatement/fence``) for the lease of `term`, to send first in a commit's pipeline.
    func fenceStatement(term: Int64) -> PostgresStatement {
        #if LOCKSTEP_FAILPOINTS
        if lease.unfencedForTesting { return .sql("SELECT $1::bigint", [.int64(term)]) }
        #endif
        return .prepared(LeaseStatement.fence.0, [.int64(term), .text(lease.holder), .int64(lease.milliseconds)])
    }

    /// Whether `failure` is the fence's refusal: the lease row no longer has this journal's term and holder.
    static func isFenceRefusal(_ failure: PostgresFailure) -> Bool {
        failure.sqlState == "22P02" && failure.message.contains(LeaseStatement.fenceRefusal)
    }

    /// Extends the lease alone, outside any transaction (an idle leader), or throws ``JournalError/Code/fenced``
    /// naming the term that superseded this journal's; the journal then leads no more.
    func fence(_ session: PostgresConnection, operation: String) throws {
        let term = try heldTerm(operation)
        #if LOCKSTEP_FAILPOINTS
        if lease.unfencedForTesting {
            _ = try session.execute("SELECT 1")
            return
        }
        #endif
        do {
            try session.execute(prepared: LeaseStatement.fence.0, fenceStatement(term: term).parameters)
        } catch let failure where Self.isFenceRefusal(failure) {
            throw fenced(session, term: term, operation: operation)
        }
    }

    /// What the fence's refusal means for an `operation` of the lease of `term`: the journal leads no more, and the
    /// error names the term that superseded it. Rolls back the session's failed transaction first, to read the
    /// lease row.
    func fenced(_ session: PostgresConnection, term: Int64, operation: String) -> JournalError {
        leaseTerm.withLockedValue { $0 = nil }
        if session.inTransaction { _ = try? session.execute("ROLLBACK") }
        let leader = try? Self.readLeader(session)
        return JournalError(
            code: .fenced,
            file: location,
            operation: operation,
            term: leader?.term,
            message: "this daemon's lease (term \(term), as \(lease.holder)) was taken over"
                + (leader.map { " by \($0.holder.isEmpty ? "another daemon" : $0.holder) with term \($0.term)" } ?? "")
                + ", so nothing of this \(operation) was kept: another daemon leads the journal now"
        )
    }

    /// Takes the lease if it is free or expired; see ``PostgresJournal/acquireLease()``.
    func acquireLease() throws(JournalError) -> LeaseOutcome {
        var outcome: LeaseOutcome?
        try withWriter("acquire lease") { session in
            let taken = try session.execute(
                LeaseStatement.acquire,
                [.text(lease.holder), .int64(lease.milliseconds)]
            )
            if taken.count == 1, let term = taken.int64(0, 0) {
                leaseTerm.withLockedValue { $0 = term }
                outcome = .leading(term: UInt64(term), previousHolder: taken.text(0, 1) ?? "")
            } else {
                outcome = .standingBy(try Self.readLeader(session))
            }
        }
        return outcome!
    }

    /// Renews the lease alone (an idle leader); see ``PostgresJournal/renewLease()``.
    func renewLease() throws(JournalError) {
        try withWriter("renew lease") { session in try fence(session, operation: "renewal") }
    }

    /// The lease row as it stands, read on a reader connection.
    func leader() throws(JournalError) -> JournalLeader {
        try withReader("read lease") { try Self.readLeader($0) }
    }

    /// Lets the lease go, if this journal holds it; see ``PostgresJournal/releaseLease()``.
    func releaseLease() throws(JournalError) {
        try withWriter("release lease") { session in releaseLease(session) }
    }

    /// Lets the lease go, if this journal holds it: on a clean close.
    func releaseLease(_ session: PostgresConnection) {
        guard let term = leaseTerm.withLockedValue({ $0 }) else { return }
        leaseTerm.withLockedValue { $0 = nil }
        _ = try? session.execute(LeaseStatement.release, [.int64(term), .text(lease.holder)])
    }
}
