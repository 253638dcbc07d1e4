import Lockstep

// One domain, `shelf`, as it evolves: the versions a team keeps in its code base to take over old journals.

/// Version 1: a list of item names.
public enum ShelfV1: Domain {
    public struct State: Codable, Equatable, Sendable {
        public var items: [String] = []
        public init(items: [String] = []) { self.items = items }
    }

    public enum Action: Codable, Equatable, Sendable {
        case add(name: String)
    }

    public static let name = "shelf"
    public static let version: UInt32 = 1
    public static var initialState: State { State() }

    public static func reduce(into state: inout State, _ action: Action) {
        if case let .add(name) = action { state.items.append(name) }
    }
}

/// Version 2: each item has a count, and a new action sets it. Upgrades version 1 (each item counted once).
public enum ShelfV2: Domain {
    public struct Item: Codable, Equatable, Sendable {
        public var name: String
        public var count: Int
        public init(name: String, count: Int) {
            self.name = name
            self.count = count
        }
    }

    public struct State: Codable, Equatable, Sendable {
        public var items: [Item] = []
        public init(items: [Item] = []) { self.items = items }
    }

    public enum Action: Codable, Equatable, Sendable {
        case add(name: String)
        case setCount(name: String, count: Int)
    }

    public static let name = "shelf"
    public static let version: UInt32 = 2
    public static var initialState: State { State() }

    public static let upgrades = [
        DomainUpgrade<ShelfV2>(from: ShelfV1.self) { old in
            State(items: old.items.map { Item(name: $0, count: 1) })
        }
    ]

    public static func validate(_ action: Action, in state: State) throws(Rejection) {
        if case let .setCount(name, _) = action, !state.items.contains(where: { $0.name == name }) {
            throw Rejection(code: "unknown_item", "shelf: setCount names '\(name)', which is not on the shelf")
        }
    }

    public static func reduce(into state: inout State, _ action: Action) {
        switch action {
        case let .add(name):
            state.items.append(Item(name: name, count: 1))
        case let .setCount(name, count):
            if let index = state.items.firstIndex(where: { $0.name == name }) { state.items[index].count = count }
        }
    }
}

/// Version 2 as a team might first write it: the same change, but no upgrade from version 1.
public enum ShelfV2WithoutUpgrade: Domain {
    public typealias State = ShelfV2.State
    public typealias Action = ShelfV2.Action
    public static let name = "shelf"
    public static let version: UInt32 = 2
    public static var initialState: State { State() }
    public static func reduce(into state: inout State, _ action: Action) { ShelfV2.reduce(into: &state, action) }
}

/// Version 3: `items` renamed `entries` in the state. Upgrades version 2, and through it version 1.
public enum ShelfV3: Domain {
    public struct State: Codable, Equatable, Sendable {
        public var entries: [ShelfV2.Item] = []
        public init(entries: [ShelfV2.Item] = []) { self.entries = entries }
    }

    public typealias Action = ShelfV2.Action
    public static let name = "shelf"
    public static let version: UInt32 = 3
    public static var initialState: State { State() }

    public static let upgrades = [DomainUpgrade<ShelfV3>(from: ShelfV2.self) { State(entries: $0.items) }]

    public static func reduce(into state: inout State, _ action: Action) {
        var old = ShelfV2.State(items: state.entries)
        ShelfV2.reduce(into: &old, action)
        state.entries = old.items
    }
}

/// A second store beside `shelf`, version 1: a number that only grows.
public enum TallyV1: Domain {
    public struct State: Codable, Equatable, Sendable {
        public var total = 0
        public init(total: Int = 0) { self.total = total }
    }

    public enum Action: Codable, Equatable, Sendable {
        case add(amount: Int)
    }

    public static let name = "tally"
    public static let version: UInt32 = 1
    public static var initialState: State { State() }

    public static func reduce(into state: inout State, _ action: Action) {
        if case let .add(amount) = action { state.total += amount }
    }
}

/// `tally` version 2, with no upgrade from version 1: a daemon hosting it and `ShelfV2` must refuse a version 1
/// journal before it upgrades `shelf`.
public enum TallyV2WithoutUpgrade: Domain {
    public typealias State = TallyV1.State
    public typealias Action = TallyV1.Action
    public static let name = "tally"
    public static let version: UInt32 = 2
    public static var initialState: State { State() }
    public static func reduce(into state: inout State, _ action: Action) { TallyV1.reduce(into: &state, action) }
}
