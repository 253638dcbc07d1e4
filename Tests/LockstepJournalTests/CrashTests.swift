import Foundation
import Lockstep
import LockstepExamples
import LockstepJournal
import LockstepTesting
import TestSupport
import Testing

/// A `lockstep journal append-load` child, killed with SIGKILL in the middle of its stream of group
/// commits, again and again on the same journal: no batch it acknowledged is lost, no batch is kept in
/// part, and the journal reopens and keeps accepting commits.
@Suite struct CrashTests {
    static let rounds = 50
    static let batchSize: UInt64 = 37
    static let policy = JournalPolicy(snapshotEveryEvents: 500, snapshotsKept: 2, idempotencyEntriesKept: 2_000)

    /// What one round saw. A round waits for its child and the journal on a thread of its own (`offPool`), not on
    /// one of the cooperative pool; the test checks what it saw in its own task, in the order it happened.
    struct Round: Sendable {
        /// The seqs the child printed, each once its commit had returned: acknowledged.
        var printed: [UInt64] = []
        /// The child's standard error, when it acknowledged nothing (the round stops there).
        var errors = ""
        /// Whether the killed child was reaped, and whether its output ended.
        var reaped = false
        var outputEnded = false
        /// The journal recovered after the kill.
        var recovered: RecoveredStore<Counter>?
        /// What the recovered journal held, and the commit made on it; `nil` when the recovery failed a check the
        /// test requires (the round stops there, as the test does).
        var after: AfterRecovery?
    }

    /// The recovered journal's checks and the round's own commit on it.
    struct AfterRecovery: Sendable {
        var problems: [JournalProblem]
        /// The request numbers of the idempotency entries kept.
        var kept: Set<UInt64>
        var lastBatchSeqs: [UInt64]
        var lastRange: JournalRange
        /// The store's snapshot seqs, read when the last batch was compacted away.
        var snapshotSeqCount: Int?
        /// The last seq of the round's commit, and the journal's last seq after it.
        var committed: UInt64
        var lastSeq: UInt64?
    }

    /// Runs round `round`: a child, killed mid-stream, then the journal recovered, checked and committed to.
    /// `acknowledged` is the highest seq acknowledged before this round.
    static func play(
        round: Int,
        kind: JournalKind,
        data: String,
        runFor: Duration,
        acknowledged: UInt64
    ) throws -> Round {
        var seen = Round()
        let child = try ChildProcess(
            "lockstep",
            [
                "journal", "append-load", data, "--batch-size", "\(Self.batchSize)",
                "--snapshot-every", "\(Self.policy.snapshotEveryEvents)",
                "--snapshots-kept", "\(Self.policy.snapshotsKept)",
                "--idempotency-kept", "\(Self.policy.idempotencyEntriesKept)",
            ] + (kind == .log ? ["--log", "--log-rewrite-bytes", "\(Self.logRewriteBytes)"] : [])
        )
        // Wait (bounded) for the first acknowledged batch, so the kill lands in a running stream.
        let firstDeadline = ContinuousClock.now + .seconds(30)
        while seen.printed.isEmpty, !child.reachedEndOfOutput, ContinuousClock.now < firstDeadline {
            child.read(for: .milliseconds(50))
            seen.printed += child.takeLines().compactMap { UInt64($0) }
        }
        guard !seen.printed.isEmpty else {
            seen.errors = child.errors()
            return seen
        }
        // Then let it run a random while.
        let killAt = ContinuousClock.now + runFor
        while ContinuousClock.now < killAt, !child.reachedEndOfOutput {
            child.read(for: killAt - ContinuousClock.now)
        }
        child.kill()
        seen.reaped = child.waitForExit(within: .seconds(10)) != nil
        // What it printed before dying was printed after its commit returned: acknowledged too.
        let drainDeadline = ContinuousClock.now + .seconds(10)
        while !child.reachedEndOfOutput, ContinuousClock.now < drainDeadline { child.read(for: .milliseconds(100)) }
        seen.outputEnded = child.reachedEndOfOutput
        seen.printed += child.takeLines().compactMap { UInt64($0) }
        let acknowledged = max(acknowledged, seen.printed.last ?? 0)

        let journal = try open(kind, data)
        let recovered = try journal.recover(Counter.self)
        seen.recovered = recovered
        // What the test requires of the recovery; a failed round would spoil the next ones.
        guard recovered.lastSeq >= acknowledged, recovered.lastSeq % Self.batchSize == 0,
            recovered.state.count == Int(recovered.lastSeq)
        else {
            try journal.close()
            return seen
        }
        let problems = try journal.verify()
        // Each batch is there whole, with its idempotency entries: the last batch's are all kept.
        let kept = Set(try journal.idempotencyRecords().map(\.key.requestNumber))
        let lastBatchSeqs = Array((recovered.lastSeq - Self.batchSize + 1)...recovered.lastSeq)
        let lastRange = try journal.events(
            store: Counter.name,
            from: lastBatchSeqs[0],
            to: recovered.lastSeq,
            limit: 1_000
        )
        var snapshotSeqCount: Int?
        if case .compacted = lastRange { snapshotSeqCount = try journal.stats().stores.first?.snapshotSeqs.count }

        // The journal keeps accepting commits after the crash.
        var state = recovered.state
        let batch = events(Counter.name, from: recovered.lastSeq + 1, count: Int(Self.batchSize)) { _ in
            Counter.Action.increment
        }
        for _ in batch { Counter.reduce(into: &state, .increment) }
        var commit = JournalBatch(events: batch, idempotency: idempotency(for: batch))
        if journal.snapshotDue(store: Counter.name, in: commit) {
            commit.snapshots = [try JournalSnapshot(store: Counter.name, seq: batch.last!.seq, encoding: state)]
        }
        try journal.commit(commit)
        seen.after = AfterRecovery(
            problems: problems,
            kept: kept,
            lastBatchSeqs: lastBatchSeqs,
            lastRange: lastRange,
            snapshotSeqCount: snapshotSeqCount,
            committed: batch.last!.seq,
            lastSeq: journal.lastSeq(store: Counter.name)
        )
        try journal.close()
        return seen
    }

    /// A log journal is rewritten whenever it passes this, so the kills land in rewrites too.
    static let logRewriteBytes: Int64 = 64 << 10

    /// The journal of `kind` in `data`: SQLite, or a log journal.
    static func open(_ kind: JournalKind, _ data: String) throws -> any Journal {
        kind == .log
            ? try LogJournal(directory: data, policy: Self.policy, rewriteMinimumBytes: Self.logRewriteBytes)
            : try SQLiteJournal(directory: data, policy: Self.policy)
    }

    @Test(arguments: [JournalKind.sqlite, .log])
    func killedMidCommitStreamLosesNoAcknowledgedBatchAndKeepsNoPartialOne(kind: JournalKind) async throws {
        let directory = try temporaryDirectory("crash")
        defer { try? FileManager.default.removeItem(at: directory) }
        let data = directory.appendingPathComponent("data").path
        let started = ContinuousClock.now
        var random = SplitMix64(seed: 0xC0FFEE)
        var acknowledged: UInt64 = 0
        var unacknowledgedKept = 0
        var totalEvents: UInt64 = 0

        for round in 1...Self.rounds {
            // The child runs a random while before its kill: 0 to 40 ms, a few to a few dozen commits.
            let runFor = Duration.microseconds(Int64(random.next() % 40_000))
            let before = acknowledged
            let seen = try await offPool("crash round") {
                try Self.play(round: round, kind: kind, data: data, runFor: runFor, acknowledged: before)
            }
            try #require(!seen.printed.isEmpty, "round \(round): the child acknowledged nothing: \(seen.errors)")
            #expect(seen.reaped, "round \(round): the child was not reaped")
            #expect(seen.outputEnded, "round \(round): the dead child's output did not end")
            let printed = seen.printed
            let lastPrinted = try #require(printed.last)
            #expect(printed == printed.sorted(), "round \(round)")
            acknowledged = max(acknowledged, lastPrinted)

            let recovered = try #require(seen.recovered)
            // A failed round would spoil the next ones: stop at the first.
            try #require(recovered.lastSeq >= acknowledged, "round \(round): acknowledged seq \(acknowledged) was lost")
            try #require(
                recovered.lastSeq % Self.batchSize == 0,
                "round \(round): a partial batch was kept: \(recovered.lastSeq)"
            )
            try #require(recovered.state.count == Int(recovered.lastSeq), "round \(round)")
            if recovered.lastSeq > lastPrinted { unacknowledgedKept += 1 }
            let after = try #require(seen.after)
            #expect(after.problems == [], "round \(round)")
            // Each batch is there whole, with its idempotency entries: the last batch's are all kept.
            let kept = after.kept
            #expect(kept.count == min(Int(recovered.lastSeq), Self.policy.idempotencyEntriesKept), "round \(round)")
            let lastBatchSeqs = after.lastBatchSeqs
            #expect(lastBatchSeqs.filter { !kept.contains($0) } == [], "round \(round): idempotency entries missing")
            switch after.lastRange {
            case let .events(lastBatch):
                #expect(lastBatch.map(\.seq) == lastBatchSeqs, "round \(round)")
            case .compacted:
                // Only the store's first snapshot, written with the last batch, compacts the batch away.
                #expect(recovered.snapshotSeq == recovered.lastSeq, "round \(round)")
                #expect(after.snapshotSeqCount == 1, "round \(round)")
            }

            // The journal keeps accepting commits after the crash.
            acknowledged = after.committed
            totalEvents = acknowledged
            #expect(after.lastSeq == acknowledged)
        }
        let final = try Self.open(kind, data)
        #expect(try final.recover(Counter.self).lastSeq == acknowledged)
        try final.close()
        print(
            "crash test, \(kind): \(Self.rounds) SIGKILLs, \(totalEvents) events in batches of \(Self.batchSize); "
                + "\(unacknowledgedKept) kills landed after a commit was durable but before it was printed; "
                + "took \(ContinuousClock.now - started)"
        )
    }
}
