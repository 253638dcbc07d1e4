import Dispatch
import Foundation
import Synchronization

/// Runs `body` in the calling task, but on a thread of its own rather than on one of Swift's cooperative pool: for
/// long synchronous work — a check that encodes thousands of values, a fuzzer — in a test that checks as it goes.
///
/// `offPool` (LockstepTesting) runs a closure on another thread, outside the task, so `#expect` there would find
/// no test. Here the task is the same — it only prefers an executor of its own for the while
/// (`withTaskExecutorPreference`) — so `#expect`, `#require` and `Issue.record` in `body` find the test as
/// anywhere else in it, while the pool's threads (as many as the cores) stay free for every other test's tasks:
/// a replica's `run()`, a daemon's service, a continuation resumed from a wait.
///
/// Work `body` hands to an actor still runs on that actor; only the task's own nonisolated code moves.
public func onOwnThread<T, E: Error>(
    _ name: String = "test thread",
    _ body: () async throws(E) -> T
) async throws(E) -> T {
    let executor = ThreadExecutor(name: name)
    defer { executor.finish() }
    return try await withTaskExecutorPreference(executor) { () async throws(E) -> T in try await body() }
}

/// A task executor with one thread, which runs the jobs enqueued on it in order and ends once ``finish()`` has
/// been called and no job is left.
private final class ThreadExecutor: TaskExecutor {
    private struct Queue {
        var jobs: [UnownedJob] = []
        var finished = false
    }

    private let queue = Mutex(Queue())
    /// One signal per job enqueued and one for ``finish()``: the thread waits for the next.
    private let signals = DispatchSemaphore(value: 0)

    init(name: String) {
        let thread = Thread { [self] in
            // Foundation names a thread only from the thread itself; Linux keeps 15 bytes.
            var name = name
            while name.utf8.count > 15 { name.removeLast() }
            Thread.current.name = name
            run()
        }
        thread.start()
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        queue.withLock { $0.jobs.append(job) }
        signals.signal()
    }

    /// Lets the thread end once the jobs enqueued so far have run.
    func finish() {
        queue.withLock { $0.finished = true }
        signals.signal()
    }

    private func run() {
        while true {
            signals.wait()
            let next = queue.withLock { queue -> (job: UnownedJob?, finished: Bool) in
                (queue.jobs.isEmpty ? nil : queue.jobs.removeFirst(), queue.finished)
            }
            if let job = next.job {
                job.runSynchronously(on: asUnownedTaskExecutor())
            } else if next.finished {
                return
            }
        }
    }
}
