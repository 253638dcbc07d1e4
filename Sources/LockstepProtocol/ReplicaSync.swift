import Lockstep

/// An action with the sequence number the daemon gave it.
public struct SequencedAction: Hashable, Sendable {
    /// The action's seq in its store.
    public var seq: SequenceNumber
    /// The action's JSON, as the daemon published it.
    public var action: Frame
    /// Who dispatched it, as the daemon's policy names them; `Author.unknown` without a policy.
    public var author: Author
    /// What the action set going (the daemon's own record, journaled with it; never on the wire): empty for a
    /// domain without effects, and as replicas receive it.
    public var effects: [EffectRecord]

    /// The action `action` (its JSON) at `seq` by `author`, with the effects it set going.
    public init(seq: SequenceNumber, action: Frame, author: Author = .unknown, effects: [EffectRecord] = []) {
        self.seq = seq
        self.action = action
        self.author = author
        self.effects = effects
    }
}

/// The replica's sync logic as a value: it takes what arrived and returns what to do, with no sockets, no
/// clock and no state of the domain in it.
///
/// It joins without loss (keep events from the subscription, ask for a snapshot, drop kept events at or
/// below the snapshot's seq, apply the rest in order), then applies only `seq = last + 1`. A gap asks for
/// the missing range; a compacted range asks for a snapshot. A new epoch or a digest mismatch starts over. A
/// silent daemon does not: the state is kept, and the replica asks the daemon for the events from the last it holds
/// on, which says whether the daemon's history (another daemon's, after a failover) still holds it and brings what
/// was missed meanwhile (the rest is repaired by range). The owner executes the returned ``Output``s in order.
public struct ReplicaSync: Sendable {
    /// Where the replica is in its life.
    public enum Phase: Hashable, Sendable {
        /// Waiting for a snapshot; events are kept meanwhile.
        case joining
        /// Applying events as they come.
        case live
        /// Waiting for a range (or, when it was compacted, a snapshot) to fill a gap.
        case repairing
    }

    /// Why the replica threw its state away and joined again.
    public enum ResyncReason: Hashable, Sendable, CustomStringConvertible {
        /// The daemon's epoch changed from `old` to `new`: it runs on another journal, so seqs of the old one mean
        /// nothing.
        case newEpoch(old: Epoch, new: Epoch)
        /// The local state's digest differed from the daemon's at `seq`.
        case divergence(seq: SequenceNumber)
        /// The daemon refused a range it had announced (`invalid_range`): its history in this epoch is shorter
        /// than the replica's, so the replica's state may hold actions the daemon no longer has.
        case historyShorter(from: SequenceNumber)

        /// One sentence for a log line.
        public var description: String {
            switch self {
            case let .newEpoch(old, new): "the daemon's epoch changed from \(old) to \(new)"
            case let .divergence(seq): "the state's digest differed from the daemon's at seq \(seq)"
            case let .historyShorter(from): "the daemon has no events from seq \(from) on, though it announced them"
            }
        }
    }

    /// What the owner must do, in order.
    public enum Output: Hashable, Sendable {
        /// Ask the daemon for a snapshot of the store.
        case requestSnapshot
        /// Ask the daemon for the events `from...to`.
        case requestRange(from: SequenceNumber, to: SequenceNumber)
        /// Replace the state with this snapshot; check that `digest` is the SHA-256 of `state` first and
        /// report ``ReplicaSync/digestMismatch(at:now:)`` if it is not.
        case install(epoch: Epoch, seq: SequenceNumber, digest: StateDigest, state: Frame)
        /// Apply these actions, in order; their seqs follow on from the last one applied.
        case apply([SequencedAction])
        /// The daemon's digest at `seq`, which is the replica's current seq: compare it with the local
        /// state's and report ``ReplicaSync/digestMismatch(at:now:)`` if they differ.
        case verifyDigest(seq: SequenceNumber, digest: StateDigest)
        /// The daemon is taking its digest at `seq`, the replica's current seq, off its loop (a CHECKPOINT): keep the
        /// local state's digest at `seq` for the DIGEST that comes later.
        case keepDigest(seq: SequenceNumber)
        /// The daemon's digest at `seq`, a seq the replica has passed: compare it with the local state's digest kept
        /// at `seq` (``keepDigest(seq:)``), if one was, and report ``ReplicaSync/digestMismatch(at:now:)`` if they
        /// differ.
        case verifyKeptDigest(seq: SequenceNumber, digest: StateDigest)
        /// The replica's state differs from the daemon's at `seq`: tell the user loudly.
        case reportDivergence(seq: SequenceNumber)
        /// Everything held so far is void; a snapshot request follows.
        case resync(ResyncReason)
        /// No event, heartbeat or digest of the store arrived for this long (``Settings/silenceLimit``): the daemon
        /// is down, stopped, or a failover is under way. The state is kept; a range request from the last event held
        /// on follows, unless a request is out already.
        case silent(Duration)
        /// The snapshot or range request out went unanswered for its timeout (``Settings/requestTimeout``, doubled
        /// with each repeat in a row up to 8 times it); it is sent again next. The owner may move to another daemon
        /// first (``LeaderSearch/timedOut()``).
        case requestUnanswered
    }

    /// How long to wait, and how much to keep.
    public struct Settings: Hashable, Sendable {
        /// No event or heartbeat for this long means the daemon is gone, or a failover is under way: the replica
        /// says so (``Output/silent(_:)``) and asks for the events from the last it holds on. Three heartbeat
        /// intervals.
        public var silenceLimit: Duration
        /// A snapshot or range request unanswered for this long is sent again; each repeat in a row waits twice as
        /// long as the one before, up to 8 times this, so a reply slower than it still gets through.
        public var requestTimeout: Duration
        /// Events kept while joining or repairing; past it, the oldest are dropped and fetched by range later.
        public var maximumBufferedEvents: Int
        /// After a divergence that follows another within twice ``maximumDivergenceBackoff``, the snapshot is
        /// asked for only after this long, doubling with each such divergence up to the maximum: a replica that
        /// cannot take the daemon's state (another version of the domain, say) asks a few times a second at
        /// most, not in a tight loop. The first divergence resyncs at once.
        public var divergenceBackoff: Duration
        /// The longest wait between divergences in a row.
        public var maximumDivergenceBackoff: Duration

        /// Settings for a daemon with the default heartbeat interval of 1 s; a replica of a daemon with a longer one
        /// needs a `silenceLimit` of at least 3 of its intervals (docs/protocol.md, "Endpoints and timing").
        public init(
            silenceLimit: Duration = .seconds(3),
            requestTimeout: Duration = .seconds(2),
            maximumBufferedEvents: Int = 100_000,
            divergenceBackoff: Duration = .milliseconds(100),
            maximumDivergenceBackoff: Duration = .seconds(5)
        ) {
            self.silenceLimit = silenceLimit
            self.requestTimeout = requestTimeout
            self.maximumBufferedEvents = maximumBufferedEvents
            self.divergenceBackoff = divergenceBackoff
            self.maximumDivergenceBackoff = maximumDivergenceBackoff
        }
    }

    private enum Awaiting: Hashable, Sendable {
        case snapshot
        case range(from: SequenceNumber, to: SequenceNumber)
    }

    /// The timings and limits this replica runs with.
    public let settings: Settings
    /// Where the replica is.
    public private(set) var phase = Phase.joining
    /// The epoch of the state held, `nil` before the first snapshot.
    public private(set) var epoch: Epoch?
    /// The seq of the last action applied (or of the snapshot installed).
    public private(set) var lastSeq: SequenceNumber = 0
    /// The highest seq the daemon is known to have reached, from events, heartbeats and digests.
    public private(set) var daemonSeq: SequenceNumber = 0
    /// The epoch `daemonSeq` was heard in: a seq of another epoch says nothing about this one.
    private var daemonSeqEpoch: Epoch?
    /// How many times the replica started over.
    public private(set) var resyncCount = 0

    private var buffer: [SequencedAction] = []
    private var bufferEpoch: Epoch?
    private var awaiting: Awaiting?
    private var requestedAt: ContinuousClock.Instant
    private var lastHeard: ContinuousClock.Instant
    private var pendingDigest: (seq: SequenceNumber, digest: StateDigest)?
    /// A CHECKPOINT of a seq the replica has not reached yet.
    private var pendingCheckpoint: SequenceNumber?
    /// Divergences in a row (each within twice the maximum backoff of the one before), and when the last was.
    private var divergenceStreak = 0
    private var lastDivergence: ContinuousClock.Instant?
    /// A snapshot request put off after a divergence; ``tick(now:)`` sends it.
    private var snapshotDueAt: ContinuousClock.Instant?
    /// How many times in a row a snapshot or range request went unanswered: each repeat waits twice as long (up to
    /// 8 request timeouts), so a reply slower than one timeout (a large snapshot) still gets through.
    private var unansweredTries = 0

    /// How long the request out now waits before it is sent again.
    private var currentRequestTimeout: Duration { settings.requestTimeout * (1 << min(unansweredTries, 3)) }

    /// A replica that has just subscribed; call ``start(now:)`` next.
    public init(settings: Settings = Settings(), now: ContinuousClock.Instant) {
        self.settings = settings
        self.requestedAt = now
        self.lastHeard = now
    }

    /// Begins the join: the owner has subscribed and must now ask for a snapshot.
    public mutating func start(now: ContinuousClock.Instant) -> [Output] {
        phase = .joining
        return request(.snapshot, now: now)
    }

    // MARK: - Inputs from the events socket

    /// An event published by the daemon: `action` at `seq`, dispatched by `author`.
    public mutating func event(
        epoch eventEpoch: Epoch,
        seq: SequenceNumber,
        action: Frame,
        author: Author = .unknown,
        now: ContinuousClock.Instant
    ) -> [Output] {
        lastHeard = now
        let sequenced = SequencedAction(seq: seq, action: action, author: author)
        if let epoch, eventEpoch != epoch, phase != .joining {
            return resync(.newEpoch(old: epoch, new: eventEpoch), now: now, keeping: (eventEpoch, sequenced))
        }
        heard(epoch: eventEpoch, seq: seq)
        switch phase {
        case .joining:
            keep(epoch: eventEpoch, sequenced)
            return []
        case .repairing:
            if seq > lastSeq { keep(epoch: eventEpoch, sequenced) }
            return []
        case .live:
            if seq <= lastSeq { return [] }  // a duplicate
            if seq == lastSeq + 1 {
                lastSeq = seq
                return [.apply([sequenced])] + checkPendingDigest()
            }
            keep(epoch: eventEpoch, sequenced)
            phase = .repairing
            return request(.range(from: lastSeq + 1, to: seq - 1), now: now)
        }
    }

    /// A run of events published together (EVENTS): the same as each of them in turn, with the actions that apply
    /// at once coming out as one ``Output/apply(_:)``, so the owner applies the run in one step. `authors` is empty
    /// (nobody identified) or holds each action's author.
    public mutating func events(
        epoch eventEpoch: Epoch,
        firstSeq: SequenceNumber,
        actions: [Frame],
        authors: [Author] = [],
        now: ContinuousClock.Instant
    ) -> [Output] {
        var outputs: [Output] = []
        var run: [SequencedAction] = []
        for (offset, action) in actions.enumerated() {
            let author = offset < authors.count ? authors[offset] : .unknown
            let seq = firstSeq + UInt64(offset)
            for output in event(epoch: eventEpoch, seq: seq, action: action, author: author, now: now) {
                if case let .apply(applied) = output {
                    run += applied
                } else {
                    if !run.isEmpty { outputs.append(.apply(run)) }
                    run = []
                    outputs.append(output)
                }
            }
        }
        if !run.isEmpty { outputs.append(.apply(run)) }
        return outputs
    }

    /// A heartbeat: the daemon is alive and its store is at `lastSeq`.
    public mutating func heartbeat(
        epoch beatEpoch: Epoch,
        lastSeq daemonLast: SequenceNumber,
        now: ContinuousClock.Instant
    )
        -> [Output]
    {
        lastHeard = now
        if let epoch, beatEpoch != epoch, phase != .joining {
            return resync(.newEpoch(old: epoch, new: beatEpoch), now: now)
        }
        heard(epoch: beatEpoch, seq: daemonLast)
        return repairIfBehind(now: now)
    }

    /// The daemon's digest of its state at `seq`.
    public mutating func digest(
        epoch digestEpoch: Epoch,
        seq: SequenceNumber,
        digest: StateDigest,
        now: ContinuousClock.Instant
    ) -> [Output] {
        lastHeard = now
        if let epoch, digestEpoch != epoch, phase != .joining {
            return resync(.newEpoch(old: epoch, new: digestEpoch), now: now)
        }
        heard(epoch: digestEpoch, seq: seq)
        guard phase != .joining else { return [] }
        if seq < lastSeq { return [.verifyKeptDigest(seq: seq, digest: digest)] }
        if seq == lastSeq { return [.verifyDigest(seq: seq, digest: digest)] }
        pendingDigest = (seq, digest)
        return repairIfBehind(now: now)
    }

    /// The daemon is taking its digest at `seq` off its loop; the DIGEST comes later.
    public mutating func checkpoint(
        epoch checkpointEpoch: Epoch,
        seq: SequenceNumber,
        now: ContinuousClock.Instant
    ) -> [Output] {
        lastHeard = now
        if let epoch, checkpointEpoch != epoch, phase != .joining {
            return resync(.newEpoch(old: epoch, new: checkpointEpoch), now: now)
        }
        heard(epoch: checkpointEpoch, seq: seq)
        guard phase != .joining, seq >= lastSeq else { return [] }
        if seq == lastSeq { return [.keepDigest(seq: seq)] }
        pendingCheckpoint = seq
        return repairIfBehind(now: now)
    }

    // MARK: - Inputs from the command socket

    /// The snapshot asked for.
    public mutating func snapshot(
        epoch snapshotEpoch: Epoch,
        seq: SequenceNumber,
        digest: StateDigest,
        state: Frame,
        now: ContinuousClock.Instant
    ) -> [Output] {
        guard awaiting == .snapshot else { return [] }
        awaiting = nil
        unansweredTries = 0
        lastHeard = now
        if bufferEpoch != snapshotEpoch { buffer.removeAll() }
        if let pending = pendingDigest, pending.seq <= seq || epoch != snapshotEpoch { pendingDigest = nil }
        if let pending = pendingCheckpoint, pending <= seq || epoch != snapshotEpoch { pendingCheckpoint = nil }
        epoch = snapshotEpoch
        bufferEpoch = snapshotEpoch
        lastSeq = seq
        heard(epoch: snapshotEpoch, seq: seq)
        return [.install(epoch: snapshotEpoch, seq: seq, digest: digest, state: state)] + drainBuffer(now: now)
    }

    /// Events asked for by range; `actions[k]` has seq `firstSeq + k` and author `authors[k]` (`authors` empty:
    /// nobody identified).
    public mutating func range(
        epoch rangeEpoch: Epoch,
        firstSeq: SequenceNumber,
        actions: [Frame],
        authors: [Author] = [],
        now: ContinuousClock.Instant
    ) -> [Output] {
        guard case .range = awaiting else { return [] }
        awaiting = nil
        unansweredTries = 0
        lastHeard = now
        if let epoch, rangeEpoch != epoch {
            return resync(.newEpoch(old: epoch, new: rangeEpoch), now: now)
        }
        var applied: [SequencedAction] = []
        for (offset, action) in actions.enumerated() {
            let seq = firstSeq + SequenceNumber(offset)
            guard seq > lastSeq else { continue }
            guard seq == lastSeq + 1 else { break }  // the daemon left a hole: ask again below
            let author = offset < authors.count ? authors[offset] : .unknown
            applied.append(SequencedAction(seq: seq, action: action, author: author))
            lastSeq = seq
        }
        daemonSeq = max(daemonSeq, lastSeq)
        let outputs: [Output] = applied.isEmpty ? [] : [.apply(applied)]
        return outputs + checkPendingDigest() + drainBuffer(now: now)
    }

    /// The range asked for is no longer in the journal: only a snapshot can fill the gap.
    public mutating func compacted(
        epoch compactedEpoch: Epoch,
        firstAvailable: SequenceNumber,
        now: ContinuousClock.Instant
    )
        -> [Output]
    {
        guard case .range = awaiting else { return [] }
        awaiting = nil
        unansweredTries = 0
        lastHeard = now
        if let epoch, compactedEpoch != epoch {
            return resync(.newEpoch(old: epoch, new: compactedEpoch), now: now)
        }
        phase = .repairing
        return request(.snapshot, now: now)
    }

    /// The range asked for was refused as `invalid_range`: the daemon has fewer events than it announced (it
    /// restarted and lost the newest, with relaxed durability, say). Asking again would loop; start over.
    public mutating func rangeRefused(now: ContinuousClock.Instant) -> [Output] {
        guard case let .range(from, _) = awaiting else { return [] }
        awaiting = nil
        unansweredTries = 0
        return resync(.historyShorter(from: from), now: now)
    }

    // MARK: - Inputs from the owner

    /// The owner found its state's digest differs from the daemon's at `seq` (or a snapshot's bytes do not
    /// match its digest): report it and start over.
    public mutating func digestMismatch(at seq: SequenceNumber, now: ContinuousClock.Instant) -> [Output] {
        if let last = lastDivergence, now - last <= settings.maximumDivergenceBackoff * 2 {
            divergenceStreak += 1
        } else {
            divergenceStreak = 1
        }
        lastDivergence = now
        var delay = Duration.zero
        if divergenceStreak > 1 {
            delay = settings.divergenceBackoff
            for _ in 2..<divergenceStreak where delay < settings.maximumDivergenceBackoff { delay *= 2 }
            delay = min(delay, settings.maximumDivergenceBackoff)
        }
        return [.reportDivergence(seq: seq)] + resync(.divergence(seq: seq), now: now, delay: delay)
    }

    /// A part of the snapshot asked for arrived (a state sent in parts, docs/protocol.md "SNAPSHOT in parts"): the
    /// request is being answered, so its timeout counts from `now` — a large state's parts all together may take
    /// longer than one timeout. (A part that does not come in time is asked for again, the wait doubled, as any
    /// request is: the owner asks for the same part, not the first.)
    public mutating func snapshotPartArrived(now: ContinuousClock.Instant) {
        guard awaiting == .snapshot, snapshotDueAt == nil else { return }
        requestedAt = now
    }

    /// The owner itself was not running (the process was stopped or starved) until `now`: silence since then
    /// says nothing about the daemon. What was missed meanwhile shows up as a gap and is repaired by range.
    public mutating func resumed(now: ContinuousClock.Instant) {
        lastHeard = now
        requestedAt = now
    }

    /// Time passed: resend a request nobody answered, and ask after the state held when the daemon fell silent.
    public mutating func tick(now: ContinuousClock.Instant) -> [Output] {
        if let due = snapshotDueAt {
            guard now >= due else { return [] }
            return request(.snapshot, now: now)
        }
        let silence = now - lastHeard
        if silence > settings.silenceLimit, epoch != nil {
            lastHeard = now
            guard awaiting == nil else { return [.silent(silence)] }
            // From the last event held on: a daemon whose history lost it refuses (`invalid_range`) or answers
            // with another epoch; one that holds it answers with the events since, up to its last (what a replica
            // that hears no events would otherwise never learn). At seq 0 only a snapshot tells.
            let probe: Awaiting = lastSeq > 0 ? .range(from: lastSeq, to: .max) : .snapshot
            return [.silent(silence)] + request(probe, now: now)
        }
        if let awaiting, now - requestedAt > currentRequestTimeout {
            unansweredTries += 1
            return [.requestUnanswered] + request(awaiting, now: now)
        }
        return []
    }

    /// The owner's command socket changed (it moved to another daemon, or renewed the socket after a silence):
    /// a request out on the old one is lost, so it is sent again now.
    /// Its timeout still counts from the first send: a daemon that only ever says `not_leader` does not keep it
    /// out forever, the timeout moves the owner on.
    public mutating func resendRequest(now: ContinuousClock.Instant) -> [Output] {
        guard snapshotDueAt == nil, let awaiting else { return [] }
        switch awaiting {
        case .snapshot: return [.requestSnapshot]
        case let .range(from, to): return [.requestRange(from: from, to: to)]
        }
    }

    // MARK: - Internals

    private mutating func request(_ what: Awaiting, now: ContinuousClock.Instant) -> [Output] {
        snapshotDueAt = nil
        awaiting = what
        requestedAt = now
        switch what {
        case .snapshot: return [.requestSnapshot]
        case let .range(from, to): return [.requestRange(from: from, to: to)]
        }
    }

    private mutating func resync(
        _ reason: ResyncReason,
        now: ContinuousClock.Instant,
        keeping event: (Epoch, SequencedAction)? = nil,
        delay: Duration = .zero
    ) -> [Output] {
        resyncCount += 1
        phase = .joining
        epoch = nil
        lastSeq = 0
        daemonSeq = 0
        daemonSeqEpoch = nil
        pendingDigest = nil
        pendingCheckpoint = nil
        buffer.removeAll()
        bufferEpoch = nil
        if let (eventEpoch, sequenced) = event { keep(epoch: eventEpoch, sequenced) }
        guard delay > .zero else { return [.resync(reason)] + request(.snapshot, now: now) }
        awaiting = nil
        snapshotDueAt = now + delay
        lastHeard = now
        return [.resync(reason)]
    }

    /// Keeps an event for later, in seq order, once; events of an older epoch than the newest kept are void.
    private mutating func keep(epoch eventEpoch: Epoch, _ event: SequencedAction) {
        if bufferEpoch != eventEpoch {
            buffer.removeAll()
            bufferEpoch = eventEpoch
        }
        if let last = buffer.last, last.seq >= event.seq {
            // Out of order or repeated: insert in place unless it is already there.
            let index = buffer.firstIndex { $0.seq >= event.seq }!
            if buffer[index].seq != event.seq { buffer.insert(event, at: index) }
        } else {
            buffer.append(event)
        }
        if buffer.count > settings.maximumBufferedEvents {
            buffer.removeFirst(buffer.count - settings.maximumBufferedEvents)
        }
    }

    /// Applies what the buffer holds after `lastSeq`, then asks for whatever is still missing.
    private mutating func drainBuffer(now: ContinuousClock.Instant) -> [Output] {
        var applied: [SequencedAction] = []
        var consumed = 0
        for event in buffer {
            if event.seq <= lastSeq {
                consumed += 1
            } else if event.seq == lastSeq + 1 {
                applied.append(event)
                lastSeq = event.seq
                consumed += 1
            } else {
                break
            }
        }
        buffer.removeFirst(consumed)
        var outputs: [Output] = applied.isEmpty ? [] : [.apply(applied)]
        outputs += checkPendingDigest()
        if let next = buffer.first {
            phase = .repairing
            return outputs + request(.range(from: lastSeq + 1, to: next.seq - 1), now: now)
        }
        phase = .live
        return outputs + repairIfBehind(now: now)
    }

    /// A heartbeat or digest said the daemon is ahead: fetch the difference unless a request is out.
    private mutating func repairIfBehind(now: ContinuousClock.Instant) -> [Output] {
        guard phase == .live, daemonSeq > lastSeq, awaiting == nil else { return [] }
        phase = .repairing
        return request(.range(from: lastSeq + 1, to: daemonSeq), now: now)
    }

    /// The daemon said it reached `seq` in `epoch`; a newer epoch's word replaces an older one's.
    private mutating func heard(epoch heardEpoch: Epoch, seq: SequenceNumber) {
        if daemonSeqEpoch != heardEpoch {
            daemonSeqEpoch = heardEpoch
            daemonSeq = seq
        } else {
            daemonSeq = max(daemonSeq, seq)
        }
    }

    private mutating func checkPendingDigest() -> [Output] {
        var outputs: [Output] = []
        if let pending = pendingCheckpoint, pending <= lastSeq {
            pendingCheckpoint = nil
            if pending == lastSeq { outputs.append(.keepDigest(seq: pending)) }
        }
        guard let pending = pendingDigest, pending.seq <= lastSeq else { return outputs }
        pendingDigest = nil
        return outputs + (pending.seq == lastSeq ? [.verifyDigest(seq: pending.seq, digest: pending.digest)] : [])
    }
}
