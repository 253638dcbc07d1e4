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
