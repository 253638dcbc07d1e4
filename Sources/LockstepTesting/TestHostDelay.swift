import Foundation
import Lockstep

#if canImport(Glibc)
import Glibc
#endif

/// Delay, jitter and reordering on every link between test hosts, made without the kernel's netem (which a kernel
/// built without `CONFIG_NET_SCH_NETEM`, like this project's CI machine's, lacks): each host's outgoing packets to
/// the other hosts go to a netfilter queue (an iptables `NFQUEUE` rule in the host's namespace), and a thread here
/// holds each packet for `delay` ± `jitter` (uniform) before letting the kernel send it on — in the order their
/// times come due, not the order they came, so packets sent close together are reordered. `lossPercent` of them
/// are dropped instead. The packets are the real ones, on the real stack: TCP sees late, reordered and missing
/// segments and acts on them as it would on a slow network.
///
/// ```swift
/// let delay = try PacketDelay(hosts, on: ["db", "a", "b"], delay: .milliseconds(50), jitter: .milliseconds(40))
/// // … the load runs through it …
/// let figures = delay.stop()   // packets held, dropped
/// ```
///
/// Needs root, iptables (Debian's `iptables`; `make deps` installs it) and `CONFIG_NETFILTER_NETLINK_QUEUE` with the
/// xtables `NFQUEUE` target. The queue speaks nfnetlink directly (no libnetfilter_queue): each packet's metadata
/// only, a verdict per packet. While a queue has no reader, the kernel drops what reaches it, so the rule is added
/// only once the thread reads, and removed before it stops.
// Shared between its threads and the caller without the compiler's check, and why that is sound: every stored
// property is a `let`; the one that changes, `shared`, is a `LockedValue`, read and written only inside
// `withLockedValue`; the queue threads read only the immutable settings and their own socket (handed to each
// thread, never shared); `hosts`, a class the compiler cannot check, is used only by the caller's calls (`init`,
// `stop`, `deinit`), never by a queue thread.
public final class PacketDelay: @unchecked Sendable {
    /// What the threads and the caller share.
    private struct Shared {
        var stopping = false
        var running = 0
        var held = 0
        var dropped = 0
        var failure: String?
    }

    private let hosts: TestHosts
    private let names: [String]
    private let delay: Duration
    private let jitter: Duration
    private let lossPercent: Int
    private let shared = LockedValue(Shared())
    /// The netfilter queue each host's rule sends to (namespaces do not share queues; one number serves all).
    private static let queue: UInt16 = 7

    /// Starts delaying every packet that hosts `names` send to any test host; returns once every host's queue reads
    /// and its rule is in place.
    ///
    /// - Throws: ``TestHostsUnavailable`` when iptables is missing, ``TestHostsError`` when a queue or a rule cannot
    ///   be set up (what was set up is removed first).
    public init(
        _ hosts: TestHosts,
        on names: [String],
        delay: Duration,
        jitter: Duration = .zero,
        lossPercent: Int = 0,
        seed: UInt64 = .random(in: 0...UInt64.max)
    ) throws {
        precondition(jitter <= delay, "a jitter of \(jitter) would make delays below zero (delay \(delay))")
        precondition((0..<100).contains(lossPercent), "drop 0 to 99 % of the packets, not \(lossPercent)")
        self.hosts = hosts
        self.names = names
        self.delay = delay
        self.jitter = jitter
        self.lossPercent = lossPercent
        let iptables = try Self.iptables()
        var started: [String] = []
        do {
            for (index, name) in names.enumerated() {
                let socket = try hosts.within(name) { try QueueSocket(queue: Self.queue) }
                shared.withLockedValue { $0.running += 1 }
                let random = SplitMix64(seed: seed &+ UInt64(index))
                Thread { [self] in
                    defer { shared.withLockedValue { $0.running -= 1 } }
                    run(socket, random: random)
                }.start()
                try hosts.ip(["netns", "exec", hosts[name].namespace, iptables] + rule("-A"))
                started.append(name)
            }
        } catch {
            for name in started {
                _ = try? hosts.ip(["netns", "exec", hosts[name].namespace, iptables] + rule("-D"))
            }
            shared.withLockedValue { $0.stopping = true }
            throw error
        }
    }

    deinit { _ = stop() }

    /// The iptables rule, added (`-A`) or deleted (`-D`): what the host sends into the test hosts' subnet goes to
    /// the queue.
    private func rule(_ verb: String) -> [String] {
        [verb, "OUTPUT", "-d", hosts.subnet, "-j", "NFQUEUE", "--queue-num", "\(Self.queue)"]
    }

    /// Removes the rules, lets every held packet go when its time comes, and stops the threads. Harmless twice.
    /// Returns how many packets were held and how many dropped, and the first failure a thread met, if any.
    @discardableResult
    public func stop() -> (held: Int, dropped: Int, failure: String?) {
        if !shared.withLockedValue({ $0.stopping }), let iptables = try? Self.iptables() {
            for name in names {
                _ = try? hosts.ip(["netns", "exec", hosts[name].namespace, iptables] + rule("-D"))
            }
        }
        shared.withLockedValue { $0.stopping = true }
        let deadline = ContinuousClock.now + delay + jitter + .seconds(5)
        while shared.withLockedValue({ $0.running > 0 }), ContinuousClock.now < deadline {
            Thread.sleep(forTimeInterval: 0.01)
        }
        return shared.withLockedValue { ($0.held, $0.dropped, $0.failure) }
    }

    /// One host's queue: read what comes, answer each packet when its time is due; once stopping, until nothing is
    /// held.
    private func run(_ socket: QueueSocket, random: SplitMix64) {
        var random = random
        var due: [(at: ContinuousClock.Instant, id: UInt32, accept: Bool)] = []
        defer { socket.close() }
        while true {
            let now = ContinuousClock.now
            var ready = 0
            while ready < due.count, due[ready].at <= now { ready += 1 }
            for packet in due.prefix(ready) {
                if let failure = socket.verdict(packet.id, accept: packet.accept) {
                    shared.withLockedValue { $0.failure = $0.failure ?? failure }
                }
            }
            due.removeFirst(ready)
            let stopping = shared.withLockedValue { $0.stopping }
            if stopping, due.isEmpty { return }
            let wait = due.first.map { max($0.at - .now, .zero) } ?? .milliseconds(stopping ? 10 : 100)
            let ids: [UInt32]
            switch socket.receive(waiting: wait) {
            case let .success(received): ids = received
            case let .failure(failure):
                shared.withLockedValue { $0.failure = $0.failure ?? failure.reason }
                continue
            }
            guard !ids.isEmpty else { continue }
            let arrived = ContinuousClock.now
            var dropped = 0
            for id in ids {
                let span = Int64(jitter / .microseconds(1))
                let offset = span == 0 ? 0 : Int64.random(in: -span...span, using: &random)
                let accept = lossPercent == 0 || Int.random(in: 0..<100, using: &random) >= lossPercent
                if !accept { dropped += 1 }
                let at = arrived + delay + .microseconds(offset)
                let place = due.firstIndex { $0.at > at } ?? due.count
                due.insert((at, id, accept), at: place)
            }
            shared.withLockedValue {
                $0.held += ids.count
                $0.dropped += dropped
            }
        }
    }

    /// iptables' path, or ``TestHostsUnavailable`` naming the package.
    private static func iptables() throws -> String {
        guard
            let path = ["/usr/sbin/iptables", "/sbin/iptables", "/usr/bin/iptables"].first(
                where: FileManager.default.isExecutableFile
            )
        else {
            throw TestHostsUnavailable(
                reason: "no 'iptables' in /usr/sbin, /sbin or /usr/bin; install iptables (make deps does)"
            )
        }
        return path
    }
}

/// A netfilter queue's nfnetlink socket (`NETLINK_NETFILTER`, subsystem `NFNL_SUBSYS_QUEUE`), bound to one queue,
/// copying each packet's metadata only. Every system call on it is here.
private struct QueueSocket {
    struct Failure: Error { var reason: String }

    let descriptor: Int32
    let queue: UInt16
    private static let packetMessage: UInt16 = 3 << 8 | 0  // NFQNL_MSG_PACKET
    private static let verdictMessage: UInt16 = 3 << 8 | 1  // NFQNL_MSG_VERDICT
    private static let configMessage: UInt16 = 3 << 8 | 2  // NFQNL_MSG_CONFIG

    /// Opens the socket in the calling thread's network namespace and binds `queue` to it.
    init(queue: UInt16) throws {
        self.queue = queue
        descriptor = socket(AF_NETLINK, Int32(SOCK_RAW.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 12)  // NETLINK_NETFILTER
        guard descriptor >= 0 else { throw Self.failed("socket(AF_NETLINK, NETLINK_NETFILTER)") }
        var size: Int32 = 8 << 20
        // SO_RCVBUFFORCE (root): a burst of queued packets must not overflow the socket, or their verdicts never come.
        _ = setsockopt(descriptor, SOL_SOCKET, SO_RCVBUFFORCE, &size, socklen_t(MemoryLayout<Int32>.size))
        do {
            // NFQA_CFG_CMD: NFQNL_CFG_CMD_BIND; NFQA_CFG_PARAMS: copy NFQNL_COPY_META; NFQA_CFG_QUEUE_MAXLEN.
            try configure([(1, [1, 0, 0, 0])])
            try configure([(2, Self.bigEndian(UInt32(0)) + [1]), (3, Self.bigEndian(UInt32(16_384)))])
        } catch {
            Glibc.close(descriptor)
            throw error
        }
    }

    func close() { Glibc.close(descriptor) }

    /// Sends a configuration message and reads its acknowledgement.
    private func configure(_ attributes: [(UInt16, [UInt8])]) throws {
        try send(Self.message(Self.configMessage, flags: 1 | 4, queue: queue, attributes))  // NLM_F_REQUEST | NLM_F_ACK
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
        guard count >= 20, Self.little16(buffer, 4) == 2 else {  // NLMSG_ERROR
            throw Failure(reason: "netfilter queue \(queue): no acknowledgement to its configuration")
        }
        let error = Int32(bitPattern: Self.little32(buffer, 16))
        guard error == 0 else {
            throw Failure(
                reason: "netfilter queue \(queue): configuring it failed: \(String(cString: strerror(-error))) "
                    + "(is CONFIG_NETFILTER_NETLINK_QUEUE in the kernel, and this process root?)"
            )
        }
    }

    /// Lets packet `id` go on (`NF_ACCEPT`) or drops it (`NF_DROP`); a failure's reason, or `nil`.
    func verdict(_ id: UInt32, accept: Bool) -> String? {
        let header = Self.bigEndian(UInt32(accept ? 1 : 0)) + Self.bigEndian(id)  // NFQA_VERDICT_HDR
        do {
            try send(Self.message(Self.verdictMessage, flags: 1, queue: queue, [(2, header)]))
            return nil
        } catch {
            return error.reason
        }
    }

    /// The ids of the packets queued, waiting at most `timeout` for the first; empty when none came.
    func receive(waiting timeout: Duration) -> Result<[UInt32], Failure> {
        var poll = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
        let milliseconds = Int32(min(timeout / .milliseconds(1), 1_000).rounded(.up))
        guard Glibc.poll(&poll, 1, milliseconds) > 0 else { return .success([]) }
        var ids: [UInt32] = []
        var buffer = [UInt8](repeating: 0, count: 256 << 10)
        while true {
            let count = buffer.withUnsafeMutableBytes {
                recv(descriptor, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT))
            }
            if count < 0 {
                if errno == EAGAIN || errno == EWOULDBLOCK { break }
                return .failure(Self.failed("recv on netfilter queue \(queue)"))
            }
            var offset = 0
            while offset + 16 <= count {
                let length = Int(Self.little32(buffer, offset))
                guard length >= 16, offset + length <= count else { break }
                if Self.little16(buffer, offset + 4) == Self.packetMessage {
                    // nlmsghdr (16), nfgenmsg (4), then attributes; NFQA_PACKET_HDR (1) starts with the id.
                    var attribute = offset + 20
                    while attribute + 4 <= offset + length {
                        let size = Int(Self.little16(buffer, attribute))
                        guard size >= 4 else { break }
                        if Self.little16(buffer, attribute + 2) & 0x3fff == 1, size >= 8 {
                            ids.append(Self.big32(buffer, attribute + 4))
                        }
                        attribute += (size + 3) & ~3
                    }
                }
                offset += (length + 3) & ~3
            }
        }
        return .success(ids)
    }

    private func send(_ message: [UInt8]) throws(Failure) {
        let sent = message.withUnsafeBytes { Glibc.send(descriptor, $0.baseAddress, $0.count, 0) }
        guard sent == message.count else { throw Self.failed("send on netfilter queue \(queue)") }
    }

    /// An nfnetlink message of the queue subsystem: nlmsghdr, nfgenmsg (AF_UNSPEC, version 0, the queue), attributes.
    private static func message(
        _ type: UInt16,
        flags: UInt16,
        queue: UInt16,
        _ attributes: [(UInt16, [UInt8])]
    ) -> [UInt8] {
        var body: [UInt8] = [UInt8(AF_UNSPEC), 0] + bigEndian(queue)
        for (kind, data) in attributes {
            body += little(UInt16(4 + data.count)) + little(kind) + data
            body += [UInt8](repeating: 0, count: (4 - data.count % 4) % 4)
        }
        return little(UInt32(16 + body.count)) + little(type) + little(flags) + little(UInt32(0)) + little(UInt32(0))
            + body
    }

    private static func failed(_ call: String) -> Failure {
        Failure(reason: "\(call): \(String(cString: strerror(errno)))")
    }

    private static func little<T: FixedWidthInteger>(_ value: T) -> [UInt8] {
        withUnsafeBytes(of: value.littleEndian, Array.init)
    }

    private static func bigEndian<T: FixedWidthInteger>(_ value: T) -> [UInt8] {
        withUnsafeBytes(of: value.bigEndian, Array.init)
    }

    private static func little16(_ bytes: [UInt8], _ at: Int) -> UInt16 {
        UInt16(bytes[at]) | UInt16(bytes[at + 1]) << 8
    }

    private static func little32(_ bytes: [UInt8], _ at: Int) -> UInt32 {
        UInt32(little16(bytes, at)) | UInt32(little16(bytes, at + 2)) << 16
    }

    private static func big32(_ bytes: [UInt8], _ at: Int) -> UInt32 {
        bytes[at..<at + 4].reduce(0) { $0 << 8 | UInt32($1) }
    }
}
