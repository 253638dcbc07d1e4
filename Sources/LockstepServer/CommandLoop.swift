import CoreMetrics
import Foundation
import Lockstep
import LockstepJournal
import LockstepProtocol
import Logging
import Synchronization
import ZeroMQ

/// The daemon's one loop, on one thread that owns every socket (``LoopThread``): each turn drains the command
/// socket and, while the daemon leads, runs every request through the ``Sequencer`` into the ``CommitPipeline``,
/// which commits each group to the journal once before it is answered and published; while it stands by, it
/// answers STATUS and refuses the rest `not_leader`. ``Leadership`` decides which. Nothing is acknowledged or
/// published before it is durable.
///
/// This class holds what the loop shares with other threads: its settings, its wake-up pipe, the stop flag, and the
/// replies reader threads make for SNAPSHOT and RANGE.
final class CommandLoop: Sendable {
    let configuration: DaemonConfiguration
    let domains: [HostedDomain]
    let logger: Logger
    let notifier: SystemdNotifier
    let wakeup: Wakeup
    let failpoint: Failpoint?
    /// Runs the hosted domains' effects while the daemon leads.
    let effects: EffectRunner
    private let stopping = Atomic<Bool>(false)
    /// When the daemon started: its uptime in STATUS, whatever its role.
    let startedAt = ContinuousClock.now
    /// Replies finished by readers off the loop, waiting for the loop to send them.
    private let outbox = LockedValue<(replies: [(envelope: [Frame], reply: Reply)], inFlight: Int)>(([], 0))
    private let readers = DispatchQueue(label: "lockstepd.readers", attributes: .concurrent)
    /// Checkpoints of large states, one at a time, and what they came to, waiting for the loop.
    private let checkpointThread = BackgroundThread(name: "lockstepd checkp")
    private let checkpoints = LockedValue<[Checkpoints.Taken]>([])
    /// Where the metrics go (docs/operations.md, "Metrics").
    let metricsFactory: any MetricsFactory
    /// The commit and fsync timings, recorded on the thread that commits.
    let journalTimings: DaemonMetrics.JournalTimings
    /// Where the HTTP listener listens, once it does: for STATUS.
    let httpAddress = LockedValue<String?>(nil)
    /// What the loop tells the inspector, when it is served (``DaemonConfiguration/servesInspector``).
    let inspectorFeed: InspectorFeed?
    /// The in-memory or log journal, for the inspector to read in place: the one holds no file to open a reader on,
    /// the other answers every read from memory beside its commits.
    private let sharedJournal = LockedValue<(any Journal)?>(nil)

    init(
        configuration: DaemonConfiguration,
        domains: [HostedDomain],
        notifier: SystemdNotifier,
        failpoint: Failpoint? = nil,
        effectHandlers: [EffectHandler] = [],
        metrics: any MetricsFactory = MetricsSystem.factory,
        logger: Logger
    ) throws(ServerError) {
        // The journal is chosen once, at start: the one the data directory holds, or the default in a new one.
        var configuration = configuration
        configuration.journal = configuration.journalToOpen
        self.configuration = configuration
        self.domains = domains
        self.notifier = notifier
        self.failpoint = failpoint
        self.logger = logger
        metricsFactory = metrics
        inspectorFeed = configuration.servesInspector ? InspectorFeed() : nil
        journalTimings = DaemonMetrics.timings(factory: metrics, journalKind: configuration.journalToOpen.rawValue)
        do {
            wakeup = try Wakeup()
        } catch {
            throw ServerError(code: .system, "could not make the loop's wake-up pipe: \(error)")
        }
        effects = EffectRunner(
            handlers: effectHandlers,
            dataDirectory: configuration.dataDirectory,
            threads: configuration.effects.concurrency,
            wakeup: wakeup,
            logger: logger
        )
    }

    /// Asks the loop to finish its turn and stop; callable from any thread.
    func stop() {
        stopping.store(true, ordering: .releasing)
        wakeup.signal()
    }

    /// SNAPSHOT and RANGE requests being answered at once; more are refused, so a flood of them cannot pile
    /// up threads and copies of states.
    static let maximumOffloaded = 64

    /// Runs `work` on a reader thread — encoding a large state or reading the journal must not hold the
    /// loop — and hands the reply back to the loop, which alone may touch the socket (and counts an ERROR as
    /// every other). Returns false, doing nothing, when ``maximumOffloaded`` are already being answered.
    func offload(_ envelope: [Frame], _ work: @escaping @Sendable () -> Reply) -> Bool {
        let accepted = outbox.withLockedValue { outbox in
            guard outbox.inFlight < Self.maximumOffloaded else { return false }
            outbox.inFlight += 1
            return true
        }
        guard accepted else { return false }
        readers.async { [self] in
            let reply = work()
            outbox.withLockedValue {
                $0.replies.append((envelope, reply))
                $0.inFlight -= 1
            }
            wakeup.signal()
        }
        return true
    }

    /// Does `plan`'s work on `store` — a value the loop no longer changes — on the checkpoint thread, the state
    /// streamed (``Checkpoints/Work/init(_:streaming:stagingIn:)``: the log journal's snapshot file is written as the
    /// state is encoded; another journal's snapshot is the canonical bytes, staged), and hands the result to the loop
    /// (``checkpointsTaken()``).
    func takeCheckpoint(
        of store: any SequencedStore,
        plan: Checkpoints.Plan,
        generation: UInt64,
        journal: any Journal
    ) {
        checkpointThread.submit { [self] in
            let start = ContinuousClock.now
            var taken = Checkpoints.Taken(
                store: store.name,
                epoch: store.epoch,
                seq: store.lastSeq,
                cost: .zero,
                generation: generation
            )
            do {
                let work = try Checkpoints.Work(plan, streaming: store, stagingIn: journal)
                if let snapshot = work.snapshot, snapshot.stagedBytes == nil { journal.stage(snapshot) }
                taken.work = work
            } catch {
                taken.failure = "\(error)"
            }
            taken.cost = ContinuousClock.now - start
            checkpoints.withLockedValue { $0.append(taken) }
            wakeup.signal()
        }
    }

    /// The checkpoints the checkpoint thread finished since the last call.
    func checkpointsTaken() -> [Checkpoints.Taken] {
        checkpoints.withLockedValue { taken in
            defer { taken.removeAll() }
            return taken
        }
    }

    /// SNAPSHOT and RANGE requests a reader thread is answering now.
    var offloadedInFlight: Int { outbox.withLockedValue { $0.inFlight } }

    /// Replies ready to send, and how many are still being made.
    func takeReplies() -> (replies: [(envelope: [Frame], reply: Reply)], inFlight: Int) {
        outbox.withLockedValue { outbox in
            defer { outbox.replies.removeAll() }
            return outbox
        }
    }

    /// Makes SIGHUP wake the loop to read the allowed CURVE clients again.
    func installHangupHandler() {
        HangupSignal.install(wakeDescriptor: wakeup.writeDescriptor)
    }

    /// Whether ``stop()`` was called.
    var isStopping: Bool { stopping.load(ordering: .acquiring) }

    /// Recovers, binds, tells systemd it is ready, and serves until ``stop()``. Runs on its own thread.
    ///
    /// On a PostgreSQL journal it leads only while it holds the journal's lease (``Leadership``): without it, it
    /// binds, tells systemd it is ready as a standby, answers STATUS, refuses every other request `not_leader`, and
    /// tries to take the lease every third of its duration (sooner when the holder's expires sooner). Once it holds
    /// the lease it recovers every store and serves; a commit or renewal that another daemon's lease refused makes it
    /// stand by again.
    func run() throws {
        let journal = try openJournal()
        defer { try? journal.close() }
        if configuration.journalToOpen == .memory || configuration.journalToOpen == .log {
            sharedJournal.withLockedValue { $0 = journal }
        }
        let writer = JournalWriter(wakeup: wakeup)
        defer { writer.stop() }
        var thread = try LoopThread(loop: self, journal: journal, writer: writer)
        defer { thread.sockets.close() }
        defer { effects.stop() }
        defer { checkpointThread.stop() }
        try thread.start()
        while !isStopping { try thread.turn() }
        try thread.finish()
    }

    /// The stores as the journal proves them, and its outbox: on the loop's thread at start, on the journal writer's
    /// after a takeover.
    func recoverStores(_ journal: any Journal) throws -> Recovered {
        Recovered(
            sequencer: try Serving.recover(domains, journal: journal, logger: logger),
            outbox: try journal.outbox()
        )
    }

    /// What a leadership starts from: the stores, and the effects and timers the journal holds.
    struct Recovered: Sendable {
        var sequencer: Sequencer
        var outbox: JournalOutbox
    }

    /// The STATUS fields every role shares: uptime, journal, refusals, the settings a client needs.
    func status(
        role: DaemonStatus.Role,
        stores: [DaemonStatus.Store],
        sockets: LoopSockets,
        journal: any Journal
    ) -> DaemonStatus {
        // Only the file sizes: journal.stats() counts every event, which takes tens of ms on a long history
        // and would hold the loop.
        let bytes = Self.journalBytes(journal)
        return DaemonStatus(
            uptimeSeconds: (ContinuousClock.now - startedAt).components.seconds,
            role: role,
            journal: journal.location,
            journalBytes: bytes,
            stores: stores,
            refused: sockets.refusals,
            heartbeatMs: Int64(configuration.heartbeatInterval / .milliseconds(1)),
            digestEveryEvents: configuration.digestEveryEvents,
            maximumBatch: configuration.maximumBatch,
            maximumActionBytes: configuration.maximumMessageBytes,
            http: httpAddress.withLockedValue { $0 }
        )
    }

    /// A local journal's files, in bytes: SQLite's file and its write-ahead log, or the log and its snapshots;
    /// `nil` for the others.
    static func journalBytes(_ journal: any Journal) -> Int64? {
        if let log = journal as? LogJournal { return log.fileBytes }
        guard journal is SQLiteJournal else { return nil }
        return [journal.location, journal.location + "-wal"].reduce(0) { total, file in
            let size = (try? FileManager.default.attributesOfItem(atPath: file)[.size] as? NSNumber)?.int64Value
            return total + (size ?? 0)
        }
    }

    /// A journal to read beside the loop's (the inspector's): the same file or database opened read-only, so its
    /// reads never wait for the loop's commits.
    func openReader() throws -> any Journal {
        switch configuration.journalToOpen {
        case .memory, .log:
            guard let journal = sharedJournal.withLockedValue({ $0 }) else {
                throw ServerError(code: .journal, "the \(configuration.journalToOpen.rawValue) journal is not open yet")
            }
            return journal
        case .postgres:
            return try PostgresJournal(
                connection: configuration.postgresConnection ?? "",
                readOnly: true,
                lease: PostgresLease(holder: "inspector", duration: configuration.leaseDuration),
                takeLease: false
            )
        case .sqlite:
            return try SQLiteJournal(directory: configuration.dataDirectory, readOnly: true)
        }
    }

    private func openJournal() throws -> any Journal {
        switch configuration.journalToOpen {
        case .memory:
            return InMemoryJournal(policy: configuration.snapshots)
        case .postgres:
            var lease = PostgresLease(
                holder: configuration.leaseHolder ?? PostgresLease.defaultHolder(),
                duration: configuration.leaseDuration
            )
            #if LOCKSTEP_FAILPOINTS
            if failpoint?.point == .unfenced {
                logger.critical(
                    "LOCKSTEP_FAILPOINT=unfenced: commits and renewals check no lease; two daemons may lead"
                )
                lease.unfencedForTesting = true
            }
            #endif
            do {
                return try PostgresJournal(
                    connection: configuration.postgresConnection ?? "",
                    policy: configuration.snapshots,
                    lease: lease,
                    takeLease: false
                )
            } catch {
                throw ServerError(code: .journal, "cannot open the PostgreSQL journal: \(error)")
            }
        case .sqlite, .log:
            let directory = configuration.dataDirectory
            let policy = configuration.snapshots
            let log = configuration.journalToOpen == .log
            do {
                #if LOCKSTEP_FAILPOINTS
                if failpoint?.point == .noSync {
                    logger.critical("LOCKSTEP_FAILPOINT=no-sync: the journal never fsyncs; a power cut loses data")
                    return log
                        ? try LogJournal(unsyncedForTestingIn: directory, policy: policy)
                        : try SQLiteJournal(unsyncedForTestingIn: directory, policy: policy)
                }
                #endif
                return log
                    ? try LogJournal(directory: directory, policy: policy)
                    : try SQLiteJournal(
                        directory: directory,
                        policy: policy,
                        relaxed: configuration.durability == .relaxed
                    )
            } catch {
                throw ServerError(code: .journal, "cannot open the journal in \(configuration.dataDirectory): \(error)")
            }
        }
    }
}

/// What the loop's thread owns: the journal, the sockets, ``Leadership``, and while the daemon leads, ``Serving``.
/// Each turn waits for a request, the writer, a reader or the next deadline, and carries out what the values decide.
struct LoopThread {
    let loop: CommandLoop
    let journal: any Journal
    let writer: JournalWriter
    /// The sockets, which outlive each leadership.
    var sockets: LoopSockets
    var leadership: Leadership
    /// The leader's state; `nil` while the daemon stands by or recovers.
    var serving: Serving?
    /// The stores a takeover's recovery made on the writer's thread, until ``Leadership`` says to lead with them.
    var recovered: (recovered: CommandLoop.Recovered, fencedAt: ContinuousClock.Instant)?
    var lastWatchdog = ContinuousClock.now
    let limits: Limits
    /// The metrics, brought up to date with the loop's tallies once a second (``recordMetrics()``).
    var metrics: MetricsMirror
    var nextMetrics = ContinuousClock.now
    /// Leaderships begun by taking the PostgreSQL journal's lease (each a new term).
    var takeovers: UInt64 = 0

    var logger: Logger { loop.logger }
    var configuration: DaemonConfiguration { loop.configuration }
    /// The journal's lease, when it has one.
    var leased: PostgresJournal? { journal as? PostgresJournal }
    /// This daemon's name in the lease.
    var holder: String { leased?.lease.holder ?? "" }

    init(loop: CommandLoop, journal: any Journal, writer: JournalWriter) throws {
        self.loop = loop
        self.journal = journal
        self.writer = writer
        sockets = try LoopSockets(loop: loop)
        metrics = MetricsMirror(factory: loop.metricsFactory)
        leadership = .unleased
        limits = Limits(
            maximumBatch: loop.configuration.maximumBatch,
            maximumActionBytes: loop.configuration.maximumMessageBytes
        )
    }

    /// The first attempt at the lease, before anything is bound: a daemon that leads at once recovers before it
    /// binds, so READY=1 means serving; one that stands by binds and answers as a standby.
    mutating func start() throws {
        if let leased {
            let outcome: LeaseOutcome
            do {
                outcome = try leased.acquireLease()
            } catch {
                throw ServerError(code: .journal, "cannot take or read the PostgreSQL journal's lease: \(error)")
            }
            leadership = Leadership(leaseDuration: leased.lease.duration, startedWith: outcome, now: .now)
            if case let .leading(takeover?) = leadership.role {
                // Renewed before recovery: the fence waits for a commit of the previous leader still in flight
                // (its row lock), so recovery reads everything that leader made durable.
                let fencedAt = ContinuousClock.now
                do throws(JournalError) {
                    try leased.renewLease()
                } catch {
                    logger.error(
                        "no longer the leader: the lease, just taken, could not be renewed; standing by",
                        metadata: ["error": "\(error)", "name": "\(holder)"]
                    )
                    _ = leadership.lost(stillHeld: nil, holder: holder, now: .now)
                }
                if leadership.isLeading {
                    let lease = Serving.Pipeline.Lease(
                        duration: leased.lease.duration,
                        term: takeover.term,
                        fencedAt: fencedAt
                    )
                    serve(try loop.recoverStores(journal), lease: lease, takeover: takeover)
                }
            }
        } else {
            serve(try loop.recoverStores(journal), lease: nil, takeover: nil)
        }
        try sockets.bind()
        if let serving { serving.announceReady() } else { announce() }
    }

    /// Becomes the leader over what recovery proved.
    mutating func serve(
        _ recovered: CommandLoop.Recovered,
        lease: Serving.Pipeline.Lease?,
        takeover: Leadership.Takeover?
    ) {
        if takeover != nil { takeovers += 1 }
        serving = Serving(
            loop: loop,
            journal: journal,
            recovered: recovered,
            lease: lease,
            takeover: takeover,
            sockets: sockets
        )
    }

    /// One turn: wait for requests, the writer, a reader or the next deadline; take what the writer finished;
    /// answer or sequence every waiting request; let the leader commit, or a standby try for the lease.
    mutating func turn() throws {
        let accepting = serving?.pipeline.accepting ?? true
        var items: [Poller.Item] = [.fileDescriptor(loop.wakeup.descriptor, .readable)]
        if accepting { items.append(.socket(sockets.router, .readable)) }
        if let zap = sockets.zap { items.append(.socket(zap, .readable)) }
        let ready = try Poller(items).poll(timeout: nextDeadline() - ContinuousClock.now)
        if ready[0].contains(.readable) { loop.wakeup.drain() }
        if let completion = writer.takeResult() { try completed(completion) }
        for (envelope, reply) in loop.takeReplies().replies { sockets.send(reply, to: envelope) }
        try sockets.serveAuthentication()
        var received = 0
        while accepting, received < 1_024,
            let message = try sockets.router.receive(
                wait: false,
                maximumFrames: configuration.maximumBatch + 4,
                userID: sockets.access != nil
            )
        {
            let frames = message.frames
            // [identity, empty, body…] from REQ and from DEALERs that follow docs/protocol.md.
            let split = frames.count >= 2 && frames[1].isEmpty ? 2 : 1
            let envelope = Array(frames.prefix(split))
            received += 1
            let request = readRequest(Array(frames.dropFirst(split)), message.droppedFrames, limits, logger)
            var author = Author.unknown
            var grant = AccessPolicy.ActionGrant.every
            if sockets.access != nil, case let .success(decoded) = request {
                switch sockets.admit(decoded, userID: message.userID) {
                case let .admitted(identity, actions):
                    (author, grant) = (identity, actions)
                case let .refused(reply):
                    sockets.send(reply, to: envelope)
                    continue
                }
            }
            if case let .success(.report(requestID, report)) = request {
                // No reply (docs/protocol.md); a standby has no stores to measure a replica against.
                if let refusal = serving?.heard(report, requestID: requestID, now: .now) {
                    sockets.send(refusal, to: envelope)
                }
                continue
            }
            if serving != nil {
                serving!.sequence(request, envelope: envelope, author: author, grant: grant)
            } else {
                sockets.send(answerStandingBy(request), to: envelope)
            }
        }
        if serving != nil {
            do {
                serving!.takeCheckpoints(&sockets)
                serving!.takeDeferredCheckpoints(sockets)
                serving!.runEffects()
                try serving!.advance(&sockets, writer)
                serving!.publishHeartbeats(&sockets)
            } catch {
                try stepDownOrStop(error)
            }
        } else {
            // Subscriptions made now are sent once: kept for the next leadership.
            _ = sockets.readSubscriptions()
            try perform(leadership.tick(now: .now))
        }
        if let interval = loop.notifier.watchdogInterval, ContinuousClock.now - lastWatchdog >= interval {
            loop.notifier.notify("WATCHDOG=1")
            lastWatchdog = ContinuousClock.now
        }
        if ContinuousClock.now >= nextMetrics { recordMetrics() }
    }

    func nextDeadline() -> ContinuousClock.Instant {
        let now = ContinuousClock.now
        var deadline =
            serving?.nextDeadline()
            ?? leadership.nextDeadline
            ?? now + .seconds(1)
        if let interval = loop.notifier.watchdogInterval { deadline = min(deadline, lastWatchdog + interval) }
        return max(min(deadline, nextMetrics), now)
    }

    /// The writer finished work for the leader's pipeline or for the leadership.
    mutating func completed(_ completion: JournalWriter.Completion) throws {
        switch completion {
        case let .commit(result):
            guard serving != nil else { return }
            do {
                try serving!.completed(result, &sockets, writer)
            } catch {
                try stepDownOrStop(error)
            }
        case let .leaseAttempt(result):
            try perform(leadership.attempted(result, now: .now))
        case let .recovery(result):
            recovered = try? result.get()
            try perform(leadership.recovered(result.map { _ in () }, now: .now))
        }
    }

    /// The leadership ended: stand by on a PostgreSQL journal; stop on a local one, which has no other way on.
    mutating func stepDownOrStop(_ ended: Serving.SteppedDown) throws {
        guard leased != nil else { throw ServerError(code: .journal, ended.reason) }
        stepDown(ended)
    }

    /// Logs why the leader steps down, and stands by.
    mutating func stepDown(_ ended: Serving.SteppedDown) {
        if ended.stillHeld != nil {
            logger.error(
                "recovering the stores on the journal's thread; answering 'not_leader' meanwhile",
                metadata: ["reason": "\(ended.reason)", "name": "\(holder)"]
            )
        } else {
            logger.error(
                "no longer the leader: stopped serving, refused what was in flight (none of it applied), standing by",
                metadata: ["reason": "\(ended.reason)", "name": "\(holder)"]
            )
        }
        // What this leadership tallied, before its tallies go.
        recordMetrics()
        serving = nil
        // A daemon that leads no more starts nothing, and what it runs is cancelled: the next leader runs it again.
        loop.effects.cancelAll()
        // `perform` throws only for what a leader does; a standby's actions never do.
        try? perform(leadership.lost(stillHeld: ended.stillHeld, holder: holder, now: .now))
    }

    /// Carries out what ``Leadership`` decided.
    mutating func perform(_ actions: [Leadership.Action]) throws {
        guard let leased else { return }
        for action in actions {
            switch action {
            case .attemptLease:
                writer.submit {
                    do throws(JournalError) {
                        return .leaseAttempt(.success(try leased.acquireLease()))
                    } catch {
                        return .leaseAttempt(.failure(Leadership.Failure("\(error)")))
                    }
                }
            case .recover:
                let loop = self.loop
                writer.submit {
                    let sent = ContinuousClock.now
                    do {
                        // The fence first: it waits for a commit of the previous leader in flight, so recovery reads
                        // all it made durable.
                        try leased.renewLease()
                        return .recovery(.success((try loop.recoverStores(leased), sent)))
                    } catch {
                        // Another daemon may recover where this one cannot (a newer build, a reachable database).
                        try? leased.releaseLease()
                        return .recovery(.failure(Leadership.Failure("\(error)")))
                    }
                }
            case let .lead(takeover):
                guard let (recovered, fencedAt) = self.recovered else { continue }
                self.recovered = nil
                let lease = Serving.Pipeline.Lease(
                    duration: leased.lease.duration,
                    term: takeover.term,
                    fencedAt: fencedAt
                )
                serve(recovered, lease: lease, takeover: takeover)
                serving?.announceReady()
            case .announce:
                announce()
            case let .attemptFailed(reason):
                logger.warning("standing by: could not try to take the lease", metadata: ["error": "\(reason)"])
            case let .recoveryFailed(reason):
                logger.error(
                    "could not recover after taking the lease: let it go, standing by to try again",
                    metadata: ["error": "\(reason)", "name": "\(holder)"]
                )
            }
        }
    }

    /// Tells systemd and the log where a daemon that does not serve stands.
    func announce() {
        if case let .recovering(takeover) = leadership.role {
            logger.notice(
                "recovering the stores before serving",
                metadata: ["name": "\(holder)", "term": "\(takeover.term)"]
            )
            loop.notifier.notify("READY=1\nSTATUS=standby, recovering the stores to lead (term \(takeover.term))")
            return
        }
        let leader = leadership.leader
        let who = leader.map { "leader \($0.holder) term \($0.term)" } ?? "leader unknown"
        logger.notice(
            "standing by: another daemon leads the journal",
            metadata: [
                "name": "\(holder)", "leader": "\(leader?.holder ?? "unknown")",
                "term": "\(leader?.term ?? 0)", "expiresAt": "\(leader?.expiresAt ?? "")",
            ]
        )
        loop.notifier.notify("READY=1\nSTATUS=standby, \(who)")
    }

    /// The daemon's STATUS as it stands: the leader's, or a standby's.
    var status: DaemonStatus { serving?.status(sockets) ?? standbyStatus }

    /// A standby's STATUS: its name and the leader's, no stores.
    var standbyStatus: DaemonStatus {
        var status = loop.status(role: .standby, stores: [], sockets: sockets, journal: journal)
        status.name = holder
        status.journalBytes = nil
        status.leader = leadership.leader.map {
            DaemonStatus.Leader(name: $0.holder, term: $0.term, expiresAt: $0.expiresAt)
        }
        return status
    }

    /// A standby's answer to one request: STATUS, or `not_leader`, or the error that reading it found.
    func answerStandingBy(_ request: Result<Request, RefusedRequest>) -> Reply {
        switch request {
        case let .failure(refusal):
            return refusal.reply
        case let .success(.status(requestID)):
            return standbyStatus.reply(to: requestID)
        case let .success(request):
            return Replies.standingBy(request.requestID, leadership.refusal(holder: holder))
        }
    }

    /// The turns before the daemon stops: the leader answers everything sequenced (waiting for the writer) and
    /// syncs the journal; a standby waits for an attempt or recovery in flight, whose lease the journal's close lets
    /// go.
    mutating func finish() throws {
        if serving != nil {
            do {
                try serving!.finish(&sockets, writer)
            } catch {
                try stepDownOrStop(error)
            }
        }
        guard serving != nil else {
            if leadership.isWaitingForWriter { _ = writer.waitForResult() }
            loop.notifier.notify("STOPPING=1")
            logger.info("daemon stopping (standing by, nothing to commit)")
            return
        }
        // Replies being made off the loop go out before the sockets close (bounded: a stuck reader is left).
        let deadline = ContinuousClock.now + .seconds(2)
        while ContinuousClock.now < deadline {
            let (replies, inFlight) = loop.takeReplies()
            for (envelope, reply) in replies { sockets.send(reply, to: envelope) }
            if inFlight == 0 { break }
            Thread.sleep(forTimeInterval: 0.001)
        }
        loop.notifier.notify("STOPPING=1")
        try journal.sync()
        logger.info("daemon stopping: the last batch is committed, replied to and published")
    }
}

/// A request that could not be read: the ERROR reply that says why.
struct RefusedRequest: Error {
    let reply: Reply
}

/// `body` read as a request, or the ERROR that says why it cannot be (logged).
func readRequest(
    _ body: [Frame],
    _ droppedFrames: Int,
    _ limits: Limits,
    _ logger: Logger
)
    -> Result<Request, RefusedRequest>
{
    do {
        return .success(try Request.decode(body, droppedFrames: droppedFrames, limits: limits))
    } catch {
        logger.notice("refused a request", metadata: ["error": "\(error)"])
        return .failure(RefusedRequest(reply: .error(requestID: Request.requestID(in: body), error)))
    }
}
