import CLibPQ

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A value sent to PostgreSQL as a binary parameter, of the one type each column of the journal has.
enum PostgresValue {
    case int64(Int64)
    case bytes([UInt8])
    case text(String)

    /// The parameter's type: `bigint`, `bytea` or `text`.
    var oid: Oid {
        switch self {
        case .int64: 20
        case .bytes: 17
        case .text: 25
        }
    }

    /// The binary wire form: 8 bytes big-endian for `bigint`, the bytes as they are for `bytea` and `text`.
    func append(to buffer: inout [UInt8]) {
        switch self {
        case let .int64(number): withUnsafeBytes(of: number.bigEndian) { buffer += $0 }
        case let .bytes(bytes): buffer += bytes
        case let .text(text): buffer += text.utf8
        }
    }
}

/// What a failed libpq call said: the SQLSTATE (`nil` when libpq failed before the server answered) and the
/// server's or libpq's message.
struct PostgresFailure: Error {
    var sqlState: String?
    var message: String

    /// SQLSTATE class 08 (connection exception) or 57P0x (the server is shutting down), or no SQLSTATE at all
    /// on a connection libpq reports as broken: the server is gone, not the statement wrong.
    var isConnectionLost: Bool
}

/// One statement of a pipeline (``PostgresConnection/execute(pipeline:)``): one prepared on the session, by name,
/// or SQL parsed where it is sent; its parameters binary, as ``PostgresConnection/execute(_:_:)`` sends them.
struct PostgresStatement {
    enum Text {
        case prepared(String)
        case sql(String)
    }

    var text: Text
    var parameters: [PostgresValue]

    static func prepared(_ name: String, _ parameters: [PostgresValue]) -> Self {
        Self(text: .prepared(name), parameters: parameters)
    }

    static func sql(_ sql: String, _ parameters: [PostgresValue] = []) -> Self {
        Self(text: .sql(sql), parameters: parameters)
    }
}

/// Why a pipeline failed: the first of its statements that failed or could not be sent, and how.
struct PostgresPipelineFailure: Error {
    /// The statement's index in the pipeline.
    var statement: Int
    /// Whether the server may have run statements after it: only when libpq lost the connection before the server
    /// answered this one (the answers to those it ran may have been lost with it). When the server answered with
    /// an error, or the statement was never sent, none after it ran.
    var laterMayHaveRun: Bool
    var failure: PostgresFailure
}

/// The rows of one statement's result, in binary format; freed when released.
final class PostgresRows {
    private let result: OpaquePointer

    init(_ result: OpaquePointer) { self.result = result }
    deinit { lockstep_PQclear(result) }

    var count: Int { Int(lockstep_PQntuples(result)) }

    /// The command tag: `COMMIT`, or `ROLLBACK` for a COMMIT that ended a failed transaction.
    var commandTag: String { String(cString: lockstep_PQcmdStatus(result)) }

    func isNull(_ row: Int, _ column: Int) -> Bool { lockstep_PQgetisnull(result, Int32(row), Int32(column)) == 1 }

    /// The column's bytes (a `bytea` or `text` value as stored, a `bigint` as 8 bytes big-endian); `nil` for NULL.
    func bytes(_ row: Int, _ column: Int) -> [UInt8]? {
        guard !isNull(row, column) else { return nil }
        let length = Int(lockstep_PQgetlength(result, Int32(row), Int32(column)))
        guard length > 0, let value = lockstep_PQgetvalue(result, Int32(row), Int32(column)) else { return [] }
        return value.withMemoryRebound(to: UInt8.self, capacity: length) {
            Array(UnsafeBufferPointer(start: $0, count: length))
        }
    }

    /// A `bigint` column; `nil` for NULL or a value that is not 8 bytes wide.
    func int64(_ row: Int, _ column: Int) -> Int64? {
        guard let bytes = bytes(row, column), bytes.count == 8 else { return nil }
        return bytes.reduce(0) { $0 << 8 | Int64($1) }
    }

    /// A `text` column; `nil` for NULL.
    func text(_ row: Int, _ column: Int) -> String? {
        bytes(row, column).map { String(decoding: $0, as: UTF8.self) }
    }

    /// A `boolean` column: one byte.
    func bool(_ row: Int, _ column: Int) -> Bool? {
        bytes(row, column).flatMap { $0.count == 1 ? $0[0] != 0 : nil }
    }
}

/// One libpq connection: the one place the journal calls libpq, and where every result is checked. A failure
/// throws a ``PostgresFailure`` with the SQLSTATE and message, which ``PostgresStorage`` turns into a
/// ``JournalError`` naming the operation.
///
/// Not thread-safe, as libpq's connections are not.
// @unchecked Sendable, proved here since the compiler cannot check it: a connection moves between threads but no two
// threads ever use it at once. Every connection has exactly one owner at a time:
// - PostgresStorage's writer is reached only inside `writer.withLockedValue`, whose lock is held for the whole call
//   (a commit's pipeline included), `close()` too;
// - a reader is used only after `readers.withLockedValue { popLast }` (or `close()`, or the stale-pool flush) took it
//   out of the pool under the lock, so no other thread can reach it, until `giveBack` appends it again as its last
//   use or closes it;
// - `PostgresJournal.execute(_:connection:)` makes its own and closes it before it returns, and
//   `PostgresJournal.Session` (tests only) keeps its own in a class that is not `Sendable`, so one thread uses it.
// Nothing else holds a reference: the type is internal and PostgresStorage's two owners are private. The compiler
// cannot prove this because a value that crossed a lock once cannot be `sending` back (tried: region errors at both
// places).
final class PostgresConnection: @unchecked Sendable {
    private var handle: OpaquePointer?
    /// Statements prepared on this session, by name; prepared again after a reset.
    private var prepared: [String: (sql: String, types: [Oid])] = [:]

    private let conninfo: String
    /// When the last statement on this session ended.
    private var lastUsed = ContinuousClock.now

    /// Connects with `conninfo` (key=value pairs or a `postgresql://` URI). A `connect_timeout` of 10 s, TCP
    /// keepalives that find a dead peer in ~25 s (and a `tcp_user_timeout` of 30 s for unacknowledged data: no
    /// commit waits hours on a half-open connection), UTF-8 and the application name `lockstep` apply unless the
    /// string gives its own.
    init(conninfo: String) throws(PostgresFailure) {
        self.conninfo = conninfo
        try connect()
    }

    private func connect() throws(PostgresFailure) {
        try loadLibPQ()
        let keywords = [
            "connect_timeout", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout",
            "client_encoding", "fallback_application_name", "dbname",
        ]
        let values = ["10", "10", "5", "3", "30000", "UTF8", "lockstep", conninfo]
        // Entries before the expanded `dbname` are defaults the connection string may override.
        handle = withCStrings(keywords) { keys in
            withCStrings(values) { lockstep_PQconnectdbParams(keys, $0, 1) }
        }
        guard let handle, lockstep_PQstatus(handle) == CONNECTION_OK else {
            let message =
                handle.map { Self.trimmed(lockstep_PQerrorMessage($0)) } ?? "libpq could not allocate a connection"
            close()
            throw PostgresFailure(sqlState: nil, message: message, isConnectionLost: true)
        }
        // Notices (e.g. "relation already exists, skipping") would go to standard error.
        lockstep_PQsetNoticeProcessor(handle, { _, _ in }, nil)
    }

    deinit { close() }

    /// Closes the connection (the server drops its session and any session lock); harmless twice.
    func close() {
        if let handle { lockstep_PQfinish(handle) }
        handle = nil
    }

    /// Whether libpq still considers the connection usable.
    var isUsable: Bool { handle.map { lockstep_PQstatus($0) == CONNECTION_OK } ?? false }

    /// Whether the session still answers — asked with `SELECT 1` only after it was idle for longer than `idle`: a
    /// server restart leaves idle sessions that libpq calls usable until a statement on them fails, and a
    /// statement that fails halfway through a read or a commit is worse than a round trip now.
    func answers(ifIdleFor idle: Duration) -> Bool {
        guard isUsable else { return false }
        guard ContinuousClock.now - lastUsed > idle else { return true }
        return (try? execute("SELECT 1")) != nil
    }

    /// Whether a transaction is open (or failed and not yet rolled back) on the session.
    var inTransaction: Bool {
        guard let handle else { return false }
        let status = lockstep_PQtransactionStatus(handle)
        return status == PQTRANS_INTRANS || status == PQTRANS_INERROR || status == PQTRANS_ACTIVE
    }

    /// The server process serving this session, for `pg_terminate_backend` in tests.
    var backendPID: Int32 { handle.map { lockstep_PQbackendPID($0) } ?? 0 }

    /// Reconnects with the same parameters (connects anew after ``close()``) and prepares the session's statements
    /// again.
    func reset() throws(PostgresFailure) {
        guard let handle else {
            try connect()
            for (name, statement) in prepared { try prepareOnServer(name, statement.sql, statement.types) }
            return
        }
        lockstep_PQreset(handle)
        guard lockstep_PQstatus(handle) == CONNECTION_OK else {
            throw PostgresFailure(
                sqlState: nil,
                message: Self.trimmed(lockstep_PQerrorMessage(handle)),
                isConnectionLost: true
            )
        }
        for (name, statement) in prepared { try prepareOnServer(name, statement.sql, statement.types) }
    }

    /// Runs `sql` with `parameters` ($1, $2, …) and returns its rows (none for a command).
    @discardableResult
    func execute(_ sql: String, _ parameters: [PostgresValue] = []) throws(PostgresFailure) -> PostgresRows {
        let handle = try liveHandle()
        return try check(
            withParameters(parameters) { types, values, lengths, formats in
                lockstep_PQexecParams(handle, sql, Int32(parameters.count), types, values, lengths, formats, 1)
            }
        )
    }

    /// Runs several statements without parameters in one call (the simple query protocol): a schema.
    func executeScript(_ sql: String) throws(PostgresFailure) {
        let handle = try liveHandle()
        _ = try check(lockstep_PQexec(handle, sql))
    }

    /// Sends `statements` together, ended by one sync (libpq's pipeline mode): one round trip to the server for all
    /// of them, which runs them in order. Returns each statement's rows once every one has succeeded.
    ///
    /// The server runs none after the first that fails (libpq answers those `PGRES_PIPELINE_ABORTED`); the failure
    /// names that statement. A transaction the statements opened is then left failed on the session, for the
    /// caller to roll back. A session whose pipeline cannot be ended cleanly — the connection lost, or results
    /// libpq did not expect — is closed, so the next use connects afresh (``reset()``).
    func execute(pipeline statements: [PostgresStatement]) throws(PostgresPipelineFailure) -> [PostgresRows] {
        let handle: OpaquePointer
        do {
            handle = try liveHandle()
        } catch {
            throw PostgresPipelineFailure(statement: 0, laterMayHaveRun: false, failure: error)
        }
        do {
            try sent(lockstep_PQenterPipelineMode(handle), "PQenterPipelineMode")
        } catch {
            // The session is busy with something else: it is in no state to be trusted.
            close()
            throw PostgresPipelineFailure(statement: 0, laterMayHaveRun: false, failure: error)
        }
        for (index, statement) in statements.enumerated() {
            let count = Int32(statement.parameters.count)
            let queued = withParameters(statement.parameters) { types, values, lengths, formats in
                switch statement.text {
                case let .prepared(name): lockstep_PQsendQueryPrepared(handle, name, count, values, lengths, formats, 1)
                case let .sql(sql): lockstep_PQsendQueryParams(handle, sql, count, types, values, lengths, formats, 1)
                }
            }
            do {
                try sent(queued, "PQsendQuery")
            } catch {
                // Those before it may be queued in libpq, and no sync ends them: this session is done.
                close()
                throw PostgresPipelineFailure(statement: index, laterMayHaveRun: false, failure: error)
            }
        }
        do {
            try sent(lockstep_PQpipelineSync(handle), "PQpipelineSync")
        } catch {
            close()
            throw PostgresPipelineFailure(statement: statements.count, laterMayHaveRun: false, failure: error)
        }
        var rows: [PostgresRows] = []
        var failed: PostgresPipelineFailure?
        func fail(_ index: Int, laterMayHaveRun: Bool, _ failure: PostgresFailure) {
            if failed == nil {
                failed = PostgresPipelineFailure(statement: index, laterMayHaveRun: laterMayHaveRun, failure: failure)
            }
        }
        func unexpected(_ message: String) -> PostgresFailure {
            PostgresFailure(sqlState: nil, message: message, isConnectionLost: !isUsable)
        }
        for index in statements.indices {
            // Each statement of the journal has one result, then a null.
            guard let result = lockstep_PQgetResult(handle) else {
                let reason = Self.trimmed(lockstep_PQerrorMessage(handle))
                fail(index, laterMayHaveRun: true, unexpected("libpq returned no result for the statement: \(reason)"))
                close()
                break
            }
            if lockstep_PQresultStatus(result) == PGRES_PIPELINE_ABORTED {
                lockstep_PQclear(result)
                fail(
                    index,
                    laterMayHaveRun: false,
                    unexpected("the server skipped the statement, yet no earlier one failed")
                )
            } else {
                do {
                    rows.append(try check(result))
                } catch {
                    fail(index, laterMayHaveRun: error.isConnectionLost && error.sqlState == nil, error)
                }
            }
            if let extra = lockstep_PQgetResult(handle) {
                lockstep_PQclear(extra)
                fail(index, laterMayHaveRun: true, unexpected("the statement had more than one result"))
                close()
                break
            }
        }
        endPipeline()
        if let failed { throw failed }
        return rows
    }

    /// Reads the sync's result and leaves pipeline mode; closes the session when either fails. A failure here,
    /// after every statement's answer, is not the statements': the next use reconnects.
    private func endPipeline() {
        guard let handle else { return }
        if lockstep_PQstatus(handle) == CONNECTION_OK, let sync = lockstep_PQgetResult(handle) {
            let status = lockstep_PQresultStatus(sync)
            lockstep_PQclear(sync)
            if status == PGRES_PIPELINE_SYNC, lockstep_PQexitPipelineMode(handle) == 1 { return }
        }
        close()
    }

    /// Prepares `sql` once as `name`, with parameters of the types `example` has.
    func prepare(_ name: String, _ sql: String, _ example: [PostgresValue]) throws(PostgresFailure) {
        let types = example.map(\.oid)
        try prepareOnServer(name, sql, types)
        prepared[name] = (sql, types)
    }

    /// Whether a statement is prepared as `name` on this session.
    func isPrepared(_ name: String) -> Bool { prepared[name] != nil }

    /// Runs the statement prepared as `name`.
    @discardableResult
    func execute(prepared name: String, _ parameters: [PostgresValue]) throws(PostgresFailure) -> PostgresRows {
        let handle = try liveHandle()
        return try check(
            withParameters(parameters) { _, values, lengths, formats in
                lockstep_PQexecPrepared(handle, name, Int32(parameters.count), values, lengths, formats, 1)
            }
        )
    }

    private func prepareOnServer(_ name: String, _ sql: String, _ types: [Oid]) throws(PostgresFailure) {
        let handle = try liveHandle()
        _ = try check(lockstep_PQprepare(handle, name, sql, Int32(types.count), types))
    }

    private func liveHandle() throws(PostgresFailure) -> OpaquePointer {
        guard let handle else {
            throw PostgresFailure(sqlState: nil, message: "the connection was closed", isConnectionLost: true)
        }
        return handle
    }

    /// The result if the statement succeeded; else the failure, with its SQLSTATE and message.
    private func check(_ result: OpaquePointer?) throws(PostgresFailure) -> PostgresRows {
        lastUsed = .now
        guard let result else {
            // Out of memory, or the connection is gone before a result could be made.
            throw PostgresFailure(
                sqlState: nil,
                message: handle.map { Self.trimmed(lockstep_PQerrorMessage($0)) } ?? "no connection",
                isConnectionLost: !isUsable
            )
        }
        let rows = PostgresRows(result)
        let status = lockstep_PQresultStatus(result)
        guard status != PGRES_COMMAND_OK, status != PGRES_TUPLES_OK else { return rows }
        let state = lockstep_PQresultErrorField(result, Int32(UInt8(ascii: "C"))).map { String(cString: $0) }
        var message = lockstep_PQresultErrorField(result, Int32(UInt8(ascii: "M"))).map { String(cString: $0) }
        if message == nil { message = Self.trimmed(lockstep_PQresultErrorMessage(result)) }
        if message?.isEmpty != false, let handle { message = Self.trimmed(lockstep_PQerrorMessage(handle)) }
        let lost =
            state.map { $0.hasPrefix("08") || $0.hasPrefix("57P0") }
            ?? (handle.map { lockstep_PQstatus($0) } != CONNECTION_OK)
        throw PostgresFailure(sqlState: state, message: message ?? "unknown failure", isConnectionLost: lost)
    }

    /// Nothing if a libpq call that queues or sends returned 1; else what libpq says went wrong.
    private func sent(_ status: Int32, _ function: String) throws(PostgresFailure) {
        lastUsed = .now
        guard status != 1 else { return }
        let message = handle.map { Self.trimmed(lockstep_PQerrorMessage($0)) } ?? "no connection"
        throw PostgresFailure(
            sqlState: nil,
            message: "\(function) failed: \(message.isEmpty ? "libpq gave no reason" : message)",
            isConnectionLost: !isUsable
        )
    }

    /// libpq's parameter arrays for `parameters`, all binary, valid for the duration of `body`.
    private func withParameters<Result>(
        _ parameters: [PostgresValue],
        _ body: (
            UnsafePointer<Oid>?, UnsafePointer<UnsafePointer<CChar>?>?, UnsafePointer<Int32>?, UnsafePointer<Int32>?
        ) -> Result
    ) -> Result {
        var buffer: [UInt8] = []
        var offsets: [Int] = []
        var lengths: [Int32] = []
        for parameter in parameters {
            offsets.append(buffer.count)
            parameter.append(to: &buffer)
            lengths.append(Int32(buffer.count - offsets.last!))
        }
        buffer.append(0)  // a non-null address for an empty last value: a null pointer would mean SQL NULL
        let types = parameters.map(\.oid)
        let formats = [Int32](repeating: 1, count: parameters.count)
        return buffer.withUnsafeBufferPointer { bytes in
            let base = UnsafeRawPointer(bytes.baseAddress!).assumingMemoryBound(to: CChar.self)
            let values: [UnsafePointer<CChar>?] = offsets.map { base + $0 }
            return body(types, values, lengths, formats)
        }
    }

    private static func trimmed(_ text: UnsafePointer<CChar>?) -> String {
        text.map { String(cString: $0) }?.trimmingTrailingWhitespace() ?? ""
    }
}

/// The information in a connection string that is safe to print: host, port, database and user, never the
/// password. `nil` when libpq cannot parse the string.
func redactedConnectionString(_ conninfo: String) -> String? {
    guard (try? loadLibPQ()) != nil else { return nil }
    var error: UnsafeMutablePointer<CChar>?
    guard let options = lockstep_PQconninfoParse(conninfo, &error) else {
        if let error { lockstep_PQfreemem(error) }
        return nil
    }
    defer { lockstep_PQconninfoFree(options) }
    var shown: [String: String] = [:]
    var index = 0
    while let keyword = options[index].keyword {
        if let value = options[index].val {
            shown[String(cString: keyword)] = String(cString: value)
        }
        index += 1
    }
    return ["host", "hostaddr", "port", "dbname", "user"].compactMap { key in
        shown[key].map { "\(key)=\($0)" }
    }.joined(separator: " ")
}

/// Whether a PostgreSQL server answers at `conninfo` (libpq's `PQping`): it accepts connections, whether or not
/// this user may log in.
func postgresAnswers(_ conninfo: String) -> Bool {
    guard (try? loadLibPQ()) != nil else { return false }
    return lockstep_PQping(conninfo) == PQPING_OK
}

/// Opens libpq (`libpq.so.5`, 14 or newer) the first time a PostgreSQL journal needs it; a daemon on SQLite never
/// maps it.
func loadLibPQ() throws(PostgresFailure) {
    if let failure = lockstep_libpq_load() {
        throw PostgresFailure(
            sqlState: nil,
            message: "cannot load libpq, PostgreSQL's client library (\(String(cString: failure))); install libpq "
                + "14 or newer, whose pipeline mode a commit uses (Debian: apt-get install libpq5)",
            isConnectionLost: false
        )
    }
}

/// C strings for `strings`, with a terminating null pointer, valid for the duration of `body`.
private func withCStrings<Result>(
    _ strings: [String],
    _ body: (UnsafePointer<UnsafePointer<CChar>?>) -> Result
) -> Result {
    let copies = strings.map { strdup($0) }
    defer { for copy in copies { free(copy) } }
    let pointers: [UnsafePointer<CChar>?] = copies.map { $0.map { UnsafePointer($0) } } + [nil]
    return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
}

extension String {
    fileprivate func trimmingTrailingWhitespace() -> String {
        var text = Substring(self)
        while let last = text.last, last.isWhitespace { text.removeLast() }
        return String(text)
    }
}
