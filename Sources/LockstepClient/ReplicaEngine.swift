import CoreMetrics
import Foundation
import Lockstep
import LockstepProtocol
import Logging
import Tracing
import ZeroMQ

/// What a dispatch in flight waits with: how many actions it sent, who to answer, and whether it is optimistic
/// (its request number then).
struct Dispatch {
    var count: Int
    var outcome: DispatchOutcome
    var optimistic: UInt64?
    /// When it was first sent: an optimistic dispatch is sent again until ``ReplicaConfiguration/pendingTimeout``.
    var firstSent: ContinuousClock.Instant
    /// A ``Replica/sync(timeout:)``'s STATUS: the seq it names is waited for until then.
    var barrier: ContinuousClock.Instant? = nil
}

/// The replica thread's state: the sync machine, the requests in flight, and what they wait for.
struct Engine<D: Domain> {
    unowned let replica: Replica<D>
    var sync: ReplicaSync
    /// The dispatches waiting for their reply, retried the Lazy Pirate way.
    var inFlight: LazyPirate<Dispatch>
    var repairs = 0
    var divergences = 0
    var disconnected = false
    var problem: String?
    var divergenceDetail: String?
    /// Actions read in this pass over the events socket and not yet handed to the local store: a pass
    /// applies its in-order events as one change, so the store (and its subscribers) see one run per pass,
    /// not one change per event. Anything else the sync machine asks for hands them over first.
    /// Actions read but not yet handed to the local store, with their authors (empty while every one is unknown).
    var unapplied:
        (epoch: Epoch, firstSeq: SequenceNumber, lastSeq: SequenceNumber, actions: [D.Action], authors: [Author])?
    var batching = false
    /// Reads the events' actions: the canonical form's own coder, with Foundation's behind it for anything else.
    let coder = CanonicalEncoding.Coder()
    /// With ``ReplicaConfiguration/evidenceDirectory``: what a divergence's evidence file is made of.
    var evidence: EvidenceRecorder?
    /// The digests of the local state kept at the daemon's digest seqs, and the daemon's, until both are known.
    var digests = DigestChecks()
    /// How many confirmed changes were handed to the local store: the number of the next one, less one.
    var handed: UInt64 = 0
    /// The optimistic dispatches waiting for a reply, by request number.
    var optimisticInFlight: Set<UInt64> = []
    /// Optimistic dispatches the daemon could not take for now (`unavailable`), sent again at their time.
    var retryLater: [(at: ContinuousClock.Instant, request: Request, dispatch: Dispatch)] = []
    /// When the sync machine's request goes out again, after a `not_leader` from every daemon that answers.
    var syncResendAt: ContinuousClock.Instant?
    /// The request id of the sync machine's newest snapshot or range request: an ERROR answers it only with this id
    /// (an ERROR to an earlier try, or to a dispatch sent twice, says nothing about the store now).
    var lastSyncRequest: UInt64 = 0
    /// The daemon's trace contexts of dispatches whose events are not handed over yet (TRACE, when the process
    /// traces): each applied in a span that continues the daemon's.
    var traces: [(epoch: Epoch, seqs: ClosedRange<SequenceNumber>, context: [String: String])] = []
    /// When the next REPORT goes to the daemon and the metrics are brought up to date.
    var nextReport = ContinuousClock.now
    /// A snapshot arriving in parts: what came so far (docs/protocol.md, "SNAPSHOT in parts").
    var snapshotParts: SnapshotParts?
    /// Whether the sync machine's request out is a SNAPSHOT in parts.
    var partsAsked = false
    /// Snapshots are asked for whole: the daemon refused a part (a daemon older than parts) — for good — or the last
    /// snapshot put together from parts did not match its digest — for the next request only (the daemon checks a
    /// whole snapshot's digest as it reads it, not a part's).
    var wholeSnapshots = false
    var wholeSnapshotNext = false
    /// The state being installed came in parts.
    var installingParts = false

    /// The parts of a snapshot received so far.
    struct SnapshotParts {
        var epoch: Epoch
        var seq: SequenceNumber
        var digest: StateDigest
        var total: UInt64
        var bytes: [UInt8]
    }

    /// The replica's metrics, through the process's `MetricsSystem`.
    var metrics = MetricsMirror(factory: MetricsSystem.factory)

    init(replica: Replica<D>, sync: ReplicaSync) {
        self.replica = replica
        self.sync = sync
        inFlight = LazyPirate(
            LazyPirate.Settings(timeout: replica.configuration.requestTimeout, retries: replica.configuration.retries)
        )
        evidence = replica.configuration.evidenceDirectory.map {
            EvidenceRecorder(
                directory: $0,
                maximumFiles: replica.configuration.maximumEvidenceFiles,
                maximumBytes: replica.configuration.maximumEvidenceBytes
            )
        }
    }

    var store: StoreName { replica.store }
    var configuration: ReplicaConfiguration { replica.configuration }

    var status: ReplicaStatus {
        var status = ReplicaStatus()
        switch sync.phase {
        case _ where disconnected: status.phase = .disconnected
        case .joining: status.phase = .joining
        case .live: status.phase = .live
        case .repairing: status.phase = .repairing
        }
        status.epoch = sync.epoch
        status.lastSeq = sync.lastSeq
        status.daemonSeq = sync.daemonSeq
        status.resyncs = sync.resyncCount
        status.repairs = repairs
        status.divergences = divergences
        status.problem = problem
        return status
    }

    func nextDeadline(after now: ContinuousClock.Instant) -> ContinuousClock.Instant {
        var next = min(inFlight.nextDeadline ?? now + .seconds(1), syncResendAt ?? now + .seconds(1))
        if replica.ledgerHasPending.load(ordering: .acquiring),
            let pending = replica.ledger.withLockedValue({ $0.nextDeadline })
        {
            next = min(next, pending)
        }
        if configuration.reportInterval != nil { next = min(next, nextReport) }
        return retryLater.reduce(next) { min($0, $1.at) }
    }

    // MARK: Dispatches

    mutating func send(_ outbox: [Outgoing], on link: inout Link) throws {
        let now = ContinuousClock.now
        for outgoing in outbox {
            if let barrier = outgoing.barrier {
                let request = Request.status(requestID: outgoing.number)
                let dispatch = Dispatch(count: 0, outcome: outgoing.outcome, firstSent: now, barrier: barrier)
                try perform(inFlight.submit(request, dispatch, now: now), on: &link)
                continue
            }
            let request = Request.dispatch(
                DispatchRequest(
                    requestID: outgoing.number,
                    domainVersion: D.version,
                    clientID: replica.clientID,
                    store: store,
                    actions: outgoing.actions,
                    trace: outgoing.trace
                )
            )
            let dispatch = Dispatch(
                count: outgoing.actions.count,
                outcome: outgoing.outcome,
                optimistic: outgoing.optimistic ? outgoing.number : nil,
                firstSent: now
            )
            if outgoing.optimistic { optimisticInFlight.insert(outgoing.number) }
            try perform(inFlight.submit(request, dispatch, now: now), on: &link)
        }
    }

    /// Carries out what the Lazy Pirate machine asks for.
    mutating func perform(_ outputs: [LazyPirate<Dispatch>.Output], on link: inout Link) throws {
        var again: [(Request, Dispatch)] = []
        for output in outputs {
            switch output {
            case let .send(request):
                link.send(request)
                if optimisticInFlight.contains(request.requestID) { sentOptimistic(request.requestID) }
            case .renewSocket:
                try moveOn(.dispatchUnanswered, &link, now: .now)
            case let .gaveUp(request, dispatch, _)
            where dispatch.optimistic != nil && .now - dispatch.firstSent < configuration.pendingTimeout:
                // An optimistic dispatch stays pending through a daemon restart: sent again, with its key.
                again.append((request, dispatch))
            case let .gaveUp(_, dispatch, tries):
                guard let number = dispatch.optimistic else {
                    dispatch.outcome.fail(
                        ClientError(
                            code: .unavailable,
                            "no reply from \(configuration.daemonsPhrase) after \(tries) tries of "
                                + "\(configuration.requestTimeout) each; is the daemon running, and is the endpoint "
                                + "right?"
                        )
                    )
                    continue
                }
                optimisticInFlight.remove(number)
                replica.rolledBack(
                    number,
                    ClientError(
                        code: .unavailable,
                        "no reply from \(configuration.daemonsPhrase) for "
                            + "\(configuration.pendingTimeout) (ReplicaConfiguration.pendingTimeout): given up, its "
                            + "outcome unknown (the confirmed state holds it if the daemon applied it); is the daemon "
                            + "running?"
                    )
                )
            }
        }
        // After the outputs above, so on the renewed socket.
        let now = ContinuousClock.now
        for (request, dispatch) in again { try perform(inFlight.submit(request, dispatch, now: now), on: &link) }
    }

    /// Why requests move to another daemon's command socket.
    enum Move {
        /// A dispatch's try timed out (the Lazy Pirate machine sends what is in flight again itself).
        case dispatchUnanswered
        /// A snapshot or range request timed out (the sync machine sends it again itself).
        case syncUnanswered
        /// The daemon answered `not_leader`.
        case notLeader
    }

    /// Requests go to the next daemon (`LeaderSearch`) on a fresh socket, and what was out on the old one is sent
    /// again there; after a `not_leader` from every daemon that answers, after a pause.
    mutating func moveOn(_ move: Move, _ link: inout Link, now: ContinuousClock.Instant) throws {
        let from = link.search.endpoint
        let because =
            switch move {
            case .notLeader: "not the leader"
            case _ where link.search.currentIsStandingBy: "a standby, and a request's try ran out"
            default: "no answer in time"
            }
        var pause = Duration.zero
        if move == .notLeader {
            pause = link.search.notLeader()
        } else {
            link.search.timedOut()
        }
        try link.renewCommandSocket()
        if link.search.endpoint != from {
            replica.logger.notice(
                "sending to another daemon",
                metadata: [
                    "from": "\(from)", "to": "\(link.search.endpoint)",
                    "because": "\(because)",
                ]
            )
        }
        if move != .dispatchUnanswered { try perform(inFlight.redirect(now: now, pause: pause), on: &link) }
        guard move != .syncUnanswered else { return }
        if pause > .zero {
            syncResendAt = now + pause
        } else {
            try perform(sync.resendRequest(now: now), on: &link)
        }
    }

    /// Optimistic dispatch `number` went out (again): counted, and the first time, when.
    func sentOptimistic(_ number: UInt64) {
        replica.carryOut(replica.withLedger { [handed] in $0.sent(number, heard: handed) })
    }

    /// Optimistic dispatches the ledger gave up (``ReplicaConfiguration/pendingTimeout``): sent no more. What is
    /// still queued on the command socket for them is dropped with the socket, and the requests still in flight
    /// go out again on a fresh one.
    mutating func abandon(_ numbers: [UInt64], on link: inout Link) throws {
        guard !numbers.isEmpty else { return }
        for number in numbers {
            _ = inFlight.cancel(number)
            optimisticInFlight.remove(number)
        }
        retryLater.removeAll { numbers.contains($0.request.requestID) }
        try link.renewCommandSocket()
        try perform(inFlight.redirect(now: .now, pause: .zero), on: &link)
    }

    mutating func failAll(_ outbox: [Outgoing], _ error: ClientError) {
        for outgoing in outbox { outgoing.outcome.fail(error) }
        for (_, dispatch) in inFlight.removeAll() { dispatch.outcome.fail(error) }
        for (_, _, dispatch) in retryLater { dispatch.outcome.fail(error) }
        retryLater.removeAll()
        optimisticInFlight.removeAll()
    }

    /// Answers a dispatch: a rejection or refusal at once (an optimistic one rolled back), an acceptance once this
    /// replica applied it.
    mutating func complete(_ request: Request, _ flight: Dispatch, with reply: Reply) {
        if let deadline = flight.barrier { return wait(for: reply, until: deadline, flight.outcome) }
        if let number = flight.optimistic { optimisticInFlight.remove(number) }
        let error: any Error
        switch DispatchReply(reply, count: flight.count, store: store) {
        case let .accepted(epoch, seqs):
            let deadline = ContinuousClock.now + configuration.readYourWritesTimeout
            if let number = flight.optimistic {
                // Confirmed by the rebase onto a confirmed state that holds its seqs; that may be the one this
                // answer held up.
                replica.carryOut(
                    replica.withLedger { $0.accepted(number, epoch: epoch, seqs: seqs, confirmBy: deadline) }
                )
                return
            }
            let waiter = Waiter(epoch: epoch, seqs: seqs, deadline: deadline, outcome: flight.outcome)
            replica.shared.withLockedValue { $0.waiters.append(waiter) }
            // It may have been applied already (the event can overtake the reply).
            let current = replica.local.state
            if let applied = current.epoch, applied == epoch, current.seq >= seqs.upperBound {
                replica.applied(epoch: applied, seq: current.seq)
            }
            return
        case let .notNow(refusal):
            // Nothing was applied and a retry with the same key is safe: an optimistic dispatch is sent again after
            // a request's timeout; the caller of another may try again later.
            if let number = flight.optimistic {
                retryLater.append((.now + configuration.requestTimeout, request, flight))
                // Not in any history until it is sent again: it holds no rebase up meanwhile.
                replica.carryOut(replica.withLedger { $0.notTaken(number) })
                return
            }
            error = refusal
        case let .failed(failure):
            error = failure
        }
        if let number = flight.optimistic { replica.rolledBack(number, error) } else { flight.outcome.fail(error) }
    }

    /// A ``Replica/sync(timeout:)``: waits until `deadline` for the seq of the store the daemon's STATUS `reply`
    /// names.
    func wait(for reply: Reply, until deadline: ContinuousClock.Instant, _ outcome: DispatchOutcome) {
        guard let status = DaemonStatus(reply) else {
            return outcome.fail(
                ClientError(code: .protocolViolation, "the daemon answered a STATUS with \(reply), not its status")
            )
        }
        guard status.leads else {
            return outcome.fail(
                ClientError(
                    code: .unavailable,
                    "the daemon asked for the store's seq stands by (it is \(status.role.map { "\($0)" } ?? "?")), so "
                        + "its seq is not the store's; sync() again once a leader serves"
                )
            )
        }
        guard let seq = status.stores.first(where: { $0.name == store.rawValue })?.seq else {
            return outcome.fail(
                ClientError(
                    code: .refused,
                    "the daemon does not host '\(store)' (it hosts \(status.stores.map(\.name).joined(separator: ", ")))"
                )
            )
        }
        let timeout = deadline - .now
        replica.shared.withLockedValue {
            $0.waiters.append(
                Waiter(epoch: nil, seqs: seq...seq, deadline: deadline, outcome: outcome, barrier: timeout)
            )
        }
        let current = replica.local.state
        if let epoch = current.epoch, current.seq >= seq { replica.applied(epoch: epoch, seq: current.seq) }
    }

    // MARK: Inputs

    mutating func readEvents(from link: inout Link) throws {
        batching = true
        defer {
            batching = false
            handOver()
        }
        for _ in 0..<10_000 {
            guard let frames = link.events.take() else { return }
            let now = ContinuousClock.now
            disconnected = false
            let event: Event
            do {
                event = try Event.decode(frames)
            } catch {
                // A daemon of a later protocol would be refused here, by name, not followed blindly.
                replica.logger.warning(
                    "ignored an unreadable message on the events socket",
                    metadata: ["frames": "\(frames.count)", "error": "\(error)"]
                )
                continue
            }
            guard event.store == store else { continue }
            switch event {
            case let .events(_, epoch, firstSeq, actions, authors):
                try perform(
                    sync.events(epoch: epoch, firstSeq: firstSeq, actions: actions, authors: authors, now: now),
                    on: &link
                )
            case let .event(_, epoch, seq, action, author):
                try perform(sync.event(epoch: epoch, seq: seq, action: action, author: author, now: now), on: &link)
            case let .heartbeat(_, epoch, lastSeq):
                try perform(sync.heartbeat(epoch: epoch, lastSeq: lastSeq, now: now), on: &link)
            case let .digest(_, epoch, seq, digest):
                try perform(sync.digest(epoch: epoch, seq: seq, digest: digest, now: now), on: &link)
            case let .checkpoint(_, epoch, seq):
                try perform(sync.checkpoint(epoch: epoch, seq: seq, now: now), on: &link)
            case let .trace(_, epoch, firstSeq, lastSeq, context):
                // Bounded: contexts of events that never come (a resync) go, oldest first.
                if traces.count >= 1_000 { traces.removeFirst(traces.count - 999) }
                traces.append((epoch, firstSeq...lastSeq, context))
            }
        }
    }

    mutating func readReplies(from link: inout Link) throws {
        for _ in 0..<10_000 {
            guard let frames = try link.commands.receive(wait: false) else { return }
            let now = ContinuousClock.now
            let reply: Reply
            do {
                reply = try Reply.decode(frames)
            } catch {
                replica.logger.warning(
                    "ignored an unreadable reply",
                    metadata: ["endpoint": "\(link.search.endpoint)", "error": "\(error)"]
                )
                continue
            }
            if case let .error(_, error) = reply, error.code == .notLeader, link.search.endpoints.count > 1 {
                // A standby: nothing was applied; the request goes on at the next daemon that may lead.
                try moveOn(.notLeader, &link, now: now)
                continue
            }
            link.search.answered()
            if let (request, dispatch) = inFlight.answered(reply.requestID) {
                complete(request, dispatch, with: reply)
                continue
            }
            switch reply {
            case let .snapshot(requestID, snapshot) where snapshot.store == store && snapshot.part != nil:
                // Only the answer to the part asked for last: another is a resend's twin, or of an earlier join.
                guard requestID == lastSyncRequest else { break }
                problem = nil
                guard let whole = received(snapshot, on: &link, now: now), let part = snapshot.part else { break }
                installingParts = true
                defer { installingParts = false }
                try perform(
                    sync.snapshot(
                        epoch: snapshot.epoch,
                        seq: snapshot.seq,
                        digest: snapshot.digest,
                        state: whole,
                        now: now
                    ),
                    on: &link
                )
                // The snapshot may be older than the store: where the store stood, as a HEARTBEAT says it, so the
                // events between are asked for now, not at the next heartbeat.
                try perform(sync.heartbeat(epoch: snapshot.epoch, lastSeq: part.storeSeq, now: now), on: &link)
            case let .error(requestID, error)
            where error.code == .invalidRange && requestID == lastSyncRequest && snapshotParts != nil:
                // The daemon no longer keeps the snapshot the parts came from: from the first part of its newest.
                requestSnapshotPart(from: nil, on: &link)
            case let .error(requestID, error)
            where error.code == .malformed && requestID == lastSyncRequest && partsAsked:
                // A daemon older than parts: the state whole, from now on.
                replica.logger.notice(
                    "the daemon does not send snapshots in parts; asking for them whole",
                    metadata: ["store": "\(store)", "error": "\(error)"]
                )
                wholeSnapshots = true
                requestSnapshotPart(from: nil, on: &link)
            case let .snapshot(_, snapshot) where snapshot.store == store:
                snapshotParts = nil
                problem = nil
                try perform(
                    sync.snapshot(
                        epoch: snapshot.epoch,
                        seq: snapshot.seq,
                        digest: snapshot.digest,
                        state: snapshot.state,
                        now: now
                    ),
                    on: &link
                )
            case let .range(_, name, epoch, firstSeq, actions, authors) where name == store:
                try perform(
                    sync.range(epoch: epoch, firstSeq: firstSeq, actions: actions, authors: authors, now: now),
                    on: &link
                )
            case let .compacted(_, name, epoch, firstAvailable) where name == store:
                try perform(sync.compacted(epoch: epoch, firstAvailable: firstAvailable, now: now), on: &link)
            case let .error(requestID, error) where error.code == .invalidRange && requestID == lastSyncRequest:
                try perform(sync.rangeRefused(now: now), on: &link)
            case let .error(requestID, error) where requestID == lastSyncRequest:
                if problem == nil {
                    replica.logger.error(
                        "the daemon refused to serve the store",
                        metadata: ["store": "\(store)", "error": "\(error)"]
                    )
                }
                problem = "the daemon refused to serve '\(store)': \(error)"
            default:
                break  // the answer to a dispatch that already timed out, or to an older request (a resend's twin)
            }
        }
    }

    /// Resends what went unanswered, gives up on what ran out of tries, and lets the sync machine see time pass.
    mutating func tick(on link: inout Link) throws {
        let now = ContinuousClock.now
        try perform(inFlight.tick(now: now), on: &link)
        if let at = syncResendAt, at <= now {
            syncResendAt = nil
            try perform(sync.resendRequest(now: now), on: &link)
        }
        if retryLater.contains(where: { $0.at <= now }) {
            let due = retryLater.filter { $0.at <= now }
            retryLater.removeAll { $0.at <= now }
            for (_, request, dispatch) in due {
                if let number = dispatch.optimistic { optimisticInFlight.insert(number) }
                try perform(inFlight.submit(request, dispatch, now: now), on: &link)
            }
        }
        let late = replica.shared.withLockedValue { shared in
            var late: [Waiter] = []
            shared.waiters.removeAll { waiter in
                guard waiter.deadline <= now else { return false }
                late.append(waiter)
                return true
            }
            return late
        }
        func notApplied(_ seqs: ClosedRange<SequenceNumber>) -> ClientError {
            ClientError(
                code: .notApplied,
                "the daemon committed seqs \(seqs), but this replica has not applied them within "
                    + "\(configuration.readYourWritesTimeout) (it is \(status.phase) at seq \(sync.lastSeq))"
            )
        }
        for waiter in late {
            guard let timeout = waiter.barrier else {
                waiter.outcome.fail(notApplied(waiter.seqs))
                continue
            }
            waiter.outcome.fail(
                ClientError(
                    code: .notApplied,
                    "this replica has not reached seq \(waiter.seqs.upperBound) within \(timeout) (it is "
                        + "\(status.phase) at seq \(sync.lastSeq), the daemon's last word seq \(sync.daemonSeq)); did "
                        + "the daemon sequence it?"
                )
            )
        }
        try abandon(replica.carryOut(replica.withLedger { $0.tick(now: now) }), on: &link)
        try perform(sync.tick(now: now), on: &link)
        if let interval = configuration.reportInterval, now >= nextReport {
            nextReport = now + interval
            report(interval, on: link)
        }
    }

    /// Tells the daemon how far the local store has applied (it sends no reply), and brings the metrics up to date.
    mutating func report(_ interval: Duration, on link: Link) {
        let local = replica.local.state
        let status = self.status
        link.send(
            .report(
                requestID: 0,
                ReplicaProgress(
                    clientID: replica.clientID,
                    store: store,
                    name: replica.name,
                    epoch: local.epoch,
                    appliedSeq: local.seq,
                    interval: interval,
                    repairs: UInt64(status.repairs),
                    resyncs: UInt64(status.resyncs),
                    divergences: UInt64(status.divergences)
                )
            )
        )
        let dimensions = [("store", store.rawValue), ("client", String(replica.clientID.description.prefix(8)))]
        metrics.gauge("lockstep_client_applied_seq", dimensions, Double(local.seq))
        metrics.gauge(
            "lockstep_client_lag_events",
            dimensions,
            Double(status.daemonSeq &- min(status.daemonSeq, local.seq))
        )
        metrics.count("lockstep_client_repairs_total", dimensions, total: UInt64(status.repairs))
        metrics.count("lockstep_client_resyncs_total", dimensions, total: UInt64(status.resyncs))
        metrics.count("lockstep_client_divergences_total", dimensions, total: UInt64(status.divergences))
    }

    // MARK: Snapshots in parts

    /// Asks for the part of the snapshot that follows `parts` — or, with `nil`, for the first part of the daemon's
    /// newest (a daemon that sends the state whole answers that with all of it).
    mutating func requestSnapshotPart(from parts: SnapshotParts?, on link: inout Link) {
        snapshotParts = parts
        lastSyncRequest = replica.nextRequestID()
        partsAsked = !(wholeSnapshots || wholeSnapshotNext)
        guard partsAsked else {
            wholeSnapshotNext = false
            link.send(.snapshot(requestID: lastSyncRequest, store: store))
            return
        }
        let part = SnapshotPartRequest(
            seq: parts?.seq ?? 0,
            offset: UInt64(parts?.bytes.count ?? 0),
            maximumBytes: max(1, replica.configuration.snapshotPartBytes)
        )
        link.send(.snapshot(requestID: lastSyncRequest, store: store, part: part))
    }

    /// A part of a snapshot: kept, and the next asked for; the whole state once the last is here. A part out of step
    /// with those before (another snapshot's, or not where the last ended) starts again from the first.
    mutating func received(_ snapshot: SnapshotReply, on link: inout Link, now: ContinuousClock.Instant) -> [UInt8]? {
        guard let part = snapshot.part else { return nil }
        if part.offset == 0 {
            var bytes: [UInt8] = []
            bytes.reserveCapacity(Int(clamping: part.total))
            snapshotParts = SnapshotParts(
                epoch: snapshot.epoch,
                seq: snapshot.seq,
                digest: snapshot.digest,
                total: part.total,
                bytes: bytes
            )
        }
        // Taken out while it grows: a copy left behind would make the append copy the whole.
        guard var parts = snapshotParts.take(), parts.epoch == snapshot.epoch, parts.seq == snapshot.seq,
            parts.digest == snapshot.digest, parts.total == part.total, UInt64(parts.bytes.count) == part.offset
        else {
            requestSnapshotPart(from: nil, on: &link)
            return nil
        }
        parts.bytes.append(contentsOf: snapshot.state)
        if UInt64(parts.bytes.count) == parts.total { return parts.bytes }
        sync.snapshotPartArrived(now: now)
        requestSnapshotPart(from: parts, on: &link)
        return nil
    }

    // MARK: Outputs

    /// Does what the sync machine asked, in order. A check that fails hands the machine the mismatch and
    /// drops the rest: the machine has started over, so what followed is void.
    mutating func perform(_ outputs: [ReplicaSync.Output], on link: inout Link) throws {
        var unanswered = false
        for output in outputs {
            if case .apply = output {} else { handOver() }
            switch output {
            case .requestSnapshot:
                syncResendAt = nil
                // A part that did not come in time is asked for again, not the first: a slow link still gets through.
                requestSnapshotPart(from: unanswered ? snapshotParts : nil, on: &link)
            case let .requestRange(from, to):
                repairs += 1
                syncResendAt = nil
                lastSyncRequest = replica.nextRequestID()
                link.send(.range(requestID: lastSyncRequest, store: store, from: from, to: to))
            case let .install(epoch, seq, digest, bytes):
                guard StateDigest(of: bytes) == digest else {
                    // Parts are read from the daemon's file unchecked: the next snapshot whole, which it checks.
                    if installingParts { wholeSnapshotNext = true }
                    return try mismatch(seq, "the snapshot's bytes do not match its digest \(digest)", on: &link)
                }
                let state: D.State
                do {
                    state = try coder.decode(D.State.self, from: bytes)
                } catch {
                    let reason = CanonicalEncoding.describe(error)
                    return try mismatch(
                        seq,
                        "the snapshot is not a state of \(D.name) v\(D.version): \(reason)",
                        on: &link
                    )
                }
                replica.takeDigestSums(of: state, bytes: bytes.count)
                handed += 1
                digests.reset()
                replica.apply(
                    .install(Replicated(epoch: epoch, seq: seq, state: state)),
                    number: handed,
                    epoch: epoch,
                    seq: seq
                )
                evidence?.agree(epoch: epoch, seq: seq, state: bytes)
            case let .apply(events):
                guard let epoch = sync.epoch, let first = events.first, let last = events.last else { continue }
                evidence?.applied(events)
                if let pending = unapplied, pending.epoch != epoch || pending.lastSeq + 1 != first.seq { handOver() }
                var actions = unapplied?.actions ?? []
                var authors = unapplied?.authors ?? []
                actions.reserveCapacity(actions.count + events.count)
                for event in events {
                    if !event.author.isUnknown || !authors.isEmpty {
                        // Unknown until now: the earlier actions' authors are filled in as such.
                        if authors.count < actions.count {
                            authors += Array(repeating: .unknown, count: actions.count - authors.count)
                        }
                        authors.append(event.author)
                    }
                    do {
                        actions.append(try coder.decode(D.Action.self, from: event.action))
                    } catch {
                        let reason = CanonicalEncoding.describe(error)
                        return try mismatch(
                            event.seq,
                            "the action is not an action of \(D.name) v\(D.version) (\(reason)); does the daemon run "
                                + "another version of the domain?",
                            on: &link
                        )
                    }
                }
                unapplied = (epoch, unapplied?.firstSeq ?? first.seq, last.seq, actions, authors)
                if !batching { handOver() }
            case let .verifyDigest(seq, digest):
                // In order: the daemon took it on its loop, so its digest form is small — compared here, at once,
                // as the daemon did, unless this replica's was large when last written (a state just installed from
                // a large snapshot, whose `DigestedDictionary` sums the digest thread is taking). The events read
                // with it go to the local store first (it applies them on this thread when idle); a state it has not
                // reached yet (another thread drains it) is compared off this thread once it has.
                handOver()
                let current = replica.local.state
                if current.seq == seq, current.epoch == sync.epoch, replica.digestFormIsSmall,
                    let form = try? CanonicalEncoding.digestForm(of: current.state),
                    // Evidence keeps the canonical state: for a condensed one, written on the digest thread.
                    evidence == nil || form.isCanonicalForm
                {
                    let verdict = DigestChecks.Verdict.compare(
                        daemon: digest,
                        mine: form.digest,
                        at: seq,
                        state: evidence == nil ? nil : form.bytes
                    )
                    if try judge(verdict, on: &link) { return }
                    continue
                }
                keepDigest(at: seq)
                if let verdict = digests.daemonSaid(digest, at: seq), try judge(verdict, on: &link) { return }
            case let .keepDigest(seq):
                keepDigest(at: seq)
            case let .verifyKeptDigest(seq, digest):
                if let verdict = digests.daemonSaid(digest, at: seq), try judge(verdict, on: &link) { return }
            case let .reportDivergence(seq):
                divergences += 1
                let detail = divergenceDetail ?? "the state differs from the daemon's"
                divergenceDetail = nil
                replica.logger.error(
                    "diverged from the daemon; resyncing",
                    metadata: ["store": "\(store)", "seq": "\(seq)", "detail": "\(detail)"]
                )
                replica.notify(.diverged(seq: seq, detail: detail))
            case let .resync(reason):
                digests.reset()
                replica.logger.warning("replica resyncs", metadata: ["store": "\(store)", "reason": "\(reason)"])
                replica.notify(.resynced(reason))
            case let .silent(duration):
                disconnected = true
                replica.logger.warning(
                    "no word from the daemon; keeping the state and asking after it",
                    metadata: ["store": "\(store)", "silent": "\(duration)", "seq": "\(sync.lastSeq)"]
                )
            case .requestUnanswered:
                unanswered = true
                // With one daemon the request goes out again on the same socket, where a slow reply still lands.
                if link.search.endpoints.count > 1 { try moveOn(.syncUnanswered, &link, now: .now) }
            }
        }
    }

    /// Asks for the digest of the local state at `seq` (the replica's seq now: every action before it is handed over).
    mutating func keepDigest(at seq: SequenceNumber) {
        guard let epoch = sync.epoch, digests.keep(seq) else { return }
        replica.wantDigest(DigestWanted(epoch: epoch, seq: seq, generation: digests.generation))
    }

    /// The digests the digest thread took: each checked against the daemon's once both are known.
    mutating func checkDigests(_ taken: [DigestTaken], on link: inout Link) throws {
        for taken in taken {
            guard let digest = taken.digest else {
                replica.logger.error(
                    "could not encode the local state to check its digest",
                    metadata: ["store": "\(store)", "seq": "\(taken.seq)"]
                )
                continue
            }
            let verdict = digests.computed(digest, state: taken.state, at: taken.seq, generation: taken.generation)
            if let verdict, try judge(verdict, on: &link) { return }
        }
    }

    /// Carries out a digest check's verdict: an agreement is the evidence's new starting point; a difference is a
    /// divergence, with its evidence written when the replica keeps some: `true` then (the replica started over, and
    /// what followed is void).
    mutating func judge(_ verdict: DigestChecks.Verdict, on link: inout Link) throws -> Bool {
        switch verdict {
        case let .agree(seq, state):
            if let epoch = sync.epoch, let state { evidence?.agree(epoch: epoch, seq: seq, state: state) }
            return false
        case let .differ(seq, digest, mine, state):
            var location = ""
            do {
                if let state,
                    let file = try evidence?.write(
                        store: store.rawValue,
                        domainVersion: D.version,
                        seq: seq,
                        daemonDigest: digest,
                        replicaState: state,
                        replicaDigest: mine
                    )
                {
                    location = "; evidence in \(file.path)"
                    replica.logger.error(
                        "wrote the evidence of a divergence",
                        metadata: ["store": "\(store)", "seq": "\(seq)", "file": "\(file.path)"]
                    )
                }
            } catch {
                replica.logger.error(
                    "could not write the evidence of a divergence",
                    metadata: [
                        "store": "\(store)", "directory": "\(evidence?.directory ?? "")", "error": "\(error)",
                    ]
                )
            }
            try mismatch(seq, "the daemon's digest is \(digest), this replica's is \(mine)\(location)", on: &link)
            return true
        }
    }

    /// Gives the local store the actions read so far, as one change.
    mutating func handOver() {
        guard let pending = unapplied else { return }
        unapplied = nil
        handed += 1
        let spans = applySpans(pending.epoch, pending.firstSeq...pending.lastSeq)
        replica.apply(
            .apply(firstSeq: pending.firstSeq, pending.actions, authors: pending.authors),
            number: handed,
            epoch: pending.epoch,
            seq: pending.lastSeq
        )
        for span in spans { span.end() }
    }

    /// A span `lockstep.apply` for each traced dispatch among `seqs`, continuing the daemon's span (whose context its
    /// TRACE carried); the contexts of seqs handed over go.
    mutating func applySpans(_ epoch: Epoch, _ seqs: ClosedRange<SequenceNumber>) -> [any Span] {
        guard !traces.isEmpty else { return [] }
        let spans = traces.filter { $0.epoch == epoch && $0.seqs.overlaps(seqs) }.map { trace -> any Span in
            var context = ServiceContext.topLevel
            InstrumentationSystem.instrument.extract(trace.context, into: &context, using: TraceFields())
            let span = InstrumentationSystem.tracer.startSpan("lockstep.apply", context: context, ofKind: .consumer)
            span.attributes["lockstep.store"] = store.rawValue
            span.attributes["lockstep.seq.first"] = Int(clamping: trace.seqs.lowerBound)
            span.attributes["lockstep.seq.last"] = Int(clamping: trace.seqs.upperBound)
            return span
        }
        traces.removeAll { $0.epoch != epoch || $0.seqs.upperBound <= seqs.upperBound }
        return spans
    }

    private mutating func mismatch(_ seq: SequenceNumber, _ detail: String, on link: inout Link) throws {
        divergenceDetail = detail
        try perform(sync.digestMismatch(at: seq, now: .now), on: &link)
    }
}
