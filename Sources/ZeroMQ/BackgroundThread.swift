import CZeroMQ
import Dispatch
import Foundation
import Synchronization

/// One thread of its own, at a low priority (nice 10), running the work handed to it in order: encoding and hashing a
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
                // Nice 10: the loops and the clients come first, but on a saturated machine the work still gets about a
                // tenth of a busy thread's share (at 19, a fortieth: a digest could wait seconds behind 20 processes).
                _ = lockstep_nice_current_thread(10)
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
