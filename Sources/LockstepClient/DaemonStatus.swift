import Foundation
import LockstepProtocol

/// What a daemon says of itself in its STATUS reply (docs/operations.md, "Status"): per store seq, epoch and
/// rate; its journal; the errors it refused requests with.
public struct DaemonStatus: Decodable, Sendable {
    /// One hosted store.
    public struct Store: Decodable, Sendable {
        /// The store's name on the wire.
        public var name: String
        /// The seq of its last action.
        public var seq: UInt64
        /// Its epoch, as 16 hex digits.
        public var epoch: String
        /// The domain version it runs.
        public var domainVersion: UInt32
        /// Actions committed since the daemon began serving (started, or last took its journal's lease), over that
        /// time.
        public var eventsPerSecond: Double
    }

    /// The lease row as the daemon last saw it (a PostgreSQL journal shared by several daemons).
    public struct Leader: Decodable, Sendable {
        /// The leading daemon's name in the lease.
        public var name: String
        /// The lease's term: one more at every takeover.
        public var term: UInt64
        /// When the lease expires unless renewed, by the database's clock (ISO 8601, UTC); absent from a leader's
        /// own STATUS.
        public var expiresAt: String?
    }

    /// Seconds since the daemon started.
    public var uptimeSeconds: Int64
    /// `leader`, or `standby` for a daemon that does not hold its PostgreSQL journal's lease (it hosts no store
    /// then, and refuses DISPATCH, SNAPSHOT and RANGE with `not_leader`); absent from daemons before this field.
    public var role: String?
    /// The daemon's own name in the lease, on a PostgreSQL journal.
    public var name: String?
    /// Who leads, on a PostgreSQL journal: the daemon itself when it leads; `nil` on a standby that could not read
    /// the lease.
    public var leader: Leader?
    /// The journal's file, or `memory`.
    public var journal: String
    /// The journal's size on disk; `nil` for the in-memory journal.
    public var journalBytes: Int64?
    /// Every hosted store, in the daemon's order.
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

    /// The status `reply` carries; `nil` when it is not a STATUS reply or its JSON is not readable.
    public init?(_ reply: Reply) {
        guard case let .status(_, body) = reply, let status = try? JSONDecoder().decode(Self.self, from: Data(body))
        else { return nil }
        self = status
    }
}
