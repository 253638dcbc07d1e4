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
    @Test func onlyListedClientsGetThrough() throws {
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

        /// One dispatch from a fresh REQ socket; nil when nothing comes back within `wait` ms.
        func dispatch(keys: CurveKeyPair?, serverKey: [UInt8], number: UInt64, wait: Int32) throws -> Reply? {
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
                    clientID: ClientID.random(),
                    store: try StoreName("counter"),
                    actions: [Array(#"{"increment":{}}"#.utf8)]
                )
            )
            try socket.send(request.encode())
            return try socket.receive().map { try Reply.decode($0) }
        }

        // The listed client gets in (retrying while the daemon starts).
        var first: Reply?
        let deadline = ContinuousClock.now + .seconds(10)
        while first == nil, ContinuousClock.now < deadline {
            first = try dispatch(keys: listed, serverKey: server.publicKey, number: 1, wait: 500)
        }
        guard case .accepted = first else {
            Issue.record("the listed client got \(String(describing: first)); log:\n\(daemon.output)")
            return
        }
        #expect(try dispatch(keys: unlisted, serverKey: server.publicKey, number: 2, wait: 1_000) == nil)
        #expect(try dispatch(keys: nil, serverKey: [], number: 3, wait: 1_000) == nil)
        #expect(try dispatch(keys: listed, serverKey: unlisted.publicKey, number: 4, wait: 1_000) == nil)

        // Listing the other key and sending SIGHUP lets it in.
        try "\(Z85.encode(listed.publicKey))\n\(Z85.encode(unlisted.publicKey))\n".write(
            toFile: clientsFile,
            atomically: true,
            encoding: .utf8
        )
        daemon.signal(SIGHUP)
        var after: Reply?
        let reloadDeadline = ContinuousClock.now + .seconds(5)
        while after == nil, ContinuousClock.now < reloadDeadline {
            after = try dispatch(keys: unlisted, serverKey: server.publicKey, number: 5, wait: 500)
        }
        guard case let .accepted(_, _, seq, _) = after else {
            Issue.record(
                "after SIGHUP the newly listed client got \(String(describing: after)); log:\n\(daemon.output)"
            )
            return
        }
        // Only the two accepted dispatches were applied.
        #expect(seq == 2)
        #expect(daemon.stop() == 0)
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
        #expect(daemon.waitForExit(within: .zero) != 0)
        #expect(daemon.output.contains("must be 0600"), "\(daemon.output)")
    }
}
