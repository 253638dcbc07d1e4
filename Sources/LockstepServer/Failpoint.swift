#if canImport(Glibc)
import Glibc
#endif

/// A crash on purpose, for the fault suite: with `LOCKSTEP_FAILPOINT=POINT:N` in its environment a daemon of a test
/// build kills itself (SIGKILL, no clean-up) the N-th time a turn that commits reaches POINT. Unset, it costs one
/// comparison per turn.
///
/// Failpoints exist only in test builds: `LOCKSTEP_FAILPOINTS` is defined for debug builds alone (Package.swift),
/// so a release daemon — what runs in production — has no code that reads the variable or acts on it, and
/// ``init(environment:)`` returns `nil` there whatever it says (the daemon logs that it ignored it).
struct Failpoint: Sendable {
    enum Point: String, Sendable, CaseIterable {
        /// Requests sequenced, nothing written.
        case beforeCommit = "before-commit"
        /// The batch is durable; no reply has been sent.
        case afterCommit = "after-commit"
        /// Replies sent; the events are not published yet.
        case afterReply = "after-reply"
        /// An effect's action is durable and its run is about to start (counted per run started).
        case effectStart = "effect-start"
        /// An effect's run ended; what it returned is not sequenced yet (counted per run that ended).
        case effectRan = "effect-ran"
        /// Not a crash: the journal never fsyncs (SQLite `synchronous = OFF`), so acknowledged actions are lost
        /// on a power cut. Only for proving that the fault suite's power-cut class can fail.
        case noSync = "no-sync"
        /// Not a crash: on a PostgreSQL journal the fence checks nothing — a commit or a renewal goes through
        /// whoever holds the lease row — so a leader cut off and healed leads on beside its successor. Only for
        /// proving that the fault suite's partition classes catch two leaders.
        case unfenced
    }

    /// Whether this build has failpoints: a debug (test) build.
    static var compiledIn: Bool {
        #if LOCKSTEP_FAILPOINTS
        true
        #else
        false
        #endif
    }

    let point: Point
    private var remaining: Int

    /// The failpoint `LOCKSTEP_FAILPOINT` names, `nil` when it is unset or this is not a test build; a malformed
    /// value is an error in a test build.
    init?(environment: [String: String]) throws(ServerError) {
        #if LOCKSTEP_FAILPOINTS
        guard let value = environment["LOCKSTEP_FAILPOINT"], !value.isEmpty else { return nil }
        let parts = value.split(separator: ":", maxSplits: 1).map(String.init)
        guard let point = Point(rawValue: parts[0]), let count = parts.count == 2 ? Int(parts[1]) : 1, count >= 1
        else {
            let points = Point.allCases.map(\.rawValue).joined(separator: ", ")
            throw ServerError(
                code: .configuration,
                "LOCKSTEP_FAILPOINT='\(value)' is not POINT or POINT:N with POINT one of \(points) and N ≥ 1"
            )
        }
        self.point = point
        remaining = count
        #else
        return nil
        #endif
    }

    /// The loop reached `point`.
    mutating func pass(_ point: Point) {
        #if LOCKSTEP_FAILPOINTS
        guard point == self.point else { return }
        remaining -= 1
        if remaining == 0 { kill(getpid(), SIGKILL) }
        #endif
    }
}
