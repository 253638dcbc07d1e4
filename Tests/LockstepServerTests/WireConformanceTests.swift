import Foundation
import LockstepProtocol
import TestSupport
import Testing
import ZeroMQ

/// Requests a client written from docs/protocol.md might send, against a real lockstepd: each gets exactly the
/// error the spec names, in the spec's order of checks, and the daemon stays up.
@Suite struct WireConformanceTests {
    @Test func theHeaderIsCheckedBeforeTheFrameCountWhateverTheSize() throws {
        let directory = try temporaryDirectory("conformance").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let daemon = try DaemonProcess(directory: directory, arguments: ["--domain", "counter"])
        let context = try Context()
        let client = try Client(context, endpoint: daemon.command)
        let valid = Request.dispatch(
            DispatchRequest(
                requestID: 9,
                domainVersion: 1,
                clientID: client.clientID,
                store: try StoreName("counter"),
                actions: [Array(#"{"increment":{}}"#.utf8)]
            )
        ).encode()
        let padding = [Frame](repeating: Array(#"{"increment":{}}"#.utf8), count: 1_001)
        var badMagic = valid[0]
        badMagic[0] = 0x00
        var badVersion = valid[0]
        badVersion[2] = 9
        var badType = valid[0]
        badType[3] = 0x7e
        let cases: [(String, Frame, ProtocolError.Code)] = [
            ("wrong magic", badMagic, .malformed),
            ("wrong version", badVersion, .unsupportedVersion),
            ("unknown type", badType, .unknownMessageType),
            ("a valid header", valid[0], .tooLarge),
        ]
        for (label, header, code) in cases {
            // 1,003 frames: over the frame limit, so only the header decides which error comes first.
            guard case let .error(_, error) = try client.call([header, valid[1]] + padding) else {
                Issue.record("\(label): expected ERROR")
                continue
            }
            #expect(error.code == code, "\(label): \(error)")
        }
        // An action over the 1 MiB limit is read and answered too_large, not dropped with the connection.
        let oversized =
            Array(#"{"increment":{"pad":""#.utf8) + [UInt8](repeating: 0x61, count: 1 << 20) + Array(#""}}"#.utf8)
        guard case let .error(_, tooLarge) = try client.call([valid[0], valid[1], oversized]) else {
            Issue.record("expected ERROR for an oversized action")
            return
        }
        #expect(tooLarge.code == .tooLarge, "\(tooLarge)")
        #expect(daemon.output.contains("refused a request"), "\(daemon.output)")
        // Counted by code in the daemon's status.
        let stats = try runProduct("lockstep", ["stats", "--json", "--command-endpoint", daemon.command])
        let status = try JSONSerialization.jsonObject(with: Data(stats.standardOutput.utf8)) as? [String: Any]
        let refused = status?["refused"] as? [String: Int]
        #expect(
            refused == ["malformed": 1, "unsupported_version": 1, "unknown_message_type": 1, "too_large": 2],
            "\(stats.standardOutput)"
        )
        // Still serving, and nothing was applied.
        guard case let .accepted(_, _, first, _) = try client.dispatch("counter", [#"{"increment":{}}"#], number: 1)
        else {
            Issue.record("the daemon did not accept a valid dispatch afterwards")
            return
        }
        #expect(first == 1)
        #expect(daemon.terminate() == 0)
    }
}
