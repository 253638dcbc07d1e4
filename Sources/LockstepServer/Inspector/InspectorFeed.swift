import Lockstep
import LockstepProtocol
import Synchronization

/// What the command loop tells the inspector (docs/operations.md, "The inspector"), without waiting for it: the
/// seq each store has published (after each group it publishes, and once a second), the daemon's STATUS once a
/// second, and the answers that change no state —
/// rejections and ERRORs — as they are sent. The inspector's thread reads it; a page that falls behind loses the
/// oldest notices, never holds the loop. Actions themselves the inspector reads from the journal.
final class InspectorFeed: Sendable {
    /// A rejection or an ERROR the loop answered, numbered in the order they were sent.
    enum Notice: Hashable, Sendable {
        case rejected(store: String, author: String, code: String, reason: String, actions: [[UInt8]])
        case error(code: String, reason: String)
    }

    /// How many notices are kept for a reader that has not read them yet.
    static let capacity = 512

    private struct State {
        var published: [StoreName: UInt64] = [:]
        var status: DaemonStatus?
        var notices: [Notice] = []
        /// The number of the first notice in `notices`.
        var firstNotice = 0
    }

    private let state = Mutex(State())

    /// The seq each store has published, as the loop's leadership keeps it.
    func published(_ seqs: [StoreName: UInt64]) {
        state.withLock { $0.published = seqs }
    }

    /// The daemon's status now, and the seq each store has published (none while it stands by).
    func status(_ status: DaemonStatus, published: [StoreName: UInt64]) {
        state.withLock {
            $0.status = status
            $0.published = published
        }
    }

    /// `notice` was sent.
    func notice(_ notice: Notice) {
        state.withLock { state in
            state.notices.append(notice)
            // Trimmed in halves, so that a notice costs the loop an append, not a shift of the whole array.
            if state.notices.count > 2 * Self.capacity {
                let dropped = state.notices.count - Self.capacity
                state.notices.removeFirst(dropped)
                state.firstNotice += dropped
            }
        }
    }

    /// The seqs published and the status, as they stand.
    var current: (published: [StoreName: UInt64], status: DaemonStatus?) {
        state.withLock { ($0.published, $0.status) }
    }

    /// What the inspector reads: the seqs published, the status, and the notices from number `next` on (with the
    /// number to read from next, and how many were lost before the first returned).
    func read(
        noticesFrom next: Int
    ) -> (
        published: [StoreName: UInt64], status: DaemonStatus?, notices: [Notice], next: Int, lost: Int
    ) {
        state.withLock { state in
            let start = max(next, state.firstNotice)
            let notices = Array(state.notices[(start - state.firstNotice)...])
            return (state.published, state.status, notices, start + notices.count, start - next)
        }
    }
}
