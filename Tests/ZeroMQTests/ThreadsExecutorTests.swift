import Dispatch
import Foundation
import Testing

@testable import ZeroMQ

/// The executor effect handlers run on: threads of its own, as many as jobs need up to the limit, and a way on for
/// a task that outlives it.
@Suite(.timeLimit(.minutes(1))) struct ThreadsExecutorTests {
    @Test func aTaskThatBlocksItsThreadHoldsUpNoOther() async throws {
        let threads = ThreadsExecutor(limit: 2, name: "executor-test")
        defer { threads.stop() }
        let release = DispatchSemaphore(value: 0)
        let blocked = Task(executorPreference: threads) {
            // A task that blocks, as an effect handler with a synchronous client would.
            release.wait()
            return threadName()
        }
        let other = await Task(executorPreference: threads) { threadName() }.value
        #expect(other == "executor-test", "a task goes on the executor's threads, not the cooperative pool")
        release.signal()
        #expect(await blocked.value == "executor-test")
    }

    @Test func whatATaskDoesOnceTheExecutorStoppedGoesOnElsewhere() async throws {
        let threads = ThreadsExecutor(limit: 1, name: "executor-test")
        #expect(await Task(executorPreference: threads) { threadName() }.value == "executor-test")
        threads.stop()
        // A task that ignored cancellation, resumed after the executor stopped: it still ends.
        let name = await Task(executorPreference: threads) { threadName() }.value
        #expect(name != "executor-test", "\(name ?? "unnamed")")
    }
}

/// The name of the thread that calls it, as Linux keeps it.
private func threadName() -> String? {
    (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8))?.trimmingCharacters(in: .newlines)
}
