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
/// Given the command endpoints of several daemons (a leader and its standbys on one PostgreSQL journal), it finds
/// the leader by asking (``LeaderSearch``): a silence moves it to the next daemon, and so does an ERROR
/// `not_leader`, which ends no try; the request goes on until a daemon that leads answers it or its tries are over.
/// With one endpoint, a `not_leader` is the reply, as any other ERROR.
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
    }

    /// Sends `request` and returns the daemon's reply to it: the leader's, when several daemons were given.
    public func call(_ request: Request) throws(ClientError) -> Reply {
        var pirate = LazyPirate<Void>(LazyPirate.Settings(timeout: timeout, retries: retries))
        var outputs = pirate.submit(request, (), now: .now)
        var refusal: Reply?
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
                    throw ClientError(code: .unavailable, gaveUp(tries, refused: refusal))
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
                if case let .error(_, error) = reply, error.code == .notLeader, search.endpoints.count > 1 {
                    // Not applied; the request goes on at the next daemon that may lead, its try still running.
                    refusal = reply
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

    /// The STATUS of the daemon that leads, and its body as it came (docs/operations.md, "Status"). A standby answers
    /// STATUS too, so with several endpoints each is asked in turn, from the current one, until one does not stand
    /// by; requests go to that one next. With one endpoint, or when every daemon that answers stands by, it is the
    /// last answer.
    public func leaderStatus() throws(ClientError) -> (status: DaemonStatus, body: [UInt8]) {
        var answer: (DaemonStatus, [UInt8])?
        for _ in search.endpoints {
            statusRequests += 1
            let reply = try call(.status(requestID: statusRequests))
            guard case let .status(_, body) = reply, let status = DaemonStatus(reply) else {
                throw ClientError(
                    code: .protocolViolation,
                    "the daemon at \(endpoint) answered STATUS with a reply that is not a readable status: \(reply)"
                )
            }
            answer = (status, body)
            guard status.role == "standby", search.endpoints.count > 1 else { break }
            _ = search.notLeader()
            closeSocket()
        }
        return answer!
    }

    /// Why a request was given up after `tries`.
    private func gaveUp(_ tries: Int, refused refusal: Reply?) -> String {
        let each = "\(tries) \(tries == 1 ? "try" : "tries") of \(timeout) each"
        guard search.endpoints.count > 1 else {
            return "no reply from the daemon at \(endpoint) after \(each); is the daemon running, and is the endpoint "
                + "right?"
        }
        let daemons = search.endpoints.joined(separator: ", ")
        guard case let .error(_, error)? = refusal else {
            return "no reply from any of the daemons at \(daemons) after \(each); are they running, and are the "
                + "endpoints right?"
        }
        return
            "no daemon at \(daemons) would lead after \(each) (the last said: \(error.reason)); is a leader running, "
            + "and can the standbys reach the journal's database to take over?"
    }

    private func closeSocket() {
        socket?.close()
        socket = nil
    }

    /// The next message on the socket, waiting until `deadline` at most. After a `not_leader` the socket is closed
    /// and nothing is sent until the search's pause is over: the socket to the daemon asked next is opened here, so
    /// that the pause is waited out in a poll (returning at once without a socket, the caller's loop spun through
    /// it).
    private func receive(until deadline: ContinuousClock.Instant) -> [[UInt8]]? {
        let wait = max(.zero, deadline - .now)
        guard let socket = try? openSocket() else {
            // No socket to this daemon (libzmq refused its endpoint): as good as silent; wait out the try.
            _ = try? Poller([]).poll(timeout: wait)
            return nil
        }
        guard let ready = try? Poller([.socket(socket, .readable)]).poll(timeout: wait), ready[0].contains(.readable)
        else { return nil }
        return try? socket.receive(wait: false)
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
