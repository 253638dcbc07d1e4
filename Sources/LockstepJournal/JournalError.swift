/// Why the journal refused or failed an operation: a stable ``Code`` for programs and the context a person
/// needs — the file or database, the operation, the store and seq when one is involved, and SQLite's or
/// PostgreSQL's own words when the database reported the failure.
///
/// After any error from ``Journal/commit(_:)`` nothing of the batch counts, and the journal stays usable.
public struct JournalError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What kind of failure this is. New codes may be added; match the ones you handle and treat the rest
    /// as a failure to report.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private enum Base: String, Hashable, Sendable {
            case storageFull = "storage_full"
            case ioError = "io_error"
            case readOnly = "read_only"
            case corrupt
            case sqlite
            case notFound = "not_found"
            case notAJournal = "not_a_journal"
            case formatVersionMismatch = "format_version_mismatch"
            case domainVersionMismatch = "domain_version_mismatch"
            case unknownStore = "unknown_store"
            case invalidBatch = "invalid_batch"
            case invalidArgument = "invalid_argument"
            case checksumMismatch = "checksum_mismatch"
            case sequenceGap = "sequence_gap"
            case digestMismatch = "digest_mismatch"
            case undecodableState = "undecodable_state"
            case undecodableAction = "undecodable_action"
            case inUse = "in_use"
            case postgres
            case unreachable
            case fenced
        }

        private let base: Base
        private init(_ base: Base) { self.base = base }

        /// The disk (or the in-memory journal's capacity, or SQLite's `max_page_count`) is full.
        public static let storageFull = Code(.storageFull)
        /// The operating system or SQLite reported an I/O error.
        public static let ioError = Code(.ioError)
        /// The journal was opened read-only, or its file or directory cannot be written.
        public static let readOnly = Code(.readOnly)
        /// SQLite found the file damaged (`SQLITE_CORRUPT`, `SQLITE_NOTADB`).
        public static let corrupt = Code(.corrupt)
        /// Any other SQLite failure; ``JournalError/sqliteCode`` and ``JournalError/sqliteMessage`` say which.
        public static let sqlite = Code(.sqlite)
        /// There is no journal where one was expected.
        public static let notFound = Code(.notFound)
        /// The file is an SQLite database, but not a Lockstep journal.
        public static let notAJournal = Code(.notAJournal)
        /// Another process (or another journal in this one) has the journal open for writing.
        public static let inUse = Code(.inUse)
        /// Any other PostgreSQL failure; ``JournalError/postgresState`` and ``JournalError/postgresMessage`` say
        /// which.
        public static let postgres = Code(.postgres)
        /// The PostgreSQL server cannot be reached, or the connection to it was lost.
        public static let unreachable = Code(.unreachable)
        /// Another daemon took the PostgreSQL journal's lease (``JournalError/term`` is its term), or this journal
        /// never held it: the commit or renewal was refused, nothing of it was kept, and the journal leads no more.
        public static let fenced = Code(.fenced)
        /// The journal was written in a format this build does not read.
        public static let formatVersionMismatch = Code(.formatVersionMismatch)
        /// The store was written by another version of its domain.
        public static let domainVersionMismatch = Code(.domainVersionMismatch)
        /// The store is not known to the journal, or was not recovered before a commit named it.
        public static let unknownStore = Code(.unknownStore)
        /// The batch breaks a rule of the journal (seqs not contiguous, a snapshot not at the last seq, …).
        public static let invalidBatch = Code(.invalidBatch)
        /// An argument is out of range.
        public static let invalidArgument = Code(.invalidArgument)
        /// A stored event's bytes do not match its checksum.
        public static let checksumMismatch = Code(.checksumMismatch)
        /// A store's seqs are not contiguous.
        public static let sequenceGap = Code(.sequenceGap)
        /// A stored snapshot's bytes do not match its digest.
        public static let digestMismatch = Code(.digestMismatch)
        /// A snapshot's state bytes do not decode as the domain's state.
        public static let undecodableState = Code(.undecodableState)
        /// An event's action bytes do not decode as the domain's action.
        public static let undecodableAction = Code(.undecodableAction)

        /// The code as a stable snake_case word, e.g. `checksum_mismatch`.
        public var description: String { base.rawValue }
    }

    /// What kind of failure this is.
    public var code: Code
    /// The journal's file, `memory` for ``InMemoryJournal``, or the database (never its password) for
    /// ``PostgresJournal``.
    public var file: String
    /// What the journal was doing: `open`, `recover`, `commit`, `range`, `verify`, …
    public var operation: String
    /// The store involved, if one is.
    public var store: String?
    /// The seq involved, if one is.
    public var seq: UInt64?
    /// SQLite's extended result code, when SQLite reported the failure.
    public var sqliteCode: Int32?
    /// SQLite's message, when SQLite reported the failure.
    public var sqliteMessage: String?
    /// PostgreSQL's SQLSTATE (e.g. `23505`), when the server reported the failure.
    public var postgresState: String?
    /// PostgreSQL's or libpq's message, when PostgreSQL reported the failure.
    public var postgresMessage: String?
    /// The lease term that superseded this journal's, for ``Code/fenced`` when the lease row could be read.
    public var term: UInt64?
    /// What failed, with which value, and what to do.
    public var message: String

    /// An error with its full context.
    public init(
        code: Code,
        file: String,
        operation: String,
        store: String? = nil,
        seq: UInt64? = nil,
        sqliteCode: Int32? = nil,
        sqliteMessage: String? = nil,
        postgresState: String? = nil,
        postgresMessage: String? = nil,
        term: UInt64? = nil,
        message: String
    ) {
        self.code = code
        self.file = file
        self.operation = operation
        self.store = store
        self.seq = seq
        self.sqliteCode = sqliteCode
        self.sqliteMessage = sqliteMessage
        self.postgresState = postgresState
        self.postgresMessage = postgresMessage
        self.term = term
        self.message = message
    }

    /// The file, the operation, the store and seq when known, the message, SQLite's or PostgreSQL's code and words
    /// when it reported the failure, and the code: the line a log or the command-line tool shows.
    public var description: String {
        var text = "journal \(file): \(operation)"
        if let store { text += ", store \(store)" }
        if let seq { text += ", seq \(seq)" }
        text += ": \(message)"
        if let sqliteCode {
            text += " (SQLite error \(sqliteCode)" + (sqliteMessage.map { ": \($0)" } ?? "") + ")"
        }
        if let postgresMessage {
            text += " (PostgreSQL" + (postgresState.map { " SQLSTATE \($0)" } ?? "") + ": \(postgresMessage))"
        }
        return text + " [\(code)]"
    }
}
