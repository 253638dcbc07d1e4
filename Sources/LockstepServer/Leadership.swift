import LockstepJournal

/// Whether this daemon leads its journal, and how it comes to, as a value: no socket, no journal and no clock in
/// it. Every event carries `now`; every decision comes back as an ``Action`` for the loop to carry out on the
/// journal writer's thread, so that a slow or unreachable database never holds the loop (docs/operations.md,
/// "Leader and standby").
///
/// A daemon on a local journal leads from the start. On a PostgreSQL journal shared by several daemons it leads
/// only while it holds the journal's lease:
///
/// - **standing by**: another daemon leads (or none could be read). It tries to take the lease every third of the
///   lease's duration, or as soon as the holder's lease expires.
/// - **recovering**: it took the lease (or still holds it after a failed commit). The writer's thread renews it —
///   the fence waits for a commit of the previous leader still in flight — and recovers every store; meanwhile the
///   daemon answers as a standby does. A recovery that fails lets the lease go and stands by again.
/// - **leading**: it serves, until a commit or renewal says another daemon took the lease, or a commit fails.
package struct Leadership {
    /// How a leadership began: its term, who led before, when the takeover began, and whether the lease was this
    /// daemon's already (it recovers after a failed commit).
    package struct Takeover: Hashable, Sendable {
        package var term: UInt64
        package var previousHolder: String
        package var since: ContinuousClock.Instant
        package var afterFailedCommit = false

        package init(
            term: UInt64,
            previousHolder: String,
            since: ContinuousClock.Instant,
            afterFailedCommit: Bool = false
        ) {
            self.term = term
            self.previousHolder = previousHolder
            self.since = since
            self.afterFailedCommit = afterFailedCommit
        }
    }

    /// Where the daemon stands.
    package enum Role: Hashable, Sendable {
        /// It serves: alone on a local journal (no takeover), or holding the lease.
        case leading(Takeover?)
        /// It holds the lease and its stores are being recovered before it serves.
        case recovering(Takeover)
        /// Another daemon leads, or none could be read.
        case standingBy
    }

    /// Why an attempt to take the lease, or a recovery, failed.
    package struct Failure: Error, Hashable, Sendable, CustomStringConvertible {
        package var description: String

        package init(_ description: String) { self.description = description }
    }

    /// What the loop must do.
    package enum Action: Hashable, Sendable {
        /// Try to take the lease on the writer's thread; then tell ``attempted(_:now:)``.
        case attemptLease
        /// Renew the lease of `term` and recover every store on the writer's thread, letting the lease go if that
        /// fails; then tell ``recovered(_:now:)``.
        case recover(term: UInt64)
        /// Serve with the stores just recovered.
        case lead(Takeover)
        /// Tell the log and systemd where the daemon stands now (``role``, ``leader``, ``problem``).
        case announce
        /// Log, once per new problem, that the lease could not be read or taken.
        case attemptFailed(reason: String)
        /// Log that the recovery failed and the daemon stands by to try again.
        case recoveryFailed(reason: String)
    }

    /// Where the daemon stands now.
    package private(set) var role: Role
    /// How long the journal's lease lasts unless renewed; `nil` on a local journal.
    package let leaseDuration: Duration?
    /// The leader as the last attempt read it; `nil` before one did, or when the last attempt failed.
    package private(set) var leader: JournalLeader?
    /// Why the last attempt or recovery failed, when it did.
    package private(set) var problem: String?
    private var nextAttempt: ContinuousClock.Instant
    private var attempting = false

    /// A daemon on a local journal: it leads from the start, for good.
    package static var unleased: Leadership {
        Leadership(role: .leading(nil), leaseDuration: nil, nextAttempt: .now)
    }

    private init(role: Role, leaseDuration: Duration?, nextAttempt: ContinuousClock.Instant) {
        self.role = role
        self.leaseDuration = leaseDuration
        self.nextAttempt = nextAttempt
    }

    /// A daemon on a PostgreSQL journal whose lease lasts `leaseDuration`, after its first attempt at start found
    /// `outcome`: leading (it recovers before it binds), or standing by until the holder's lease may expire.
    package init(leaseDuration: Duration, startedWith outcome: LeaseOutcome, now: ContinuousClock.Instant) {
        self.leaseDuration = leaseDuration
        switch outcome {
        case let .leading(term, previousHolder):
            role = .leading(Takeover(term: term, previousHolder: previousHolder, since: now))
            nextAttempt = now
        case let .standingBy(found):
            role = .standingBy
            leader = found
            nextAttempt = now + Self.wait(for: found, leaseDuration: leaseDuration)
        }
    }

    /// Whether the daemon serves requests now.
    package var isLeading: Bool {
        if case .leading = role { return true }
        return false
    }

    /// Whether the writer's thread is working for it (an attempt or a recovery): the daemon waits for that before
    /// it stops.
    package var isWaitingForWriter: Bool {
        if case .recovering = role { return true }
        return attempting
    }

    /// How long to wait before the next attempt: a third of the lease, or until the holder's lease expires.
    static func wait(for leader: JournalLeader, leaseDuration: Duration) -> Duration {
        min(leaseDuration / 3, max(leader.expiresIn, .milliseconds(10)))
    }

    /// When ``tick(now:)`` has something to do: the next attempt to take the lease.
    package var nextDeadline: ContinuousClock.Instant? {
        guard case .standingBy = role, !attempting else { return nil }
        return nextAttempt
    }

    /// Time passed: a standby whose next attempt is due tries to take the lease.
    package mutating func tick(now: ContinuousClock.Instant) -> [Action] {
        guard case .standingBy = role, !attempting, now >= nextAttempt else { return [] }
        attempting = true
        return [.attemptLease]
    }

    /// An attempt to take the lease came back with `result`.
    package mutating func attempted(_ result: Result<LeaseOutcome, Failure>, now: ContinuousClock.Instant) -> [Action] {
        guard attempting, case .standingBy = role, let leaseDuration else { return [] }
        attempting = false
        switch result {
        case let .success(.leading(term, previousHolder)):
            role = .recovering(Takeover(term: term, previousHolder: previousHolder, since: now))
            return [.announce, .recover(term: term)]
        case let .success(.standingBy(found)):
            let changed = found.holder != leader?.holder || found.term != leader?.term || problem != nil
            leader = found
            problem = nil
            nextAttempt = now + Self.wait(for: found, leaseDuration: leaseDuration)
            return changed ? [.announce] : []
        case let .failure(failure):
            let new = problem != failure.description
            problem = failure.description
            leader = nil
            nextAttempt = now + leaseDuration / 3
            return new ? [.attemptFailed(reason: failure.description)] : []
        }
    }

    /// The recovery after a takeover came back: the daemon leads, or, having let the lease go, stands by to try
    /// again (another daemon may recover where this one cannot: a newer build, a reachable database).
    package mutating func recovered(_ result: Result<Void, Failure>, now: ContinuousClock.Instant) -> [Action] {
        guard case let .recovering(takeover) = role, let leaseDuration else { return [] }
        switch result {
        case .success:
            role = .leading(takeover)
            return [.lead(takeover)]
        case let .failure(failure):
            role = .standingBy
            problem = "could not recover: \(failure.description)"
            leader = nil
            nextAttempt = now + leaseDuration / 3
            return [.recoveryFailed(reason: failure.description), .announce]
        }
    }

    /// This leadership is over (`reason`): the daemon stands by — recovering at once when it still holds the lease
    /// in term `stillHeld` (a commit failed, so its stores must be rebuilt from the journal), trying to take the
    /// lease at once otherwise. `holder` is this daemon's own name in the lease.
    package mutating func lost(stillHeld: UInt64?, holder: String, now: ContinuousClock.Instant) -> [Action] {
        guard case .leading = role, leaseDuration != nil else { return [] }
        leader = nil
        problem = nil
        if let stillHeld {
            role = .recovering(Takeover(term: stillHeld, previousHolder: holder, since: now, afterFailedCommit: true))
            return [.announce, .recover(term: stillHeld)]
        }
        role = .standingBy
        nextAttempt = now
        return [.announce]
    }

    /// Why a request other than STATUS is refused `not_leader` while the daemon does not lead; `holder` is its own
    /// name in the lease.
    package func refusal(holder: String) -> String {
        let leading: String
        switch role {
        case let .recovering(takeover):
            leading = "it holds the lease (term \(takeover.term)) and is recovering its stores to lead"
        case .leading, .standingBy:
            if let leader {
                leading =
                    "\(leader.holder) leads the journal (term \(leader.term), its lease expires at "
                    + "\(leader.expiresAt) unless renewed)"
            } else {
                leading = "no leader is known (\(problem ?? "not asked yet"))"
            }
        }
        return "this daemon (\(holder)) is a standby and applies nothing: \(leading); send the request to the leader, "
            + "or again here after a takeover, with the same request number"
    }
}
