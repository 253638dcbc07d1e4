#if canImport(Glibc)
import Glibc
#endif

/// A pipe that other threads write to, to wake the loop thread out of its poll.
final class Wakeup: Sendable {
    /// The end the loop polls.
    let descriptor: Int32
    /// The end that wakes it; written from other threads and from the SIGHUP handler.
    let writeDescriptor: Int32

    init() throws(ServerError) {
        var ends: [Int32] = [-1, -1]
        guard pipe(&ends) == 0 else { throw ServerError(code: .system, "pipe failed: errno \(errno)") }
        for end in ends {
            _ = fcntl(end, F_SETFL, fcntl(end, F_GETFL) | O_NONBLOCK)
            _ = fcntl(end, F_SETFD, FD_CLOEXEC)
        }
        descriptor = ends[0]
        writeDescriptor = ends[1]
    }

    /// Makes the descriptor readable; callable from any thread. A full pipe is already readable.
    func signal() {
        var byte: UInt8 = 1
        _ = write(writeDescriptor, &byte, 1)
    }

    /// Empties it; the loop thread calls this after it woke.
    func drain() {
        var buffer = [UInt8](repeating: 0, count: 64)
        while read(descriptor, &buffer, buffer.count) > 0 {}
    }

    deinit {
        close(descriptor)
        close(writeDescriptor)
    }
}

/// The daemon could not start or go on: what failed, and what to do.
public struct ServerError: Error, Hashable, Sendable, CustomStringConvertible {
    public struct Code: Hashable, Sendable, RawRepresentable {
        public var rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        /// A system call failed.
        public static let system = Code(rawValue: "system")
        /// An endpoint could not be bound.
        public static let bind = Code(rawValue: "bind")
        /// The journal could not be opened or recovered.
        public static let journal = Code(rawValue: "journal")
        /// The configuration cannot be served.
        public static let configuration = Code(rawValue: "configuration")
    }

    public var code: Code
    public var reason: String

    public init(code: Code, _ reason: String) {
        self.code = code
        self.reason = reason
    }

    public var description: String { reason }
}
