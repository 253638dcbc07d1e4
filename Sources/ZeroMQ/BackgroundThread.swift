import CZeroMQ
import Dispatch
import Foundation
import Synchronization

/// One thread of its own, at the lowest priority, running the work handed to it in order: encoding and hashing a
/// large state for a checkpoint must neither hold a loop nor, on a busy machine, take the CPU from one. Started by
/// the first ``submit(_:)``; ``stop()`` ends it once the work in hand is done.
public final class BackgroundThread: Sendable {
    private struct Queue {
        var work: [@Sendable () -> Void] = []
        var started = false
        var stopping = false
    }

    private let name: String
    private let queue = Mutex(Queue())
    private let ready = DispatchSemaphore(value: 0)

    /// A thread named `name` (as `ps -L` and `perf` show it; 15 bytes are kept), not started yet.
    public init(name: String) {
        self.name = name
    }

    /// Runs `work` on the thread after what was handed to it before.
    public func submit(_ work: @escaping @Sendable () -> Void) {
        let start = queue.withLock { queue -> Bool in
            guard !queue.stopping else { return false }
            queue.work.append(work)
            defer { queue.started = true }
            return !queue.started
        }
        if start {
            let thread = Thread { [self] in
                nameCurrentThread(name)
                // Nice 19: a core the loops and the clients leave idle does the work; under load it gets a small share.
                _ = lockstep_nice_current_thread(19)
                run()
            }
            thread.start()
        }
        ready.signal()
    }

    /// Ends the thread once the work in hand is done; later work is dropped.
    public func stop() {
        queue.withLock { $0.stopping = true }
        ready.signal()
    }

    private func run() {
        while true {
            ready.wait()
            let (work, stopping) = queue.withLock { queue in
                defer { queue.work.removeAll() }
                return (queue.work, queue.stopping)
            }
            for item in work { item() }
            if stopping { return }
        }
    }
}
