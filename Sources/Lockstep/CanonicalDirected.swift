/// A value's canonical bytes streamed out a chunk at a time (``CanonicalEncoding/stream(_:chunkBytes:into:)``), never
/// held whole: what a large state's snapshot and digest are written with.
///
/// The one-pass writer (``CanonicalStream``) puts an object's members in order when the object ends, so it holds an
/// object until then — and a state is an object whose large member (its list) comes before one that sorts first.
/// Here the objects on the way down to the large parts are written a member at a time, in their names' order: a pass
/// over the value from its root *probes* an object (its members' names, their values not encoded), then a pass for
/// each member, in order, goes down to it and writes it alone. What is below the objects written this way — an
/// array, a scalar, an object of more than ``directedMembers`` members — goes through the one-pass writer, which
/// hands out each chunk once nothing in it can move (an array's elements as they end; a ``DigestedDictionary``'s
/// members, which come in order). A value that leaves any of this path makes the call return `false`: the caller
/// writes it whole instead, and the tree or Foundation decides what it is.
enum CanonicalDirected {
    /// An object of more members than this is written in one pass, put in order by the one-pass writer: a passes'
    /// cost is one walk of the root down to the member, and a dictionary's thousands of members would each cost one.
    static let directedMembers = 64

    /// Writes `value` through `stream`, which hands its chunks to its sink; `false` when the value leaves this path.
    static func write<Value: Encodable>(_ value: Value, to stream: CanonicalStream) -> Bool {
        do {
            if case let .object(names) = try probe(value, at: [], stream: stream) {
                try writeObject(value, at: [], names: names, stream: stream)
            } else {
                try stream.encodeValue(value, emptyIsObject: false)
                while stream.hasOpenContainers { stream.close() }
            }
        } catch {
            return false
        }
        guard !stream.isOffFastPath, stream.handedOut + stream.out.count > 0 else { return false }
        stream.handOutRest()
        return true
    }

    /// What a probe found at the end of its route.
    enum Probed {
        /// An object, written by members by name (`encode(_:forKey:)` and the like) with these names.
        case object([String])
        /// Anything else: a scalar, an array, an object of members in order already or of too many, one written
        /// through nested containers.
        case other
    }

    /// The object at `route`: its member names, in the order the value writes them.
    private static func probe<Value: Encodable>(
        _ value: Value,
        at route: [String],
        stream: CanonicalStream
    ) throws -> Probed {
        let pass = Pass(route: route, probing: true, stream: stream)
        do {
            try value.encode(to: RouteEncoder(pass: pass, level: 0))
        } catch is Pass.Stop {}
        guard !pass.isLost else { throw stream.leave() }
        guard pass.reached, pass.isDirectable, pass.names.count <= directedMembers else { return .other }
        return .object(pass.names)
    }

    /// Writes the object at `route`, whose members are `names`: each member by a pass of its own, in order.
    private static func writeObject<Value: Encodable>(
        _ value: Value,
        at route: [String],
        names: [String],
        stream: CanonicalStream
    ) throws {
        // A name that needs an escape, or one there twice, is left to the tree.
        for name in names {
            guard !name.utf8.contains(where: { $0 < 0x20 || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") })
            else { throw stream.leave() }
        }
        guard Set(names).count == names.count else { throw stream.leave() }
        let order = CanonicalStream.canonicalOrder(of: names)
        stream.appendLiteral("{")
        for (rank, index) in order.enumerated() {
            if rank > 0 { stream.appendLiteral(",") }
            stream.appendString(names[index])
            stream.appendLiteral(":")
            let member = route + [names[index]]
            if member.count < CanonicalTree.maximumDepth,
                case let .object(inner) = try probe(value, at: member, stream: stream)
            {
                try writeObject(value, at: member, names: inner, stream: stream)
                continue
            }
            let pass = Pass(route: member, probing: false, stream: stream)
            try value.encode(to: RouteEncoder(pass: pass, level: 0))
            guard !pass.isLost, pass.written == 1 else { throw stream.leave() }
        }
        stream.appendLiteral("}")
        stream.handOutIfDue()
    }

    /// One walk of the value from its root, down `route` by member name, skipping every other member: to the object
    /// at its end to note its members' names (probing), or to the member at its end to write it.
    final class Pass {
        /// Thrown to end a probe early (an array or a scalar where an object was probed, too many members).
        struct Stop: Error {}

        let route: [String]
        let probing: Bool
        let stream: CanonicalStream
        /// A probe: the names; whether the object was reached, and written by name only; whether its keys say its
        /// members come in order.
        var names: [String] = []
        var reached = false
        var isDirectable = true
        /// A write: how many times the member was written (once, unless the value writes differently each pass).
        var written = 0
        /// The walk did not find the way a probe found, or met a container it cannot follow: the value is not
        /// written the same way each time, or not only by name on the way.
        var isLost = false

        init(route: [String], probing: Bool, stream: CanonicalStream) {
            self.route = route
            self.probing = probing
            self.stream = stream
        }
    }
}

/// The encoder a value's `encode(to:)` gets at `level` of a pass's route: only keyed containers are followed.
struct RouteEncoder: Encoder {
    let pass: CanonicalDirected.Pass
    let level: Int

    var codingPath: [any CodingKey] {
        pass.isLost = true
        return []
    }
    var userInfo: [CodingUserInfoKey: Any] { [CanonicalDirected.probingKey: pass.probing && level == pass.route.count] }

    func container<Key: CodingKey>(keyedBy _: Key.Type) -> KeyedEncodingContainer<Key> {
        if level == pass.route.count {
            pass.reached = true
            if Key.self is any CanonicallyOrderedKey.Type { pass.isDirectable = false }
        }
        return KeyedEncodingContainer(RouteKeyedContainer<Key>(pass: pass, level: level))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer { refuse() }
    func singleValueContainer() -> any SingleValueEncodingContainer { refuse() }

    /// Anything but an object by name: the end of a probe (the value there is not one), or a way lost.
    private func refuse() -> RefusingContainer {
        if level < pass.route.count { pass.isLost = true }
        return RefusingContainer()
    }
}

extension CanonicalDirected {
    /// In a probe's `userInfo` (`true`) for the value whose members it notes: a ``DigestedDictionary`` asks for its
    /// container and writes nothing more, rather than put its members in order for nothing.
    static let probingKey = CodingUserInfoKey(rawValue: "lockstep.canonical.probing")!
}

/// Keys that say an object's members are written in their names' order: the writer checks it, and holds back none.
protocol CanonicallyOrderedKey: CodingKey {}

/// An object on a pass's route: its member on the route is followed (or written, or its names noted), others skipped.
struct RouteKeyedContainer<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let pass: CanonicalDirected.Pass
    let level: Int

    var codingPath: [any CodingKey] {
        pass.isLost = true
        return []
    }

    /// `value` as member `key`: noted, followed, written or skipped.
    private func member<T: Encodable>(_ key: Key, _ value: T) throws {
        let route = pass.route
        if level == route.count {
            // The object probed.
            pass.names.append(key.stringValue)
            if pass.names.count > CanonicalDirected.directedMembers { throw CanonicalDirected.Pass.Stop() }
            return
        }
        guard key.stringValue == route[level] else { return }
        if pass.probing || level + 1 < route.count {
            try value.encode(to: RouteEncoder(pass: pass, level: level + 1))
        } else {
            pass.written += 1
            try pass.stream.encodeValue(value, emptyIsObject: true)
        }
    }

    mutating func encodeNil(forKey key: Key) throws {
        let route = pass.route
        if level == route.count {
            try member(key, 0)
        } else if key.stringValue == route[level] {
            // A null member: written when it is the one, the end of a probe (no object) when probed, else a way lost.
            if level + 1 < route.count {
                pass.isLost = true
            } else if !pass.probing {
                pass.written += 1
                pass.stream.appendLiteral("null")
            }
        }
    }
    mutating func encode(_ value: Bool, forKey key: Key) throws { try member(key, value) }
    mutating func encode(_ value: String, forKey key: Key) throws { try member(key, value) }
    mutating func encode(_ value: Double, forKey key: Key) throws { try member(key, value) }
    mutating func encode(_ value: Float, forKey key: Key) throws { try member(key, value) }
    mutating func encode(_ value: Int, forKey key: Key) throws { try member(key, value) }
    mutating func encode(_ value: Int8, forKey key: Key) throws { try member(key, value) }
    mutating func encode(_ value: Int16, forKey key: Key) throws { try member(key, value) }
    mutating func encode(_ value: Int32, forKey key: Key) throws { try member(key, value) }
    mutating func encode(_ value: Int64, forKey key: Key) throws { try member(key, value) }
    mutating func encode(_ value: Int128, forKey key: Key) throws { try member(key, value) }
    mutating func encode(_ value: UInt, forKey key: Key) throws { try member(key, value) }
    mutating func encode(_ value: UInt8, forKey key: Key) throws { try member(key, value) }
    mutating func encode(_ value: UInt16, forKey key: Key) throws { try member(key, value) }
    mutating func encode(_ value: UInt32, forKey key: Key) throws { try member(key, value) }
    mutating func encode(_ value: UInt64, forKey key: Key) throws { try member(key, value) }
    mutating func encode(_ value: UInt128, forKey key: Key) throws { try member(key, value) }
    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws { try member(key, value) }

    // A member written through a nested container or a super encoder is not followed: a probe of this object says it
    // is not to be written by name, and a walk that needs it is lost.
    mutating func nestedContainer<NestedKey: CodingKey>(
        keyedBy _: NestedKey.Type,
        forKey key: Key
    ) -> KeyedEncodingContainer<NestedKey> {
        notFollowed(key)
        return KeyedEncodingContainer(RefusingKeyedContainer<NestedKey>())
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        notFollowed(key)
        return RefusingContainer()
    }

    mutating func superEncoder() -> any Encoder {
        notFollowed(named: "super")
        return RefusingEncoder()
    }

    mutating func superEncoder(forKey key: Key) -> any Encoder {
        notFollowed(key)
        return RefusingEncoder()
    }

    private func notFollowed(_ key: Key) { notFollowed(named: key.stringValue) }

    private func notFollowed(named name: String) {
        if level == pass.route.count {
            pass.isDirectable = false
        } else if name == pass.route[level] {
            pass.isLost = true
        }
    }
}

/// What a pass gives where it does not follow: every write ends the walk.
struct RefusingContainer: UnkeyedEncodingContainer, SingleValueEncodingContainer {
    var codingPath: [any CodingKey] { [] }
    var count: Int { 0 }

    private func stop() throws -> Never { throw CanonicalDirected.Pass.Stop() }

    mutating func encodeNil() throws { try stop() }
    mutating func encode(_: Bool) throws { try stop() }
    mutating func encode(_: String) throws { try stop() }
    mutating func encode(_: Double) throws { try stop() }
    mutating func encode(_: Float) throws { try stop() }
    mutating func encode(_: Int) throws { try stop() }
    mutating func encode(_: Int8) throws { try stop() }
    mutating func encode(_: Int16) throws { try stop() }
    mutating func encode(_: Int32) throws { try stop() }
    mutating func encode(_: Int64) throws { try stop() }
    mutating func encode(_: Int128) throws { try stop() }
    mutating func encode(_: UInt) throws { try stop() }
    mutating func encode(_: UInt8) throws { try stop() }
    mutating func encode(_: UInt16) throws { try stop() }
    mutating func encode(_: UInt32) throws { try stop() }
    mutating func encode(_: UInt64) throws { try stop() }
    mutating func encode(_: UInt128) throws { try stop() }
    mutating func encode<T: Encodable>(_: T) throws { try stop() }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy _: NestedKey.Type) -> KeyedEncodingContainer<NestedKey>
    {
        KeyedEncodingContainer(RefusingKeyedContainer<NestedKey>())
    }
    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer { self }
    mutating func superEncoder() -> any Encoder { RefusingEncoder() }
}

/// The keyed form of ``RefusingContainer``.
struct RefusingKeyedContainer<Key: CodingKey>: KeyedEncodingContainerProtocol {
    var codingPath: [any CodingKey] { [] }

    private func stop() throws -> Never { throw CanonicalDirected.Pass.Stop() }

    mutating func encodeNil(forKey _: Key) throws { try stop() }
    mutating func encode(_: Bool, forKey _: Key) throws { try stop() }
    mutating func encode(_: String, forKey _: Key) throws { try stop() }
    mutating func encode(_: Double, forKey _: Key) throws { try stop() }
    mutating func encode(_: Float, forKey _: Key) throws { try stop() }
    mutating func encode(_: Int, forKey _: Key) throws { try stop() }
    mutating func encode(_: Int8, forKey _: Key) throws { try stop() }
    mutating func encode(_: Int16, forKey _: Key) throws { try stop() }
    mutating func encode(_: Int32, forKey _: Key) throws { try stop() }
    mutating func encode(_: Int64, forKey _: Key) throws { try stop() }
    mutating func encode(_: Int128, forKey _: Key) throws { try stop() }
    mutating func encode(_: UInt, forKey _: Key) throws { try stop() }
    mutating func encode(_: UInt8, forKey _: Key) throws { try stop() }
    mutating func encode(_: UInt16, forKey _: Key) throws { try stop() }
    mutating func encode(_: UInt32, forKey _: Key) throws { try stop() }
    mutating func encode(_: UInt64, forKey _: Key) throws { try stop() }
    mutating func encode(_: UInt128, forKey _: Key) throws { try stop() }
    mutating func encode<T: Encodable>(_: T, forKey _: Key) throws { try stop() }

    mutating func nestedContainer<NestedKey: CodingKey>(
        keyedBy _: NestedKey.Type,
        forKey _: Key
    ) -> KeyedEncodingContainer<NestedKey> {
        KeyedEncodingContainer(RefusingKeyedContainer<NestedKey>())
    }
    mutating func nestedUnkeyedContainer(forKey _: Key) -> any UnkeyedEncodingContainer { RefusingContainer() }
    mutating func superEncoder() -> any Encoder { RefusingEncoder() }
    mutating func superEncoder(forKey _: Key) -> any Encoder { RefusingEncoder() }
}

/// An encoder whose every container refuses.
struct RefusingEncoder: Encoder {
    var codingPath: [any CodingKey] { [] }
    var userInfo: [CodingUserInfoKey: Any] { [:] }
    func container<Key: CodingKey>(keyedBy _: Key.Type) -> KeyedEncodingContainer<Key> {
        KeyedEncodingContainer(RefusingKeyedContainer<Key>())
    }
    func unkeyedContainer() -> any UnkeyedEncodingContainer { RefusingContainer() }
    func singleValueContainer() -> any SingleValueEncodingContainer { RefusingContainer() }
}
