import Foundation
import GRDB
import GRDBSQLite
import Lockstep

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The journal in one SQLite file, `journal.sqlite` in the data directory: WAL, `synchronous = FULL`, mode
/// 0600. Its schema, durability and tools are described in docs/operations.md.
public final class SQLiteJournal: EngineJournal {
    /// The journal's file name inside the data directory.
    public static let fileName = "journal.sqlite"

    /// Copies the SQLite journal in `directory` — which its daemon may be writing — into `destination`, a new or
    /// empty directory, with SQLite's online backup: a consistent copy of the database and its write-ahead log as
    /// they stood at one commit. Check the copy with `lockstep journal verify`.
    public static func backup(_ directory: String, to destination: String) throws(JournalError) {
        try JournalFiles.requireEmpty(destination)
        let journal = try SQLiteJournal(directory: directory, readOnly: true)
        defer { try? journal.close() }
        let path = URL(fileURLWithPath: destination).appendingPathComponent(fileName).path
        try JournalFiles.makeDirectory(destination, path: path)
        _ = try JournalFiles.createFile(path)
        try JournalFiles.restrictMode(path, journal: path)
        do {
            let target = try DatabaseQueue(path: path)
            try journal.databaseQueue.backup(to: target)
            try target.close()
        } catch {
            for file in [path, path + "-wal", path + "-shm"] { unlink(file) }
            throw SQLiteStorage.map(error, file: path, operation: "backup")
        }
        try JournalFiles.fsyncDirectory(destination, journal: path)
    }

    /// Whether `directory` holds an SQLite journal (`journal.sqlite`).
    public static func exists(in directory: String) -> Bool {
        JournalFiles.exists(fileName, in: directory)
    }
    /// The format this build writes and reads. A journal of another format is refused when opened.
    public static let formatVersion = 5

    let engine: JournalEngine<SQLiteStorage>
    private var storage: SQLiteStorage { engine.storage }

    /// Opens the journal in `directory`, creating the directory (mode 0700) and the journal when absent.
    ///
    /// - Parameters:
    ///   - directory: The data directory.
    ///   - policy: When snapshots are due and how much history is kept.
    ///   - readOnly: Open for reading only (the CLI's `verify`, `dump` and `stats`): nothing is created,
    ///     commits are refused, and a store not yet in the journal cannot be recovered.
    ///   - relaxed: `synchronous = NORMAL`: a commit returns once written, not synced; call ``sync()`` soon
    ///     after (lockstepd does within 10 ms). A crash of the process loses nothing; a power cut can lose
    ///     what was committed since the last sync.
    /// - Throws: ``JournalError`` with ``JournalError/Code/formatVersionMismatch`` when the file was written
    ///   in another format, ``JournalError/Code/notAJournal`` when it is some other database, and the
    ///   SQLite or I/O failure otherwise.
    public init(
        directory: String,
        policy: JournalPolicy = JournalPolicy(),
        readOnly: Bool = false,
        relaxed: Bool = false
    ) throws(JournalError) {
        engine = JournalEngine(
            storage: try SQLiteStorage(
                directory: directory,
                readOnly: readOnly,
                synchronous: relaxed ? .normal : .full
            ),
            policy: policy
        )
    }

    #if LOCKSTEP_FAILPOINTS
    /// A journal that never fsyncs (SQLite `synchronous = OFF`): only for the fault suite's proof that its
    /// power-cut class loses acknowledged actions when the journal does not sync. Never for data: only test (debug)
    /// builds have it.
    package init(unsyncedForTestingIn directory: String, policy: JournalPolicy) throws(JournalError) {
        engine = JournalEngine(
            storage: try SQLiteStorage(directory: directory, readOnly: false, synchronous: .off),
            policy: policy
        )
    }
    #endif

    /// The open connection, for tests that must reach under the journal (e.g. `PRAGMA max_page_count`).
    package var databaseQueue: DatabaseQueue { storage.queue }

    /// Closes the SQLite connection and releases the writer's lock (`journal.lock`), so another process may open the
    /// directory for writing. Later calls fail; closing twice is harmless.
    public func close() throws(JournalError) {
        try storage.close()
    }

    /// Makes every commit so far durable: fsyncs the write-ahead log. Needed only for a `relaxed` journal.
    public func sync() throws(JournalError) {
        let wal = storage.location + "-wal"
        let descriptor = interruptible { open(wal, O_RDONLY | O_CLOEXEC) }
        guard descriptor >= 0 else {
            if errno == ENOENT { return }  // no log yet: nothing written since the last checkpoint
            throw JournalFiles.ioError(storage.location, "sync", "cannot open \(wal)")
        }
        defer { closeDescriptor(descriptor) }
        guard interruptible({ fsync(descriptor) }) == 0 else {
            throw JournalFiles.ioError(storage.location, "sync", "cannot fsync \(wal)")
        }
    }
}

/// The SQLite tables behind ``SQLiteJournal``; see docs/operations.md for the schema.
final class SQLiteStorage: JournalStorage {
    let location: String
    let isReadOnly: Bool
    let queue: DatabaseQueue
    /// Held while open read-write: one writer per data directory.
    let writerLock: WriterLock?
    /// A read-only open's `-wal` and `-shm` files that it made itself (SQLite makes them to read a WAL database), which
    /// its close removes again when no writer has come meanwhile: a stopped daemon's directory stays as it was.
    private let madeByReading: [String]
    /// The format of the file as opened: ``SQLiteJournal/formatVersion`` once opened read-write.
    let formatVersion: Int

    static let schema = """
        CREATE TABLE journal_format (
            version INTEGER NOT NULL
        );
        CREATE TABLE stores (
            name TEXT NOT NULL PRIMARY KEY,
            domain_version INTEGER NOT NULL,
            epoch INTEGER NOT NULL
        );
        CREATE TABLE events (
            store TEXT NOT NULL REFERENCES stores (name),
            seq INTEGER NOT NULL,
            action BLOB NOT NULL,
            client_id BLOB NOT NULL,
            request_number INTEGER NOT NULL,
            checksum INTEGER NOT NULL,
            author TEXT NOT NULL DEFAULT '',
            PRIMARY KEY (store, seq)
        ) WITHOUT ROWID;
        CREATE TABLE snapshots (
            store TEXT NOT NULL REFERENCES stores (name),
            seq INTEGER NOT NULL,
            state BLOB NOT NULL,
            digest BLOB NOT NULL,
            UNIQUE (store, seq)
        );
        CREATE TABLE idempotency \(idempotencyColumns);
        CREATE TABLE store_versions \(storeVersionColumns);
        \(outboxTables)
        """

    /// The outbox (format 4, docs/effects.md): effects to run, journaled with their action, and the timers not
    /// fired, each with a CRC-32C checked when it is read back.
    static let outboxTables = """
        CREATE TABLE IF NOT EXISTS effects (
            store TEXT NOT NULL REFERENCES stores (name),
            seq INTEGER NOT NULL,
            idx INTEGER NOT NULL,
            body BLOB NOT NULL,
            attempts INTEGER NOT NULL,
            last_error TEXT,
            dead INTEGER NOT NULL,
            checksum INTEGER NOT NULL,
            PRIMARY KEY (store, seq, idx)
        ) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS timers (
            store TEXT NOT NULL REFERENCES stores (name),
            key TEXT NOT NULL,
            due_ms INTEGER NOT NULL,
            action BLOB NOT NULL,
            seq INTEGER NOT NULL,
            idx INTEGER NOT NULL,
            checksum INTEGER NOT NULL,
            PRIMARY KEY (store, key)
        ) WITHOUT ROWID;
        """

    /// Format 5 records each event's author (docs/security.md): a format 4 journal opened read-write gains the
    /// column, empty for the events it holds (their checksums leave an empty author out, so they still match).
    static let migrationFrom4 = """
        ALTER TABLE events ADD COLUMN author TEXT NOT NULL DEFAULT '';
        UPDATE journal_format SET version = 5;
        """

    /// Format 4 adds the outbox; a format 3 journal opened read-write gains its two tables in one transaction.
    static let migrationFrom3 = """
        \(outboxTables)
        UPDATE journal_format SET version = 4;
        """

    /// Which domain version wrote each part of a store: `version` wrote its events after `since_seq`.
    static let storeVersionColumns = """
        (
            store TEXT NOT NULL REFERENCES stores (name),
            version INTEGER NOT NULL,
            since_seq INTEGER NOT NULL,
            PRIMARY KEY (store, version)
        ) WITHOUT ROWID
        """

    /// Format 3 records each store's domain versions (`store_versions`), so that a store can be upgraded to a
    /// new version of its domain. A format 2 journal's stores were each written by the one version `stores`
    /// names, from seq 0; opening it read-write adds the table in one transaction.
    static let migrationFrom2 = """
        CREATE TABLE store_versions \(storeVersionColumns);
        INSERT INTO store_versions (store, version, since_seq) SELECT name, domain_version, 0 FROM stores;
        UPDATE journal_format SET version = 3;
        """

    /// The idempotency table's columns and index, in the schema and in the migration from format 1.
    static let idempotencyColumns = """
        (
            position INTEGER PRIMARY KEY,
            client_id BLOB NOT NULL,
            request_number INTEGER NOT NULL,
            fingerprint BLOB NOT NULL,
            reply BLOB NOT NULL,
            UNIQUE (request_number, client_id)
        )
        """

    /// Format 1 ordered the idempotency index by (client_id, request_number): client ids are random, so
    /// each client's entries sat on an index page of their own and a commit of n clients' dispatches wrote
    /// n index pages to the WAL. Format 2 orders it by (request_number, client_id): every client counts from
    /// 1, so one commit's entries share the index's last pages. Opening a format 1 journal read-write
    /// rebuilds the table once, in one transaction; nothing else changed.
    static let migrationFrom1 = """
        CREATE TABLE idempotency_2 \(idempotencyColumns);
        INSERT INTO idempotency_2 (position, client_id, request_number, fingerprint, reply)
            SELECT position, client_id, request_number, fingerprint, reply FROM idempotency;
        DROP TABLE idempotency;
        ALTER TABLE idempotency_2 RENAME TO idempotency;
        UPDATE journal_format SET version = 2;
        """

    /// "LKSP": lets `file` and other tools tell a journal from other SQLite files.
    static let applicationID: Int32 = 0x4C4B_5350

    /// SQLite's `synchronous` setting: when a commit fsyncs the write-ahead log.
    enum Synchronous: Int {
        case off = 0
        case normal = 1
        case full = 2
    }

    init(directory: String, readOnly: Bool, synchronous: Synchronous = .full) throws(JournalError) {
        let path = URL(fileURLWithPath: directory).appendingPathComponent(SQLiteJournal.fileName).path
        location = path
        isReadOnly = readOnly
        let fail = { (code: JournalError.Code, message: String) in
            JournalError(code: code, file: path, operation: "open", message: message)
        }

        var created = false
        if readOnly {
            guard FileManager.default.fileExists(atPath: path) else {
                throw fail(.notFound, "there is no journal file; check the data directory (\(directory))")
            }
            writerLock = nil
            madeByReading = [path + "-wal", path + "-shm"].filter { !FileManager.default.fileExists(atPath: $0) }
        } else {
            madeByReading = []
            try JournalFiles.makeDirectory(directory, path: path)
            writerLock = try WriterLock(directory: directory, journal: path)
            guard !LogJournal.exists(in: directory) else {
                throw fail(
                    .inUse,
                    "the data directory holds a log journal (\(LogJournal.fileName)): an SQLite journal beside it "
                        + "would start every store afresh; set journal = \"log\", or move the directory aside"
                )
            }
            created = try JournalFiles.createFile(path)
            if !created {
                for file in [path, path + "-wal", path + "-shm"] { try JournalFiles.restrictMode(file, journal: path) }
            }
            if created { try JournalFiles.fsyncDirectory(directory, journal: path) }
        }

        var configuration = Configuration()
        configuration.readonly = readOnly
        configuration.label = "lockstep-journal"
        configuration.foreignKeysEnabled = true
        configuration.busyMode = .timeout(10)
        // Not `journalMode = .wal`: GRDB then sets synchronous = NORMAL, which may lose the last commits on
        // power loss. FULL syncs the WAL at every commit. WAL itself is switched on below, once the file is
        // known to be a journal, so a foreign database is left as it was.
        configuration.prepareDatabase { db in
            guard !db.configuration.readonly else { return }
            try db.execute(sql: "PRAGMA synchronous = \(synchronous.rawValue)")
        }
        do {
            queue = try DatabaseQueue(path: path, configuration: configuration)
        } catch {
            throw Self.map(error, file: path, operation: "open")
        }

        let found: Int?
        do {
            found = try queue.writeWithoutTransaction { db -> Int? in
                try db.inTransaction(readOnly ? .deferred : .immediate) {
                    let tables = try String.fetchAll(db, sql: "SELECT name FROM sqlite_master WHERE type = 'table'")
                    if tables.contains("journal_format") {
                        let version = try Int.fetchOne(db, sql: "SELECT version FROM journal_format")
                        if version == 1, !readOnly { try db.execute(sql: Self.migrationFrom1) }
                        if version == 1 || version == 2, !readOnly { try db.execute(sql: Self.migrationFrom2) }
                        if (1...3).contains(version ?? 0), !readOnly { try db.execute(sql: Self.migrationFrom3) }
                        if (1...4).contains(version ?? 0), !readOnly { try db.execute(sql: Self.migrationFrom4) }
                        return .commit
                    }
                    guard tables.isEmpty, !readOnly else { return .commit }
                    try db.execute(sql: Self.schema)
                    try db.execute(
                        sql: "INSERT INTO journal_format (version) VALUES (?)",
                        arguments: [SQLiteJournal.formatVersion]
                    )
                    try db.execute(sql: "PRAGMA application_id = \(Self.applicationID)")
                    return .commit
                }
                let tables = try String.fetchAll(db, sql: "SELECT name FROM sqlite_master WHERE type = 'table'")
                guard tables.contains("journal_format") else { return nil }
                return try Int.fetchOne(db, sql: "SELECT version FROM journal_format")
            }
        } catch {
            throw Self.map(error, file: path, operation: "open")
        }
        guard let found else {
            try? queue.close()
            throw fail(
                .notAJournal,
                "the file is not a Lockstep journal (it has no journal_format table); move it aside or point "
                    + "the daemon at another data directory"
            )
        }
        // A format 1 to 4 journal opened read-only reads the same: its index may be ordered the old way, each
        // store's one version is the one `stores` names (1, 2), its outbox is empty (1, 2, 3), and no event has an
        // author (1 to 4).
        guard found == SQLiteJournal.formatVersion || ((1...4).contains(found) && readOnly) else {
            try? queue.close()
            throw JournalError(
                code: .formatVersionMismatch,
                file: path,
                operation: "open",
                message: "the journal has format version \(found), but this build reads format version "
                    + "\(SQLiteJournal.formatVersion); run the Lockstep release that wrote it, or move the data "
                    + "directory aside to start afresh"
            )
        }
        formatVersion = found
        if !readOnly {
            do {
                let (mode, found) = try queue.writeWithoutTransaction { db in
                    (
                        try String.fetchOne(db, sql: "PRAGMA journal_mode = WAL"),
                        try Int.fetchOne(db, sql: "PRAGMA synchronous")
                    )
                }
                guard mode == "wal", found == synchronous.rawValue else {
                    throw fail(
                        .sqlite,
                        "SQLite reports journal_mode \(mode ?? "?"), synchronous \(found ?? -1); "
                            + "expected wal and \(synchronous.rawValue) (\(synchronous))"
                            + "the journal needs a file system with shared memory and locks"
                    )
                }
            } catch let error as JournalError {
                throw error
            } catch {
                throw Self.map(error, file: path, operation: "open")
            }
            // The -wal and -shm files now exist; make their directory entries durable too.
            for file in [path + "-wal", path + "-shm"] { try JournalFiles.restrictMode(file, journal: path) }
            if created { try JournalFiles.fsyncDirectory(directory, journal: path) }
        }
    }

    func fileBytes() -> Int64? {
        var total: Int64 = 0
        for file in [location, location + "-wal"] {
            var info = stat()
            if interruptible({ stat(file, &info) }) == 0 { total += Int64(info.st_size) }
        }
        return total
    }

    // MARK: Errors

    static func map(_ error: any Error, file: String, operation: String, store: String? = nil) -> JournalError {
        if let error = error as? JournalError { return error }
        guard let error = error as? DatabaseError else {
            return JournalError(code: .sqlite, file: file, operation: operation, store: store, message: "\(error)")
        }
        let advice: String
        let code: JournalError.Code
        switch error.resultCode {
        case .SQLITE_FULL:
            code = .storageFull
            advice = "the disk is full; free space on it, then retry — nothing of the failed operation was kept"
        case .SQLITE_IOERR:
            code = .ioError
            advice = "the disk reported an I/O error; check the device and the kernel log"
        case .SQLITE_READONLY, .SQLITE_PERM, .SQLITE_AUTH:
            code = .readOnly
            advice = "the journal cannot be written; check the file's owner and mode, and that the disk is writable"
        case .SQLITE_CANTOPEN:
            code = .ioError
            advice = "SQLite cannot open the file; check that the directory exists and is writable"
        case .SQLITE_CORRUPT, .SQLITE_NOTADB:
            code = .corrupt
            advice = "the file is damaged or not an SQLite database; restore the data directory from a backup"
        case .SQLITE_BUSY, .SQLITE_LOCKED:
            code = .sqlite
            advice = "another process holds the journal locked; is a second daemon running on this directory?"
        default:
            code = .sqlite
            advice = "SQLite failed"
        }
        return JournalError(
            code: code,
            file: file,
            operation: operation,
            store: store,
            sqliteCode: error.extendedResultCode.rawValue,
            sqliteMessage: error.message,
            message: advice
        )
    }

    private func run<T>(_ operation: String, store: String? = nil, _ body: () throws -> T) throws(JournalError) -> T {
        do {
            return try body()
        } catch {
            throw Self.map(error, file: location, operation: operation, store: store)
        }
    }

    private func corrupt(_ operation: String, store: String?, _ message: String) -> JournalError {
        JournalError(code: .corrupt, file: location, operation: operation, store: store, message: message)
    }

    private func integer(
        _ row: Row,
        _ index: Int,
        _ operation: String,
        _ store: String?
    ) throws(JournalError) -> Int64 {
        let value: DatabaseValue = row[index]
        guard case let .int64(number) = value.storage else {
            throw corrupt(operation, store: store, "column \(index) holds \(value), where an INTEGER belongs")
        }
        return number
    }

    private func blob(_ row: Row, _ index: Int, _ operation: String, _ store: String?) throws(JournalError) -> [UInt8] {
        let value: DatabaseValue = row[index]
        guard case let .blob(data) = value.storage else {
            throw corrupt(operation, store: store, "column \(index) holds \(value), where a BLOB belongs")
        }
        return [UInt8](data)
    }

    private func seq(_ number: Int64, _ operation: String, _ store: String?) throws(JournalError) -> UInt64 {
        guard number >= 0 else { throw corrupt(operation, store: store, "a seq is negative (\(number))") }
        return UInt64(number)
    }

    // MARK: Stores

    private func record(_ row: Row, _ operation: String) throws(JournalError) -> StoreRecord {
        let name: DatabaseValue = row[0]
        guard case let .string(text) = name.storage else {
            throw corrupt(operation, store: nil, "a store name is \(name), where TEXT belongs")
        }
        let version = try integer(row, 1, operation, text)
        guard let domainVersion = UInt32(exactly: version) else {
            throw corrupt(operation, store: text, "the domain version \(version) is out of range")
        }
        return StoreRecord(
            name: text,
            domainVersion: domainVersion,
            epoch: UInt64(bitPattern: try integer(row, 2, operation, text))
        )
    }

    func storeRecord(named name: String) throws(JournalError) -> StoreRecord? {
        let row = try run("recover", store: name) {
            try queue.read { db in
                try Row.fetchOne(
                    db,
                    sql: "SELECT name, domain_version, epoch FROM stores WHERE name = ?",
                    arguments: [name]
                )
            }
        }
        guard let row else { return nil }
        return try record(row, "recover")
    }

    func storeRecords() throws(JournalError) -> [StoreRecord] {
        let rows = try run("read stores") {
            try queue.read { db in
                try Row.fetchAll(db, sql: "SELECT name, domain_version, epoch FROM stores ORDER BY name")
            }
        }
        var records: [StoreRecord] = []
        for row in rows { records.append(try record(row, "read stores")) }
        return records
    }

    func register(_ record: StoreRecord) throws(JournalError) {
        try run("register store", store: record.name) {
            try queue.write { db in
                try db.execute(
                    sql: "INSERT INTO stores (name, domain_version, epoch) VALUES (?, ?, ?)",
                    arguments: [record.name, Int64(record.domainVersion), Int64(bitPattern: record.epoch)]
                )
                try db.execute(
                    sql: "INSERT INTO store_versions (store, version, since_seq) VALUES (?, ?, 0)",
                    arguments: [record.name, Int64(record.domainVersion)]
                )
            }
        }
    }

    func versionHistory(store: String) throws(JournalError) -> [JournalDomainVersion] {
        guard formatVersion >= 3 else {
            // Before format 3 a store had one version, from the start.
            return try storeRecord(named: store).map {
                [JournalDomainVersion(store: store, version: $0.domainVersion, sinceSeq: 0)]
            } ?? []
        }
        let rows = try run("read versions", store: store) {
            try queue.read { db in
                try Row.fetchAll(
                    db,
                    sql: "SELECT version, since_seq FROM store_versions WHERE store = ? ORDER BY version",
                    arguments: [store]
                )
            }
        }
        var versions: [JournalDomainVersion] = []
        for row in rows {
            let version = try integer(row, 0, "read versions", store)
            let since = try integer(row, 1, "read versions", store)
            guard let version = UInt32(exactly: version), let since = UInt64(exactly: since) else {
                throw corrupt("read versions", store: store, "a version row (\(version), \(since)) is out of range")
            }
            versions.append(JournalDomainVersion(store: store, version: version, sinceSeq: since))
        }
        return versions
    }

    // MARK: Snapshots and events

    func snapshotSeqs(store: String) throws(JournalError) -> [UInt64] {
        let numbers = try run("read snapshots", store: store) {
            try queue.read { db in
                try Int64.fetchAll(
                    db,
                    sql: "SELECT seq FROM snapshots WHERE store = ? ORDER BY seq",
                    arguments: [store]
                )
            }
        }
        var seqs: [UInt64] = []
        for number in numbers { seqs.append(try seq(number, "read snapshots", store)) }
        return seqs
    }

    func snapshot(store: String, seq snapshotSeq: UInt64) throws(JournalError) -> JournalSnapshot? {
        let operation = "read snapshot"
        let row = try run(operation, store: store) {
            try queue.read { db in
                try Row.fetchOne(
                    db,
                    sql: "SELECT state, digest FROM snapshots WHERE store = ? AND seq = ?",
                    arguments: [store, Int64(snapshotSeq)]
                )
            }
        }
        guard let row else { return nil }
        let digestBytes = try blob(row, 1, operation, store)
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
        return JournalSnapshot(
            store: store,
            seq: snapshotSeq,
            state: try blob(row, 0, operation, store),
            digest: digest
        )
    }

    /// The events' author column: a journal before format 5, opened read-only, has none.
    private var authorColumn: String { formatVersion >= 5 ? "author" : "''" }

    private func event(_ row: Row, store: String, _ operation: String) throws(JournalError) -> StoredEvent {
        StoredEvent(
            event: JournalEvent(
                store: store,
                seq: try seq(try integer(row, 0, operation, store), operation, store),
                action: try blob(row, 1, operation, store),
                clientID: try blob(row, 2, operation, store),
                requestNumber: UInt64(bitPattern: try integer(row, 3, operation, store)),
                author: row[5] as String? ?? ""
            ),
            storedChecksum: try integer(row, 4, operation, store)
        )
    }

    func forEachEvent(
        store: String,
        from: UInt64,
        through: UInt64,
        _ body: (StoredEvent) throws(JournalError) -> Void
    ) throws(JournalError) {
        let operation = "read events"
        try run(operation, store: store) {
            try queue.read { db in
                let rows = try Row.fetchCursor(
                    db,
                    sql: """
                        SELECT seq, action, client_id, request_number, checksum, \(authorColumn) FROM events
                        WHERE store = ? AND seq >= ? AND seq <= ? ORDER BY seq
                        """,
                    arguments: [
                        store, Int64(min(from, UInt64(Int64.max))), Int64(min(through, UInt64(Int64.max))),
                    ]
                )
                while let row = try rows.next() {
                    try body(try event(row, store: store, operation))
                }
            }
        }
    }

    func eventSummary(store: String) throws(JournalError) -> (first: UInt64, last: UInt64, count: Int)? {
        let row = try run("read events", store: store) {
            try queue.read { db in
                try Row.fetchOne(
                    db,
                    sql: "SELECT min(seq), max(seq), count(*) FROM events WHERE store = ?",
                    arguments: [store]
                )
            }
        }
        guard let row, let first = row[0] as Int64?, let last = row[1] as Int64?, let count = row[2] as Int? else {
            return nil
        }
        return (try seq(first, "read events", store), try seq(last, "read events", store), count)
    }

    func readRange(
        store: String,
        from: UInt64,
        to: UInt64,
        limit: Int,
        maximumBytes: Int
    ) throws(JournalError) -> StoredRange {
        let operation = "range"
        // One read transaction, so a compaction cannot slip between the bounds and the events. Rows are read one
        // at a time, so a reply of large actions stops at the byte budget instead of reading all of them.
        let (bounds, rows, stopped) = try run(operation, store: store) {
            try queue.read { db in
                let bounds = try Row.fetchOne(
                    db,
                    sql: """
                        SELECT (SELECT min(seq) FROM events WHERE store = ?1),
                               (SELECT max(seq) FROM events WHERE store = ?1),
                               (SELECT max(seq) FROM snapshots WHERE store = ?1)
                        """,
                    arguments: [store]
                )
                let cursor = try Row.fetchCursor(
                    db,
                    sql: """
                        SELECT seq, action, client_id, request_number, checksum, \(authorColumn) FROM events
                        WHERE store = ? AND seq >= ? AND seq <= ? ORDER BY seq LIMIT ?
                        """,
                    arguments: [store, Int64(from), Int64(to), limit]
                )
                var rows: [Row] = []
                var budget = ByteBudget(maximumBytes)
                while let row = try cursor.next(), budget.admit((row[1] as Data?)?.count ?? 0) {
                    rows.append(row.copy())
                }
                return (bounds, rows, budget.exhausted)
            }
        }
        let firstEvent = bounds?[0] as Int64?
        let lastEvent = bounds?[1] as Int64?
        let newestSnapshot = bounds?[2] as Int64?
        var events: [StoredEvent] = []
        events.reserveCapacity(rows.count)
        for row in rows { events.append(try event(row, store: store, operation)) }
        let snapshotSeq = UInt64(max(newestSnapshot ?? 0, 0))
        let first = firstEvent.map { UInt64(max($0, 0)) } ?? snapshotSeq + 1
        let last = max(UInt64(max(lastEvent ?? 0, 0)), snapshotSeq)
        return StoredRange(firstAvailable: first, lastSeq: last, events: events, stoppedAtBytes: stopped)
    }

    // MARK: Commit

    /// One transaction for the whole plan. The statements are cached and run through ``step(_:in:_:)``: on
    /// this path GRDB's argument boxing and the parsing of uncached statements cost more than SQLite's own
    /// inserts (docs/performance.md).
    func write(_ plan: CommitPlan) throws(JournalError) {
        try run("commit") {
            try queue.inDatabase { db in
                try db.cachedStatement(sql: "BEGIN IMMEDIATE").execute()
                do {
                    try write(plan, in: db)
                    try db.cachedStatement(sql: "COMMIT").execute()
                } catch {
                    if sqlite3_get_autocommit(db.sqliteConnection) == 0 {
                        try? db.cachedStatement(sql: "ROLLBACK").execute()
                    }
                    throw error
                }
            }
        }
    }

    private func write(_ plan: CommitPlan, in db: Database) throws {
        try writeRows(plan, in: db)
        try writeOutbox(plan.batch, in: db)
    }

    private func writeRows(_ plan: CommitPlan, in db: Database) throws {
        if !plan.batch.events.isEmpty {
            let insert = try db.cachedStatement(
                sql: """
                    INSERT INTO events (store, seq, action, client_id, request_number, checksum, author)
                    VALUES (?, ?, ?, ?, ?, ?, ?)
                    """
            )
            for event in plan.batch.events {
                try Self.step(insert, in: db) { values in
                    values.text(event.store, at: 1)
                    values.int64(Int64(event.seq), at: 2)
                    values.blob(event.action, at: 3)
                    values.blob(event.clientID, at: 4)
                    values.int64(Int64(bitPattern: event.requestNumber), at: 5)
                    values.int64(Int64(event.checksum), at: 6)
                    values.text(event.author, at: 7)
                }
            }
        }
        for snapshot in plan.batch.snapshots {
            let insert = try db.cachedStatement(
                // OR REPLACE only for an upgrade, whose snapshot replaces the older version's at the same seq; any
                // other snapshot must be new, and the UNIQUE constraint says so if it is not.
                sql: plan.upgrades.isEmpty
                    ? "INSERT INTO snapshots (store, seq, state, digest) VALUES (?, ?, ?, ?)"
                    : "INSERT OR REPLACE INTO snapshots (store, seq, state, digest) VALUES (?, ?, ?, ?)"
            )
            try Self.step(insert, in: db) { values in
                values.text(snapshot.store, at: 1)
                values.int64(Int64(snapshot.seq), at: 2)
                values.blob(snapshot.state, at: 3)
                values.blob(snapshot.digest.bytes, at: 4)
            }
        }
        for compaction in plan.compactions {
            for sql in [
                "DELETE FROM snapshots WHERE store = ? AND seq < ?", "DELETE FROM events WHERE store = ? AND seq <= ?",
            ] {
                try Self.step(try db.cachedStatement(sql: sql), in: db) { values in
                    values.text(compaction.store, at: 1)
                    values.int64(Int64(compaction.throughSeq), at: 2)
                }
            }
        }
        for upgrade in plan.upgrades {
            try db.execute(
                sql: "UPDATE stores SET domain_version = ? WHERE name = ?",
                arguments: [Int64(upgrade.version), upgrade.store]
            )
            try db.execute(
                sql: "INSERT INTO store_versions (store, version, since_seq) VALUES (?, ?, ?)",
                arguments: [upgrade.store, Int64(upgrade.version), Int64(upgrade.sinceSeq)]
            )
        }
        guard !plan.batch.idempotency.isEmpty else { return }
        let insert = try db.cachedStatement(
            sql: """
                INSERT INTO idempotency (client_id, request_number, fingerprint, reply)
                VALUES (?, ?, ?, ?)
                ON CONFLICT (request_number, client_id)
                DO UPDATE SET fingerprint = excluded.fingerprint, reply = excluded.reply
                """
        )
        for record in plan.batch.idempotency {
            try Self.step(insert, in: db) { values in
                values.blob(record.key.clientID, at: 1)
                values.int64(Int64(bitPattern: record.key.requestNumber), at: 2)
                values.blob(record.fingerprint, at: 3)
                values.blob(record.reply, at: 4)
            }
        }
        // Positions are contiguous (an entry replaced keeps its own), so this keeps exactly the newest N.
        let trim = try db.cachedStatement(
            sql: "DELETE FROM idempotency WHERE position <= (SELECT max(position) FROM idempotency) - ?"
        )
        try Self.step(trim, in: db) { $0.int64(Int64(plan.idempotencyKept), at: 1) }
    }

    /// The batch's outbox changes, in the same transaction as its events.
    private func writeOutbox(_ batch: JournalBatch, in db: Database) throws {
        if !batch.effects.isEmpty {
            let insert = try db.cachedStatement(
                sql: """
                    INSERT INTO effects (store, seq, idx, body, attempts, last_error, dead, checksum)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                    """
            )
            for effect in batch.effects {
                try Self.step(insert, in: db) { values in
                    values.text(effect.store, at: 1)
                    values.int64(Int64(effect.seq), at: 2)
                    values.int64(Int64(effect.index), at: 3)
                    values.blob(effect.body, at: 4)
                    values.int64(Int64(effect.attempts), at: 5)
                    values.optionalText(effect.lastError, at: 6)
                    values.int64(effect.dead ? 1 : 0, at: 7)
                    values.int64(Int64(effect.checksum), at: 8)
                }
            }
        }
        for update in batch.effectUpdates {
            let sql: String
            switch update.change {
            case .done, .drop: sql = "DELETE FROM effects WHERE store = ?1 AND seq = ?2 AND idx = ?3"
            case .failed:
                sql =
                    "UPDATE effects SET attempts = ?4, last_error = ?5, dead = ?6 WHERE store = ?1 AND seq = ?2 AND idx = ?3"
            case .retry: sql = "UPDATE effects SET attempts = 0, dead = 0 WHERE store = ?1 AND seq = ?2 AND idx = ?3"
            }
            try Self.step(try db.cachedStatement(sql: sql), in: db) { values in
                values.text(update.id.store, at: 1)
                values.int64(Int64(update.id.seq), at: 2)
                values.int64(Int64(update.id.index), at: 3)
                if case let .failed(attempts, error, dead) = update.change {
                    values.int64(Int64(attempts), at: 4)
                    values.text(error, at: 5)
                    values.int64(dead ? 1 : 0, at: 6)
                }
            }
        }
        for change in batch.timerChanges {
            switch change {
            case let .set(timer):
                let upsert = try db.cachedStatement(
                    sql: """
                        INSERT OR REPLACE INTO timers (store, key, due_ms, action, seq, idx, checksum)
                        VALUES (?, ?, ?, ?, ?, ?, ?)
                        """
                )
                try Self.step(upsert, in: db) { values in
                    values.text(timer.store, at: 1)
                    values.text(timer.key, at: 2)
                    values.int64(timer.dueMilliseconds, at: 3)
                    values.blob(timer.action, at: 4)
                    values.int64(Int64(timer.seq), at: 5)
                    values.int64(Int64(timer.index), at: 6)
                    values.int64(Int64(timer.checksum), at: 7)
                }
            case let .remove(store, key):
                let delete = try db.cachedStatement(sql: "DELETE FROM timers WHERE store = ? AND key = ?")
                try Self.step(delete, in: db) { values in
                    values.text(store, at: 1)
                    values.text(key, at: 2)
                }
            }
        }
    }

    func storedOutbox() throws(JournalError) -> (
        effects: [(JournalEffect, Int64)], timers: [(JournalTimer, Int64)]
    ) {
        guard formatVersion >= 4 else { return ([], []) }
        return try run("outbox") {
            try queue.read { db in
                let effects = try Row.fetchAll(
                    db,
                    sql: """
                        SELECT store, seq, idx, body, attempts, last_error, dead, checksum FROM effects
                        ORDER BY store, seq, idx
                        """
                ).map { row in
                    let effect = JournalEffect(
                        store: row[0],
                        seq: UInt64(max(row[1] as Int64, 0)),
                        index: Int(row[2] as Int64),
                        body: Array((row[3] as Data?) ?? Data()),
                        attempts: Int(row[4] as Int64),
                        lastError: row[5],
                        dead: (row[6] as Int64) != 0
                    )
                    return (effect, row[7] as Int64)
                }
                let timers = try Row.fetchAll(
                    db,
                    sql: "SELECT store, key, due_ms, action, seq, idx, checksum FROM timers ORDER BY store, key"
                ).map { row in
                    let timer = JournalTimer(
                        store: row[0],
                        key: row[1],
                        dueMilliseconds: row[2],
                        action: Array((row[3] as Data?) ?? Data()),
                        seq: UInt64(max(row[4] as Int64, 0)),
                        index: Int(row[5] as Int64)
                    )
                    return (timer, row[6] as Int64)
                }
                return (effects, timers)
            }
        }
    }

    /// Runs `statement` once with the values `bind` sets: every C call of the commit path goes through here, and
    /// every one's result is checked. A failure (a bind SQLite refused, a step that did not finish) becomes GRDB's
    /// `DatabaseError`, which ``map(_:file:operation:store:)`` explains.
    private static func step(_ statement: Statement, in db: Database, _ bind: (inout Values) -> Void) throws {
        let handle = statement.sqliteStatement
        var values = Values(handle: handle)
        // sqlite3_reset returns the outcome of the statement's last step again, which was reported then (a
        // statement whose step failed once would otherwise be refused for ever): its result says nothing new.
        _ = sqlite3_reset(handle)
        bind(&values)
        let code = values.code == SQLITE_OK ? sqlite3_step(handle) : values.code
        let message = code == SQLITE_DONE ? nil : String(cString: sqlite3_errmsg(db.sqliteConnection))
        _ = sqlite3_reset(handle)
        _ = sqlite3_clear_bindings(handle)
        if let message {
            let what = values.code == SQLITE_OK ? "" : " (binding parameter \(values.failedIndex))"
            throw DatabaseError(resultCode: ResultCode(rawValue: code), message: message + what, sql: statement.sql)
        }
    }

    /// Binds a statement's parameters, keeping the first failure: ``step(_:in:_:)`` checks it before stepping.
    struct Values {
        let handle: SQLiteStatement
        private(set) var code = SQLITE_OK
        private(set) var failedIndex: Int32 = 0

        init(handle: SQLiteStatement) { self.handle = handle }

        mutating func int64(_ value: Int64, at index: Int32) {
            check(sqlite3_bind_int64(handle, index, value), index)
        }

        /// SQLite copies the bytes (SQLITE_TRANSIENT); an empty blob is bound as a zero-length blob, not NULL.
        mutating func blob(_ bytes: [UInt8], at index: Int32) {
            let result = bytes.withUnsafeBytes { buffer in
                if let base = buffer.baseAddress {
                    sqlite3_bind_blob(handle, index, base, Int32(buffer.count), transient)
                } else {
                    sqlite3_bind_zeroblob(handle, index, 0)
                }
            }
            check(result, index)
        }

        mutating func text(_ text: String, at index: Int32) {
            check(sqlite3_bind_text(handle, index, text, -1, transient), index)
        }

        mutating func optionalText(_ text: String?, at index: Int32) {
            guard let text else { return check(sqlite3_bind_null(handle, index), index) }
            self.text(text, at: index)
        }

        private mutating func check(_ result: Int32, _ index: Int32) {
            guard result != SQLITE_OK, code == SQLITE_OK else { return }
            code = result
            failedIndex = index
        }
    }

    /// SQLITE_TRANSIENT, which the C header defines as a cast the importer cannot bring over.
    private static let transient = unsafeBitCast(OpaquePointer(bitPattern: -1), to: sqlite3_destructor_type.self)

    // MARK: Idempotency

    private func idempotency(_ row: Row, _ operation: String) throws(JournalError) -> IdempotencyRecord {
        IdempotencyRecord(
            key: IdempotencyKey(
                clientID: try blob(row, 0, operation, nil),
                requestNumber: UInt64(bitPattern: try integer(row, 1, operation, nil))
            ),
            fingerprint: try blob(row, 2, operation, nil),
            reply: try blob(row, 3, operation, nil)
        )
    }

    func idempotencyRecord(for key: IdempotencyKey) throws(JournalError) -> IdempotencyRecord? {
        let operation = "read idempotency"
        let row = try run(operation) {
            try queue.read { db in
                try Row.fetchOne(
                    db,
                    sql: """
                        SELECT client_id, request_number, fingerprint, reply FROM idempotency
                        WHERE client_id = ? AND request_number = ?
                        """,
                    arguments: [Data(key.clientID), Int64(bitPattern: key.requestNumber)]
                )
            }
        }
        guard let row else { return nil }
        return try idempotency(row, operation)
    }

    func forEachIdempotencyRecord(
        _ body: (IdempotencyRecord) throws(JournalError) -> Void
    ) throws(JournalError) {
        let operation = "read idempotency"
        try run(operation) {
            try queue.read { db in
                let rows = try Row.fetchCursor(
                    db,
                    sql: "SELECT client_id, request_number, fingerprint, reply FROM idempotency ORDER BY position"
                )
                while let row = try rows.next() { try body(try idempotency(row, operation)) }
            }
        }
    }

    func idempotencyCount() throws(JournalError) -> Int {
        try run("read idempotency") {
            try queue.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM idempotency") ?? 0 }
        }
    }

    // MARK: Integrity

    func integrityProblems() throws(JournalError) -> [String] {
        let lines = try run("verify") {
            try queue.read { db in try String.fetchAll(db, sql: "PRAGMA integrity_check") }
        }
        return lines == ["ok"] ? [] : lines.map { "SQLite integrity check: \($0)" }
    }

    func close() throws(JournalError) {
        try run("close") { try queue.close() }
        writerLock?.release()
        removeWhatReadingMade()
    }

    /// Removes the `-wal` and `-shm` a read-only open made, under the writer's lock (a daemon that starts meanwhile
    /// waits for it), and only while the `-wal` is empty: a writer that came and went since leaves them be.
    private func removeWhatReadingMade() {
        guard !madeByReading.isEmpty else { return }
        let directory = URL(fileURLWithPath: location).deletingLastPathComponent().path
        guard let lock = try? WriterLock(directory: directory, journal: location) else { return }
        defer { lock.release() }
        let wal = location + "-wal"
        let walSize = (try? FileManager.default.attributesOfItem(atPath: wal)[.size] as? Int) ?? 0
        guard walSize == 0 else { return }
        for file in madeByReading { unlink(file) }
    }
}

/// The one writer of a data directory: an exclusive `flock` on `journal.lock` beside the journal, held from open
/// to close. Two daemons on one directory would interleave commits — and since a daemon may upgrade a store at
/// start, one could rewrite history under the other. The kernel releases it when the process dies, kill -9
/// included, so a crash never leaves the directory locked.
final class WriterLock: Sendable {
    static let fileName = "journal.lock"
    private let descriptor = LockedValue<Int32>(-1)

    /// Takes the lock on `directory`, or throws ``JournalError/Code/inUse`` at once when another holds it.
    init(directory: String, journal: String) throws(JournalError) {
        let path = URL(fileURLWithPath: directory).appendingPathComponent(Self.fileName).path
        var fd: Int32
        fd = interruptible { open(path, O_CREAT | O_RDWR | O_CLOEXEC, 0o600) }
        guard fd >= 0 else { throw JournalFiles.ioError(journal, "open", "cannot open the lock file \(path)") }
        // Tried for up to a second: a process that forks (to start a child) holds a copy of its descriptors, this
        // lock's included, until the child execs, so a journal closed a moment ago may still look held.
        var result: Int32
        let deadline = ContinuousClock.now + .seconds(1)
        while true {
            result = interruptible { flock(fd, LOCK_EX | LOCK_NB) }
            if result == 0 { break }
            guard errno == EWOULDBLOCK, ContinuousClock.now < deadline else { break }
            usleep(10_000)
        }
        guard result == 0 else {
            let busy = errno == EWOULDBLOCK
            closeDescriptor(fd)
            guard busy else { throw JournalFiles.ioError(journal, "open", "cannot lock \(path)") }
            throw JournalError(
                code: .inUse,
                file: journal,
                operation: "open",
                message: "another process has this journal open for writing (\(path) is locked): one daemon per data "
                    + "directory; stop the other one, or open the journal read-only (journal verify, dump, stats "
                    + "and state do)"
            )
        }
        descriptor.withLockedValue { $0 = fd }
    }

    /// Lets the next writer in; harmless twice.
    func release() {
        let fd = descriptor.withLockedValue { fd in
            defer { fd = -1 }
            return fd
        }
        if fd >= 0 { closeDescriptor(fd) }
    }

    deinit { release() }
}
