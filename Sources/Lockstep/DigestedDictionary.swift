import HashTreeCollections

/// A dictionary for the large part of a state: a swift-collections `TreeDictionary` (a copy shares every node but
/// the path a change makes) that keeps the sum of its members' digests as it changes, so the state's digest costs
/// what its other members cost, not what its size does (docs/domains.md, "Large states"; docs/protocol.md,
/// "Digest forms").
///
/// Its canonical form is the tree's: an object whose members are the keys, sorted — a snapshot of a state holding
/// one is the same bytes as with a plain `TreeDictionary`. In a state's *digest form* it is written as
/// `{"count":n,"sum":"…"}`: `sum` the 64 hex digits of the sum, modulo 2²⁵⁶, of each member's SHA-256 over the digest
/// form of `[key, value]` (both read as big-endian numbers). Each change hashes the member it removes and the one it
/// adds (a few microseconds for a member of a few hundred bytes); a dictionary decoded from a snapshot hashes its
/// members once, the first time its digest is asked for, on the thread that asks. The daemon and the replicas ask
/// on a thread of their own for a state decoded from a snapshot of 1 MiB or more (a checkpoint at recovery, the
/// replica's digest thread after it installs one).
///
/// Keys are `Int` or `String`, as for the tree in a state: other keys encode in hash order, which differs between
/// processes.
public struct DigestedDictionary<Key: Hashable & Codable, Value: Codable> {
    /// The members.
    public private(set) var tree: TreeDictionary<Key, Value>
    /// What the changes since ``origin`` added to the sum: the digests of the members they added less those of the
    /// members they removed, leaving out members that would not encode.
    private var delta: DigestSum
    /// The members added since ``origin`` that would not encode, less those removed: while any is left the
    /// dictionary has no digest form, as the state has no canonical form.
    private var unencodable = 0
    /// The decoded value this one descends from, whose members' sum is taken once, when first asked for; `nil` for
    /// one built from empty.
    private var origin: DigestOrigin?

    /// An empty dictionary.
    public init() {
        tree = TreeDictionary()
        delta = .zero
        origin = nil
    }

    /// A dictionary of the members of `tree`; their sum is taken when first asked for.
    public init(_ tree: TreeDictionary<Key, Value>) {
        self.tree = tree
        delta = .zero
        origin = tree.isEmpty ? nil : DigestOrigin()
    }

    /// The value for `key`; setting `nil` removes the member.
    public subscript(key: Key) -> Value? {
        get { tree[key] }
        set {
            let old = newValue.map { tree.updateValue($0, forKey: key) } ?? tree.removeValue(forKey: key)
            account(key, removed: old, added: newValue)
        }
    }

    /// Sets the value for `key`, and returns the one it replaced.
    @discardableResult
    public mutating func updateValue(_ value: Value, forKey key: Key) -> Value? {
        let old = tree.updateValue(value, forKey: key)
        account(key, removed: old, added: value)
        return old
    }

    /// Removes the member for `key`, and returns its value.
    @discardableResult
    public mutating func removeValue(forKey key: Key) -> Value? {
        let old = tree.removeValue(forKey: key)
        account(key, removed: old, added: nil)
        return old
    }

    /// The number of members.
    public var count: Int { tree.count }
    /// Whether there are none.
    public var isEmpty: Bool { tree.isEmpty }
    /// The keys, in the tree's order (which is not the same in every process: sort them for an order).
    public var keys: TreeDictionary<Key, Value>.Keys { tree.keys }
    /// The values, in the tree's order.
    public var values: TreeDictionary<Key, Value>.Values { tree.values }

    /// The sum of the members' digests: what the digest form writes.
    func sum() throws -> DigestSum {
        guard unencodable == 0 else {
            let context = EncodingError.Context(
                codingPath: [],
                debugDescription: "\(unencodable) member(s) of a DigestedDictionary do not encode (a NaN or an "
                    + "infinity, say): the state has no digest form, nor a canonical form, until they are gone"
            )
            throw EncodingError.invalidValue(tree.count, context)
        }
        guard let origin else { return delta }
        if let base = origin.base.withLockedValue({ $0 }) { return base + delta }
        let whole = try Self.sum(of: tree)
        origin.base.withLockedValue { $0 = whole - delta }
        return whole
    }

    private mutating func account(_ key: Key, removed: Value?, added: Value?) {
        if let removed { change(by: key, removed, sign: -1) }
        if let added { change(by: key, added, sign: 1) }
    }

    /// Adds (`sign` 1) or subtracts (-1) the member's digest; one that would not encode is counted instead.
    private mutating func change(by key: Key, _ value: Value, sign: Int) {
        do {
            let digest = try Self.digest(key, value)
            delta = sign > 0 ? delta + digest : delta - digest
        } catch {
            unencodable += sign
        }
    }

    private static func sum(of tree: TreeDictionary<Key, Value>) throws -> DigestSum {
        let digester = CanonicalEncoding.DigestFormDigester()
        return try digester.run {
            try tree.reduce(DigestSum.zero) {
                $0 + DigestSum(try digester.digest(of: Member(key: $1.key, value: $1.value)))
            }
        }
    }

    /// A member's digest: the SHA-256 of the digest form of `[key, value]`, as a number.
    static func digest(_ key: Key, _ value: Value) throws -> DigestSum {
        DigestSum(try CanonicalEncoding.digestForm(of: Member(key: key, value: value)).digest)
    }

    /// `[key, value]`.
    private struct Member: Encodable {
        var key: Key
        var value: Value

        func encode(to encoder: any Encoder) throws {
            var container = encoder.unkeyedContainer()
            try container.encode(key)
            try container.encode(value)
        }
    }

    private enum SummaryKeys: String, CodingKey {
        case count, sum
    }
}

extension DigestedDictionary: Codable {
    /// The tree's canonical form, or in a digest form the count and sum.
    public func encode(to encoder: any Encoder) throws {
        guard let form = CanonicalEncoding.writingDigestForm else { return try encodeMembers(to: encoder) }
        form.condensed()
        var container = encoder.container(keyedBy: SummaryKeys.self)
        try container.encode(tree.count, forKey: .count)
        try container.encode(StateDigest(words: try sum().words).hex, forKey: .sum)
    }

    /// The members as the tree encodes them, but written in the canonical form's order (by their names' UTF-8)
    /// when the keys are `Int` or `String`: the canonical encoder then has nothing to reorder — it would otherwise
    /// set every member but the largest aside (a second copy of a large state) and sort them all — and, its keys
    /// saying so (``CanonicallyOrderedKey``), holds back none of them when it streams.
    private func encodeMembers(to encoder: any Encoder) throws {
        guard Key.self == String.self || Key.self == Int.self else { return try tree.encode(to: encoder) }
        var container = encoder.container(keyedBy: MemberKey.self)
        // A probe of the streaming writer's (`CanonicalDirected`) only asks what the members are written as.
        if encoder.userInfo[CanonicalDirected.probingKey] as? Bool == true { return }
        let names: [String] =
            if let tree = tree as? TreeDictionary<String, Value> {
                Array(tree.keys)
            } else {
                tree.keys.map { String(unsafeBitCast($0, to: Int.self)) }
            }
        let values = Array(tree.values)
        for index in Self.canonicalOrder(of: names) {
            try container.encode(values[index], forKey: MemberKey(stringValue: names[index]))
        }
    }

    /// The indices of `names` in the canonical form's order (``CanonicalStream/canonicalOrder(of:)``).
    package static func canonicalOrder(of names: [String]) -> [Int] { CanonicalStream.canonicalOrder(of: names) }

    /// A member's key: its name, read as a number when it is one (as the tree's own keys are). Sixteen bytes, so
    /// that a decoder holds it inline where it takes `any CodingKey`.
    private struct MemberKey: CanonicallyOrderedKey {
        let stringValue: String
        var intValue: Int? { Int(stringValue) }

        init(stringValue: String) {
            self.stringValue = stringValue
        }

        init(intValue: Int) {
            stringValue = String(intValue)
        }
    }

    /// The members of the tree's canonical form; their sum is taken when first asked for. `Int` and `String` keys
    /// are read as the tree reads them — an object's member names, a later duplicate winning — but without casting
    /// each key and boxing each coding key on the way, and from the canonical decoder a member at a time, in the
    /// document's order.
    public init(from decoder: any Decoder) throws {
        guard Key.self == Int.self || Key.self == String.self else {
            self.init(try TreeDictionary(from: decoder))
            return
        }
        var tree = TreeDictionary<Key, Value>()
        if let canonical = decoder as? CanonicalDecoder {
            try canonical.forEachMember(MemberKey.self, Value.self) { name, value in
                tree[try Self.key(name, in: decoder)] = try value()
            }
        } else {
            let container = try decoder.container(keyedBy: MemberKey.self)
            for name in container.allKeys {
                tree[try Self.key(name, in: decoder)] = try container.decode(Value.self, forKey: name)
            }
        }
        self.init(tree)
    }

    /// The key a member's name is, for `Int` or `String` keys; the key is checked before its value, as the tree
    /// checks it.
    private static func key(_ name: MemberKey, in decoder: any Decoder) throws -> Key {
        if Key.self == String.self { return unsafeBitCast(name.stringValue, to: Key.self) }
        guard let number = name.intValue else {
            throw DecodingError.typeMismatch(
                Int.self,
                DecodingError.Context(
                    codingPath: decoder.codingPath + [name],
                    debugDescription: "Expected Int key but found String key instead."
                )
            )
        }
        return unsafeBitCast(number, to: Key.self)
    }
}

extension DigestedDictionary: Equatable where Value: Equatable {
    /// Whether both have the same members (the tree stops at the subtrees both share).
    public static func == (left: Self, right: Self) -> Bool { left.tree == right.tree }
}

extension DigestedDictionary: Hashable where Value: Hashable {
    /// The members' hash (the tree's).
    public func hash(into hasher: inout Hasher) { hasher.combine(tree) }
}

extension DigestedDictionary: Sendable where Key: Sendable, Value: Sendable {}

extension DigestedDictionary: Sequence {
    /// The members, in the tree's order.
    public func makeIterator() -> TreeDictionary<Key, Value>.Iterator { tree.makeIterator() }
    public var underestimatedCount: Int { tree.count }
}

extension DigestedDictionary: ExpressibleByDictionaryLiteral {
    /// The members listed; a key listed twice traps, as for a `Dictionary`.
    public init(dictionaryLiteral elements: (Key, Value)...) {
        self.init(TreeDictionary(uniqueKeysWithValues: elements))
    }
}

/// The sum of a decoded dictionary's members, shared by every value that descends from it, and taken once.
final class DigestOrigin: Sendable {
    let base = LockedValue<DigestSum?>(nil)
}

/// A number modulo 2²⁵⁶, held as four words, most significant first: what digests add up to.
struct DigestSum: Hashable, Sendable {
    var words: (UInt64, UInt64, UInt64, UInt64)

    static let zero = DigestSum(words: (0, 0, 0, 0))

    init(words: (UInt64, UInt64, UInt64, UInt64)) {
        self.words = words
    }

    /// A digest, read as a big-endian number.
    init(_ digest: StateDigest) {
        words = digest.words
    }

    static func + (left: Self, right: Self) -> Self {
        let (w3, c3) = left.words.3.addingReportingOverflow(right.words.3)
        let (w2, c2) = add(left.words.2, right.words.2, carry: c3)
        let (w1, c1) = add(left.words.1, right.words.1, carry: c2)
        let (w0, _) = add(left.words.0, right.words.0, carry: c1)
        return Self(words: (w0, w1, w2, w3))
    }

    static func - (left: Self, right: Self) -> Self {
        // The two's complement of `right`: every bit flipped, plus one.
        let flipped = Self(words: (~right.words.0, ~right.words.1, ~right.words.2, ~right.words.3))
        return left + flipped + Self(words: (0, 0, 0, 1))
    }

    private static func add(_ left: UInt64, _ right: UInt64, carry: Bool) -> (UInt64, Bool) {
        let (sum, first) = left.addingReportingOverflow(right)
        let (withCarry, second) = sum.addingReportingOverflow(carry ? 1 : 0)
        return (withCarry, first || second)
    }

    static func == (left: Self, right: Self) -> Bool { left.words == right.words }

    func hash(into hasher: inout Hasher) {
        hasher.combine(words.0)
        hasher.combine(words.1)
        hasher.combine(words.2)
        hasher.combine(words.3)
    }
}
