import Foundation
import Lockstep
import LockstepClient
import LockstepExamples
import LockstepProtocol
import LockstepTesting
import TestSupport
import Testing
import ZeroMQ

/// STATUS — and `lockstep stats` — tells each store's last digest and what its dispatches were refused.
@Suite struct StoreStatusTests {
    @Test func eachStoreShowsItsLastDigestAndItsRejectionsAndRefusals() async throws {
        let directory = try TestSupport.temporaryDirectory("store-status").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let file = "\(directory)/lockstepd.toml"
        try "[intervals]\ndigest_every_events = 2\n".write(toFile: file, atomically: true, encoding: .utf8)
        let daemon = try DaemonProcess(directory: directory, arguments: ["--config", file, "--domain", "todos"])
        try await daemon.waitUntilServing()
        var configuration = DispatcherConfiguration(commandEndpoints: [daemon.command])
        configuration.requestTimeout = .seconds(1)
        configuration.retries = 10
        let dispatcher = try Dispatcher(Todos.self, configuration: configuration)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await dispatcher.run() }
            try await dispatcher.dispatch(batch: [.add(text: "milk"), .add(text: "eggs")])
            await #expect(throws: Rejection.self) { try await dispatcher.dispatch(.toggle(id: 99)) }
            group.cancelAll()
            while try await group.next() != nil {}
        }
        // An action of no case of the domain, as another client might send it.
        let client = CommandClient(context: try Context(), endpoint: daemon.command, timeout: .seconds(1), retries: 10)
        let reply = try await offPool("dispatch", lending: client) { client in
            try client.call(
                .dispatch(
                    DispatchRequest(
                        requestID: 1,
                        domainVersion: Todos.version,
                        clientID: .random(),
                        store: try StoreName("todos"),
                        actions: [Array(#"{"restock":{}}"#.utf8)]
                    )
                )
            )
        }
        guard case let .error(_, error) = reply, error.code == .undecodableAction else {
            Issue.record("the daemon answered \(reply)")
            return
        }
        let todos = try #require(await daemon.status()?.stores.first { $0.name == "todos" })
        let snapshot = try #require(try await daemon.digests(of: ["todos"])["todos"])
        #expect(todos.digest == DaemonStatus.Digest(seq: 2, digest: "\(snapshot.digest)") && snapshot.seq == 2)
        #expect(todos.rejected == ["unknown_id": 1])
        #expect(todos.refused == ["undecodable_action": 1])
        let stats = try await runProduct("lockstep", ["stats", "--command-endpoint", daemon.command])
        #expect(stats.standardOutput.contains("\(snapshot.digest) at seq 2"), "\(stats.standardOutput)")
        #expect(
            stats.standardOutput.contains("rejected unknown_id 1; refused undecodable_action 1"),
            "\(stats.standardOutput)"
        )
        #expect(await daemon.stop() == 0)
    }
}
