import Foundation

/// The body of an EFFECTS reply (docs/protocol.md, "EFFECTS"): the leader's effects and timers.
public struct EffectsListing: Codable, Hashable, Sendable {
    /// One effect in the outbox.
    public struct Effect: Codable, Hashable, Sendable {
        /// Its id, `store/seq/index`: the idempotency key its handler is given.
        public var id: String
        /// `waiting` (to run, or to run again after a failure), `running`, or `dead` (given up: a dead letter).
        public var phase: String
        /// Runs that failed so far.
        public var attempts: Int
        /// Why the last failed run failed.
        public var lastError: String?
        /// The effect, as the domain's JSON.
        public var effect: String

        /// An effect's line.
        public init(id: String, phase: String, attempts: Int, lastError: String?, effect: String) {
            self.id = id
            self.phase = phase
            self.attempts = attempts
            self.lastError = lastError
            self.effect = effect
        }
    }

    /// One timer set.
    public struct Timer: Codable, Hashable, Sendable {
        /// The store whose action set it.
        public var store: String
        /// Its key in the store.
        public var key: String
        /// When it fires, in milliseconds since 1970 (the leader's wall clock).
        public var dueMilliseconds: Int64
        /// The action it dispatches, as the domain's JSON.
        public var action: String

        /// A timer's line.
        public init(store: String, key: String, dueMilliseconds: Int64, action: String) {
            self.store = store
            self.key = key
            self.dueMilliseconds = dueMilliseconds
            self.action = action
        }
    }

    /// Every effect waiting, running or given up, by id.
    public var effects: [Effect]
    /// Every timer set, by due time.
    public var timers: [Timer]

    /// A listing.
    public init(effects: [Effect], timers: [Timer]) {
        self.effects = effects
        self.timers = timers
    }

    /// The listing `reply` carries; `nil` when it is not an EFFECTS reply or its JSON is not readable.
    public init?(_ reply: Reply) {
        guard case let .effects(_, body) = reply, let listing = try? JSONDecoder().decode(Self.self, from: Data(body))
        else { return nil }
        self = listing
    }

    /// The EFFECTS reply to request `requestID` that carries this listing.
    public func reply(to requestID: UInt64) -> Reply {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let body = (try? encoder.encode(self)) ?? Data("{}".utf8)
        return .effects(requestID: requestID, json: Array(body))
    }
}
