import Lockstep
import LockstepProtocol

/// When and where the leader takes each store's checkpoint — the digest replicas compare with their own, and the
/// snapshot the journal keeps — as a value: no thread, no clock and no state of a store in it (docs/architecture.md,
/// "Checkpoints").
///
/// A checkpoint is due once a store has committed ``everyEvents`` events since its last one, or its journal is due a
/// snapshot. A small state (under ``offLoopBytes`` when last encoded) is encoded on the loop as the group that reached
/// it is committed, and its DIGEST follows the group's events. A larger one is encoded and hashed on another thread
/// from the store as it stood then (a value the loop no longer changes): the loop publishes a CHECKPOINT after the
/// events instead, and the DIGEST once the work is done; the snapshot goes into a later commit. One store has at most
/// one checkpoint off the loop at a time, and starts the next no sooner than ``paceFactor`` times the last one's cost
/// after the last one started: however large the state, its checkpoints take at most a tenth of a core.
package struct Checkpoints {
    /// Where a checkpoint is taken.
    package enum Place: Hashable, Sendable {
        /// Encoded on the loop now; the DIGEST goes out with the group's events.
        case loop
        /// Encoded and hashed on the checkpoint thread; a CHECKPOINT goes out with the events, the DIGEST later.
        case background
    }

    /// A checkpoint to take now, at the store's current seq.
    package struct Plan: Hashable, Sendable {
        package var store: StoreName
        package var place: Place
        /// Whether the journal keeps this one as a snapshot.
        package var snapshot: Bool
        /// The room to encode the state in: its last size and an eighth, so that a large state's bytes are written
        /// into one buffer, not regrown (and copied) on the way.
        package var expectedBytes = 0
    }

    /// What the checkpoint thread made of a store.
    package struct Taken: Sendable {
        package var store: StoreName
        package var epoch: Epoch
        package var seq: SequenceNumber
        /// The canonical state's digest; `nil` when the state did not encode (`failure` says why).
        package var digest: StateDigest? = nil
        /// The canonical state, when the journal keeps it as a snapshot.
        package var state: Frame? = nil
        package var bytes: Int
        package var cost: Duration
        package var failure: String? = nil
        /// The ``Checkpoints/generation`` it was started in: a result of an earlier one (or of an earlier leadership)
        /// is void.
        package var generation: UInt64

        /// What the thread made of `store` at `seq` of `epoch`: `bytes` bytes in `cost`, started in `generation`.
        package init(
            store: StoreName,
            epoch: Epoch,
            seq: SequenceNumber,
            digest: StateDigest? = nil,
            state: Frame? = nil,
            bytes: Int,
            cost: Duration,
            failure: String? = nil,
            generation: UInt64
        ) {
            self.store = store
            self.epoch = epoch
            self.seq = seq
            self.digest = digest
            self.state = state
            self.bytes = bytes
            self.cost = cost
            self.failure = failure
            self.generation = generation
        }
    }

    private struct Track {
        var sinceLast = 0
        /// The size of the canonical state when it was last encoded (or recovered).
        var bytes: Int
        /// How long the last checkpoint off the loop took to encode and hash.
        var cost: Duration = .zero
        var startedAt: ContinuousClock.Instant?
        /// The seq of the checkpoint being taken off the loop.
        var taking: SequenceNumber?
    }

    /// A store's next checkpoint off the loop starts no sooner than this many times the last one's cost after it.
    package static var paceFactor: Int { 10 }

    /// Events between checkpoints (`[intervals] digest_every_events`).
    let everyEvents: Int
    /// A state of at least this many bytes is checkpointed off the loop (`[intervals] checkpoint_off_loop_bytes`).
    let offLoopBytes: Int
    /// Random at first (so a leadership never takes an earlier one's result), one more each time the stores were
    /// recovered anew: what was being taken before is void.
    package private(set) var generation = UInt64.random(in: 0...UInt64.max / 2)
    private var tracks: [StoreName: Track] = [:]

    /// The checkpoints of stores of about `bytes` bytes each, every `everyEvents` events.
    package init(everyEvents: Int, offLoopBytes: Int, stores bytes: [StoreName: Int]) {
        self.everyEvents = everyEvents
        self.offLoopBytes = offLoopBytes
        tracks = bytes.mapValues { Track(bytes: $0) }
    }

    /// Whether `store`'s state is checkpointed off the loop: SNAPSHOT requests are then answered from its newest
    /// snapshot in the journal rather than by encoding it again.
    func isLarge(_ store: StoreName) -> Bool { (tracks[store]?.bytes ?? 0) >= offLoopBytes }

    /// `events` more events of `store` were sequenced into the group being committed.
    package mutating func committed(_ store: StoreName, events: Int) {
        tracks[store, default: Track(bytes: 0)].sinceLast += events
    }

    /// The checkpoint `store` is due now, if any; `snapshotDue` says whether its journal is due a snapshot.
    package func due(_ store: StoreName, snapshotDue: Bool, now: ContinuousClock.Instant) -> Plan? {
        let track = tracks[store] ?? Track(bytes: 0)
        guard track.taking == nil, track.sinceLast >= everyEvents || snapshotDue else { return nil }
        let expectedBytes = CanonicalEncoding.capacity(forLastSize: track.bytes)
        guard track.bytes >= offLoopBytes else {
            return Plan(store: store, place: .loop, snapshot: snapshotDue, expectedBytes: expectedBytes)
        }
        if let started = track.startedAt, now - started < track.cost * Self.paceFactor { return nil }
        return Plan(store: store, place: .background, snapshot: snapshotDue, expectedBytes: expectedBytes)
    }

    /// When a checkpoint that the pace held back past a store's last commit may start: the loop wakes then and takes
    /// it (``Serving/takeDeferredCheckpoints(_:)``), so a store that goes quiet still gets the digest of its last
    /// events. `nil` when none waits on the pace.
    package func nextDeferred() -> ContinuousClock.Instant? {
        tracks.values.compactMap { track in
            guard track.sinceLast >= everyEvents, track.taking == nil, track.bytes >= offLoopBytes,
                let started = track.startedAt
            else { return nil }
            return started + track.cost * Self.paceFactor
        }.min()
    }

    /// The checkpoint `plan` was taken on the loop: its state had `bytes` bytes.
    mutating func tookOnLoop(_ plan: Plan, bytes: Int) {
        tracks[plan.store, default: Track(bytes: 0)].sinceLast = 0
        tracks[plan.store]?.bytes = bytes
    }

    /// The checkpoint `plan` was handed to the checkpoint thread at `seq`.
    package mutating func started(_ plan: Plan, seq: SequenceNumber, now: ContinuousClock.Instant) {
        tracks[plan.store, default: Track(bytes: 0)].sinceLast = 0
        tracks[plan.store]?.taking = seq
        tracks[plan.store]?.startedAt = now
    }

    /// What the checkpoint thread made: `true` when it belongs to this generation (else it is void).
    package mutating func finished(_ taken: Taken) -> Bool {
        guard taken.generation == generation, tracks[taken.store]?.taking == taken.seq else { return false }
        tracks[taken.store]?.taking = nil
        tracks[taken.store]?.cost = taken.cost
        if taken.digest != nil { tracks[taken.store]?.bytes = taken.bytes }
        return true
    }

    /// The stores were recovered anew: nothing being taken counts any more.
    mutating func restart(stores bytes: [StoreName: Int]) {
        generation += 1
        for (store, size) in bytes {
            tracks[store] = Track(bytes: max(size, tracks[store]?.bytes ?? 0))
        }
    }
}
