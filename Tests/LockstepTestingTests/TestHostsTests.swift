import Foundation
import LockstepTesting
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `TestHosts`: namespaces on one subnet that reach each other over tcp, gone at tear-down; leftovers of a killed
/// run; an `ip` failure that says what failed. Needs root: skipped (cancelled, with the reason) otherwise.
@Suite struct TestHostsTests {
    /// Every named network namespace.
    func namespaces() async throws -> [String] {
        let output = try await ChildProcess(executable: URL(fileURLWithPath: "/usr/sbin/ip"), ["netns", "list"])
            .finish(within: .seconds(10))
        return output.standardOutput.split(separator: "\n").compactMap {
            $0.split(separator: " ").first.map(String.init)
        }
    }

    @Test func hostsReachEachOtherOverTcpAndAreGoneAfterTearDown() async throws {
        guard let hosts = try await testHostsOrSkip(["x", "y"]) else { return }
        let names = [hosts.switchNamespace] + hosts.hosts.map(\.namespace)
        #expect(Set(try await namespaces()).isSuperset(of: names))
        #expect(hosts["x"].address.hasPrefix("10.231.") && hosts["x"].address.hasSuffix(".1"))
        #expect(hosts["y"].address == hosts["x"].address.dropLast() + "2")
        #expect(hosts.subnet == hosts["x"].address.dropLast() + "0/24")

        // y listens on its address; x connects to it and reads what y sent.
        let python = URL(fileURLWithPath: "/usr/bin/python3")
        try #require(FileManager.default.isExecutableFile(atPath: python.path), "python3 is needed (make deps)")
        let listener = try hosts.run(
            on: "y",
            python,
            [
                "-c",
                """
                import socket, sys
                s = socket.socket(); s.bind(("\(hosts["y"].address)", 7000)); s.listen(); s.settimeout(20)
                print("listening", flush=True)
                c, peer = s.accept(); c.sendall(("from y to " + peer[0]).encode()); c.close()
                """,
            ]
        )
        // Read on a thread of its own, with the clock read there: a busy cooperative pool does not use up the 20 s.
        let ready = await offPool("listener", lending: listener) { listener in
            var ready = false
            let deadline = ContinuousClock.now + .seconds(20)
            while !ready, ContinuousClock.now < deadline, !listener.reachedEndOfOutput {
                listener.read(for: .milliseconds(100))
                ready = String(decoding: listener.output, as: UTF8.self).contains("listening")
            }
            return ready
        }
        try #require(ready, "the listener on y did not start: \(listener.errors())")
        let connecting = try await hosts.run(
            on: "x",
            python,
            [
                "-c",
                "import socket; print(socket.create_connection((\"\(hosts["y"].address)\", 7000), timeout=10)"
                    + ".recv(100).decode())",
            ]
        ).finish(within: .seconds(20))
        #expect(connecting.standardOutput == "from y to \(hosts["x"].address)\n", "\(connecting.standardError)")
        #expect(try await listener.finish(within: .seconds(20)).status == 0)

        await hosts.tearDown()
        #expect(Set(try await namespaces()).isDisjoint(with: names))
    }

    @Test func leftoversOfAGoneRunAreDeletedUnlessSomethingRunsInThem() async throws {
        // A process that is gone: its id names the leftovers, as a test process killed with SIGKILL would.
        let gone = try ChildProcess(executable: URL(fileURLWithPath: "/bin/true"), [])
        _ = try await gone.finish(within: .seconds(10))
        let owner = gone.process.processIdentifier
        try #require(Glibc.kill(owner, 0) == -1 && errno == ESRCH)
        let empty = "\(TestHosts.prefix)-\(owner)-0"
        let occupied = "\(TestHosts.prefix)-\(owner)-0-h"
        guard let probe = try await testHostsOrSkip(["p"]) else { return }
        defer {
            probe.tearDown()
            _ = try? probe.ip(["netns", "delete", empty])
            _ = try? probe.ip(["netns", "delete", occupied])
        }
        try probe.ip(["netns", "add", empty])
        try probe.ip(["netns", "add", occupied])
        let sleeper = try ChildProcess(
            executable: URL(fileURLWithPath: "/usr/sbin/ip"),
            ["netns", "exec", occupied, "/bin/sleep", "60"]
        )
        defer { sleeper.kill() }
        let sleeping = sleeper.process.processIdentifier
        let entered = try await offPool("netns pids", lending: probe) { probe in
            try (0..<100).contains { _ in
                if try probe.ip(["netns", "pids", occupied]).contains("\(sleeping)") {
                    return true
                }
                usleep(20_000)
                return false
            }
        }
        try #require(entered, "sleep never ran in \(occupied)")

        let hosts = try #require(try await testHostsOrSkip(["q"]))
        defer { hosts.tearDown() }
        let left = try await namespaces()
        // Another set made at the same time in this process may have deleted the empty one first: either way it is
        // gone, and the occupied one stays, reported with the process in it.
        #expect(!left.contains(empty), "\(hosts.leftovers)")
        #expect(left.contains(occupied))
        #expect(
            hosts.leftovers.contains { $0.contains(occupied) && $0.contains("\(sleeper.process.processIdentifier)") },
            "\(hosts.leftovers)"
        )
    }

    @Test func aFailingIPCommandNamesTheCommandItsStatusAndItsStandardError() async throws {
        guard let hosts = try await testHostsOrSkip(["z"]) else { return }
        defer { hosts.tearDown() }
        let namespace = hosts["z"].namespace
        do {
            try hosts.ip(["-n", namespace, "link", "show", "nosuchlink"])
            Issue.record("ip link show of a link that does not exist succeeded")
        } catch let error as TestHostsError {
            #expect(error.command == "ip -n \(namespace) link show nosuchlink")
            #expect(error.status == 1)
            #expect(error.standardError.contains("does not exist"), "\(error.standardError)")
            #expect("\(error)".contains("failed (exit status 1)"), "\(error)")
        }
    }
}
