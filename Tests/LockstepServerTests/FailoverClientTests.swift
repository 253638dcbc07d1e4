import Foundation
import Lockstep
import LockstepClient
import LockstepExamples
import LockstepProtocol
import LockstepTesting
import TestSupport
import Testing
import ZeroMQ

#if canImport(Glibc)
import Glibc
#endif

/// Clients given every daemon of the pair find the leader by asking and follow it across a takeover (#21 step 3):
/// a `Replica` in this process, a `CommandClient`, and a `lockstep demo-client` process that only watches. The
/// standby comes first in every list, so each must be refused `not_leader` before it finds the leader.
extension FailoverProcessTests {
    @Test func clientsGivenBothDaemonsFollowTheLeaderAcrossAKill() async throws {
        let pair = try await Pair()
        let a = try pair.daemon(0)
        try await a.waitUntilServing()
        let b = try pair.daemon(1)
        try #require(try await status(b, role: "standby", within: .seconds(20)) != nil, "log:\n\(b.output)")
        let daemons = [b, a].map { DaemonEndpoints(command: $0.command, events: $0.events) }
        var configuration = ReplicaConfiguration(daemons: daemons)
        configuration.requestTimeout = .seconds(1)
        // Enough tries to outlast a takeover (the 3 s lease and a recovery) on a loaded machine.
        configuration.retries = 20
        configuration.readYourWritesTimeout = .seconds(60)
        let replica = try Replica(Counter.self, configuration: configuration)
        let watcher = try ReplicaClient(
            lockstep: productURL("lockstep"),
            daemons: daemons.map { ($0.command, $0.events) },
            stores: ["counter"],
            actions: 0
        )
        defer { watcher.child.kill() }
        let client = CommandClient(
            context: try Context(),
            endpoints: daemons.map(\.command),
            timeout: .seconds(1),
            retries: 20
        )
        let clientID = ClientID.random()
        /// Increment number `number` through the command client: its seq, or `nil` with an issue recorded. The client
        /// blocks (up to 20 tries of 1 s across a takeover): it waits on a thread of its own, and the issue is
        /// recorded here.
        func increment(_ number: UInt64) async throws -> SequenceNumber? {
            let request = Request.dispatch(
                DispatchRequest(
                    requestID: number,
                    domainVersion: Counter.version,
                    clientID: clientID,
                    store: try StoreName("counter"),
                    actions: [Array(#"{"increment":{}}"#.utf8)]
                )
            )
            let reply = try await offPool("increment", lending: client) { try $0.call(request) }
            guard case let .accepted(_, _, seq, _) = reply else {
                Issue.record("increment \(number) was answered \(reply)")
                return nil
            }
            return seq
        }

        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await replica.run() }
            try await replica.waitUntilLive(timeout: .seconds(60))
            for _ in 1...5 { try await replica.dispatch(.increment) }
            for number: UInt64 in 1...5 { _ = try await increment(number) }
            #expect(client.endpoint == a.command, "the command client did not settle on the leader")
            let before = try await replica.wait(for: 10, timeout: .seconds(30)).seq

            let killed = ContinuousClock.now
            a.kill()
            // Each waits out a's silence and b's `not_leader` (asked again every 200 ms) until b leads, with one key.
            let first = try await increment(6)
            print("failover: a command client's dispatch was answered \(ContinuousClock.now - killed) after the kill")
            #expect(client.endpoint == b.command)
            let seq = try await replica.dispatch(.increment)
            print("failover: a replica's dispatch was applied \(ContinuousClock.now - killed) after the leader's kill")
            #expect(first == before + 1 && seq == before + 2)
            for number: UInt64 in 7...10 { _ = try await increment(number) }
            // The replica goes on from its seq: the same epoch, no resync.
            _ = try await replica.wait(for: 16, timeout: .seconds(30))
            #expect(replica.confirmedState.count == 16)
            #expect(replica.status.resyncs == 0, "\(replica.status)")
            group.cancelAll()
            try await group.waitForAll()
        }

        // Every increment once, at one seq, in the history b continued.
        let events = try await pair.journalEvents()
        #expect(events.map(\.seq) == Array(1...16))
        let fromClient = events.filter { $0.client == clientID.bytes }.map(\.requestNumber)
        #expect(fromClient == Array(1...10))
        // The watcher followed b without starting over.
        let expected = try await b.digests(of: ["counter"]).mapValues { ($0.seq, "\($0.digest)") }
        #expect(await watcher.converge(on: expected, within: .seconds(30)), "\(String(describing: watcher.last))")
        #expect(watcher.store("counter")?.resyncs == 0, "\(String(describing: watcher.last))")
        #expect(try await watcher.stop().status == 0)
        #expect(await b.stop() == 0)
        await pair.close()
    }

    /// A `Dispatcher` that 64 tasks share, given both daemons (the standby first), goes on through the leader's kill:
    /// every dispatch answered once, each once in the history the standby continued.
    @Test func aDispatcherSharedBySixtyFourTasksFollowsTheLeaderAcrossAKill() async throws {
        let pair = try await Pair()
        let a = try pair.daemon(0)
        try await a.waitUntilServing()
        let b = try pair.daemon(1)
        try #require(try await status(b, role: "standby", within: .seconds(20)) != nil, "log:\n\(b.output)")
        var configuration = DispatcherConfiguration(commandEndpoints: [b.command, a.command])
        configuration.requestTimeout = .seconds(1)
        // Enough tries to outlast a takeover (the 3 s lease and a recovery) on a loaded machine.
        configuration.retries = 20
        let dispatcher = try Dispatcher(Counter.self, configuration: configuration)
        let (tasks, each) = (64, 5)
        let killed = Tally()
        let (seqs, answeredAtTheKill) = try await incrementFromTasks(dispatcher, tasks: tasks, each: each) {
            a.kill()
            killed.count.store(1, ordering: .relaxed)
        }
        #expect(killed.count.load(ordering: .relaxed) == 1)
        #expect(answeredAtTheKill < tasks * each, "the kill came after every dispatch was answered")
        #expect(seqs.sorted() == Array(1...SequenceNumber(tasks * each)))
        let events = try await pair.journalEvents()
        #expect(events.map(\.seq) == Array(1...UInt64(tasks * each)))
        #expect(events.map(\.requestNumber).sorted() == Array(1...UInt64(tasks * each)))
        #expect(events.allSatisfy { $0.client == dispatcher.clientID.bytes })
        #expect(await b.stop() == 0)
        await pair.close()
    }
}
