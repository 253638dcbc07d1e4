#if canImport(Glibc)
import Glibc
#endif

/// A pipe that other threads write to, to wake the loop thread out of its poll.
public final class Wakeup: Sendable {
    /// The end the loop polls.
    public let descriptor: Int32
    /// The end that wakes it; written from other threads and from the SIGHUP handler.
    public let writeDescriptor: Int32

    /// A fresh pipe, both ends non-blocking and closed on exec; closed when this object goes away.
    public init() throws(ZeroMQError) {
        var ends: [Int32] = [-1, -1]
        guard pipe(&ends) == 0 else { throw ZeroMQError(errno: errno, function: "pipe", detail: "for a wake-up pipe") }
        for end in ends {
            _ = fcntl(end, F_SETFL, fcntl(end, F_GETFL) | O_NONBLOCK)
            _ = fcntl(end, F_SETFD, FD_CLOEXEC)
        }
        descriptor = ends[0]
        writeDescriptor = ends[1]
    }

    /// Makes the descriptor readable; callable from any thread. A full pipe is already readable.
    public func signal() {
        var byte: UInt8 = 1
        _ = write(writeDescriptor, &byte, 1)
    }

    /// Empties it; the loop thread calls this after it woke.
    public func drain() {
        var buffer = [UInt8](repeating: 0, count: 64)
        while read(descriptor, &buffer, buffer.count) > 0 {}
    }

    deinit {
        close(descriptor)
        close(writeDescriptor)
    }
}
