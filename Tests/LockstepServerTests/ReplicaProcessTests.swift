import Foundation
import Lockstep
import LockstepClient
import LockstepProtocol
import LockstepTesting
import TestSupport
import Testing
import ZeroMQ

#if canImport(Glibc)
import Glibc
#endif

extension ReplicaClient {
    /// A demo client of `daemon`, with short timeouts and retries enough to ride out a restart.
    convenience init(_ daemon: DaemonProcess, stores: [String], actions: Int, extra: [String] = []) throws {
        try self.init(
            lockstep: productURL("lockstep"),
            daemons: [(daemon.command, daemon.events)],
            stores: stores,
            actions: actions,
            extra: ["--timeout-ms", "1000", "--retries", "8"] + extra
        )
    }
}

@Suite struct ReplicaProcessTests {
    func startDaemon(_ directory: String, configuration: String? = nil) async throws -> DaemonProcess {
        var arguments: [String] = []
        if let configuration {
            let file = URL(fileURLWithPath: directory).appendingPathComponent("lockstepd.toml")
            try configuration.write(to: file, atomically: true, encoding: .utf8)
            arguments = ["--config", file.path]
        }
        let daemon = try DaemonProcess(directory: directory, arguments: arguments)
        _ = try await daemonDigests(daemon, stores: [])
        return daemon
    }

    /// Each store's (seq, digest) from the daemon's snapshots, asking until it answers (at most 15 s); the blocking
    /// client waits on a thread of its own, not on one of the cooperative pool.
    func daemonDigests(
        _ daemon: DaemonProcess,
        stores: [String]
    ) async throws -> [String: (seq: UInt64, digest: String)] {
        let endpoint = daemon.command
        return try await offPool("daemon digests") {
            let client = CommandClient(context: try Context(), endpoint: endpoint, timeout: .seconds(1), retries: 15)
            _ = try client.call(.status(requestID: 1))
            var digests: [String: (seq: UInt64, digest: String)] = [:]
            for store in stores {
                guard
                    case let .snapshot(_, snapshot) = try client.call(
                        .snapshot(requestID: 2, store: try StoreName(store))
                    )
                else { throw ClientTimeout() }
                digests[store] = (snapshot.seq, snapshot.digest.hex)
            }
            return digests
        }
    }

    func converged(_ report: ReplicaReport, on digests: [String: (seq: UInt64, digest: String)]) -> Bool {
        report.matches(digests)
    }

    @Test func aReplicaThatJoinsDuringABurstEndsOnTheDaemonsDigest() async throws {
        let directory = try TestSupport.temporaryDirectory("replica-join").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let daemon = try await startDaemon(directory)
        let stores = ["counter", "todos"]
        let writer = try ReplicaClient(daemon, stores: stores, actions: 3_000, extra: ["--concurrency", "8"])
        let started = await writer.wait(within: .seconds(30)) { $0.accepted >= 300 }
        try #require(started.map { $0.accepted >= 300 } == true, "the writer did not get going")
        // The watcher starts while the burst is on: the writer is a tenth of the way through.
        #expect(started?.done == false)
        let watcher = try ReplicaClient(daemon, stores: stores, actions: 0)
        @Sendable func hasJoined(_ report: ReplicaReport) -> Bool {
            stores.allSatisfy { report.store($0)?.seq ?? 0 > 0 }
        }
        let joined = await watcher.wait(within: .seconds(30), until: hasJoined)
        let written = await writer.wait(within: .seconds(60)) { $0.done }
        try #require(written?.done == true, "the writer did not finish")
        #expect(written?.failed == 0)
        let digests = try await daemonDigests(daemon, stores: stores)
        #expect(digests.values.reduce(0) { $0 + $1.seq } == UInt64(written!.accepted))
        let watched = await watcher.wait(within: .seconds(30)) { converged($0, on: digests) }
        #expect(watched.map { converged($0, on: digests) } == true, "watcher: \(String(describing: watched))")
        #expect(joined.map(hasJoined) == true, "the watcher never joined: \(String(describing: joined))")
        #expect(watched?.stores.allSatisfy { $0.divergences == 0 } == true)
        #expect(try await watcher.stop().status == 0)
        #expect(try await writer.stop().status == 0)
        #expect(await daemon.stop() == 0)
    }

    /// A process holding 16 replicas (`demo-client`, on one `ReplicaHub`) runs them on one thread, one ZeroMQ context
    /// — counted from /proc — and one subscription to the daemon — counted from `ss` — and every one ends on the
    /// daemon's digest, checking digests as it goes.
    @Test func sixteenReplicasInOneProcessShareOneThreadAndOneContext() async throws {
        let directory = try TestSupport.temporaryDirectory("replica-hub").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let daemon = try await startDaemon(directory, configuration: "[intervals]\ndigest_every_events = 50\n")
        let stores = ["counter", "todos"]
        let names = (0..<16).map { stores[$0 % 2] }
        let watcher = try ReplicaClient(daemon, stores: names, actions: 0)
        let joined = await watcher.wait(within: .seconds(30)) { $0.stores.count == 16 }
        try #require(joined?.stores.count == 16, "\(String(describing: joined))")
        let writer = try ReplicaClient(daemon, stores: stores, actions: 600, extra: ["--concurrency", "8"])
        let written = await writer.wait(within: .seconds(60)) { $0.done }
        try #require(written?.done == true, "the writer did not finish")
        let digests = try await daemonDigests(daemon, stores: stores)
        @Sendable func allConverged(_ report: ReplicaReport) -> Bool {
            report.stores.count == 16
                && report.stores.allSatisfy { store in
                    digests[store.store].map { store.seq == $0.seq && store.digest == $0.digest } ?? false
                }
        }
        let watched = await watcher.wait(within: .seconds(30), until: allConverged)
        #expect(watched.map(allConverged) == true, "\(String(describing: watched))")
        #expect(watched?.stores.allSatisfy { $0.divergences == 0 && $0.resyncs == 0 } == true)
        // The threads of the process, by name: one replicas' thread, one ZeroMQ context (its I/O thread and reaper).
        let pid = watcher.child.process.processIdentifier
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        let threadNames = tasks.compactMap {
            try? String(contentsOfFile: "/proc/\(pid)/task/\($0)/comm", encoding: .utf8)
                .trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let count = { (name: String) in threadNames.filter { $0 == name }.count }
        #expect(count("replicas") == 1, "\(threadNames)")
        #expect(count("ZMQbg/Reaper") == 1 && count("ZMQbg/IO/0") == 1, "\(threadNames)")
        // One subscription per daemon and process: the daemon accepted one events connection from the watcher's
        // 16 replicas and one from the writer's two.
        let subscribers = try await acceptedConnections(daemon, daemon.events)
        #expect(subscribers.count == 2, "the daemon has \(subscribers.count) events connections")
        let memory = residentMemory(of: pid)
        print("16 replicas in one process: \(threadNames.count) threads, \(memory.residentKiB) KiB resident")
        #expect(try await watcher.stop().status == 0)
        #expect(try await writer.stop().status == 0)
        #expect(await daemon.stop() == 0)
    }

    @Test func aStoppedReplicaWhoseEventsWereDroppedRepairsAndConverges() async throws {
        let directory = try TestSupport.temporaryDirectory("replica-gap").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // A short queue on both sides, so the stopped replica's events are dropped, not held.
        let daemon = try await startDaemon(directory, configuration: "[limits]\nevents_queue = 100\n")
        let watcher = try ReplicaClient(daemon, stores: ["counter"], actions: 0, extra: ["--events-queue", "100"])
        // One event seen first: the watcher's subscription is in place before it is stopped. The bound is for a full
        // parallel run's first minute on two cores, where ~100 process tests start at once and one `lockstep
        // dispatch` has taken 14 s (alone: 0.3 s).
        let first = try await runProduct(
            "lockstep",
            ["dispatch", "counter", #"{"increment":{}}"#, "--command-endpoint", daemon.command],
            timeout: .seconds(90)
        )
        #expect(first.status == 0)
        let live = await watcher.wait(within: .seconds(30)) {
            $0.store("counter")?.phase == "live" && $0.store("counter")?.seq == 1
        }
        try #require(live?.store("counter")?.seq == 1, "the watcher never saw the first event")
        watcher.child.signal(SIGSTOP)
        // 40,000 events in 2,000 commits (so 2,000 EVENTS messages) while it sleeps: far more than the queues and
        // the socket buffers hold.
        let batch = Array(repeating: #"{"increment":{}}"#, count: 20)
        let burst = try await runProduct(
            "lockstep",
            ["dispatch", "counter"] + batch + ["--repeat", "2000", "--command-endpoint", daemon.command],
            timeout: .seconds(120)
        )
        watcher.child.signal(SIGCONT)
        #expect(burst.status == 0, "\(burst.standardError)")
        let digests = try await daemonDigests(daemon, stores: ["counter"])
        #expect(digests["counter"]?.seq == 40_001)
        let caught = await watcher.wait(within: .seconds(60)) { converged($0, on: digests) }
        #expect(caught.map { converged($0, on: digests) } == true, "watcher: \(String(describing: caught))")
        // It had a gap to fill: the events were dropped, and the replica asked for the range — it did not
        // mistake its own stop for a silent daemon and start over.
        #expect((caught?.store("counter")?.repairs ?? 0) >= 1)
        #expect(caught?.store("counter")?.resyncs == 0)
        #expect(caught?.store("counter")?.divergences == 0)
        #expect(try await watcher.stop().status == 0)
        #expect(await daemon.stop() == 0)
    }

    @Test func everyReplicaSurvivesADaemonRestart() async throws {
        let directory = try TestSupport.temporaryDirectory("replica-restart").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var daemon = try await startDaemon(directory)
        let stores = ["counter", "numbers", "todos"]
        let before = try await daemonDigests(daemon, stores: stores)
        // Tries enough to outlast the restart, as docs/operations.md advises (1 s × 20): with the default 4, a restart
        // in a busy full run took longer, and 4 dispatches applied before the kill gave up unanswered.
        let writer = try ReplicaClient(daemon, stores: stores, actions: 1_500, extra: ["--retries", "20"])
        let watcher = try ReplicaClient(daemon, stores: stores, actions: 0)
        let halfway = await writer.wait(within: .seconds(60)) { $0.accepted >= 500 }
        try #require(halfway.map { $0.accepted >= 500 } == true)
        daemon.kill()
        daemon = try await startDaemon(directory)
        let written = await writer.wait(within: .seconds(90)) { $0.done }
        try #require(written?.done == true, "the writer did not finish after the restart")
        // Every dispatch got an answer: retries across the restart were applied once, not lost.
        #expect(written?.failed == 0, "the writer's errors:\n\(writer.child.errors().suffix(2_000))")
        let digests = try await daemonDigests(daemon, stores: stores)
        #expect(
            digests.values.reduce(0) { $0 + $1.seq } - before.values.reduce(0) { $0 + $1.seq }
                == UInt64(written!.accepted)
        )
        for client in [writer, watcher] {
            let report = await client.wait(within: .seconds(30)) { converged($0, on: digests) }
            #expect(report.map { converged($0, on: digests) } == true, "\(String(describing: report))")
            #expect(try await client.stop().status == 0)
        }
        #expect(await daemon.stop() == 0)
    }

    @Test func twoProcessesDispatchingToTodosEachSeeTheOthersTodos() async throws {
        let directory = try TestSupport.temporaryDirectory("replica-todos").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let daemon = try await startDaemon(directory)
        let alice = try ReplicaClient(
            daemon,
            stores: ["todos"],
            actions: 60,
            extra: ["--tag", "alice", "--print-state"]
        )
        let bob = try ReplicaClient(daemon, stores: ["todos"], actions: 60, extra: ["--tag", "bob", "--print-state"])
        for client in [alice, bob] {
            try #require(await client.wait(within: .seconds(60)) { $0.done }?.done == true)
        }
        let digests = try await daemonDigests(daemon, stores: ["todos"])
        for client in [alice, bob] { await client.wait(within: .seconds(30)) { converged($0, on: digests) } }
        let (aliceFinal, aliceStatus) = try await alice.stop()
        let (bobFinal, bobStatus) = try await bob.stop()
        #expect(aliceStatus == 0 && bobStatus == 0)
        for final in [aliceFinal, bobFinal] {
            let state = try #require(final?.store("todos")?.state)
            let todos = try JSONDecoder().decode(TodosState.self, from: Data(state.utf8))
            let texts = todos.list.items.map(\.text)
            #expect(texts.contains { $0.hasPrefix("alice ") }, "\(texts)")
            #expect(texts.contains { $0.hasPrefix("bob ") }, "\(texts)")
            #expect(final?.store("todos")?.digest == digests["todos"]?.digest)
        }
        #expect(await daemon.stop() == 0)
    }

    @Test func aRejectedDispatchExitsNonZeroWithTheDaemonsReason() async throws {
        let directory = try TestSupport.temporaryDirectory("replica-reject").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let daemon = try await startDaemon(directory)
        let result = try await runProduct(
            "lockstep",
            ["dispatch", "numbers", #"{"delete":{"index":99}}"#, "--command-endpoint", daemon.command],
            timeout: .seconds(90)
        )
        #expect(result.status == 3)
        #expect(result.standardError.contains("delete index 99 is out of range"), "\(result.standardError)")
        #expect(try await daemonDigests(daemon, stores: ["numbers"])["numbers"]?.seq == 0)
        #expect(await daemon.stop() == 0)
    }
}

/// The parts of the todos state the test reads.
private struct TodosState: Decodable {
    struct List: Decodable {
        struct Item: Decodable { var text: String }
        var items: [Item]
    }
    var list: List
}
