import Lockstep

/// A journal in memory with the behaviour of ``SQLiteJournal`` — recovery, group commit, snapshot policy,
/// compaction, range reads, idempotency — but nothing durable: for tests and `--journal memory`.
///
/// ``capacityBytes`` lets a test make it run out of space: a commit that would store more bytes (actions,
/// snapshot states, idempotency replies) than that fails with ``JournalError/Code/storageFull`` and keeps
/// nothing, as a full disk does to ``SQLiteJournal``.
public final class InMemoryJournal: EngineJournal {
    let engine: JournalEngine<MemoryStorage>
    private var storage: MemoryStorage { engine.storage }

    /// An empty journal.
    public convenience init(policy: JournalPolicy = JournalPolicy(), capacityBytes: Int? = nil) {
        self.init(storage: MemoryStorage(capacityBytes: capacityBytes), policy: policy)
    }

    private init(storage: MemoryStorage, policy: JournalPolicy) {
        engine = JournalEngine(storage: storage, policy: policy)
    }

    /// A new journal over the same contents, as a daemon restarted in this process would find them: every
    /// store must be recovered again. Don't commit through both.
    public func reopened(policy: JournalPolicy? = nil) -> InMemoryJournal {
        InMemoryJournal(storage: storage, policy: policy ?? self.policy)
    }

    /// The most bytes the journal may hold, or `nil` for no limit. Lowering it below what is held makes
    /// the next commit that adds anything fail.
    public var capacityBytes: Int? {
        get { storage.state.withLockedValue { $0.capacityBytes } }
        set { storage.state.withLockedValue { $0.capacityBytes = newValue } }
    }

    /// Nothing is durable in memory, so there is nothing to sync.
    public func sync() throws(JournalError) {}

    /// Nothing to release; the contents stay until the journal is dropped.
    public func close() throws(JournalError) {}
}

/// The in-memory tables: the same records ``SQLiteStorage`` keeps, behind one lock.
final class MemoryStorage: JournalStorage {
    struct State: Sendable {
        var capacityBytes: Int?
        var bytes = 0
        var stores: [String: StoreRecord] = [:]
        /// Per store, oldest first.
        var versions: [String: [JournalDomainVersion]] = [:]
        /// Per store, ascending by seq.
        var events: [String: [StoredEvent]] = [:]
        /// Per store, ascending by seq.
        var snapshots: [String: [JournalSnapshot]] = [:]
        var idempotency: [IdempotencyKey: (position: UInt64, record: IdempotencyRecord)] = [:]
        /// Keys in position order from `idempotencyHead`; an entry whose key is no longer in the dictionary
        /// was pruned and is skipped.
        var idempotencyOrder: [(position: UInt64, key: IdempotencyKey)] = []
        var idempotencyHead = 0
        var nextPosition: UInt64 = 1
        /// The outbox: effects not done, and timers by store and key.
        var effects: [JournalEffectID: JournalEffect] = [:]
        var timers: [TimerKey: JournalTimer] = [:]
    }

    struct TimerKey: Hashable, Sendable {
        var store: String
        var key: String
    }

    let location = "memory"
    let formatVersion = SQLiteJournal.formatVersion
    let isReadOnly = false
    let state: LockedValue<State>

    init(capacityBytes: Int?) {
        state = LockedValue(State(capacityBytes: capacityBytes))
    }

    func storeRecord(named name: String) throws(JournalError) -> StoreRecord? {
        state.withLockedValue { $0.stores[name] }
    }

    func storeRecords() throws(JournalError) -> [StoreRecord] {
        state.withLockedValue { $0.stores.values.sorted { $0.name < $1.name } }
    }

    func register(_ record: StoreRecord) throws(JournalError) {
        state.withLockedValue {
            $0.stores[record.name] = record
            $0.versions[record.name] = [
                JournalDomainVersion(store: record.name, version: record.domainVersion, sinceSeq: 0)
            ]
        }
    }

    func versionHistory(store: String) throws(JournalError) -> [JournalDomainVersion] {
        state.withLockedValue { $0.versions[store, default: []] }
    }

    func snapshotSeqs(store: String) throws(JournalError) -> [UInt64] {
        state.withLockedValue { $0.snapshots[store, default: []].map(\.seq) }
    }

    func snapshot(store: String, seq: UInt64) throws(JournalError) -> JournalSnapshot? {
        state.withLockedValue { $0.snapshots[store, default: []].first { $0.seq == seq } }
    }

    func forEachEvent(
        store: String,
        from: UInt64,
        through: UInt64,
        _ body: (StoredEvent) throws(JournalError) -> Void
    ) throws(JournalError) {
        let events = state.withLockedValue { $0.events[store, default: []] }
        for event in events[Self.index(of: from, in: events)...] {
            guard event.event.seq <= through else { return }
            try body(event)
        }
    }

    /// The index of the first event with seq ≥ `seq`.
    private static func index(of seq: UInt64, in events: [StoredEvent]) -> Int {
        var low = 0
        var high = events.count
        while low < high {
            let mid = (low + high) / 2
            if events[mid].event.seq < seq { low = mid + 1 } else { high = mid }
        }
        return low
    }

    func eventSummary(store: String) throws(JournalError) -> (first: UInt64, last: UInt64, count: Int)? {
        state.withLockedValue { state in
            guard let events = state.events[store], let first = events.first, let last = events.last else { return nil }
            return (first.event.seq, last.event.seq, events.count)
        }
    }

    func readRange(
        store: String,
        from: UInt64,
        to: UInt64,
        limit: Int,
        maximumBytes: Int
    ) throws(JournalError) -> StoredRange {
        state.withLockedValue { state in
            let events = state.events[store, default: []]
            let snapshotSeq = state.snapshots[store]?.last?.seq ?? 0
            let start = Self.index(of: from, in: events)
            var found: [StoredEvent] = []
            var budget = ByteBudget(maximumBytes)
            for event in events[start...].prefix(limit) where event.event.seq <= to {
                guard budget.admit(event.event.action.count) else { break }
                found.append(event)
            }
            return StoredRange(
                firstAvailable: events.first?.event.seq ?? snapshotSeq + 1,
                lastSeq: max(events.last?.event.seq ?? 0, snapshotSeq),
                events: found,
                stoppedAtBytes: budget.exhausted
            )
        }
    }

    func write(_ plan: CommitPlan) throws(JournalError) {
        try state.withLockedValue { (state: inout State) throws(JournalError) in
            // Check the space first, counting additions before deletions as SQLite does: after the check
            // nothing can fail, so a refused batch leaves the state as it was.
            let added =
                plan.batch.events.reduce(0) { $0 + $1.action.count + $1.clientID.count }
                + plan.batch.snapshots.reduce(0) { $0 + $1.state.count }
                + plan.batch.idempotency.reduce(0) { $0 + Self.size(of: $1) }
            if let capacity = state.capacityBytes, added > 0, state.bytes + added > capacity {
                throw JournalError(
                    code: .storageFull,
                    file: location,
                    operation: "commit",
                    message: "the batch needs \(added) bytes, but the in-memory journal holds \(state.bytes) of "
                        + "its \(capacity) bytes; raise capacityBytes — nothing of the batch was kept"
                )
            }
            state.bytes += added
            for event in plan.batch.events {
                state.events[event.store, default: []].append(
                    StoredEvent(event: event, storedChecksum: Int64(event.checksum))
                )
            }
            for snapshot in plan.batch.snapshots {
                // An upgrade's snapshot replaces the older version's at the same seq.
                if let old = state.snapshots[snapshot.store]?.last, old.seq == snapshot.seq {
                    state.bytes -= old.state.count
                    state.snapshots[snapshot.store]?.removeLast()
                }
                state.snapshots[snapshot.store, default: []].append(snapshot)
            }
            for upgrade in plan.upgrades {
                state.stores[upgrade.store]?.domainVersion = upgrade.version
                state.versions[upgrade.store, default: []].append(upgrade)
            }
            for compaction in plan.compactions {
                let snapshots = state.snapshots[compaction.store, default: []]
                let dropped = snapshots.prefix { $0.seq < compaction.throughSeq }
                state.bytes -= dropped.reduce(0) { $0 + $1.state.count }
                state.snapshots[compaction.store, default: []].removeFirst(dropped.count)
                let events = state.events[compaction.store, default: []]
                let cut = Self.index(of: compaction.throughSeq + 1, in: events)
                state.bytes -= events[..<cut].reduce(0) { $0 + $1.event.action.count + $1.event.clientID.count }
                // A new array, not `removeFirst`: that keeps the capacity of every event compacted away.
                if cut > 0 { state.events[compaction.store] = Array(events[cut...]) }
            }
            // One hash of a key for each entry added and one for each evicted: the daemon adds one an action.
            for record in plan.batch.idempotency {
                if let old = state.idempotency.updateValue((state.nextPosition, record), forKey: record.key) {
                    // Replaced in place: it keeps its position, as in SQLite.
                    state.bytes -= Self.size(of: old.record)
                    state.idempotency[record.key]?.position = old.position
                    continue
                }
                state.idempotencyOrder.append((state.nextPosition, record.key))
                state.nextPosition += 1
            }
            while state.idempotency.count > plan.idempotencyKept, state.idempotencyHead < state.idempotencyOrder.count {
                let (position, key) = state.idempotencyOrder[state.idempotencyHead]
                state.idempotencyHead += 1
                if let index = state.idempotency.index(forKey: key), state.idempotency[index].value.position == position
                {
                    state.bytes -= Self.size(of: state.idempotency.remove(at: index).value.record)
                }
            }
            if state.idempotencyHead > 1024, state.idempotencyHead * 2 > state.idempotencyOrder.count {
                state.idempotencyOrder.removeFirst(state.idempotencyHead)
                state.idempotencyHead = 0
            }
            Self.apply(plan.batch, to: &state)
        }
    }

    /// The batch's outbox changes: new effects, what became of old ones, the timers set and removed, in order.
    private static func apply(_ batch: JournalBatch, to state: inout State) {
        for effect in batch.effects { state.effects[effect.id] = effect }
        for update in batch.effectUpdates {
            switch update.change {
            case .done, .drop:
                state.effects[update.id] = nil
            case let .failed(attempts, error, dead):
                state.effects[update.id]?.attempts = attempts
                state.effects[update.id]?.lastError = error
                state.effects[update.id]?.dead = dead
            case .retry:
                state.effects[update.id]?.attempts = 0
                state.effects[update.id]?.dead = false
            }
        }
        for change in batch.timerChanges {
            switch change {
            case let .set(timer): state.timers[TimerKey(store: timer.store, key: timer.key)] = timer
            case let .remove(store, key): state.timers[TimerKey(store: store, key: key)] = nil
            }
        }
    }

    func storedOutbox() throws(JournalError) -> (
        effects: [(JournalEffect, Int64)], timers: [(JournalTimer, Int64)]
    ) {
        state.withLockedValue { state in
            let effects = state.effects.values.sorted { $0.id < $1.id }.map { ($0, Int64($0.checksum)) }
            let timers = state.timers.values.sorted { ($0.store, $0.key) < ($1.store, $1.key) }
                .map { ($0, Int64($0.checksum)) }
            return (effects, timers)
        }
    }

    private static func size(of record: IdempotencyRecord) -> Int {
        record.key.clientID.count + 8 + record.fingerprint.count + record.reply.count
    }

    func idempotencyRecord(for key: IdempotencyKey) throws(JournalError) -> IdempotencyRecord? {
        state.withLockedValue { $0.idempotency[key]?.record }
    }

    func forEachIdempotencyRecord(
        _ body: (IdempotencyRecord) throws(JournalError) -> Void
    ) throws(JournalError) {
        let records: [IdempotencyRecord] = state.withLockedValue { state in
            state.idempotencyOrder[state.idempotencyHead...].compactMap { position, key -> IdempotencyRecord? in
                guard let entry = state.idempotency[key], entry.position == position else { return nil }
                return entry.record
            }
        }
        for record in records { try body(record) }
    }

    func idempotencyCount() throws(JournalError) -> Int {
        state.withLockedValue { $0.idempotency.count }
    }

    func fileBytes() -> Int64? { nil }

    func integrityProblems() throws(JournalError) -> [String] { [] }

    func close() throws(JournalError) {}
}
