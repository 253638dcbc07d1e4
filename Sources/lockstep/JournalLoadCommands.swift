import ArgumentParser
import Foundation
import Lockstep
import LockstepExamples
import LockstepJournal
import LockstepProtocol
import LockstepTool

/// Builds one batch of `count` `{"increment":{}}` events for the counter store, with their idempotency
/// entries and, when due, a snapshot at the batch's last seq.
private func counterBatch(
    journal: any Journal,
    epoch: UInt64,
    state: inout Counter.State,
    lastSeq: UInt64,
    count: Int,
    clientID: [UInt8]
) throws -> JournalBatch {
    let increment = Array(try CanonicalEncoding.encode(Counter.Action.increment))
    return try journalBatch(
        Counter.self,
        journal: journal,
        epoch: epoch,
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
    let recovered = try journal.recover(D.self)
    var state = recovered.state
    let clientID = [UInt8](repeating: 7, count: 16)
    var lastSeq: UInt64 = 0
    while lastSeq < UInt64(events) {
        let count = min(batchSize, events - Int(lastSeq))
        let batch = try journalBatch(
            D.self,
            journal: journal,
            epoch: recovered.epoch,
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

/// A batch of `count` events of store `D` (of epoch `epoch`) after `lastSeq`: the action `action(seq)` gives (with
/// its encoding) is applied to `state` for each, with the idempotency entry a daemon would have written for it (a
/// one-action DISPATCH, request number = seq, answered ACCEPTED), and the snapshot the journal's policy makes due.
/// What `journal append-load`, `bench-recovery` and `lockstep bench` commit; a daemon started on it recovers it.
func journalBatch<D: Domain>(
    _ domain: D.Type,
    journal: any Journal,
    epoch: UInt64,
    state: inout D.State,
    lastSeq: UInt64,
    count: Int,
    clientID: [UInt8],
    action: (UInt64) -> (D.Action, [UInt8])
) throws -> JournalBatch {
    let store = try StoreName(D.name)
    var batch = JournalBatch()
    batch.events.reserveCapacity(count)
    batch.idempotency.reserveCapacity(count)
    for offset in 1...UInt64(count) {
        let seq = lastSeq + offset
        let (value, encoded) = action(seq)
        batch.events.append(
            JournalEvent(store: D.name, seq: seq, action: encoded, clientID: clientID, requestNumber: seq)
        )
        let reply = Reply.accepted(requestID: seq, epoch: Epoch(rawValue: epoch), firstSeq: seq, count: 1)
        batch.idempotency.append(
            IdempotencyRecord(
                key: IdempotencyKey(clientID: clientID, requestNumber: seq),
                fingerprint: Sequencer.fingerprint(store: store, actions: [encoded]).bytes,
                reply: ReplyRecord.encode(reply)
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
                    epoch: recovered.epoch,
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
