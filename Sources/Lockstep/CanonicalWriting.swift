import Foundation

/// The fast encoder of ``CanonicalEncoding``: ``CanonicalStream`` writes the value in one pass; what it leaves (containers
/// used out of nesting order, coding paths read, `superEncoder()`) goes to an `Encoder` that builds the value as a
/// tree of nodes in flat arrays, its scalars already in their final bytes, then writes the tree out with each
/// object's members sorted.
///
/// It writes only what it is certain to write byte for byte as `JSONEncoder` with
/// `[.sortedKeys, .withoutEscapingSlashes]` does. Anything else — `Date`, `Data`, `URL`, `Decimal`, a member
/// name twice in one object (or two names that are equal Strings), a container asked for where a value was
/// already encoded, `superEncoder()` of an array, NaN and infinities, a top-level value that encodes nothing,
/// nesting deeper than 256, and every error at all — marks the tree as off the fast path, and
/// ``CanonicalEncoding`` encodes the value again with `JSONEncoder`, whose bytes or error stand.
///
/// Foundation's rules matched here, from swift-foundation's `JSONWriter.swift` and `JSONEncoder.swift`:
/// - members are sorted by the bytes of their names' UTF-8 (`a.key.utf8.lexicographicallyPrecedes(b.key.utf8)`):
///   `"B"` before `"a"`, `"a10"` before `"a9"`, `""` first, `"z"` before `"é"`;
/// - strings escape `"` and `\` with a backslash, 0x08, 0x0c, 0x0a, 0x0d and 0x09 as `\b`, `\f`, `\n`, `\r` and
///   `\t`, every other byte below 0x20 as `\u00XX` in lowercase hex, and nothing else (`/`, DEL, U+2028 and
///   U+2029 and all non-ASCII go as they are);
/// - integers are their `description`; a `Double` or `Float` is its `description` less a trailing `.0` (`1`,
///   `0.1`, `1e-07`, `1e+21`, `-0`);
/// - a value whose `encode(to:)` encodes nothing is `{}` below the top level; an unused `superEncoder()` too;
/// - a nested value's coding path is its encoder's path plus its key: the keys of nested containers on the way are
///   not in it, nor in the path of `superEncoder()`.
enum CanonicalWriting {
    /// The canonical bytes of `value`, or `nil` when the fast path cannot be certain to write what `JSONEncoder`
    /// would (including when `JSONEncoder` would throw); written into room for `capacity` bytes.
    static func encode<Value: Encodable>(_ value: Value, reservingCapacity capacity: Int = 0) -> [UInt8]? {
        guard !CanonicalDecoding.isSpecialCased(Value.self) else { return nil }
        switch CanonicalStream.encode(value, reservingCapacity: capacity) {
        case let .bytes(bytes): return bytes
        case .foundation: return nil
        case .tree: CanonicalEncoding.Fallbacks.current?.recordTreeEncoding()
        }
        let tree = CanonicalTree()
        do {
            try value.encode(to: CanonicalEncoder(tree: tree, slot: 0, path: -1))
            // JSONEncoder throws for a top-level value that encodes nothing.
            guard !tree.isOffFastPath, tree.nodes[0].kind != .empty else { return nil }
            return try tree.serialized()
        } catch {
            return nil
        }
    }
}

/// The value being encoded: nodes whose scalars and member names are bytes in ``scratch``.
final class CanonicalTree: CanonicalCodingState {
    struct Node {
        enum Kind: UInt8 {
            case empty, scalar, array, object
        }

        var kind = Kind.empty
        /// An object: one of its members' names is not ASCII.
        var hasNonASCIINames = false
        /// A scalar: its bytes, as written. A member: its name's bytes, not escaped.
        var start: UInt32 = 0
        var end: UInt32 = 0
        var nameStart: UInt32 = 0
        var nameEnd: UInt32 = 0
        /// A container: its first and last member or element, and how many there are.
        var first: Int32 = -1
        var last: Int32 = -1
        var count: UInt32 = 0
        /// The next member or element of the same container.
        var next: Int32 = -1
    }

    // The vars skip the runtime's exclusivity checks, which cost more than the rest of a small encoding: each access
    // is made by a method of this class and ends before any other code (a value's encode(to:), a key's stringValue)
    // runs.
    @exclusivity(unchecked) var nodes: [Node] = []
    @exclusivity(unchecked) var scratch: [UInt8] = []
    /// Members being sorted: a stack, one run per object being written.
    @exclusivity(unchecked) private var order: [Int32] = []

    /// Deeper than this is left to Foundation, which refuses 512.
    static let maximumDepth = 256
    /// More bytes than the nodes' 32-bit offsets hold are left to Foundation.
    static let maximumScratch = Int(Int32.max)

    override init() {
        nodes.reserveCapacity(16)
        nodes.append(Node())
        scratch.reserveCapacity(64)
    }

    // MARK: Building

    /// `slot` as a container of `kind`: the one it is already, or a new one if it is empty. Foundation hands out
    /// the same container again too; anything else (it stops the process) is left to it, and the caller gets a
    /// container no one writes out.
    func container(_ slot: Int32, _ kind: Node.Kind) -> Int32 {
        switch nodes[Int(slot)].kind {
        case .empty:
            nodes[Int(slot)].kind = kind
            return slot
        case kind:
            return slot
        default:
            isOffFastPath = true
            let detached = detachedSlot()
            nodes[Int(detached)].kind = kind
            return detached
        }
    }

    /// A node in no container, for what is encoded after the fast path was left.
    func detachedSlot() -> Int32 {
        nodes.append(Node())
        return Int32(nodes.count - 1)
    }

    private func append(_ node: Node, to container: Int32) -> Int32 {
        let index = Int32(nodes.count)
        nodes.append(node)
        if nodes[Int(container)].last >= 0 {
            nodes[Int(nodes[Int(container)].last)].next = index
        } else {
            nodes[Int(container)].first = index
        }
        nodes[Int(container)].last = index
        nodes[Int(container)].count += 1
        return index
    }

    /// A new, empty member of `object` named by `key`.
    func member(of object: Int32, _ key: some CodingKey) -> Int32 {
        var name = key.stringValue
        let start = scratch.count
        if start > Self.maximumScratch {
            // Past what the nodes' offsets hold: left to Foundation, with the name set aside.
            isOffFastPath = true
            return detachedSlot()
        }
        var ascii = true
        name.withUTF8 { name in
            scratch.append(contentsOf: name)
            for byte in name where byte >= 0x80 { ascii = false }
        }
        if !ascii { nodes[Int(object)].hasNonASCIINames = true }
        return append(Node(nameStart: UInt32(start), nameEnd: UInt32(scratch.count)), to: object)
    }

    /// A new, empty element at the end of `array`.
    func element(of array: Int32) -> Int32 {
        append(Node(), to: array)
    }

    /// Ends a scalar begun at `start` in ``scratch`` in `slot`, which must be empty (Foundation stops the process
    /// when a single value is encoded twice).
    private func setScalar(_ slot: Int32, from start: Int) throws(OffTheFastPath) {
        guard nodes[Int(slot)].kind == .empty, scratch.count <= Self.maximumScratch else { throw leaveFastPath() }
        nodes[Int(slot)].kind = .scalar
        nodes[Int(slot)].start = UInt32(start)
        nodes[Int(slot)].end = UInt32(scratch.count)
    }

    func setLiteral(_ slot: Int32, _ literal: StaticString) throws(OffTheFastPath) {
        let start = scratch.count
        scratch.append(contentsOf: UnsafeBufferPointer(start: literal.utf8Start, count: literal.utf8CodeUnitCount))
        try setScalar(slot, from: start)
    }

    func setBool(_ slot: Int32, _ value: Bool) throws(OffTheFastPath) {
        try setLiteral(slot, value ? "true" : "false")
    }

    func setString(_ slot: Int32, _ value: String) throws(OffTheFastPath) {
        let start = scratch.count
        var value = value
        value.withUTF8 { Self.appendQuoted($0, to: &scratch) }
        try setScalar(slot, from: start)
    }

    /// An integer's `description`, without making the String.
    func setInteger<T: FixedWidthInteger>(_ slot: Int32, _ value: T) throws(OffTheFastPath) {
        let start = scratch.count
        Self.appendInteger(value, to: &scratch)
        try setScalar(slot, from: start)
    }

    /// JSONEncoder's spelling: `description` less a trailing `.0`; NaN and infinities make it throw.
    func setFloatingPoint<T: BinaryFloatingPoint & CustomStringConvertible>(
        _ slot: Int32,
        _ value: T
    ) throws(OffTheFastPath) {
        let start = scratch.count
        guard Self.appendFloatingPoint(value, to: &scratch) else { throw leaveFastPath() }
        try setScalar(slot, from: start)
    }

    /// An integer's `description` at the end of `out`, without making the String.
    static func appendInteger<T: FixedWidthInteger>(_ value: T, to out: inout [UInt8]) {
        if T.bitWidth > 64 {
            out.append(contentsOf: value.description.utf8)
            return
        }
        if value < 0 { out.append(UInt8(ascii: "-")) }
        var magnitude = UInt64(value.magnitude)
        let digits = out.count
        repeat {
            out.append(UInt8(ascii: "0") + UInt8(magnitude % 10))
            magnitude /= 10
        } while magnitude > 0
        out[digits...].reverse()
    }

    /// A `Double` or `Float` as JSONEncoder spells it — `description` less a trailing `.0` — at the end of `out`;
    /// `false` (and nothing written) for NaN and the infinities, which make it throw.
    static func appendFloatingPoint<T: BinaryFloatingPoint & CustomStringConvertible>(
        _ value: T,
        to out: inout [UInt8]
    ) -> Bool {
        guard value.isFinite else { return false }
        var text = value.description
        if text.hasSuffix(".0") { text.removeLast(2) }
        out.append(contentsOf: text.utf8)
        return true
    }

    /// `value` through its own `encode(to:)` into `slot`; `{}` when it encodes nothing, as Foundation writes.
    ///
    /// Any error, the value's own too, leaves the fast path: a caller that catches it goes on with a tree that
    /// holds what the value wrote before it threw, where Foundation keeps nothing.
    func encode<T: Encodable>(_ value: T, into slot: Int32, path: Int32) throws {
        if CanonicalDecoding.isSpecialCased(T.self) { throw leaveFastPath() }
        // What their own encode(to:) would write, without the encoder in between.
        if T.self == String.self { return try setString(slot, unsafeBitCast(value, to: String.self)) }
        if T.self == Int.self { return try setInteger(slot, unsafeBitCast(value, to: Int.self)) }
        if T.self == Bool.self { return try setBool(slot, unsafeBitCast(value, to: Bool.self)) }
        if T.self == [String].self {
            return try setArray(slot, unsafeBitCast(value, to: [String].self)) { try setString($0, $1) }
        }
        if T.self == [Int].self {
            return try setArray(slot, unsafeBitCast(value, to: [Int].self)) { try setInteger($0, $1) }
        }
        do {
            try value.encode(to: CanonicalEncoder(tree: self, slot: slot, path: path))
        } catch {
            isOffFastPath = true
            throw error
        }
        if nodes[Int(slot)].kind == .empty { nodes[Int(slot)].kind = .object }
    }

    /// `elements` as `Array.encode(to:)` writes them: an array in `slot`, each element in turn through `set`.
    private func setArray<Element>(
        _ slot: Int32,
        _ elements: [Element],
        _ set: (Int32, Element) throws -> Void
    ) throws {
        guard nodes[Int(slot)].kind == .empty else { throw leaveFastPath() }
        nodes[Int(slot)].kind = .array
        for element in elements { try set(self.element(of: slot), element) }
    }

    // MARK: Writing

    func serialized() throws(OffTheFastPath) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(scratch.count + 4 * nodes.count)
        try write(0, depth: 0, to: &out)
        return out
    }

    private func write(_ index: Int32, depth: Int, to out: inout [UInt8]) throws(OffTheFastPath) {
        let node = nodes[Int(index)]
        switch node.kind {
        case .empty:
            // An unused superEncoder(): Foundation writes what it finds there, an empty object.
            out.append(UInt8(ascii: "{"))
            out.append(UInt8(ascii: "}"))
        case .scalar:
            out.append(contentsOf: scratch[Int(node.start)..<Int(node.end)])
        case .array:
            guard depth < Self.maximumDepth else { throw leaveFastPath() }
            out.append(UInt8(ascii: "["))
            var element = node.first
            while element >= 0 {
                if element != node.first { out.append(UInt8(ascii: ",")) }
                try write(element, depth: depth + 1, to: &out)
                element = nodes[Int(element)].next
            }
            out.append(UInt8(ascii: "]"))
        case .object:
            guard depth < Self.maximumDepth else { throw leaveFastPath() }
            out.append(UInt8(ascii: "{"))
            if node.count == 1 {
                try writeMember(node.first, depth: depth, to: &out)
            } else if node.count > 1 {
                let base = order.count
                var member = node.first
                while member >= 0 {
                    order.append(member)
                    member = nodes[Int(member)].next
                }
                try sortMembers(base..<order.count, hasNonASCIINames: node.hasNonASCIINames)
                for position in base..<order.count {
                    if position != base { out.append(UInt8(ascii: ",")) }
                    try writeMember(order[position], depth: depth, to: &out)
                }
                order.removeSubrange(base...)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    private func writeMember(_ member: Int32, depth: Int, to out: inout [UInt8]) throws(OffTheFastPath) {
        let node = nodes[Int(member)]
        scratch.withUnsafeBufferPointer {
            Self.appendQuoted(UnsafeBufferPointer(rebasing: $0[Int(node.nameStart)..<Int(node.nameEnd)]), to: &out)
        }
        out.append(UInt8(ascii: ":"))
        try write(member, depth: depth + 1, to: &out)
    }

    /// Whether the name of member `left` comes before that of `right`: JSONWriter's order,
    /// `a.key.utf8.lexicographicallyPrecedes(b.key.utf8)`.
    private func precedes(_ left: Int32, _ right: Int32) -> Bool {
        let (left, right) = (nodes[Int(left)], nodes[Int(right)])
        return scratch.withUnsafeBufferPointer { scratch in
            var (l, r) = (Int(left.nameStart), Int(right.nameStart))
            while l < Int(left.nameEnd), r < Int(right.nameEnd) {
                if scratch[l] != scratch[r] { return scratch[l] < scratch[r] }
                l += 1
                r += 1
            }
            return l == Int(left.nameEnd) && r < Int(right.nameEnd)
        }
    }

    /// Sorts the members in `range` of ``order`` by their names; off the fast path if a name is there twice, in
    /// bytes or (with names that are not ASCII) as equal Strings, where Foundation's dictionary keeps one.
    private func sortMembers(_ range: Range<Int>, hasNonASCIINames: Bool) throws(OffTheFastPath) {
        if range.count <= 16 {
            // Insertion sort: members mostly arrive in an order close to sorted, and few.
            for position in range.dropFirst() {
                let member = order[position]
                var slot = position
                while slot > range.lowerBound, precedes(member, order[slot - 1]) {
                    order[slot] = order[slot - 1]
                    slot -= 1
                }
                order[slot] = member
            }
        } else {
            order[range].sort { precedes($0, $1) }
        }
        for position in range.dropFirst() where !precedes(order[position - 1], order[position]) {
            throw leaveFastPath()
        }
        if hasNonASCIINames {
            var names = Set<String>()
            for position in range {
                let member = nodes[Int(order[position])]
                let name = String(decoding: scratch[Int(member.nameStart)..<Int(member.nameEnd)], as: UTF8.self)
                guard names.insert(name).inserted else { throw leaveFastPath() }
            }
        }
    }

    /// `utf8` as a JSON string, escaped as JSONWriter escapes with `.withoutEscapingSlashes`.
    static func appendQuoted(_ utf8: UnsafeBufferPointer<UInt8>, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        var mark = 0
        for index in 0..<utf8.count {
            let byte = utf8[index]
            guard byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") else { continue }
            out.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[mark..<index]))
            out.append(UInt8(ascii: "\\"))
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"): out.append(byte)
            case 0x08: out.append(UInt8(ascii: "b"))
            case 0x0c: out.append(UInt8(ascii: "f"))
            case 0x0a: out.append(UInt8(ascii: "n"))
            case 0x0d: out.append(UInt8(ascii: "r"))
            case 0x09: out.append(UInt8(ascii: "t"))
            default:
                // \u00XX, lowercase: only 0x00...0x1f get here, so the first digit is 0 or 1.
                let low = byte & 0x0f
                out.append(UInt8(ascii: "u"))
                out.append(UInt8(ascii: "0"))
                out.append(UInt8(ascii: "0"))
                out.append(UInt8(ascii: "0") + (byte >> 4))
                out.append(low < 10 ? UInt8(ascii: "0") + low : UInt8(ascii: "a") + low - 10)
            }
            mark = index + 1
        }
        out.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[mark...]))
        out.append(UInt8(ascii: "\""))
    }
}

// MARK: - Encoder

/// The encoder handed to a value's `encode(to:)`: the node its value goes in, and its coding path.
struct CanonicalEncoder: Encoder, SingleValueEncodingContainer {
    let tree: CanonicalTree
    let slot: Int32
    let path: Int32

    var codingPath: [any CodingKey] { tree.codingPath(path) }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy _: Key.Type) -> KeyedEncodingContainer<Key> {
        KeyedEncodingContainer(
            CanonicalKeyedEncodingContainer<Key>(
                tree: tree,
                object: tree.container(slot, .object),
                encoderPath: path,
                path: path
            )
        )
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        CanonicalUnkeyedEncodingContainer(
            tree: tree,
            array: tree.container(slot, .array),
            encoderPath: path,
            path: path
        )
    }

    func singleValueContainer() -> any SingleValueEncodingContainer { self }

    func encodeNil() throws { try tree.setLiteral(slot, "null") }
    func encode(_ value: Bool) throws { try tree.setBool(slot, value) }
    func encode(_ value: String) throws { try tree.setString(slot, value) }
    func encode(_ value: Double) throws { try tree.setFloatingPoint(slot, value) }
    func encode(_ value: Float) throws { try tree.setFloatingPoint(slot, value) }
    func encode(_ value: Int) throws { try tree.setInteger(slot, value) }
    func encode(_ value: Int8) throws { try tree.setInteger(slot, value) }
    func encode(_ value: Int16) throws { try tree.setInteger(slot, value) }
    func encode(_ value: Int32) throws { try tree.setInteger(slot, value) }
    func encode(_ value: Int64) throws { try tree.setInteger(slot, value) }
    func encode(_ value: Int128) throws { try tree.setInteger(slot, value) }
    func encode(_ value: UInt) throws { try tree.setInteger(slot, value) }
    func encode(_ value: UInt8) throws { try tree.setInteger(slot, value) }
    func encode(_ value: UInt16) throws { try tree.setInteger(slot, value) }
    func encode(_ value: UInt32) throws { try tree.setInteger(slot, value) }
    func encode(_ value: UInt64) throws { try tree.setInteger(slot, value) }
    func encode(_ value: UInt128) throws { try tree.setInteger(slot, value) }

    // Foundation encodes a single value's value with the same encoder, so at the same path.
    func encode<T: Encodable>(_ value: T) throws {
        guard tree.nodes[Int(slot)].kind == .empty else { throw tree.leaveFastPath() }
        try tree.encode(value, into: slot, path: path)
    }
}

struct CanonicalKeyedEncodingContainer<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let tree: CanonicalTree
    let object: Int32
    /// The path of the encoder the container came from: a nested value's encoder extends it, not ``path``.
    let encoderPath: Int32
    let path: Int32

    var codingPath: [any CodingKey] { tree.codingPath(path) }

    mutating func encodeNil(forKey key: Key) throws { try tree.setLiteral(tree.member(of: object, key), "null") }
    mutating func encode(_ value: Bool, forKey key: Key) throws {
        try tree.setBool(tree.member(of: object, key), value)
    }
    mutating func encode(_ value: String, forKey key: Key) throws {
        try tree.setString(tree.member(of: object, key), value)
    }
    mutating func encode(_ value: Double, forKey key: Key) throws {
        try tree.setFloatingPoint(tree.member(of: object, key), value)
    }
    mutating func encode(_ value: Float, forKey key: Key) throws {
        try tree.setFloatingPoint(tree.member(of: object, key), value)
    }
    mutating func encode(_ value: Int, forKey key: Key) throws {
        try tree.setInteger(tree.member(of: object, key), value)
    }
    mutating func encode(_ value: Int8, forKey key: Key) throws {
        try tree.setInteger(tree.member(of: object, key), value)
    }
    mutating func encode(_ value: Int16, forKey key: Key) throws {
        try tree.setInteger(tree.member(of: object, key), value)
    }
    mutating func encode(_ value: Int32, forKey key: Key) throws {
        try tree.setInteger(tree.member(of: object, key), value)
    }
    mutating func encode(_ value: Int64, forKey key: Key) throws {
        try tree.setInteger(tree.member(of: object, key), value)
    }
    mutating func encode(_ value: Int128, forKey key: Key) throws {
        try tree.setInteger(tree.member(of: object, key), value)
    }
    mutating func encode(_ value: UInt, forKey key: Key) throws {
        try tree.setInteger(tree.member(of: object, key), value)
    }
    mutating func encode(_ value: UInt8, forKey key: Key) throws {
        try tree.setInteger(tree.member(of: object, key), value)
    }
    mutating func encode(_ value: UInt16, forKey key: Key) throws {
        try tree.setInteger(tree.member(of: object, key), value)
    }
    mutating func encode(_ value: UInt32, forKey key: Key) throws {
        try tree.setInteger(tree.member(of: object, key), value)
    }
    mutating func encode(_ value: UInt64, forKey key: Key) throws {
        try tree.setInteger(tree.member(of: object, key), value)
    }
    mutating func encode(_ value: UInt128, forKey key: Key) throws {
        try tree.setInteger(tree.member(of: object, key), value)
    }

    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        try tree.encode(value, into: tree.member(of: object, key), path: tree.path(encoderPath, key))
    }

    mutating func nestedContainer<NestedKey: CodingKey>(
        keyedBy _: NestedKey.Type,
        forKey key: Key
    ) -> KeyedEncodingContainer<NestedKey> {
        KeyedEncodingContainer(
            CanonicalKeyedEncodingContainer<NestedKey>(
                tree: tree,
                object: tree.container(tree.member(of: object, key), .object),
                encoderPath: encoderPath,
                path: tree.path(path, key)
            )
        )
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        CanonicalUnkeyedEncodingContainer(
            tree: tree,
            array: tree.container(tree.member(of: object, key), .array),
            encoderPath: encoderPath,
            path: tree.path(path, key)
        )
    }

    // Foundation sets the member when the encoder it hands out goes away; set now, it ends the same unless the
    // name is used twice, which leaves the fast path anyway.
    mutating func superEncoder() -> any Encoder {
        CanonicalEncoder(
            tree: tree,
            slot: tree.member(of: object, CanonicalCodingKey.super),
            path: tree.path(encoderPath, CanonicalCodingKey.super)
        )
    }

    mutating func superEncoder(forKey key: Key) -> any Encoder {
        CanonicalEncoder(tree: tree, slot: tree.member(of: object, key), path: tree.path(encoderPath, key))
    }
}

/// Three words, so that it is held inline in `any UnkeyedEncodingContainer`.
struct CanonicalUnkeyedEncodingContainer: UnkeyedEncodingContainer {
    let tree: CanonicalTree
    let array: Int32
    let encoderPath: Int32
    let path: Int32

    var codingPath: [any CodingKey] { tree.codingPath(path) }
    var count: Int { Int(tree.nodes[Int(array)].count) }

    mutating func encodeNil() throws { try tree.setLiteral(tree.element(of: array), "null") }
    mutating func encode(_ value: Bool) throws { try tree.setBool(tree.element(of: array), value) }
    mutating func encode(_ value: String) throws { try tree.setString(tree.element(of: array), value) }
    mutating func encode(_ value: Double) throws { try tree.setFloatingPoint(tree.element(of: array), value) }
    mutating func encode(_ value: Float) throws { try tree.setFloatingPoint(tree.element(of: array), value) }
    mutating func encode(_ value: Int) throws { try tree.setInteger(tree.element(of: array), value) }
    mutating func encode(_ value: Int8) throws { try tree.setInteger(tree.element(of: array), value) }
    mutating func encode(_ value: Int16) throws { try tree.setInteger(tree.element(of: array), value) }
    mutating func encode(_ value: Int32) throws { try tree.setInteger(tree.element(of: array), value) }
    mutating func encode(_ value: Int64) throws { try tree.setInteger(tree.element(of: array), value) }
    mutating func encode(_ value: Int128) throws { try tree.setInteger(tree.element(of: array), value) }
    mutating func encode(_ value: UInt) throws { try tree.setInteger(tree.element(of: array), value) }
    mutating func encode(_ value: UInt8) throws { try tree.setInteger(tree.element(of: array), value) }
    mutating func encode(_ value: UInt16) throws { try tree.setInteger(tree.element(of: array), value) }
    mutating func encode(_ value: UInt32) throws { try tree.setInteger(tree.element(of: array), value) }
    mutating func encode(_ value: UInt64) throws { try tree.setInteger(tree.element(of: array), value) }
    mutating func encode(_ value: UInt128) throws { try tree.setInteger(tree.element(of: array), value) }

    mutating func encode<T: Encodable>(_ value: T) throws {
        let path = tree.path(encoderPath, index: count)
        try tree.encode(value, into: tree.element(of: array), path: path)
    }

    mutating func nestedContainer<NestedKey: CodingKey>(
        keyedBy _: NestedKey.Type
    ) -> KeyedEncodingContainer<NestedKey> {
        let path = tree.path(path, index: count)
        return KeyedEncodingContainer(
            CanonicalKeyedEncodingContainer<NestedKey>(
                tree: tree,
                object: tree.container(tree.element(of: array), .object),
                encoderPath: encoderPath,
                path: path
            )
        )
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        let path = tree.path(path, index: count)
        return CanonicalUnkeyedEncodingContainer(
            tree: tree,
            array: tree.container(tree.element(of: array), .array),
            encoderPath: encoderPath,
            path: path
        )
    }

    // Foundation inserts its value where the array was when it was asked for, once the encoder goes away: the
    // elements encoded in between see other indices. Left to Foundation.
    mutating func superEncoder() -> any Encoder {
        _ = tree.leaveFastPath()
        return CanonicalEncoder(tree: tree, slot: tree.detachedSlot(), path: tree.path(encoderPath, index: count))
    }
}
