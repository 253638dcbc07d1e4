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

        // Serving: its command socket is bound (bounded wait).
        let socket = directory.appendingPathComponent("command").path
        var deadline = ContinuousClock.now + .seconds(30)
        while !FileManager.default.fileExists(atPath: socket), ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(FileManager.default.fileExists(atPath: socket))
        let stoppedEarly = finished.load(ordering: .acquiring)
        #expect(!stoppedEarly)

        running.cancel()
        deadline = ContinuousClock.now + .seconds(30)
        while !finished.load(ordering: .acquiring), ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(20))
        }
        let stopped = finished.load(ordering: .acquiring)
        try #require(stopped, "the daemon did not stop within 30 s of its cancellation")
        try await running.value  // returned, not thrown
        let journal = try SQLiteJournal(directory: configuration.dataDirectory)
        #expect(try journal.recover(Counter.self).lastSeq == 0)
        try journal.close()
    }
}
