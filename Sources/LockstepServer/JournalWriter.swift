import Dispatch
import Foundation
import Lockstep
import LockstepJournal
import LockstepProtocol
import ZeroMQ

/// The journal's own thread, for work the loop must not wait on: a PostgreSQL journal's commits, lease renewals
/// and a takeover's recovery, and SQLite's commit while a reader holds its one connection (otherwise a local
/// journal commits on the loop; `LoopState.commitsOnLoop` says why). The loop
/// hands it one piece of work at a time and goes on sequencing the next requests meanwhile; the writer wakes the
/// loop when the work is done or failed. The loop only hands it work while it is idle, so there is at most one
/// commit in flight.
final class JournalWriter: Sendable {
    /// What a piece of work came to, for the value that asked for it.
    enum Completion: Sendable {
        /// A commit, sync or lease renewal: for the ``CommitPipeline``.
        case commit(Result<Void, CommitFailure>)
        /// An attempt to take the lease: for ``Leadership``.
        case leaseAttempt(Result<LeaseOutcome, Leadership.Failure>)
        /// A takeover's renewal and recovery: for ``Leadership``, with the stores recovered and when the fence that
        /// renewed the lease was sent.
        case recovery(Result<(recovered: CommandLoop.Recovered, fencedAt: ContinuousClock.Instant), Leadership.Failure>)
    }

    typealias Work = @Sendable () -> Completion

    private struct Slot {
        var work: Work?
        var result: Completion?
        var stopping = false
    }

    private let slot = LockedValue(Slot())
    private let ready = DispatchSemaphore(value: 0)
    /// Signalled once per result, and taken once per result taken: what ``waitForResult()`` blocks on.
    private let done = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)
    private let wakeup: Wakeup

    /// Starts the thread (`lockstepd journal`); each result is announced on `wakeup`.
    init(wakeup: Wakeup) {
        self.wakeup = wakeup
        let thread = Thread { [self] in
            nameCurrentThread("lockstepd journal")
            run()
        }
        thread.start()
    }

    /// Hands over `work`; the writer must be idle (its last result taken).
    func submit(_ work: @escaping Work) {
        slot.withLockedValue { slot in
            precondition(slot.work == nil && slot.result == nil, "the journal writer is busy")
            slot.work = work
        }
        ready.signal()
    }

    /// The result of the work handed over, once it is done; `nil` while it runs.
    func takeResult() -> Completion? {
        let result = slot.withLockedValue { slot in
            defer { slot.result = nil }
            return slot.result
        }
        if result != nil { done.wait() }  // signalled already: keeps one signal per result not yet taken
        return result
    }

    /// Blocks until the work handed over is done — as long as the journal takes: a daemon stopping waits for its
    /// last commit — and returns its result.
    func waitForResult() -> Completion {
        done.wait()
        done.signal()  // takeResult consumes it
        return takeResult()!
    }

    /// Ends the thread once the work in hand is done; returns when it has ended.
    func stop() {
        slot.withLockedValue { $0.stopping = true }
        ready.signal()
        finished.wait()
    }

    private func run() {
        while true {
            ready.wait()
            let (work, stopping) = slot.withLockedValue { slot in (slot.work, slot.stopping) }
            if let work {
                let result = work()
                slot.withLockedValue { slot in
                    slot.work = nil
                    slot.result = result
                }
                done.signal()
                wakeup.signal()
            }
            if stopping { break }
        }
        finished.signal()
    }
}
