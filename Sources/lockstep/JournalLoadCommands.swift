import ArgumentParser
import Foundation
import Lockstep
import LockstepBench
import LockstepExamples
import LockstepJournal
import LockstepProtocol
import LockstepTool

struct JournalAppendLoadCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "append-load",
        abstract: "Commit batches of counter increments to a journal until killed; print each batch's last seq.",
        discussion: """
            Recovers the example counter store from DIR (creating the journal if needed), then commits batches \
            of --batch-size {"increment":{}} events, each with its idempotency entries (request number = seq) \
            and, when due, a snapshot. The last seq of a batch is printed, and flushed, only after its commit \
            returned: every printed seq is durable. The crash test kills this process at random points. \
            --postgres CONNINFO commits to a PostgreSQL journal instead of DIR.
            """
    )

    @Argument(help: "The data directory (not with --postgres).")
    var directory: String?

    @Option(name: .long, help: "A PostgreSQL journal's libpq connection string, instead of DIR.")
    var postgres: String?

    @Flag(help: "Create a log journal (journal.lslog) when DIR has no journal yet; DIR's own kind is used when it has.")
    var log = false

    @Option(
        name: .long,
        help:
            "With --log: rewrite the log once it passes this many bytes (64 MiB by default; the crash test uses less)."
    )
    var logRewriteBytes: Int64?

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
        guard (directory == nil) != (postgres == nil) else {
            throw ValidationError("give the data directory DIR or --postgres CONNINFO (one of them)")
        }
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
        do {
            try appendLoad(
                directory: directory ?? "",
                postgres: postgres,
                log: log,
                logRewriteBytes: log ? logRewriteBytes : nil,
                policy: policy,
                batchSize: batchSize,
                batches: batches
            ) { lastSeq in
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
            let result = try RecoveryBenchmark.run(
                directory: directory,
                policy: policy,
                events: events,
                batchSize: batchSize
            )
            print(result.text)
        } catch {
            printError("lockstep journal bench-recovery: \(error)")
            throw ExitCode.failure
        }
    }
}
