import Foundation
import Lockstep
import LockstepExamples
import LockstepJournal
import LockstepTesting
import TestSupport
import Testing

/// Recovery cost must follow the snapshot interval, not the history: a long history with a snapshot every
/// 10,000 events recovers from the newest snapshot plus its tail.
///
/// Writes 200,000 events by default (a few seconds in a debug build); set
/// `LOCKSTEP_JOURNAL_RECOVERY_EVENTS=1000000` for the full million. The time is printed, never asserted;
/// `lockstep journal bench-recovery` measures the same in any build.
@Suite struct RecoveryScaleTests {
    static let snapshotEvery = 10_000

    @Test func aLongHistoryRecoversFromTheNewestSnapshotAndItsTail() async throws {
        let total = ProcessInfo.processInfo.environment["LOCKSTEP_JOURNAL_RECOVERY_EVENTS"].flatMap(Int.init) ?? 200_000
        let snapshotted = total / Self.snapshotEvery * Self.snapshotEvery
        let tail = Self.snapshotEvery - 1
        let policy = JournalPolicy(snapshotEveryEvents: Self.snapshotEvery)
        let fixture = try await JournalFixture(.sqlite, policy: policy)
        // Seconds of writing, recovering and verifying: on the check thread, not on one of the cooperative pool.
        // The test checks what it found.
        let found = try await onCheckThread {
            let journal = try fixture.open()
            _ = try journal.recover(Counter.self)

            let increment = encoded(Counter.Action.increment)
            let writeStart = ContinuousClock.now
            var seq: UInt64 = 0
            var state = Counter.initialState
            while seq < UInt64(snapshotted + tail) {
                let count = min(Self.snapshotEvery, snapshotted + tail - Int(seq))
                var batch = JournalBatch()
                batch.events.reserveCapacity(count)
                for _ in 0..<count {
                    seq += 1
                    batch.events.append(
                        JournalEvent(
                            store: Counter.name,
                            seq: seq,
                            action: increment,
                            clientID: clientA,
                            requestNumber: seq
                        )
                    )
                }
                state.count += count
                if journal.snapshotDue(store: Counter.name, in: batch) {
                    batch.snapshots = [try JournalSnapshot(store: Counter.name, seq: seq, encoding: state)]
                }
                try journal.commit(batch)
            }
            let written = ContinuousClock.now - writeStart
            try journal.close()

            let recoveryStart = ContinuousClock.now
            let reopened = try fixture.open()
            let recovered = try reopened.recover(Counter.self)
            let recovery = ContinuousClock.now - recoveryStart
            let stats = try reopened.stats()
            let verifyStart = ContinuousClock.now
            let problems = try reopened.verify()
            let verify = ContinuousClock.now - verifyStart
            try reopened.close()
            return (
                recovered: recovered, stats: stats, problems: problems, written: written, recovery: recovery,
                verify: verify
            )
        }
        let (recovered, stats) = (found.recovered, found.stats)

        #expect(recovered.lastSeq == UInt64(snapshotted + tail))
        #expect(recovered.state.count == snapshotted + tail)
        #expect(recovered.snapshotSeq == UInt64(snapshotted))
        #expect(recovered.replayedEvents == tail)
        #expect(stats.stores.first?.snapshotSeqs == [UInt64(snapshotted - Self.snapshotEvery), UInt64(snapshotted)])
        #expect(stats.stores.first?.firstSeq == UInt64(snapshotted - Self.snapshotEvery + 1))
        #expect(stats.stores.first?.eventCount == Self.snapshotEvery + tail)
        #expect(found.problems == [])
        print(
            "recovery of \(snapshotted + tail) events (snapshot every \(Self.snapshotEvery), \(tail) replayed): "
                + "\(found.recovery) (writing them took \(found.written); verify took \(found.verify))"
        )
    }
}
