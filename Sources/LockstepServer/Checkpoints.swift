import Lockstep
import LockstepJournal
import LockstepProtocol

/// When and where the leader takes each store's checkpoint — the digest replicas compare with their own, and the
/// snapshot the journal keeps — as a value: no thread, no clock and no state of a store in it (docs/architecture.md,
/// "Checkpoints").
///
/// A checkpoint is due once a store has committed ``everyEvents`` events since its last one, or its journal is due a
/// snapshot. Its work is the state's digest form (its canonical form, unless it holds a `DigestedDictionary`:
/// `CanonicalEncoding.digestForm(of:reservingCapacity:)`), and the canonical form too for a snapshot. Work under
/// ``offLoopBytes`` (sizes as last encoded) is done on the loop as the group that reached it is committed, and its
/// DIGEST follows the group's events. More is done on another thread from the store as it stood then (a value the
/// loop no longer changes): the loop publishes a CHECKPOINT after the events instead, and the DIGEST once the work is
/// done; the snapshot goes into a later commit. One store has at most one checkpoint off the loop at a time, and
/// starts the next no sooner than ``paceFactor`` times the last one's cost after the last one started: however large
/// the state, its checkpoints take at most a tenth of a core. A state whose digest form is small (a large
/// `DigestedDictionary` and little else) has its digests taken on the loop, and only its snapshots off it.
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
        /// The same for its digest form.
        package var expectedDigestBytes = 0

        /// A checkpoint of `store` at `place`, and a snapshot too when `snapshot`.
        package init(
            store: StoreName,
            place: Place,
            snapshot: Bool,
            expectedBytes: Int = 0,
            expectedDigestBytes: Int = 0
        ) {
            self.store = store
            self.place = place
            self.snapshot = snapshot
            self.expectedBytes = expectedBytes
            self.expectedDigestBytes = expectedDigestBytes
        }
    }

    /// What a checkpoint makes of a store, on the loop or off it.
    package struct Work: Sendable {
        /// The state's digest: the SHA-256 of its digest form.
        package var digest: StateDigest
        /// The state, when the plan makes it a snapshot.
        package var snapshot: JournalSnapshot?
        /// The size of the canonical state, when it was written; of its digest form.
        package var bytes: Int?
        package var digestBytes: Int
        /// Whether the digest form condensed part of the state (it holds a `DigestedDictionary`).
        package var isCondensed: Bool

        /// Work done: `digest` over `digestBytes` bytes, and the snapshot of `bytes` bytes, if any.
        package init(
            digest: StateDigest,
            snapshot: JournalSnapshot?,
            bytes: Int?,
            digestBytes: Int,
            isCondensed: Bool = false
        ) {
            self.digest = digest
            self.snapshot = snapshot
            self.bytes = bytes
            self.digestBytes = digestBytes
            self.isCondensed = isCondensed
        }

        /// The work `plan` asks of `store` at its current seq.
        package init(_ plan: Plan, of store: some SequencedStore) throws {
            let form = try store.digestForm(expectedBytes: plan.expectedDigestBytes)
            digest = form.digest
            digestBytes = form.bytes.count
            isCondensed = !form.isCanonicalForm
            bytes = form.isCanonicalForm ? form.bytes.count : nil
            guard plan.snapshot else { return }
            if form.isCanonicalForm {
                snapshot = JournalSnapshot(
                    store: store.name.rawValue,
                    seq: store.lastSeq,
                    state: form.bytes,
                    digest: digest
                )
            } else {
                try encodeSnapshot(plan, of: store)
            }
        }

        /// The snapshot of `store`'s state written whole, for a state whose digest form is not its canonical form
        /// (or whose file could not be staged): the canonical bytes, hashed here unless they are the digest form's.
        private mutating func encodeSnapshot(_ plan: Plan, of store: some SequencedStore) throws {
            let state = try store.encodedState(expectedBytes: plan.expectedBytes)
            let (name, seq) = (store.name.rawValue, store.lastSeq)
            snapshot =
                isCondensed
                ? JournalSnapshot(store: name, seq: seq, state: state)
                : JournalSnapshot(store: name, seq: seq, state: state, digest: digest)
            bytes = state.count
        }

        /// The work `plan` asks of `store` off the loop (its state is large), the state streamed rather than written whole
        /// (`CanonicalEncoding.streamed`): the digest form hashed as it is written and, for a snapshot, the canonical
        /// form written to the file `journal` stages for it on the way — one pass when the two are the same bytes. A
        /// state that does not stream, or a journal that keeps snapshots in its commits, is written whole
        /// (``init(_:of:)``).
        package init(_ plan: Plan, streaming store: some SequencedStore, stagingIn journal: any Journal) throws {
            let (name, seq) = (store.name.rawValue, store.lastSeq)
            var form: CanonicalEncoding.Streamed?
            var snapshot: JournalSnapshot?
            if plan.snapshot {
                var staging = false
                snapshot = journal.stageSnapshot(store: name, seq: seq) { sink in
                    staging = true
                    form = store.streamed(digestForm: true, into: sink)
                    // Kept when the digest form is the canonical one; a condensed one is written again, whole, below.
                    return form.flatMap { $0.isCanonicalForm ? $0.digest : nil }
                }
                // Such a journal needs the state in hand: written once, for the digest and the snapshot.
                guard staging else {
                    try self.init(plan, of: store)
                    return
                }
            } else {
                form = store.streamed(digestForm: true) { _ in }
            }
            guard let form else {
                try self.init(plan, of: store)
                return
            }
            self.init(
                digest: form.digest,
                snapshot: nil,
                bytes: form.isCanonicalForm ? form.bytes : nil,
                digestBytes: form.bytes,
                isCondensed: !form.isCanonicalForm
            )
            guard plan.snapshot else { return }
            if snapshot == nil, isCondensed {
                snapshot = journal.stageSnapshot(store: name, seq: seq) {
                    store.streamed(digestForm: false, into: $0)?.digest
                }
            }
            if let snapshot {
                self.snapshot = snapshot
                bytes = snapshot.stagedBytes
                return
            }
            // The file could not be written: the state whole, in the commit.
            try encodeSnapshot(plan, of: store)
        }
    }

    /// What the checkpoint thread made of a store.
    package struct Taken: Sendable {
        package var store: StoreName
        package var epoch: Epoch
        package var seq: SequenceNumber
        /// What it made; `nil` when the state did not encode (`failure` says why).
        package var work: Work? = nil
        package var cost: Duration
        package var failure: String? = nil
        /// The ``Checkpoints/generation`` it was started in: a result of an earlier one (or of an earlier leadership)
        /// is void.
        package var generation: UInt64

        /// What the thread made of `store` at `seq` of `epoch` in `cost`, started in `generation`.
        package init(
            store: StoreName,
            epoch: Epoch,
            seq: SequenceNumber,
            work: Work? = nil,
            cost: Duration,
            failure: String? = nil,
            generation: UInt64
        ) {
            self.store = store
            self.epoch = epoch
            self.seq = seq
            self.work = work
            self.cost = cost
            self.failure = failure
            self.generation = generation
        }
    }

    private struct Track {
        var sinceLast = 0
        /// The size of the canonical state when it was last encoded (or recovered).
        var bytes: Int
        /// The size of its digest form when last written (until then, taken to be ``bytes``).
        var digestBytes: Int
        /// Whether the digest form condensed part of the state when last written: the canonical size is then known
        /// only from the last snapshot.
        var isCondensed = false
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

    /// The checkpoints of stores of about `bytes` bytes each, recovered at `now`, every `everyEvents` events.
    package init(
        everyEvents: Int,
        offLoopBytes: Int,
        stores bytes: [StoreName: Int],
        recoveredAt now: ContinuousClock.Instant
    ) {
        self.everyEvents = everyEvents
        self.offLoopBytes = offLoopBytes
        recovered(bytes, at: now)
    }

    /// Stores recovered at `now`, of about `bytes` bytes each. One recovered from a snapshot too large for the loop
    /// has a checkpoint due at once, at its recovered seq: its digest form was never written in this process, and a
    /// `DigestedDictionary` decoded from the snapshot takes its members' sum then — off the loop, before the first
    /// actions rather than among them.
    private mutating func recovered(_ bytes: [StoreName: Int], at now: ContinuousClock.Instant) {
        for (store, size) in bytes {
            let known = tracks[store]
            var track = Track(bytes: max(size, known?.bytes ?? 0), digestBytes: max(size, known?.digestBytes ?? 0))
            if size > 0, size >= offLoopBytes {
                track.sinceLast = everyEvents
                track.startedAt = now
            }
            tracks[store] = track
        }
    }

    /// Whether `store`'s state is checkpointed off the loop: SNAPSHOT requests are then answered from its newest
    /// snapshot in the journal rather than by encoding it again.
    func isLarge(_ store: StoreName) -> Bool { (tracks[store]?.bytes ?? 0) >= offLoopBytes }

    /// `events` more events of `store` were sequenced into the group being committed.
    package mutating func committed(_ store: StoreName, events: Int) {
        tracks[store, default: Track(bytes: 0, digestBytes: 0)].sinceLast += events
    }

    /// The checkpoint `store` is due now, if any; `snapshotDue` says whether its journal is due a snapshot.
    package func due(_ store: StoreName, snapshotDue: Bool, now: ContinuousClock.Instant) -> Plan? {
        let track = tracks[store] ?? Track(bytes: 0, digestBytes: 0)
        let digestDue = track.sinceLast >= everyEvents
        guard track.taking == nil, digestDue || snapshotDue else { return nil }
        func plan(_ place: Place, snapshot: Bool) -> Plan {
            Plan(
                store: store,
                place: place,
                snapshot: snapshot,
                expectedBytes: CanonicalEncoding.capacity(forLastSize: track.bytes),
                expectedDigestBytes: CanonicalEncoding.capacity(forLastSize: track.digestBytes)
            )
        }
        let digestOnLoop = track.digestBytes < offLoopBytes
        // A condensed state may have grown past the loop's bound since its last snapshot measured it.
        let snapshotOnLoop = !track.isCondensed && track.bytes < offLoopBytes
        if digestOnLoop, !snapshotDue || snapshotOnLoop { return plan(.loop, snapshot: snapshotDue) }
        if let started = track.startedAt, now - started < track.cost * Self.paceFactor {
            // The snapshot waits for the pace; a digest that is cheap does not.
            return digestOnLoop && digestDue ? plan(.loop, snapshot: false) : nil
        }
        return plan(.background, snapshot: snapshotDue)
    }

    /// When a checkpoint that the pace held back past a store's last commit may start: the loop wakes then and takes
    /// it (``Serving/takeDeferredCheckpoints(_:)``), so a store that goes quiet still gets the digest of its last
    /// events. Only for the stores `published` says have every event published (the others are taken once they
    /// have); `nil` when none waits.
    package func nextDeferred(published: (StoreName) -> Bool) -> ContinuousClock.Instant? {
        tracks.compactMap { store, track in
            // One held back while another was being taken: a cheap digest may be taken at once.
            guard track.sinceLast >= everyEvents, track.taking == nil, let started = track.startedAt, published(store)
            else { return nil }
            return track.digestBytes < offLoopBytes ? started : started + track.cost * Self.paceFactor
        }.min()
    }

    /// The checkpoint `plan` was taken on the loop, making `work`.
    package mutating func tookOnLoop(_ plan: Plan, _ work: Work) {
        tracks[plan.store, default: Track(bytes: 0, digestBytes: 0)].sinceLast = 0
        learn(work, of: plan.store)
    }

    /// The checkpoint `plan` could not be taken on the loop (the state did not encode; the caller logs why): the
    /// next is due after another ``everyEvents`` events.
    package mutating func failedOnLoop(_ plan: Plan) {
        tracks[plan.store]?.sinceLast = 0
    }

    private mutating func learn(_ work: Work, of store: StoreName) {
        tracks[store]?.digestBytes = work.digestBytes
        tracks[store]?.isCondensed = work.isCondensed
        if let bytes = work.bytes { tracks[store]?.bytes = bytes }
    }

    /// The checkpoint `plan` was handed to the checkpoint thread at `seq`.
    package mutating func started(_ plan: Plan, seq: SequenceNumber, now: ContinuousClock.Instant) {
        tracks[plan.store, default: Track(bytes: 0, digestBytes: 0)].sinceLast = 0
        tracks[plan.store]?.taking = seq
        tracks[plan.store]?.startedAt = now
    }

    /// What the checkpoint thread made: `true` when it belongs to this generation (else it is void).
    package mutating func finished(_ taken: Taken) -> Bool {
        guard taken.generation == generation, tracks[taken.store]?.taking == taken.seq else { return false }
        tracks[taken.store]?.taking = nil
        tracks[taken.store]?.cost = taken.cost
        if let work = taken.work { learn(work, of: taken.store) }
        return true
    }

    /// The stores were recovered anew at `now`: nothing being taken counts any more.
    mutating func restart(stores bytes: [StoreName: Int], at now: ContinuousClock.Instant) {
        generation += 1
        recovered(bytes, at: now)
    }
}
