import Foundation

/// What a daemon says of itself in its STATUS reply (docs/operations.md, "Status"): its role, per store seq, epoch
/// and rate; its journal; the errors it refused requests with; the settings a client needs. The daemon encodes this
/// type and every Swift client decodes it, so the two cannot drift apart; clients in other languages read the same
/// JSON and ignore fields they do not know.
public struct DaemonStatus: Codable, Hashable, Sendable {
    /// A daemon's role: ``leader`` serves; a ``standby`` (a PostgreSQL journal shared by several daemons) hosts no
    /// store and refuses DISPATCH, SNAPSHOT and RANGE with `not_leader`. Roles a later daemon adds decode too.
    public struct Role: RawRepresentable, Codable, Hashable, Sendable, CustomStringConvertible,
        ExpressibleByStringLiteral
    {
        /// The role's name on the wire.
        public var rawValue: String

        /// The role named `rawValue`.
        public init(rawValue: String) { self.rawValue = rawValue }

        /// The role named `value`: `"standby"`.
        public init(stringLiteral value: String) { rawValue = value }

        /// It serves every store it hosts.
        public static let leader = Role(rawValue: "leader")
        /// It waits to take its PostgreSQL journal's lease, or is recovering its stores after taking it.
        public static let standby = Role(rawValue: "standby")

        /// `leader` or `standby`.
        public var description: String { rawValue }
    }

    /// One hosted store.
    public struct Store: Codable, Hashable, Sendable {
        /// The store's name on the wire.
        public var name: String
        /// The seq of its last action published: durable, unlike one still being committed.
        public var seq: UInt64
        /// Its epoch, as 16 hex digits.
        public var epoch: String
        /// The domain version it runs.
        public var domainVersion: UInt32
        /// Actions committed since the daemon began serving (started, or last took its journal's lease), over that
        /// time.
        public var eventsPerSecond: Double
        /// Its effects and timers, when its domain declares effects.
        public var effects: Effects?
        /// Its last DIGEST published (the state's SHA-256 at a seq), what replicas compare theirs with; `nil` before
        /// the first, and from daemons before it was reported.
        public var digest: Digest?
        /// Its dispatches refused by the domain's validator since the daemon began serving, by rejection code.
        public var rejected: [String: UInt64]?
        /// Its dispatches answered ERROR since the daemon began serving, by error code (`undecodable_action`,
        /// `domain_version_mismatch`, `forbidden`, …).
        public var refused: [String: UInt64]?

        /// A store's line in the status.
        public init(
            name: String,
            seq: UInt64,
            epoch: String,
            domainVersion: UInt32,
            eventsPerSecond: Double,
            effects: Effects? = nil,
            digest: Digest? = nil,
            rejected: [String: UInt64]? = nil,
            refused: [String: UInt64]? = nil
        ) {
            self.name = name
            self.seq = seq
            self.epoch = epoch
            self.domainVersion = domainVersion
            self.eventsPerSecond = eventsPerSecond
            self.effects = effects
            self.digest = digest
            self.rejected = rejected
            self.refused = refused
        }
    }

    /// A store's state digest at a seq.
    public struct Digest: Codable, Hashable, Sendable {
        public var seq: UInt64
        /// 64 lowercase hex digits.
        public var digest: String

        public init(seq: UInt64, digest: String) {
            self.seq = seq
            self.digest = digest
        }
    }

    /// A store's effects and timers (docs/effects.md).
    public struct Effects: Codable, Hashable, Sendable {
        /// Effects waiting to run or running (their actions durable or about to be).
        public var pending: Int
        /// Effects given up: dead letters, until `lockstep effects retry` or `drop`.
        public var dead: Int
        /// Timers set and not yet fired.
        public var timers: Int

        /// These counts.
        public init(pending: Int, dead: Int, timers: Int) {
            self.pending = pending
            self.dead = dead
            self.timers = timers
        }
    }

    /// The lease row as the daemon last saw it (a PostgreSQL journal shared by several daemons).
    public struct Leader: Codable, Hashable, Sendable {
        /// The leading daemon's name in the lease.
        public var name: String
        /// The lease's term: one more at every takeover.
        public var term: UInt64
        /// When the lease expires unless renewed, by the database's clock (ISO 8601, UTC); absent from a leader's
        /// own STATUS.
        public var expiresAt: String?

        /// The leader `name` in `term`, its lease expiring at `expiresAt` when known.
        public init(name: String, term: UInt64, expiresAt: String? = nil) {
            self.name = name
            self.term = term
            self.expiresAt = expiresAt
        }
    }

    /// A replica the leader heard from lately (REPORT), and how far behind it is.
    public struct Replica: Codable, Hashable, Sendable {
        /// The store it follows.
        public var store: String
        /// Its name for people (`HOST:PID` unless it set one).
        public var name: String
        /// Its client id, 32 hex digits.
        public var client: String
        /// The last seq it reported applied.
        public var seq: UInt64
        /// Events the store has that it had not applied, at its report (now, when its report is overdue).
        public var lagEvents: UInt64
        /// How long ago the first of those was committed, in milliseconds; 0 when it has them all.
        public var lagMs: Int64
        /// Milliseconds since its last report.
        public var heardMsAgo: Int64
        /// What it counted since it started: gaps repaired by RANGE, resyncs, divergences.
        public var repairs: UInt64
        public var resyncs: UInt64
        public var divergences: UInt64

        /// A replica's line in the status.
        public init(
            store: String,
            name: String,
            client: String,
            seq: UInt64,
            lagEvents: UInt64,
            lagMs: Int64,
            heardMsAgo: Int64,
            repairs: UInt64,
            resyncs: UInt64,
            divergences: UInt64
        ) {
            self.store = store
            self.name = name
            self.client = client
            self.seq = seq
            self.lagEvents = lagEvents
            self.lagMs = lagMs
            self.heardMsAgo = heardMsAgo
            self.repairs = repairs
            self.resyncs = resyncs
            self.divergences = divergences
        }
    }

    /// Seconds since the daemon started.
    public var uptimeSeconds: Int64
    /// `leader` or `standby`; absent from daemons before this field (they lead).
    public var role: Role?
    /// The daemon's own name in the lease, on a PostgreSQL journal.
    public var name: String?
    /// Who leads, on a PostgreSQL journal: the daemon itself when it leads; `nil` on a standby that could not read
    /// the lease.
    public var leader: Leader?
    /// The journal's file, `memory`, or `postgres host=… dbname=…`.
    public var journal: String
    /// The journal's size on disk; `nil` for the in-memory and PostgreSQL journals.
    public var journalBytes: Int64?
    /// Every hosted store, in the daemon's order; none on a standby.
    public var stores: [Store]
    /// ERROR replies the daemon sent since it started, by code name (absent from daemons before this field).
    public var refused: [String: UInt64]?
    /// The daemon's heartbeat interval in milliseconds: a replica's silence limit must be at least 3 of them.
    /// This and the fields below are absent from daemons before them.
    public var heartbeatMs: Int64?
    /// A DIGEST goes out once a store has published this many events since its last one (and on a snapshot).
    public var digestEveryEvents: Int?
    /// The most actions one DISPATCH may hold.
    public var maximumBatch: Int?
    /// The most bytes one action (one message part) may have.
    public var maximumActionBytes: Int?
    /// The replicas that reported to this leader lately, by store; absent from a standby and from daemons before it.
    public var replicas: [Replica]?
    /// Where the daemon serves HTTP (`/metrics`), as `HOST:PORT`; absent when it does not.
    public var http: String?

    /// A status with every field given.
    public init(
        uptimeSeconds: Int64,
        role: Role?,
        name: String? = nil,
        leader: Leader? = nil,
        journal: String,
        journalBytes: Int64? = nil,
        stores: [Store],
        refused: [String: UInt64]? = nil,
        heartbeatMs: Int64? = nil,
        digestEveryEvents: Int? = nil,
        maximumBatch: Int? = nil,
        maximumActionBytes: Int? = nil,
        replicas: [Replica]? = nil,
        http: String? = nil
    ) {
        self.uptimeSeconds = uptimeSeconds
        self.role = role
        self.name = name
        self.leader = leader
        self.journal = journal
        self.journalBytes = journalBytes
        self.stores = stores
        self.refused = refused
        self.heartbeatMs = heartbeatMs
        self.digestEveryEvents = digestEveryEvents
        self.maximumBatch = maximumBatch
        self.maximumActionBytes = maximumActionBytes
        self.replicas = replicas
        self.http = http
    }

    /// Whether this daemon leads (a daemon from before roles always does).
    public var leads: Bool { (role ?? .leader) == .leader }

    /// The status `reply` carries; `nil` when it is not a STATUS reply or its JSON is not readable.
    public init?(_ reply: Reply) {
        guard case let .status(_, body) = reply, let status = try? JSONDecoder().decode(Self.self, from: Data(body))
        else { return nil }
        self = status
    }

    /// The STATUS reply to request `requestID` that carries this status: its JSON, with `null` for a field the
    /// daemon has no value for (`journalBytes` of a PostgreSQL journal, `leader` of a standby that could not read
    /// the lease), as docs/operations.md lists them.
    public func reply(to requestID: UInt64) -> Reply {
        .status(requestID: requestID, json: json)
    }

    /// The status as a STATUS reply's JSON.
    public var json: [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return Array((try? encoder.encode(Encoded(self))) ?? Data("{}".utf8))
    }

    /// The status as the daemon writes it: the optional fields clients expect as `null` are written so.
    private struct Encoded: Encodable {
        let status: DaemonStatus
        init(_ status: DaemonStatus) { self.status = status }

        func encode(to encoder: any Encoder) throws {
            try status.encode(to: encoder)
            var container = encoder.container(keyedBy: DaemonStatus.CodingKeys.self)
            if status.journalBytes == nil { try container.encodeNil(forKey: .journalBytes) }
            if status.leader == nil, status.role == .standby { try container.encodeNil(forKey: .leader) }
        }
    }
}
