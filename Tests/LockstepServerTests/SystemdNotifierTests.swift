import Foundation
import LockstepServer
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct SystemdNotifierTests {
    /// A datagram socket bound where systemd's would be, at an abstract or a filesystem address.
    final class FakeSystemd {
        let descriptor: Int32
        let name: String

        init(abstract: Bool) throws {
            descriptor = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
            let path = abstract ? "@lockstep-notify-\(UUID())" : NSTemporaryDirectory() + "notify-\(UUID())"
            name = path
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            var bytes = Array(path.utf8)
            if abstract { bytes[0] = 0 }
            withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
            let length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count)
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, length) }
            }
            try #require(bound == 0, "bind \(path): errno \(errno)")
            var timeout = timeval(tv_sec: 5, tv_usec: 0)
            setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        }

        func receive() -> String? {
            var buffer = [UInt8](repeating: 0, count: 4096)
            let count = recv(descriptor, &buffer, buffer.count, 0)
            return count < 0 ? nil : String(decoding: buffer.prefix(count), as: UTF8.self)
        }

        deinit {
            close(descriptor)
            if !name.hasPrefix("@") { unlink(name) }
        }
    }

    @Test(arguments: [true, false])
    func sendsTheStateToTheNotifySocket(abstract: Bool) throws {
        let systemd = try FakeSystemd(abstract: abstract)
        let notifier = SystemdNotifier(environment: ["NOTIFY_SOCKET": systemd.name])
        #expect(notifier.notify("READY=1\nSTATUS=serving 4 stores"))
        #expect(systemd.receive() == "READY=1\nSTATUS=serving 4 stores")
        #expect(notifier.notify("STOPPING=1"))
        #expect(systemd.receive() == "STOPPING=1")
    }

    @Test func withoutSystemdNothingIsSent() {
        let notifier = SystemdNotifier(environment: [:])
        #expect(notifier.socketPath == nil)
        #expect(!notifier.notify("READY=1"))
        #expect(notifier.watchdogInterval == nil)
    }

    @Test func theWatchdogIntervalIsHalfOfWatchdogUsecForThisProcessOnly() {
        let ours = SystemdNotifier(environment: ["WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "\(getpid())"])
        #expect(ours.watchdogInterval == .seconds(2))
        let anyProcess = SystemdNotifier(environment: ["WATCHDOG_USEC": "1000000"])
        #expect(anyProcess.watchdogInterval == .milliseconds(500))
        let another = SystemdNotifier(environment: ["WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"])
        #expect(another.watchdogInterval == nil)
    }
}
