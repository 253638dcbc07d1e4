import CZeroMQ

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

/// Names the calling thread — a loop thread that owns sockets — as `ps -L`, `top -H`, `perf` and /proc show it
/// (`lockstepd loop`); Linux keeps the first 15 bytes. Foundation's `Thread.name` does not reach the kernel.
public func nameCurrentThread(_ name: String) {
    let bytes = Array(name.utf8.prefix(15)) + [0]
    bytes.withUnsafeBufferPointer { buffer in
        buffer.withMemoryRebound(to: CChar.self) { _ = lockstep_name_current_thread($0.baseAddress!) }
    }
}
