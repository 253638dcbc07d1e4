import ArgumentParser
import Foundation
import Lockstep
import LockstepExamples
import LockstepJournal

/// `lockstep journal …`: look into a data directory's journal without the daemon's help.
struct JournalCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "journal",
        abstract: "Check, dump and describe a daemon's journal; generate journal load.",
        discussion: """
            DIR is the daemon's data directory; the journal is DIR/\(SQLiteJournal.fileName). verify, dump and \
            stats open it read-only and may run while the daemon runs. See docs/operations.md, "The journal".
            """,
        subcommands: [
            JournalVerifyCommand.self, JournalDumpCommand.self, JournalStatsCommand.self,
            JournalAppendLoadCommand.self, JournalBenchRecoveryCommand.self,
        ]
    )

    /// `lockstep journal verify` found the journal damaged.
    static let damaged = ExitCode(5)
}

/// Opens `directory`'s journal, turning a failure into a message and an exit code.
private func openJournal(
    _ directory: String,
    command: String,
    readOnly: Bool,
    policy: JournalPolicy = JournalPolicy()
) throws -> SQLiteJournal {
    do {
        return try SQLiteJournal(directory: directory, policy: policy, readOnly: readOnly)
    } catch {
        printError("lockstep journal \(command): \(error)")
        switch error.code {
        case .notFound: throw ExitCode.failure
        case .corrupt, .notAJournal, .formatVersionMismatch: throw JournalCommand.damaged
        default: throw ExitCode.failure
        }
    }
}

/// A JSON string literal for `text`.
private func jsonString(_ text: String) -> String {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.withoutEscapingSlashes]
    return (try? String(decoding: encoder.encode(text), as: UTF8.self)) ?? "\"\""
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
            seqs are contiguous and join its newest snapshot. Stores of the example domains are also recovered \
            (snapshot plus replay through the reducer), which proves every action decodes. Each problem is \
            printed with its store and seq. Exit 0 when intact, 5 when something is wrong, 1 when the journal \
            cannot be read at all.
            """
    )

    @Argument(help: "The data directory.")
    var directory: String

    @Flag(
        name: .long,
        help: "Print one JSON object: {\"intact\":…,\"problems\":[{\"code\",\"store\",\"seq\",\"message\"}]}."
    )
    var json = false

    func run() throws {
        let journal = try openJournal(directory, command: "verify", readOnly: true)
        defer { try? journal.close() }
        var problems: [JournalProblem]
        var stores: [JournalStoreStats] = []
        do {
            problems = try journal.verify()
            stores = try journal.stats().stores
        } catch {
            problems = [JournalProblem(code: error.code, store: error.store, seq: error.seq, message: error.message)]
        }
        for store in stores where !problems.contains(where: { $0.store == store.name }) {
            guard let domain = Examples.domain(named: store.name), domain.version == store.domainVersion else {
                continue
            }
            do {
                _ = try recoverExample(domain, from: journal)
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

    private func recoverExample<D: Domain>(_: D.Type, from journal: SQLiteJournal) throws(JournalError) -> UInt64 {
        try journal.recover(D.self).lastSeq
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

    @Argument(help: "The data directory.")
    var directory: String

    @Option(name: .long, help: "Only this store.")
    var store: String?

    @Option(name: .long, help: "The first seq to print.")
    var from: UInt64?

    @Option(name: .long, help: "The last seq to print.")
    var to: UInt64?

    func run() throws {
        let journal = try openJournal(directory, command: "dump", readOnly: true)
        defer { try? journal.close() }
        var output = OutputBuffer()
        defer { output.flush() }
        do {
            let stores = try journal.stats().stores
            let selected = store.map { name in stores.filter { $0.name == name } } ?? stores
            if let store, selected.isEmpty {
                let names = stores.map(\.name).joined(separator: ", ")
                printError("lockstep journal dump: the journal has no store '\(store)'; it has: \(names)")
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
                            "lockstep journal dump: store \(info.name) is compacted below seq \(firstAvailable); "
                                + "use --from \(firstAvailable) or later"
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
            printError("lockstep journal dump: \(error)")
            throw JournalCommand.damaged
        }
    }

    private func line(_ event: JournalEvent) -> String {
        let action = Data(event.action)
        let prefix = "{\"store\":\(jsonString(event.store)),\"seq\":\(event.seq),\"action\":"
        if (try? JSONSerialization.jsonObject(with: action, options: [.fragmentsAllowed])) != nil {
            return prefix + String(decoding: action, as: UTF8.self) + "}"
        }
        // Not JSON (a domain with another encoding): keep the line parseable.
        return prefix + "null,\"actionBase64\":\"\(action.base64EncodedString())\"}"
    }
}

struct JournalStatsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stats",
        abstract: "Per store: epoch, domain version, first and last seq, events and snapshots kept; file size."
    )

    @Argument(help: "The data directory.")
    var directory: String

    @Flag(name: .long, help: "Print the figures as one JSON object.")
    var json = false

    func run() throws {
        let journal = try openJournal(directory, command: "stats", readOnly: true)
        defer { try? journal.close() }
        let stats: JournalStats
        do {
            stats = try journal.stats()
        } catch {
            printError("lockstep journal stats: \(error)")
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
    }
}

/// Builds one batch of `count` `{"increment":{}}` events for the counter store, with their idempotency
/// entries and, when due, a snapshot at the batch's last seq.
private func counterBatch(
    journal: any Journal,
    state: inout Counter.State,
    lastSeq: UInt64,
    count: Int,
    clientID: [UInt8]
) throws -> JournalBatch {
    let increment = Array(try CanonicalEncoding.encode(Counter.Action.increment))
    return try journalBatch(
        Counter.self,
        journal: journal,
        state: &state,
        lastSeq: lastSeq,
        count: count,
        clientID: clientID
    ) { _ in (.increment, increment) }
}

/// Recovers store `D` from a new `journal` and commits `events` events to it, `batchSize` per commit (see
/// ``journalBatch(_:journal:state:lastSeq:count:clientID:action:)``); returns the state they lead to.
func fill<D: Domain>(
    _ journal: any Journal,
    _ domain: D.Type,
    events: Int,
    batchSize: Int,
    action: (UInt64) -> (D.Action, [UInt8])
) throws -> D.State {
    var state = try journal.recover(D.self).state
    let clientID = [UInt8](repeating: 7, count: 16)
    var lastSeq: UInt64 = 0
    while lastSeq < UInt64(events) {
        let count = min(batchSize, events - Int(lastSeq))
        let batch = try journalBatch(
            D.self,
            journal: journal,
            state: &state,
            lastSeq: lastSeq,
            count: count,
            clientID: clientID,
            action: action
        )
        try journal.commit(batch)
        lastSeq += UInt64(count)
    }
    return state
}

/// A batch of `count` events of store `D` after `lastSeq`: the action `action(seq)` gives (with its encoding)
/// is applied to `state` for each, with an idempotency entry (request number = seq), and the snapshot the
/// journal's policy makes due. What `journal append-load`, `bench-recovery` and `lockstep bench` commit.
func journalBatch<D: Domain>(
    _ domain: D.Type,
    journal: any Journal,
    state: inout D.State,
    lastSeq: UInt64,
    count: Int,
    clientID: [UInt8],
    action: (UInt64) -> (D.Action, [UInt8])
) throws -> JournalBatch {
    var batch = JournalBatch()
    batch.events.reserveCapacity(count)
    batch.idempotency.reserveCapacity(count)
    for offset in 1...UInt64(count) {
        let seq = lastSeq + offset
        let (value, encoded) = action(seq)
        batch.events.append(
            JournalEvent(store: D.name, seq: seq, action: encoded, clientID: clientID, requestNumber: seq)
        )
        batch.idempotency.append(
            IdempotencyRecord(
                key: IdempotencyKey(clientID: clientID, requestNumber: seq),
                fingerprint: encoded,
                reply: withUnsafeBytes(of: seq.bigEndian) { Array($0) }
            )
        )
        D.reduce(into: &state, value)
    }
    if journal.snapshotDue(store: D.name, in: batch) {
        batch.snapshots.append(try JournalSnapshot(store: D.name, seq: lastSeq + UInt64(count), encoding: state))
    }
    return batch
}

struct JournalAppendLoadCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "append-load",
        abstract: "Commit batches of counter increments to a journal until killed; print each batch's last seq.",
        discussion: """
            Recovers the example counter store from DIR (creating the journal if needed), then commits batches \
            of --batch-size {"increment":{}} events, each with its idempotency entries (request number = seq) \
            and, when due, a snapshot. The last seq of a batch is printed, and flushed, only after its commit \
            returned: every printed seq is durable. The crash test kills this process at random points.
            """
    )

    @Argument(help: "The data directory.")
    var directory: String

    @Option(name: .long, help: "Events per commit.")
    var batchSize = 100

    @Option(name: .long, help: "Stop after this many batches (default: run until killed).")
    var batches: Int?

    @Option(name: .long, help: "A snapshot every this many events.")
    var snapshotEvery = 10_000

    @Option(name: .long, help: "Snapshots kept per store.")
    var snapshotsKept = 2

    @Option(name: .long, help: "Idempotency entries kept.")
    var idempotencyKept = 100_000

    func validate() throws {
        guard (1...1_000_000).contains(batchSize) else {
            throw ValidationError("--batch-size must be 1...1000000, got \(batchSize)")
        }
        if let batches, batches < 1 { throw ValidationError("--batches must be at least 1, got \(batches)") }
    }

    func run() throws {
        let policy = JournalPolicy(
            snapshotEveryEvents: snapshotEvery,
            snapshotsKept: snapshotsKept,
            idempotencyEntriesKept: idempotencyKept
        )
        let journal = try openJournal(directory, command: "append-load", readOnly: false, policy: policy)
        defer { try? journal.close() }
        do {
            let recovered = try journal.recover(Counter.self)
            var state = recovered.state
            var lastSeq = recovered.lastSeq
            var generator = SystemRandomNumberGenerator()
            let clientID = (0..<16).map { _ in UInt8.random(in: 0...255, using: &generator) }
            var committed = 0
            while batches.map({ committed < $0 }) ?? true {
                let batch = try counterBatch(
                    journal: journal,
                    state: &state,
                    lastSeq: lastSeq,
                    count: batchSize,
                    clientID: clientID
                )
                try journal.commit(batch)
                lastSeq += UInt64(batchSize)
                committed += 1
                FileHandle.standardOutput.write(Data("\(lastSeq)\n".utf8))
            }
        } catch let error as JournalError {
            printError("lockstep journal append-load: \(error)")
            throw ExitCode.failure
        }
    }
}

struct JournalBenchRecoveryCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench-recovery",
        abstract: "Fill a new journal with counter events, then time its recovery and its verification.",
        discussion: """
            Writes --events events in commits of --batch-size with a snapshot every --snapshot-every events, \
            closes the journal, reopens it and times recover (newest snapshot + replay of the tail) and verify \
            (every kept event's checksum). DIR must not hold a journal yet.
            """
    )

    @Argument(help: "An empty or absent data directory.")
    var directory: String

    @Option(name: .long, help: "How many events to write.")
    var events = 1_000_000

    @Option(name: .long, help: "Events per commit.")
    var batchSize = 10_000

    @Option(name: .long, help: "A snapshot every this many events.")
    var snapshotEvery = 10_000

    @Option(name: .long, help: "Snapshots kept per store (events at or below the oldest kept are compacted).")
    var snapshotsKept = 2

    func run() throws {
        let file = URL(fileURLWithPath: directory).appendingPathComponent(SQLiteJournal.fileName).path
        guard !FileManager.default.fileExists(atPath: file) else {
            printError("lockstep journal bench-recovery: \(file) exists; give a new directory")
            throw ExitCode.failure
        }
        let policy = JournalPolicy(snapshotEveryEvents: snapshotEvery, snapshotsKept: snapshotsKept)
        do {
            let journal = try openJournal(directory, command: "bench-recovery", readOnly: false, policy: policy)
            let fillStart = ContinuousClock.now
            let increment = Array(try CanonicalEncoding.encode(Counter.Action.increment))
            let state = try fill(journal, Counter.self, events: events, batchSize: batchSize) { _ in
                (.increment, increment)
            }
            let lastSeq = UInt64(events)
            let fill = ContinuousClock.now - fillStart
            try journal.close()

            let openStart = ContinuousClock.now
            let reopened = try openJournal(directory, command: "bench-recovery", readOnly: false, policy: policy)
            let recovered = try reopened.recover(Counter.self)
            let recovery = ContinuousClock.now - openStart
            let verifyStart = ContinuousClock.now
            let problems = try reopened.verify()
            let verify = ContinuousClock.now - verifyStart
            let stats = try reopened.stats()
            try reopened.close()
            guard recovered.lastSeq == lastSeq, recovered.state == state, problems.isEmpty else {
                printError("lockstep journal bench-recovery: recovered seq \(recovered.lastSeq), problems \(problems)")
                throw ExitCode.failure
            }
            let rate = Int(Double(lastSeq) / seconds(fill))
            print("events written   \(lastSeq) in \(format(fill)) (\(rate) events/s, \(batchSize) per commit)")
            print("file bytes       \(stats.fileBytes ?? 0)")
            let store = stats.stores.first
            print("events kept      \(store?.eventCount ?? 0) (snapshots at \(store?.snapshotSeqs ?? []))")
            let replayed = recovered.replayedEvents
            print("recovery         \(format(recovery)) (open, newest snapshot, \(replayed) events replayed)")
            print("verify           \(format(verify))")
        } catch let error as JournalError {
            printError("lockstep journal bench-recovery: \(error)")
            throw ExitCode.failure
        }
    }

    private func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }

    private func format(_ duration: Duration) -> String {
        let value = seconds(duration)
        return value < 1 ? String(format: "%.1f ms", value * 1_000) : String(format: "%.2f s", value)
    }
}
