import Dispatch
import Foundation
import Synchronization

/// A task executor of at most `limit` threads of its own, started as the jobs enqueued need them, which run those
/// jobs in order of arrival: for tasks that must not wait for a thread of Swift's cooperative pool, which other
/// code in the process may keep busy for seconds, nor hold one of its threads when they block. The daemon runs
/// effect handlers on one (a run's timeout then measures the handler); tests run long synchronous checks on one of
/// a single thread.
///
/// Once stopped, the threads finish what is queued and end; a job enqueued later (a task that ignored cancellation,
/// resumed) runs on the global executor.
package final class ThreadsExecutor: TaskExecutor, Sendable {
    private let limit: Int
    private let name: String
    private let ready = DispatchSemaphore(value: 0)
    private let state = Mutex((jobs: [UnownedJob](), head: 0, threads: 0, idle: 0, stopped: false))

    package init(limit: Int, name: String) {
        self.limit = max(1, limit)
        self.name = name
    }

    package func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        let (queued, startThread) = state.withLock { state -> (Bool, Bool) in
            guard !state.stopped else { return (false, false) }
            state.jobs.append(unowned)
            guard state.jobs.count - state.head > state.idle, state.threads < limit else { return (true, false) }
            state.threads += 1
            state.idle += 1
            return (true, true)
        }
        guard queued else {
            globalConcurrentExecutor.enqueue(ExecutorJob(unowned))
            return
        }
        if startThread {
            Thread { [self] in
                nameCurrentThread(name)
                work()
            }.start()
        }
        ready.signal()
    }

    /// Lets the threads end once what is queued has run.
    package func stop() {
        let threads = state.withLock { state in
            state.stopped = true
            return state.threads
        }
        for _ in 0..<threads { ready.signal() }
    }

    private func work() {
        while true {
            ready.wait()
            let job = state.withLock { state -> UnownedJob?? in
                guard state.head < state.jobs.count else { return state.stopped ? .some(nil) : nil }
                defer {
                    state.head += 1
                    if state.head == state.jobs.count {
                        state.jobs.removeAll(keepingCapacity: true)
                        state.head = 0
                    }
                }
                state.idle -= 1
                return state.jobs[state.head]
            }
            switch job {
            case .none: continue
            case .some(.none):
                state.withLock { state in
                    state.threads -= 1
                    state.idle -= 1
                }
                return
            case .some(.some(let job)):
                job.runSynchronously(on: asUnownedTaskExecutor())
                state.withLock { $0.idle += 1 }
            }
        }
    }
}
