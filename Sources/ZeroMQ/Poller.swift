import CZeroMQ

/// What to wait for on a socket or file descriptor.
public struct PollEvents: OptionSet, Hashable, Sendable {
    /// The `events` bits of a `zmq_pollitem_t`.
    public let rawValue: Int16
    /// The events with these bits.
    public init(rawValue: Int16) { self.rawValue = rawValue }

    /// A message can be received (or the descriptor read) without blocking.
    public static let readable = PollEvents(rawValue: Int16(ZMQ_POLLIN))
    /// A message can be sent without blocking.
    public static let writable = PollEvents(rawValue: Int16(ZMQ_POLLOUT))
}

/// Waits on several sockets and file descriptors at once, for the thread that owns them.
public struct Poller {
    /// One thing to wait on.
    public enum Item {
        /// A libzmq socket, owned by the polling thread.
        case socket(Socket, PollEvents)
        /// A plain descriptor, such as an eventfd other threads use to wake the owner.
        case fileDescriptor(Int32, PollEvents)
    }

    private var items: [Item]

    /// A poller over `items`; ``poll(timeout:)`` answers for them in this order.
    public init(_ items: [Item]) {
        self.items = items
    }

    /// Waits until one item is ready or `timeout` passes (`nil`: forever) and returns what each item can do,
    /// in the order given; all empty on timeout.
    public func poll(timeout: Duration?) throws(ZeroMQError) -> [PollEvents] {
        var pollItems = [zmq_pollitem_t]()
        pollItems.reserveCapacity(items.count)
        for item in items {
            switch item {
            case let .socket(socket, events):
                guard let handle = socket.pollHandle else {
                    throw ZeroMQError(errno: ENOTSOCK, function: "zmq_poll", detail: "a closed \(socket.type) socket")
                }
                pollItems.append(zmq_pollitem_t(socket: handle, fd: -1, events: events.rawValue, revents: 0))
            case let .fileDescriptor(descriptor, events):
                pollItems.append(zmq_pollitem_t(socket: nil, fd: descriptor, events: events.rawValue, revents: 0))
            }
        }
        let milliseconds = timeout.map(\.roundedUpMilliseconds) ?? -1
        let count = pollItems.count
        let result = try pollItems.withUnsafeMutableBufferPointer { buffer in
            Result { () throws(ZeroMQError) in
                try zmqCall("zmq_poll", detail: "\(count) items") {
                    zmq_poll(buffer.baseAddress, Int32(count), milliseconds)
                }
            }
        }.get()
        if case .wouldBlock = result { return Array(repeating: [], count: count) }
        return pollItems.map { PollEvents(rawValue: $0.revents) }
    }
}

extension Duration {
    /// The whole milliseconds libzmq waits for this duration, rounded up (a wait is never cut short), 0 for none
    /// or less, at most `Int32.max`.
    var roundedUpMilliseconds: Int {
        let (seconds, attoseconds) = components
        guard seconds < Int64(Int32.max / 1000) else { return Int(Int32.max) }
        return max(0, Int(seconds) * 1000 + Int((attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000))
    }
}
