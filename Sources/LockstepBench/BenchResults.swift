/// What `lockstep bench --json` prints: one object, keys in snake_case, documented in docs/performance.md.
/// Latencies are in microseconds, rates per second, memory in bytes.
package struct BenchResults: Codable {
    var build: String
    var transport: String
    var cores: Int
    var secondsPerMeasurement: Double
    /// The journal of the daemons of P1, P2, P3, P7 and `outside`: `sqlite` or `log` (`--journal`).
    var journal = "sqlite"
    /// Whether P1 and P2 ran against a daemon with a policy (`--policy`, docs/security.md).
    var policy = false
    /// Whether P1 and P2 ran against a daemon serving /metrics (`--metrics`, docs/operations.md "Metrics").
    var metrics = false
    /// Whether P1 and P2 ran with an inspector page open on the daemon (`--inspector`, docs/operations.md "The
    /// inspector"), and how many actions its stream carried; `null` without.
    var inspector = false
    var inspectorActionsSent: Int?
    var baselines = Baselines()
    var p1 = P1()
    var p2: [P2] = []
    var optimistic = Optimistic()
    /// Effects run by the daemon with a no-op handler; `null` when the part did not run.
    var effects: Effects?
    var p3: [P3] = []
    var p4: [P4] = []
    var p5: [P5] = []
    var p6 = P6()
    var p7: [P7] = []
    /// C clients against a raw C echo and against lockstepd (`outside`): 1, 8 and 32 with one request in flight each,
    /// one with 32 and with 256; empty when it did not run.
    var outside: [Outside] = []
    /// Redis Streams from 1, 8 and 32 clients, when `redis-server` is installed; else `null`.
    var redis: RedisStreams?
    /// P1 and P2 with the PostgreSQL journal, when PostgreSQL is installed; else `null`.
    var postgres: PostgresJournalFigures?
    var totalSeconds = 0.0

    struct Baselines: Codable {
        /// Raw REQ → REP echo of a counter DISPATCH's bytes, one client.
        var reqRepP50Us = Microseconds(0)
        var reqRepP99Us = Microseconds(0)
        var reqRepRoundTripsPerS = 0.0
        /// Raw ROUTER echo with 8 REQ client processes, all round trips per second, and their p50.
        var router8ReqRoundTripsPerS = 0.0
        var router8ReqP50Us = Microseconds(0)
        /// The 8 REQ processes' own CPU time per round trip: what a client costs with nothing in between.
        var router8ReqClientCpuPerRoundTripUs: Double?
        /// The echo ROUTER process's own CPU time per round trip: the server's side of the same transport.
        var router8EchoCpuPerRoundTripUs: Double?
        /// Raw PUB → 4 SUB processes, 200-byte messages each subscriber received per second.
        var pub4SubMsgsPerS = 0.0
        /// write(2) of 200 bytes + fsync(2) to a file in the bench's data directory.
        var fsyncP50Us = Microseconds(0)
        var fsyncP99Us = Microseconds(0)
        /// pwrite(2) of 200 bytes inside a file of zeros written and synced before + fdatasync(2): a durable write
        /// with no file size to sync, as the log journal's commits are (the lower of the two floors).
        var fsyncInPlaceP50Us = Microseconds(0)
        var fsyncInPlaceP99Us = Microseconds(0)
        /// The same ROUTER ← 8 REQ, answered late enough that the clients wait about as long as P2's at 8 clients;
        /// `null` when P2 did not run.
        var lateEcho: LateEcho?
    }

    /// A raw ROUTER echo that answers each message `delayUs` after it came, 8 REQ processes.
    struct LateEcho: Codable {
        var delayUs = Microseconds(0)
        /// The clients' round trip p50: what the delay was set for.
        var p50Us = Microseconds(0)
        var roundTripsPerS = 0.0
        var echoCpuPerRoundTripUs: Double?
        var clientCpuPerRoundTripUs: Double?
    }

    struct P1: Codable {
        var dispatches = 0
        var p50Us = Microseconds(0)
        var p99Us = Microseconds(0)
        /// The raw REQ/REP p50 + the in-place fsync p50: what one durable round trip cannot beat.
        var baselineUs = Microseconds(0)
        var ratioP50: Double?
        var ratioP99: Double?
    }

    struct P2: Codable {
        var clients: Int
        /// Dispatches each client keeps in flight: 1 (one at a time), or one process pipelining through a `Dispatcher`.
        var inFlight = 1
        var actionsPerS: Double
        var ratioToRouter8Req: Double?
        var ratioToRedis: Double?
        var p50Us: Microseconds
        var p99Us: Microseconds
        /// Dispatches acknowledged as accepted, and the daemon's seq advance over the same run: equal when
        /// nothing was lost or committed unacknowledged.
        var acknowledged: Int
        var committed: Int
        var failures: Int
        /// CPU time of the daemon's loop thread (`lockstepd loop`, from /proc) per committed action; with SQLite
        /// the commits, fsync included, are made there.
        var loopCpuPerActionUs: Double?
        /// …of its journal thread (`lockstepd journal`: a PostgreSQL journal's commits; ~0 with SQLite).
        var journalCpuPerActionUs: Double?
        /// …of the whole daemon process: loop, journal, libzmq's I/O thread, readers.
        var daemonCpuPerActionUs: Double?
        /// The dispatching processes' own CPU time per acknowledged action.
        var clientCpuPerActionUs: Double?
    }

    /// One process dispatching optimistically through a replica, one at a time.
    struct Optimistic: Codable {
        var dispatches = 0
        /// From calling `dispatchOptimistically` to the replica's optimistic state showing the action (a subscriber
        /// in the same process): no daemon in between.
        var optimisticP50Us = Microseconds(0)
        var optimisticP99Us = Microseconds(0)
        /// From the same call to its handle's seq resolving: the daemon accepted the action and the replica's
        /// confirmed state holds it.
        var confirmedP50Us = Microseconds(0)
        var confirmedP99Us = Microseconds(0)
        /// Dispatches that failed or were rolled back; the replica's resyncs over the run.
        var failures = 0
        var resyncs = 0
        /// What the first failed dispatch said, when one failed.
        var firstFailure: String?
    }

    /// A daemon running `pulse`'s effects (one per action) with a no-op handler, over ipc.
    struct Effects: Codable {
        /// One client dispatching one ping at a time: when the handler of its effect started, from the dispatch
        /// (its commit included) and from the moment its ACCEPTED reached the client (its commit durable).
        var dispatches = 0
        var dispatchToStartP50Us = Microseconds(0)
        var dispatchToStartP99Us = Microseconds(0)
        /// Negative when the handler started before the client read the reply (both follow the commit).
        var ackToStartP50Us = Microseconds(0)
        var ackToStartP99Us = Microseconds(0)
        /// 8 clients dispatching batches of 100 pings: actions committed per second, and effects started per
        /// second over the same load (each done by a commit of its own turn, 8 running at most).
        var batchedActionsPerS = 0.0
        var effectsPerS = 0.0
        /// Effects run in all, and whether every effect set going ran once (each seq's handler started exactly once).
        var effectsRun = 0
        var everyEffectRanOnce = false
    }

    struct P3: Codable {
        var replicas: Int
        /// Committed actions/s from 8 dispatching processes while the replicas run.
        var actionsPerS: Double
        var ratioToP2: Double?
        /// Every replica reached the last seq within 100 ms of the last acknowledgement, without a resync.
        var keptUp: Bool
        /// From the last acknowledgement to the last replica applying the last seq.
        var catchUpMs: Double
        /// From sending a dispatch to the last replica applying it.
        var p50Us: Microseconds
        var p99Us: Microseconds
        var resyncs: Int
        var repairs: Int
        var replicaPeakBytes: Int
        /// CPU time of a replica's whole process per event it applied, the mean over the replicas.
        var replicaCpuPerEventUs: Double?
        /// CPU time of a raw libzmq SUB process per event, subscribed to the same events beside the replicas: what
        /// receiving them costs with nothing applied.
        var rawSubCpuPerEventUs: Double?
    }

    struct P4: Codable {
        var store: String
        var events: Int
        var stateBytes: Int
        /// From a new replica process starting its replica to its state at the last seq.
        var joinSeconds: Double
        /// From starting lockstepd on the journal to its first answer (recovery included).
        var daemonStartSeconds: Double
        /// Seconds to write the history into the journal (not part of the join).
        var fillSeconds: Double
        var replicaPeakBytes: Int
        var daemonPeakBytes: Int
    }

    struct P5: Codable {
        var subscribers: Int
        var dispatchesPerS: Double
        /// The state and the action, when not the counter's increment.
        var state: String?
    }

    struct P6: Codable {
        /// The highest resident set (VmHWM) of any lockstepd the bench ran, and of any replica process.
        var daemonPeakBytes = 0
        var replicaPeakBytes = 0
        /// The largest state the bench held (P4's 1 MB store).
        var stateBytes = 0
        /// 64 MiB + 3 × state bytes.
        var budgetBytes = 0
        /// Whether both peaks are within the budget; `nil` (not judged) when P4 did not run (no state size) or a peak
        /// was not measured (the parts that run a daemon or a replica process did not).
        var withinBudget: Bool?
        /// Why the budget was not judged, when it was not.
        var notJudged: String?
    }

    /// One size of P7's `todos` store: the empty store's row first, the others' ratios to it.
    struct P7: Codable {
        /// `todos` (the todos in an array), or `tree-todos` (the same in a `DigestedDictionary` by id).
        var store: String
        var megabytes: Int
        /// The state's canonical JSON, in bytes.
        var stateBytes: Int
        var fillSeconds: Double
        var daemonStartSeconds: Double
        /// A new replica process's time to the store's last seq (snapshot included), on the daemon just started (its
        /// journal's snapshot is at the store's seq: no encoding), and again after P2 (the state encoded for it).
        var joinSeconds: Double
        var joinAfterLoadSeconds: Double
        /// The bench encoding the state canonically once, hashing those bytes (SHA-256), decoding them: the floors
        /// under a join and a checkpoint (0 for the empty store).
        var encodeSeconds: Double
        var hashSeconds: Double
        var decodeSeconds: Double
        /// The bench streaming the state's canonical form once, hashing it as it goes (`CanonicalEncoding.streamed`):
        /// what a checkpoint off the loop does instead of encoding and hashing (0 for the empty store).
        var streamSeconds: Double
        /// One client adding todos, one at a time.
        var p1P50Us: Microseconds
        var p1P99Us: Microseconds
        var p1RatioP50: Double?
        var p1RatioP99: Double?
        /// 8 clients adding todos.
        var p2ActionsPerS: Double
        var p2Ratio: Double?
        var failures: Int
        /// A replica following P1 and P2: its process's CPU per event applied.
        var replicaCpuPerEventUs: Double?
        var replicaResyncs: Int
        /// VmHWM of the daemon, and of the two replica processes (the larger).
        var daemonPeakBytes: Int
        var replicaPeakBytes: Int
        /// 64 MiB + 3 × the state.
        var budgetBytes: Int
        var withinBudget: Bool
        /// The largest size only: a replica whose reducer misapplies one action found out this long after the
        /// action's acceptance, this many events after its seq, while one client added todos.
        var divergenceFoundSeconds: Double?
        var divergenceEvents: Int?
    }

    /// `clients` C threads (`lockstep-cload`) sending the counter's DISPATCH, `inFlight` requests at a time each (one:
    /// a REQ socket; more: a DEALER): to a raw C ROUTER echo, then to lockstepd.
    struct Outside: Codable {
        var clients: Int
        var inFlight: Int
        /// Against the echo: round trips per second, latencies, the echo's CPU and the clients' per round trip.
        var rawRoundTripsPerS: Double
        var rawP50Us: Microseconds
        var rawP99Us: Microseconds
        var rawServerCpuPerRoundTripUs: Double?
        var rawClientCpuPerRoundTripUs: Double?
        /// Against lockstepd: every reply checked (ACCEPTED, its request's id, one action, one epoch, each client's
        /// seqs rising, no seq twice).
        var actionsPerS: Double
        var ratioToRaw: Double?
        var p50Us: Microseconds
        var p99Us: Microseconds
        /// Dispatches acknowledged (each client's connecting one included) and the daemon's seq advance: equal, or
        /// the bench fails.
        var acknowledged: Int
        var committed: Int
        /// The daemon's process CPU per committed action, and the C clients' per acknowledged one.
        var daemonCpuPerActionUs: Double?
        var clientCpuPerActionUs: Double?
    }

    struct PostgresJournalFigures: Codable {
        /// The server's version, e.g. `15.18`.
        var version: String
        var p1: P1
        var p2: [P2]
    }

    struct RedisStreams: Codable {
        var version: String
        var rows: [Row]

        struct Row: Codable {
            var clients: Int
            /// XADDs each client pipelines: written together, then their replies read.
            var inFlight = 1
            var xaddsPerS: Double
            var p50Us: Microseconds
            var p99Us: Microseconds
        }
    }
}
