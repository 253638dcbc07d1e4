import Dispatch
import Foundation
import Lockstep
import ZeroMQ

/// The threads effect handlers run on: a task executor of at most `limit` threads of the daemon's own, started as
/// runs need them. A run's timeout then measures the handler, not the wait for a thread of Swift's cooperative
/// pool — which other code in the process (a test suite, an HTTP server's handlers) may keep busy for seconds —
/// and a handler that blocks (a synchronous client, a file write) holds one of these threads, never one of the pool.
///
/// Once stopped, the threads finish what is queued and end; whatever a run still does later (one that ignores
/// cancellation) goes on on the global executor.
final class EffectThreads: TaskExecutor, Sendable {
    private let limit: Int
    private let name: String
    private let ready = DispatchSemaphore(value: 0)
    private let state = LockedValue((jobs: [UnownedJob](), head: 0, threads: 0, idle: 0, stopped: false))

    init(limit: Int, name: String) {
        self.limit = max(1, limit)
        self.name = name
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        let (queued, startThread) = state.withLockedValue { state -> (Bool, Bool) in
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
    func stop() {
        let threads = state.withLockedValue { state in
            state.stopped = true
            return state.threads
        }
        for _ in 0..<threads { ready.signal() }
    }

    private func work() {
        while true {
            ready.wait()
            let job = state.withLockedValue { state -> UnownedJob?? in
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
                state.withLockedValue { state in
                    state.threads -= 1
                    state.idle -= 1
                }
                return
            case .some(.some(let job)):
                job.runSynchronously(on: asUnownedTaskExecutor())
                state.withLockedValue { $0.idle += 1 }
            }
        }
    }
}
