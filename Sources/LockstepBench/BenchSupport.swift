import Foundation
import LockstepTool

#if canImport(Glibc)
import Glibc
#endif

/// Nanoseconds on CLOCK_MONOTONIC: one clock for every process on the machine, so a time taken in one
/// process can be subtracted from a time taken in another (dispatch in one, applied in a replica).
func monotonicNanos() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

/// A set of latency samples, in nanoseconds.
struct Latencies: Codable, Sendable {
    private(set) var sorted: [UInt64]

    init<S: Sequence>(_ samples: S) where S.Element == UInt64 {
        sorted = samples.sorted()
    }

    var count: Int { sorted.count }

    /// The `q`-quantile (0...1) by the nearest-rank method; 0 when there are no samples.
    func quantile(_ q: Double) -> UInt64 {
        guard !sorted.isEmpty else { return 0 }
        let rank = Int((q * Double(sorted.count)).rounded(.up))
        return sorted[min(max(rank, 1), sorted.count) - 1]
    }

    var p50: Microseconds { Microseconds(nanoseconds: quantile(0.5)) }
    var p99: Microseconds { Microseconds(nanoseconds: quantile(0.99)) }
}

/// A duration in microseconds, printed with one decimal.
struct Microseconds: Codable, Sendable, Comparable, CustomStringConvertible {
    var value: Double

    init(_ value: Double) { self.value = value }
    init(nanoseconds: UInt64) { value = Double(nanoseconds) / 1_000 }

    static func < (a: Self, b: Self) -> Bool { a.value < b.value }
    static func + (a: Self, b: Self) -> Self { Self(a.value + b.value) }

    var description: String {
        value >= 10_000 ? String(format: "%.1f ms", value / 1_000) : String(format: "%.1f µs", value)
    }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode((value * 10).rounded() / 10)
    }

    init(from decoder: any Decoder) throws {
        value = try decoder.singleValueContainer().decode(Double.self)
    }
}

/// `numerator / denominator` rounded to two decimals, or nil when there is nothing to divide by.
func ratio(_ numerator: Double, _ denominator: Double) -> Double? {
    guard denominator > 0, numerator.isFinite else { return nil }
    return (numerator / denominator * 100).rounded() / 100
}

/// A rate rounded to a whole number per second.
func perSecond(_ count: Int, nanoseconds: UInt64) -> Double {
    guard nanoseconds > 0 else { return 0 }
    return (Double(count) / (Double(nanoseconds) / 1e9)).rounded()
}

/// Bytes as MiB with one decimal.
func mebibytes(_ bytes: Int) -> String {
    String(format: "%.1f MiB", Double(bytes) / 1_048_576)
}

/// What a bench worker prints as its last line: everything it counted and timed.
struct WorkerReport: Codable, Sendable {
    /// Operations completed inside the measured window.
    var count = 0
    /// Nanoseconds the measured window lasted.
    var elapsed: UInt64 = 0
    /// One round-trip time per operation, in nanoseconds (optimistic workers: dispatch → the optimistic state
    /// showed it).
    var latencies: [UInt64] = []
    /// Optimistic workers: dispatch → the handle resolved (the confirmed state held it), per dispatch, in
    /// nanoseconds; `confirmed[i]` and `latencies[i]` are the same dispatch.
    var confirmed: [UInt64] = []
    /// Dispatch workers with `--record-seqs`: the seq each dispatch got and when (monotonic ns) it was sent;
    /// `sent[i]` and `latencies[i]` are the same dispatch, so its acknowledgement came at `at + latencies[i]`.
    var sent: [Sample] = []
    /// Replica workers: a seq and when (monotonic ns) the replica's state reached it.
    var applied: [Sample] = []
    /// Subscriber workers: when (monotonic ns) the last message arrived.
    var finishedAt: UInt64 = 0
    /// Peak resident memory of the worker, in bytes.
    var peakResident = 0
    /// Replica workers: the replica's seq and state size at the end.
    var seq: UInt64 = 0
    var stateBytes = 0
    var resyncs = 0
    var repairs = 0
    /// CPU nanoseconds the process used in the measured window (replica workers: while it applied
    /// `eventsApplied` events).
    var cpuNanos: UInt64 = 0
    var eventsApplied: UInt64 = 0
    /// Failed operations, and the first failure's message.
    var failures = 0
    var firstFailure: String?

    struct Sample: Codable, Sendable {
        var seq: UInt64
        var at: UInt64
    }
}

extension WorkerReport {
    /// Counts one operation that began at `start`: timed when it succeeded, a failure (not timed) when it threw.
    /// Returns when it ended, where the next one begins.
    mutating func timed(from start: UInt64, _ result: Result<Void, any Error>) -> UInt64 {
        let done = monotonicNanos()
        switch result {
        case .success:
            latencies.append(done - start)
            count += 1
        case let .failure(error):
            failures += 1
            firstFailure = firstFailure ?? "\(error)"
        }
        return done
    }
}

/// A minimal Redis client (RESP2) over a unix socket, for the comparison with Redis Streams: one blocking
/// request at a time, as the Lockstep clients it is compared with.
final class RedisConnection {
    private let descriptor: Int32
    private var buffer: [UInt8] = []
    private var position = 0

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// A reply: simple string, error, integer, bulk string (nil = null) or array.
    enum Reply: Equatable {
        case simple(String)
        case error(String)
        case integer(Int)
        case bulk([UInt8]?)
        case array([Reply])
    }

    init(path: String) throws {
        descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw Failure(description: "socket(AF_UNIX): errno \(errno)") }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
            close(descriptor)
            throw Failure(description: "unix socket path too long: \(path)")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard connected == 0 else {
            let code = errno
            close(descriptor)
            throw Failure(description: "connect(\(path)): \(String(cString: strerror(code)))")
        }
    }

    deinit { close(descriptor) }

    /// Sends one command and reads its reply.
    func call(_ arguments: [[UInt8]]) throws -> Reply {
        try pipeline(arguments, times: 1)[0]
    }

    /// Sends the same command `times` times in one write, then reads their replies, in order.
    func pipeline(_ arguments: [[UInt8]], times: Int) throws -> [Reply] {
        var command = Array("*\(arguments.count)\r\n".utf8)
        for argument in arguments {
            command += Array("$\(argument.count)\r\n".utf8)
            command += argument
            command += [13, 10]
        }
        let request = Array([[UInt8]](repeating: command, count: times).joined())
        var sent = 0
        while sent < request.count {
            let count = request[sent...].withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
            guard count > 0 else {
                if count < 0 && errno == EINTR { continue }
                throw Failure(description: "write to redis: errno \(errno)")
            }
            sent += count
        }
        return try (0..<times).map { _ in try reply() }
    }

    func call(_ arguments: String...) throws -> Reply {
        try call(arguments.map { Array($0.utf8) })
    }

    private func reply() throws -> Reply {
        let line = try readLine()
        guard let kind = line.first else { throw Failure(description: "redis sent an empty line") }
        let rest = String(decoding: line.dropFirst(), as: UTF8.self)
        switch kind {
        case UInt8(ascii: "+"): return .simple(rest)
        case UInt8(ascii: "-"): return .error(rest)
        case UInt8(ascii: ":"):
            guard let value = Int(rest) else { throw Failure(description: "redis sent integer '\(rest)'") }
            return .integer(value)
        case UInt8(ascii: "$"):
            guard let length = Int(rest) else { throw Failure(description: "redis sent bulk length '\(rest)'") }
            guard length >= 0 else { return .bulk(nil) }
            let body = try readExactly(length + 2)
            return .bulk(Array(body.dropLast(2)))
        case UInt8(ascii: "*"):
            guard let count = Int(rest) else { throw Failure(description: "redis sent array length '\(rest)'") }
            return .array(try (0..<max(count, 0)).map { _ in try reply() })
        default:
            throw Failure(description: "redis sent a reply starting with byte \(kind)")
        }
    }

    private func readLine() throws -> ArraySlice<UInt8> {
        while true {
            if let end = buffer[position...].firstIndex(of: 10), end > position, buffer[end - 1] == 13 {
                defer { position = end + 1 }
                return buffer[position..<(end - 1)]
            }
            try fill()
        }
    }

    private func readExactly(_ count: Int) throws -> ArraySlice<UInt8> {
        while buffer.count - position < count { try fill() }
        defer { position += count }
        return buffer[position..<(position + count)]
    }

    private func fill() throws {
        if position > 0 {
            buffer.removeFirst(position)
            position = 0
        }
        var chunk = [UInt8](repeating: 0, count: 4_096)
        let count = chunk.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
        if count < 0 && errno == EINTR { return }
        guard count > 0 else { throw Failure(description: "redis closed the connection") }
        buffer += chunk[..<count]
    }
}

/// Why the bench could not finish; names the process or step and where its log is.
package struct BenchFailure: Error, CustomStringConvertible {
    package var description: String
    package init(_ description: String) { self.description = description }
}
