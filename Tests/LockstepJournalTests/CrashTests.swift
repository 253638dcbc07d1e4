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

    @Test func killedMidCommitStreamLosesNoAcknowledgedBatchAndKeepsNoPartialOne() throws {
        let directory = try temporaryDirectory("crash")
        defer { try? FileManager.default.removeItem(at: directory) }
        let data = directory.appendingPathComponent("data").path
        let started = ContinuousClock.now
        var random = SplitMix64(seed: 0xC0FFEE)
        var acknowledged: UInt64 = 0
        var unacknowledgedKept = 0
        var totalEvents: UInt64 = 0

        for round in 1...Self.rounds {
            let child = try ChildProcess(
                "lockstep",
                [
                    "journal", "append-load", data, "--batch-size", "\(Self.batchSize)",
                    "--snapshot-every", "\(Self.policy.snapshotEveryEvents)",
                    "--snapshots-kept", "\(Self.policy.snapshotsKept)",
                    "--idempotency-kept", "\(Self.policy.idempotencyEntriesKept)",
                ]
            )
            var printed: [UInt64] = []
            // Wait (bounded) for the first acknowledged batch, so the kill lands in a running stream.
            let firstDeadline = ContinuousClock.now + .seconds(30)
            while printed.isEmpty, !child.reachedEndOfOutput, ContinuousClock.now < firstDeadline {
                child.read(for: .milliseconds(50))
                printed += child.takeLines().compactMap { UInt64($0) }
            }
            try #require(!printed.isEmpty, "round \(round): the child acknowledged nothing: \(child.errors())")
            // Then let it run a random while: 0 to 40 ms, a few to a few dozen commits.
            let runFor = Duration.microseconds(Int64(random.next() % 40_000))
            let killAt = ContinuousClock.now + runFor
            while ContinuousClock.now < killAt, !child.reachedEndOfOutput {
                child.read(for: killAt - ContinuousClock.now)
            }
            child.kill()
            #expect(child.waitForExit(within: .seconds(10)) != nil, "round \(round): the child was not reaped")
            // What it printed before dying was printed after its commit returned: acknowledged too.
            let drainDeadline = ContinuousClock.now + .seconds(10)
            while !child.reachedEndOfOutput, ContinuousClock.now < drainDeadline { child.read(for: .milliseconds(100)) }
            #expect(child.reachedEndOfOutput, "round \(round): the dead child's output did not end")
            printed += child.takeLines().compactMap { UInt64($0) }
            let lastPrinted = try #require(printed.last)
            #expect(printed == printed.sorted(), "round \(round)")
            acknowledged = max(acknowledged, lastPrinted)

            let journal = try SQLiteJournal(directory: data, policy: Self.policy)
            let recovered = try journal.recover(Counter.self)
            // A failed round would spoil the next ones: stop at the first.
            try #require(recovered.lastSeq >= acknowledged, "round \(round): acknowledged seq \(acknowledged) was lost")
            try #require(
                recovered.lastSeq % Self.batchSize == 0,
                "round \(round): a partial batch was kept: \(recovered.lastSeq)"
            )
            try #require(recovered.state.count == Int(recovered.lastSeq), "round \(round)")
            if recovered.lastSeq > lastPrinted { unacknowledgedKept += 1 }
            #expect(try journal.verify() == [], "round \(round)")
            // Each batch is there whole, with its idempotency entries: the last batch's are all kept.
            let kept = Set(try journal.idempotencyRecords().map(\.key.requestNumber))
            #expect(kept.count == min(Int(recovered.lastSeq), Self.policy.idempotencyEntriesKept), "round \(round)")
            let lastBatchSeqs = Array((recovered.lastSeq - Self.batchSize + 1)...recovered.lastSeq)
            #expect(lastBatchSeqs.filter { !kept.contains($0) } == [], "round \(round): idempotency entries missing")
            let lastRange = try journal.events(
                store: Counter.name,
                from: lastBatchSeqs[0],
                to: recovered.lastSeq,
                limit: 1_000
            )
            switch lastRange {
            case let .events(lastBatch):
                #expect(lastBatch.map(\.seq) == lastBatchSeqs, "round \(round)")
            case .compacted:
                // Only the store's first snapshot, written with the last batch, compacts the batch away.
                #expect(recovered.snapshotSeq == recovered.lastSeq, "round \(round)")
                #expect(try journal.stats().stores.first?.snapshotSeqs.count == 1, "round \(round)")
            }

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
            acknowledged = batch.last!.seq
            totalEvents = acknowledged
            #expect(journal.lastSeq(store: Counter.name) == acknowledged)
            try journal.close()
        }
        let final = try SQLiteJournal(directory: data, policy: Self.policy)
        #expect(try final.recover(Counter.self).lastSeq == acknowledged)
        try final.close()
        print(
            "crash test: \(Self.rounds) SIGKILLs, \(totalEvents) events in batches of \(Self.batchSize); "
                + "\(unacknowledgedKept) kills landed after a commit was durable but before it was printed; "
                + "took \(ContinuousClock.now - started)"
        )
    }
}
