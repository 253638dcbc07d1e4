/// The leader's commit pipeline as a value: which requests are answered together, when their group is committed,
/// where, and what a commit's outcome makes of them — with the lease a PostgreSQL journal's commits renew. No
/// socket, no journal and no clock in it: every event carries `now`, and every decision comes back as an
/// ``Action`` for the loop to carry out (docs/architecture.md, "The daemon's loop").
///
/// Requests are sequenced into the *open* group. When nothing is being committed, ``advance(now:readersBusy:)``
/// hands the open group over: to be committed (when it holds dispatches to journal), or answered at once (when its
/// answers stand on what is durable already). One group is committed at a time; when its commit is done,
/// ``completed(_:now:)`` says whether to answer and publish it, to answer it and everything after it `unavailable`,
/// or to end this leadership.
///
/// On a PostgreSQL journal every commit renews the lease in the same transaction (the fence). An idle leader renews
/// it on its own every third of the lease, and answers that need no commit (STATUS, SNAPSHOT, RANGE, a rejection, a
/// retry's first reply) wait for a renewal once the last fence is older than ``leaseTrusted``: another daemon may
/// lead by then. A commit or renewal the fence refused ends the leadership; a renewal that fails otherwise ends it
/// once the lease may have lapsed since the last one that worked.
///
/// `Entry` is what the loop keeps of each request until its group is answered; `Commit` what it keeps of each
/// dispatch to journal. The pipeline only counts and moves them.
package struct CommitPipeline<Entry, Commit> {
    /// Requests answered together, and the dispatches among them whose commit they wait for.
    package struct Group {
        package var entries: [Entry] = []
        package var commits: [Commit] = []

        package init(entries: [Entry] = [], commits: [Commit] = []) {
            self.entries = entries
            self.commits = commits
        }

        package var isEmpty: Bool { entries.isEmpty && commits.isEmpty }
    }

    /// The lease of a PostgreSQL journal, as this leadership keeps it.
    package struct Lease: Hashable, Sendable {
        /// How long the lease lasts unless renewed.
        package var duration: Duration
        /// The term this daemon leads in.
        package var term: UInt64
        /// When the newest fence that renewed it was sent (a commit's, or a renewal's).
        package var fencedAt: ContinuousClock.Instant
        /// When an idle leader renews it next.
        package var renewAt: ContinuousClock.Instant

        /// A lease of `duration` in `term`, renewed by a fence sent at `fencedAt`.
        package init(duration: Duration, term: UInt64, fencedAt: ContinuousClock.Instant) {
            self.duration = duration
            self.term = term
            self.fencedAt = fencedAt
            renewAt = fencedAt + duration / 3
        }

        mutating func renewed(at sent: ContinuousClock.Instant) {
            fencedAt = sent
            renewAt = sent + duration / 3
        }
    }

    /// Where a piece of work runs.
    package enum Place: Hashable, Sendable {
        /// On the loop's thread, at once: a local journal's commit (``commitsOnLoop``).
        case loop
        /// On the journal writer's thread, answered in a later turn.
        case writer
    }

    /// What the loop must do, in order.
    package enum Action {
        /// Journal the group's dispatches in one transaction (fsyncing the journal after it when `sync`), at
        /// `place`; then tell ``completed(_:now:)``.
        case commit(Group, sync: Bool, at: Place)
        /// Fsync what relaxed durability wrote unsynced, at `place`; then tell ``completed(_:now:)``.
        case sync(at: Place)
        /// Renew the lease on the writer's thread; then tell ``completed(_:now:)``.
        case renewLease
        /// Answer the group as decided (`committed`), or everything of it that waited for a commit `unavailable`;
        /// then, when `publish`, publish its dispatches' events.
        case answer(Group, committed: Bool, publish: Bool)
        /// Answer the group `not_leader` — all but the requests that could not be read — because this leadership
        /// ends (`reason`).
        case refuse(Group, reason: String)
        /// This leadership is over: stand by, recovering at once when the lease is `stillHeld` in that term.
        case stepDown(reason: String, stillHeld: UInt64?)
        /// The stores must be rebuilt from the journal: the groups sequenced on the failed commit stood on a state
        /// that will not exist.
        case recoverStores
        /// The daemon cannot go on (`reason`).
        case stop(reason: String)
        /// Log that a renewal failed and is tried again soon.
        case renewalFailed(reason: String)
        /// Log that a commit or sync failed: nothing of it was applied.
        case commitFailed(reason: String)
    }

    /// What is being committed, synced or renewed now.
    private enum Work {
        case commit(Group, synced: Bool, submittedAt: ContinuousClock.Instant)
        case sync
        case renewal(holding: Group, sentAt: ContinuousClock.Instant)
    }

    /// The most requests the open group holds before the loop stops reading more: a stalled disk or database makes
    /// clients wait in libzmq's queues, not the daemon's memory grow.
    package static var maximumOpen: Int { 4_096 }

    /// Whether a local journal's commit runs on the loop (see ``Place/loop``).
    package let commitsOnLoop: Bool
    /// Whether commits are fsynced later, within ``relaxedSyncDelay`` (relaxed durability).
    package let relaxed: Bool
    /// The lease, on a PostgreSQL journal.
    package private(set) var lease: Lease?
    /// Requests sequenced since the last group was handed over.
    package private(set) var open = Group()
    private var inFlight: Work?
    /// With relaxed durability: when what was committed since the last sync must be synced.
    package private(set) var syncDue: ContinuousClock.Instant?

    /// How long relaxed durability waits before it fsyncs what it committed.
    package static var relaxedSyncDelay: Duration { .milliseconds(10) }

    /// A pipeline with nothing sequenced. A local journal commits on the loop; `lease` is a PostgreSQL journal's.
    package init(commitsOnLoop: Bool, relaxed: Bool = false, lease: Lease? = nil) {
        self.commitsOnLoop = commitsOnLoop
        self.relaxed = relaxed
        self.lease = lease
    }

    /// Whether the open group may take more requests now.
    package var accepting: Bool { open.entries.count < Self.maximumOpen }

    /// Whether a commit, sync or renewal is in flight.
    package var isBusy: Bool { inFlight != nil }

    /// Whether nothing waits: no work in flight and nothing sequenced.
    package var isIdle: Bool { inFlight == nil && open.isEmpty }

    /// A request read: its answer waits in the open group, with its dispatch's commit when it has one.
    package mutating func sequenced(_ entry: Entry, commit: Commit? = nil) {
        open.entries.append(entry)
        if let commit { open.commits.append(commit) }
    }

    /// How long after its last fence the lease is surely still this daemon's by the database's clock: its duration
    /// less a third, for the time between the check and the answers and for clocks that do not run alike.
    package static func leaseTrusted(_ duration: Duration) -> Duration {
        duration - duration / 3
    }

    /// Whether this daemon surely still leads at `now`: on a local journal always; on a PostgreSQL journal within
    /// ``leaseTrusted(_:)`` of its last fence. What acts on the world — an effect's run, a due timer — waits while it
    /// is not sure: a leader paused past its lease starts nothing before a renewal says the lease is still its own.
    package func surelyLeads(at now: ContinuousClock.Instant) -> Bool {
        guard let lease else { return true }
        return now - lease.fencedAt < Self.leaseTrusted(lease.duration)
    }

    /// When ``advance(now:readersBusy:)`` has something to do without a request: a renewal or a sync.
    package var nextDeadline: ContinuousClock.Instant? {
        guard inFlight == nil else { return nil }
        switch (lease?.renewAt, syncDue) {
        case let (renew?, sync?): return min(renew, sync)
        case let (renew?, nil): return renew
        case let (nil, sync?): return sync
        case (nil, nil): return nil
        }
    }

    /// With nothing in flight, hands the open group over: to be committed, or answered at once when it holds no
    /// dispatch to journal (what it was decided against is durable by then) — unless the lease may have lapsed,
    /// when it waits for a renewal first. With nothing to answer, a due sync or renewal. `readersBusy`: a reader
    /// thread holds a local journal's connection, so its commit goes to the writer.
    package mutating func advance(now: ContinuousClock.Instant, readersBusy: Bool) -> [Action] {
        guard inFlight == nil else { return [] }
        let place: Place = commitsOnLoop && !readersBusy ? .loop : .writer
        let syncNow = syncDue.map { now >= $0 } ?? false
        let group = open
        open = Group()
        guard group.commits.isEmpty else {
            if syncNow { syncDue = nil }
            inFlight = .commit(group, synced: syncNow, submittedAt: now)
            return [.commit(group, sync: syncNow, at: place)]
        }
        var actions: [Action] = []
        if !group.entries.isEmpty {
            if let lease, now - lease.fencedAt >= Self.leaseTrusted(lease.duration) {
                // Another daemon may lead and have committed past this state: answered once a renewal says the
                // lease is still ours.
                inFlight = .renewal(holding: group, sentAt: now)
                return [.renewLease]
            }
            actions.append(.answer(group, committed: true, publish: false))
        }
        if syncNow {
            syncDue = nil
            inFlight = .sync
            actions.append(.sync(at: place))
        } else if let lease, now >= lease.renewAt {
            // Idle for a third of the lease: renewed on the writer's thread, never by the loop waiting for it.
            inFlight = .renewal(holding: Group(), sentAt: now)
            actions.append(.renewLease)
        }
        return actions
    }

    /// The work in flight is done: `result` is its outcome.
    package mutating func completed(_ result: Result<Void, CommitFailure>, now: ContinuousClock.Instant) -> [Action] {
        guard let work = inFlight else { return [] }
        inFlight = nil
        switch (work, result) {
        case let (.commit(group, synced, submittedAt), .success):
            // The commit's fence renewed the lease when it was sent, at the latest.
            lease?.renewed(at: submittedAt)
            if relaxed, !synced, syncDue == nil { syncDue = now + Self.relaxedSyncDelay }
            return [.answer(group, committed: true, publish: true)]
        case (.sync, .success):
            return []
        case let (.renewal(held, sentAt), .success):
            lease?.renewed(at: sentAt)
            return held.isEmpty ? [] : [.answer(held, committed: true, publish: false)]
        case let (.renewal(held, _), .failure(failure)) where failure.kind != .fenced:
            var actions: [Action] = held.isEmpty ? [] : [.answer(held, committed: false, publish: false)]
            guard let current = lease, now - current.fencedAt < current.duration else {
                return actions + stepDown("the lease could not be renewed for longer than it lasts: \(failure)")
            }
            lease?.renewAt = now + current.duration / 10
            actions.append(.renewalFailed(reason: failure.description))
            return actions
        case let (.renewal(held, _), .failure(failure)):
            return [.refuse(held, reason: failure.description)] + stepDown(failure.description)
        case let (.commit(group, _, _), .failure(failure)):
            return failed(group, failure)
        case let (.sync, .failure(failure)):
            return failed(Group(), failure)
        }
    }

    /// The group's commit (or a sync) failed: nothing of it was applied, and the groups sequenced after it stood on
    /// it. A write or fsync the disk failed stops the daemon — after a failed fsync the page cache no longer says
    /// what the disk holds (PostgreSQL's "fsyncgate") — any other failure starts the stores again from the journal;
    /// on a PostgreSQL journal, on the writer's thread while the daemon stands by, so that the fence first waits
    /// for a commit whose outcome a lost connection left unknown.
    private mutating func failed(_ group: Group, _ failure: CommitFailure) -> [Action] {
        let logged = Action.commitFailed(reason: failure.description)
        if failure.kind == .fenced {
            return [logged, .refuse(group, reason: failure.description)] + stepDown(failure.description)
        }
        let later = open
        open = Group()
        var actions: [Action] = [
            logged, .answer(group, committed: false, publish: false), .answer(later, committed: false, publish: false),
        ]
        if let lease {
            actions.append(.stepDown(reason: "a commit failed: \(failure)", stillHeld: lease.term))
        } else if failure.kind == .disk {
            actions.append(.stop(reason: failure.description))
        } else {
            actions.append(.recoverStores)
        }
        return actions
    }

    /// Everything sequenced is answered `not_leader`, and this leadership ends.
    private mutating func stepDown(_ reason: String) -> [Action] {
        let later = open
        open = Group()
        return [.refuse(later, reason: reason), .stepDown(reason: reason, stillHeld: nil)]
    }
}

/// Why a commit, sync or renewal failed, as far as the ``CommitPipeline`` cares.
package struct CommitFailure: Error, Hashable, Sendable, CustomStringConvertible {
    package enum Kind: Hashable, Sendable {
        /// Another daemon holds the lease (or this one never did): nothing was kept, and this leadership ends.
        case fenced
        /// The disk failed a write or an fsync: after that the page cache no longer says what the disk holds.
        case disk
        /// Anything else: a lost connection, a full disk, a state that could not be encoded.
        case other
    }

    package var kind: Kind
    package var description: String

    package init(_ kind: Kind, _ description: String) {
        self.kind = kind
        self.description = description
    }
}
