import CZeroMQ

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A libzmq call failed: which function, with which `errno`, and libzmq's words for it.
public struct ZeroMQError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The `errno` value libzmq reported (`zmq_errno()`), or `EPROTO` for checks of our own.
    public let errno: Int32
    /// The C function that failed, such as `zmq_connect`.
    public let function: String
    /// What was being done, with which value: an endpoint, an option, a limit.
    public let detail: String

    /// An error of `function` with `errno`, and what was being done.
    public init(errno: Int32, function: String, detail: String = "") {
        self.errno = errno
        self.function = function
        self.detail = detail
    }

    /// libzmq's text for ``errno``.
    public var message: String { String(cString: zmq_strerror(errno)) }

    /// The context was shut down while the call waited: the owner should close its sockets and stop.
    public var isContextTerminated: Bool { errno == ETERM }

    /// `FUNCTION failed for DETAIL: MESSAGE (errno N)`, the detail left out when there is none.
    public var description: String {
        detail.isEmpty
            ? "\(function) failed: \(message) (errno \(errno))"
            : "\(function) failed for \(detail): \(message) (errno \(errno))"
    }
}

/// The result of a call that may find nothing to do: would-block is a value, not an error.
enum CallResult {
    case done(Int32)
    case wouldBlock
}

/// Every libzmq call goes through here: `EINTR` is retried, `EAGAIN` comes back as ``CallResult/wouldBlock``,
/// anything else throws a ``ZeroMQError`` naming the function.
@inline(__always)
func zmqCall(
    _ function: StaticString,
    detail: @autoclosure () -> String = "",
    _ body: () -> Int32
)
    throws(ZeroMQError) -> CallResult
{
    while true {
        let result = body()
        if result >= 0 { return .done(result) }
        let error = zmq_errno()
        switch error {
        case EINTR: continue
        case EAGAIN: return .wouldBlock
        default: throw ZeroMQError(errno: error, function: "\(function)", detail: detail())
        }
    }
}

/// For calls where would-block cannot happen or is itself a failure.
@inline(__always)
@discardableResult
func zmqCheck(
    _ function: StaticString,
    detail: @autoclosure () -> String = "",
    _ body: () -> Int32
)
    throws(ZeroMQError) -> Int32
{
    switch try zmqCall(function, detail: detail(), body) {
    case let .done(result): return result
    case .wouldBlock: throw ZeroMQError(errno: EAGAIN, function: "\(function)", detail: detail())
    }
}
