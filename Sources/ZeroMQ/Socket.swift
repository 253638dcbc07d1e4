import CZeroMQ
import Synchronization

/// The socket types Lockstep uses.
public struct SocketType: Hashable, Sendable, CustomStringConvertible {
    let rawValue: Int32

    /// PAIR: exactly one peer at each end; the socket tests use it.
    public static let pair = SocketType(rawValue: ZMQ_PAIR)
    /// PUB: the daemon's events socket, which sends each event to every subscriber of its topic.
    public static let publisher = SocketType(rawValue: ZMQ_PUB)
    /// XPUB: a PUB that also reads its subscribers' subscriptions (`0x01` + topic when the first subscriber of a
    /// topic comes, `0x00` + topic when the last one goes); the daemon's events socket, so it publishes a stream
    /// only while someone follows it.
    public static let extendedPublisher = SocketType(rawValue: ZMQ_XPUB)
    /// SUB: a replica's events socket, subscribed to its store's topic.
    public static let subscriber = SocketType(rawValue: ZMQ_SUB)
    /// REQ: one request, then its reply; the socket of `CommandClient` (LockstepClient).
    public static let request = SocketType(rawValue: ZMQ_REQ)
    /// REP: the other end of REQ; the daemon answers libzmq's CURVE authentication (ZAP) requests on one.
    public static let reply = SocketType(rawValue: ZMQ_REP)
    /// DEALER: many requests in flight; the replica's command socket.
    public static let dealer = SocketType(rawValue: ZMQ_DEALER)
    /// ROUTER: the daemon's command socket, which tells its peers apart by an identity frame.
    public static let router = SocketType(rawValue: ZMQ_ROUTER)
    /// STREAM: raw TCP, each message `[routing id, bytes]`; a connection's arrival and departure each come as its
    /// id with no bytes, and sending its id with no bytes closes it. The daemon's HTTP listener.
    public static let stream = SocketType(rawValue: ZMQ_STREAM)

    /// The type's name as ZeroMQ writes it: `PUB`, `ROUTER`, ….
    public var description: String {
        switch rawValue {
        case ZMQ_PAIR: "PAIR"
        case ZMQ_PUB: "PUB"
        case ZMQ_XPUB: "XPUB"
        case ZMQ_SUB: "SUB"
        case ZMQ_REQ: "REQ"
        case ZMQ_REP: "REP"
        case ZMQ_DEALER: "DEALER"
        case ZMQ_ROUTER: "ROUTER"
        case ZMQ_STREAM: "STREAM"
        default: "type \(rawValue)"
        }
    }
}

/// A message as it came off a socket, with a count of the parts dropped past the caller's limit.
public struct ReceivedMessage: Sendable {
    /// The parts kept, in order.
    public var frames: [[UInt8]]
    /// Parts that arrived beyond `maximumFrames` and were discarded unread.
    public var droppedFrames: Int
    /// The connection's User-Id, as the ZAP handler gave it when the peer connected, when asked for and set.
    public var userID: String?

    /// A message of `frames`, with `droppedFrames` parts discarded beyond them.
    public init(frames: [[UInt8]], droppedFrames: Int = 0, userID: String? = nil) {
        self.frames = frames
        self.droppedFrames = droppedFrames
        self.userID = userID
    }
}

/// One libzmq socket, owned by one thread.
///
/// libzmq sockets are not thread-safe, so `Socket` is not `Sendable`: create it, use it and close it on the
/// thread that owns it. It is closed exactly once, by ``close()`` or when it is deinitialized.
public final class Socket {
    /// The socket's type.
    public let type: SocketType
    private let context: Context
    private var handle: UnsafeMutableRawPointer?
    /// Its parts lent to libzmq and not let go yet (``lentPartsOutstanding``).
    private let lent = LentCount()

    /// A new socket of `type` on `context`, with linger set to 0 so closing never waits for unsent
    /// messages; set ``SocketOption/linger`` to keep them.
    public init(_ context: Context, type: SocketType) throws(ZeroMQError) {
        guard let handle = zmq_socket(context.handle, type.rawValue) else {
            throw ZeroMQError(errno: zmq_errno(), function: "zmq_socket", detail: "a \(type) socket")
        }
        self.type = type
        self.context = context
        self.handle = handle
        try set(.linger, 0)
    }

    deinit {
        close()
    }

    /// Closes the socket; later calls throw `ENOTSOCK`. Closing twice is harmless.
    public func close() {
        guard let handle else { return }
        self.handle = nil
        // zmq_close fails only for a pointer that is not a socket, which `handle` always is.
        _ = try? zmqCheck("zmq_close") { zmq_close(handle) }
    }

    /// Whether ``close()`` has run.
    public var isClosed: Bool { handle == nil }

    private func open(_ function: StaticString) throws(ZeroMQError) -> UnsafeMutableRawPointer {
        guard let handle else {
            throw ZeroMQError(errno: ENOTSOCK, function: "\(function)", detail: "a \(type) socket already closed")
        }
        return handle
    }

    // MARK: - Endpoints

    /// Binds to `endpoint`, such as `ipc:///run/lockstep/command` or `tcp://127.0.0.1:5555`.
    public func bind(_ endpoint: String) throws(ZeroMQError) {
        let handle = try open("zmq_bind")
        try zmqCheck("zmq_bind", detail: endpoint) { zmq_bind(handle, endpoint) }
    }

    /// Connects to `endpoint`; libzmq reconnects by itself if the peer goes away.
    public func connect(_ endpoint: String) throws(ZeroMQError) {
        let handle = try open("zmq_connect")
        try zmqCheck("zmq_connect", detail: endpoint) { zmq_connect(handle, endpoint) }
    }

    /// Stops listening on `endpoint`.
    public func unbind(_ endpoint: String) throws(ZeroMQError) {
        let handle = try open("zmq_unbind")
        try zmqCheck("zmq_unbind", detail: endpoint) { zmq_unbind(handle, endpoint) }
    }

    /// Drops the connection to `endpoint`.
    public func disconnect(_ endpoint: String) throws(ZeroMQError) {
        let handle = try open("zmq_disconnect")
        try zmqCheck("zmq_disconnect", detail: endpoint) { zmq_disconnect(handle, endpoint) }
    }

    /// The endpoint last bound, with the port libzmq chose for `tcp://…:*`.
    public var lastEndpoint: String {
        get throws(ZeroMQError) {
            let bytes = try get(.lastEndpoint)
            return String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
        }
    }

    // MARK: - Messages

    /// Parts of this many bytes or more are lent to libzmq rather than copied (``send(_:wait:)``).
    public static let lentPartBytes = 1 << 20

    /// The parts this socket lent to libzmq that it has not let go yet: each a large array held until it is.
    public var lentPartsOutstanding: Int { lent.value.load(ordering: .relaxed) }

    /// Sends `frames` as one multipart message (libzmq delivers all parts or none). Each part is copied
    /// once, into libzmq's message — but a part of ``lentPartBytes`` or more (a large state's SNAPSHOT) is lent: the
    /// message points at the array's bytes and keeps the array until libzmq has sent them, so a large state is not
    /// held twice while it goes out. Returns `false` when `wait` is false and the send would block (high-water
    /// mark reached, or no peer for a socket type that needs one), or when a send timeout expires.
    @discardableResult
    public func send(_ frames: [[UInt8]], wait: Bool = true) throws(ZeroMQError) -> Bool {
        let handle = try open("zmq_send")
        guard !frames.isEmpty else {
            throw ZeroMQError(errno: EINVAL, function: "zmq_send", detail: "a message with no parts")
        }
        let last = frames.count - 1
        for (index, frame) in frames.enumerated() {
            let flags = (index < last ? ZMQ_SNDMORE : 0) | (wait ? 0 : ZMQ_DONTWAIT)
            let result =
                frame.count >= Self.lentPartBytes
                ? try Self.lend(frame, to: handle, flags: flags, counted: lent, detail: part(index, of: frames.count))
                : try frame.withUnsafeBytes { buffer in
                    Result { () throws(ZeroMQError) in
                        try zmqCall("zmq_send", detail: self.part(index, of: frames.count)) {
                            zmq_send(handle, buffer.baseAddress, buffer.count, flags)
                        }
                    }
                }.get()
            if case .wouldBlock = result {
                // libzmq checks the high-water mark on the first part only; later parts always go.
                guard index == 0 else {
                    throw ZeroMQError(errno: EAGAIN, function: "zmq_send", detail: "part \(index + 1) after the first")
                }
                return false
            }
        }
        return true
    }

    /// What an error says of the part at `index` of a message of `count` parts (made only for an error).
    private func part(_ index: Int, of count: Int) -> String { "part \(index + 1) of \(count) on a \(type) socket" }

    /// Sends `frame` as a message that points at its bytes: libzmq calls back, on its I/O thread, once it no longer
    /// needs them, and the array is let go then. (An array's elements stay where they are while it is neither
    /// changed nor freed: the box holds it, unchanged, until that call.)
    private static func lend(
        _ frame: [UInt8],
        to handle: UnsafeMutableRawPointer,
        flags: Int32,
        counted outstanding: LentCount,
        detail: @autoclosure () -> String
    ) throws(ZeroMQError) -> CallResult {
        let owner = Unmanaged.passRetained(LentPart(frame, counted: outstanding))
        let data = owner.takeUnretainedValue().bytes.withUnsafeBytes {
            UnsafeMutableRawPointer(mutating: $0.baseAddress!)
        }
        var message = zmq_msg_t()
        do {
            try zmqCheck("zmq_msg_init_data", detail: detail()) {
                zmq_msg_init_data(
                    &message,
                    data,
                    frame.count,
                    { _, hint in
                        Unmanaged<LentPart>.fromOpaque(hint!).release()
                    },
                    owner.toOpaque()
                )
            }
        } catch {
            owner.release()
            throw error
        }
        do {
            let result = try zmqCall("zmq_msg_send", detail: detail()) { zmq_msg_send(&message, handle, flags) }
            // Sent, the message is libzmq's; not sent, closing it lets the array go.
            if case .wouldBlock = result { zmq_msg_close(&message) }
            return result
        } catch {
            zmq_msg_close(&message)
            throw error
        }
    }

    /// Receives one multipart message, or `nil` when `wait` is false and none is ready, or when a receive
    /// timeout expires. Each part is copied once, out of libzmq's message.
    public func receive(wait: Bool = true) throws(ZeroMQError) -> [[UInt8]]? {
        try receive(wait: wait, maximumFrames: .max)?.frames
    }

    /// Receives one multipart message, waiting `timeout` at most (rounded up to a whole millisecond): `nil` when
    /// none came. The socket's ``SocketOption/receiveTimeout`` is left at that wait. One call into libzmq, as a plain
    /// blocking receive makes, where a ``Poller`` over the one socket and then a receive were two.
    public func receive(timeout: Duration) throws(ZeroMQError) -> [[UInt8]]? {
        try set(.receiveTimeout, Int32(timeout.roundedUpMilliseconds))
        return try receive(wait: true)
    }

    /// Receives one multipart message, keeping at most `maximumFrames` parts: the rest are read and
    /// discarded without copying, so a hostile peer cannot make us hold more than we chose to. With `userID`, the
    /// message's User-Id property (the ZAP handler's word on who the peer is) comes with it.
    public func receive(
        wait: Bool = true,
        maximumFrames: Int,
        userID: Bool = false
    ) throws(ZeroMQError) -> ReceivedMessage? {
        let handle = try open("zmq_msg_recv")
        var message = zmq_msg_t()
        zmq_msg_init(&message)
        defer { zmq_msg_close(&message) }
        var received = ReceivedMessage(frames: [])
        var flags = wait ? 0 : ZMQ_DONTWAIT
        repeat {
            let result = try zmqCall("zmq_msg_recv", detail: "a \(type) socket") {
                zmq_msg_recv(&message, handle, flags)
            }
            if case .wouldBlock = result {
                guard received.frames.isEmpty && received.droppedFrames == 0 else {
                    throw ZeroMQError(errno: EAGAIN, function: "zmq_msg_recv", detail: "a part after the first")
                }
                return nil
            }
            // The parts that came over the wire carry the connection's properties. A ROUTER's first part is its own
            // (the peer's routing id), with them or, when a poll made it read ahead, without: the second has them.
            if userID, received.userID == nil, received.frames.count + received.droppedFrames < 2,
                let property = zmq_msg_gets(&message, "User-Id")
            {
                received.userID = String(cString: property)
            }
            // The rest of a multipart message is already here; never wait for it.
            flags = ZMQ_DONTWAIT
            if received.frames.count < maximumFrames {
                let size = zmq_msg_size(&message)
                if size == 0 {
                    received.frames.append([])
                } else {
                    let data = zmq_msg_data(&message)!.assumingMemoryBound(to: UInt8.self)
                    received.frames.append(Array(UnsafeBufferPointer(start: data, count: size)))
                }
            } else {
                received.droppedFrames += 1
            }
        } while zmq_msg_more(&message) != 0
        return received
    }

    // MARK: - Options

    /// Sets an integer option.
    public func set(_ option: SocketOption<Int32>, _ value: Int32) throws(ZeroMQError) {
        let handle = try open("zmq_setsockopt")
        var value = value
        try zmqCheck("zmq_setsockopt", detail: "\(option.name) = \(value)") {
            zmq_setsockopt(handle, option.code, &value, MemoryLayout<Int32>.size)
        }
    }

    /// Sets a 64-bit integer option.
    public func set(_ option: SocketOption<Int64>, _ value: Int64) throws(ZeroMQError) {
        let handle = try open("zmq_setsockopt")
        var value = value
        try zmqCheck("zmq_setsockopt", detail: "\(option.name) = \(value)") {
            zmq_setsockopt(handle, option.code, &value, MemoryLayout<Int64>.size)
        }
    }

    /// Sets a binary option (a subscription prefix, a routing id, a 32-byte CURVE key).
    public func set(_ option: SocketOption<[UInt8]>, _ value: [UInt8]) throws(ZeroMQError) {
        let handle = try open("zmq_setsockopt")
        try zmqCheck("zmq_setsockopt", detail: "\(option.name) (\(value.count) bytes)") {
            value.withUnsafeBytes { zmq_setsockopt(handle, option.code, $0.baseAddress, $0.count) }
        }
    }

    /// Sets a text option (a ZAP domain).
    public func set(_ option: SocketOption<[UInt8]>, _ value: String) throws(ZeroMQError) {
        try set(option, Array(value.utf8))
    }

    /// Reads an integer option.
    public func get(_ option: SocketOption<Int32>) throws(ZeroMQError) -> Int32 {
        let handle = try open("zmq_getsockopt")
        var value: Int32 = 0
        var size = MemoryLayout<Int32>.size
        try zmqCheck("zmq_getsockopt", detail: option.name) { zmq_getsockopt(handle, option.code, &value, &size) }
        return value
    }

    /// Reads a 64-bit integer option.
    public func get(_ option: SocketOption<Int64>) throws(ZeroMQError) -> Int64 {
        let handle = try open("zmq_getsockopt")
        var value: Int64 = 0
        var size = MemoryLayout<Int64>.size
        try zmqCheck("zmq_getsockopt", detail: option.name) { zmq_getsockopt(handle, option.code, &value, &size) }
        return value
    }

    /// Reads a binary option of at most 256 bytes.
    public func get(_ option: SocketOption<[UInt8]>) throws(ZeroMQError) -> [UInt8] {
        let handle = try open("zmq_getsockopt")
        var buffer = [UInt8](repeating: 0, count: 256)
        var size = buffer.count
        try zmqCheck("zmq_getsockopt", detail: option.name) {
            buffer.withUnsafeMutableBytes { zmq_getsockopt(handle, option.code, $0.baseAddress, &size) }
        }
        return Array(buffer.prefix(size))
    }

    /// Subscribes a SUB socket to messages whose first part starts with `prefix`.
    public func subscribe(_ prefix: [UInt8]) throws(ZeroMQError) {
        try set(.subscribe, prefix)
    }

    /// Takes back one subscription of a SUB socket to `prefix`.
    public func unsubscribe(_ prefix: [UInt8]) throws(ZeroMQError) {
        try set(.unsubscribe, prefix)
    }

    /// The address libzmq polls this socket by; used by ``Poller``.
    var pollHandle: UnsafeMutableRawPointer? { handle }
}

/// A socket option and the type of its value.
public struct SocketOption<Value>: Sendable {
    let code: Int32
    let name: String

    init(_ code: Int32, _ name: String) {
        self.code = code
        self.name = name
    }
}

extension SocketOption where Value == Int32 {
    /// Milliseconds to keep unsent messages after close; -1 forever, 0 drop them (the default here).
    public static let linger = SocketOption(ZMQ_LINGER, "ZMQ_LINGER")
    /// Messages queued for sending before sends block or drop.
    public static let sendHighWaterMark = SocketOption(ZMQ_SNDHWM, "ZMQ_SNDHWM")
    /// Messages queued on receipt before the peer is pushed back or messages dropped.
    public static let receiveHighWaterMark = SocketOption(ZMQ_RCVHWM, "ZMQ_RCVHWM")
    /// Milliseconds a blocking receive waits before returning nothing; -1 forever.
    public static let receiveTimeout = SocketOption(ZMQ_RCVTIMEO, "ZMQ_RCVTIMEO")
    /// Milliseconds a blocking send waits before giving up; -1 forever.
    public static let sendTimeout = SocketOption(ZMQ_SNDTIMEO, "ZMQ_SNDTIMEO")
    /// Milliseconds between ZMTP heartbeat pings; 0 turns them off.
    public static let heartbeatInterval = SocketOption(ZMQ_HEARTBEAT_IVL, "ZMQ_HEARTBEAT_IVL")
    /// Milliseconds to wait for a ping's answer before the connection is dropped.
    public static let heartbeatTimeout = SocketOption(ZMQ_HEARTBEAT_TIMEOUT, "ZMQ_HEARTBEAT_TIMEOUT")
    /// Milliseconds the peer should wait for our pings before it drops us.
    public static let heartbeatTimeToLive = SocketOption(ZMQ_HEARTBEAT_TTL, "ZMQ_HEARTBEAT_TTL")
    /// Milliseconds a new connection may take to finish its handshake (CURVE included).
    public static let handshakeInterval = SocketOption(ZMQ_HANDSHAKE_IVL, "ZMQ_HANDSHAKE_IVL")
    /// 1 makes this socket the CURVE server side.
    public static let curveServer = SocketOption(ZMQ_CURVE_SERVER, "ZMQ_CURVE_SERVER")
    /// 1 makes the ZAP handler mandatory: with no handler, connections are refused (fail closed).
    public static let zapEnforceDomain = SocketOption(ZMQ_ZAP_ENFORCE_DOMAIN, "ZMQ_ZAP_ENFORCE_DOMAIN")
    /// 1 makes a ROUTER fail with `EHOSTUNREACH` for an unknown peer instead of dropping silently.
    public static let routerMandatory = SocketOption(ZMQ_ROUTER_MANDATORY, "ZMQ_ROUTER_MANDATORY")
    /// 1 queues messages only to completed connections.
    public static let immediate = SocketOption(ZMQ_IMMEDIATE, "ZMQ_IMMEDIATE")
    /// 1 if the last part received has more parts after it.
    public static let receiveMore = SocketOption(ZMQ_RCVMORE, "ZMQ_RCVMORE")
    /// 1 makes an XPUB pass every subscription to the application and apply only those it sets again with
    /// ``SocketOption/subscribe`` (for the peer of the subscription last received).
    public static let manualSubscriptions = SocketOption(ZMQ_XPUB_MANUAL, "ZMQ_XPUB_MANUAL")
    /// `ZMQ_POLLIN` / `ZMQ_POLLOUT` bits of what the socket can do now.
    public static let events = SocketOption(ZMQ_EVENTS, "ZMQ_EVENTS")
}

extension SocketOption where Value == Int64 {
    /// The largest message part accepted, in bytes; a peer sending more is disconnected. -1: no limit.
    public static let maximumMessageSize = SocketOption(ZMQ_MAXMSGSIZE, "ZMQ_MAXMSGSIZE")
}

extension SocketOption where Value == [UInt8] {
    /// A SUB socket's prefix filter: messages whose first part starts with it are delivered.
    public static let subscribe = SocketOption(ZMQ_SUBSCRIBE, "ZMQ_SUBSCRIBE")
    /// Removes a prefix filter set with ``subscribe``.
    public static let unsubscribe = SocketOption(ZMQ_UNSUBSCRIBE, "ZMQ_UNSUBSCRIBE")
    /// The identity a ROUTER peer sees for this socket (1 to 255 bytes, not starting with 0).
    public static let routingID = SocketOption(ZMQ_ROUTING_ID, "ZMQ_ROUTING_ID")
    /// This socket's long-term CURVE public key, 32 bytes.
    public static let curvePublicKey = SocketOption(ZMQ_CURVE_PUBLICKEY, "ZMQ_CURVE_PUBLICKEY")
    /// This socket's long-term CURVE secret key, 32 bytes.
    public static let curveSecretKey = SocketOption(ZMQ_CURVE_SECRETKEY, "ZMQ_CURVE_SECRETKEY")
    /// On a CURVE client, the server's public key, 32 bytes.
    public static let curveServerKey = SocketOption(ZMQ_CURVE_SERVERKEY, "ZMQ_CURVE_SERVERKEY")
    /// The ZAP domain sent to the authentication handler.
    public static let zapDomain = SocketOption(ZMQ_ZAP_DOMAIN, "ZMQ_ZAP_DOMAIN")
    /// The endpoint last bound, NUL-terminated.
    public static let lastEndpoint = SocketOption(ZMQ_LAST_ENDPOINT, "ZMQ_LAST_ENDPOINT")
}

/// A part lent to libzmq (``Socket/send(_:wait:)``): the array whose bytes a message points at, held until libzmq
/// lets the message go.
private final class LentPart: Sendable {
    let bytes: [UInt8]
    /// The lending socket's count of the parts it has lent and libzmq has not let go.
    let outstanding: LentCount

    init(_ bytes: [UInt8], counted outstanding: LentCount) {
        self.bytes = bytes
        self.outstanding = outstanding
        outstanding.value.add(1, ordering: .relaxed)
    }

    deinit {
        outstanding.value.subtract(1, ordering: .relaxed)
    }
}

/// A socket's count of its parts lent to libzmq and not let go yet.
final class LentCount: Sendable {
    let value = Atomic<Int>(0)
}
