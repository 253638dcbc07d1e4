import ArgumentParser
import Foundation
import Lockstep
import LockstepJournal
import LockstepProtocol

/// `lockstep journal …`: look into a data directory's journal without the daemon's help.
package struct JournalCommand: ParsableCommand {
    package static var configuration: CommandConfiguration {
        CommandConfiguration(
            commandName: "journal",
            abstract: "Check, dump and describe a daemon's journal; rebuild a store's state at any seq.",
            discussion: """
                DIR is the daemon's data directory; the journal is DIR/\(SQLiteJournal.fileName), or \
                DIR/\(LogJournal.fileName) and DIR/snapshots for a log journal (journal = "log"). verify, dump \
                and stats take --postgres CONNINFO instead of DIR for a PostgreSQL journal. verify, dump, stats, \
                state and backup open it read-only and may run while the daemon runs. See docs/operations.md, "The \
                journal".
                """,
            subcommands: [
                JournalVerifyCommand.self, JournalDumpCommand.self, JournalStatsCommand.self, JournalStateCommand.self,
                JournalBackupCommand.self, JournalConvertCommand.self,
            ]
                + Tool.current.withLockedValue { $0.journalCommands }
        )
    }

    package init() {}

    /// `lockstep journal verify` found the journal damaged.
    package static let damaged = ExitCode(5)
}

/// Opens `directory`'s journal, or the PostgreSQL journal at `postgres` when given, turning a failure into a
/// message and an exit code.
package func openJournal(
    _ directory: String,
    postgres: String? = nil,
    command: String,
    readOnly: Bool,
    policy: JournalPolicy = JournalPolicy(),
    log: Bool = false
) throws -> any Journal {
    do {
        if let postgres { return try PostgresJournal(connection: postgres, policy: policy, readOnly: readOnly) }
        return try openLocalJournal(directory: directory, policy: policy, readOnly: readOnly, log: log)
    } catch {
        printError("\(Tool.commandName) journal \(command): \(error)")
        switch error.code {
        case .notFound: throw ExitCode.failure
        case .corrupt, .notAJournal, .formatVersionMismatch: throw JournalCommand.damaged
        default: throw ExitCode.failure
        }
    }
}

/// `journal`'s problems as `verify` finds them (a failure to read it is one), and its stores when it could be read.
func checked(_ journal: any Journal) -> (problems: [JournalProblem], stores: [JournalStoreStats]) {
    do {
        return (try journal.verify(), try journal.stats().stores)
    } catch {
        return ([JournalProblem(code: error.code, store: error.store, seq: error.seq, message: error.message)], [])
    }
}

/// Prints a copy's problems and exits 5 (``JournalCommand/damaged``) when it has any; else prints `what`, intact, with
/// each store's seq.
func report(
    _ copy: any Journal,
    _ problems: [JournalProblem],
    _ stores: [JournalStoreStats],
    as what: String
) throws {
    guard problems.isEmpty else {
        for problem in problems { print("journal \(copy.location): \(problem)") }
        throw JournalCommand.damaged
    }
    let seqs = stores.map { "\($0.name) at seq \($0.lastSeq)" }.joined(separator: ", ")
    print("\(what): intact (\(seqs.isEmpty ? "no stores" : seqs))")
}

/// Where a read-only command finds the journal: a data directory, or a PostgreSQL database.
struct JournalLocation: ParsableArguments {
    @Argument(help: "The data directory (not with --postgres).")
    var directory: String?

    @Option(name: .long, help: "A PostgreSQL journal's libpq connection string, instead of DIR.")
    var postgres: String?

    func validate() throws {
        guard (directory == nil) != (postgres == nil) else {
            throw ValidationError("give the data directory DIR or --postgres CONNINFO (one of them)")
        }
    }

    func open(command: String) throws -> any Journal {
        try openJournal(directory ?? "", postgres: postgres, command: command, readOnly: true)
    }
}

/// Writes to standard output in large unbuffered chunks.
private struct OutputBuffer {
    private var data = Data()

    mutating func append(_ line: String) {
        data.append(contentsOf: line.utf8)
        data.append(UInt8(ascii: "\n"))
        if data.count > 1 << 16 { flush() }
    }

    mutating func flush() {
        guard !data.isEmpty else { return }
        FileHandle.standardOutput.write(data)
        data.removeAll(keepingCapacity: true)
    }
}

struct JournalVerifyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "verify",
        abstract: "Check every checksum, seq and digest in a journal; exit 0 only when it is intact.",
        discussion: """
            Checks SQLite's integrity, every snapshot's digest, every event's checksum, and that each store's \
            seqs are contiguous and join its newest snapshot. Stores of this tool's domains are also recovered \
            (snapshot plus replay through the reducer), which proves every action decodes. Each problem is \
            printed with its store and seq. Exit 0 when intact, 5 when something is wrong, 1 when the journal \
            cannot be read at all.
            """
    )

    @OptionGroup var location: JournalLocation

    @Flag(
        name: .long,
        help: "Print one JSON object: {\"intact\":…,\"problems\":[{\"code\",\"store\",\"seq\",\"message\"}]}."
    )
    var json = false

    func run() throws {
        let journal = try location.open(command: "verify")
        defer { try? journal.close() }
        var (problems, stores) = checked(journal)
        for store in stores where !problems.contains(where: { $0.store == store.name }) {
            guard let domain = Tool.domain(named: store.name) else { continue }
            guard domain.version == store.domainVersion else {
                printError(
                    "\(Tool.commandName) journal verify: store '\(store.name)' was written by domain version "
                        + "\(store.domainVersion) and this tool has version \(domain.version): its checksums, seqs and "
                        + "digests were checked, its actions were not replayed"
                )
                continue
            }
            do {
                _ = try recoverStore(domain, from: journal)
            } catch {
                problems.append(
                    JournalProblem(code: error.code, store: error.store, seq: error.seq, message: error.message)
                )
            }
        }
        if json {
            let items = problems.map { problem in
                "{\"code\":\(jsonString(problem.code.description)),\"store\":"
                    + (problem.store.map(jsonString) ?? "null") + ",\"seq\":" + (problem.seq.map { "\($0)" } ?? "null")
                    + ",\"message\":\(jsonString(problem.message))}"
            }
            let list = items.joined(separator: ",")
            print("{\"journal\":\(jsonString(journal.location)),\"intact\":\(problems.isEmpty),\"problems\":[\(list)]}")
        } else if problems.isEmpty {
            let events = stores.reduce(0) { $0 + $1.eventCount }
            print("journal \(journal.location): intact (\(stores.count) stores, \(events) events kept)")
        } else {
            for problem in problems { print("journal \(journal.location): \(problem)") }
        }
        if !problems.isEmpty { throw JournalCommand.damaged }
    }

    private func recoverStore<D: Domain>(_: D.Type, from journal: any Journal) throws(JournalError) -> UInt64 {
        try journal.recover(D.self).lastSeq
    }
}

struct JournalBackupCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "backup",
        abstract: "Copy a data directory's journal into a new directory, while the daemon runs, and verify the copy.",
        discussion: """
            DEST must be new or empty. A log journal is copied as its records stood when it was read, with the \
            snapshot files they keep (read again if a commit compacted one away meanwhile); an SQLite journal with \
            SQLite's online backup. The copy is then checked as verify checks a journal: exit 0 when it is intact, \
            5 when not, 1 when the copy could not be made. To restore, point a stopped daemon's data_dir at a copy.
            """
    )

    @Argument(help: "The daemon's data directory.")
    var directory: String

    @Argument(help: "Where the copy goes: a new or empty directory.")
    var destination: String

    func run() throws {
        do {
            try backupLocalJournal(directory: directory, to: destination)
        } catch {
            printError("\(Tool.commandName) journal backup: \(error)")
            throw ExitCode.failure
        }
        let copy = try openJournal(destination, command: "backup", readOnly: true)
        defer { try? copy.close() }
        let (problems, stores) = checked(copy)
        try report(copy, problems, stores, as: "journal \(directory) copied to \(copy.location)")
    }
}

struct JournalConvertCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "convert",
        abstract: "Write a stopped daemon's SQLite journal as a log journal in a new directory, and check the copy.",
        discussion: """
            DIR holds the SQLite journal (the daemon stopped: convert takes its writer's lock, and fails in_use \
            while a daemon runs); DEST must be new or empty. Every store keeps its epoch, domain versions, \
            snapshots, events, idempotency entries and outbox, so replicas and clients go on as after a restart. \
            The copy is checked as verify checks a journal, and each store's seq, epoch and events compared with \
            the source's: exit 0 when they agree, 5 when not, 1 when the copy could not be made. Then point the \
            daemon's data_dir at DEST. DIR is left as it was.
            """
    )

    @Argument(help: "The stopped daemon's data directory, holding journal.sqlite.")
    var directory: String

    @Argument(help: "Where the log journal goes: a new or empty directory.")
    var destination: String

    func run() throws {
        do {
            try LogJournal.convert(sqliteIn: directory, to: destination)
        } catch {
            printError("\(Tool.commandName) journal convert: \(error)")
            throw ExitCode.failure
        }
        let source = try openJournal(directory, command: "convert", readOnly: true)
        defer { try? source.close() }
        let copy = try openJournal(destination, command: "convert", readOnly: true)
        defer { try? copy.close() }
        var (problems, stores): ([JournalProblem], [JournalStoreStats]) = checked(copy)
        let before = (try? source.stats().stores) ?? []
        if problems.isEmpty, stores != before {
            problems.append(
                JournalProblem(
                    code: .invalidArgument,
                    store: nil,
                    seq: nil,
                    message: "the stores differ from the SQLite journal's: \(stores) against \(before)"
                )
            )
        }
        try report(copy, problems, stores, as: "journal \(source.location) written as \(copy.location)")
    }
}

struct JournalDumpCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dump",
        abstract: "Print a journal's events as JSON lines: {\"store\":…,\"seq\":…,\"action\":…}.",
        discussion: """
            Stores in name order, each from its first kept event (or --from) to its last (or --to). The action \
            is the action's own JSON. Asking --from below what the journal keeps is an error that names the \
            first seq still kept.
            """
    )

    @OptionGroup var location: JournalLocation

    @Option(name: .long, help: "Only this store.")
    var store: String?

    @Option(name: .long, help: "The first seq to print.")
    var from: UInt64?

    @Option(name: .long, help: "The last seq to print.")
    var to: UInt64?

    func run() throws {
        let journal = try location.open(command: "dump")
        defer { try? journal.close() }
        var output = OutputBuffer()
        defer { output.flush() }
        do {
            let stores = try journal.stats().stores
            let selected = store.map { name in stores.filter { $0.name == name } } ?? stores
            if let store, selected.isEmpty {
                let names = stores.map(\.name).joined(separator: ", ")
                printError("\(Tool.commandName) journal dump: the journal has no store '\(store)'; it has: \(names)")
                throw ExitCode.failure
            }
            for info in selected {
                var next = from ?? info.firstSeq ?? info.lastSeq + 1
                let last = min(to ?? info.lastSeq, info.lastSeq)
                while next <= last {
                    switch try journal.events(store: info.name, from: next, to: last, limit: 10_000) {
                    case let .compacted(firstAvailable):
                        output.flush()
                        printError(
                            "\(Tool.commandName) journal dump: store \(info.name) is compacted below seq "
                                + "\(firstAvailable); use --from \(firstAvailable) or later"
                        )
                        throw ExitCode.failure
                    case let .events(events):
                        guard let lastEvent = events.last else {
                            next = last + 1
                            break
                        }
                        for event in events { output.append(line(event)) }
                        next = lastEvent.seq + 1
                    }
                }
            }
        } catch let error as JournalError {
            output.flush()
            printError("\(Tool.commandName) journal dump: \(error)")
            throw JournalCommand.damaged
        }
    }

    private func line(_ event: JournalEvent) -> String {
        let action = Data(event.action)
        let prefix = "{\"store\":\(jsonString(event.store)),\"seq\":\(event.seq),\"action\":"
        let author = event.author.isEmpty ? "" : ",\"author\":\(jsonString(event.author))"
        if (try? JSONSerialization.jsonObject(with: action, options: [.fragmentsAllowed])) != nil {
            return prefix + String(decoding: action, as: UTF8.self) + author + "}"
        }
        // Not JSON (a domain with another encoding): keep the line parseable.
        return prefix + "null,\"actionBase64\":\"\(action.base64EncodedString())\"" + author + "}"
    }
}

struct JournalStatsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stats",
        abstract: "Per store: epoch, domain version, first and last seq, events and snapshots kept; file size."
    )

    @OptionGroup var location: JournalLocation

    @Flag(name: .long, help: "Print the figures as one JSON object.")
    var json = false

    func run() throws {
        let journal = try location.open(command: "stats")
        defer { try? journal.close() }
        let stats: JournalStats
        do {
            stats = try journal.stats()
        } catch {
            printError("\(Tool.commandName) journal stats: \(error)")
            throw JournalCommand.damaged
        }
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            print(String(decoding: try encoder.encode(stats), as: UTF8.self))
            return
        }
        print("journal      \(stats.location)")
        print("format       \(stats.formatVersion)")
        print("file bytes   \(stats.fileBytes.map { "\($0)" } ?? "-")")
        print("idempotency  \(stats.idempotencyEntries) entries")
        print("")
        print("store            epoch               version  first seq  last seq   events     snapshots")
        for store in stats.stores {
            let snapshots = store.snapshotSeqs.isEmpty ? "-" : store.snapshotSeqs.map { "\($0)" }.joined(separator: ",")
            print(
                store.name.padding(toLength: 16, withPad: " ", startingAt: 0),
                String(store.epoch, radix: 16).leftPadded(to: 16).replacingOccurrences(of: " ", with: "0") + "   ",
                String(store.domainVersion).padding(toLength: 8, withPad: " ", startingAt: 0),
                (store.firstSeq.map { "\($0)" } ?? "-").padding(toLength: 10, withPad: " ", startingAt: 0),
                String(store.lastSeq).padding(toLength: 10, withPad: " ", startingAt: 0),
                String(store.eventCount).padding(toLength: 10, withPad: " ", startingAt: 0),
                snapshots
            )
        }
        for store in stats.stores where store.versions.count > 1 {
            print("\(store.name): upgraded; \(store.versions.map(\.summary).joined(separator: ", "))")
        }
    }
}

struct JournalStateCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "state",
        abstract: "Print a store's state at a seq, rebuilt from a journal by this tool's domain.",
        discussion: """
            Starts from the newest snapshot at or below the seq and replays the events after it through the \
            domain's reducer; works on a copy of a live data directory and changes nothing. Prints the store, \
            seq, digest and state; --json prints them as one object. The actions between two seqs are \
            'journal dump DIR --store STORE --from A --to B'. Exit 1 when the seq is past the end, compacted \
            away, or written by another version of the domain (the message says which).
            """
    )

    @Argument(help: "The data directory.")
    var directory: String

    @Argument(help: ArgumentHelp("The store: \(Tool.domainList)."))
    var store: String

    @Option(name: .long, help: "The seq (default: the store's last).")
    var seq: UInt64?

    @Flag(name: .long, help: "Print one JSON object: store, seq, digest, state.")
    var json = false

    func run() throws {
        let domain = try Tool.requireDomain(store)
        let journal = try openJournal(directory, command: "state", readOnly: true)
        defer { try? journal.close() }
        try print(domain, journal)
    }

    private func print<D: Domain>(_: D.Type, _ journal: any Journal) throws {
        let state: D.State
        let at: UInt64
        do {
            at = try seq ?? journal.stats().stores.first { $0.name == D.name }?.lastSeq ?? 0
            state = try journal.state(of: D.self, at: at)
        } catch {
            printError("\(Tool.commandName) journal state: \(error)")
            throw ExitCode.failure
        }
        let bytes = try CanonicalEncoding.encode(state)
        let text = String(decoding: bytes, as: UTF8.self)
        let digest = StateDigest(of: bytes)
        if json {
            Swift.print(#"{"store":"\#(D.name)","seq":\#(at),"digest":"\#(digest)","state":\#(text)}"#)
        } else {
            Swift.print("store   \(D.name)")
            Swift.print("seq     \(at)")
            Swift.print("digest  \(digest)")
            Swift.print("state   \(text)")
        }
    }
}
