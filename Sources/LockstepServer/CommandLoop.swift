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

    /// Recovers, binds, tells systemd it is ready, and serves until ``stop()``. Runs on its own thread.
    func run() throws {
        let journal = try openJournal()
        defer { try? journal.close() }
        var state = try LoopState(loop: self, journal: journal)
        try state.bind()
        logger.info(
            "daemon ready",
            metadata: [
                "command": "\(configuration.commandEndpoint)", "events": "\(configuration.eventsEndpoint)",
                "stores": "\(state.storeSummary)",
            ]
        )
        notifier.notify("READY=1\nSTATUS=serving \(domains.count) stores")
        while !stopping.load(ordering: .acquiring) {
            try state.turn()
        }
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
        state.close()
    }

    private func openJournal() throws -> any Journal {
        switch configuration.journal {
        case .memory:
            return InMemoryJournal(policy: configuration.snapshots)
        case .postgres:
            do {
                return try PostgresJournal(
                    connection: configuration.postgresConnection ?? "",
                    policy: configuration.snapshots
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
    let context: Context
    let router: Socket
    let publisher: Socket
    /// The ZAP handler's socket and the keys it checks, when CURVE is configured.
    let zap: Socket?
    var curve: CurveAuthority?
    var sequencer: Sequencer
    let limits: Limits
    let startedAt = ContinuousClock.now
    var lastPublished: [StoreName: ContinuousClock.Instant] = [:]
    var sinceDigest: [StoreName: Int] = [:]
    var committedEvents: [StoreName: UInt64] = [:]
    /// ERROR replies sent since start, by code, for STATUS.
    var refusals: [String: UInt64] = [:]
    var lastWatchdog = ContinuousClock.now
    /// With relaxed durability: when the commits made since the last sync must be synced.
    var syncDue: ContinuousClock.Instant?
    /// The fault suite's crash point, if any.
    var failpoint: Failpoint?

    var configuration: DaemonConfiguration { loop.configuration }
    var logger: Logger { loop.logger }

    init(loop: CommandLoop, journal: any Journal) throws {
        self.loop = loop
        self.journal = journal
        failpoint = loop.failpoint
        limits = Limits(
            maximumBatch: loop.configuration.maximumBatch,
            maximumActionBytes: loop.configuration.maximumMessageBytes
        )
        sequencer = try Self.recover(loop.domains, journal: journal, logger: loop.logger)
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
        publisher = try Socket(context, type: .publisher)
        let now = ContinuousClock.now
        for name in sequencer.stores.keys { lastPublished[name] = now }
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
                        + "idempotency WHERE client_id = x'\(client)' AND request_number = \(record.key.requestNumber)\""
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

    func bind() throws {
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

    /// One turn: wait for work or the next heartbeat, take every waiting request, commit once, reply, publish.
    mutating func turn() throws {
        var items: [Poller.Item] = [.socket(router, .readable), .fileDescriptor(loop.wakeup.descriptor, .readable)]
        if let zap { items.append(.socket(zap, .readable)) }
        let ready = try Poller(items).poll(timeout: nextDeadline() - ContinuousClock.now)
        if ready[1].contains(.readable) { loop.wakeup.drain() }
        sendReplies(loop.takeReplies().replies)
        if HangupSignal.take(), curve != nil {
            if let error = curve?.reload() {
                logger.error("kept the old list of CURVE clients", metadata: ["error": "\(error)"])
            } else {
                logger.notice(
                    "reloaded the CURVE clients",
                    metadata: ["clients": "\(curve?.allowedClients.count ?? 0)"]
                )
            }
        }
        if let zap, let curve {
            while let request = try zap.receive(wait: false, maximumFrames: 16) {
                let answer = curve.answer(request.frames)
                if !answer.allowed { logger.notice("refused a connection", metadata: ["client": "\(answer.client)"]) }
                try zap.send(answer.reply)
            }
        }

        var inbox: [(envelope: [Frame], body: [Frame], dropped: Int)] = []
        while inbox.count < 1_024,
            let message = try router.receive(wait: false, maximumFrames: configuration.maximumBatch + 4)
        {
            let frames = message.frames
            // [identity, empty, body…] from REQ and from DEALERs that follow docs/protocol.md.
            let split = frames.count >= 2 && frames[1].isEmpty ? 2 : 1
            inbox.append((Array(frames.prefix(split)), Array(frames.dropFirst(split)), message.droppedFrames))
        }
        if !inbox.isEmpty { try serve(inbox) }
        if let due = syncDue, ContinuousClock.now >= due {
            try journal.sync()
            syncDue = nil
        }
        publishHeartbeats()
        if let interval = loop.notifier.watchdogInterval, ContinuousClock.now - lastWatchdog >= interval {
            loop.notifier.notify("WATCHDOG=1")
            lastWatchdog = ContinuousClock.now
        }
    }

    mutating func sendReplies(_ replies: [(envelope: [Frame], reply: Reply)]) {
        for (envelope, reply) in replies { send(reply, to: envelope) }
    }

    /// Sends `reply` behind its `envelope`, counting an ERROR by its code for STATUS.
    mutating func send(_ reply: Reply, to envelope: [Frame]) {
        if case let .error(_, error) = reply { refusals[error.code.description, default: 0] += 1 }
        _ = try? router.send(envelope + reply.encode(), wait: false)
    }

    func nextDeadline() -> ContinuousClock.Instant {
        var deadline = (lastPublished.values.min() ?? ContinuousClock.now) + configuration.heartbeatInterval
        if let interval = loop.notifier.watchdogInterval { deadline = min(deadline, lastWatchdog + interval) }
        if let syncDue { deadline = min(deadline, syncDue) }
        return max(deadline, ContinuousClock.now)
    }

    private enum Pending {
        case reply(Reply)
        /// The sequencer's answer to a dispatch that needs no commit: it stands only if the turn's commit
        /// does, since it was decided against the state the turn's earlier dispatches left.
        case decided(Reply)
        case commit(Sequencer.Commit)
        case snapshot(requestID: UInt64, store: StoreName)
        case range(requestID: UInt64, store: StoreName, from: SequenceNumber, to: SequenceNumber)
        case status(requestID: UInt64)
    }

    mutating func serve(_ inbox: [(envelope: [Frame], body: [Frame], dropped: Int)]) throws {
        var pending: [(envelope: [Frame], work: Pending)] = []
        pending.reserveCapacity(inbox.count)
        for message in inbox {
            let requestID = Request.requestID(in: message.body)
            let request: Request
            do {
                request = try Request.decode(message.body, droppedFrames: message.dropped, limits: limits)
            } catch {
                logger.notice("refused a request", metadata: ["error": "\(error)"])
                pending.append((message.envelope, .reply(.error(requestID: requestID, error))))
                continue
            }
            switch request {
            case let .dispatch(dispatch):
                switch sequencer.dispatch(dispatch) {
                case let .reply(reply): pending.append((message.envelope, .decided(reply)))
                case let .commit(commit): pending.append((message.envelope, .commit(commit)))
                }
            case let .snapshot(requestID, store):
                pending.append((message.envelope, .snapshot(requestID: requestID, store: store)))
            case let .range(requestID, store, from, to):
                pending.append((message.envelope, .range(requestID: requestID, store: store, from: from, to: to)))
            case let .status(requestID):
                pending.append((message.envelope, .status(requestID: requestID)))
            }
        }

        let commits = pending.compactMap { if case let .commit(commit) = $0.work { commit } else { nil } }
        var committed = true
        /// A write or fsync the disk failed: after a failed fsync the page cache no longer says what the disk
        /// holds (PostgreSQL's "fsyncgate"), so the daemon answers the turn and stops rather than go on from it.
        var diskFailure: JournalError?
        var snapshotted: [StoreName: JournalSnapshot] = [:]
        if !commits.isEmpty {
            do {
                let batch = try batch(for: commits)
                failpoint?.pass(.beforeCommit)
                try journal.commit(batch)
                failpoint?.pass(.afterCommit)
                if configuration.durability == .relaxed, syncDue == nil {
                    syncDue = ContinuousClock.now + .milliseconds(10)
                }
                for snapshot in batch.snapshots {
                    if let name = try? StoreName(snapshot.store) { snapshotted[name] = snapshot }
                }
            } catch {
                committed = false
                logger.error("commit failed; nothing of this batch was applied", metadata: ["error": "\(error)"])
                if let error = error as? JournalError, error.code == .ioError {
                    diskFailure = error
                } else {
                    // The sequencer ran ahead of the journal: start it again from what is durable.
                    sequencer = try Self.recover(loop.domains, journal: journal, logger: logger)
                }
            }
        }

        // Replies, in arrival order, now that the batch is durable (or known not to be).
        for (envelope, work) in pending {
            let reply: Reply
            switch work {
            case let .reply(answer):
                reply = answer
            case let .decided(answer):
                reply = committed ? answer : unavailable(answer.requestID)
            case let .commit(commit):
                reply = committed ? commit.reply : unavailable(commit.requestNumber)
            case let .snapshot(requestID, name):
                guard let store = sequencer.stores[name] else {
                    reply = unknownStore(requestID, name)
                    break
                }
                // The store is a value: the reader encodes this seq's state while the loop goes on.
                if loop.offload(envelope, { Self.snapshot(requestID: requestID, store: store) }) { continue }
                reply = busy(requestID)
            case let .range(requestID, name, from, to):
                guard let store = sequencer.stores[name] else {
                    reply = unknownStore(requestID, name)
                    break
                }
                // Only what the reader needs: holding the store would make the next dispatch copy its state.
                let (journal, epoch, lastSeq) = (self.journal, store.epoch, store.lastSeq)
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
            case let .status(requestID):
                reply = status(requestID: requestID)
            }
            send(reply, to: envelope)
        }
        if committed, !commits.isEmpty {
            failpoint?.pass(.afterReply)
            publish(commits, snapshotted: snapshotted)
        }
        if let diskFailure {
            throw ServerError(
                code: .journal,
                "the journal's disk failed a write or an fsync, so nothing of the last batch was acknowledged "
                    + "(\(diskFailure)); after a failed fsync the kernel's cache no longer tells what the disk "
                    + "holds, so the daemon stops instead of going on: start it again (systemd does) and it recovers "
                    + "from what the disk holds; if it fails again, check the device and the kernel log"
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

    /// Events, then a digest for each store past its digest interval or just snapshotted; a snapshot's digest
    /// is reused rather than the state encoded again.
    mutating func publish(_ commits: [Sequencer.Commit], snapshotted: [StoreName: JournalSnapshot]) {
        let now = ContinuousClock.now
        for commit in commits {
            for event in commit.events {
                send(Event.event(store: commit.store, epoch: commit.epoch, seq: event.seq, action: event.action))
            }
            lastPublished[commit.store] = now
            sinceDigest[commit.store, default: 0] += commit.events.count
            committedEvents[commit.store, default: 0] += UInt64(commit.events.count)
        }
        for name in Set(commits.map(\.store)) {
            let snapshot = snapshotted[name]
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
            send(Event.digest(store: name, epoch: store.epoch, seq: store.lastSeq, digest))
            sinceDigest[name] = 0
        }
    }

    mutating func publishHeartbeats() {
        let now = ContinuousClock.now
        for (name, store) in sequencer.stores
        where now - (lastPublished[name] ?? now) >= configuration.heartbeatInterval {
            send(Event.heartbeat(store: name, epoch: store.epoch, lastSeq: store.lastSeq))
            lastPublished[name] = now
        }
    }

    func send(_ event: Event) {
        // PUB never blocks: a subscriber past its high-water mark loses messages and repairs by range.
        _ = try? publisher.send(event.encode(), wait: false)
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
        let seconds = max(Double(uptime.components.seconds) + Double(uptime.components.attoseconds) / 1e18, 1e-3)
        let stores = sequencer.stores.values.sorted { $0.name < $1.name }.map { store in
            let rate = Double(committedEvents[store.name] ?? 0) / seconds
            return #"{"name":"\#(store.name)","seq":\#(store.lastSeq),"epoch":"\#(store.epoch)","#
                + #""domainVersion":\#(store.domainVersion),"eventsPerSecond":\#(String(format: "%.1f", rate))}"#
        }
        // Only the file sizes: journal.stats() counts every event, which takes tens of ms on a long history
        // and would hold the loop.
        let journalBytes = configuration.journal == .sqlite ? "\(Self.fileBytes(journal.location))" : "null"
        let refused = refusals.sorted { $0.key < $1.key }.map { #""\#($0.key)":\#($0.value)"# }
        let json =
            #"{"uptimeSeconds":\#(uptime.components.seconds),"journal":\#(Self.jsonString(journal.location)),"#
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
