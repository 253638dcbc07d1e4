import Lockstep
import LockstepProtocol
import ZeroMQ

#if canImport(Glibc)
import Glibc
#endif

/// A request to the daemon failed: no answer in time, or an answer that was not the one asked for.
public struct ClientError: Error, Hashable, Sendable, CustomStringConvertible {
    public struct Code: Hashable, Sendable, RawRepresentable {
        public var rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        /// No reply after every retry: the daemon is down, stopped, or the endpoint is wrong.
        public static let unavailable = Code(rawValue: "unavailable")
        /// The reply could not be read, or answered another request.
        public static let protocolViolation = Code(rawValue: "protocol_violation")
        /// The socket itself failed.
        public static let transport = Code(rawValue: "transport")
        /// The daemon would not take the request: an unknown store, another domain version, a malformed batch.
        public static let refused = Code(rawValue: "refused")
        /// The request could not be made: an empty batch, an action that cannot be encoded.
        public static let badRequest = Code(rawValue: "bad_request")
        /// The daemon committed the action, but this replica did not apply it in time.
        public static let notApplied = Code(rawValue: "not_applied")
        /// The replica is not running, or stopped before the answer came.
        public static let stopped = Code(rawValue: "stopped")
    }

    public var code: Code
    public var reason: String

    public init(code: Code, _ reason: String) {
        self.code = code
        self.reason = reason
    }

    public var description: String { reason }
}

/// CURVE keys for a client: its own pair, and the daemon's public key.
public struct ClientCurve: Hashable, Sendable {
    public var keys: CurveKeyPair
    public var serverPublicKey: [UInt8]

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

/// Requests to the daemon over a REQ socket, the Lazy Pirate way: wait `timeout`; on silence close the socket
/// (a REQ socket that lost its reply is stuck), open a fresh one and send the same request again, up to
/// `retries` times; then give up with ``ClientError/Code/unavailable``. Because a dispatch carries the same
/// idempotency key on every try, the daemon applies it at most once.
///
/// Owned by one thread: it holds a socket.
public final class CommandClient {
    public let endpoint: String
    public let timeout: Duration
    public let retries: Int
    private let context: Context
    private let curve: ClientCurve?
    private var socket: Socket?

    public init(
        context: Context,
        endpoint: String,
        timeout: Duration = .seconds(2),
        retries: Int = 3,
        curve: ClientCurve? = nil
    ) {
        self.context = context
        self.endpoint = endpoint
        self.timeout = timeout
        self.retries = max(0, retries)
        self.curve = curve
    }

    /// Sends `request` and returns the daemon's reply to it.
    public func call(_ request: Request) throws(ClientError) -> Reply {
        let body = request.encode()
        for _ in 0...retries {
            do {
                let socket = try openSocket()
                guard try socket.send(body) else { throw ZeroMQError(errno: EAGAIN, function: "zmq_send") }
                if let frames = try socket.receive() {
                    let reply: Reply
                    do {
                        reply = try Reply.decode(frames)
                    } catch {
                        throw ClientError(code: .protocolViolation, "the daemon at \(endpoint) sent \(error)")
                    }
                    guard reply.requestID == request.requestID || reply.requestID == 0 else {
                        throw ClientError(
                            code: .protocolViolation,
                            "the reply answers request \(reply.requestID), not \(request.requestID)"
                        )
                    }
                    return reply
                }
            } catch let error as ClientError {
                throw error
            } catch {
                // A socket error is treated like silence: start again with a fresh socket.
            }
            self.socket?.close()
            self.socket = nil
        }
        throw ClientError(
            code: .unavailable,
            "no reply from the daemon at \(endpoint) after \(retries + 1) \(retries == 0 ? "try" : "tries") of "
                + "\(timeout) each; is the daemon running, and is the endpoint right?"
        )
    }

    private func openSocket() throws(ZeroMQError) -> Socket {
        if let socket { return socket }
        let socket = try Socket(context, type: .request)
        let milliseconds = Int32(
            clamping: timeout.components.seconds * 1_000 + timeout.components.attoseconds / 1_000_000_000_000_000
        )
        try socket.set(.receiveTimeout, milliseconds)
        try socket.set(.sendTimeout, milliseconds)
        try curve?.configure(socket)
        try socket.connect(endpoint)
        self.socket = socket
        return socket
    }
}
