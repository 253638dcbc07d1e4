import Foundation
import Lockstep
import LockstepExamples
import LockstepJournal
import LockstepProtocol
import LockstepServer
import TestSupport
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
        var checkpoints = Checkpoints(everyEvents: 10, offLoopBytes: 0, stores: [store: 1_000], recoveredAt: at(0))
        // Recovered from a snapshot too large for the loop: a checkpoint at the recovered seq is due at once, with no
        // commit (a `DigestedDictionary` decoded from it takes its sum then, before the first actions).
        #expect(checkpoints.nextDeferred(published: { _ in true }) == at(0))
        #expect(checkpoints.nextDeferred(published: { _ in false }) == nil, "not before its events are published")
        let first = try #require(checkpoints.due(store, snapshotDue: false, now: at(0)))
        #expect(first.place == .background)
        // Room for the state as recovered and an eighth more: encoded into one buffer.
        #expect(first.expectedBytes == 1_125)
        checkpoints.started(first, seq: 10, now: at(0))
        #expect(checkpoints.nextDeferred(published: { _ in true }) == nil)
        // Done in 20 ms: the next may start 200 ms after the first did.
        let taken = Checkpoints.Taken(
            store: store,
            epoch: Epoch(rawValue: 1),
            seq: 10,
            cost: .milliseconds(20),
            generation: checkpoints.generation
        )
        let finished = checkpoints.finished(taken)
        #expect(finished)
        checkpoints.committed(store, events: 10)
        #expect(checkpoints.due(store, snapshotDue: false, now: at(50)) == nil)
        #expect(
            checkpoints.nextDeferred(published: { _ in true }) == at(0) + .milliseconds(20) * Checkpoints.paceFactor
        )
        #expect(checkpoints.due(store, snapshotDue: false, now: at(200)) == first)
        checkpoints.started(first, seq: 20, now: at(200))
        #expect(checkpoints.nextDeferred(published: { _ in true }) == nil)
    }

    /// A state whose digest form is small (a large `DigestedDictionary` and little else) has its digests taken on the
    /// loop, and only its snapshots off it; a snapshot the pace holds back does not hold back a digest.
    @Test func aSmallDigestFormIsDigestedOnTheLoopAndOnlyItsSnapshotsGoOffIt() throws {
        let store = try StoreName("inventory")
        var checkpoints = Checkpoints(everyEvents: 10, offLoopBytes: 1_000, stores: [store: 50_000], recoveredAt: at(0))
        // Recovered: the digest form's size is not known, and a decoded dictionary's sum is taken at its first digest.
        let first = try #require(checkpoints.due(store, snapshotDue: false, now: at(0)))
        #expect(first.place == .background && !first.snapshot)
        checkpoints.started(first, seq: 10, now: at(0))
        let digested = Checkpoints.Work(
            digest: StateDigest(of: [1]),
            snapshot: nil,
            bytes: nil,
            digestBytes: 100,
            isCondensed: true
        )
        let done = Checkpoints.Taken(
            store: store,
            epoch: Epoch(rawValue: 1),
            seq: 10,
            work: digested,
            cost: .milliseconds(20),
            generation: checkpoints.generation
        )
        let finished = checkpoints.finished(done)
        #expect(finished)
        // Now 100 bytes to digest: on the loop, at once, pace or not; room for them and an eighth.
        checkpoints.committed(store, events: 10)
        let onLoop = try #require(checkpoints.due(store, snapshotDue: false, now: at(1)))
        #expect(onLoop.place == .loop && !onLoop.snapshot && onLoop.expectedDigestBytes == 112)
        checkpoints.tookOnLoop(onLoop, digested)
        // A snapshot due: the canonical form is 50,000 bytes, so it goes off the loop — once the pace allows; until
        // then a digest that is due is still taken on the loop, without the snapshot.
        #expect(checkpoints.due(store, snapshotDue: true, now: at(50)) == nil)
        checkpoints.committed(store, events: 10)
        let paced = try #require(checkpoints.due(store, snapshotDue: true, now: at(50)))
        #expect(paced.place == .loop && !paced.snapshot)
        checkpoints.tookOnLoop(paced, digested)
        let snapshot = try #require(checkpoints.due(store, snapshotDue: true, now: at(200)))
        #expect(snapshot.place == .background && snapshot.snapshot && snapshot.expectedBytes == 56_250)

        // A condensed state last measured small may have grown since its last snapshot: its snapshots go off the loop.
        let small = try StoreName("small")
        var fresh = Checkpoints(everyEvents: 10, offLoopBytes: 1_000, stores: [small: 500], recoveredAt: at(0))
        #expect(fresh.nextDeferred(published: { _ in true }) == nil, "no recovery checkpoint under the bound")
        fresh.committed(small, events: 10)
        let cheap = try #require(fresh.due(small, snapshotDue: false, now: at(1)))
        #expect(cheap.place == .loop)
        fresh.tookOnLoop(cheap, digested)
        let grown = try #require(fresh.due(small, snapshotDue: true, now: at(2)))
        #expect(grown.place == .background && grown.snapshot)
    }

    /// A state whose digest form condenses: a `DigestedDictionary` beside a number.
    enum Shelves: Domain {
        struct State: Codable, Equatable, Sendable {
            var items = DigestedDictionary<Int, String>()
            var next = 0
        }
        enum Action: Codable, Equatable, Sendable { case put(String) }
        static let name = "shelves"
        static let version: UInt32 = 1
        static var initialState: State { State() }
        static func reduce(into state: inout State, _ action: Action) {
            guard case let .put(text) = action else { return }
            state.items[state.next] = text
            state.next += 1
        }
    }

    /// A checkpoint off the loop streams the state: into the log journal's snapshot file as it is encoded (once,
    /// hashed on the way, when the digest form is the canonical form; again after a digest form that condensed), never
    /// held whole; a journal that keeps snapshots in its commits gets it written whole, once. Either commits and reads
    /// back as the state's canonical bytes.
    @Test func aCheckpointOffTheLoopStreamsTheStateIntoTheSnapshotFile() throws {
        let directory = try temporaryDirectory("checkpoint-stream")
        defer { try? FileManager.default.removeItem(at: directory) }
        var todos = Todos.initialState
        var shelves = Shelves.initialState
        for index in 0..<2_000 {
            Todos.reduce(into: &todos, .add(text: "todo \(index)"))
            Shelves.reduce(into: &shelves, .put("item \(index)"))
        }
        let epoch = Epoch(rawValue: 1)
        let todosStore = try DomainStore(Todos.self, epoch: epoch, lastSeq: 1, state: todos)
        let shelvesStore = try DomainStore(Shelves.self, epoch: epoch, lastSeq: 1, state: shelves)
        func plan(_ name: String) throws -> Checkpoints.Plan {
            Checkpoints.Plan(store: try StoreName(name), place: .background, snapshot: true)
        }
        let log = try LogJournal(directory: directory.appendingPathComponent("log").path)
        let sqlite = try SQLiteJournal(directory: directory.appendingPathComponent("sqlite").path)
        for journal in [log, sqlite] as [any Journal] {
            _ = try journal.recover(Todos.self)
            _ = try journal.recover(Shelves.self)
            try journal.commit(
                JournalBatch(
                    events: [Todos.name, Shelves.name].map {
                        JournalEvent(
                            store: $0,
                            seq: 1,
                            action: Array("{}".utf8),
                            clientID: [UInt8](repeating: 1, count: 16),
                            requestNumber: 0
                        )
                    }
                )
            )
        }
        let todosBytes = try CanonicalEncoding.bytes(of: todos)
        let shelvesBytes = try CanonicalEncoding.bytes(of: shelves)
        let shelvesForm = try CanonicalEncoding.digestForm(of: shelves)

        let streamed = try Checkpoints.Work(try plan(Todos.name), streaming: todosStore, stagingIn: log)
        #expect(streamed.digest == StateDigest(of: todosBytes) && !streamed.isCondensed)
        #expect(streamed.bytes == todosBytes.count && streamed.digestBytes == todosBytes.count)
        let staged = try #require(streamed.snapshot)
        #expect(staged.state.isEmpty && staged.stagedBytes == todosBytes.count)
        #expect(staged.digest == StateDigest(of: todosBytes))

        let condensed = try Checkpoints.Work(try plan(Shelves.name), streaming: shelvesStore, stagingIn: log)
        #expect(condensed.isCondensed && condensed.digest == shelvesForm.digest)
        #expect(condensed.digestBytes == shelvesForm.bytes.count && condensed.bytes == shelvesBytes.count)
        let stagedShelves = try #require(condensed.snapshot)
        #expect(
            stagedShelves.stagedBytes == shelvesBytes.count && stagedShelves.digest == StateDigest(of: shelvesBytes)
        )
        try log.commit(JournalBatch(snapshots: [staged, stagedShelves]))
        #expect(try log.snapshot(store: Todos.name, seq: 1)?.state == todosBytes)
        #expect(try log.snapshot(store: Shelves.name, seq: 1)?.state == shelvesBytes)

        let whole = try Checkpoints.Work(try plan(Todos.name), streaming: todosStore, stagingIn: sqlite)
        #expect(whole.digest == StateDigest(of: todosBytes))
        #expect(whole.snapshot?.stagedBytes == nil && whole.snapshot?.state == todosBytes)
        try sqlite.commit(JournalBatch(snapshots: [try #require(whole.snapshot)]))
        #expect(try sqlite.snapshot(store: Todos.name, seq: 1)?.state == todosBytes)
        try log.close()
        try sqlite.close()
    }
}
