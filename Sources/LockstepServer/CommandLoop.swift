import Foundation
import Lockstep
import LockstepJournal
import LockstepProtocol
import Logging
import Synchronization
import ZeroMQ

/// The daemon's one loop, on one thread that owns every socket: each turn drains the command socket, runs
/// the ``Sequencer`` on every request, commits the whole batch to the journal once, and only then replies
/// and publishes. Nothing is acknowledged or published before it is durable.
final class CommandLoop: Sendable {
    let configuration: DaemonConfiguration
    let domains: [HostedDomain]
    let logger: Logger
    let notifier: SystemdNotifier
    let wakeup: Wakeup
    let failpoint: Failpoint?
    private let stopping = Atomic<Bool>(false)
    /// When the daemon started: its uptime in STATUS, whatever its role.
    let startedAt = ContinuousClock.now
    /// Replies finished by readers off the loop, waiting for the loop to send them.
    private let outbox = LockedValue<(replies: [(envelope: [Frame], reply: Reply)], inFlight: Int)>(([], 0))
    private let readers = DispatchQueue(label: "lockstepd.readers", attributes: .concurrent)

    init(
        configuration: DaemonConfiguration,
        domains: [HostedDomain],
        notifier: SystemdNotifier,
        failpoint: Failpoint? = nil,
        logger: Logger
    ) throws(ServerError) {
        self.configuration = configuration
        self.domains = domains
        self.notifier = notifier
        self.failpoint = failpoint
        self.logger = logger
        do {
            wakeup = try Wakeup()
        } catch {
            throw ServerError(code: .system, "could not make the loop's wake-up pipe: \(error)")
        }
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
    /// On a PostgreSQL journal it leads only while it holds the journal's lease: without it, it binds, tells systemd
    /// it is ready as a standby, answers STATUS, refuses every other request `not_leader`, and tries to take the
    /// lease every third of its duration (sooner when the holder's expires sooner). Once it holds the lease it
    /// recovers every store and serves; a commit or renewal that another daemon's lease refused makes it stand by
    /// again.
    func run() throws {
        let journal = try openJournal()
        defer { try? journal.close() }
        let writer = JournalWriter(wakeup: wakeup)
        defer { writer.stop() }
        var sockets = try LoopSockets(loop: self)
        defer { sockets.close() }
        let leased = journal as? PostgresJournal
        var takeover: Takeover?
        if let leased {
            switch try Standby.acquireAtStart(leased, logger: logger) {
            case let .leading(term, previousHolder):
                takeover = Takeover(term: term, previousHolder: previousHolder, since: .now)
            case let .standingBy(leader):
                try sockets.bind()
                var standby = Standby(loop: self, journal: leased, writer: writer, leader: leader)
                guard let next = try standby.wait(&sockets) else { return finishStandingBy() }
                takeover = next
            }
        }
        while true {
            var state: LoopState
            do {
                state = try LoopState(
                    loop: self,
                    journal: journal,
                    sockets: sockets,
                    writer: writer,
                    takeover: takeover
                )
                if !sockets.isBound { try state.sockets.bind() }
            } catch let lost as LeadershipLost {
                guard let leased, let next = try standBy(after: lost, leased, writer, &sockets) else {
                    return finishStandingBy()
                }
                takeover = next
                continue
            }
            sockets = state.sockets
            state.announceReady()
            do {
                while !stopping.load(ordering: .acquiring) {
                    try state.turn()
                }
                try state.finish()
            } catch let lost as LeadershipLost {
                sockets = state.sockets
                guard let leased, let next = try standBy(after: lost, leased, writer, &sockets) else {
                    return finishStandingBy()
                }
                takeover = next
                continue
            }
            try stopServing(&state, journal: journal)
            sockets = state.sockets
            return
        }
    }

    /// A lease, just taken: its term, who held the one before, and when the takeover began; with the stores the
    /// journal writer's thread recovered after renewing it (the fence sent at `fencedAt`), when a standby took it.
    struct Takeover {
        var term: UInt64
        var previousHolder: String
        var since: ContinuousClock.Instant
        var recovered: (sequencer: Sequencer, fencedAt: ContinuousClock.Instant)? = nil
        /// The lease was this daemon's already: it recovered after a failed commit.
        var afterFailedCommit = false
    }

    /// The leader lost its lease, cannot tell whether it holds it, or must recover before it goes on: it has
    /// answered what it held and stands by — recovering first, on the writer's thread, when it still holds the
    /// lease with term `stillHeld`.
    struct LeadershipLost: Error {
        var reason: String
        var stillHeld: UInt64? = nil
    }

    /// The stores as the journal proves them: on the journal writer's thread during a takeover.
    func recoverStores(_ journal: any Journal) throws -> Sequencer {
        try LoopState.recover(domains, journal: journal, logger: logger)
    }

    /// Logs why the leader steps down and stands by until it takes the lease again; `nil` once asked to stop.
    private func standBy(
        after lost: LeadershipLost,
        _ journal: PostgresJournal,
        _ writer: JournalWriter,
        _ sockets: inout LoopSockets
    ) throws -> Takeover? {
        if lost.stillHeld != nil {
            logger.error(
                "recovering the stores on the journal's thread; answering 'not_leader' meanwhile",
                metadata: ["reason": "\(lost.reason)", "name": "\(journal.lease.holder)"]
            )
        } else {
            logger.error(
                "no longer the leader: stopped serving, refused what was in flight (none of it applied), standing by",
                metadata: ["reason": "\(lost.reason)", "name": "\(journal.lease.holder)"]
            )
        }
        if !sockets.isBound { try sockets.bind() }
        var standby = Standby(loop: self, journal: journal, writer: writer, leader: nil, recoveringTerm: lost.stillHeld)
        return try standby.wait(&sockets)
    }

    private func finishStandingBy() {
        notifier.notify("STOPPING=1")
        logger.info("daemon stopping (standing by, nothing to commit)")
    }

    private func stopServing(_ state: inout LoopState, journal: any Journal) throws {
        // Replies being made off the loop go out before the sockets close (bounded: a stuck reader is left).
        let deadline = ContinuousClock.now + .seconds(2)
        while ContinuousClock.now < deadline {
            let (replies, inFlight) = takeReplies()
            state.sendReplies(replies)
            if inFlight == 0 { break }
            Thread.sleep(forTimeInterval: 0.001)
        }
        notifier.notify("STOPPING=1")
        try journal.sync()
        logger.info("daemon stopping: the last batch is committed, replied to and published")
    }

    private func openJournal() throws -> any Journal {
        switch configuration.journal {
        case .memory:
            return InMemoryJournal(policy: configuration.snapshots)
        case .postgres:
            do {
                return try PostgresJournal(
                    connection: configuration.postgresConnection ?? "",
                    policy: configuration.snapshots,
                    lease: PostgresLease(
                        holder: configuration.leaseHolder ?? PostgresLease.defaultHolder(),
                        duration: configuration.leaseDuration
                    ),
                    takeLease: false
                )
            } catch {
                throw ServerError(code: .journal, "cannot open the PostgreSQL journal: \(error)")
            }
        case .sqlite:
            do {
                if failpoint?.point == .noSync {
                    logger.critical("LOCKSTEP_FAILPOINT=no-sync: the journal never fsyncs; a power cut loses data")
                    return try SQLiteJournal(
                        unsyncedForTestingIn: configuration.dataDirectory,
                        policy: configuration.snapshots
                    )
                }
                return try SQLiteJournal(
                    directory: configuration.dataDirectory,
                    policy: configuration.snapshots,
                    relaxed: configuration.durability == .relaxed
                )
            } catch {
                throw ServerError(code: .journal, "cannot open the journal in \(configuration.dataDirectory): \(error)")
            }
        }
    }
}

/// Everything the loop thread owns.
private struct LoopState {
    let loop: CommandLoop
    let journal: any Journal
    /// The sockets, which outlive this leadership.
    var sockets: LoopSockets
    var router: Socket { sockets.router }
    var publisher: Socket { sockets.publisher }
    var sequencer: Sequencer
    let limits: Limits
    let startedAt: ContinuousClock.Instant
    /// When this leadership began: what `eventsPerSecond` counts from, as `committedEvents` do.
    let servingSince = ContinuousClock.now
    /// The lease, on a PostgreSQL journal: its term, when the last fence that renewed it was sent, and when to
    /// renew it next if nothing is committed before.
    var lease:
        (journal: PostgresJournal, term: UInt64, fencedAt: ContinuousClock.Instant, renewAt: ContinuousClock.Instant)?
    /// How this leadership began, logged once the daemon serves.
    let takeover: CommandLoop.Takeover?
    var lastPublished: [StoreName: ContinuousClock.Instant] = [:]
    /// Which of each store's streams (one by one, in runs) someone follows, as ``LoopSockets/subscriptions`` say.
    var streams: [StoreName: (oneByOne: Bool, runs: Bool)] = [:]
    /// Each store's last seq published: durable, and what heartbeats announce.
    var publishedSeq: [StoreName: SequenceNumber] = [:]
    /// Commits a PostgreSQL journal on its own thread while the loop sequences the next group, and renews its
    /// lease; see ``commitsOnLoop``.
    let writer: JournalWriter
    /// Whether the loop commits a local journal on its own thread. Its commit (SQLite: a few WAL writes and one
    /// `fdatasync`, ~200 µs) is made right here: handing it to the writer and back costs two thread wake-ups per
    /// group, and measured on 2 cores that cost more than the overlap bought (docs/performance.md, "Commit on the
    /// loop"). Not while a reader thread answers a SNAPSHOT or RANGE: a RANGE holds the journal's connection while
    /// it reads (up to 10,000 events), and the loop must not wait behind it. A PostgreSQL journal's commit waits on
    /// the network and on another machine's disk, for as long as they take: it always goes to the writer, so the
    /// loop keeps reading, sequencing and heartbeating meanwhile.
    let commitsOnLoop: Bool
    /// Requests sequenced since the last group committed; committed when no commit is in flight.
    var open = Group()
    /// The group being committed, if any: on the writer's thread, or, on the loop, for the moment of its commit.
    var committing: Committing?
    var sinceDigest: [StoreName: Int] = [:]
    var committedEvents: [StoreName: UInt64] = [:]
    var lastWatchdog = ContinuousClock.now
    /// With relaxed durability: when the commits made since the last sync must be synced.
    var syncDue: ContinuousClock.Instant?
    /// The fault suite's crash point, if any.
    var failpoint: Failpoint?

    var configuration: DaemonConfiguration { loop.configuration }
    var logger: Logger { loop.logger }

    init(
        loop: CommandLoop,
        journal: any Journal,
        sockets: LoopSockets,
        writer: JournalWriter,
        takeover: CommandLoop.Takeover?
    ) throws {
        self.loop = loop
        self.journal = journal
        self.sockets = sockets
        self.writer = writer
        commitsOnLoop = !(journal is PostgresJournal)
        self.takeover = takeover
        startedAt = loop.startedAt
        failpoint = loop.failpoint
        limits = Limits(
            maximumBatch: loop.configuration.maximumBatch,
            maximumActionBytes: loop.configuration.maximumMessageBytes
        )
        if let leased = journal as? PostgresJournal, let takeover, let recovered = takeover.recovered {
            // A standby's takeover: renewed and recovered on the journal writer's thread while the loop served.
            let fencedAt = recovered.fencedAt
            lease = (leased, takeover.term, fencedAt, fencedAt + leased.lease.duration / 3)
            sequencer = recovered.sequencer
        } else if let leased = journal as? PostgresJournal, let takeover {
            // At start, before READY=1: renewed before recovery, since the fence waits for a commit of the previous
            // leader still in flight (its row lock), so recovery reads everything that leader made durable.
            let fencedAt = ContinuousClock.now
            do {
                try leased.renewLease()
            } catch {
                throw CommandLoop.LeadershipLost(reason: "the lease, just taken, could not be renewed: \(error)")
            }
            lease = (leased, takeover.term, fencedAt, fencedAt + leased.lease.duration / 3)
            sequencer = try Self.recover(loop.domains, journal: journal, logger: loop.logger)
        } else {
            sequencer = try Self.recover(loop.domains, journal: journal, logger: loop.logger)
        }
        let now = ContinuousClock.now
        for (name, store) in sequencer.stores {
            lastPublished[name] = now
            publishedSeq[name] = store.lastSeq
        }
        // A subscriber that stayed connected while the daemon stood by sends its subscriptions no more.
        followSubscriptions()
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
        if let lease {
            metadata["term"] = "\(lease.term)"
            metadata["name"] = "\(lease.journal.lease.holder)"
        }
        if let takeover, let lease {
            let recovery = ContinuousClock.now - takeover.since
            metadata["previous"] = "\(takeover.previousHolder.isEmpty ? "(none)" : takeover.previousHolder)"
            metadata["recoveryMs"] = "\(recovery / .milliseconds(1))"
            if takeover.afterFailedCommit {
                logger.notice("recovered after a failed commit: leading on", metadata: metadata)
            } else {
                logger.notice("took the journal's lease: leading", metadata: metadata)
            }
            let leader = "leader \(lease.journal.lease.holder) term \(lease.term)"
            loop.notifier.notify("READY=1\nSTATUS=serving \(loop.domains.count) stores, \(leader)")
        } else {
            logger.info("daemon ready", metadata: metadata)
            loop.notifier.notify("READY=1\nSTATUS=serving \(loop.domains.count) stores")
        }
    }
}

/// A request that could not be read: the ERROR reply that says why.
struct RefusedRequest: Error {
    let reply: Reply
}

/// `body` read as a request, or the ERROR that says why it cannot be (logged): the leader's loop and a standby read
/// requests the same way.
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

/// The sockets the loop owns whatever its role, the ZAP handler with them, and the ERROR replies sent since start.
struct LoopSockets {
    let loop: CommandLoop
    let context: Context
    let router: Socket
    let publisher: Socket
    /// The ZAP handler's socket and the keys it checks, when CURVE is configured.
    let zap: Socket?
    var curve: CurveAuthority?
    /// ERROR replies sent since start, by code, for STATUS.
    var refusals: [String: UInt64] = [:]
    /// The topics someone subscribes to, as the XPUB tells them. Kept with the socket, whatever the daemon's role:
    /// libzmq sends a subscriber's subscriptions once, when it connects, so one that stayed connected while the
    /// daemon stood by would be forgotten by its next leadership.
    private(set) var subscriptions: Set<Frame> = []
    private(set) var isBound = false

    var configuration: DaemonConfiguration { loop.configuration }

    init(loop: CommandLoop) throws {
        self.loop = loop
        context = try Context()
        if let settings = loop.configuration.curve {
            curve = try CurveAuthority(settings)
            // The ZAP handler must be bound before any CURVE socket accepts a connection.
            let zap = try Socket(context, type: .reply)
            try zap.bind("inproc://zeromq.zap.01")
            self.zap = zap
        } else {
            zap = nil
        }
        router = try Socket(context, type: .router)
        publisher = try Socket(context, type: .extendedPublisher)
    }

    /// Sends `reply` behind its `envelope`, counting an ERROR by its code for STATUS.
    mutating func send(_ reply: Reply, to envelope: [Frame]) {
        if case let .error(_, error) = reply { refusals[error.code.description, default: 0] += 1 }
        _ = try? router.send(envelope + reply.encode(), wait: false)
    }

    /// Reads what the XPUB says of subscriptions; whether they changed.
    mutating func readSubscriptions() -> Bool {
        var changed = false
        while let frames = try? publisher.receive(wait: false), let message = frames.first, let kind = message.first {
            let topic = Array(message.dropFirst())
            if kind == 1 {
                subscriptions.insert(topic)
            } else if kind == 0 {
                subscriptions.remove(topic)
            }
            changed = true
        }
        return changed
    }

    /// Reloads the CURVE clients after SIGHUP and answers every waiting ZAP request.
    mutating func serveAuthentication() throws {
        if HangupSignal.take(), curve != nil {
            if let error = curve?.reload() {
                loop.logger.error("kept the old list of CURVE clients", metadata: ["error": "\(error)"])
            } else {
                loop.logger.notice(
                    "reloaded the CURVE clients",
                    metadata: ["clients": "\(curve?.allowedClients.count ?? 0)"]
                )
            }
        }
        if let zap, let curve {
            while let request = try zap.receive(wait: false, maximumFrames: 16) {
                let answer = curve.answer(request.frames)
                if !answer.allowed {
                    loop.logger.notice("refused a connection", metadata: ["client": "\(answer.client)"])
                }
                try zap.send(answer.reply)
            }
        }
    }

    mutating func bind() throws {
        isBound = true
        for endpoint in [configuration.commandEndpoint, configuration.eventsEndpoint] where endpoint.hasPrefix("ipc://")
        {
            let directory = (String(endpoint.dropFirst("ipc://".count)) as NSString).deletingLastPathComponent
            if !directory.isEmpty {
                try FileManager.default.createDirectory(
                    atPath: directory,
                    withIntermediateDirectories: true,
                    attributes: [.posixPermissions: 0o700]
                )
            }
        }
        let sockets = [
            (router, configuration.commandEndpoint, 100_000),
            (publisher, configuration.eventsEndpoint, configuration.eventsQueue),
        ]
        for (socket, endpoint, queue) in sockets {
            // The socket takes parts up to 4 × the limit, so that an action over the limit is read and answered
            // too_large (docs/protocol.md); past that libzmq drops the peer's connection unread, which bounds
            // what one message can make the daemon allocate.
            try socket.set(.maximumMessageSize, min(Int64(configuration.maximumMessageBytes) * 4, Int64(Int32.max)))
            try socket.set(.sendHighWaterMark, Int32(clamping: queue))
            try socket.set(.handshakeInterval, 5_000)
            try socket.set(.heartbeatInterval, 5_000)
            try socket.set(.heartbeatTimeout, 15_000)
            if endpoint.hasPrefix("tcp://"), let curve {
                try socket.set(.curveServer, 1)
                try socket.set(.curveSecretKey, curve.serverKeys.secretKey)
                try socket.set(.zapDomain, "lockstep")
                // Fail closed: with no ZAP handler answering, nobody gets in.
                try socket.set(.zapEnforceDomain, 1)
            }
        }
        try router.set(.receiveHighWaterMark, 100_000)
        do {
            try router.bind(configuration.commandEndpoint)
            try publisher.bind(configuration.eventsEndpoint)
        } catch {
            throw ServerError(code: .bind, "cannot bind: \(error); is another daemon running on these endpoints?")
        }
    }

    func close() {
        router.close()
        publisher.close()
        zap?.close()
    }
}

extension LoopState {
    /// One turn: wait for requests, the writer or the next heartbeat; answer and publish what the writer made
    /// durable; sequence every waiting request into the open group; commit the open group unless the writer is
    /// still busy with the last one — here, answering and publishing it at once, or on the writer's thread while
    /// the loop sequences the next (``commitsOnLoop``).
    mutating func turn() throws {
        let accepting = open.entries.count < Self.maximumOpen
        var items: [Poller.Item] = [.fileDescriptor(loop.wakeup.descriptor, .readable)]
        if accepting { items.append(.socket(router, .readable)) }
        if let zap = sockets.zap { items.append(.socket(zap, .readable)) }
        let ready = try Poller(items).poll(timeout: nextDeadline() - ContinuousClock.now)
        if ready[0].contains(.readable) { loop.wakeup.drain() }
        if let result = writer.takeResult() { try complete(result) }
        sendReplies(loop.takeReplies().replies)
        try sockets.serveAuthentication()
        var received = 0
        while accepting, received < 1_024,
            let message = try router.receive(wait: false, maximumFrames: configuration.maximumBatch + 4)
        {
            let frames = message.frames
            // [identity, empty, body…] from REQ and from DEALERs that follow docs/protocol.md.
            let split = frames.count >= 2 && frames[1].isEmpty ? 2 : 1
            sequence(envelope: Array(frames.prefix(split)), body: Array(frames.dropFirst(split)), message.droppedFrames)
            received += 1
        }
        try advance()
        publishHeartbeats()
        if let interval = loop.notifier.watchdogInterval, ContinuousClock.now - lastWatchdog >= interval {
            loop.notifier.notify("WATCHDOG=1")
            lastWatchdog = ContinuousClock.now
        }
    }

    /// Requests the open group may hold before the loop stops reading more until the writer is done: a stalled
    /// disk or database makes clients wait in libzmq's queues, not the daemon's memory grow.
    static let maximumOpen = 4_096

    /// Waits for the writer and answers everything sequenced: the last turn before the daemon stops.
    mutating func finish() throws {
        while committing != nil || !open.entries.isEmpty {
            if committing != nil { try complete(writer.waitForResult()) }
            try advance()
        }
    }

    mutating func sendReplies(_ replies: [(envelope: [Frame], reply: Reply)]) {
        for (envelope, reply) in replies { send(reply, to: envelope) }
    }

    /// Sends `reply` behind its `envelope`, counting an ERROR by its code for STATUS.
    mutating func send(_ reply: Reply, to envelope: [Frame]) {
        sockets.send(reply, to: envelope)
    }

    func nextDeadline() -> ContinuousClock.Instant {
        var deadline = (lastPublished.values.min() ?? ContinuousClock.now) + configuration.heartbeatInterval
        if let lease, committing == nil { deadline = min(deadline, lease.renewAt) }
        if let interval = loop.notifier.watchdogInterval { deadline = min(deadline, lastWatchdog + interval) }
        if let syncDue, committing == nil { deadline = min(deadline, syncDue) }
        return max(deadline, ContinuousClock.now)
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
        case snapshot(requestID: UInt64, store: any SequencedStore)
        /// Read from the journal up to the store's seq when the request was read, durable once the group is.
        case range(requestID: UInt64, store: StoreName, epoch: Epoch, lastSeq: SequenceNumber, from: UInt64, to: UInt64)
    }

    /// Requests sequenced together, answered together once their commit is durable.
    struct Group {
        var entries: [(envelope: [Frame], work: Pending)] = []
        var commits: [Sequencer.Commit] = []
    }

    /// A group being committed, with the snapshots its batch carries and the digests to publish after it.
    struct Committing {
        var group: Group
        var snapshots: [StoreName: JournalSnapshot]
        var digests: [(store: StoreName, epoch: Epoch, seq: SequenceNumber, digest: StateDigest)]
        /// The work synced the journal after the commit (relaxed durability's periodic sync).
        var synced: Bool
        /// The work renewed the lease alone, its fence sent at this instant (an idle leader).
        var renewal: ContinuousClock.Instant? = nil
        /// When the work, a commit with its fence, was handed to the writer.
        var submittedAt = ContinuousClock.now
    }

    /// Reads one request and sequences it into the open group.
    mutating func sequence(envelope: [Frame], body: [Frame], _ droppedFrames: Int) {
        let request: Request
        switch readRequest(body, droppedFrames, limits, logger) {
        case let .success(read): request = read
        case let .failure(refusal):
            open.entries.append((envelope, .reply(refusal.reply)))
            return
        }
        let work: Pending
        switch request {
        case let .dispatch(dispatch):
            switch sequencer.dispatch(dispatch) {
            case let .reply(reply):
                work = .decided(reply)
            case let .commit(commit):
                work = .decided(commit.reply)
                open.commits.append(commit)
            }
        case let .snapshot(requestID, name):
            if let store = sequencer.stores[name] {
                work = .snapshot(requestID: requestID, store: store)
            } else {
                work = .reply(unknownStore(requestID, name))
            }
        case let .range(requestID, name, from, to):
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
        case let .status(requestID):
            work = .status(requestID: requestID)
        }
        open.entries.append((envelope, work))
    }

    /// With the writer idle: commits the open group's batch (and relaxed durability's sync when due), or, with
    /// nothing to commit, answers the open group at once — what it was decided against is durable.
    mutating func advance() throws {
        guard committing == nil else { return }
        let syncNow = syncDue.map { ContinuousClock.now >= $0 } ?? false
        let group = open
        open = Group()
        if group.commits.isEmpty {
            if let lease, !group.entries.isEmpty,
                ContinuousClock.now - lease.fencedAt >= Self.leaseTrusted(lease.journal.lease)
            {
                // The lease may have lapsed (renewals failed, or the process was paused): another daemon may lead
                // and have committed past this state. Answered only once a renewal says the lease is still ours.
                let sent = ContinuousClock.now
                writer.submit { () throws(JournalError) in try lease.journal.renewLease() }
                committing = Committing(group: group, snapshots: [:], digests: [], synced: false, renewal: sent)
                return
            }
            release(group, committed: true)
            if syncNow {
                syncDue = nil
                try commit(
                    Committing(group: Group(), snapshots: [:], digests: [], synced: true),
                    { [journal] () throws(JournalError) in try journal.sync() }
                )
            } else if let lease, ContinuousClock.now >= lease.renewAt {
                // Idle for a third of the lease: renewed on the writer's thread, never by the loop waiting for it.
                let now = ContinuousClock.now
                writer.submit { () throws(JournalError) in try lease.journal.renewLease() }
                committing = Committing(group: Group(), snapshots: [:], digests: [], synced: false, renewal: now)
            }
            return
        }
        let batch: JournalBatch
        do {
            batch = try self.batch(for: group.commits)
        } catch {
            try fail(group, error)
            return
        }
        var snapshots: [StoreName: JournalSnapshot] = [:]
        for snapshot in batch.snapshots {
            if let name = try? StoreName(snapshot.store) { snapshots[name] = snapshot }
        }
        failpoint?.pass(.beforeCommit)
        if syncNow { syncDue = nil }
        try commit(
            Committing(
                group: group,
                snapshots: snapshots,
                digests: digestsDue(after: group.commits, snapshots: snapshots),
                synced: syncNow
            ),
            { [journal] () throws(JournalError) in
                try journal.commit(batch)
                if syncNow { try journal.sync() }
            }
        )
    }

    /// Makes `work` (a commit, a sync) for `done`: here, answering and publishing at once, or on the writer's
    /// thread, answered in a later turn; see ``commitsOnLoop``.
    mutating func commit(_ done: Committing, _ work: @escaping JournalWriter.Work) throws {
        committing = done
        guard commitsOnLoop, loop.offloadedInFlight == 0 else { return writer.submit(work) }
        try complete(Result(catching: work))
    }

    /// How long after its last fence the lease is surely still this daemon's by the database's clock: its duration
    /// less a third, for the time between the check and the answers and for clocks that do not run alike. Past it,
    /// answers that need no commit (STATUS, SNAPSHOT, RANGE, REJECTED, a retry's first reply) wait for a renewal.
    static func leaseTrusted(_ lease: PostgresLease) -> Duration {
        lease.duration - lease.duration / 3
    }

    /// The commit of the group in hand is done: answer and publish it, or answer it and everything sequenced
    /// after it (while the writer had it) `unavailable`.
    mutating func complete(_ result: Result<Void, JournalError>) throws {
        guard let done = committing else { return }
        committing = nil
        if let renewal = done.renewal { return try renewed(at: renewal, result, holding: done.group) }
        switch result {
        case .success:
            if let current = lease {
                // The commit's fence renewed the lease when it was sent, at the latest.
                lease?.fencedAt = done.submittedAt
                lease?.renewAt = done.submittedAt + current.journal.lease.duration / 3
            }
            guard !done.group.commits.isEmpty else { return }
            failpoint?.pass(.afterCommit)
            if configuration.durability == .relaxed, !done.synced, syncDue == nil {
                syncDue = ContinuousClock.now + .milliseconds(10)
            }
            release(done.group, committed: true)
            failpoint?.pass(.afterReply)
            publish(done)
        case let .failure(error):
            try fail(done.group, error)
        }
    }

    /// An idle leader's renewal is done: a lease another daemon took ends this leadership; a renewal that failed
    /// otherwise is tried again soon, and ends it once the lease may have expired since the last one that worked.
    mutating func renewed(
        at sent: ContinuousClock.Instant,
        _ result: Result<Void, JournalError>,
        holding held: Group
    ) throws {
        guard let current = lease else { return }
        let duration = current.journal.lease.duration
        switch result {
        case .success:
            lease?.fencedAt = sent
            lease?.renewAt = sent + duration / 3
            release(held, committed: true)
        case let .failure(error) where error.code == .fenced:
            release(held, refusing: notLeader(error.message))
            try stepDown(because: "\(error)")
        case let .failure(error):
            release(held, committed: false)
            guard ContinuousClock.now - current.fencedAt < duration else {
                try stepDown(because: "the lease could not be renewed for longer than it lasts: \(error)")
            }
            logger.warning("could not renew the lease; trying again", metadata: ["error": "\(error)"])
            lease?.renewAt = ContinuousClock.now + duration / 10
        }
    }

    /// Answers everything sequenced `not_leader` and ends this leadership.
    mutating func stepDown(because reason: String) throws -> Never {
        let later = open
        open = Group()
        release(later, refusing: notLeader(reason))
        throw CommandLoop.LeadershipLost(reason: reason)
    }

    /// The group's commit failed: nothing of it was applied, and the groups sequenced after it stood on it.
    /// A write or fsync the disk failed stops the daemon — after a failed fsync the page cache no longer says what
    /// the disk holds (PostgreSQL's "fsyncgate") — any other failure starts the sequencer again from the journal.
    mutating func fail(_ group: Group, _ error: any Error) throws {
        logger.error("commit failed; nothing of this batch was applied", metadata: ["error": "\(error)"])
        if let error = error as? JournalError, error.code == .fenced {
            release(group, refusing: notLeader(error.message))
            try stepDown(because: "\(error)")
        }
        release(group, committed: false)
        let later = open
        open = Group()
        release(later, committed: false)
        if let lease {
            // Renewed, then recovered, on the writer's thread, by the standby's loop (which pets the watchdog and
            // answers meanwhile): the fence waits for a commit whose outcome the lost connection left unknown (it
            // holds the lease row's lock until it ends), so recovery finds it settled.
            throw CommandLoop.LeadershipLost(reason: "a commit failed: \(error)", stillHeld: lease.term)
        }
        if let error = error as? JournalError, error.code == .ioError {
            throw ServerError(
                code: .journal,
                "the journal's disk failed a write or an fsync, so nothing of the last batch was acknowledged "
                    + "(\(error)); after a failed fsync the kernel's cache no longer tells what the disk "
                    + "holds, so the daemon stops instead of going on: start it again (systemd does) and it recovers "
                    + "from what the disk holds; if it fails again, check the device and the kernel log"
            )
        }
        sequencer = try Self.recover(loop.domains, journal: journal, logger: logger)
        for (name, store) in sequencer.stores { publishedSeq[name] = store.lastSeq }
    }

    /// Sends a group's answers in arrival order: as decided when its commit is durable, `unavailable` when not.
    mutating func release(_ group: Group, committed: Bool) {
        for (envelope, work) in group.entries {
            let reply: Reply
            switch work {
            case let .reply(answer):
                reply = answer
            case let .decided(answer):
                reply = committed ? answer : unavailable(answer.requestID)
            case let .status(requestID):
                reply = status(requestID: requestID)
            case let .snapshot(requestID, store):
                guard committed else {
                    reply = unavailable(requestID)
                    break
                }
                if loop.offload(envelope, { Self.snapshot(requestID: requestID, store: store) }) { continue }
                reply = busy(requestID)
            case let .range(requestID, name, epoch, lastSeq, from, to):
                guard committed else {
                    reply = unavailable(requestID)
                    break
                }
                let journal = self.journal
                let offloaded = loop.offload(envelope) {
                    Self.range(
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
                reply = busy(requestID)
            }
            send(reply, to: envelope)
        }
    }

    /// Answers a group `refusal` — all but the requests that could not be read — when this daemon leads no more.
    mutating func release(_ group: Group, refusing refusal: (UInt64) -> Reply) {
        for (envelope, work) in group.entries {
            switch work {
            case let .reply(answer):
                send(answer, to: envelope)
            case let .decided(answer):
                send(refusal(answer.requestID), to: envelope)
            case let .status(requestID), let .snapshot(requestID, _), let .range(requestID, _, _, _, _, _):
                send(refusal(requestID), to: envelope)
            }
        }
    }

    /// `not_leader`: this leadership ends (`reason` says why), so nothing this daemon holds can be trusted; no
    /// dispatch it held was applied.
    func notLeader(_ reason: String) -> (UInt64) -> Reply {
        { requestID in
            .error(
                requestID: requestID,
                ProtocolError(
                    code: .notLeader,
                    "this daemon no longer leads the journal (\(reason)), so nothing of this request was applied or "
                        + "read; send it to the leader, or again here later, with the same request number"
                )
            )
        }
    }

    func unavailable(_ requestID: UInt64) -> Reply {
        .error(
            requestID: requestID,
            ProtocolError(
                code: .unavailable,
                "the journal could not make this dispatch durable, so nothing was applied; retry with the same "
                    + "request number later, and see the daemon's log"
            )
        )
    }

    func batch(for commits: [Sequencer.Commit]) throws -> JournalBatch {
        var batch = JournalBatch()
        for commit in commits {
            for event in commit.events {
                batch.events.append(
                    JournalEvent(
                        store: commit.store.rawValue,
                        seq: event.seq,
                        action: event.action,
                        clientID: commit.clientID.bytes,
                        requestNumber: commit.requestNumber
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
        }
        for name in Set(commits.map(\.store)) where journal.snapshotDue(store: name.rawValue, in: batch) {
            guard let store = sequencer.stores[name] else { continue }
            batch.snapshots.append(
                JournalSnapshot(store: name.rawValue, seq: store.lastSeq, state: try store.encodedState())
            )
        }
        return batch
    }

    /// The digest of each store past its digest interval or snapshotted by these commits, at the group's last
    /// seq: taken as the group is committed, while the stores still stand there (a snapshot's digest
    /// is reused rather than the state encoded again).
    mutating func digestsDue(
        after commits: [Sequencer.Commit],
        snapshots: [StoreName: JournalSnapshot]
    ) -> [(store: StoreName, epoch: Epoch, seq: SequenceNumber, digest: StateDigest)] {
        var due: [(store: StoreName, epoch: Epoch, seq: SequenceNumber, digest: StateDigest)] = []
        for commit in commits { sinceDigest[commit.store, default: 0] += commit.events.count }
        for name in Set(commits.map(\.store)) {
            let snapshot = snapshots[name]
            guard (sinceDigest[name] ?? 0) >= configuration.digestEveryEvents || snapshot != nil,
                let store = sequencer.stores[name]
            else { continue }
            let digest: StateDigest
            if let snapshot, snapshot.seq == store.lastSeq {
                digest = snapshot.digest
            } else if let state = try? store.encodedState() {
                digest = StateDigest(of: state)
            } else {
                continue
            }
            due.append((name, store.epoch, store.lastSeq, digest))
            sinceDigest[name] = 0
        }
        return due
    }

    /// Events — an EVENT each on the one-by-one stream, one EVENTS per store on the stream in runs — then the
    /// digests taken when the group was handed over.
    mutating func publish(_ done: Committing) {
        readSubscriptions()
        let now = ContinuousClock.now
        var runs: [(store: StoreName, epoch: Epoch, firstSeq: SequenceNumber, actions: [Frame])] = []
        for commit in done.group.commits {
            let streams = streams[commit.store] ?? (false, false)
            if streams.oneByOne {
                for event in commit.events {
                    publish(
                        Event.event(store: commit.store, epoch: commit.epoch, seq: event.seq, action: event.action)
                            .encode()
                    )
                }
            }
            if streams.runs, let first = commit.events.first {
                // The group's commits of one store are consecutive seqs: one run, unless it is over the limit.
                if let last = runs.indices.last(where: { runs[$0].store == commit.store }),
                    runs[last].actions.count + commit.events.count <= Event.maximumRun
                {
                    runs[last].actions += commit.events.map(\.action)
                } else {
                    runs.append((commit.store, commit.epoch, first.seq, commit.events.map(\.action)))
                }
            }
            lastPublished[commit.store] = now
            publishedSeq[commit.store] = commit.events.last?.seq ?? publishedSeq[commit.store]
            committedEvents[commit.store, default: 0] += UInt64(commit.events.count)
        }
        for run in runs {
            publish(
                Event.events(store: run.store, epoch: run.epoch, firstSeq: run.firstSeq, actions: run.actions).encode()
            )
        }
        for digest in done.digests {
            announce(Event.digest(store: digest.store, epoch: digest.epoch, seq: digest.seq, digest.digest))
        }
    }

    /// Reads what the XPUB says of subscriptions and, if they changed, which streams someone follows.
    mutating func readSubscriptions() {
        if sockets.readSubscriptions() { followSubscriptions() }
    }

    /// Works out which streams of each store someone follows: a subscription to a prefix of a stream's topic
    /// (even the empty one) follows it.
    mutating func followSubscriptions() {
        let subscriptions = sockets.subscriptions
        func followed(_ topic: Frame) -> Bool { subscriptions.contains { topic.starts(with: $0) } }
        for name in sequencer.stores.keys {
            streams[name] = (followed(Event.topic(for: name)), followed(Event.runTopic(for: name)))
        }
    }

    /// A heartbeat for each store silent for the interval, announcing the last seq published (not the last
    /// sequenced: a replica that hears of a seq asks for it).
    mutating func publishHeartbeats() {
        readSubscriptions()
        let now = ContinuousClock.now
        for (name, store) in sequencer.stores
        where now - (lastPublished[name] ?? now) >= configuration.heartbeatInterval {
            announce(Event.heartbeat(store: name, epoch: store.epoch, lastSeq: publishedSeq[name] ?? store.lastSeq))
            lastPublished[name] = now
        }
    }

    /// Publishes a HEARTBEAT or DIGEST on each stream of its store that someone follows.
    func announce(_ event: Event) {
        let streams = streams[event.store] ?? (false, false)
        if streams.oneByOne { publish(event.encode()) }
        if streams.runs { publish(event.encodeForRuns()) }
    }

    func publish(_ frames: [Frame]) {
        // PUB never blocks: a subscriber past its high-water mark loses messages and repairs by range.
        _ = try? publisher.send(frames, wait: false)
    }

    static func snapshot(requestID: UInt64, store: any SequencedStore) -> Reply {
        let name = store.name
        do {
            let state = try store.encodedState()
            return .snapshot(
                requestID: requestID,
                SnapshotReply(
                    store: name,
                    epoch: store.epoch,
                    seq: store.lastSeq,
                    digest: StateDigest(of: state),
                    state: state
                )
            )
        } catch {
            return .error(
                requestID: requestID,
                ProtocolError(code: .internal, "cannot encode store '\(name)': \(error)")
            )
        }
    }

    static func range(
        requestID: UInt64,
        store name: StoreName,
        epoch: Epoch,
        lastSeq: SequenceNumber,
        from: SequenceNumber,
        to: SequenceNumber,
        journal: any Journal
    ) -> Reply {
        guard from <= lastSeq else {
            return .error(
                requestID: requestID,
                ProtocolError(
                    code: .invalidRange,
                    "store '\(name)' is at seq \(lastSeq); a range from seq \(from) is empty"
                )
            )
        }
        do {
            // At most 10,000 events and 16 MiB of actions (at least one event): a RANGE of large actions must
            // not make a reader thread hold gigabytes.
            switch try journal.events(
                store: name.rawValue,
                from: from,
                to: min(to, lastSeq),
                limit: 10_000,
                maximumBytes: 16 << 20
            ) {
            case let .events(events):
                return .range(
                    requestID: requestID,
                    store: name,
                    epoch: epoch,
                    firstSeq: from,
                    actions: events.map(\.action)
                )
            case let .compacted(firstAvailable):
                return .compacted(requestID: requestID, store: name, epoch: epoch, firstAvailable: firstAvailable)
            }
        } catch {
            return .error(requestID: requestID, ProtocolError(code: .internal, "cannot read store '\(name)': \(error)"))
        }
    }

    func status(requestID: UInt64) -> Reply {
        let uptime = ContinuousClock.now - startedAt
        let serving = ContinuousClock.now - servingSince
        let seconds = max(Double(serving.components.seconds) + Double(serving.components.attoseconds) / 1e18, 1e-3)
        let stores = sequencer.stores.values.sorted { $0.name < $1.name }.map { store in
            let rate = Double(committedEvents[store.name] ?? 0) / seconds
            // The seq published: durable, unlike one the writer is still committing.
            let seq = publishedSeq[store.name] ?? store.lastSeq
            return #"{"name":"\#(store.name)","seq":\#(seq),"epoch":"\#(store.epoch)","#
                + #""domainVersion":\#(store.domainVersion),"eventsPerSecond":\#(String(format: "%.1f", rate))}"#
        }
        // Only the file sizes: journal.stats() counts every event, which takes tens of ms on a long history
        // and would hold the loop.
        let journalBytes = configuration.journal == .sqlite ? "\(Self.fileBytes(journal.location))" : "null"
        let refused = sockets.refusals.sorted { $0.key < $1.key }.map { #""\#($0.key)":\#($0.value)"# }
        var role = #""role":"leader","#
        if let lease {
            let name = Self.jsonString(lease.journal.lease.holder)
            role += #""name":\#(name),"leader":{"name":\#(name),"term":\#(lease.term)},"#
        }
        let json =
            #"{"uptimeSeconds":\#(uptime.components.seconds),\#(role)"journal":\#(Self.jsonString(journal.location)),"#
            + #""journalBytes":\#(journalBytes),"stores":[\#(stores.joined(separator: ","))],"#
            + #""refused":{\#(refused.joined(separator: ","))},"#
            + #""heartbeatMs":\#(Int(configuration.heartbeatInterval / .milliseconds(1))),"#
            + #""digestEveryEvents":\#(configuration.digestEveryEvents),"#
            + #""maximumBatch":\#(configuration.maximumBatch),"#
            + #""maximumActionBytes":\#(configuration.maximumMessageBytes)}"#
        return .status(requestID: requestID, json: Array(json.utf8))
    }

    /// `text` as a JSON string: a data directory may hold quotes or backslashes.
    static func jsonString(_ text: String) -> String {
        (try? JSONEncoder().encode(text)).map { String(decoding: $0, as: UTF8.self) } ?? "null"
    }

    /// The journal file and its write-ahead log, in bytes.
    static func fileBytes(_ path: String) -> Int64 {
        [path, path + "-wal"].reduce(0) { total, file in
            let size = (try? FileManager.default.attributesOfItem(atPath: file)[.size] as? NSNumber)?.int64Value
            return total + (size ?? 0)
        }
    }

    func busy(_ requestID: UInt64) -> Reply {
        .error(
            requestID: requestID,
            ProtocolError(
                code: .unavailable,
                "\(CommandLoop.maximumOffloaded) snapshot and range requests are already being answered; ask again"
            )
        )
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
