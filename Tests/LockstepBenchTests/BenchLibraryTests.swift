import Foundation
import LockstepBench
import LockstepDemo
import LockstepExamples
import LockstepJournal
import LockstepProtocol
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

    @Test func theDemoConvergesThroughAStoppedClientAndADaemonCrash() throws {
        let run = try DemoRun(
            lockstep: productURL("lockstep"),
            lockstepd: productURL("lockstepd"),
            clients: 2,
            actions: 400,
            seed: 7,
            quiet: true
        )
        defer { try? FileManager.default.removeItem(at: run.folder) }
        let summary = try run.play()
        #expect(summary.converged, "see \(run.folder.path)")
    }
}
