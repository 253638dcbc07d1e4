import Foundation
import GRDB
import Lockstep
import LockstepExamples
import LockstepJournal
import Testing

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The two journals every behavioural test runs against.
enum JournalKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case sqlite
    case memory

    var testDescription: String { rawValue }
}

/// A journal of one kind in a fresh temporary directory, which it removes when dropped.
final class JournalFixture {
    let kind: JournalKind
    let policy: JournalPolicy
    let directory: URL
    private var memory: InMemoryJournal?

    init(_ kind: JournalKind, policy: JournalPolicy = JournalPolicy()) throws {
        self.kind = kind
        self.policy = policy
        directory = try temporaryDirectory("journal-\(kind.rawValue)")
    }

    deinit {
        try? FileManager.default.removeItem(at: directory)
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
        }
    }
}

/// A new empty directory under the system's temporary directory.
func temporaryDirectory(_ label: String) throws -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("lockstep-\(label)-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
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

// MARK: Child processes

/// One of this package's executables, built next to the test bundle.
func productURL(_ name: String) -> URL {
    let productsDirectory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    let executable = productsDirectory.appendingPathComponent(name)
    if FileManager.default.isExecutableFile(atPath: executable.path) { return executable }
    // swift-testing may run from inside the .xctest bundle.
    return productsDirectory.deletingLastPathComponent().appendingPathComponent(name)
}

struct ProcessOutput {
    var status: Int32
    var standardOutput: String
    var standardError: String
}

struct ProcessTimeout: Error, CustomStringConvertible {
    var command: String
    var description: String { "\(command) did not finish in time and was killed" }
}

/// Runs one of this package's executables to its end, waiting at most `timeout`.
func runProduct(_ name: String, _ arguments: [String], timeout: Duration = .seconds(60)) throws -> ProcessOutput {
    let child = try ChildProcess(name, arguments)
    defer { child.kill() }
    let deadline = ContinuousClock.now + timeout
    while !child.reachedEndOfOutput {
        guard ContinuousClock.now < deadline else {
            throw ProcessTimeout(command: "\(name) \(arguments.joined(separator: " "))")
        }
        child.read(for: .milliseconds(100))
    }
    guard let status = child.waitForExit(within: deadline - ContinuousClock.now) else {
        throw ProcessTimeout(command: "\(name) \(arguments.joined(separator: " "))")
    }
    return ProcessOutput(
        status: status,
        standardOutput: String(decoding: child.output, as: UTF8.self),
        standardError: child.errors()
    )
}

/// A child process whose standard output is read with bounded waits; its standard error goes to a file.
final class ChildProcess {
    let process = Process()
    private let stdout = Pipe()
    private let errorFile: URL
    private(set) var output: [UInt8] = []
    private(set) var reachedEndOfOutput = false
    private var consumed = 0

    init(_ name: String, _ arguments: [String]) throws {
        errorFile = FileManager.default.temporaryDirectory.appendingPathComponent("lockstep-child-\(UUID().uuidString)")
        guard FileManager.default.createFile(atPath: errorFile.path, contents: nil) else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: errorFile.path])
        }
        process.executableURL = productURL(name)
        process.arguments = arguments
        process.standardOutput = stdout
        process.standardError = try FileHandle(forWritingTo: errorFile)
        process.standardInput = FileHandle.nullDevice
        try process.run()
    }

    deinit {
        kill()
        try? FileManager.default.removeItem(at: errorFile)
    }

    /// Waits up to `timeout` for output and takes what has arrived.
    func read(for timeout: Duration) {
        guard !reachedEndOfOutput else { return }
        let fd = stdout.fileHandleForReading.fileDescriptor
        var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let milliseconds = Int32(max(0, min(timeout / .milliseconds(1), 60_000)))
        guard poll(&descriptor, 1, milliseconds) > 0 else { return }
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        let count = Glibc.read(fd, &buffer, buffer.count)
        if count > 0 {
            output += buffer[..<count]
        } else if count == 0 {
            reachedEndOfOutput = true
        }
    }

    /// The complete lines that arrived since the last call.
    func takeLines() -> [String] {
        guard let end = output.lastIndex(of: UInt8(ascii: "\n")), end >= consumed else { return [] }
        let text = String(decoding: output[consumed..<end], as: UTF8.self)
        consumed = end + 1
        return text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
    }

    /// The exit status, or `nil` if the process is still running after `timeout`.
    func waitForExit(within timeout: Duration) -> Int32? {
        let deadline = ContinuousClock.now + timeout
        while process.isRunning {
            guard ContinuousClock.now < deadline else { return nil }
            Thread.sleep(forTimeInterval: 0.002)
        }
        return process.terminationStatus
    }

    /// Sends SIGKILL (if it still runs) and reaps it, waiting at most 10 s.
    func kill() {
        if process.isRunning { _ = Glibc.kill(process.processIdentifier, SIGKILL) }
        _ = waitForExit(within: .seconds(10))
    }

    /// What the process wrote to standard error.
    func errors() -> String {
        (try? String(contentsOf: errorFile, encoding: .utf8)) ?? ""
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
