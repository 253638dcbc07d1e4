import Foundation
import LockstepClient
import LockstepProtocol
import LockstepTesting
import TestSupport
import Testing

/// Optimistic reads seen from outside the replica, in separate client processes: every read a subscriber gets
/// agrees with itself (``OptimisticReadCheck``), while clients dispatch conflicting actions and the daemon is
/// killed -9 and restarted (docs/optimistic.md, "One consistent read").
@Suite(.serialized, .timeLimit(.minutes(5))) struct OptimisticProcessTests {
    /// Clients of `todos` and `numbers` dispatching `actions` each optimistically, 8 at a time, checking every read;
    /// the daemon killed -9 and started again once a third is answered when `kill`. Their final reports, once every
    /// dispatch is answered and every client is on the daemon's digests.
    func run(clients count: Int, actions: Int, kill: Bool, extra: [String] = []) async throws -> [ReplicaReport] {
        let directory = try temporaryDirectory("optimistic-reads")
        defer { try? FileManager.default.removeItem(at: directory) }
        let daemon = try DaemonProcess(directory: directory.path)
        try await daemon.waitUntilServing()
        let clients = try (0..<count).map { index in
            try ReplicaClient(
                lockstep: productURL("lockstep"),
                daemons: [(daemon.command, daemon.events)],
                stores: ["todos", "numbers"],
                actions: actions,
                extra: [
                    "--optimistic", "--check-reads", "--concurrency", "8", "--seed", "\(index + 1)", "--tag",
                    "c\(index)", "--timeout-ms", "500", "--retries", "20",
                ] + extra
            )
        }
        defer { for client in clients { client.child.kill() } }
        if kill {
            let third = count * actions / 3
            let started = try await eventually(within: .seconds(60)) {
                var answered = 0
                for client in clients {
                    answered += await client.wait(within: .milliseconds(20)) { _ in false }?.dispatched ?? 0
                }
                return answered >= third
            }
            try #require(started, "the clients did not get a third of their dispatches answered")
            daemon.kill()
            try daemon.start()
            try await daemon.waitUntilServing()
        }
        for (index, client) in clients.enumerated() {
            let done = await client.wait(within: .seconds(120)) { $0.done }
            try #require(
                done?.done == true,
                "client \(index) did not get every dispatch answered: \(String(describing: done))"
            )
        }
        let expected = try await daemon.digests(of: ["todos", "numbers"]).mapValues {
            (seq: $0.seq, digest: $0.digest.hex)
        }
        var reports: [ReplicaReport] = []
        for (index, client) in clients.enumerated() {
            #expect(
                await client.converge(on: expected, within: .seconds(30)),
                "client \(index) is not on the daemon's digests"
            )
            let (report, status) = try await client.stop()
            #expect(status == 0)
            reports.append(try #require(report))
        }
        #expect(await daemon.stop() == 0)
        return reports
    }

    /// Three processes, each with `todos` and `numbers` replicas, dispatching conflicting actions optimistically
    /// (8 pending at most), the daemon killed -9 midway: every read every subscriber got agrees with itself, every
    /// handle is answered once, and nothing stays pending.
    @Test func everyReadAgreesAcrossThreeProcessesThroughAKill() async throws {
        let reports = try await run(clients: 3, actions: 600, kill: true)
        for report in reports {
            #expect(report.dispatched == 600 && report.accepted + report.rejected == 600, "\(report)")
            for store in report.stores {
                #expect((store.checkedReads ?? 0) > 0, "\(store.store): no read was checked")
                #expect(store.readProblems == 0, "\(store.store): \(store.firstReadProblem ?? "")")
                #expect(store.pending == nil, "\(store.store): \(store.pending ?? [])")
            }
        }
        let reads = reports.flatMap(\.stores).compactMap(\.checkedReads).reduce(0, +)
        let rejected = reports.map(\.rejected).reduce(0, +)
        print(
            "OptimisticProcessTests: \(reads) reads checked in 3 processes, \(rejected) dispatches rejected, 0 problems"
        )
    }

    /// The control: a client whose reads lose their first pending dispatch before the check is caught.
    @Test func theCheckCatchesAReadThatLostAPendingDispatch() async throws {
        let reports = try await run(clients: 1, actions: 200, kill: false, extra: ["--break-reads"])
        #expect(reports.allSatisfy { $0.failed == 0 }, "\(reports)")
        let problems = reports.flatMap(\.stores).compactMap(\.readProblems).reduce(0, +)
        #expect(problems > 0, "the broken reads went unnoticed: \(reports)")
    }
}
