/// Which daemon of a failover group a client sends its requests to, and where it goes next, as a value: no socket
/// and no clock in it (docs/protocol.md, "Failover").
///
/// Several `lockstepd` may share one PostgreSQL journal; one leads, the others stand by and answer every request
/// but STATUS with ERROR `not_leader`. A client that holds all their command endpoints finds the leader by asking:
/// it sends to one; when that one is silent for a request's timeout it moves to the next; when it answers
/// `not_leader` it moves at once to the next that has neither answered so nor gone silent since a leader last
/// answered. When every daemon that answers says `not_leader` (a takeover is under way, or none can lead), it asks
/// them again after ``pause``, so a search never spins. A daemon that went silent is asked again in turn after the
/// next timeout, so one that comes back is found.
///
/// With a single endpoint the search stays on it: silence renews the socket to the same daemon, and a `not_leader`
/// (a lone standby, waiting for the lease) is asked again after ``pause``.
public struct LeaderSearch: Hashable, Sendable {
    /// How long a client waits before asking again when every daemon that answers said `not_leader`.
    public static let pause = Duration.milliseconds(200)

    /// The daemons' command endpoints, in the order they are tried.
    public let endpoints: [String]
    /// The index in ``endpoints`` of the daemon requests go to now.
    public private(set) var current = 0
    /// Daemons that let a request's timeout pass, without a word, since a leader last answered.
    private var silent: Set<Int> = []
    /// Daemons that answered `not_leader` since a leader last answered: alive, whatever timeout passes while a
    /// client is at one of them.
    private var standingBy: Set<Int> = []
    /// Daemons that answered `not_leader` in this pass.
    private var refusing: Set<Int> = []
    /// Whether the current daemon answered anything (but `not_leader`) since requests went to it.
    private var answeredHere = false

    /// A search over `endpoints` (at least one), starting with the first.
    public init(endpoints: [String]) {
        precondition(!endpoints.isEmpty, "a leader search needs at least one endpoint")
        self.endpoints = endpoints
    }

    /// The command endpoint requests go to now.
    public var endpoint: String { endpoints[current] }

    /// Whether the daemon requests go to now said `not_leader` since a leader last answered: alive, standing by.
    public var currentIsStandingBy: Bool { standingBy.contains(current) }

    /// The current daemon answered a request with anything but `not_leader`: it leads (or serves alone), and what
    /// was learnt about the others is stale.
    public mutating func answered() {
        silent.removeAll()
        standingBy.removeAll()
        refusing.removeAll()
        answeredHere = true
    }

    /// A request's timeout passed at the current daemon: requests go to the next one. The daemon counts as silent
    /// unless it answered since requests went to it (slow, not gone), or said `not_leader` (a standby is alive; one
    /// that says nothing more by the next timeout is silent then).
    public mutating func timedOut() {
        if standingBy.remove(current) == nil, !answeredHere { silent.insert(current) }
        current = (current + 1) % endpoints.count
        answeredHere = false
    }

    /// The current daemon answered `not_leader`: requests go to the next that may lead. Returns how long to wait
    /// before sending there: zero while a daemon not asked in this pass is left, ``pause`` when every daemon that
    /// answers has said `not_leader` (they are asked again then, from the next one on).
    public mutating func notLeader() -> Duration {
        refusing.insert(current)
        standingBy.insert(current)
        silent.remove(current)
        let others = (1...endpoints.count).map { (current + $0) % endpoints.count }  // the current one last
        answeredHere = false
        if let next = others.first(where: { !refusing.contains($0) && !silent.contains($0) }) {
            current = next
            return .zero
        }
        refusing.removeAll()
        // The current one is not silent, so there is always one.
        current = others.first { !silent.contains($0) }!
        return Self.pause
    }
}
