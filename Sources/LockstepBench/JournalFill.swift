import Foundation
import Lockstep
import LockstepExamples
import LockstepJournal
import LockstepProtocol
import LockstepTool

/// Builds one batch of `count` `{"increment":{}}` events for the counter store, with their idempotency
/// entries and, when due, a snapshot at the batch's last seq.
package func counterBatch(
    journal: any Journal,
    epoch: UInt64,
    state: inout Counter.State,
    lastSeq: UInt64,
    count: Int,
    clientID: [UInt8]
) throws -> JournalBatch {
    let increment = try CanonicalEncoding.bytes(of: Counter.Action.increment)
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
package func fill<D: Domain>(
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
package func journalBatch<D: Domain>(
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

/// `lockstep journal append-load`: commits `batchSize` counter increments per commit to the journal in
/// `directory` (a new log journal there with `log`; or the PostgreSQL journal at `postgres`; recovered first), `batches` times or until killed,
/// calling `committed` with the last seq after each commit. The crash tests kill it at random points and check
/// that no committed batch was lost.
package func appendLoad(
    directory: String,
    postgres: String? = nil,
    log: Bool = false,
    logRewriteBytes: Int64? = nil,
    policy: JournalPolicy,
    batchSize: Int,
    batches: Int?,
    committed: (UInt64) -> Void
) throws {
    let journal: any Journal =
        if let logRewriteBytes {
            try LogJournal(directory: directory, policy: policy, rewriteMinimumBytes: logRewriteBytes)
        } else {
            try openJournal(
                directory,
                postgres: postgres,
                command: "append-load",
                readOnly: false,
                policy: policy,
                log: log
            )
        }
    defer { try? journal.close() }
    let recovered = try journal.recover(Counter.self)
    var state = recovered.state
    var lastSeq = recovered.lastSeq
    var generator = SystemRandomNumberGenerator()
    let clientID = (0..<16).map { _ in UInt8.random(in: 0...255, using: &generator) }
    var count = 0
    while batches.map({ count < $0 }) ?? true {
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
        count += 1
        committed(lastSeq)
    }
}

/// `lockstep journal bench-recovery`: how long a journal of `events` counter events takes to write, to recover
/// and to verify.
package struct RecoveryBenchmark {
    package var events: UInt64
    package var batchSize: Int
    package var fill: Duration
    package var recovery: Duration
    package var verify: Duration
    package var fileBytes: Int64
    package var eventsKept: Int
    package var snapshotSeqs: [UInt64]
    package var replayedEvents: Int

    /// Writes the journal in `directory` (which must not hold one), closes it, opens and recovers it, verifies
    /// it; throws when the recovered state is not the one written or verify finds a problem.
    package static func run(directory: String, policy: JournalPolicy, events: Int, batchSize: Int) throws -> Self {
        let journal = try openJournal(directory, command: "bench-recovery", readOnly: false, policy: policy)
        let fillStart = ContinuousClock.now
        let increment = try CanonicalEncoding.bytes(of: Counter.Action.increment)
        let state = try LockstepBench.fill(journal, Counter.self, events: events, batchSize: batchSize) { _ in
            (.increment, increment)
        }
        let fill = ContinuousClock.now - fillStart
        try journal.close()

        let openStart = ContinuousClock.now
        let reopened = try openJournal(directory, command: "bench-recovery", readOnly: false, policy: policy)
        defer { try? reopened.close() }
        let recovered = try reopened.recover(Counter.self)
        let recovery = ContinuousClock.now - openStart
        let verifyStart = ContinuousClock.now
        let problems = try reopened.verify()
        let verify = ContinuousClock.now - verifyStart
        let stats = try reopened.stats()
        guard recovered.lastSeq == UInt64(events), recovered.state == state, problems.isEmpty else {
            throw BenchFailure(
                "recovered seq \(recovered.lastSeq) of \(events) written, "
                    + "\(recovered.state == state ? "the same" : "another") state, problems \(problems)"
            )
        }
        let store = stats.stores.first
        return Self(
            events: UInt64(events),
            batchSize: batchSize,
            fill: fill,
            recovery: recovery,
            verify: verify,
            fileBytes: Int64(stats.fileBytes ?? 0),
            eventsKept: Int(store?.eventCount ?? 0),
            snapshotSeqs: store?.snapshotSeqs ?? [],
            replayedEvents: Int(recovered.replayedEvents)
        )
    }

    /// The report, one figure a line.
    package var text: String {
        func seconds(_ duration: Duration) -> Double {
            Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
        }
        func format(_ duration: Duration) -> String {
            let value = seconds(duration)
            return value < 1 ? String(format: "%.1f ms", value * 1_000) : String(format: "%.2f s", value)
        }
        let rate = Int(Double(events) / seconds(fill))
        return """
            events written   \(events) in \(format(fill)) (\(rate) events/s, \(batchSize) per commit)
            file bytes       \(fileBytes)
            events kept      \(eventsKept) (snapshots at \(snapshotSeqs))
            recovery         \(format(recovery)) (open, newest snapshot, \(replayedEvents) events replayed)
            verify           \(format(verify))
            """
    }
}
