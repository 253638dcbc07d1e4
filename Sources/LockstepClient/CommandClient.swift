import Lockstep
import LockstepProtocol
import ZeroMQ

#if canImport(Glibc)
import Glibc
#endif

/// A request to the daemon failed: no answer in time, or an answer that was not the one asked for.
public struct ClientError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What kind of failure: switch on the static members; new ones may be added, so keep a default.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private enum Base: String, Hashable, Sendable {
            case unavailable = "unavailable"
            case protocolViolation = "protocol_violation"
            case transport = "transport"
            case refused = "refused"
            case badRequest = "bad_request"
            case notApplied = "not_applied"
            case stopped = "stopped"
            case tooManyPending = "too_many_pending"
        }

        private let base: Base
        private init(_ base: Base) { self.base = base }

        /// No reply after every retry: the daemon is down, stopped, or the endpoint is wrong.
        public static let unavailable = Code(.unavailable)
        /// The reply could not be read, or answered another request.
        public static let protocolViolation = Code(.protocolViolation)
        /// The socket itself failed.
        public static let transport = Code(.transport)
        /// The daemon would not take the request: an unknown store, another domain version, a malformed batch.
        public static let refused = Code(.refused)
        /// The request could not be made: an empty batch, an action that cannot be encoded.
        public static let badRequest = Code(.badRequest)
        /// The daemon committed the action, but this replica did not apply it in time, or the daemon's journal was
        /// lost after it accepted the action.
        public static let notApplied = Code(.notApplied)
        /// The replica is not running, or stopped before the answer came.
        public static let stopped = Code(.stopped)
        /// The replica holds as many optimistic actions the daemon has not confirmed as its configuration allows.
        public static let tooManyPending = Code(.tooManyPending)

        /// The code's stable name, e.g. `unavailable`.
        public var description: String { base.rawValue }
    }

    /// What kind of failure, for programs.
    public var code: Code
    /// What failed, with which value, and what to do: for people.
    public var reason: String

    /// An error of kind `code`, explained by `reason`.
    public init(code: Code, _ reason: String) {
        self.code = code
        self.reason = reason
    }

    /// The reason alone; the code is for programs.
    public var description: String { reason }
}

/// CURVE keys for a client: its own pair, and the daemon's public key.
public struct ClientCurve: Hashable, Sendable {
    /// The client's own key pair; its public key must be listed in the daemon's allowed clients file.
    public var keys: CurveKeyPair
    /// The daemon's public key, 32 bytes (`lockstep keygen` prints it in Z85).
    public var serverPublicKey: [UInt8]

    /// The keys for a client with `keys` that trusts the daemon whose public key is `serverPublicKey`.
    public init(keys: CurveKeyPair, serverPublicKey: [UInt8]) {
        self.keys = keys
        self.serverPublicKey = serverPublicKey
    }

    /// Makes `socket` a CURVE client of the daemon; call before `connect`.
    public func configure(_ socket: Socket) throws(ZeroMQError) {
        try socket.set(.curveServerKey, serverPublicKey)
        try socket.set(.curvePublicKey, keys.publicKey)
        try socket.set(.curveSecretKey, keys.secretKey)
    }
}

/// Requests to the daemon over a REQ socket, one at a time, the Lazy Pirate way (`LazyPirate`): wait
/// `timeout`; on silence close the socket (a REQ socket that lost its reply is stuck), open a fresh one and send
/// the same request again, up to `retries` times; then give up with ``ClientError/Code/unavailable``. Because a
/// dispatch carries the same idempotency key on every try, the daemon applies it at most once.
///
/// Requests go to the daemon that leads (`LeaderSearch`). Given the command endpoints of several daemons (a leader
/// and its standbys on one PostgreSQL journal), a silence moves the client to the next daemon, and so does an ERROR
/// `not_leader`, which ends no try; given one, a `not_leader` (a lone standby waiting for the lease) is asked again
/// after `LeaderSearch.pause`. Either way a request goes on until a daemon that leads answers it or its tries are
/// over, so a takeover shorter than `timeout` × (`retries` + 1) is waited out, and a standby's answer is never
/// taken for the leader's.
///
/// Owned by one thread: it holds a socket.
public final class CommandClient {
    /// The command endpoint (a daemon's ROUTER) requests go to now, e.g. `ipc://.lockstep/run/command`: the first of
    /// ``endpoints`` until a silence or a `not_leader` moves the client on.
    public var endpoint: String { search.endpoint }
    /// The command endpoints of the daemons this client may ask, in the order they are tried.
    public var endpoints: [String] { search.endpoints }
    /// How long one try waits for its reply before the socket is renewed and the request sent again.
    public let timeout: Duration
    /// How many times a request is sent again after a silence before ``call(_:)`` throws
    /// ``ClientError/Code/unavailable``.
    public let retries: Int
    private let context: Context
    private let curve: ClientCurve?
    private var socket: Socket?
    private var search: LeaderSearch
    /// The request in flight, between calls none: one machine for every call, so that its storage is not made anew
    /// on each.
    private var pirate: LazyPirate<Void>
    private var statusRequests: UInt64 = 0

    /// A client of the daemon at `endpoint`; it connects on its first ``call(_:)``, with CURVE when `curve` is given. A
    /// negative `retries` is taken as 0.
    public convenience init(
        context: Context,
        endpoint: String,
        timeout: Duration = .seconds(2),
        retries: Int = 3,
        curve: ClientCurve? = nil
    ) {
        self.init(context: context, endpoints: [endpoint], timeout: timeout, retries: retries, curve: curve)
    }

    /// A client of whichever of the daemons at `endpoints` (at least one) leads; it connects to the first on its
    /// first ``call(_:)``, with CURVE when `curve` is given (one server key for them all). A negative `retries` is
    /// taken as 0.
    public init(
        context: Context,
        endpoints: [String],
        timeout: Duration = .seconds(2),
        retries: Int = 3,
        curve: ClientCurve? = nil
    ) {
        self.context = context
        search = LeaderSearch(endpoints: endpoints)
        self.timeout = timeout
        self.retries = max(0, retries)
        self.curve = curve
        pirate = LazyPirate(LazyPirate.Settings(timeout: timeout, retries: retries))
    }

    /// Sends `request` and returns the leading daemon's reply to it; a `not_leader` is never the reply.
    public func call(_ request: Request) throws(ClientError) -> Reply {
        try exchange(request) { reply in
            guard case let .error(_, error) = reply, error.code == .notLeader else { return nil }
            return error.reason
        }
    }

    /// The STATUS of the daemon that leads, and its body as it came (docs/operations.md, "Status"). A standby
    /// answers STATUS too, as it stands by: that answer counts as a `not_leader`, so the request goes on to the next
    /// daemon — or, with one endpoint, to the same one after a pause — until one that leads answers or the tries are
    /// over.
    public func leaderStatus() throws(ClientError) -> (status: DaemonStatus, body: [UInt8]) {
        statusRequests += 1
        let request = Request.status(requestID: statusRequests)
        let reply = try exchange(request) { reply in
            switch reply {
            case let .error(_, error) where error.code == .notLeader:
                return error.reason
            case .status:
                guard let status = DaemonStatus(reply), !status.leads else { return nil }
                return Self.standingBy(status)
            default:
                return nil
            }
        }
        return try Self.readStatus(reply, from: endpoint)
    }

    /// The STATUS of the daemon requests go to now (with one endpoint, that daemon), whatever its role, and its body
    /// as it came: a standby's says who it believes leads.
    public func status() throws(ClientError) -> (status: DaemonStatus, body: [UInt8]) {
        statusRequests += 1
        return try Self.readStatus(call(.status(requestID: statusRequests)), from: endpoint)
    }

    private static func readStatus(_ reply: Reply, from endpoint: String) throws(ClientError) -> (DaemonStatus, [UInt8])
    {
        guard case let .status(_, body) = reply, let status = DaemonStatus(reply) else {
            throw ClientError(
                code: .protocolViolation,
                "the daemon at \(endpoint) answered STATUS with a reply that is not a readable status: \(reply)"
            )
        }
        return (status, body)
    }

    /// Why a standby's STATUS is not the leader's, in its own terms.
    private static func standingBy(_ status: DaemonStatus) -> String {
        let name = status.name.map { " \($0)" } ?? ""
        guard let leader = status.leader else { return "the daemon\(name) stands by, and knows of no leader" }
        let expiry = leader.expiresAt.map { ", its lease expiring at \($0) unless renewed" } ?? ""
        return "the daemon\(name) stands by: \(leader.name) leads (term \(leader.term)\(expiry))"
    }

    /// Sends `request` until a reply comes that `refusal` does not call a refusal to lead (it returns why); a
    /// refused request goes on at the daemon the search points at next, its try still running.
    private func exchange(_ request: Request, refusal: (Reply) -> String?) throws(ClientError) -> Reply {
        // A call that threw (a reply it could not read) left its request in flight.
        if pirate.count > 0 { _ = pirate.removeAll() }
        var outputs = pirate.submit(request, (), now: .now)
        var refused: String?
        while true {
            for output in outputs {
                switch output {
                case let .send(request):
                    // A socket that fails to send is as good as silent: the next tick replaces it.
                    _ = try? openSocket().send(request.encode(), wait: false)
                case .renewSocket:
                    search.timedOut()
                    closeSocket()
                case let .gaveUp(_, _, tries):
                    throw ClientError(code: .unavailable, gaveUp(tries, refused: refused))
                }
            }
            if let frames = receive(until: pirate.nextDeadline ?? .now) {
                let reply: Reply
                do {
                    reply = try Reply.decode(frames)
                } catch {
                    throw ClientError(code: .protocolViolation, "the daemon at \(endpoint) sent \(error)")
                }
                // A REQ socket only ever gets the reply to what it sent; id 0 is an ERROR whose request id the
                // daemon could not read.
                guard reply.requestID == request.requestID || reply.requestID == 0 else {
                    throw ClientError(
                        code: .protocolViolation,
                        "the reply answers request \(reply.requestID), not \(request.requestID)"
                    )
                }
                if let reason = refusal(reply) {
                    // Not applied; the request goes on at the next daemon that may lead, its try still running.
                    refused = reason
                    let pause = search.notLeader()
                    closeSocket()
                    outputs = pirate.redirect(now: .now, pause: pause)
                    continue
                }
                search.answered()
                _ = pirate.answered(request.requestID)
                return reply
            }
            outputs = pirate.tick(now: .now)
        }
    }

    /// Why a request was given up after `tries`.
    private func gaveUp(_ tries: Int, refused refusal: String?) -> String {
        let each = "\(tries) \(tries == 1 ? "try" : "tries") of \(timeout) each"
        let daemons = search.endpoints.joined(separator: ", ")
        guard let refusal else {
            guard search.endpoints.count > 1 else {
                return "no reply from the daemon at \(endpoint) after \(each); is the daemon running, and is the "
                    + "endpoint right?"
            }
            return "no reply from any of the daemons at \(daemons) after \(each); are they running, and are the "
                + "endpoints right?"
        }
        let which = search.endpoints.count > 1 ? "no daemon at \(daemons)" : "the daemon at \(daemons)"
        return "\(which) would lead after \(each) (the last said: \(refusal)); is a leader running, and can the "
            + "standbys reach the journal's database to take over?"
    }

    private func closeSocket() {
        socket?.close()
        socket = nil
    }

    /// The next message on the socket, waiting until `deadline` at most. After a `not_leader` the socket is closed
    /// and nothing is sent until the search's pause is over: the socket to the daemon asked next is opened here, and
    /// the pause is waited out here (returning at once, the caller's loop spun through it).
    private func receive(until deadline: ContinuousClock.Instant) -> [[UInt8]]? {
        let wait = max(.zero, deadline - .now)
        do {
            return try openSocket().receive(timeout: wait)
        } catch {
            // No socket to this daemon (libzmq refused its endpoint), or a REQ socket that has sent nothing yet (the
            // pause after a `not_leader`: it cannot receive, EFSM at once): as good as silent; wait it out.
            _ = try? Poller([]).poll(timeout: wait)
            return nil
        }
    }

    private func openSocket() throws(ZeroMQError) -> Socket {
        if let socket { return socket }
        let socket = try Socket(context, type: .request)
        try curve?.configure(socket)
        try socket.connect(endpoint)
        self.socket = socket
        return socket
    }
}
