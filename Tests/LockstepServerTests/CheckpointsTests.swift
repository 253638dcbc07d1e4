import LockstepProtocol
import LockstepServer
import Testing

/// When checkpoints are taken, on a clock the test moves.
@Suite struct CheckpointsTests {
    let start = ContinuousClock.now
    func at(_ milliseconds: Int) -> ContinuousClock.Instant { start + .milliseconds(milliseconds) }

    /// A large store's checkpoint that the pace holds back past its last commit is not lost: the loop is told when it
    /// may start, and it is due then with no commit after it (the Python client's late-digest test missed the digest
    /// of its last events under CI's load without this).
    @Test func aCheckpointThePaceHeldBackIsDueWhenThePaceAllowsWithoutAnotherCommit() throws {
        let store = try StoreName("todos")
        var checkpoints = Checkpoints(everyEvents: 10, offLoopBytes: 0, stores: [store: 1_000])
        #expect(checkpoints.nextDeferred() == nil)
        checkpoints.committed(store, events: 10)
        let first = try #require(checkpoints.due(store, snapshotDue: false, now: at(0)))
        #expect(first.place == .background)
        // Room for the state as recovered and an eighth more: encoded into one buffer.
        #expect(first.expectedBytes == 1_125)
        checkpoints.started(first, seq: 10, now: at(0))
        // Done in 20 ms: the next may start 200 ms after the first did.
        let taken = Checkpoints.Taken(
            store: store,
            epoch: Epoch(rawValue: 1),
            seq: 10,
            bytes: 1_000,
            cost: .milliseconds(20),
            generation: checkpoints.generation
        )
        let finished = checkpoints.finished(taken)
        #expect(finished)
        checkpoints.committed(store, events: 10)
        #expect(checkpoints.due(store, snapshotDue: false, now: at(50)) == nil)
        #expect(checkpoints.nextDeferred() == at(0) + .milliseconds(20) * Checkpoints.paceFactor)
        #expect(checkpoints.due(store, snapshotDue: false, now: at(200)) == first)
        checkpoints.started(first, seq: 20, now: at(200))
        #expect(checkpoints.nextDeferred() == nil)
    }
}
