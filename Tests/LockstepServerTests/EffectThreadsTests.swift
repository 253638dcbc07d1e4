import Dispatch
import Foundation
import Lockstep
import Testing

@testable import LockstepServer

/// The threads effect handlers run on: their own, as many as runs need up to the limit, and still there for a run
/// that outlives the daemon.
@Suite(.timeLimit(.minutes(1))) struct EffectThreadsTests {
    @Test func aHandlerThatBlocksItsThreadHoldsUpNoOther() async throws {
        let threads = EffectThreads(limit: 2, name: "effects-test")
        defer { threads.stop() }
        let release = DispatchSemaphore(value: 0)
        let blocked = Task(executorPreference: threads) {
            // A handler that blocks, as a synchronous client would.
            release.wait()
            return threadName()
        }
        let other = await Task(executorPreference: threads) { threadName() }.value
        #expect(other == "effects-test", "a run goes on the effect threads, not the cooperative pool")
        release.signal()
        #expect(await blocked.value == "effects-test")
    }

    @Test func whatARunDoesOnceTheThreadsStoppedGoesOnElsewhere() async throws {
        let threads = EffectThreads(limit: 1, name: "effects-test")
        #expect(await Task(executorPreference: threads) { threadName() }.value == "effects-test")
        threads.stop()
        // A run that ignores cancellation, resumed after the daemon stopped: it still ends.
        let name = await Task(executorPreference: threads) { threadName() }.value
        #expect(name != "effects-test", "\(name ?? "unnamed")")
    }
}

/// The name of the thread that calls it, as Linux keeps it.
private func threadName() -> String? {
    (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8))?.trimmingCharacters(in: .newlines)
}
