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
#elseif canImport(Darwin)
import Darwin
#endif

/// The three journals every behavioural test runs against.
enum JournalKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case sqlite
    case memory
    case postgres
    case log

    var testDescription: String { rawValue }
}

/// One PostgreSQL server for the whole test run, started by the first test that needs it and stopped when the
/// test process exits; each fixture has a database of its own on it. `initdb` and the start run off the
/// cooperative pool, and the tests that wait for them meanwhile suspend rather than hold its threads.
enum SharedPostgres {
    /// The server, once started; every caller awaits the one start, and gets its error if it failed.
    static var server: PostgresServer {
        get async throws { try await starting.value }
    }

    private static let starting = Task<PostgresServer, any Error> {
        let server = try await PostgresServer.start()
        started.withLockedValue { $0 = server }
        return server
    }

    /// The server once started, for the stop at exit.
    private static let started: LockedValue<PostgresServer?> = {
        atexit { SharedPostgres.started.withLockedValue { $0?.stop() } }
        return LockedValue(nil)
    }()
}

/// A journal of one kind in a fresh temporary directory (for PostgreSQL, a fresh database), which it removes when
/// dropped.
final class JournalFixture {
    let kind: JournalKind
    let policy: JournalPolicy
    let directory: URL
    private var memory: InMemoryJournal?
    /// The shared PostgreSQL server, for a PostgreSQL journal.
    private let server: PostgresServer?
    /// The PostgreSQL database's connection string.
    let connection: String?

    /// A fixture of `kind`; for PostgreSQL it waits for the shared server and makes a database on it without holding
    /// a thread of the cooperative pool.
    init(_ kind: JournalKind, policy: JournalPolicy = JournalPolicy()) async throws {
        self.kind = kind
        self.policy = policy
        directory = try temporaryDirectory("journal-\(kind.rawValue)")
        if kind == .postgres {
            let server = try await SharedPostgres.server
            self.server = server
            connection = try await offPool("create database") { try server.createDatabase() }
        } else {
            server = nil
            connection = nil
        }
    }

    deinit {
        try? FileManager.default.removeItem(at: directory)
        if let connection, let server, let name = connection.split(separator: "=").last {
            try? server.dropDatabase(String(name))
        }
    }

    /// The data directory (absent until a SQLite journal is first opened).
    var dataDirectory: String { directory.appendingPathComponent("data").path }

    /// Opens the journal: a new connection to the same file, or for memory a new journal over the same
    /// contents — in both cases what a restarted daemon would see.
    func open() throws -> any Journal {
        switch kind {
        case .sqlite:
            return try SQLiteJournal(directory: dataDirectory, policy: policy)
        case .memory:
            let journal = memory?.reopened() ?? InMemoryJournal(policy: policy)
            memory = journal
            return journal
        case .postgres:
            return try PostgresJournal(connection: connection!, policy: policy)
        case .log:
            // Rewritten once past 4 KiB (64 MiB by default): every test's history goes through a rewrite or two.
            return try LogJournal(directory: dataDirectory, policy: policy, rewriteMinimumBytes: 4_096)
        }
    }

    /// Changes the journal's database behind its back: `sql` on SQLite's file or on the PostgreSQL database.
    func tamper(_ sql: String) throws {
        switch kind {
        case .sqlite: try LockstepJournalTests.tamper(self) { try $0.execute(sql: sql) }
        case .postgres: _ = try PostgresJournal.execute(sql, connection: connection!)
        case .memory, .log: Issue.record("an in-memory or log journal cannot be changed by SQL")
        }
    }
}

let clientA = [UInt8](repeating: 0xA1, count: 16)
let clientB = [UInt8](repeating: 0xB2, count: 16)

/// The encoded bytes of an action.
func encoded<Action: Encodable>(_ action: Action) -> [UInt8] {
    Array(try! CanonicalEncoding.encode(action))
}

/// Events `first…first+count-1` of `store`, request number = seq.
func events<Action: Encodable>(
    _ store: String,
    from first: UInt64,
    count: Int,
    client: [UInt8] = clientA,
    action: (UInt64) -> Action
) -> [JournalEvent] {
    (0..<UInt64(count)).map { offset in
        let seq = first + offset
        return JournalEvent(store: store, seq: seq, action: encoded(action(seq)), clientID: client, requestNumber: seq)
    }
}

/// An idempotency entry per event, the reply being the seq.
func idempotency(for events: [JournalEvent], replySize: Int = 8) -> [IdempotencyRecord] {
    events.map { event in
        var reply = withUnsafeBytes(of: event.seq.bigEndian) { Array($0) }
        if replySize > reply.count { reply += [UInt8](repeating: 0x5A, count: replySize - reply.count) }
        return IdempotencyRecord(
            key: IdempotencyKey(clientID: event.clientID, requestNumber: event.requestNumber),
            fingerprint: event.action,
            reply: reply
        )
    }
}

/// `batches` commits of 5 counter increments after `seq`, each with its idempotency entries and a snapshot when the
/// journal is due one; `state` follows them. Returns the last seq.
func commitIncrements(
    _ journal: any Journal,
    after seq: UInt64,
    state: inout Counter.State,
    batches: Int
) throws -> UInt64 {
    var seq = seq
    for _ in 0..<batches {
        let batch = events(Counter.name, from: seq + 1, count: 5) { _ in Counter.Action.increment }
        for _ in batch { Counter.reduce(into: &state, .increment) }
        seq += 5
        var commit = JournalBatch(events: batch, idempotency: idempotency(for: batch))
        if journal.snapshotDue(store: Counter.name, in: commit) {
            commit.snapshots = [try JournalSnapshot(store: Counter.name, seq: seq, encoding: state)]
        }
        try journal.commit(commit)
    }
    return seq
}

/// The counter domain at another version, to test the refusal of a store written by the first.
enum CounterV2: Domain {
    typealias State = Counter.State
    typealias Action = Counter.Action
    static let name = Counter.name
    static let version: UInt32 = 2
    static var initialState: State { Counter.initialState }
    static func reduce(into state: inout State, _ action: Action) { Counter.reduce(into: &state, action) }
}

/// Runs `body`, which must throw a ``JournalError``, and returns that error.
func journalError(_ body: () throws -> Void, sourceLocation: SourceLocation = #_sourceLocation) -> JournalError? {
    do {
        try body()
        Issue.record("expected a JournalError, but nothing was thrown", sourceLocation: sourceLocation)
        return nil
    } catch let error as JournalError {
        return error
    } catch {
        Issue.record("expected a JournalError, got \(error)", sourceLocation: sourceLocation)
        return nil
    }
}

/// The SQLite file behind a fixture's journal.
func file(_ fixture: JournalFixture) -> String {
    URL(fileURLWithPath: fixture.dataDirectory).appendingPathComponent(SQLiteJournal.fileName).path
}

/// Changes the file behind the journal's back.
func tamper(_ fixture: JournalFixture, _ change: (Database) throws -> Void) throws {
    let queue = try DatabaseQueue(path: file(fixture))
    try queue.write(change)
    try queue.close()
}
