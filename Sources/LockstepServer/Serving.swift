import Foundation
import Lockstep
import LockstepJournal
import LockstepProtocol
import Logging
import Tracing
import ZeroMQ

/// A request read by the leader, waiting for its group to be answered.
struct Waiting {
    var envelope: [Frame]
    var work: Serving.Pending
}

/// What the loop owns while the daemon leads: the stores (``Sequencer``), the ``CommitPipeline`` and what was
/// published. It sequences each request into the pipeline's open group and carries out what the pipeline decides —
/// commits, answers, publication — through the loop's sockets; the pipeline decides, this does.
struct Serving {
    typealias Pipeline = CommitPipeline<Waiting, Sequenced>

    /// What a group journals for one change: a sequenced dispatch (a client's, a timer's, an effect's results) with
    /// the outbox changes its actions made, or outbox changes alone (an effect failed, given up, sent back).
    struct Sequenced: Sendable {
        var commit: Sequencer.Commit?
        var effects: [JournalEffect] = []
        var effectUpdates: [JournalEffectUpdate] = []
        var timerChanges: [JournalTimerChange] = []
        /// The daemon's span of a traced dispatch (one whose DISPATCH carried a trace context), ended once its
        /// actions are published or refused.
        var span: (any Span)? = nil
    }

    let loop: CommandLoop
    let journal: any Journal
    /// Whether a reader thread's RANGE or SNAPSHOT read holds the journal from the loop's commits: SQLite's one
    /// connection does; the log and in-memory journals answer reads from memory beside them.
    let readsHoldTheJournal: Bool
    var sequencer: Sequencer
    var pipeline: Pipeline
    let limits: Limits
    /// When this leadership began: what `eventsPerSecond` counts from, as `committedEvents` do.
    let servingSince = ContinuousClock.now
    /// How this leadership began, logged once the daemon serves; `nil` on a local journal.
    let takeover: Leadership.Takeover?
    var lastPublished: [StoreName: ContinuousClock.Instant] = [:]
    /// Which of each store's streams (one by one, in runs) someone follows, as ``LoopSockets/subscriptions`` say.
    var streams: [StoreName: (oneByOne: Bool, runs: Bool)] = [:]
    /// The stores whose trace topic someone follows: a replica that traces.
    var traced: Set<StoreName> = []
    /// Each store's last seq published: durable, and what heartbeats announce.
    var publishedSeq: [StoreName: SequenceNumber] = [:]
    var committedEvents: [StoreName: UInt64] = [:]
    /// Each store's last DIGEST published, for STATUS.
    var lastDigests: [StoreName: Digest] = [:]
    /// Each store's dispatches answered REJECTED (by rejection code) and ERROR (by error code), for STATUS.
    var answered: [StoreName: (rejected: [String: UInt64], refused: [String: UInt64])] = [:]
    /// When and where each store's checkpoints are taken.
    var checkpoints: Checkpoints
    /// What the group being committed publishes after its events: the DIGESTs of checkpoints taken on the loop, the
    /// CHECKPOINTs of those handed to the checkpoint thread.
    var committing: (digests: [Digest], checkpoints: [Checkpoint])?
    /// The stores whose snapshot the commit in flight holds, and how many snapshots each store committed since the
    /// daemon began serving (for the metrics).
    var committingSnapshots: [StoreName] = []
    var snapshotsCommitted: [StoreName: UInt64] = [:]
    /// The replicas that report to this leader, and what their reports added up to, by store.
    var roster = ReplicaRoster()
    var reported: [StoreName: ReplicaRoster.Counts] = [:]
    /// Snapshots the checkpoint thread made, for the next commit to journal.
    var readySnapshots: [JournalSnapshot] = []
    /// DIGESTs the checkpoint thread made of a seq not yet published: they go out after its event.
    var laterDigests: [Digest] = []
    /// The fault suite's crash point, in a test build.
    var failpoint: Failpoint?
    /// The effects and timers, when a hosted domain declares effects.
    var ledger: EffectLedger

    typealias Digest = (store: StoreName, epoch: Epoch, seq: SequenceNumber, digest: StateDigest)
    typealias Checkpoint = (store: StoreName, epoch: Epoch, seq: SequenceNumber)

    var configuration: DaemonConfiguration { loop.configuration }
    var logger: Logger { loop.logger }

    /// This leadership ended: the daemon stands by, recovering at once when it still holds the lease in term
    /// `stillHeld`.
    struct SteppedDown: Error {
        var reason: String
        var stillHeld: UInt64?
    }

    /// The leader's state over `sequencer` (the stores as the journal proves them), with a PostgreSQL journal's
    /// `lease`.
    init(
        loop: CommandLoop,
        journal: any Journal,
        recovered: CommandLoop.Recovered,
        lease: Pipeline.Lease?,
        takeover: Leadership.Takeover?,
        sockets: LoopSockets
    ) {
        self.loop = loop
        self.journal = journal
        readsHoldTheJournal = journal is SQLiteJournal
        sequencer = recovered.sequencer
        ledger = EffectLedger(outbox: recovered.outbox, policy: loop.configuration.effects.policy, now: .now)
        self.takeover = takeover
        failpoint = loop.failpoint
        limits = Limits(
            maximumBatch: loop.configuration.maximumBatch,
            maximumActionBytes: loop.configuration.maximumMessageBytes
        )
        pipeline = Pipeline(
            commitsOnLoop: !(journal is PostgresJournal),
            relaxed: loop.configuration.durability == .relaxed,
            lease: lease
        )
        checkpoints = Checkpoints(
            everyEvents: loop.configuration.digestEveryEvents,
            offLoopBytes: loop.configuration.checkpointOffLoopBytes,
            stores: recovered.sequencer.stores.mapValues(\.stateBytesHint),
            recoveredAt: .now
        )
        let now = ContinuousClock.now
        for (name, store) in sequencer.stores {
            lastPublished[name] = now
            publishedSeq[name] = store.lastSeq
        }
        // A subscriber that stayed connected while the daemon stood by sends its subscriptions no more.
        followSubscriptions(sockets)
    }

    /// The stores as the journal proves them, with the idempotency entries that answer retries.
    static func recover(_ domains: [HostedDomain], journal: any Journal, logger: Logger) throws -> Sequencer {
        // Every store's version first: a store that cannot be taken over refuses the start before any other
        // store is upgraded, so the journal stays readable by the build that wrote it.
        for domain in domains {
            do {
                try domain.checkTakeOver(journal)
            } catch {
                throw ServerError(
                    code: .journal,
                    "cannot recover store '\(domain.name)' from \(journal.location): \(error)"
                )
            }
        }
        var stores: [any SequencedStore] = []
        for domain in domains {
            do {
                let (store, upgradedFrom) = try domain.recover(journal)
                if let upgradedFrom {
                    logger.notice(
                        "upgraded store to a new domain version",
                        metadata: [
                            "store": "\(store.name)", "from": "\(upgradedFrom)", "to": "\(store.domainVersion)",
                            "seq": "\(store.lastSeq)",
                        ]
                    )
                }
                logger.info(
                    "recovered store",
                    metadata: ["store": "\(store.name)", "seq": "\(store.lastSeq)", "epoch": "\(store.epoch)"]
                )
                stores.append(store)
            } catch {
                throw ServerError(
                    code: .journal,
                    "cannot recover store '\(domain.name)' from \(journal.location): \(error)"
                )
            }
        }
        var sequencer = Sequencer(stores: stores, idempotencyCapacity: journal.policy.idempotencyEntriesKept)
        sequencer.reserveIdempotency(try journal.idempotencyRecordCount())
        // An entry that cannot be read is a request whose retry could be applied twice: refuse to start.
        try journal.forEachIdempotencyRecord { (record: IdempotencyRecord) throws(JournalError) in
            guard let client = ClientID(bytes: record.key.clientID), let reply = ReplyRecord.decode(record.reply),
                let fingerprint = StateDigest(bytes: record.fingerprint)
            else {
                let client = record.key.clientID.map { String(format: "%02x", $0) }.joined()
                throw JournalError(
                    code: .corrupt,
                    file: journal.location,
                    operation: "recover",
                    message: "the idempotency entry of client \(client) request \(record.key.requestNumber) is "
                        + "unreadable (client id of \(record.key.clientID.count) bytes, fingerprint of "
                        + "\(record.fingerprint.count), reply of \(record.reply.count)): a retry of that request "
                        + "could be applied twice; restore the data directory from a backup, or, accepting that risk "
                        + "for this one request, delete the entry: sqlite3 \(journal.location) \"DELETE FROM "
                        + "idempotency WHERE client_id = x'\(client)' AND request_number = "
                        + "\(record.key.requestNumber)\""
                )
            }
            sequencer.remember(
                IdempotencyCache.Key(client: client, requestNumber: record.key.requestNumber),
                IdempotencyCache.Entry(fingerprint: fingerprint, reply: reply)
            )
        }
        return sequencer
    }

    var storeSummary: String {
        sequencer.stores.values.sorted { $0.name < $1.name }.map { "\($0.name)@\($0.lastSeq)" }.joined(separator: " ")
    }

    /// Logs that the daemon serves (and how it took over, when it did) and tells systemd.
    func announceReady() {
        var metadata: Logger.Metadata = [
            "command": "\(configuration.commandEndpoint)", "events": "\(configuration.eventsEndpoint)",
            "stores": "\(storeSummary)",
        ]
        if let takeover, let leased = journal as? PostgresJournal {
            let recovery = ContinuousClock.now - takeover.since
            metadata["term"] = "\(takeover.term)"
            metadata["name"] = "\(leased.lease.holder)"
            metadata["previous"] = "\(takeover.previousHolder.isEmpty ? "(none)" : takeover.previousHolder)"
            metadata["recoveryMs"] = "\(recovery / .milliseconds(1))"
            if takeover.afterFailedCommit {
                logger.notice("recovered after a failed commit: leading on", metadata: metadata)
            } else {
                logger.notice("took the journal's lease: leading", metadata: metadata)
            }
            let leader = "leader \(leased.lease.holder) term \(takeover.term)"
            loop.notifier.notify("READY=1\nSTATUS=serving \(loop.domains.count) stores, \(leader)")
        } else {
            logger.info("daemon ready", metadata: metadata)
            loop.notifier.notify("READY=1\nSTATUS=serving \(loop.domains.count) stores")
        }
    }

    /// When the leader has something to do without a request: a heartbeat, a renewal, a sync.
    func nextDeadline() -> ContinuousClock.Instant {
        var deadline = (lastPublished.values.min() ?? ContinuousClock.now) + configuration.heartbeatInterval
        if let pipelineDeadline = pipeline.nextDeadline { deadline = min(deadline, pipelineDeadline) }
        // Only for stores whose every event is published (`takeDeferredCheckpoints` waits for that).
        let isPublished = { (store: StoreName) in
            guard let last = sequencer.stores[store]?.lastSeq else { return false }
            return (publishedSeq[store] ?? last) == last
        }
        if let deferred = checkpoints.nextDeferred(published: isPublished) { deadline = min(deadline, deferred) }
        // While the lease is not surely ours, effects wait for the renewal, whose end wakes the loop.
        guard !ledger.isIdle, pipeline.surelyLeads(at: .now) else { return deadline }
        let (monotonic, wall) = ledger.nextDeadline(now: .now)
        if let monotonic { deadline = min(deadline, monotonic) }
        if let wall {
            // Compared before subtracting: a due time may be anywhere in Int64.
            let now = Self.wallMilliseconds()
            deadline = min(deadline, wall <= now ? .now : .now + .milliseconds(wall - now))
        }
        return deadline
    }

    /// The wall clock, in milliseconds since 1970: what timers are due by (docs/effects.md, "Which clock").
    static func wallMilliseconds() -> Int64 {
        Int64((Date().timeIntervalSince1970 * 1_000).rounded(.down))
    }

    /// A request's answer, as it waits for its group's commit.
    enum Pending {
        /// Final whatever the commit does (a request that could not be read).
        case reply(Reply)
        /// Decided against the state the group's earlier dispatches (and earlier groups) left: it stands only if
        /// the group's commit does — an ACCEPTED, a REJECTED, a retry's first reply.
        case decided(Reply)
        /// Answered as the daemon stands when the group is answered, whatever its commit did.
        case status(requestID: UInt64)
        /// The store as it was when the request was read (a value: the reader encodes it off the loop).
        case snapshot(requestID: UInt64, store: any SequencedStore, part: SnapshotPartRequest?)
        /// Read from the journal up to the store's seq when the request was read, durable once the group is.
        case range(requestID: UInt64, store: StoreName, epoch: Epoch, lastSeq: SequenceNumber, from: UInt64, to: UInt64)
        /// The daemon's own change (a timer fired, an effect's results, an outbox change): nobody to answer.
        case `internal`
    }

    /// Sequences one request into the open group: a dispatch as sent by `author`, refused `forbidden` unless `grant`
    /// allows each of its action cases.
    mutating func sequence(
        _ request: Result<Request, RefusedRequest>,
        envelope: [Frame],
        author: Author = .unknown,
        grant: AccessPolicy.ActionGrant = .every
    ) {
        let work: Pending
        var commit: Sequenced?
        switch request {
        case let .failure(refusal):
            work = .reply(refusal.reply)
        case let .success(.dispatch(dispatch)):
            let span = dispatch.trace.isEmpty ? nil : Self.span(continuing: dispatch)
            switch sequencer.dispatch(dispatch, by: author, allowedCases: grant.cases) {
            case let .reply(reply):
                count(reply, of: dispatch.store)
                if case let .rejected(_, _, rejection) = reply, let feed = loop.inspectorFeed {
                    feed.notice(
                        .rejected(
                            store: dispatch.store.rawValue,
                            author: author.name,
                            code: rejection.code,
                            reason: rejection.reason,
                            actions: dispatch.actions
                        )
                    )
                }
                span?.attributes["lockstep.outcome"] = Self.outcome(of: reply)
                span?.end()
                work = .decided(reply)
            case let .commit(sequenced):
                work = .decided(sequenced.reply)
                commit = outboxChanges(of: sequenced)
                if let span, let first = sequenced.events.first, let last = sequenced.events.last {
                    span.attributes["lockstep.seq.first"] = Int(clamping: first.seq)
                    span.attributes["lockstep.seq.last"] = Int(clamping: last.seq)
                    span.addEvent("sequenced")
                    commit?.span = span
                }
            }
        case let .success(.snapshot(requestID, name, part)):
            if let store = sequencer.stores[name] {
                work = .snapshot(requestID: requestID, store: store, part: part)
            } else {
                work = .reply(unknownStore(requestID, name))
            }
        case let .success(.range(requestID, name, from, to)):
            if let store = sequencer.stores[name] {
                work = .range(
                    requestID: requestID,
                    store: name,
                    epoch: store.epoch,
                    lastSeq: store.lastSeq,
                    from: from,
                    to: to
                )
            } else {
                work = .reply(unknownStore(requestID, name))
            }
        case let .success(.status(requestID)):
            work = .status(requestID: requestID)
        case let .success(.effects(requestID, command)):
            (work, commit) = effects(requestID, command)
        case .success(.report):
            return  // taken by the loop as it reads it (LoopThread.turn): no reply
        }
        pipeline.sequenced(Waiting(envelope: envelope, work: work), commit: commit)
    }

    /// Counts a dispatch's rejection or refusal against its store (a store the daemon hosts: an unknown one is counted
    /// by code only, as every ERROR is).
    mutating func count(_ reply: Reply, of store: StoreName) {
        guard sequencer.stores[store] != nil else { return }
        switch reply {
        case let .rejected(_, _, rejection):
            answered[store, default: ([:], [:])].rejected[rejection.code, default: 0] += 1
        case let .error(_, error): answered[store, default: ([:], [:])].refused[error.code.description, default: 0] += 1
        default: break
        }
    }

    /// What `commit` journals beside its events: its actions' effects to run (the outbox) and the timers they set and
    /// cancel, in order; the ledger takes the timers at once and the effects once the commit is durable.
    mutating func outboxChanges(of commit: Sequencer.Commit, firing timer: JournalTimer? = nil) -> Sequenced {
        var change = Sequenced(commit: commit)
        let store = commit.store.rawValue
        for event in commit.events {
            for record in event.effects {
                if let failure = record.failure {
                    // The action stands; what it set going cannot be kept as JSON: a dead letter, shown and logged.
                    let what = record.kind == .run ? "the effect" : "the action of timer '\(record.key ?? "")'"
                    let error = "\(what) \(failure); fix the domain, then drop this dead letter"
                    change.effects.append(
                        JournalEffect(
                            store: store,
                            seq: record.seq,
                            index: record.index,
                            body: [],
                            lastError: error,
                            dead: true
                        )
                    )
                    logger.error(
                        "an action set going what cannot be encoded: a dead letter",
                        metadata: ["effect": "\(store)/\(record.seq)/\(record.index)", "error": "\(error)"]
                    )
                    continue
                }
                switch record.kind {
                case .run:
                    change.effects.append(
                        JournalEffect(store: store, seq: record.seq, index: record.index, body: record.body)
                    )
                case .schedule:
                    change.timerChanges.append(
                        .set(
                            JournalTimer(
                                store: store,
                                key: record.key ?? "",
                                dueMilliseconds: record.dueMilliseconds ?? 0,
                                action: record.body,
                                seq: record.seq,
                                index: record.index
                            )
                        )
                    )
                case .cancel:
                    change.timerChanges.append(.remove(store: store, key: record.key ?? ""))
                }
            }
        }
        ledger.sequenced(change.effects, timers: change.timerChanges, now: .now)
        // A fired timer left the ledger when it fired; it leaves the journal before what its action sets.
        if let timer { change.timerChanges.insert(.remove(store: timer.store, key: timer.key), at: 0) }
        return change
    }

    /// An EFFECTS request: the listing, after the retry or drop it asks for (journaled with the group, answered once
    /// durable).
    private mutating func effects(_ requestID: UInt64, _ command: EffectsCommand) -> (Pending, Sequenced?) {
        var update: Sequenced?
        switch command {
        case .list:
            break
        case let .retry(text), let .drop(text):
            let retrying = if case .retry = command { true } else { false }
            guard let id = JournalEffectID(text) else {
                let reason = "'\(text)' is not an effect id; an id is store/seq/index, as `lockstep effects list` shows"
                return (.reply(.error(requestID: requestID, ProtocolError(code: .unknownEffect, reason))), nil)
            }
            guard let actions = retrying ? ledger.retry(id, now: .now) : ledger.drop(id) else {
                let reason = ledger.refusal(id, retrying: retrying)
                return (.reply(.error(requestID: requestID, ProtocolError(code: .unknownEffect, reason))), nil)
            }
            update = Sequenced(
                effectUpdates: actions.compactMap { if case let .journal(change) = $0 { change } else { nil } }
            )
        }
        return (.decided(ledger.listing().reply(to: requestID)), update)
    }

    /// The effects' turn: what the runs that ended came to, then what the ledger says is due — timers to fire,
    /// effects to run, results to sequence, changes to journal.
    mutating func runEffects() {
        // Idle, nothing runs whose outcome the ledger would take (a late one it gave up on waits for the next run).
        guard !ledger.isIdle else { return }
        let runner = loop.effects
        let now = ContinuousClock.now
        // A leader that may have lost its lease (paused past it) starts nothing until a renewal says it leads.
        guard pipeline.surelyLeads(at: now) else { return }
        var actions: [EffectLedger.Action] = []
        for outcome in runner.takeOutcomes() {
            failpoint?.pass(.effectRan)
            actions += ledger.finished(outcome.id, attempt: outcome.attempt, outcome.result, now: now)
        }
        actions += ledger.tick(now: now, wallMilliseconds: Self.wallMilliseconds())
        guard !actions.isEmpty else { return }
        for action in actions {
            switch action {
            case let .run(id, body, attempt):
                failpoint?.pass(.effectStart)
                runner.start(EffectRunner.Job(id: id, body: body, attempt: attempt))
            case let .fire(timer):
                sequenceInternal(
                    store: timer.store,
                    actions: [timer.action],
                    key: Self.key("timer", timer.store, timer.seq, timer.index),
                    firing: timer,
                    why: "timer '\(timer.key)'"
                )
            case let .complete(id, frames):
                sequenceInternal(
                    store: id.store,
                    actions: frames,
                    key: Self.key("effect", id.store, id.seq, id.index),
                    done: id,
                    why: "the results of effect \(id)"
                )
            case let .journal(update):
                pipeline.sequenced(Waiting(envelope: [], work: .internal), commit: Sequenced(effectUpdates: [update]))
            case let .failed(id, attempt, error, givenUp):
                runner.cancel(id, attempt: attempt)
                let metadata: Logger.Metadata = ["effect": "\(id)", "attempt": "\(attempt)", "error": "\(error)"]
                if givenUp {
                    logger.error(
                        "an effect was given up: a dead letter, kept until retried or dropped",
                        metadata: metadata
                    )
                } else {
                    logger.warning("an effect's run failed; it is tried again", metadata: metadata)
                }
            }
        }
    }

    /// Sequences the daemon's own dispatch of `actions` to `store` under idempotency key `key` (the same for every
    /// try of it, on any daemon): a due timer's action (which leaves the timers in the same commit), or an effect's
    /// results (the effect is done in the same commit). An action the domain refuses is logged, and the timer or the
    /// effect is done all the same: trying again would be refused again.
    private mutating func sequenceInternal(
        store name: String,
        actions: [[UInt8]],
        key: ClientID,
        firing timer: JournalTimer? = nil,
        done effect: JournalEffectID? = nil,
        why: String
    ) {
        let done = effect.map { [JournalEffectUpdate($0, .done)] } ?? []
        var outcome = Sequenced(effectUpdates: done)
        if let timer {
            // Fired whatever its action comes to: it leaves the ledger now, and the journal in this commit.
            outcome.timerChanges = [.remove(store: timer.store, key: timer.key)]
        }
        if !actions.isEmpty, let storeName = try? StoreName(name), let store = sequencer.stores[storeName] {
            let request = DispatchRequest(
                requestID: 1,
                domainVersion: store.domainVersion,
                clientID: key,
                store: storeName,
                actions: actions
            )
            switch sequencer.dispatch(request, by: .daemon) {
            case let .commit(commit):
                var change = outboxChanges(of: commit, firing: timer)
                change.effectUpdates += done
                outcome = change
            case .reply(.accepted):
                break  // applied before, under the same key: done
            case let .reply(reply):
                logger.error(
                    "the daemon refused its own dispatch of \(why); it is done all the same",
                    metadata: ["store": "\(name)", "reply": "\(reply)"]
                )
            }
        }
        pipeline.sequenced(Waiting(envelope: [], work: .internal), commit: outcome)
    }

    /// The idempotency key of the daemon's own dispatch for `kind` (`timer`, `effect`) with this stable id: 16 bytes
    /// of its SHA-256, the same on every daemon.
    static func key(_ kind: String, _ store: String, _ seq: UInt64, _ index: Int) -> ClientID {
        let digest = StateDigest(of: Array("lockstep \(kind) \(store) \(seq) \(index)".utf8))
        return ClientID(bytes: Array(digest.bytes.prefix(16)))!
    }

    /// Hands the open group to the pipeline when nothing is in flight, and carries out what it decides.
    mutating func advance(_ sockets: inout LoopSockets, _ writer: JournalWriter) throws(SteppedDown) {
        let actions = pipeline.advance(now: .now, readersBusy: readsHoldTheJournal && loop.offloadedInFlight > 0)
        try perform(actions, &sockets, writer)
    }

    /// The work the writer (or the loop) did for the pipeline is done: carries out what its outcome makes of it.
    mutating func completed(
        _ result: Result<Void, CommitFailure>,
        _ sockets: inout LoopSockets,
        _ writer: JournalWriter
    ) throws(SteppedDown) {
        try perform(pipeline.completed(result, now: .now), &sockets, writer)
    }

    /// Waits for the writer and answers everything sequenced: the last turn before the daemon stops.
    mutating func finish(_ sockets: inout LoopSockets, _ writer: JournalWriter) throws(SteppedDown) {
        while !pipeline.isIdle {
            if pipeline.isBusy, case let .commit(result) = writer.waitForResult() {
                try completed(result, &sockets, writer)
            }
            try advance(&sockets, writer)
        }
    }

    /// Carries out `actions` in order, and what the commits made here (on the loop) come to.
    private mutating func perform(
        _ actions: [Pipeline.Action],
        _ sockets: inout LoopSockets,
        _ writer: JournalWriter
    ) throws(SteppedDown) {
        var queue = actions[...]
        while let action = queue.popFirst() {
            switch action {
            case let .commit(group, sync, place):
                let batch: JournalBatch
                do {
                    batch = try self.batch(for: group.commits)
                } catch {
                    queue += pipeline.completed(.failure(CommitFailure(.other, "\(error)")), now: .now)
                    continue
                }
                failpoint?.pass(.beforeCommit)
                let (journal, timings) = (self.journal, loop.journalTimings)
                timings.batch.record(batch.events.count)
                queue += run(at: place, writer) { () throws(JournalError) in
                    try timings.commit { () throws(JournalError) in try journal.commit(batch) }
                    if sync { try timings.sync { () throws(JournalError) in try journal.sync() } }
                }
            case let .sync(place):
                let (journal, timings) = (self.journal, loop.journalTimings)
                queue += run(at: place, writer) { () throws(JournalError) in
                    try timings.sync { () throws(JournalError) in try journal.sync() }
                }
            case .renewLease:
                guard let leased = journal as? PostgresJournal else { continue }
                _ = run(at: .writer, writer) { () throws(JournalError) in try leased.renewLease() }
            case let .answer(group, committed, publishing):
                if publishing { failpoint?.pass(.afterCommit) }
                if committed { Self.spans(of: group) { $0.addEvent("committed") } }
                release(group, committed: committed, &sockets)
                if publishing {
                    failpoint?.pass(.afterReply)
                    publish(group, &sockets)
                    // Durable: the effects these actions set going may run now.
                    ledger.committed(group.commits.flatMap { $0.effects.map(\.id) }, now: .now)
                    Self.spans(of: group) { $0.addEvent("published") }
                }
                Self.spans(of: group) { span in
                    span.attributes["lockstep.outcome"] = committed ? "accepted" : "unavailable"
                    if !committed { span.setStatus(SpanStatus(code: .error, message: "not committed")) }
                    span.end()
                }
            case let .refuse(group, reason):
                release(group, refusing: reason, &sockets)
                Self.spans(of: group) { span in
                    span.attributes["lockstep.outcome"] = "not_leader"
                    span.setStatus(SpanStatus(code: .error, message: reason))
                    span.end()
                }
            case let .stepDown(reason, stillHeld):
                throw SteppedDown(reason: reason, stillHeld: stillHeld)
            case .recoverStores:
                do {
                    let recovered = try loop.recoverStores(journal)
                    sequencer = recovered.sequencer
                    checkpoints.restart(stores: sequencer.stores.mapValues(\.stateBytesHint), at: .now)
                    (committing, committingSnapshots, readySnapshots, laterDigests) = (nil, [], [], [])
                    // What was sequenced on the failed commit is gone: the outbox is the journal's again.
                    loop.effects.cancelAll()
                    ledger = EffectLedger(outbox: recovered.outbox, policy: ledger.policy, now: .now)
                } catch {
                    throw SteppedDown(reason: "the stores could not be recovered after a failed commit: \(error)")
                }
                for (name, store) in sequencer.stores { publishedSeq[name] = store.lastSeq }
            case let .stop(reason):
                throw SteppedDown(reason: Self.diskFailed(reason))
            case let .renewalFailed(reason):
                logger.warning("could not renew the lease; trying again", metadata: ["error": "\(reason)"])
            case let .commitFailed(reason):
                logger.error("commit failed; nothing of this batch was applied", metadata: ["error": "\(reason)"])
            }
        }
    }

    /// The daemon's span of a traced dispatch, a child of the client's span whose context the DISPATCH carried
    /// (docs/operations.md, "Traces"): from reading it through validation and the commit to publishing its events.
    static func span(continuing dispatch: DispatchRequest) -> any Span {
        var context = ServiceContext.topLevel
        InstrumentationSystem.instrument.extract(dispatch.trace, into: &context, using: TraceFields())
        let span = InstrumentationSystem.tracer.startSpan("lockstep.sequence", context: context, ofKind: .server)
        span.attributes["lockstep.store"] = dispatch.store.rawValue
        span.attributes["lockstep.actions"] = dispatch.actions.count
        return span
    }

    /// What a dispatch answered at once came to, for its span: `rejected CODE`, or the ERROR's code.
    static func outcome(of reply: Reply) -> String {
        switch reply {
        case let .rejected(_, _, rejection): "rejected \(rejection.code)"
        case let .error(_, error): "\(error.code)"
        default: "answered"
        }
    }

    /// Calls `body` with the span of each traced dispatch of `group`.
    static func spans(of group: Pipeline.Group, _ body: (any Span) -> Void) {
        for commit in group.commits { if let span = commit.span { body(span) } }
    }

    /// Runs `work` here at once — returning what its outcome comes to — or hands it to the writer, whose result a
    /// later turn takes.
    private mutating func run(
        at place: Pipeline.Place,
        _ writer: JournalWriter,
        _ work: @escaping @Sendable () throws(JournalError) -> Void
    ) -> [Pipeline.Action] {
        let job: JournalWriter.Work = { .commit(Self.outcome(of: work)) }
        guard place == .loop else {
            writer.submit(job)
            return []
        }
        return pipeline.completed(Self.outcome(of: work), now: .now)
    }

    /// What `work` came to, as the pipeline reads it.
    static func outcome(of work: () throws(JournalError) -> Void) -> Result<Void, CommitFailure> {
        do throws(JournalError) {
            try work()
            return .success(())
        } catch {
            let kind: CommitFailure.Kind =
                switch error.code {
                case .fenced: .fenced
                case .ioError: .disk
                default: .other
                }
            return .failure(CommitFailure(kind, "\(error)"))
        }
    }

    static func diskFailed(_ reason: String) -> String {
        "the journal's disk failed a write or an fsync, so nothing of the last batch was acknowledged (\(reason)); "
            + "after a failed fsync the kernel's cache no longer tells what the disk holds, so the daemon stops "
            + "instead of going on: start it again (systemd does) and it recovers from what the disk holds; if it "
            + "fails again, check the device and the kernel log"
    }

    /// Sends a group's answers in arrival order: as decided when its commit is durable, `unavailable` when not.
    mutating func release(_ group: Pipeline.Group, committed: Bool, _ sockets: inout LoopSockets) {
        for waiting in group.entries {
            let envelope = waiting.envelope
            let reply: Reply
            switch waiting.work {
            case let .reply(answer):
                reply = answer
            case let .decided(answer):
                reply = committed ? answer : Replies.unavailable(answer.requestID)
            case let .status(requestID):
                reply = status(sockets).reply(to: requestID)
            case let .snapshot(requestID, store, part):
                guard committed else {
                    reply = Replies.unavailable(requestID)
                    break
                }
                let kept = checkpoints.isLarge(store.name) ? journal : nil
                let offloaded = loop.offload(envelope) {
                    Replies.snapshot(requestID: requestID, store: store, journal: kept, part: part)
                }
                if offloaded { continue }
                reply = Replies.busy(requestID)
            case .internal:
                continue
            case let .range(requestID, name, epoch, lastSeq, from, to):
                guard committed else {
                    reply = Replies.unavailable(requestID)
                    break
                }
                let journal = self.journal
                let offloaded = loop.offload(envelope) {
                    Replies.range(
                        requestID: requestID,
                        store: name,
                        epoch: epoch,
                        lastSeq: lastSeq,
                        from: from,
                        to: to,
                        journal: journal
                    )
                }
                if offloaded { continue }
                reply = Replies.busy(requestID)
            }
            sockets.send(reply, to: envelope)
        }
    }

    /// Answers a group `not_leader` — all but the requests that could not be read — when this daemon leads no more.
    func release(_ group: Pipeline.Group, refusing reason: String, _ sockets: inout LoopSockets) {
        for waiting in group.entries {
            switch waiting.work {
            case let .reply(answer):
                sockets.send(answer, to: waiting.envelope)
            case let .decided(answer):
                sockets.send(Replies.notLeader(answer.requestID, reason), to: waiting.envelope)
            case let .status(requestID), let .snapshot(requestID, _, _), let .range(requestID, _, _, _, _, _):
                sockets.send(Replies.notLeader(requestID, reason), to: waiting.envelope)
            case .internal:
                continue
            }
        }
    }

    /// The journal batch of a group's changes, with the snapshots the checkpoint thread made since the last one; and
    /// the checkpoints the group makes due: taken here (a small state) or handed to the checkpoint thread, from the
    /// stores as they stand at the group's last seq (see ``Checkpoints``).
    mutating func batch(for changes: [Sequenced]) throws -> JournalBatch {
        var batch = JournalBatch()
        for change in changes {
            batch.effects += change.effects
            batch.effectUpdates += change.effectUpdates
            batch.timerChanges += change.timerChanges
        }
        let commits = changes.compactMap(\.commit)
        for commit in commits {
            for event in commit.events {
                batch.events.append(
                    JournalEvent(
                        store: commit.store.rawValue,
                        seq: event.seq,
                        action: event.action,
                        clientID: commit.clientID.bytes,
                        requestNumber: commit.requestNumber,
                        author: event.author.name
                    )
                )
            }
            batch.idempotency.append(
                IdempotencyRecord(
                    key: IdempotencyKey(clientID: commit.clientID.bytes, requestNumber: commit.requestNumber),
                    fingerprint: commit.fingerprint.bytes,
                    reply: ReplyRecord.encode(commit.reply)
                )
            )
            checkpoints.committed(commit.store, events: commit.events.count)
        }
        batch.snapshots = readySnapshots
        readySnapshots = []
        var published: (digests: [Digest], checkpoints: [Checkpoint]) = ([], [])
        let now = ContinuousClock.now
        for name in Set(commits.map(\.store)) {
            guard let store = sequencer.stores[name] else { continue }
            let snapshotted = batch.snapshots.contains { $0.store == name.rawValue }
            let snapshotDue = !snapshotted && journal.snapshotDue(store: name.rawValue, in: batch)
            guard let plan = checkpoints.due(name, snapshotDue: snapshotDue, now: now) else { continue }
            switch plan.place {
            case .loop:
                let work = try Checkpoints.Work(plan, of: store)
                if let snapshot = work.snapshot { batch.snapshots.append(snapshot) }
                checkpoints.tookOnLoop(plan, work)
                published.digests.append((name, store.epoch, store.lastSeq, work.digest))
            case .background:
                loop.takeCheckpoint(of: store, plan: plan, generation: checkpoints.generation, journal: journal)
                checkpoints.started(plan, seq: store.lastSeq, now: now)
                published.checkpoints.append((name, store.epoch, store.lastSeq))
            }
        }
        committing = published
        committingSnapshots = batch.snapshots.compactMap { try? StoreName($0.store) }
        return batch
    }

    /// What the checkpoint thread finished: a snapshot to journal in the next commit (one is made due now), a DIGEST to
    /// publish — now, or after its seq's event when that is not published yet.
    mutating func takeCheckpoints(_ sockets: inout LoopSockets) {
        for taken in loop.checkpointsTaken() where checkpoints.finished(taken) {
            guard let work = taken.work else {
                logger.error(
                    "could not take a checkpoint of the store",
                    metadata: ["store": "\(taken.store)", "seq": "\(taken.seq)", "error": "\(taken.failure ?? "")"]
                )
                continue
            }
            if let snapshot = work.snapshot {
                readySnapshots.removeAll { $0.store == taken.store.rawValue }
                readySnapshots.append(snapshot)
                pipeline.sequenced(Waiting(envelope: [], work: .internal), commit: Sequenced())
            }
            laterDigests.append((taken.store, taken.epoch, taken.seq, work.digest))
        }
        publishLaterDigests(sockets)
    }

    /// The checkpoints the pace (or one still being taken) held back past a store's last commit, once it allows:
    /// without them a store that goes quiet would wait for its next commit for the digest of its last events. Only
    /// for a store whose every event is published; a CHECKPOINT goes out now, the DIGEST when it is done.
    mutating func takeDeferredCheckpoints(_ sockets: LoopSockets) {
        let now = ContinuousClock.now
        for (name, store) in sequencer.stores where (publishedSeq[name] ?? store.lastSeq) == store.lastSeq {
            guard let plan = checkpoints.due(name, snapshotDue: false, now: now) else { continue }
            switch plan.place {
            case .loop:
                // A digest form small enough for the loop (the snapshot waits for the pace and a commit).
                do {
                    let work = try Checkpoints.Work(plan, of: store)
                    checkpoints.tookOnLoop(plan, work)
                    laterDigests.append((name, store.epoch, store.lastSeq, work.digest))
                } catch {
                    checkpoints.failedOnLoop(plan)
                    logger.error(
                        "could not take a checkpoint of the store",
                        metadata: ["store": "\(name)", "seq": "\(store.lastSeq)", "error": "\(error)"]
                    )
                }
            case .background:
                // Asked only now that one is due: the loop passes here every turn.
                var deferred = plan
                deferred.snapshot = journal.snapshotDue(store: name.rawValue)
                loop.takeCheckpoint(of: store, plan: deferred, generation: checkpoints.generation, journal: journal)
                checkpoints.started(deferred, seq: store.lastSeq, now: now)
                announce(Event.checkpoint(store: name, epoch: store.epoch, seq: store.lastSeq), sockets)
            }
        }
        publishLaterDigests(sockets)
    }

    /// The DIGESTs made off the loop whose seq is published.
    mutating func publishLaterDigests(_ sockets: LoopSockets) {
        guard !laterDigests.isEmpty else { return }
        let published = publishedSeq
        let (due, later) = (
            laterDigests.filter { $0.seq <= published[$0.store] ?? 0 },
            laterDigests.filter { $0.seq > published[$0.store] ?? 0 }
        )
        laterDigests = later
        for digest in due {
            announce(Event.digest(store: digest.store, epoch: digest.epoch, seq: digest.seq, digest.digest), sockets)
            lastDigests[digest.store] = digest
        }
    }

    /// Events — an EVENT each on the one-by-one stream, one EVENTS per store on the stream in runs — then the
    /// digests taken when the group was handed over.
    mutating func publish(_ group: Pipeline.Group, _ sockets: inout LoopSockets) {
        readSubscriptions(&sockets)
        let now = ContinuousClock.now
        var runs: [(store: StoreName, epoch: Epoch, firstSeq: SequenceNumber, actions: [Frame], authors: [Author])] = []
        // Each traced dispatch's context, before its events: a replica that traces continues it as it applies them.
        for change in group.commits where change.span != nil && !traced.isEmpty {
            guard let span = change.span, let commit = change.commit, traced.contains(commit.store),
                let first = commit.events.first?.seq, let last = commit.events.last?.seq
            else { continue }
            var context: [String: String] = [:]
            InstrumentationSystem.instrument.inject(span.context, into: &context, using: TraceFields())
            guard !context.isEmpty else { continue }
            sockets.publish(
                Event.trace(store: commit.store, epoch: commit.epoch, firstSeq: first, lastSeq: last, context).encode()
            )
        }
        for commit in group.commits.compactMap(\.commit) {
            let streams = streams[commit.store] ?? (false, false)
            if streams.oneByOne {
                for event in commit.events {
                    sockets.publish(
                        Event.event(
                            store: commit.store,
                            epoch: commit.epoch,
                            seq: event.seq,
                            action: event.action,
                            author: event.author
                        ).encode()
                    )
                }
            }
            if streams.runs, let first = commit.events.first {
                // The group's commits of one store are consecutive seqs: one run, unless it is over the limit.
                let run: Int
                if let last = runs.indices.last(where: { runs[$0].store == commit.store }),
                    runs[last].actions.count + commit.events.count <= Event.maximumRun
                {
                    run = last
                } else {
                    run = runs.count
                    runs.append((commit.store, commit.epoch, first.seq, [], []))
                }
                // Authors only once one is known (a commit's actions share theirs): without a policy, none.
                if !first.author.isUnknown || !runs[run].authors.isEmpty {
                    runs[run].authors += repeatElement(
                        Author.unknown,
                        count: runs[run].actions.count - runs[run].authors.count
                    )
                    runs[run].authors += commit.events.map(\.author)
                }
                runs[run].actions += commit.events.map(\.action)
            }
            lastPublished[commit.store] = now
            publishedSeq[commit.store] = commit.events.last?.seq ?? publishedSeq[commit.store]
            if let last = commit.events.last { roster.committed(commit.store, through: last.seq, now: now) }
            committedEvents[commit.store, default: 0] += UInt64(commit.events.count)
        }
        loop.inspectorFeed?.published(publishedSeq)
        for run in runs {
            sockets.publish(
                Event.events(
                    store: run.store,
                    epoch: run.epoch,
                    firstSeq: run.firstSeq,
                    actions: run.actions,
                    authors: run.authors
                ).encode()
            )
        }
        for digest in committing?.digests ?? [] {
            announce(Event.digest(store: digest.store, epoch: digest.epoch, seq: digest.seq, digest.digest), sockets)
            lastDigests[digest.store] = digest
        }
        for checkpoint in committing?.checkpoints ?? [] {
            announce(Event.checkpoint(store: checkpoint.store, epoch: checkpoint.epoch, seq: checkpoint.seq), sockets)
        }
        committing = nil
        for store in committingSnapshots { snapshotsCommitted[store, default: 0] += 1 }
        committingSnapshots = []
        publishLaterDigests(sockets)
    }

    /// Reads what the XPUB says of subscriptions and, if they changed, which streams someone follows.
    mutating func readSubscriptions(_ sockets: inout LoopSockets) {
        if sockets.readSubscriptions() { followSubscriptions(sockets) }
    }

    /// Works out which streams of each store someone follows: a subscription to a prefix of a stream's topic
    /// (even the empty one) follows it.
    mutating func followSubscriptions(_ sockets: LoopSockets) {
        let subscriptions = sockets.subscriptions
        func followed(_ topic: Frame) -> Bool { subscriptions.keys.contains { topic.starts(with: $0) } }
        for name in sequencer.stores.keys {
            streams[name] = (followed(Event.topic(for: name)), followed(Event.runTopic(for: name)))
            if followed(Event.traceTopic(for: name)) { traced.insert(name) } else { traced.remove(name) }
        }
    }

    /// A heartbeat for each store silent for the interval, announcing the last seq published (not the last
    /// sequenced: a replica that hears of a seq asks for it).
    mutating func publishHeartbeats(_ sockets: inout LoopSockets) {
        readSubscriptions(&sockets)
        let now = ContinuousClock.now
        for (name, store) in sequencer.stores
        where now - (lastPublished[name] ?? now) >= configuration.heartbeatInterval {
            announce(
                Event.heartbeat(store: name, epoch: store.epoch, lastSeq: publishedSeq[name] ?? store.lastSeq),
                sockets
            )
            lastPublished[name] = now
        }
    }

    /// Publishes a HEARTBEAT or DIGEST on each stream of its store that someone follows.
    func announce(_ event: Event, _ sockets: LoopSockets) {
        let streams = streams[event.store] ?? (false, false)
        if streams.oneByOne { sockets.publish(event.encode()) }
        if streams.runs { sockets.publish(event.encodeForRuns()) }
    }

    /// The leader's STATUS: its stores as published, its journal, its refusals and settings.
    func status(_ sockets: LoopSockets) -> DaemonStatus {
        let serving = ContinuousClock.now - servingSince
        let seconds = max(Double(serving.components.seconds) + Double(serving.components.attoseconds) / 1e18, 1e-3)
        let effects = ledger.counts()
        let declaring = Set(loop.domains.filter(\.hasEffects).map(\.name))
        let stores = sequencer.stores.values.sorted { $0.name < $1.name }.map { store in
            let rate = Double(committedEvents[store.name] ?? 0) / seconds
            let counts = effects[store.name.rawValue]
            return DaemonStatus.Store(
                name: store.name.rawValue,
                // The seq published: durable, unlike one the writer is still committing.
                seq: publishedSeq[store.name] ?? store.lastSeq,
                epoch: "\(store.epoch)",
                domainVersion: store.domainVersion,
                eventsPerSecond: (rate * 10).rounded() / 10,
                // For a domain that declares effects, and for one that has timers set (or dead letters) without.
                effects: declaring.contains(store.name.rawValue) || counts != nil
                    ? DaemonStatus.Effects(
                        pending: counts?.pending ?? 0,
                        dead: counts?.dead ?? 0,
                        timers: counts?.timers ?? 0
                    ) : nil,
                digest: lastDigests[store.name].map { DaemonStatus.Digest(seq: $0.seq, digest: "\($0.digest)") },
                rejected: answered[store.name]?.rejected ?? [:],
                refused: answered[store.name]?.refused ?? [:]
            )
        }
        var status = loop.status(role: .leader, stores: stores, sockets: sockets, journal: journal)
        let now = ContinuousClock.now
        status.replicas = roster.lags(stores: storePositions, now: now).map { key, entry, lag in
            DaemonStatus.Replica(
                store: key.store.rawValue,
                name: entry.report.name,
                client: "\(key.client)",
                seq: entry.report.appliedSeq,
                lagEvents: lag.events,
                lagMs: Int64(lag.time / .milliseconds(1)),
                heardMsAgo: Int64((now - entry.heardAt) / .milliseconds(1)),
                repairs: entry.report.repairs,
                resyncs: entry.report.resyncs,
                divergences: entry.report.divergences
            )
        }
        if let leased = journal as? PostgresJournal, let lease = pipeline.lease {
            status.name = leased.lease.holder
            status.leader = DaemonStatus.Leader(name: leased.lease.holder, term: lease.term)
        }
        return status
    }

    /// Each store's epoch and last seq published, against which a replica's lag is measured.
    var storePositions: [StoreName: (epoch: Epoch, seq: SequenceNumber)] {
        sequencer.stores.mapValues { ($0.epoch, publishedSeq[$0.name] ?? $0.lastSeq) }
    }

    /// A replica's REPORT: kept in the roster, its counts added to its store's. Answered only when it names a store
    /// this daemon does not host.
    mutating func heard(_ report: ReplicaProgress, requestID: UInt64, now: ContinuousClock.Instant) -> Reply? {
        guard let store = sequencer.stores[report.store] else { return unknownStore(requestID, report.store) }
        let added = roster.heard(
            report,
            epoch: store.epoch,
            seq: publishedSeq[report.store] ?? store.lastSeq,
            now: now
        )
        reported[report.store, default: .init()].repairs += added.repairs
        reported[report.store, default: .init()].resyncs += added.resyncs
        reported[report.store, default: .init()].divergences += added.divergences
        return nil
    }

    func unknownStore(_ requestID: UInt64, _ name: StoreName) -> Reply {
        .error(
            requestID: requestID,
            ProtocolError(
                code: .unknownStore,
                "no store named '\(name)'; this daemon hosts "
                    + sequencer.stores.keys.sorted().map(\.rawValue).joined(separator: ", ")
            )
        )
    }
}
