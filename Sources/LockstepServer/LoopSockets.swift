import Foundation
import Lockstep
import LockstepProtocol
import Logging
import ZeroMQ

/// The sockets the loop owns whatever its role, the ZAP handler with them, and the ERROR replies sent since start.
struct LoopSockets {
    let loop: CommandLoop
    let context: Context
    let router: Socket
    /// The events socket: an XPUB, whose subscriptions the daemon applies itself (checked) under a policy.
    private(set) var publisher: Socket
    /// The ZAP handler's socket, when CURVE or a policy is configured: it identifies every peer as it connects.
    let zap: Socket?
    var curve: CurveAuthority?
    /// The policy, when one is configured (docs/security.md).
    var access: AccessCheck?
    /// ERROR replies sent since start, by code, for STATUS (and subscriptions refused, as `forbidden`).
    var refusals: [String: UInt64] = [:]
    /// When a `forbidden` was last logged, and how many went unlogged since: one line a second at most, so a peer
    /// that sends nothing but forbidden requests cannot flood the log.
    private var forbiddenLog: (at: ContinuousClock.Instant, unlogged: Int)?
    /// The topics subscribers asked for, as the XPUB tells them, each with how many asked. Kept with the socket,
    /// whatever the daemon's role: libzmq sends a subscriber's subscriptions once, when it connects, so one that
    /// stayed connected while the daemon stood by would be forgotten by its next leadership.
    private(set) var subscriptions: [Frame: Int] = [:]
    /// The User-Ids of the subscribers seen, so that a new policy can tell whether it takes a store from one.
    private var subscribers: Set<String> = []
    /// The events socket was made anew: every subscription is gone until its subscriber connects again.
    private var subscriptionsReset = false
    private(set) var isBound = false

    var configuration: DaemonConfiguration { loop.configuration }

    init(loop: CommandLoop) throws {
        self.loop = loop
        context = try Context()
        if let settings = loop.configuration.curve { curve = try CurveAuthority(settings) }
        let configuration = loop.configuration
        if let settings = configuration.access {
            access = AccessCheck(try AccessPolicy(settings, stores: configuration.stores, file: configuration.file))
        }
        if curve != nil || access != nil {
            // The ZAP handler must be bound before any CURVE socket (or, under a policy, any socket) accepts a
            // connection.
            let zap = try Socket(context, type: .reply)
            try zap.bind("inproc://zeromq.zap.01")
            self.zap = zap
        } else {
            zap = nil
        }
        router = try Socket(context, type: .router)
        publisher = try Socket(context, type: .extendedPublisher)
    }

    /// Whether subscriptions are the daemon's to apply: under a policy, each is checked against its subscriber.
    var checksSubscriptions: Bool { access != nil }

    /// Sends `reply` behind its `envelope`, counting an ERROR by its code for STATUS (and logging a `forbidden`).
    mutating func send(_ reply: Reply, to envelope: [Frame]) {
        if case let .error(_, error) = reply {
            refusals[error.code.description, default: 0] += 1
            if error.code == .forbidden { logForbidden(error.reason) }
            loop.inspectorFeed?.notice(.error(code: error.code.description, reason: error.reason))
        }
        _ = try? router.send(envelope + reply.encode(), wait: false)
    }

    /// Logs a `forbidden` with its reason — at most one line a second, the next one counting those left out.
    private mutating func logForbidden(_ reason: String, subscription: Bool = false) {
        let now = ContinuousClock.now
        if let last = forbiddenLog, now - last.at < .seconds(1) {
            forbiddenLog?.unlogged += 1
            return
        }
        var metadata: Logger.Metadata = ["reason": "\(reason)"]
        if let unlogged = forbiddenLog?.unlogged, unlogged > 0 { metadata["unloggedBefore"] = "\(unlogged)" }
        loop.logger.notice(subscription ? "forbidden: refused a subscription" : "forbidden", metadata: metadata)
        forbiddenLog = (now, 0)
    }

    /// What the policy makes of a request.
    enum Admission {
        /// Go on, as sent by this author, with these of the store's actions granted (a dispatch's).
        case admitted(Author, AccessPolicy.ActionGrant)
        /// Answer this `forbidden`; nothing else happens.
        case refused(Reply)
    }

    /// Checks `request` from the peer of `userID` against the policy: STATUS is open to every peer; SNAPSHOT and
    /// RANGE need read of their store; DISPATCH needs a grant on its store (its action cases are checked as it is
    /// sequenced); EFFECTS needs read of every store to list, every action of the effect's store to retry or drop.
    mutating func admit(_ request: Request, userID: String?) -> Admission {
        guard access != nil else { return .admitted(.unknown, .every) }
        let identity = access!.identity(userID)
        let author = identity.map { Author($0.name) } ?? .unknown
        func refuse(_ what: String) -> Admission {
            .refused(
                .error(
                    requestID: request.requestID,
                    ProtocolError(
                        code: .forbidden,
                        "\(AccessCheck.who(identity, userID)) may not \(what); nothing was done (ask the daemon's "
                            + "operator for the grant)"
                    )
                )
            )
        }
        switch request {
        case .status:
            return .admitted(author, .every)
        case let .snapshot(_, store, _), let .range(_, store, _, _):
            guard identity?.mayRead(store) == true else { return refuse("read store '\(store)'") }
            return .admitted(author, .every)
        case let .report(_, report):
            guard identity?.mayRead(report.store) == true else { return refuse("report on store '\(report.store)'") }
            return .admitted(author, .every)
        case let .dispatch(dispatch):
            guard let grant = identity?.dispatch[dispatch.store] else {
                return refuse("dispatch to store '\(dispatch.store)'")
            }
            return .admitted(author, grant)
        case let .effects(_, command):
            switch command {
            case .list:
                guard configuration.stores.allSatisfy({ identity?.mayRead($0) == true }) else {
                    return refuse("list effects, which needs read of every store")
                }
            case let .retry(id), let .drop(id):
                let store = id.prefix { $0 != "/" }
                guard let name = try? StoreName(String(store)), identity?.dispatch[name] == .every else {
                    return refuse("retry or drop effect '\(id)', which needs every action of store '\(store)'")
                }
            }
            return .admitted(author, .every)
        }
    }

    /// Reads what the XPUB says of subscriptions — applying, under a policy, those of stores their subscriber may
    /// read — and whether they changed.
    mutating func readSubscriptions() -> Bool {
        var changed = subscriptionsReset
        subscriptionsReset = false
        while let message = try? publisher.receive(wait: false, maximumFrames: 1, userID: checksSubscriptions),
            let first = message.frames.first, let kind = first.first, kind <= 1
        {
            let topic = Array(first.dropFirst())
            if kind == 1 {
                subscriptions[topic, default: 0] += 1
            } else if let count = subscriptions[topic] {
                subscriptions[topic] = count > 1 ? count - 1 : nil
            }
            changed = true
            // An unsubscription without a User-Id is libzmq's, for a subscriber gone: its pipe went with it.
            if checksSubscriptions, let userID = message.userID { apply(kind == 1, topic, of: userID) }
        }
        return changed
    }

    /// Applies (or takes back) a subscription to `topic` of the subscriber whose message was read last: every
    /// topic of the daemon's streams that starts with it (a prefix, even the empty one, follows several) of a store
    /// that subscriber may read. The others are refused, counted and logged; nothing of them reaches it.
    private mutating func apply(_ subscribe: Bool, _ topic: Frame, of userID: String) {
        subscribers.insert(userID)
        let identity = access?.identity(userID)
        var refused: [String] = []
        for store in configuration.stores {
            for stream in [Event.topic(for: store), Event.runTopic(for: store), Event.traceTopic(for: store)]
            where stream.starts(with: topic) {
                guard identity?.mayRead(store) == true else {
                    if subscribe, !refused.contains(store.rawValue) { refused.append(store.rawValue) }
                    continue
                }
                _ = try? publisher.set(subscribe ? .subscribe : .unsubscribe, stream)
            }
        }
        guard !refused.isEmpty else { return }
        refusals[ProtocolError.Code.forbidden.description, default: 0] += 1
        logForbidden(
            "\(AccessCheck.who(identity, userID)) may not read \(refused.map { "'\($0)'" }.joined(separator: ", ")): "
                + "its subscription gets nothing of it",
            subscription: true
        )
    }

    /// Reloads the CURVE clients and the policy after SIGHUP (on an error the old ones stay) and answers every
    /// waiting ZAP request.
    mutating func serveAuthentication() throws {
        if HangupSignal.take() {
            if curve != nil {
                if let error = curve?.reload() {
                    loop.logger.error("kept the old list of CURVE clients", metadata: ["error": "\(error)"])
                } else {
                    loop.logger.notice(
                        "reloaded the CURVE clients",
                        metadata: ["clients": "\(curve?.allowedClients.count ?? 0)"]
                    )
                }
            }
            if access != nil {
                try reloadAccess()
            } else if configuration.file != nil, (try? configuration.reloadedAccess()) ?? nil != nil {
                loop.logger.warning(
                    """
                    the configuration file now has a policy; it takes effect when the daemon starts again (its sockets \
                    identify peers only when made under one)
                    """
                )
            }
        }
        if let zap {
            while let request = try zap.receive(wait: false, maximumFrames: 16) {
                let answer = Self.answer(request.frames, curve: curve, identifiesLocalPeers: access != nil)
                if !answer.allowed {
                    loop.logger.notice("refused a connection", metadata: ["client": "\(answer.client)"])
                }
                try zap.send(answer.reply)
            }
        }
    }

    /// Takes the policy the configuration file holds now. When it changes what a subscriber seen may read, the events
    /// socket is made anew: libzmq cannot take back one peer's subscription, nor send again one the daemon refused
    /// (a store it may read now), so every subscriber connects again and its subscriptions are checked afresh (a
    /// replica repairs the events it missed meanwhile by range).
    mutating func reloadAccess() throws {
        guard let old = access?.policy else { return }
        let policy: AccessPolicy
        do {
            guard let reloaded = try configuration.reloadedAccess() else {
                loop.logger.error(
                    "kept the old policy: the file has none now; a policy is removed by a restart, never by a reload"
                )
                return
            }
            policy = reloaded
        } catch {
            loop.logger.error("kept the old policy", metadata: ["error": "\(error)"])
            return
        }
        access = AccessCheck(policy)
        let changed = subscribers.filter { userID in
            guard let peer = AccessPolicy.Peer(userID: userID) else { return false }
            return old.identity(of: peer)?.read != policy.identity(of: peer)?.read
        }
        loop.logger.notice(
            "reloaded the policy",
            metadata: ["identities": "\(policy.identities.count)", "subscribersReadingOtherStores": "\(changed.count)"]
        )
        guard !changed.isEmpty, isBound else { return }
        try renewPublisher()
    }

    /// Closes the events socket and binds a new one in its place, dropping every subscriber's connection.
    private mutating func renewPublisher() throws {
        publisher.close()
        // An ipc endpoint's new listener replaces the file (libzmq 4.3 removes the file of a named ipc endpoint
        // only when it binds one, never when it closes it); a tcp port is free again once libzmq's reaper closed the
        // old listener.
        let endpoint = configuration.eventsEndpoint
        publisher = try Socket(context, type: .extendedPublisher)
        subscriptions = [:]
        subscribers = []
        subscriptionsReset = true
        try configure(publisher, endpoint, queue: configuration.eventsQueue)
        let deadline = ContinuousClock.now + .seconds(2)
        while true {
            let failure: ZeroMQError
            do {
                try publisher.bind(endpoint)
                break
            } catch {
                failure = error
            }
            guard failure.errno == EADDRINUSE, ContinuousClock.now < deadline else { throw failure }
            usleep(1_000)
        }
        loop.logger.notice("made the events socket anew: every subscriber connects again under the new policy")
    }

    /// Answers one ZAP request (ZeroMQ RFC 27) with the peer's identity as the connection's User-Id: a listed CURVE
    /// client by its key; under a policy, an ipc peer by the OS user and group the kernel gives for it. Anything
    /// else is refused (400).
    static func answer(
        _ request: [[UInt8]],
        curve: CurveAuthority?,
        identifiesLocalPeers: Bool
    ) -> (reply: [[UInt8]], allowed: Bool, client: String) {
        let version = request.first ?? []
        let requestID = request.count > 1 ? request[1] : []
        var peer: AccessPolicy.Peer?
        var client = "?"
        var refusal = "malformed ZAP request"
        // libzmq never sends fewer frames, but a REP socket must answer whatever it received.
        if request.count >= 6, version == Array("1.0".utf8) {
            let mechanism = String(decoding: request[5], as: UTF8.self)
            let address = String(decoding: request[3], as: UTF8.self)
            client = mechanism
            switch mechanism {
            case "CURVE":
                let key = request.count >= 7 ? request[6] : []
                if key.count == 32 { client = Z85.encode(key) }
                refusal = "client key not listed"
                if curve?.allowedClients.contains(key) == true { peer = .key(key) }
            case "NULL" where identifiesLocalPeers:
                client = address
                refusal = "no peer credentials"
                peer = AccessPolicy.Peer(ipcAddress: address)
            default:
                refusal = "mechanism \(mechanism) not accepted"
            }
        }
        let allowed = peer != nil
        let reply: [[UInt8]] = [
            Array("1.0".utf8), requestID, Array((allowed ? "200" : "400").utf8),
            Array((allowed ? "OK" : refusal).utf8), peer.map { Array($0.userID.utf8) } ?? [], [],
        ]
        return (reply, allowed, client)
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
        try configure(router, configuration.commandEndpoint, queue: 100_000)
        try configure(publisher, configuration.eventsEndpoint, queue: configuration.eventsQueue)
        try router.set(.receiveHighWaterMark, 100_000)
        do {
            try router.bind(configuration.commandEndpoint)
            try publisher.bind(configuration.eventsEndpoint)
        } catch {
            throw ServerError(code: .bind, "cannot bind: \(error); is another daemon running on these endpoints?")
        }
    }

    /// The options of a socket the daemon binds at `endpoint`.
    private func configure(_ socket: Socket, _ endpoint: String, queue: Int) throws {
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
        }
        if endpoint.hasPrefix("tcp://") && curve != nil || access != nil {
            try socket.set(.zapDomain, "lockstep")
            // Fail closed: with no ZAP handler answering, nobody gets in.
            try socket.set(.zapEnforceDomain, 1)
        }
        if socket === publisher, checksSubscriptions { try socket.set(.manualSubscriptions, 1) }
    }

    func publish(_ frames: [Frame]) {
        // PUB never blocks: a subscriber past its high-water mark loses messages and repairs by range.
        _ = try? publisher.send(frames, wait: false)
    }

    func close() {
        router.close()
        publisher.close()
        zap?.close()
    }
}
