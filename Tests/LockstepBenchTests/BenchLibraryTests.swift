import Foundation
import LockstepBench
import LockstepDemo
import LockstepExamples
import LockstepJournal
import LockstepProtocol
import LockstepTesting
import TestSupport
import Testing

/// What the `lockstep` executable's demo, bench fixtures and journal load generators do, as library calls.
@Suite struct BenchLibraryTests {
    @Test func appendLoadCommitsEachBatchAndADaemonCanReadItsIdempotencyEntries() throws {
        let directory = try temporaryDirectory("append-load")
        defer { try? FileManager.default.removeItem(at: directory) }
        var seen: [UInt64] = []
        try appendLoad(directory: directory.path, policy: JournalPolicy(), batchSize: 10, batches: 3) {
            seen.append($0)
        }
        #expect(seen == [10, 20, 30])
        // Once more on the same journal: it recovers and goes on.
        try appendLoad(directory: directory.path, policy: JournalPolicy(), batchSize: 5, batches: 1) { seen.append($0) }
        #expect(seen.last == 35)
        let journal = try SQLiteJournal(directory: directory.path, readOnly: true)
        defer { try? journal.close() }
        let recovered = try journal.recover(Counter.self)
        #expect(recovered.lastSeq == 35)
        #expect(recovered.state.count == 35)
        let entries = try journal.idempotencyRecords()
        #expect(entries.count == 35)
        for entry in entries {
            #expect(ReplyRecord.decode(entry.reply) != nil, "an entry a daemon could not read")
            #expect(entry.fingerprint.count == 32)
        }
    }

    @Test func theRecoveryBenchmarkWritesRecoversAndVerifiesTheSameState() throws {
        let directory = try temporaryDirectory("bench-recovery")
        defer { try? FileManager.default.removeItem(at: directory) }
        let policy = JournalPolicy(snapshotEveryEvents: 1_000, snapshotsKept: 2)
        let result = try RecoveryBenchmark.run(directory: directory.path, policy: policy, events: 3_500, batchSize: 500)
        #expect(result.events == 3_500)
        #expect(result.snapshotSeqs == [2_000, 3_000])
        #expect(result.replayedEvents == 500)
        #expect(result.text.contains("events written   3500"))
    }

    @Test func theDemoConvergesThroughAStoppedClientADaemonCrashAndAnOptimisticConflict() async throws {
        let run = try DemoRun(
            lockstep: productURL("lockstep"),
            lockstepd: productURL("lockstepd"),
            clients: 2,
            actions: 400,
            seed: 7,
            quiet: true
        )
        defer { try? FileManager.default.removeItem(at: run.folder) }
        // The demo waits for its processes synchronously, for minutes on a loaded machine: off the cooperative pool.
        let summary = try await offPool("demo", lending: run) { try $0.play() }
        #expect(summary.converged, "see \(run.folder.path)")
        // Then the optimistic conflict: both clients deleted the last number of the same list at one instant; the
        // daemon accepted one delete and rejected the other, which its client rolled back; both ended on the daemon's
        // digest at the accepted delete's seq.
        let conflict = try #require(summary.conflict, "no optimistic conflict in\(summary.text)")
        let last = conflict.numbers.count - 1
        #expect(Set([conflict.accepted, conflict.rolledBack]) == [0, 1], "\(conflict)")
        #expect(conflict.code == "out_of_range", "\(conflict.reason)")
        #expect(conflict.reason.contains("delete index \(last) is out of range"), "\(conflict.reason)")
        #expect(conflict.rollback.hasSuffix(#"{"delete":{"index":\#(last)}}"#), "\(conflict.rollback)")
        #expect(conflict.acceptedSeq == conflict.seq + 1)
        // The rolled-back client's optimistic list: its own delete at once, then the other's, confirmed.
        #expect(conflict.before == Array(conflict.numbers.dropLast()))
        #expect(conflict.after == Array(conflict.numbers.dropLast()))
        #expect(conflict.afterSeq == conflict.acceptedSeq)
        #expect(conflict.pendingAfter == 0)
        #expect(conflict.finalSeq == conflict.acceptedSeq)
        #expect(conflict.clientDigests == [conflict.digest, conflict.digest])
        #expect(conflict.converged)
        let text = summary.text
        #expect(text.contains("'s rolled back (out_of_range)"), "\(text)")
        #expect(text.contains("on numbers seq \(conflict.finalSeq) with the daemon's digest"), "\(text)")
        #expect(text.contains("every replica converged on the daemon's digest"), "\(text)")
    }
}
