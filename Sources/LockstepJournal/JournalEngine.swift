import Foundation
import Lockstep

/// A store as the journal records it.
struct StoreRecord: Hashable, Sendable {
    var name: String
    var domainVersion: UInt32
    var epoch: UInt64
}

/// An event as read back, with the checksum stored beside it (not yet compared).
struct StoredEvent: Sendable {
    var event: JournalEvent
    var storedChecksum: Int64

    var checksumMatches: Bool { storedChecksum == Int64(event.checksum) }
}

/// Events at or below `throughSeq` and snapshots below it are deleted.
struct Compaction: Hashable, Sendable {
    var store: String
    var throughSeq: UInt64
}

/// Everything one commit writes, checked by the engine; storage writes it in one transaction.
struct CommitPlan: Sendable {
    var batch: JournalBatch
    var compactions: [Compaction]
    var idempotencyKept: Int
    /// Stores that now run another domain version, from a seq on (an upgrade at recovery).
    var upgrades: [JournalDomainVersion] = []
}

/// What a range read found, in one consistent read.
struct StoredRange: Sendable {
    /// The first seq kept as an event, or the newest snapshot's seq + 1 (or 1) when no event is kept.
    var firstAvailable: UInt64
    /// The store's last seq: the larger of its last event and its newest snapshot.
    var lastSeq: UInt64
    var events: [StoredEvent]
    /// The events stopped short of `limit` and `to` because the next would have passed the byte budget.
    var stoppedAtBytes = false
}

/// How many bytes of actions a range read may still take: the first event always, the next ones while they fit.
/// Both storages read through one, so they stop at the same event.
struct ByteBudget {
    let maximum: Int
    private(set) var used = 0
    private(set) var exhausted = false

    init(_ maximum: Int) { self.maximum = maximum }

    /// Takes an event of `size` bytes if it fits (or is the first); false, and exhausted, when it does not.
    mutating func admit(_ size: Int) -> Bool {
        guard used == 0 || used + size <= maximum else {
            exhausted = true
            return false
        }
        used += size
        return true
    }
}

/// Where the journal's records live. Implementations only store and fetch; the rules live in `JournalEngine`.
protocol JournalStorage: Sendable {
    var location: String { get }
    var formatVersion: Int { get }
    var isReadOnly: Bool { get }

    func storeRecord(named name: String) throws(JournalError) -> StoreRecord?
    func storeRecords() throws(JournalError) -> [StoreRecord]
    /// Durable before it returns; the record's version is the store's first, since seq 0.
    func register(_ record: StoreRecord) throws(JournalError)
    /// The versions that wrote the store, oldest first.
    func versionHistory(store: String) throws(JournalError) -> [JournalDomainVersion]
    /// Ascending.
    func snapshotSeqs(store: String) throws(JournalError) -> [UInt64]
    /// As stored; the digest is not checked here.
    func snapshot(store: String, seq: UInt64) throws(JournalError) -> JournalSnapshot?
    /// Every event of `store` with `from` ≤ seq ≤ `through`, ascending.
    func forEachEvent(
        store: String,
        from: UInt64,
        through: UInt64,
        _ body: (StoredEvent) throws(JournalError) -> Void
    ) throws(JournalError)
    func eventSummary(store: String) throws(JournalError) -> (first: UInt64, last: UInt64, count: Int)?
    /// Events `from...to`, at most `limit`, and no more than `maximumBytes` of actions (always at least one).
    func readRange(
        store: String,
        from: UInt64,
        to: UInt64,
        limit: Int,
        maximumBytes: Int
    ) throws(JournalError) -> StoredRange
    /// One transaction, durable before it returns; on error nothing of it is kept.
    func write(_ plan: CommitPlan) throws(JournalError)
    func idempotencyRecord(for key: IdempotencyKey) throws(JournalError) -> IdempotencyRecord?
    /// Oldest first.
    func forEachIdempotencyRecord(_ body: (IdempotencyRecord) throws(JournalError) -> Void) throws(JournalError)
    func idempotencyCount() throws(JournalError) -> Int
    func fileBytes() -> Int64?
    /// What the storage itself finds damaged (SQLite's integrity check); empty when intact.
    func integrityProblems() throws(JournalError) -> [String]
    /// The effects not done and the timers not fired, with their stored checksums (not yet compared), each in id
    /// order; nothing when the journal's format has no outbox.
    func storedOutbox() throws(JournalError) -> (effects: [(JournalEffect, Int64)], timers: [(JournalTimer, Int64)])
    func close() throws(JournalError)
}

/// A journal that is its engine over one storage: every query of `Journal` is answered here once, for both the
/// SQLite and the in-memory journal; each keeps only what differs (opening, `sync`, `close`).
protocol EngineJournal: Journal {
    associatedtype Storage: JournalStorage
    var engine: JournalEngine<Storage> { get }
}

extension EngineJournal {
    /// Where the journal lives: the SQLite file's path, or `memory`.
    public var location: String { engine.storage.location }
    /// The journal's policy.
    public var policy: JournalPolicy { engine.policy }

    /// The state of `domain`'s store that the journal can prove, registering or upgrading the store when needed; see
    /// ``Journal/recover(_:)``.
    public func recover<D: Domain>(_ domain: D.Type) throws(JournalError) -> RecoveredStore<D> {
        try engine.recover(domain)
    }

    /// Throws, writing nothing, the refusal that ``Journal/recover(_:)`` would throw for `domain`'s store; see
    /// ``Journal/checkTakeOver(_:)``.
    public func checkTakeOver<D: Domain>(_ domain: D.Type) throws(JournalError) {
        try engine.checkTakeOver(domain)
    }

    /// Checks the batch against the journal's rules, writes it in one transaction and returns once it is durable; see
    /// ``Journal/commit(_:)``.
    public func commit(_ batch: JournalBatch) throws(JournalError) {
        try engine.commit(batch)
    }

    /// Whether the store is due a snapshot once these events are committed, by the journal's ``JournalPolicy``; see
    /// ``Journal/snapshotDue(store:pendingEvents:pendingBytes:)``.
    public func snapshotDue(store: String, pendingEvents: Int, pendingBytes: Int) -> Bool {
        engine.snapshotDue(store: store, pendingEvents: pendingEvents, pendingBytes: pendingBytes)
    }

    /// The store's last committed seq, or `nil` for a store not recovered.
    public func lastSeq(store: String) -> UInt64? {
        engine.lastSeq(store: store)
    }

    /// The seq of the store's oldest snapshot kept, through which its events are compacted away (0 before any); see
    /// ``Journal/compactedThrough(store:)``.
    public func compactedThrough(store: String) -> UInt64? {
        engine.compactedThrough(store: store)
    }

    /// Events `from...to` of `store`, checksums checked, or where they start when compacted; see
    /// ``Journal/events(store:from:to:limit:)``.
    public func events(
        store: String,
        from: UInt64,
        to: UInt64,
        limit: Int,
        maximumBytes: Int
    ) throws(JournalError) -> JournalRange {
        try engine.events(store: store, from: from, to: to, limit: limit, maximumBytes: maximumBytes)
    }

    /// The store's newest snapshot, digest checked, or `nil` when it has none.
    public func newestSnapshot(store: String) throws(JournalError) -> JournalSnapshot? {
        try engine.newestSnapshot(store: store)
    }

    /// The state of `domain`'s store after exactly its events `1...seq`; see ``Journal/state(of:at:)``.
    public func state<D: Domain>(of domain: D.Type, at seq: UInt64) throws(JournalError) -> D.State {
        try engine.state(of: domain, at: seq)
    }

    /// The store's snapshot at `seq`, digest checked, or `nil` when none is kept there.
    public func snapshot(store: String, seq: UInt64) throws(JournalError) -> JournalSnapshot? {
        try engine.snapshot(store: store, seq: seq)
    }

    /// The idempotency entry kept for `key`, if any.
    public func idempotencyRecord(for key: IdempotencyKey) throws(JournalError) -> IdempotencyRecord? {
        try engine.storage.idempotencyRecord(for: key)
    }

    /// Calls `body` with every idempotency entry kept, oldest first, one at a time; see
    /// ``Journal/forEachIdempotencyRecord(_:)``.
    /// How many idempotency entries are kept.
    public func idempotencyRecordCount() throws(JournalError) -> Int {
        try engine.storage.idempotencyCount()
    }

    public func forEachIdempotencyRecord(
        _ body: (IdempotencyRecord) throws(JournalError) -> Void
    ) throws(JournalError) {
        try engine.storage.forEachIdempotencyRecord(body)
    }

    /// Per store: epoch, domain version, first and last seq, events and snapshots kept; and the file's size.
    public func stats() throws(JournalError) -> JournalStats {
        try engine.stats()
    }

    /// Checks the whole journal without a domain and returns what is wrong, empty when it is intact; see
    /// ``Journal/verify()``.
    public func verify() throws(JournalError) -> [JournalProblem] {
        try engine.verify()
    }

    /// The effects not done and the timers not fired, each checked; see ``Journal/outbox()``.
    public func outbox() throws(JournalError) -> JournalOutbox {
        try engine.outbox()
    }
}

/// The journal's rules — recovery, batch checks, snapshot policy, compaction, range answers — over any storage.
final class JournalEngine<Storage: JournalStorage>: Sendable {
    /// What the engine knows about a recovered store.
    struct Tracking: Sendable {
        var record: StoreRecord
        var lastSeq: UInt64
        /// Ascending.
        var snapshotSeqs: [UInt64]
        var eventsSinceSnapshot: Int
        var bytesSinceSnapshot: Int
    }

    let storage: Storage
    let policy: JournalPolicy
    /// Held across a whole recovery or commit, so each sees the tracking the previous one left.
    private let writeLock = LockedValue(())
    private let tracking = LockedValue<[String: Tracking]>([:])

    init(storage: Storage, policy: JournalPolicy) {
        self.storage = storage
        self.policy = policy
    }

    private func error(
        _ code: JournalError.Code,
        _ operation: String,
        store: String? = nil,
        seq: UInt64? = nil,
        _ message: String
    ) -> JournalError {
        JournalError(code: code, file: storage.location, operation: operation, store: store, seq: seq, message: message)
    }

    // MARK: Recovery

    func recover<D: Domain>(_ domain: D.Type) throws(JournalError) -> RecoveredStore<D> {
        try writeLock.withLockedValue { (_: inout Void) throws(JournalError) -> RecoveredStore<D> in
            try recoverLocked(domain)
        }
    }

    private func recoverLocked<D: Domain>(_: D.Type) throws(JournalError) -> RecoveredStore<D> {
        let operation = "recover"
        let name = D.name
        var record: StoreRecord
        if let existing = try storage.storeRecord(named: name) {
            record = existing
        } else {
            guard !storage.isReadOnly else {
                throw error(
                    .unknownStore,
                    operation,
                    store: name,
                    "the journal has no store '\(name)' and is open read-only, so it cannot register it; "
                        + "open it read-write (the daemon does) to start the store"
                )
            }
            record = StoreRecord(name: name, domainVersion: D.version, epoch: UInt64.random(in: 1...UInt64.max))
            try storage.register(record)
        }
        let writtenBy = record.domainVersion
        var proof = try prove(D.self, store: name, writtenBy: writtenBy)
        // A store with no event has nothing to migrate: it starts from this version's initial state, which is
        // also what a restart and every replica start from.
        if proof.lastSeq == 0 { proof.state = D.initialState }
        if writtenBy != D.version {
            // Journal the migrated state as this version's snapshot at the same seq, and drop what only the older
            // version can read: its events up to that seq and its older snapshots.
            let seq = proof.lastSeq
            var batch = JournalBatch()
            if seq > 0 {
                do {
                    batch.snapshots = [try JournalSnapshot(store: name, seq: seq, encoding: proof.state)]
                } catch {
                    throw self.error(
                        .undecodableState,
                        operation,
                        store: name,
                        seq: seq,
                        "the state migrated from \(name) version \(writtenBy) to \(D.version) does not encode: "
                            + "\(error); fix the upgrade's migration"
                    )
                }
            }
            try storage.write(
                CommitPlan(
                    batch: batch,
                    compactions: seq > 0 ? [Compaction(store: name, throughSeq: seq)] : [],
                    idempotencyKept: policy.idempotencyEntriesKept,
                    upgrades: [JournalDomainVersion(store: name, version: D.version, sinceSeq: seq)]
                )
            )
            record.domainVersion = D.version
            proof.snapshotSeqs = seq > 0 ? [seq] : []
            proof.replayed = 0
            proof.bytes = 0
        }
        tracking.withLockedValue {
            $0[name] = Tracking(
                record: record,
                lastSeq: proof.lastSeq,
                snapshotSeqs: proof.snapshotSeqs,
                eventsSinceSnapshot: proof.replayed,
                bytesSinceSnapshot: proof.bytes
            )
        }
        return RecoveredStore(
            state: proof.state,
            lastSeq: proof.lastSeq,
            epoch: record.epoch,
            domainVersion: record.domainVersion,
            snapshotSeq: proof.snapshotSeqs.last,
            replayedEvents: proof.replayed,
            stateBytesHint: proof.snapshotBytes + proof.bytes,
            upgradedFrom: writtenBy == D.version ? nil : writtenBy
        )
    }

    /// Checks, writing nothing, that `D` can take over its store: written by `D`'s version, or by an earlier one
    /// that `D`'s upgrades lead from on a read-write journal. A daemon checks every store it hosts before it
    /// recovers (and so perhaps upgrades) any, so that a refused start changes nothing.
    func checkTakeOver<D: Domain>(_: D.Type) throws(JournalError) {
        guard let record = try storage.storeRecord(named: D.name), record.domainVersion != D.version else { return }
        _ = try takeOver(D.self, store: D.name, writtenBy: record.domainVersion)
    }

    /// The upgrade by which `X` takes over a store written by `version` (another than `X.version`), or the refusal
    /// that names the store, both versions and what to do.
    private func takeOver<X: Domain>(
        _: X.Type,
        store name: String,
        writtenBy version: UInt32
    ) throws(JournalError) -> DomainUpgrade<X> {
        let operation = "recover"
        guard version < X.version else {
            throw error(
                .domainVersionMismatch,
                operation,
                store: name,
                "the store was written by \(name) domain version \(version), newer than this build's version "
                    + "\(X.version); run a build of version \(version) or later (a domain never goes back a version)"
            )
        }
        guard let upgrade = X.upgrade(from: version) else {
            throw error(
                .domainVersionMismatch,
                operation,
                store: name,
                "the store was written by \(name) domain version \(version), but this build has version "
                    + "\(X.version) and no upgrade from version \(version) (\(X.self).upgrades); run the build of "
                    + "version \(version), add a DomainUpgrade from version \(version) to the domain "
                    + "(docs/domains.md), or move the data directory aside to start the store afresh"
            )
        }
        guard !storage.isReadOnly else {
            throw error(
                .domainVersionMismatch,
                operation,
                store: name,
                "the store was written by \(name) domain version \(version) and this build has version "
                    + "\(X.version): the journal is open read-only, so it cannot be upgraded; start the daemon of "
                    + "version \(X.version) on it (it upgrades the store once) or read it with a build of version "
                    + "\(version)"
            )
        }
        return upgrade
    }

    /// What recovery proved of one store.
    private struct Proof<State> {
        var state: State
        var lastSeq: UInt64
        var snapshotSeqs: [UInt64]
        var replayed: Int
        var bytes: Int
        /// The size of the snapshot recovery started from (0 without one).
        var snapshotBytes = 0
    }

    /// The store's state as domain `X`: proven by the version that wrote it (`writtenBy`) and migrated through
    /// `X`'s upgrades when that is an earlier version; a refusal naming both versions when it cannot be.
    private func prove<X: Domain>(
        _: X.Type,
        store name: String,
        writtenBy version: UInt32
    ) throws(JournalError) -> Proof<X.State> {
        if version == X.version { return try replay(X.self, store: name) }
        let operation = "recover"
        let upgrade = try takeOver(X.self, store: name, writtenBy: version)
        func step<Old: Domain>(_: Old.Type) throws(JournalError) -> Proof<X.State> {
            let old = try prove(Old.self, store: name, writtenBy: version)
            guard let state = upgrade.migrate(old.state, from: Old.self) else {
                throw error(.domainVersionMismatch, operation, store: name, "the upgrade from \(Old.self) failed")
            }
            return Proof(
                state: state,
                lastSeq: old.lastSeq,
                snapshotSeqs: old.snapshotSeqs,
                replayed: old.replayed,
                bytes: old.bytes,
                snapshotBytes: old.snapshotBytes
            )
        }
        return try step(upgrade.from)
    }

    /// The store's newest snapshot at or below `through`, decoded as `X`'s state, with every later event up to
    /// `through` replayed through `X`'s reducer.
    private func replay<X: Domain>(
        _: X.Type,
        store name: String,
        through: UInt64 = .max,
        operation: String = "recover"
    ) throws(JournalError) -> Proof<X.State> {
        let snapshotSeqs = try storage.snapshotSeqs(store: name)
        var state = X.initialState
        var start: UInt64 = 0
        var snapshotBytes = 0
        if let newest = snapshotSeqs.last(where: { $0 <= through }) {
            guard let snapshot = try storage.snapshot(store: name, seq: newest) else {
                throw error(.sqlite, operation, store: name, seq: newest, "the snapshot vanished while being read")
            }
            try checkDigest(snapshot, operation)
            do {
                state = try CanonicalEncoding.Coder().decode(X.State.self, from: snapshot.state)
            } catch {
                throw self.error(
                    .undecodableState,
                    operation,
                    store: name,
                    seq: newest,
                    "the snapshot's state does not decode as \(name) version \(X.version) state: \(error); "
                        + "the journal cannot prove a state — restore the data directory from a backup"
                )
            }
            start = newest
            snapshotBytes = snapshot.state.count
        }

        var expected = start + 1
        var replayed = 0
        var bytes = 0
        let decoder = CanonicalEncoding.Coder()
        try storage.forEachEvent(store: name, from: start + 1, through: through) {
            (stored: StoredEvent) throws(JournalError) in
            let seq = stored.event.seq
            guard seq == expected else {
                throw error(
                    .sequenceGap,
                    operation,
                    store: name,
                    seq: expected,
                    "seq \(expected) is missing: the next event kept is seq \(seq); the journal cannot prove a "
                        + "state past seq \(expected - 1) — restore the data directory from a backup"
                )
            }
            guard stored.checksumMatches else {
                throw checksumError(stored, operation)
            }
            let action: X.Action
            do {
                action = try decoder.decode(X.Action.self, from: stored.event.action)
            } catch {
                throw self.error(
                    .undecodableAction,
                    operation,
                    store: name,
                    seq: seq,
                    "the action does not decode as a \(name) version \(X.version) action: \(error)"
                )
            }
            X.reduce(into: &state, action, by: Author(stored.event.author))
            expected += 1
            replayed += 1
            bytes += stored.event.action.count
        }
        return Proof(
            state: state,
            lastSeq: expected - 1,
            snapshotSeqs: snapshotSeqs,
            replayed: replayed,
            bytes: bytes,
            snapshotBytes: snapshotBytes
        )
    }

    private func checkDigest(_ snapshot: JournalSnapshot, _ operation: String) throws(JournalError) {
        let actual = StateDigest(of: snapshot.state)
        guard actual == snapshot.digest else {
            throw error(
                .digestMismatch,
                operation,
                store: snapshot.store,
                seq: snapshot.seq,
                "the snapshot's state has SHA-256 \(actual.hex), but its stored digest is \(snapshot.digest.hex); "
                    + "the snapshot is damaged — restore the data directory from a backup"
            )
        }
    }

    private func checksumError(_ stored: StoredEvent, _ operation: String) -> JournalError {
        error(
            .checksumMismatch,
            operation,
            store: stored.event.store,
            seq: stored.event.seq,
            "the event's bytes have CRC-32C \(stored.event.checksum), but its stored checksum is "
                + "\(stored.storedChecksum); the event is damaged — restore the data directory from a backup"
        )
    }

    // MARK: Commit

    func commit(_ batch: JournalBatch) throws(JournalError) {
        guard !batch.isEmpty else { return }
        try writeLock.withLockedValue { (_: inout Void) throws(JournalError) in
            try commitLocked(batch)
        }
    }

    private func commitLocked(_ batch: JournalBatch) throws(JournalError) {
        let operation = "commit"
        guard !storage.isReadOnly else {
            throw error(.readOnly, operation, "the journal is open read-only; open it read-write to commit")
        }
        var next = tracking.withLockedValue { $0 }

        for event in batch.events {
            guard var store = next[event.store] else {
                throw error(
                    .unknownStore,
                    operation,
                    store: event.store,
                    seq: event.seq,
                    "the batch has an event for store '\(event.store)', which was not recovered; "
                        + "call recover(_:) for its domain first"
                )
            }
            guard event.seq == store.lastSeq + 1, event.seq <= UInt64(Int64.max) else {
                throw error(
                    .invalidBatch,
                    operation,
                    store: event.store,
                    seq: event.seq,
                    "the event has seq \(event.seq), but the store's next seq is \(store.lastSeq + 1); "
                        + "seqs must be contiguous"
                )
            }
            guard event.clientID.count == 16 else {
                throw error(
                    .invalidBatch,
                    operation,
                    store: event.store,
                    seq: event.seq,
                    "the event's client id has \(event.clientID.count) bytes; client ids are 16 bytes"
                )
            }
            store.lastSeq = event.seq
            store.eventsSinceSnapshot += 1
            store.bytesSinceSnapshot += event.action.count
            next[event.store] = store
        }

        var compactions: [Compaction] = []
        var snapshotted: Set<String> = []
        for snapshot in batch.snapshots {
            guard var store = next[snapshot.store] else {
                throw error(
                    .unknownStore,
                    operation,
                    store: snapshot.store,
                    seq: snapshot.seq,
                    "the batch has a snapshot for store '\(snapshot.store)', which was not recovered; "
                        + "call recover(_:) for its domain first"
                )
            }
            guard snapshotted.insert(snapshot.store).inserted else {
                throw error(
                    .invalidBatch,
                    operation,
                    store: snapshot.store,
                    seq: snapshot.seq,
                    "the batch has two snapshots for the store; give at most one, at its last seq"
                )
            }
            guard snapshot.seq <= store.lastSeq, snapshot.seq > (store.snapshotSeqs.last ?? 0) else {
                throw error(
                    .invalidBatch,
                    operation,
                    store: snapshot.store,
                    seq: snapshot.seq,
                    "the snapshot is at seq \(snapshot.seq), but the store's last seq after the batch is "
                        + "\(store.lastSeq) and its newest snapshot is at \(store.snapshotSeqs.last ?? 0); "
                        + "a snapshot must be at or below the batch's last seq, past the newest"
                )
            }
            #if DEBUG
            // The caller took the digest with the bytes (off the daemon's loop): checked again in test builds only,
            // as hashing a large state here would stall every commit behind it. Recovery checks it always (a staged
            // file's too, as it reads it).
            if snapshot.stagedBytes == nil { try checkDigest(snapshot, operation) }
            #endif
            store.snapshotSeqs.append(snapshot.seq)
            if store.snapshotSeqs.count > policy.snapshotsKept {
                store.snapshotSeqs.removeFirst(store.snapshotSeqs.count - policy.snapshotsKept)
            }
            // Events are needed only after the oldest snapshot kept: recovery replays from the newest, and a
            // replica that lags further behind takes a snapshot instead.
            compactions.append(Compaction(store: snapshot.store, throughSeq: store.snapshotSeqs[0]))
            // A snapshot taken off the loop may be a few commits older than the batch: those events count.
            store.eventsSinceSnapshot = Int(store.lastSeq - snapshot.seq)
            store.bytesSinceSnapshot = 0
            next[snapshot.store] = store
        }

        // An effect is journaled with the action that set it going: its event must be in this very batch.
        let eventSeqs = Set(batch.events.map { "\($0.store)/\($0.seq)" })
        for effect in batch.effects where !eventSeqs.contains("\(effect.store)/\(effect.seq)") {
            throw error(
                .invalidBatch,
                operation,
                store: effect.store,
                seq: effect.seq,
                "effect \(effect.index) of seq \(effect.seq) is not of an event in the batch; an effect is journaled "
                    + "with the action that set it going"
            )
        }
        for change in batch.timerChanges {
            let store: String
            switch change {
            case let .set(timer): store = timer.store
            case let .remove(name, _): store = name
            }
            guard next[store] != nil else {
                throw error(
                    .unknownStore,
                    operation,
                    store: store,
                    "the batch changes a timer of store '\(store)', which was not recovered; call recover(_:) first"
                )
            }
        }

        for record in batch.idempotency where record.key.clientID.count != 16 {
            throw error(
                .invalidBatch,
                operation,
                "an idempotency entry's client id has \(record.key.clientID.count) bytes; client ids are 16 bytes"
            )
        }

        let plan = CommitPlan(batch: batch, compactions: compactions, idempotencyKept: policy.idempotencyEntriesKept)
        try storage.write(plan)
        // Nothing else changes the tracking while the write lock is held, so `next` is the whole truth.
        tracking.withLockedValue { $0 = next }
    }

    /// The outbox, every effect and timer checked against its stored checksum.
    func outbox() throws(JournalError) -> JournalOutbox {
        let (effects, timers) = try storage.storedOutbox()
        for (effect, stored) in effects where stored != Int64(effect.checksum) {
            throw error(
                .checksumMismatch,
                "outbox",
                store: effect.store,
                seq: effect.seq,
                "effect \(effect.index) of seq \(effect.seq) has CRC-32C \(effect.checksum), the stored checksum is "
                    + "\(stored): the outbox is damaged; restore the journal from a backup"
            )
        }
        for (timer, stored) in timers where stored != Int64(timer.checksum) {
            throw error(
                .checksumMismatch,
                "outbox",
                store: timer.store,
                seq: timer.seq,
                "timer '\(timer.key)' has CRC-32C \(timer.checksum), the stored checksum is \(stored): the outbox is "
                    + "damaged; restore the journal from a backup"
            )
        }
        return JournalOutbox(effects: effects.map(\.0), timers: timers.map(\.0))
    }

    func snapshotDue(store: String, pendingEvents: Int, pendingBytes: Int) -> Bool {
        guard let tracked = tracking.withLockedValue({ $0[store] }) else { return false }
        return tracked.eventsSinceSnapshot + pendingEvents >= policy.snapshotEveryEvents
            || tracked.bytesSinceSnapshot + pendingBytes >= policy.snapshotEveryBytes
    }

    func lastSeq(store: String) -> UInt64? {
        tracking.withLockedValue { $0[store]?.lastSeq }
    }

    func compactedThrough(store: String) -> UInt64? {
        tracking.withLockedValue { $0[store].map { $0.snapshotSeqs.first ?? 0 } }
    }

    // MARK: Reads

    func state<D: Domain>(of _: D.Type, at seq: UInt64) throws(JournalError) -> D.State {
        let operation = "state at seq"
        let name = D.name
        guard let record = try storage.storeRecord(named: name) else {
            throw error(.unknownStore, operation, store: name, "the journal has no store '\(name)'")
        }
        let versions = try storage.versionHistory(store: name)
        let since = versions.last?.sinceSeq ?? 0
        let history = versions.map(\.summary).joined(separator: ", ")
        guard record.domainVersion == D.version else {
            throw error(
                .domainVersionMismatch,
                operation,
                store: name,
                seq: seq,
                "'\(name)' is now written by domain version \(record.domainVersion) and this build has version "
                    + "\(D.version) (the store's history: \(history)); read it with a build of version "
                    + "\(record.domainVersion)"
            )
        }
        guard seq >= since else {
            throw error(
                .domainVersionMismatch,
                operation,
                store: name,
                seq: seq,
                "seq \(seq) of '\(name)' comes before its upgrade to version \(D.version) at seq \(since) (the "
                    + "store's history: \(history)), and the upgrade removed the older history: the oldest state "
                    + "kept is at seq \(since); only a copy of the data directory from before the upgrade has it"
            )
        }
        let summary = try storage.eventSummary(store: name)
        let snapshots = try storage.snapshotSeqs(store: name)
        let last = max(summary?.last ?? 0, snapshots.last ?? 0)
        guard seq <= last else {
            throw error(
                .invalidArgument,
                operation,
                store: name,
                seq: seq,
                "seq \(seq) is past the end of '\(name)': its last seq is \(last)"
            )
        }
        // Reachable from the newest snapshot at or below it, or from the start while event 1 is kept.
        let reachable = snapshots.contains { $0 <= seq } || (summary?.first ?? (seq == 0 ? 1 : 0)) == 1
        guard reachable else {
            let oldest = snapshots.first ?? (summary?.first).map { $0 - 1 } ?? last
            throw error(
                .invalidArgument,
                operation,
                store: name,
                seq: seq,
                "seq \(seq) of '\(name)' is compacted away: the oldest state the journal keeps is at seq \(oldest) "
                    + "(raise [snapshots] keep to keep more history)"
            )
        }
        let proof = try replay(D.self, store: name, through: seq, operation: operation)
        guard proof.lastSeq == seq else {
            throw error(
                .sequenceGap,
                operation,
                store: name,
                seq: proof.lastSeq + 1,
                "seq \(proof.lastSeq + 1) is missing, so the state at seq \(seq) cannot be proven; run "
                    + "'journal verify'"
            )
        }
        return proof.state
    }

    func events(
        store: String,
        from: UInt64,
        to: UInt64,
        limit: Int,
        maximumBytes: Int = .max
    ) throws(JournalError) -> JournalRange {
        let operation = "range"
        guard limit > 0, from <= to else {
            throw error(
                .invalidArgument,
                operation,
                store: store,
                "a range needs from ≤ to and a limit above 0; got from \(from), to \(to), limit \(limit)"
            )
        }
        if tracking.withLockedValue({ $0[store] }) == nil, try storage.storeRecord(named: store) == nil {
            throw error(.unknownStore, operation, store: store, "the journal has no store '\(store)'")
        }
        let from = max(from, 1)
        let to = min(to, UInt64(Int64.max))
        let range = try storage.readRange(store: store, from: from, to: to, limit: limit, maximumBytes: maximumBytes)
        if from < range.firstAvailable {
            return .compacted(firstAvailable: range.firstAvailable)
        }
        var expected = from
        for stored in range.events {
            guard stored.event.seq == expected else {
                throw error(
                    .sequenceGap,
                    operation,
                    store: store,
                    seq: expected,
                    "seq \(expected) is missing: the next event kept is seq \(stored.event.seq)"
                )
            }
            guard stored.checksumMatches else { throw checksumError(stored, operation) }
            expected += 1
        }
        if range.events.count < limit, !range.stoppedAtBytes, expected <= min(to, range.lastSeq) {
            throw error(
                .sequenceGap,
                operation,
                store: store,
                seq: expected,
                "seq \(expected) is missing: the store's last seq is \(range.lastSeq)"
            )
        }
        return .events(range.events.map(\.event))
    }

    func newestSnapshot(store: String) throws(JournalError) -> JournalSnapshot? {
        guard let seq = try storage.snapshotSeqs(store: store).last,
            let snapshot = try storage.snapshot(store: store, seq: seq)
        else { return nil }
        try checkDigest(snapshot, "snapshot")
        return snapshot
    }

    func snapshot(store: String, seq: UInt64) throws(JournalError) -> JournalSnapshot? {
        guard let snapshot = try storage.snapshot(store: store, seq: seq) else { return nil }
        try checkDigest(snapshot, "snapshot")
        return snapshot
    }

    func stats() throws(JournalError) -> JournalStats {
        var stores: [JournalStoreStats] = []
        for record in try storage.storeRecords().sorted(by: { $0.name < $1.name }) {
            let summary = try storage.eventSummary(store: record.name)
            let snapshots = try storage.snapshotSeqs(store: record.name)
            stores.append(
                JournalStoreStats(
                    name: record.name,
                    epoch: record.epoch,
                    domainVersion: record.domainVersion,
                    firstSeq: summary?.first,
                    lastSeq: max(summary?.last ?? 0, snapshots.last ?? 0),
                    eventCount: summary?.count ?? 0,
                    snapshotSeqs: snapshots,
                    versions: try storage.versionHistory(store: record.name)
                )
            )
        }
        return JournalStats(
            location: storage.location,
            formatVersion: storage.formatVersion,
            fileBytes: storage.fileBytes(),
            stores: stores,
            idempotencyEntries: try storage.idempotencyCount()
        )
    }

    // MARK: Verify

    func verify() throws(JournalError) -> [JournalProblem] {
        var problems = try storage.integrityProblems().map { JournalProblem(code: .corrupt, message: $0) }
        let (effects, timers) = try storage.storedOutbox()
        for (effect, stored) in effects where stored != Int64(effect.checksum) {
            problems.append(
                JournalProblem(
                    code: .checksumMismatch,
                    store: effect.store,
                    seq: effect.seq,
                    message:
                        "effect \(effect.index) (outbox) has CRC-32C \(effect.checksum), stored checksum is \(stored)"
                )
            )
        }
        for (timer, stored) in timers where stored != Int64(timer.checksum) {
            problems.append(
                JournalProblem(
                    code: .checksumMismatch,
                    store: timer.store,
                    seq: timer.seq,
                    message: "timer '\(timer.key)' has CRC-32C \(timer.checksum), stored checksum is \(stored)"
                )
            )
        }
        for record in try storage.storeRecords().sorted(by: { $0.name < $1.name }) {
            let name = record.name
            let snapshotSeqs = try storage.snapshotSeqs(store: name)
            for seq in snapshotSeqs {
                guard let snapshot = try storage.snapshot(store: name, seq: seq) else { continue }
                let actual = StateDigest(of: snapshot.state)
                if actual != snapshot.digest {
                    problems.append(
                        JournalProblem(
                            code: .digestMismatch,
                            store: name,
                            seq: seq,
                            message: "snapshot state has SHA-256 \(actual.hex), stored digest is \(snapshot.digest.hex)"
                        )
                    )
                }
            }
            var first: UInt64?
            var expected: UInt64 = 0
            var broken = false
            try storage.forEachEvent(store: name, from: 0, through: .max) {
                (stored: StoredEvent) throws(JournalError) in
                guard !broken else { return }
                let seq = stored.event.seq
                if first == nil {
                    first = seq
                } else if seq != expected {
                    problems.append(
                        JournalProblem(
                            code: .sequenceGap,
                            store: name,
                            seq: expected,
                            message: "seq \(expected) is missing: the next event kept is seq \(seq)"
                        )
                    )
                    broken = true
                    return
                }
                if !stored.checksumMatches {
                    problems.append(
                        JournalProblem(
                            code: .checksumMismatch,
                            store: name,
                            seq: seq,
                            message: "action bytes have CRC-32C \(stored.event.checksum), stored checksum is "
                                + "\(stored.storedChecksum): the event is damaged"
                        )
                    )
                    broken = true
                    return
                }
                expected = seq + 1
            }
            guard !broken, let first else { continue }
            let last = expected - 1
            if let newest = snapshotSeqs.last {
                if first > newest + 1 || last < newest {
                    problems.append(
                        JournalProblem(
                            code: .sequenceGap,
                            store: name,
                            seq: first > newest + 1 ? newest + 1 : last + 1,
                            message: "events kept are seqs \(first)...\(last), which do not join the newest "
                                + "snapshot at seq \(newest)"
                        )
                    )
                }
            } else if first != 1 {
                problems.append(
                    JournalProblem(
                        code: .sequenceGap,
                        store: name,
                        seq: 1,
                        message: "events start at seq \(first), and there is no snapshot to start from"
                    )
                )
            }
        }
        return problems
    }
}
