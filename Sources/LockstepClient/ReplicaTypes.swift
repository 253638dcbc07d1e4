import Lockstep
import LockstepProtocol

/// A replica's state and where in the daemon's history it stands.
public struct Replicated<State: Equatable & Sendable>: Equatable, Sendable {
    /// The journal lifetime the state belongs to; `nil` before the first snapshot.
    public var epoch: Epoch?
    /// The seq of the last action applied (or of the snapshot installed); 0 before any.
    public var seq: SequenceNumber
    /// The state after exactly the actions `1...seq`, never part of a batch.
    public var state: State

    /// A state at `seq` of `epoch`.
    public init(epoch: Epoch?, seq: SequenceNumber, state: State) {
        self.epoch = epoch
        self.seq = seq
        self.state = state
    }
}

extension Replicated: Encodable where State: Encodable {}

/// Where one daemon listens: its command endpoint (ROUTER) and its events endpoint (PUB).
public struct DaemonEndpoints: Hashable, Sendable, CustomStringConvertible {
    /// The command endpoint, e.g. `tcp://10.0.0.1:7700`.
    public var command: String
    /// The events endpoint, e.g. `tcp://10.0.0.1:7701`.
    public var events: String

    /// The daemon listening at `command` and `events`.
    public init(command: String, events: String) {
        self.command = command
        self.events = events
    }

    /// The daemon's own defaults: `ipc://.lockstep/run/command` and `ipc://.lockstep/run/events`, relative to the
    /// folder it runs in.
    public static let defaults = DaemonEndpoints(
        command: "ipc://.lockstep/run/command",
        events: "ipc://.lockstep/run/events"
    )

    /// `command` and `events`, as one would write them down.
    public var description: String { "\(command) (events \(events))" }
}

/// How a replica reaches the daemon and how patient it is.
public struct ReplicaConfiguration: Sendable {
    /// The daemons the replica follows: one, or the leader and standbys of one PostgreSQL journal, in any order
    /// (never daemons of different journals). The replica hears the events of them all and sends its requests to
    /// whichever leads, found by asking (`LeaderSearch`); after a takeover it goes on from its seq, repairing
    /// what it missed by range. The default is one daemon at the daemon's own default endpoints.
    public var daemons = [DaemonEndpoints.defaults]
    /// The first daemon's command endpoint (ROUTER); setting it sets the first of ``daemons``.
    public var commandEndpoint: String {
        get { daemons.first?.command ?? DaemonEndpoints.defaults.command }
        set {
            if daemons.isEmpty { daemons = [DaemonEndpoints.defaults] }
            daemons[0].command = newValue
        }
    }
    /// The first daemon's events endpoint (PUB); setting it sets the first of ``daemons``.
    public var eventsEndpoint: String {
        get { daemons.first?.events ?? DaemonEndpoints.defaults.events }
        set {
            if daemons.isEmpty { daemons = [DaemonEndpoints.defaults] }
            daemons[0].events = newValue
        }
    }
    /// CURVE keys for tcp endpoints.
    public var curve: ClientCurve?
    /// How long one try of a dispatch waits for its reply.
    public var requestTimeout = Duration.seconds(2)
    /// How many times a dispatch is sent again, on a fresh socket, after a silence.
    public var retries = 3
    /// The most bytes of state one SNAPSHOT reply carries when the daemon sends a large state in parts
    /// (docs/protocol.md, "SNAPSHOT in parts"): the daemon holds one part per replica joining, not the whole state.
    public var snapshotPartBytes: UInt32 = 4 << 20
    /// How long an accepted dispatch waits for this replica to apply it before `dispatch` gives up (an optimistic
    /// one is then rolled back).
    public var readYourWritesTimeout = Duration.seconds(10)
    /// The most optimistic actions the daemon has not confirmed yet that the replica holds; past it,
    /// `dispatchOptimistically` throws `tooManyPending`. Each is applied again on every confirmed change, so this
    /// also bounds that work.
    public var maximumPending = 1_000
    /// How long after its dispatch an optimistic dispatch the daemon has not accepted stays pending: it is sent
    /// again (with its idempotency key, through daemon restarts) until then, and at the bound rolled back with
    /// `unavailable` and sent no more, even while the daemon is silent. Keep it well inside the time the daemon keeps
    /// idempotency keys (its newest `idempotency_entries` replies): no dispatch is sent after its bound, so none
    /// comes back after its key was dropped.
    public var pendingTimeout = Duration.seconds(60)
    /// Join, repair and silence settings.
    public var sync = ReplicaSync.Settings()
    /// Events queued on this side before the newest are dropped (the ZeroMQ high-water mark); a gap is
    /// repaired by range, so this bounds memory, not correctness. Replicas of one ``ReplicaHub`` that follow the same
    /// daemons share one subscription, made with the first one's queue.
    public var eventsQueue = 100_000
    /// The first half of every idempotency key the replica sends; `nil` gives each replica a random one.
    /// Two replicas must never share one: their request numbers would collide.
    public var clientID: ClientID?
    /// Where the replica writes a ``DivergenceEvidence`` file when its digest differs from the daemon's, before
    /// it repairs itself; `nil` (the default) writes none. `lockstep replay --evidence FILE` (or the tool of your
    /// domains) turns a file into a report. The replica then keeps the state at the last agreeing digest and the
    /// actions since (about one state and one digest interval of actions more memory).
    public var evidenceDirectory: String?
    /// The most evidence files of this store kept in ``evidenceDirectory``; the oldest go first.
    public var maximumEvidenceFiles = 8
    /// The most bytes of actions kept since the last agreeing digest for evidence; past it the file says the
    /// actions are incomplete and holds the states only.
    public var maximumEvidenceBytes = 16 << 20

    /// The replica's name in its daemon's STATUS and metrics; `HOST:PID` when `nil`.
    public var name: String?
    /// How often the replica tells the daemon it follows how far it has applied (REPORT, docs/protocol.md), so the
    /// daemon knows its replicas and their lag, and brings its own metrics (`lockstep_client_*`) up to date; `nil`
    /// does neither. Every second by default.
    public var reportInterval: Duration? = .seconds(1)

    /// The defaults: the daemon's default `ipc://` endpoints under `.lockstep/run`, no CURVE, 2 s per try and 3
    /// retries, a random client id.
    public init() {}

    /// The defaults, with these endpoints.
    public init(commandEndpoint: String, eventsEndpoint: String) {
        daemons = [DaemonEndpoints(command: commandEndpoint, events: eventsEndpoint)]
    }

    /// The defaults, following `daemons` (a leader and its standbys).
    public init(daemons: [DaemonEndpoints]) {
        self.daemons = daemons
    }
}

/// Where a replica stands, for dashboards and health checks.
public struct ReplicaStatus: Hashable, Sendable {
    /// What the replica is doing now: `ReplicaSync.Phase`, plus the two states only its owner knows.
    public enum Phase: String, Hashable, Sendable, CustomStringConvertible {
        /// Waiting for its first snapshot (or a new one after a resync).
        case joining
        /// Applying events as they are published.
        case live
        /// Filling a gap by range or snapshot; events are kept meanwhile.
        case repairing
        /// Nothing heard from the daemon for longer than the silence limit; it keeps trying.
        case disconnected
        /// `run()` returned: the replica no longer follows the daemon.
        case stopped

        /// The phase's name, e.g. `live`.
        public var description: String { rawValue }
    }

    /// What the replica is doing now.
    public var phase = Phase.joining
    /// The epoch of the state this replica holds; `nil` before its first snapshot.
    public var epoch: Epoch?
    /// The seq of the state this replica holds.
    public var lastSeq: SequenceNumber = 0
    /// The highest seq the daemon announced (events, heartbeats, digests).
    public var daemonSeq: SequenceNumber = 0
    /// Times the replica threw its state away and joined again.
    public var resyncs = 0
    /// Gaps filled by range.
    public var repairs = 0
    /// Times its state's digest differed from the daemon's.
    public var divergences = 0
    /// The daemon's last refusal to serve this store (an unknown store, say), until a snapshot arrives.
    public var problem: String?
    /// Optimistic actions the confirmed state does not hold yet (``Replica/pending`` lists them).
    public var pendingActions = 0

    /// How many actions the replica is behind the daemon's last word.
    public var lag: UInt64 { daemonSeq > lastSeq ? daemonSeq - lastSeq : 0 }

    /// A replica that has not joined yet: joining, at seq 0, with nothing counted.
    public init() {}
}

/// Something a replica's user should know about: it had to start over, or its state was wrong.
public enum ReplicaNotice: Hashable, Sendable, CustomStringConvertible {
    /// The replica threw its state away and is joining again.
    case resynced(ReplicaSync.ResyncReason)
    /// The replica's state differed from the daemon's at `seq`; it resyncs. The reducers are not
    /// deterministic, or this process runs another version of the domain: run `lockstep replay`.
    case diverged(seq: SequenceNumber, detail: String)

    /// One line for a log: `resynced: …` or `diverged at seq N: …`.
    public var description: String {
        switch self {
        case let .resynced(reason): "resynced: \(reason)"
        case let .diverged(seq, detail): "diverged at seq \(seq): \(detail)"
        }
    }
}
