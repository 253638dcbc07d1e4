import Foundation
import LockstepClient
import LockstepProtocol
import LockstepTesting
import TestSupport
import Testing
import ZeroMQ

/// Failpoints exist only in test builds: `LOCKSTEP_FAILPOINT` crashes a debug daemon where it says, and a release
/// daemon (what runs in production) ignores it — no crash point, and no journal that skips its fsyncs.
@Suite struct FailpointBuildTests {
    /// A `lockstepd` built in the release configuration: `LOCKSTEP_RELEASE_LOCKSTEPD` (`make test` builds one in
    /// `.build-release-check`), else the one beside this debug build (`swift build -c release --product lockstepd`).
    var releaseDaemon: URL {
        if let path = ProcessInfo.processInfo.environment["LOCKSTEP_RELEASE_LOCKSTEPD"] {
            return URL(fileURLWithPath: path)
        }
        return productURL("lockstepd").deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("release/lockstepd")
    }

    /// Starts `executable` with `failpoint` in a new folder and dispatches three increments: how many were
    /// acknowledged, whether it still runs, and its log.
    func dispatchThree(
        _ executable: URL,
        failpoint: String
    ) async throws -> (acknowledged: Int, running: Bool, log: String) {
        let directory = try temporaryDirectory("failpoint")
        defer { try? FileManager.default.removeItem(at: directory) }
        let daemon = try DaemonProcess(executable: executable, folder: directory, arguments: ["--domain", "counter"])
        try daemon.start(environment: ["LOCKSTEP_FAILPOINT": failpoint])
        try await daemon.waitUntilServing()
        let client = CommandClient(context: try Context(), endpoint: daemon.command, timeout: .seconds(1), retries: 0)
        var acknowledged = 0
        for number: UInt64 in 1...3 {
            let request = DispatchRequest(
                requestID: number,
                domainVersion: 1,
                clientID: ClientID(bytes: [UInt8](repeating: 7, count: 16))!,
                store: try StoreName("counter"),
                actions: [Array(#"{"increment":{}}"#.utf8)]
            )
            guard case .accepted? = try? client.call(.dispatch(request)) else { break }
            acknowledged += 1
        }
        let running = daemon.isRunning
        _ = await daemon.stop()
        return (acknowledged, running, daemon.output)
    }

    @Test func aTestBuildCrashesWhereTheFailpointSays() async throws {
        let debug = try await dispatchThree(productURL("lockstepd"), failpoint: "after-commit:2")
        #expect(debug.acknowledged == 1 && !debug.running, "\(debug)")
    }

    @Test(arguments: ["after-commit:2", "before-commit:1", "no-sync", "unfenced"])
    func aReleaseDaemonIgnoresTheFailpoint(failpoint: String) async throws {
        try #require(
            FileManager.default.isExecutableFile(atPath: releaseDaemon.path),
            """
            no release lockstepd at \(releaseDaemon.path): build it with swift build -c release --product lockstepd, \
            or run make test, which builds one and says where in LOCKSTEP_RELEASE_LOCKSTEPD
            """
        )
        let release = try await dispatchThree(releaseDaemon, failpoint: failpoint)
        #expect(release.acknowledged == 3 && release.running, "\(release)")
        #expect(release.log.contains("LOCKSTEP_FAILPOINT is ignored"), "\(release.log)")
        #expect(!release.log.contains("never fsyncs"), "\(release.log)")
    }
}
