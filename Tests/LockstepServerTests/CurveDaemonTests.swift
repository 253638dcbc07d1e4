import Foundation
import Lockstep
import LockstepProtocol
import LockstepTesting
import TestSupport
import Testing
import ZeroMQ

#if canImport(Glibc)
import Glibc
#endif

/// lockstepd on tcp with CURVE: listed clients get in; unlisted keys, plain clients and clients that expect
/// another server key get nothing; SIGHUP reloads the list.
@Suite struct CurveDaemonTests {
    @Test func onlyListedClientsGetThrough() async throws {
        let directory = try temporaryDirectory("curve").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let server = try CurveKeyPair.generate()
        let listed = try CurveKeyPair.generate()
        let unlisted = try CurveKeyPair.generate()
        let keyFile = "\(directory)/server.key"
        let clientsFile = "\(directory)/clients"
        _ = FileManager.default.createFile(
            atPath: keyFile,
            contents: Data((Z85.encode(server.secretKey) + "\n").utf8),
            attributes: [.posixPermissions: 0o600]
        )
        try "# allowed\n\(Z85.encode(listed.publicKey))\n".write(toFile: clientsFile, atomically: true, encoding: .utf8)
        let port = Int.random(in: 30_000..<60_000)
        let command = "tcp://127.0.0.1:\(port)"
        let config = """
            command_endpoint = "\(command)"
            events_endpoint = "tcp://127.0.0.1:\(port + 1)"
            [curve]
            server_key_file = "\(keyFile)"
            allowed_clients_file = "\(clientsFile)"
            """
        try config.write(toFile: "\(directory)/lockstepd.toml", atomically: true, encoding: .utf8)
        let daemon = try DaemonProcess(
            directory: directory,
            arguments: ["--config", "\(directory)/lockstepd.toml", "--journal", "memory", "--domain", "counter"]
        )
        let context = try Context()

        /// One dispatch from a fresh REQ socket, as client `client` (the same in every try of one dispatch, so a try
        /// whose answer came too late is not applied again); nil when nothing comes back within `wait` ms.
        @Sendable func send(
            keys: CurveKeyPair?,
            serverKey: [UInt8],
            number: UInt64,
            wait: Int32,
            client: ClientID = ClientID.random()
        ) throws -> Reply? {
            let socket = try Socket(context, type: .request)
            defer { socket.close() }
            if let keys {
                try socket.set(.curveServerKey, serverKey)
                try socket.set(.curvePublicKey, keys.publicKey)
                try socket.set(.curveSecretKey, keys.secretKey)
            }
            try socket.set(.receiveTimeout, wait)
            try socket.connect(command)
            let request = Request.dispatch(
                DispatchRequest(
                    requestID: number,
                    domainVersion: 1,
                    clientID: client,
                    store: try StoreName("counter"),
                    actions: [Array(#"{"increment":{}}"#.utf8)]
                )
            )
            try socket.send(request.encode())
            return try socket.receive().map { try Reply.decode($0) }
        }

        /// The same, waiting for the reply on a thread of its own.
        func dispatch(keys: CurveKeyPair?, serverKey: [UInt8], number: UInt64, wait: Int32) async throws -> Reply? {
            try await offPool("dispatch") { try send(keys: keys, serverKey: serverKey, number: number, wait: wait) }
        }

        /// Dispatches with `keys` and the server's key, 500 ms per try, until a reply comes or `limit` has passed: one
        /// dispatch, every try under the same client id and number, applied once however many tries it takes.
        /// The tries and the clock run on a thread of their own: a busy cooperative pool does not use up `limit`.
        func untilAnswered(within limit: Duration, keys: CurveKeyPair, number: UInt64) async throws -> Reply? {
            try await offPool("dispatch") {
                var reply: Reply?
                let client = ClientID.random()
                let deadline = ContinuousClock.now + limit
                while reply == nil, ContinuousClock.now < deadline {
                    reply = try send(keys: keys, serverKey: server.publicKey, number: number, wait: 500, client: client)
                }
                return reply
            }
        }

        // The listed client gets in (retrying while the daemon starts).
        let first = try await untilAnswered(within: .seconds(10), keys: listed, number: 1)
        guard case .accepted = first else {
            Issue.record("the listed client got \(String(describing: first)); log:\n\(daemon.output)")
            return
        }
        #expect(try await dispatch(keys: unlisted, serverKey: server.publicKey, number: 2, wait: 1_000) == nil)
        #expect(try await dispatch(keys: nil, serverKey: [], number: 3, wait: 1_000) == nil)
        #expect(try await dispatch(keys: listed, serverKey: unlisted.publicKey, number: 4, wait: 1_000) == nil)

        // Listing the other key and sending SIGHUP lets it in.
        try "\(Z85.encode(listed.publicKey))\n\(Z85.encode(unlisted.publicKey))\n".write(
            toFile: clientsFile,
            atomically: true,
            encoding: .utf8
        )
        daemon.signal(SIGHUP)
        let after = try await untilAnswered(within: .seconds(5), keys: unlisted, number: 5)
        guard case let .accepted(_, _, seq, _) = after else {
            Issue.record(
                "after SIGHUP the newly listed client got \(String(describing: after)); log:\n\(daemon.output)"
            )
            return
        }
        // Only the two accepted dispatches were applied.
        #expect(seq == 2)
        #expect(await daemon.stop() == 0)
        #expect(daemon.output.contains("refused a connection"))
    }

    @Test func aKeyFileOthersCanReadIsRefused() async throws {
        let directory = try temporaryDirectory("curve").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let server = try CurveKeyPair.generate()
        _ = FileManager.default.createFile(
            atPath: "\(directory)/server.key",
            contents: Data(Z85.encode(server.secretKey).utf8),
            attributes: [.posixPermissions: 0o644]
        )
        try "".write(toFile: "\(directory)/clients", atomically: true, encoding: .utf8)
        try """
        command_endpoint = "tcp://127.0.0.1:\(Int.random(in: 30_000..<60_000))"
        [curve]
        server_key_file = "\(directory)/server.key"
        allowed_clients_file = "\(directory)/clients"
        """.write(toFile: "\(directory)/lockstepd.toml", atomically: true, encoding: .utf8)
        let daemon = try DaemonProcess(
            directory: directory,
            arguments: ["--config", "\(directory)/lockstepd.toml", "--journal", "memory"]
        )
        let exited = try await eventually(within: .seconds(10)) { !daemon.isRunning }
        try #require(exited, "lockstepd kept running with a readable key file")
        #expect(await daemon.waitForExit(within: .zero) != 0)
        #expect(daemon.output.contains("must be 0600"), "\(daemon.output)")
    }

    /// `lockstep` (stats, dispatch, state, tail) and `lockstep demo-client` reach a tcp daemon with
    /// `--curve-server-key` and `--curve-key-file`; without them, or with a key file others can read, they do not.
    @Test func theToolAndADemoClientTalkCurveWithKeysFromKeygen() async throws {
        let directory = try temporaryDirectory("curve-tool").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var publicKeys: [String: String] = [:]
        for name in ["server", "client"] {
            let made = try await runProduct("lockstep", ["keygen", "--out", "\(directory)/\(name)"])
            try #require(made.status == 0, "\(made.standardError)")
            publicKeys[name] = try String(contentsOfFile: "\(directory)/\(name).pub", encoding: .utf8)
                .trimmingCharacters(in: .whitespacesAndNewlines)
        }
        try "\(publicKeys["client"]!)\n".write(toFile: "\(directory)/clients", atomically: true, encoding: .utf8)
        let port = Int.random(in: 30_000..<60_000)
        let command = "tcp://127.0.0.1:\(port)"
        let events = "tcp://127.0.0.1:\(port + 1)"
        try """
        command_endpoint = "\(command)"
        events_endpoint = "\(events)"
        [curve]
        server_key_file = "\(directory)/server.key"
        allowed_clients_file = "\(directory)/clients"
        """.write(toFile: "\(directory)/lockstepd.toml", atomically: true, encoding: .utf8)
        let daemon = try DaemonProcess(
            directory: directory,
            arguments: ["--config", "\(directory)/lockstepd.toml", "--journal", "memory", "--domain", "counter"]
        )
        let curve = ["--curve-server-key", publicKeys["server"]!, "--curve-key-file", "\(directory)/client.key"]

        var stats: ProcessOutput?
        for _ in 0..<50 where stats?.status != 0 {
            stats = try await runProduct(
                "lockstep",
                ["stats", "--command-endpoint", command, "--timeout-ms", "500"] + curve
            )
        }
        try #require(stats?.status == 0, "\(String(describing: stats)); log:\n\(daemon.output)")
        #expect(stats?.standardOutput.contains("role     leader") == true)
        let replica = try ReplicaClient(
            lockstep: productURL("lockstep"),
            daemons: [(command, events)],
            stores: ["counter"],
            actions: 20,
            extra: curve
        )
        let done = await replica.wait(within: .seconds(30)) {
            $0.done && $0.store("counter")?.seq == UInt64($0.accepted)
        }
        #expect(
            done?.accepted ?? 0 > 0 && done?.store("counter")?.seq == UInt64(done?.accepted ?? 0),
            "\(String(describing: done))"
        )
        #expect(try await replica.stop().status == 0)
        // tail says nothing until it is subscribed: dispatch until it has printed an event.
        let tail = try ChildProcess(
            "lockstep",
            ["tail", "counter", "--events-endpoint", events, "--count", "1", "--silence-ms", "10000"] + curve
        )
        for _ in 0..<50 where !tail.reachedEndOfOutput {
            let dispatched = try await runProduct(
                "lockstep",
                ["dispatch", "counter", #"{"increment":{}}"#, "--command-endpoint", command] + curve
            )
            #expect(dispatched.status == 0, "\(dispatched.standardError)")
            await tail.read(for: .milliseconds(200))
        }
        let tailed = try await tail.finish(within: .seconds(20))
        #expect(
            tailed.standardOutput.hasSuffix(#"  {"increment":{}}"# + "\n"),
            "\(tailed.standardOutput) \(tailed.standardError)"
        )

        let plain = try await runProduct(
            "lockstep",
            ["state", "counter", "--command-endpoint", command, "--timeout-ms", "500", "--retries", "0"]
        )
        #expect(plain.status == 69, "without CURVE: \(plain.standardOutput) \(plain.standardError)")
        let half = try await runProduct("lockstep", ["stats", "--command-endpoint", command] + curve.prefix(2))
        #expect(
            half.status == 64 && half.standardError.contains("--curve-key-file is missing"),
            "\(half.standardError)"
        )
        chmod("\(directory)/client.key", 0o644)
        let readable = try await runProduct("lockstep", ["stats", "--command-endpoint", command] + curve)
        #expect(readable.status == 64 && readable.standardError.contains("must be 0600"), "\(readable.standardError)")
        #expect(await daemon.stop() == 0)
    }

    /// One Z85 key in 85 begins with '-': the tool takes it as the value of `--curve-server-key`, not as an option
    /// (the command then waits for a daemon that is not there and exits 69, where a usage error would be 64).
    @Test func aServerKeyThatBeginsWithADashIsAKey() async throws {
        let directory = try temporaryDirectory("curve-dash").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var server = try CurveKeyPair.generate()
        while !Z85.encode(server.publicKey).hasPrefix("-") { server = try CurveKeyPair.generate() }
        let made = try await runProduct("lockstep", ["keygen", "--out", "\(directory)/client"])
        try #require(made.status == 0, "\(made.standardError)")
        let output = try await runProduct(
            "lockstep",
            [
                "stats", "--command-endpoint", "tcp://127.0.0.1:\(Int.random(in: 30_000..<60_000))", "--timeout-ms",
                "200", "--retries", "0", "--curve-server-key", Z85.encode(server.publicKey), "--curve-key-file",
                "\(directory)/client.key",
            ]
        )
        #expect(output.status == 69, "\(output.standardError)")
        #expect(output.standardError.contains("no reply from the daemon"), "\(output.standardError)")
    }
}
