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
