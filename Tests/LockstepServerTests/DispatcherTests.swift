import Foundation
import Lockstep
import LockstepClient
import LockstepExamples
import LockstepJournal
import LockstepProtocol
import LockstepTesting
import Synchronization
import TestSupport
import Testing

/// `Dispatcher<D>` in this process against a real `lockstepd`: many tasks over one connection, every dispatch
/// answered once, through a `kill -9` and a restart of the daemon.
@Suite struct DispatcherTests {
    /// 64 tasks × 10 increments each through one dispatcher; the daemon is killed with SIGKILL and started again on
    /// its journal once a third are answered.
    @Test func sixtyFourTasksShareOneDispatcherThroughAKillAndARestart() async throws {
        let directory = try TestSupport.temporaryDirectory("dispatcher-kill").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let daemon = try DaemonProcess(directory: directory, arguments: ["--domain", "counter"])
        try await daemon.waitUntilServing()
        var configuration = DispatcherConfiguration(commandEndpoints: [daemon.command])
        configuration.requestTimeout = .seconds(1)
        // Enough tries to outlast a restart (recovery and all) on a loaded machine.
        configuration.retries = 30
        let dispatcher = try Dispatcher(Counter.self, configuration: configuration)
        let (tasks, each) = (64, 10)
        let (seqs, answeredAtTheKill) = try await incrementFromTasks(dispatcher, tasks: tasks, each: each) {
            daemon.kill()
            #expect(await daemon.waitForExit(within: .seconds(10)) != nil)
            try daemon.start()
        }
        #expect(answeredAtTheKill < tasks * each, "the kill came after every dispatch was answered")
        // Every dispatch answered once, each at its own seq: no gaps, none twice.
        #expect(seqs.sorted() == Array(1...SequenceNumber(tasks * each)))
        #expect(await daemon.stop() == 0, "\(daemon.output)")
        // And in the journal: each request of this client once.
        let events = try await offPool("journal") {
            let journal = try openLocalJournal(directory: "\(directory)/.lockstep/data", readOnly: true)
            defer { try? journal.close() }
            guard case let .events(events) = try journal.events(store: "counter", from: 1, to: 10_000, limit: 10_000)
            else { return [JournalEvent]() }
            return events
        }
        #expect(events.map(\.seq) == Array(1...SequenceNumber(tasks * each)))
        #expect(events.allSatisfy { $0.clientID == dispatcher.clientID.bytes })
        #expect(events.map(\.requestNumber).sorted() == Array(1...UInt64(tasks * each)))
    }

    /// The domain's rejection comes back as itself, a store the daemon does not host is refused by name, and a
    /// stopped dispatcher says so.
    @Test func rejectionsRefusalsAndAStopAreTheCallersToSee() async throws {
        let directory = try TestSupport.temporaryDirectory("dispatcher-errors").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let daemon = try DaemonProcess(directory: directory, arguments: ["--domain", "todos"])
        try await daemon.waitUntilServing()
        var configuration = DispatcherConfiguration(commandEndpoints: [daemon.command])
        configuration.requestTimeout = .seconds(1)
        configuration.retries = 10
        let todos = try Dispatcher(Todos.self, configuration: configuration)
        let counter = try Dispatcher(Counter.self, configuration: configuration)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await todos.run() }
            group.addTask { try await counter.run() }
            #expect(try await todos.dispatch(.add(text: "milk")) == 1)
            await #expect(throws: Rejection.self) {
                do {
                    try await todos.dispatch(.toggle(id: 99))
                } catch let rejection as Rejection {
                    #expect(rejection.code == "unknown_id", "\(rejection)")
                    throw rejection
                }
            }
            let batch = try await todos.dispatch(batch: [.add(text: "eggs"), .toggle(id: 1)])
            #expect(batch == 2...3)
            do {
                try await counter.dispatch(.increment)
                Issue.record("a store the daemon does not host took a dispatch")
            } catch let error as ClientError {
                #expect(error.code == .refused, "\(error)")
                #expect(error.reason.contains("counter"), "\(error)")
            }
            group.cancelAll()
            while try await group.next() != nil {}
        }
        do {
            try await todos.dispatch(.add(text: "late"))
            Issue.record("a stopped dispatcher took a dispatch")
        } catch let error as ClientError {
            #expect(error.code == .stopped, "\(error)")
        }
        #expect(await daemon.stop() == 0)
    }
}

/// A count many tasks add to.
final class Tally: Sendable {
    let count = Atomic<Int>(0)
}

/// `tasks` tasks × `each` increments through `dispatcher` (run meanwhile), with `fault` done once a third are
/// answered: the seqs they got, and how many were answered when the fault began.
func incrementFromTasks(
    _ dispatcher: Dispatcher<Counter>,
    tasks: Int,
    each: Int,
    whenAThirdIsAnswered fault: () async throws -> Void
) async throws -> (seqs: [SequenceNumber], answeredAtTheFault: Int) {
    let answered = Tally()
    return try await withThrowingTaskGroup(of: [SequenceNumber].self) { group in
        group.addTask {
            try await dispatcher.run()
            return []
        }
        // Queued before run() may have started: they wait for it.
        let dispatching = Task {
            try await withThrowingTaskGroup(of: [SequenceNumber].self) { tasksGroup in
                for _ in 0..<tasks {
                    tasksGroup.addTask {
                        var seqs: [SequenceNumber] = []
                        for _ in 0..<each {
                            seqs.append(try await dispatcher.dispatch(.increment))
                            answered.count.add(1, ordering: .relaxed)
                        }
                        return seqs
                    }
                }
                return try await tasksGroup.reduce(into: []) { $0 += $1 }
            }
        }
        let third = try await eventually(within: .seconds(60)) {
            answered.count.load(ordering: .relaxed) >= tasks * each / 3
        }
        try #require(third, "only \(answered.count.load(ordering: .relaxed)) dispatches were answered in 60 s")
        let answeredAtTheFault = answered.count.load(ordering: .relaxed)
        try await fault()
        let seqs = try await dispatching.value
        group.cancelAll()
        while try await group.next() != nil {}
        return (seqs, answeredAtTheFault)
    }
}
