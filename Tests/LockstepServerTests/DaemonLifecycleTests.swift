import Foundation
import LockstepExamples
import LockstepJournal
import LockstepServer
import Logging
import Synchronization
import TestSupport
import Testing

/// `LockstepDaemon` as a `Service` in this process: cancelling its task stops it as cleanly as SIGTERM.
@Suite struct DaemonLifecycleTests {
    @Test func cancellingTheDaemonsTaskStopsItCleanly() async throws {
        let directory = try temporaryDirectory("cancel")
        defer { try? FileManager.default.removeItem(at: directory) }
        var configuration = DaemonConfiguration(environment: [:], domains: ["counter"])
        configuration.dataDirectory = directory.appendingPathComponent("data").path
        configuration.commandEndpoint = "ipc://\(directory.path)/command"
        configuration.eventsEndpoint = "ipc://\(directory.path)/events"
        let daemon = try LockstepDaemon(
            configuration: configuration,
            domains: [HostedDomain(Counter.self)],
            environment: [:],
            logger: Logger(label: "cancel-test")
        )
        let running = Task { try await daemon.run() }
        let finished = Atomic<Bool>(false)
        Task {
            _ = try? await running.value
            finished.store(true, ordering: .releasing)
        }

        // Serving: its command socket is bound.
        let socket = directory.appendingPathComponent("command").path
        #expect(try await eventually(within: .seconds(30)) { FileManager.default.fileExists(atPath: socket) })
        let stoppedEarly = finished.load(ordering: .acquiring)
        #expect(!stoppedEarly)

        running.cancel()
        let stopped = try await eventually(within: .seconds(30)) { finished.load(ordering: .acquiring) }
        try #require(stopped, "the daemon did not stop within 30 s of its cancellation")
        try await running.value  // returned, not thrown
        let journal = try openLocalJournal(directory: configuration.dataDirectory, readOnly: false)
        #expect(try journal.recover(Counter.self).lastSeq == 0)
        try journal.close()
    }
}
