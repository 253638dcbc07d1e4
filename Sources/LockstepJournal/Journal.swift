import Lockstep

/// A durable, ordered log of each store's sequenced actions, with snapshots, compaction and the
/// idempotency entries that let a retried request get its first reply.
///
/// ``SQLiteJournal`` keeps it in one SQLite file; ``InMemoryJournal`` keeps it in memory with the same
/// behaviour, for tests and `--journal memory`. Both are used the same way:
///
/// 1. ``recover(_:)`` each domain the caller hosts: the state the journal can prove, its last seq and the
///    store's epoch. A store seen for the first time is registered with a fresh epoch.
/// 2. ``commit(_:)`` batches — events for several stores, their idempotency entries, and a snapshot for each
///    store whose ``snapshotDue(store:pendingEvents:pendingBytes:)`` says so. A commit returns only once the
///    whole batch is durable; it is the only way anything becomes durable.
/// 3. ``events(store:from:to:limit:)`` serves range reads to replicas that missed events.
///
/// Every method blocks its caller until the journal is done (a commit waits for `fsync`): call them from a
/// thread of your own, not from Swift's cooperative pool. Commits and recoveries are serialized; reads may
/// come from any thread.
public protocol Journal: AnyObject, Sendable {
    /// Where the journal lives: its file, or `memory`.
    var location: String { get }

    /// When snapshots are due, how many are kept, how many idempotency entries are kept.
    var policy: JournalPolicy { get }

    /// The state of `domain`'s store that the journal can prove: the newest snapshot (its digest checked)
    /// with every later event replayed through the domain's reducer (each event's checksum checked, seqs
    /// contiguous).
    ///
    /// A store the journal has never seen is registered, durably, with a fresh random epoch and the domain's version. A
    /// store written by an earlier version is upgraded through the domain's `Domain.upgrades` (recovered by that
    /// version, migrated, and journaled as a snapshot of this version at the same seq, with the older version's events
    /// and snapshots compacted away; read-write journals only). Throws ``JournalError/Code/domainVersionMismatch``,
    /// changing nothing, when the store was written by another version that the domain states no upgrade from, and a
    /// checksum, sequence, digest or decoding error naming the store and the seq when the journal cannot prove a state.
    /// It never returns a state it cannot prove.
    func recover<D: Domain>(_ domain: D.Type) throws(JournalError) -> RecoveredStore<D>

    /// Throws, writing nothing, the ``JournalError/Code/domainVersionMismatch`` that ``recover(_:)`` would throw
    /// for `domain`'s store: call it for every domain before recovering any, so that one store refused leaves
    /// every other store as it was (none upgraded).
    func checkTakeOver<D: Domain>(_ domain: D.Type) throws(JournalError)

    /// Writes the whole batch in one transaction and returns once it is durable.
    ///
    /// Each store in the batch must have been recovered, its events must continue its seqs without a gap,
    /// and a snapshot must be at or below its store's last seq after the batch, past its newest snapshot. A snapshot also compacts its store:
    /// the oldest snapshots beyond ``JournalPolicy/snapshotsKept`` are deleted, and so are the events at or
    /// below the oldest snapshot kept. Idempotency entries beyond ``JournalPolicy/idempotencyEntriesKept``
    /// are deleted, oldest first.
    ///
    /// On error nothing of the batch is kept and the journal stays usable.
    func commit(_ batch: JournalBatch) throws(JournalError)

    /// Whether the store is due a snapshot once `pendingEvents` more events of `pendingBytes` action bytes
    /// are committed: include one, at the batch's last seq for that store, in the same commit.
    ///
    /// Counts the events committed since the store's newest snapshot (or since its first event). False for
    /// a store not recovered.
    func snapshotDue(store: String, pendingEvents: Int, pendingBytes: Int) -> Bool

    /// The store's last committed seq (0 before its first event), or `nil` for a store not recovered.
    func lastSeq(store: String) -> UInt64?

    /// The seq through which the store's events were compacted away — its oldest snapshot kept, 0 before any — or
    /// `nil` for a store not recovered (and from journals that do not say).
    func compactedThrough(store: String) -> UInt64?

    /// Events `from...to` of `store`, at most `limit` of them, in seq order — or, when `from` is below the
    /// first seq the journal still keeps, ``JournalRange/compacted(firstAvailable:)``.
    ///
    /// Fewer events than asked for means the store's last seq, the limit or `maximumBytes` of actions was
    /// reached (at least one event is returned whatever its size). Each event's checksum is checked before it
    /// is returned.
    func events(
        store: String,
        from: UInt64,
        to: UInt64,
        limit: Int,
        maximumBytes: Int
    ) throws(JournalError) -> JournalRange

    /// The state of `domain`'s store after exactly its events `1...seq`: the newest snapshot at or below `seq`
    /// (digest checked) with the events after it up to `seq` replayed through the domain's reducer (each
    /// checksum checked). Works on a read-only journal, e.g. a copy of a live one; changes nothing.
    ///
    /// Throws ``JournalError/Code/invalidArgument`` when `seq` is past the store's last seq or compacted away
    /// (below the oldest snapshot kept), ``JournalError/Code/domainVersionMismatch`` when that part of the store
    /// was written by another version of the domain, ``JournalError/Code/unknownStore`` when the journal has no
    /// such store.
    func state<D: Domain>(of domain: D.Type, at seq: UInt64) throws(JournalError) -> D.State

    /// The store's newest snapshot, digest checked, or `nil` when it has none.
    func newestSnapshot(store: String) throws(JournalError) -> JournalSnapshot?

    /// The store's snapshot at `seq`, digest checked, or `nil` when none is kept there.
    func snapshot(store: String, seq: UInt64) throws(JournalError) -> JournalSnapshot?

    /// The entry kept for `key`, if any.
    func idempotencyRecord(for key: IdempotencyKey) throws(JournalError) -> IdempotencyRecord?

    /// Calls `body` with every idempotency entry kept, oldest first, one at a time: what a daemon loads at
    /// start so retries across a restart get their first reply (100,000 entries by default: read as a list
    /// first, they doubled the daemon's peak memory).
    func forEachIdempotencyRecord(_ body: (IdempotencyRecord) throws(JournalError) -> Void) throws(JournalError)

    /// How many idempotency entries are kept: a daemon sizes its table once before loading them, rather than
    /// grow it (and hold two copies at each step) 17 times on the way to 100,000.
    func idempotencyRecordCount() throws(JournalError) -> Int

    /// Per store: epoch, domain version, first and last seq, events and snapshots kept; and the file's size.
    func stats() throws(JournalError) -> JournalStats

    /// Checks the whole journal without a domain: every event's checksum, every store's seqs contiguous
    /// from its first kept event to its last and joined to its newest snapshot, every snapshot's digest,
    /// and (for SQLite) the file's integrity. Returns what is wrong; empty when the journal is intact.
    func verify() throws(JournalError) -> [JournalProblem]

    /// The effects not done (dead letters included) and the timers not fired, each checked against its checksum: what
    /// a daemon that takes the lead runs and fires (docs/effects.md). Empty for a journal of a format before them.
    func outbox() throws(JournalError) -> JournalOutbox

    /// Releases the file. Later calls fail. Closing twice is harmless.
    func close() throws(JournalError)

    /// Makes every commit so far durable, for a journal whose commits return before they are synced
    /// (``SQLiteJournal`` opened `relaxed`); a no-op otherwise.
    func sync() throws(JournalError)

    /// Called off the committing thread with a snapshot that a later commit will carry: a journal that keeps
    /// snapshots apart from its commits (``LogJournal``, a file each) writes it now, so that commit only names it.
    /// Nothing counts until that commit; a snapshot staged and never committed is removed. A no-op for the others.
    func stage(_ snapshot: JournalSnapshot)

    /// Called off the committing thread to write a snapshot's file as its state is encoded, a piece at a time: the
    /// state is never held whole. `write` hands each piece to the sink it gets, and returns the SHA-256 of all it
    /// handed — or `nil` to drop the file (the state would not stream, or was not what a snapshot keeps). Returns the
    /// snapshot a later commit carries (its ``JournalSnapshot/stagedBytes`` set, its ``JournalSnapshot/state``
    /// empty), as ``stage(_:)`` stages one; `nil` when the file was dropped or could not be written, or when the
    /// journal keeps snapshots in its commits — then without calling `write`.
    func stageSnapshot(
        store: String,
        seq: UInt64,
        writing write: (_ sink: (UnsafeRawBufferPointer) -> Void) -> StateDigest?
    ) -> JournalSnapshot?

    /// Up to `maximumBytes` of the state of `store`'s snapshot at `seq` (its newest when `seq` is 0) from byte
    /// `offset`, with the whole state's size and digest: a SNAPSHOT sent in parts, none of them the whole (the
    /// receiver checks the digest once it has them all). `nil` when none is kept there (compacted since), `offset` is
    /// at or past its end, or the journal does not read a snapshot in parts (it keeps them in its database): the daemon
    /// then sends the state whole.
    func snapshotPart(
        store: String,
        seq: UInt64,
        offset: UInt64,
        maximumBytes: Int
    ) throws(JournalError) -> JournalSnapshotPart?
}

/// A part of a snapshot's state (``Journal/snapshotPart(store:seq:offset:maximumBytes:)``).
public struct JournalSnapshotPart: Hashable, Sendable {
    /// The snapshot's seq.
    public var seq: UInt64
    /// The whole state's size.
    public var total: Int
    /// SHA-256 of the whole state.
    public var digest: StateDigest
    /// The part.
    public var bytes: [UInt8]

    /// `bytes` of the state of `total` bytes with `digest`, of the snapshot at `seq`.
    public init(seq: UInt64, total: Int, digest: StateDigest, bytes: [UInt8]) {
        self.seq = seq
        self.total = total
        self.digest = digest
        self.bytes = bytes
    }
}

extension Journal {
    /// Snapshots go in with their commit.
    public func stage(_ snapshot: JournalSnapshot) {}

    /// Snapshots go in with their commit, their state held.
    public func stageSnapshot(
        store _: String,
        seq _: UInt64,
        writing _: (_ sink: (UnsafeRawBufferPointer) -> Void) -> StateDigest?
    ) -> JournalSnapshot? { nil }

    /// Snapshots are read whole.
    public func snapshotPart(
        store _: String,
        seq _: UInt64,
        offset _: UInt64,
        maximumBytes _: Int
    ) throws(JournalError) -> JournalSnapshotPart? { nil }
}

extension Journal {
    /// Events `from...to` of `store`, at most `limit`, however many bytes they hold.
    public func events(store: String, from: UInt64, to: UInt64, limit: Int) throws(JournalError) -> JournalRange {
        try events(store: store, from: from, to: to, limit: limit, maximumBytes: .max)
    }

    /// Every idempotency entry kept, oldest first.
    public func idempotencyRecords() throws(JournalError) -> [IdempotencyRecord] {
        var records: [IdempotencyRecord] = []
        try forEachIdempotencyRecord { records.append($0) }
        return records
    }

    /// Whether the store is due a snapshot, counting only what is committed.
    public func snapshotDue(store: String) -> Bool {
        snapshotDue(store: store, pendingEvents: 0, pendingBytes: 0)
    }

    /// Whether the store is due a snapshot once `batch` is committed.
    public func snapshotDue(store: String, in batch: JournalBatch) -> Bool {
        var count = 0
        var bytes = 0
        for event in batch.events where event.store == store {
            count += 1
            bytes += event.action.count
        }
        return snapshotDue(store: store, pendingEvents: count, pendingBytes: bytes)
    }
}

/// One sequenced action as the journal keeps it.
public struct JournalEvent: Hashable, Sendable {
    /// The store's name.
    public var store: String
    /// The event's place in its store's order: 1, 2, 3…
    public var seq: UInt64
    /// The encoded action (its JSON).
    public var action: [UInt8]
    /// The 16-byte id of the client that sent it.
    public var clientID: [UInt8]
    /// The client's request number: with ``clientID`` the request's idempotency key.
    public var requestNumber: UInt64
    /// Who dispatched it: the identity's name under the daemon's policy (docs/security.md), `lockstepd` for the
    /// daemon's own actions, empty when nobody was identified (no policy, and every event of a journal before
    /// format 5 on SQLite, 4 on PostgreSQL).
    public var author: String

    /// An event as the daemon sequenced it.
    public init(
        store: String,
        seq: UInt64,
        action: [UInt8],
        clientID: [UInt8],
        requestNumber: UInt64,
        author: String = ""
    ) {
        self.store = store
        self.seq = seq
        self.action = action
        self.clientID = clientID
        self.requestNumber = requestNumber
        self.author = author
    }

    /// The CRC-32C the journal stores with the event, over its store, seq, action, client id and request
    /// number, each length-prefixed or fixed-width so no two events share an input, then — when there is one — its
    /// author, length-prefixed: an event without an author has the checksum it had before authors were journaled
    /// (see docs/operations.md).
    public var checksum: UInt32 {
        var crc = CRC32C()
        let name = Array(store.utf8)
        crc.update(bigEndian: UInt32(truncatingIfNeeded: name.count))
        crc.update(name)
        crc.update(bigEndian: seq)
        crc.update(bigEndian: UInt32(truncatingIfNeeded: action.count))
        crc.update(action)
        crc.update(bigEndian: UInt32(truncatingIfNeeded: clientID.count))
        crc.update(clientID)
        crc.update(bigEndian: requestNumber)
        if !author.isEmpty {
            let author = Array(author.utf8)
            crc.update(bigEndian: UInt32(truncatingIfNeeded: author.count))
            crc.update(author)
        }
        return crc.value
    }
}

/// A store's state at one seq, as canonical bytes with their digest.
public struct JournalSnapshot: Hashable, Sendable {
    /// The store's name.
    public var store: String
    /// The seq of the last event the state includes.
    public var seq: UInt64
    /// The state's canonical encoding (`CanonicalEncoding`, in the `Lockstep` module); empty for a snapshot staged
    /// in a file as it was encoded (``stagedBytes``).
    public var state: [UInt8]
    /// SHA-256 of ``state``.
    public var digest: StateDigest
    /// For a snapshot whose state went to its file as it was encoded (``Journal/stageSnapshot(store:seq:writing:)``):
    /// the state's size. Only that journal's commit takes it.
    public var stagedBytes: Int?

    /// A snapshot whose digest the caller already has.
    public init(store: String, seq: UInt64, state: [UInt8], digest: StateDigest) {
        self.store = store
        self.seq = seq
        self.state = state
        self.digest = digest
    }

    /// A snapshot whose state of `stagedBytes` bytes, with `digest`, is in the file its journal staged.
    public init(store: String, seq: UInt64, stagedBytes: Int, digest: StateDigest) {
        self.init(store: store, seq: seq, state: [], digest: digest)
        self.stagedBytes = stagedBytes
    }

    /// A snapshot of `state` bytes, its digest computed here.
    public init(store: String, seq: UInt64, state: [UInt8]) {
        self.init(store: store, seq: seq, state: state, digest: StateDigest(of: state))
    }

    /// A snapshot of a domain's state, canonically encoded.
    public init<State: Encodable>(store: String, seq: UInt64, encoding value: State) throws {
        self.init(store: store, seq: seq, state: try CanonicalEncoding.bytes(of: value))
    }
}

/// Who sent a request and which of theirs it was: a request retried with the same key is never applied twice.
public struct IdempotencyKey: Hashable, Sendable {
    /// The client's 16-byte id.
    public var clientID: [UInt8]
    /// The client's request number.
    public var requestNumber: UInt64

    /// A key.
    public init(clientID: [UInt8], requestNumber: UInt64) {
        self.clientID = clientID
        self.requestNumber = requestNumber
    }

    /// The id's bytes in one call (an array hashes each of its elements apart: 16 calls for an id), then the number.
    public func hash(into hasher: inout Hasher) {
        clientID.withUnsafeBytes { hasher.combine(bytes: $0) }
        hasher.combine(requestNumber)
    }
}

/// What the daemon answered a request, kept so a retry gets the same reply.
public struct IdempotencyRecord: Hashable, Sendable {
    /// The request's key.
    public var key: IdempotencyKey
    /// A fingerprint of the request (e.g. a hash of store and action), so the same key with another action
    /// can be refused.
    public var fingerprint: [UInt8]
    /// The encoded reply the daemon sent.
    public var reply: [UInt8]

    /// A record.
    public init(key: IdempotencyKey, fingerprint: [UInt8], reply: [UInt8]) {
        self.key = key
        self.fingerprint = fingerprint
        self.reply = reply
    }
}

/// What one commit writes: all of it or none of it.
public struct JournalBatch: Hashable, Sendable {
    /// Events, for one or several stores, each store's in seq order.
    public var events: [JournalEvent]
    /// Idempotency entries for the requests the batch answers (applied or rejected). An entry for a key the
    /// journal already keeps replaces it and keeps its place in the order.
    public var idempotency: [IdempotencyRecord]
    /// At most one snapshot per store, at that store's last seq after the batch.
    public var snapshots: [JournalSnapshot]
    /// Effects to run that the batch's events set going (the outbox): each of an event in this batch.
    public var effects: [JournalEffect]
    /// What becomes of effects already in the outbox: done (their results, if any, are in this batch), failed,
    /// given up, sent back to be run, dropped.
    public var effectUpdates: [JournalEffectUpdate]
    /// Timers set, replaced and removed (cancelled, or fired by an event of this batch), in the order of the events
    /// that did it.
    public var timerChanges: [JournalTimerChange]

    /// A batch.
    public init(
        events: [JournalEvent] = [],
        idempotency: [IdempotencyRecord] = [],
        snapshots: [JournalSnapshot] = [],
        effects: [JournalEffect] = [],
        effectUpdates: [JournalEffectUpdate] = [],
        timerChanges: [JournalTimerChange] = []
    ) {
        self.events = events
        self.idempotency = idempotency
        self.snapshots = snapshots
        self.effects = effects
        self.effectUpdates = effectUpdates
        self.timerChanges = timerChanges
    }

    /// True when there is nothing to write.
    public var isEmpty: Bool {
        events.isEmpty && idempotency.isEmpty && snapshots.isEmpty && effects.isEmpty && effectUpdates.isEmpty
            && timerChanges.isEmpty
    }

    /// The last seq of `store` in this batch, if it has events of that store.
    public func lastSeq(of store: String) -> UInt64? {
        events.last { $0.store == store }?.seq
    }
}

extension Journal {
    /// `nil`: a journal that does not say how far it compacted.
    public func compactedThrough(store: String) -> UInt64? { nil }
}

/// A store as recovery left it.
public struct RecoveredStore<D: Domain>: Sendable {
    /// The state at ``lastSeq``.
    public var state: D.State
    /// The seq of the last event in ``state`` (0 for a store with no events).
    public var lastSeq: UInt64
    /// The random id of this store's journal lifetime; a replica that sees it change resyncs.
    public var epoch: UInt64
    /// The domain version the store runs (equal to `D.version`).
    public var domainVersion: UInt32
    /// The seq of the snapshot recovery started from, or `nil` when it started from the initial state.
    public var snapshotSeq: UInt64?
    /// How many events recovery replayed after the snapshot.
    public var replayedEvents: Int
    /// About how many bytes the state's canonical form has: the snapshot recovery started from and the actions it
    /// replayed after it (0 for a store with neither). The daemon sizes its first checkpoint by it.
    public var stateBytesHint: Int = 0
    /// The version the store was written by when recovery upgraded it to `D.version`; `nil` when it was already.
    public var upgradedFrom: UInt32?
}

/// A domain version in a store's history: it wrote the store's events after `sinceSeq` (0: from the start).
public struct JournalDomainVersion: Hashable, Sendable, Codable {
    /// The store's name.
    public var store: String
    /// The domain version.
    public var version: UInt32
    /// The seq of the state it started from: 0 for the version that started the store, the seq of the upgrade
    /// snapshot for a later one.
    public var sinceSeq: UInt64

    /// "version 2 from seq 1500", for messages and listings.
    public var summary: String { "version \(version) from seq \(sinceSeq)" }

    /// A version in a history.
    public init(store: String, version: UInt32, sinceSeq: UInt64) {
        self.store = store
        self.version = version
        self.sinceSeq = sinceSeq
    }
}

/// The answer to a range read.
public enum JournalRange: Hashable, Sendable {
    /// The events asked for, in seq order (fewer when the store's last seq or the limit was reached).
    case events([JournalEvent])
    /// `from` is below what the journal keeps: events start at `firstAvailable`. Take a snapshot instead.
    case compacted(firstAvailable: UInt64)
}

/// When snapshots are due, and how much history the journal keeps.
public struct JournalPolicy: Hashable, Sendable {
    /// A snapshot is due after this many events since the last one.
    public var snapshotEveryEvents: Int
    /// …or after this many bytes of actions since the last one, whichever comes first.
    public var snapshotEveryBytes: Int
    /// How many snapshots each store keeps; events at or below the oldest kept are compacted away. At least 1.
    public var snapshotsKept: Int
    /// How many idempotency entries the journal keeps (the newest). At least 1.
    public var idempotencyEntriesKept: Int

    /// A policy; the defaults suit a daemon.
    public init(
        snapshotEveryEvents: Int = 10_000,
        snapshotEveryBytes: Int = 16 << 20,
        snapshotsKept: Int = 2,
        idempotencyEntriesKept: Int = 100_000
    ) {
        self.snapshotEveryEvents = max(1, snapshotEveryEvents)
        self.snapshotEveryBytes = max(1, snapshotEveryBytes)
        self.snapshotsKept = max(1, snapshotsKept)
        self.idempotencyEntriesKept = max(1, idempotencyEntriesKept)
    }
}

/// One store in ``JournalStats``.
public struct JournalStoreStats: Hashable, Sendable, Codable {
    /// The store's name.
    public var name: String
    /// The store's epoch.
    public var epoch: UInt64
    /// The domain version the store was written with.
    public var domainVersion: UInt32
    /// The first seq still kept as an event, or `nil` when no event is kept.
    public var firstSeq: UInt64?
    /// The store's last seq (0 before its first event).
    public var lastSeq: UInt64
    /// How many events are kept.
    public var eventCount: Int
    /// The seqs of the snapshots kept, oldest first.
    public var snapshotSeqs: [UInt64]
    /// The domain versions that wrote the store, oldest first; the last is ``domainVersion``.
    public var versions: [JournalDomainVersion]
}

/// What a journal holds.
public struct JournalStats: Hashable, Sendable, Codable {
    /// The journal's file, or `memory`.
    public var location: String
    /// The journal's format version.
    public var formatVersion: Int
    /// The bytes on disk (database plus write-ahead log), or `nil` in memory.
    public var fileBytes: Int64?
    /// The stores, by name.
    public var stores: [JournalStoreStats]
    /// How many idempotency entries are kept.
    public var idempotencyEntries: Int
}

/// One thing ``Journal/verify()`` found wrong.
public struct JournalProblem: Hashable, Sendable, CustomStringConvertible {
    /// The kind of problem, e.g. ``JournalError/Code/checksumMismatch``.
    public var code: JournalError.Code
    /// The store, when the problem is in one.
    public var store: String?
    /// The seq, when the problem is at one.
    public var seq: UInt64?
    /// What is wrong.
    public var message: String

    /// A problem.
    public init(code: JournalError.Code, store: String? = nil, seq: UInt64? = nil, message: String) {
        self.code = code
        self.store = store
        self.seq = seq
        self.message = message
    }

    /// The store, the seq, the message and the code on one line, as `lockstep journal verify` prints it.
    public var description: String {
        var text = ""
        if let store { text += "store \(store)" }
        if let seq { text += (text.isEmpty ? "" : ", ") + "seq \(seq)" }
        return (text.isEmpty ? "" : text + ": ") + message + " [\(code)]"
    }
}

/// An effect to run, journaled in the same transaction as the action that set it going (docs/effects.md): the
/// outbox. Its stable id is (store, seq, index), which its handler passes on as an idempotency key.
public struct JournalEffect: Hashable, Sendable {
    /// The store of the action that set it going.
    public var store: String
    /// That action's seq.
    public var seq: UInt64
    /// Its index in that action's effects, from 0.
    public var index: Int
    /// The effect's canonical JSON.
    public var body: [UInt8]
    /// How many times a handler ran it and failed.
    public var attempts: Int
    /// The last failure, when there was one.
    public var lastError: String?
    /// Given up after its tries: a dead letter, kept and shown until it is sent back (retried) or dropped.
    public var dead: Bool

    /// An effect, not yet run unless `attempts` says otherwise.
    public init(
        store: String,
        seq: UInt64,
        index: Int,
        body: [UInt8],
        attempts: Int = 0,
        lastError: String? = nil,
        dead: Bool = false
    ) {
        self.store = store
        self.seq = seq
        self.index = index
        self.body = body
        self.attempts = attempts
        self.lastError = lastError
        self.dead = dead
    }

    /// Its stable id.
    public var id: JournalEffectID { JournalEffectID(store: store, seq: seq, index: index) }

    /// A CRC-32C of its store, seq, index and body, stored beside it and checked when it is read back.
    public var checksum: UInt32 {
        var crc = CRC32C()
        let name = Array(store.utf8)
        crc.update(bigEndian: UInt32(truncatingIfNeeded: name.count))
        crc.update(name)
        crc.update(bigEndian: seq)
        crc.update(bigEndian: UInt64(truncatingIfNeeded: index))
        crc.update(bigEndian: UInt32(truncatingIfNeeded: body.count))
        crc.update(body)
        return crc.value
    }
}

/// An effect's stable id: the store, seq and index of the action's effect that it is.
public struct JournalEffectID: Hashable, Sendable, Comparable, CustomStringConvertible {
    public var store: String
    public var seq: UInt64
    public var index: Int

    /// The id of effect `index` of the action at `seq` of `store`.
    public init(store: String, seq: UInt64, index: Int) {
        self.store = store
        self.seq = seq
        self.index = index
    }

    /// `todos/12/0`.
    public var description: String { "\(store)/\(seq)/\(index)" }

    /// The id `text` spells as `store/seq/index`, or `nil`.
    public init?(_ text: String) {
        let parts = text.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 3, !parts[0].isEmpty, let seq = UInt64(parts[1]), let index = Int(parts[2]), index >= 0,
            String(seq) == parts[1], String(index) == parts[2]
        else { return nil }
        self.init(store: String(parts[0]), seq: seq, index: index)
    }

    public static func < (left: Self, right: Self) -> Bool {
        (left.store, left.seq, left.index) < (right.store, right.seq, right.index)
    }
}

/// What becomes of an effect in the outbox.
public struct JournalEffectUpdate: Hashable, Sendable {
    /// The change.
    public enum Change: Hashable, Sendable {
        /// It ran, and what it returned is in the same batch: it leaves the outbox.
        case done
        /// It ran and failed for the `attempts`-th time with `error`; `dead` when it is given up.
        case failed(attempts: Int, error: String, dead: Bool)
        /// A dead letter sent back to be run: its tries start again.
        case retry
        /// Removed without running (by hand).
        case drop
    }

    /// Which effect.
    public var id: JournalEffectID
    /// What becomes of it.
    public var change: Change

    /// Effect `id` changes as `change` says.
    public init(_ id: JournalEffectID, _ change: Change) {
        self.id = id
        self.change = change
    }
}

/// A timer: an action to sequence at a time, set by an action's effect (docs/effects.md).
public struct JournalTimer: Hashable, Sendable {
    /// Its store.
    public var store: String
    /// Its key: setting a timer of the same key replaces it; cancelling the key removes it.
    public var key: String
    /// When it is due, in milliseconds since 1970.
    public var dueMilliseconds: Int64
    /// The action's canonical JSON.
    public var action: [UInt8]
    /// The seq of the action whose effect set it.
    public var seq: UInt64
    /// That effect's index: with the store and seq, the timer's stable id (its firing's idempotency key).
    public var index: Int

    /// A timer of `store` under `key`, due at `dueMilliseconds`, set by effect `index` of the action at `seq`.
    public init(store: String, key: String, dueMilliseconds: Int64, action: [UInt8], seq: UInt64, index: Int) {
        self.store = store
        self.key = key
        self.dueMilliseconds = dueMilliseconds
        self.action = action
        self.seq = seq
        self.index = index
    }

    /// A CRC-32C of every field, stored beside it and checked when it is read back.
    public var checksum: UInt32 {
        var crc = CRC32C()
        for text in [store, key] {
            let bytes = Array(text.utf8)
            crc.update(bigEndian: UInt32(truncatingIfNeeded: bytes.count))
            crc.update(bytes)
        }
        crc.update(bigEndian: UInt64(bitPattern: dueMilliseconds))
        crc.update(bigEndian: UInt32(truncatingIfNeeded: action.count))
        crc.update(action)
        crc.update(bigEndian: seq)
        crc.update(bigEndian: UInt64(truncatingIfNeeded: index))
        return crc.value
    }
}

/// A change to the timers.
public enum JournalTimerChange: Hashable, Sendable {
    /// Set (or replace) the timer of its store and key.
    case set(JournalTimer)
    /// Remove the timer of `store` under `key` (cancelled, or fired in the same batch).
    case remove(store: String, key: String)
}

/// What the outbox holds: the effects not done (dead letters included) and the timers not fired, each in its id's
/// order.
public struct JournalOutbox: Hashable, Sendable {
    public var effects: [JournalEffect]
    public var timers: [JournalTimer]

    /// An outbox holding these.
    public init(effects: [JournalEffect] = [], timers: [JournalTimer] = []) {
        self.effects = effects
        self.timers = timers
    }
}
