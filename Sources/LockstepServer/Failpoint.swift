#if canImport(Glibc)
import Glibc
#endif

/// A crash on purpose, for the fault suite: with `LOCKSTEP_FAILPOINT=POINT:N` in its environment the daemon
/// kills itself (SIGKILL, no clean-up) the N-th time a turn that commits reaches POINT. Unset, it costs one
/// comparison per turn.
struct Failpoint: Sendable {
    enum Point: String, Sendable, CaseIterable {
        /// Requests sequenced, nothing written.
        case beforeCommit = "before-commit"
        /// The batch is durable; no reply has been sent.
        case afterCommit = "after-commit"
        /// Replies sent; the events are not published yet.
        case afterReply = "after-reply"
        /// Not a crash: the journal never fsyncs (SQLite `synchronous = OFF`), so acknowledged actions are lost
        /// on a power cut. Only for proving that the fault suite's power-cut class can fail.
        case noSync = "no-sync"
    }

    let point: Point
    private var remaining: Int

    /// The failpoint `LOCKSTEP_FAILPOINT` names, `nil` when it is unset; a malformed value is an error.
    init?(environment: [String: String]) throws(ServerError) {
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
    }

    /// The loop reached `point`.
    mutating func pass(_ point: Point) {
        guard point == self.point else { return }
        remaining -= 1
        if remaining == 0 { kill(getpid(), SIGKILL) }
    }
}
