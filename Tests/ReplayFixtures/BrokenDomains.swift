import Foundation
import Lockstep
import Synchronization

// Deliberately nondeterministic domains, one per class of mistake the replay harness must catch.

/// Reads the clock inside the reducer.
public enum ClockDomain: ActionGenerating {
    public struct State: Codable, Equatable, Sendable { public var stamps: [Double] = [] }
    public enum Action: Codable, Equatable, Sendable { case stamp }
    public static let name = "clock"
    public static let version: UInt32 = 1
    public static var initialState: State { State() }
    public static func reduce(into state: inout State, _ action: Action) {
        state.stamps.append(Date().timeIntervalSince1970)
    }
    public static func randomAction(for state: State, using random: inout SplitMix64) -> Action { .stamp }
}

/// Draws random numbers inside the reducer.
public enum DiceDomain: ActionGenerating {
    public struct State: Codable, Equatable, Sendable { public var rolls: [Int] = [] }
    public enum Action: Codable, Equatable, Sendable { case roll }
    public static let name = "dice"
    public static let version: UInt32 = 1
    public static var initialState: State { State() }
    public static func reduce(into state: inout State, _ action: Action) {
        state.rolls.append(Int.random(in: 0..<1_000_000_000))
    }
    public static func randomAction(for state: State, using random: inout SplitMix64) -> Action { .roll }
}

/// Keeps a `Set`, whose encoding follows the hash order Swift seeds per process (and per instance).
public enum TagsDomain: ActionGenerating {
    public struct State: Codable, Equatable, Sendable {
        public var count = 0
        public var tags: Set<String> = []
    }
    public enum Action: Codable, Equatable, Sendable { case count, tag([String]) }
    public static let name = "tags"
    public static let version: UInt32 = 1
    public static var initialState: State { State() }
    public static func reduce(into state: inout State, _ action: Action) {
        switch action {
        case .count: state.count += 1
        case let .tag(tags): state.tags.formUnion(tags)
        }
    }
    public static func randomAction(for state: State, using random: inout SplitMix64) -> Action {
        Bool.random(using: &random) ? .count : .tag((0..<20).map { "t\($0)-\(random.next() % 100)" })
    }
}

/// Keeps a field out of its encoding, so a replica that restores from a snapshot loses it.
public enum LossyDomain: ActionGenerating {
    public struct State: Codable, Equatable, Sendable {
        public var total = 0
        /// Not encoded: after a snapshot round trip it is back to 0.
        public var lastAmount = 0
        enum CodingKeys: String, CodingKey { case total }
    }
    public enum Action: Codable, Equatable, Sendable { case add(Int), repeatLast }
    public static let name = "lossy"
    public static let version: UInt32 = 1
    public static var initialState: State { State() }
    public static func reduce(into state: inout State, _ action: Action) {
        switch action {
        case let .add(amount):
            state.total += amount
            state.lastAmount = amount
        case .repeatLast:
            state.total += state.lastAmount
        }
    }
    public static func randomAction(for state: State, using random: inout SplitMix64) -> Action {
        Bool.random(using: &random) ? .add(Int(random.next() % 10) + 1) : .repeatLast
    }
}

/// Holds a class instance in its state, so copies of the state share it.
public enum TallyDomain: ActionGenerating {
    public final class Tally: Codable, Equatable, @unchecked Sendable {
        // Deliberately unsafe: this domain exists to show the harness catching a shared mutable reference.
        public var count = 0
        public init() {}
        public static func == (left: Tally, right: Tally) -> Bool { left.count == right.count }
    }
    public struct State: Codable, Equatable, Sendable { public var tally = Tally() }
    public enum Action: Codable, Equatable, Sendable { case bump }
    public static let name = "tally"
    public static let version: UInt32 = 1
    public static var initialState: State { State() }
    public static func reduce(into state: inout State, _ action: Action) {
        state.tally.count += 1
    }
    public static func randomAction(for state: State, using random: inout SplitMix64) -> Action { .bump }
}

/// Reads the clock in its effects: its state is deterministic, but each replica stamps another time on the effect
/// of a `stamp`, so the daemon would journal one effect and a replay compute another.
public enum ClockEffectsDomain: ActionGenerating {
    public struct State: Codable, Equatable, Sendable {
        public var notes = 0
        public var stamps = 0
    }
    public enum Action: Codable, Equatable, Sendable { case note, stamp }
    public enum Effect: Codable, Equatable, Sendable { case stamp(nanos: UInt64) }
    public static let name = "clock-effects"
    public static let version: UInt32 = 1
    public static var initialState: State { State() }
    public static func reduce(into state: inout State, _ action: Action) {
        switch action {
        case .note: state.notes += 1
        case .stamp: state.stamps += 1
        }
    }
    public static func effects(of action: Action, in state: State) -> [DomainEffect<Self>] {
        guard action == .stamp else { return [] }
        return [.run(.stamp(nanos: DispatchTime.now().uptimeNanoseconds))]
    }
    public static func randomAction(for state: State, using random: inout SplitMix64) -> Action {
        random.next() % 8 == 0 ? .stamp : .note
    }
}

/// Keys its timers with a counter that outlives the store: every replica, in this process or another, draws its own
/// keys, so each would cancel or replace another timer than the daemon's.
public enum TicketDomain: ActionGenerating {
    public struct State: Codable, Equatable, Sendable {
        public var quiet = 0
        public var reminders = 0
    }
    public enum Action: Codable, Equatable, Sendable { case quiet, remind, ring }
    public static let name = "tickets"
    public static let version: UInt32 = 1
    public static var initialState: State { State() }
    static let tickets = Atomic<Int>(0)

    /// The next ticket of this process's counter: what `remind` keys its timer with.
    public static func nextTicket() -> Int { tickets.wrappingAdd(1, ordering: .relaxed).newValue }

    public static func reduce(into state: inout State, _ action: Action) {
        switch action {
        case .quiet: state.quiet += 1
        case .remind: state.reminders += 1
        case .ring: break
        }
    }
    public static func effects(of action: Action, in state: State) -> [DomainEffect<Self>] {
        guard action == .remind else { return [] }
        return [.schedule(.ring, at: Date(timeIntervalSince1970: 1_764_234_000), key: "ticket-\(nextTicket())")]
    }
    public static func randomAction(for state: State, using random: inout SplitMix64) -> Action {
        random.next() % 8 == 0 ? .remind : .quiet
    }
}

/// Every broken domain, for the child executable.
public let brokenDomains: [any Domain.Type] = [
    ClockDomain.self, DiceDomain.self, TagsDomain.self, LossyDomain.self, TallyDomain.self, ClockEffectsDomain.self,
    TicketDomain.self,
]

/// Remembers, in a cache that outlives the store, which keys it has seen: the first replica of a process to meet
/// a key calls it cold, every later one warm. Replicas diverge only through the process's history, so replaying
/// again (with every key warm by then) does not part them.
public enum WarmCacheDomain: Domain {
    public struct State: Codable, Equatable, Sendable { public var lookups: [String] = [] }
    public enum Action: Codable, Equatable, Sendable { case look(String) }
    public static let name = "warmcache"
    public static let version: UInt32 = 1
    public static var initialState: State { State() }
    static let seen = Mutex<Set<String>>([])
    public static func reduce(into state: inout State, _ action: Action) {
        guard case let .look(key) = action else { return }
        let warm = seen.withLock { !$0.insert(key).inserted }
        state.lookups.append("\(key) \(warm ? "warm" : "cold")")
    }
}

/// Sends a greeting as an effect, worded by a cache that outlives the store: the first replica of a process to greet
/// a name says hello, every later one welcome back. Its effects diverge only through the process's history.
public enum WarmGreetingDomain: Domain {
    public struct State: Codable, Equatable, Sendable { public var greeted = 0 }
    public enum Action: Codable, Equatable, Sendable { case greet(String), wait }
    public enum Effect: Codable, Equatable, Sendable { case send(String) }
    public static let name = "warmgreeting"
    public static let version: UInt32 = 1
    public static var initialState: State { State() }
    static let seen = Mutex<Set<String>>([])
    public static func reduce(into state: inout State, _ action: Action) {
        if case .greet = action { state.greeted += 1 }
    }
    public static func effects(of action: Action, in state: State) -> [DomainEffect<Self>] {
        guard case let .greet(name) = action else { return [] }
        let warm = seen.withLock { !$0.insert(name).inserted }
        return [.run(.send(warm ? "welcome back, \(name)" : "hello, \(name)"))]
    }
}
