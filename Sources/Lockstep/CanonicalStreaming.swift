import Foundation

/// The first try of ``CanonicalWriting``: the value's bytes written straight into the output as its `encode(to:)`
/// makes them, each object's members put in order when the object ends — one pass and one buffer, where the tree
/// (``CanonicalTree``) builds the whole value first (its nodes, names and scalars are ~1.5× the output again) and
/// then writes it.
///
/// It takes containers used one inside the other — a container's writes end before its parent's next one begins, as
/// every synthesized conformance and nearly every hand-written one does — and leaves the rest to the tree, which
/// takes any order: a container written again after its parent went on, an encoder used after its value's
/// `encode(to:)` returned, `superEncoder()`, `codingPath` read (it keeps no paths), a member name that needs an
/// escape, a value encoded into a single value container that writes nothing — and everything the tree leaves to
/// Foundation.
final class CanonicalStream {
    /// An open container.
    struct Frame {
        var id: Int
        var isObject: Bool
        /// Members or elements written.
        var count = 0
        /// An object: its first member in ``members``; whether its members came in order so far; whether a name is
        /// not ASCII.
        var firstMember = 0
        var inOrder = true
        var hasNonASCIINames = false
        /// An object whose members come in their names' order (a ``DigestedDictionary``'s): none is recorded in
        /// ``members`` to be put in order, so none holds back the output streamed; each name is checked against the
        /// last, kept here.
        var isOrdered = false
        var lastName: [UInt8] = []
    }

    /// What the value being encoded put in its place so far.
    enum Filled: Equatable {
        case nothing
        case value
        case container(Int)
    }

    // Unchecked, as in the tree: each access is made by a method of this class and ends before any other code (a
    // value's encode(to:), a key's stringValue) runs.
    @exclusivity(unchecked) private(set) var out: [UInt8] = []
    @exclusivity(unchecked) private var frames: [Frame] = []
    /// The members of the open objects: where each begins in ``out`` (its name's opening quote) and where its name
    /// ends (the closing quote).
    @exclusivity(unchecked) private var members: [(start: Int, nameEnd: Int)] = []
    private(set) var isOffFastPath = false
    /// Off this path for a reason the tree shares (a type Foundation's coder treats apart, NaN or an infinity, the
    /// value's own error): straight to Foundation, not through the tree first.
    private(set) var isForFoundation = false
    private var lastID: Int = 0
    /// The place the innermost value being encoded fills, and what it holds.
    private var slot: Int = 0
    private var filled = Filled.nothing
    /// Where the output goes as it is final, when it is streamed (``CanonicalEncoding/stream(_:chunkBytes:into:)``);
    /// `nil` keeps it whole in ``out``.
    private var sink: ((UnsafeRawBufferPointer) -> Void)?
    /// The output is handed to the sink once ``out`` holds this many bytes.
    private var chunkBytes = Int.max
    /// The bytes handed to the sink so far: ``out`` holds what follows them.
    private(set) var handedOut = 0

    /// What the one pass made of a value.
    enum Outcome {
        case bytes([UInt8])
        /// Off this path: the tree may take it.
        case tree
        /// Off this path for a reason the tree shares: Foundation's.
        case foundation
    }

    /// The canonical bytes of `value`, or who is to encode it; written into room for `capacity` bytes.
    static func encode<Value: Encodable>(_ value: Value, reservingCapacity capacity: Int = 0) -> Outcome {
        let stream = CanonicalStream()
        // An action is tens of bytes: room for it from the start.
        stream.out.reserveCapacity(max(capacity, 64))
        guard stream.write(value) else { return stream.isForFoundation ? .foundation : .tree }
        return .bytes(stream.out)
    }

    /// Writes the canonical bytes of `value` into ``out``, over what this stream wrote before and in the room it
    /// took (one stream for many small values, as a `DigestedDictionary`'s member digests); `false` when this path
    /// does not take it (``isForFoundation`` says whether the tree may). Not for a stream that streams out.
    func write<Value: Encodable>(_ value: Value) -> Bool {
        out.removeAll(keepingCapacity: true)
        frames.removeAll(keepingCapacity: true)
        members.removeAll(keepingCapacity: true)
        (isOffFastPath, isForFoundation, slot, filled) = (false, false, 0, .nothing)
        do {
            try encodeValue(value, emptyIsObject: false)
        } catch {
            return false
        }
        while !frames.isEmpty { close() }
        // A top-level value that encodes nothing makes JSONEncoder throw: the tree and Foundation say so.
        return !isOffFastPath && !out.isEmpty
    }

    /// Marks the call as off this path, and as Foundation's to encode.
    func leaveForFoundation() -> OffTheFastPath {
        isForFoundation = true
        return leave()
    }

    /// Marks the call as off this path; the error is for the caller to throw.
    func leave() -> OffTheFastPath {
        isOffFastPath = true
        return OffTheFastPath()
    }

    // MARK: Values

    /// `value` in the place being written. With `emptyIsObject`, a value that writes nothing is `{}`, as Foundation
    /// writes it below the top level.
    func encodeValue<T: Encodable>(_ value: T, emptyIsObject: Bool) throws {
        if CanonicalDecoding.isSpecialCased(T.self) { throw leaveForFoundation() }
        // What their own encode(to:) would write, without the encoder in between.
        if T.self == String.self { return appendString(unsafeBitCast(value, to: String.self)) }
        if T.self == Int.self { return CanonicalTree.appendInteger(unsafeBitCast(value, to: Int.self), to: &out) }
        if T.self == Bool.self { return appendLiteral(unsafeBitCast(value, to: Bool.self) ? "true" : "false") }
        if T.self == [String].self {
            return try appendArray(unsafeBitCast(value, to: [String].self)) { $0.appendString($1) }
        }
        if T.self == [Int].self {
            return try appendArray(unsafeBitCast(value, to: [Int].self)) {
                CanonicalTree.appendInteger($1, to: &$0.out)
            }
        }
        let depth = frames.count
        let parent = frames.last?.id
        let mark = handedOut + out.count
        let outer = (slot, filled)
        lastID &+= 1
        (slot, filled) = (lastID, .nothing)
        do {
            try value.encode(to: CanonicalStreamEncoder(stream: self, slot: slot))
        } catch {
            isOffFastPath = true
            // The value's own error: the tree would meet it too.
            if !(error is OffTheFastPath) { isForFoundation = true }
            throw error
        }
        (slot, filled) = outer
        // Its containers end with it; the containers around it must be the ones it was given.
        guard frames.count >= depth, depth == 0 || frames[depth - 1].id == parent else { throw leave() }
        while frames.count > depth { close() }
        if handedOut + out.count == mark {
            guard emptyIsObject else { throw leave() }
            appendLiteral("{}")
        }
    }

    func appendLiteral(_ literal: StaticString) {
        out.append(contentsOf: UnsafeBufferPointer(start: literal.utf8Start, count: literal.utf8CodeUnitCount))
    }

    func appendString(_ value: String) {
        var value = value
        value.withUTF8 { CanonicalTree.appendQuoted($0, to: &out) }
    }

    func appendIntegerValue<T: FixedWidthInteger>(_ value: T) { CanonicalTree.appendInteger(value, to: &out) }

    func appendFloatingPoint<T: BinaryFloatingPoint & CustomStringConvertible>(_ value: T) throws {
        guard CanonicalTree.appendFloatingPoint(value, to: &out) else { throw leaveForFoundation() }
    }

    private func appendArray<Element>(_ elements: [Element], _ append: (CanonicalStream, Element) -> Void) throws {
        guard frames.count < CanonicalTree.maximumDepth else { throw leave() }
        out.append(UInt8(ascii: "["))
        for (index, element) in elements.enumerated() {
            if index > 0 { out.append(UInt8(ascii: ",")) }
            append(self, element)
            handOutIfDue()
        }
        out.append(UInt8(ascii: "]"))
    }

    // MARK: The place a value fills

    /// Whether `slot` is the place being filled and nothing is in it yet; then it holds a scalar.
    func fillWithValue(_ slot: Int) throws {
        guard slot == self.slot, filled == .nothing else { throw leave() }
        filled = .value
    }

    /// The container `slot` holds: the one it holds already if it is open and of the kind, else a new one.
    func container(for slot: Int, isObject: Bool, isOrdered: Bool = false) -> Int {
        guard slot == self.slot else {
            isOffFastPath = true
            return 0
        }
        switch filled {
        case .nothing:
            let id = open(isObject: isObject, isOrdered: isOrdered)
            filled = .container(id)
            return id
        case let .container(id):
            guard let index = frames.lastIndex(where: { $0.id == id }), frames[index].isObject == isObject else {
                isOffFastPath = true
                return 0
            }
            return id
        case .value:
            isOffFastPath = true
            return 0
        }
    }

    // MARK: Containers

    /// Opens a container at the end of the output.
    func open(isObject: Bool, isOrdered: Bool = false) -> Int {
        guard frames.count < CanonicalTree.maximumDepth else {
            isOffFastPath = true
            return 0
        }
        lastID &+= 1
        out.append(isObject ? UInt8(ascii: "{") : UInt8(ascii: "["))
        frames.append(Frame(id: lastID, isObject: isObject, firstMember: members.count, isOrdered: isOrdered))
        return lastID
    }

    /// Makes container `id` the innermost, ending those opened inside it since; throws if it has ended.
    private func enter(_ id: Int) throws {
        if let last = frames.last, last.id == id { return }
        guard id != 0, let index = frames.lastIndex(where: { $0.id == id }) else { throw leave() }
        while frames.count > index + 1 { close() }
    }

    /// The members or elements container `id` has, while it is open.
    func count(of id: Int) -> Int {
        guard let frame = frames.last(where: { $0.id == id }) else {
            isOffFastPath = true
            return 0
        }
        return frame.count
    }

    /// Begins the next element of array `id`.
    func beginElement(of id: Int) throws {
        try enter(id)
        handOutIfDue()
        if frames[frames.count - 1].count > 0 { out.append(UInt8(ascii: ",")) }
        frames[frames.count - 1].count += 1
    }

    /// Begins member `key` of object `id`: its name and the colon.
    func beginMember(of id: Int, _ key: some CodingKey) throws {
        try enter(id)
        handOutIfDue()
        let top = frames.count - 1
        if frames[top].count > 0 { out.append(UInt8(ascii: ",")) }
        frames[top].count += 1
        let start = out.count
        var name = key.stringValue
        var plain = true
        var ascii = true
        name.withUTF8 { name in
            out.append(UInt8(ascii: "\""))
            out.append(contentsOf: name)
            for byte in name {
                if byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") { plain = false }
                if byte >= 0x80 { ascii = false }
            }
        }
        // A name that needs an escape is sorted by its bytes unescaped: left to the tree.
        guard plain else { throw leave() }
        let nameEnd = out.count
        out.append(UInt8(ascii: "\""))
        out.append(UInt8(ascii: ":"))
        if frames[top].isOrdered {
            // Its names come from one dictionary's keys, distinct as Strings: only their bytes' order is checked.
            let name = out[(start + 1)..<nameEnd]
            guard frames[top].count == 1 || frames[top].lastName.lexicographicallyPrecedes(name) else { throw leave() }
            frames[top].lastName.replaceSubrange(frames[top].lastName.indices, with: name)
            return
        }
        if !ascii { frames[top].hasNonASCIINames = true }
        if frames[top].inOrder, members.count > frames[top].firstMember,
            !precedes(members[members.count - 1], (start, nameEnd))
        {
            frames[top].inOrder = false
        }
        members.append((start, nameEnd))
    }

    /// Ends the innermost container: an object's members put in order.
    func close() {
        handOutIfDue()
        let frame = frames.removeLast()
        guard frame.isObject else {
            out.append(UInt8(ascii: "]"))
            return
        }
        if frame.count > 1, !frame.inOrder || frame.hasNonASCIINames {
            if !putInOrder(frame.firstMember..<members.count, hasNonASCIINames: frame.hasNonASCIINames) {
                isOffFastPath = true
            }
        }
        members.removeSubrange(frame.firstMember...)
        out.append(UInt8(ascii: "}"))
    }

    // MARK: Streaming out

    /// Whether a container is open.
    var hasOpenContainers: Bool { !frames.isEmpty }

    /// Sets the output to go to `sink` a chunk of about `chunkBytes` at a time, as it is final.
    func streamOut(to sink: @escaping (UnsafeRawBufferPointer) -> Void, chunkBytes: Int) {
        self.sink = sink
        self.chunkBytes = chunkBytes
        out.reserveCapacity(chunkBytes + chunkBytes / 2)
    }

    /// Hands the sink what is final of the output once ``out`` holds a chunk: everything before the first member of
    /// an open object whose members may yet be put in order (they are ``members``, innermost last).
    func handOutIfDue() {
        guard out.count >= chunkBytes, let sink else { return }
        let end = members.first?.start ?? out.count
        guard end >= chunkBytes / 2 else { return }
        handOut(upTo: end, to: sink)
    }

    /// Hands the rest to the sink: the output is complete.
    func handOutRest() {
        guard let sink, !out.isEmpty else { return }
        handOut(upTo: out.count, to: sink)
    }

    private func handOut(upTo end: Int, to sink: (UnsafeRawBufferPointer) -> Void) {
        out.withUnsafeBytes { sink(UnsafeRawBufferPointer(rebasing: $0[..<end])) }
        out.removeSubrange(..<end)
        handedOut += end
        for index in members.indices {
            members[index].start -= end
            members[index].nameEnd -= end
        }
    }

    /// Whether the name of `left` comes before that of `right`: JSONWriter's order, the names' UTF-8 compared.
    private func precedes(_ left: (start: Int, nameEnd: Int), _ right: (start: Int, nameEnd: Int)) -> Bool {
        out.withUnsafeBufferPointer { out in
            var (l, r) = (left.start + 1, right.start + 1)
            while l < left.nameEnd, r < right.nameEnd {
                if out[l] != out[r] { return out[l] < out[r] }
                l += 1
                r += 1
            }
            return l == left.nameEnd && r < right.nameEnd
        }
    }

    /// The first eight bytes of a member's name as one big-endian number, zeros padding a shorter one: names hold no
    /// byte below 0x20, so two names' prefixes compare as their bytes do, up to the eighth.
    @inline(__always)
    static func sortingPrefix(of name: some Collection<UInt8>) -> UInt64 {
        var prefix: UInt64 = 0
        var taken = 0
        for byte in name.prefix(8) {
            prefix = prefix << 8 | UInt64(byte)
            taken += 1
        }
        return prefix << (8 * UInt64(8 - taken))
    }

    /// The indices of `names` in the order of their UTF-8: by the first eight bytes as one number (zeros pad a
    /// shorter name, and no name's byte is below 0x20 that the canonical encoder writes unescaped), then by all.
    static func canonicalOrder(of names: [String]) -> [Int] {
        var order = names.indices.map { (prefix: sortingPrefix(of: names[$0].utf8), index: $0) }
        order.sort { left, right in
            left.prefix != right.prefix
                ? left.prefix < right.prefix
                : names[left.index].utf8.lexicographicallyPrecedes(names[right.index].utf8)
        }
        return order.map(\.index)
    }

    /// Rewrites the members `range` of ``members`` — the last object's, which ends the output — in the order of
    /// their names; `false` if a name is there twice (in bytes, or as equal Strings), where Foundation keeps one.
    ///
    /// The largest member is moved once, in place, and only the others are copied aside: an object whose bulk is one
    /// member (a state's list beside its filter) costs one move, not a second copy of itself.
    private func putInOrder(_ range: Range<Int>, hasNonASCIINames: Bool) -> Bool {
        // Sorted by the first eight bytes of each name as one number (names hold no byte below 0x20, so the zeros
        // that pad a short name sort it first, as the bytes do), then by the names where those are equal: most of
        // a large object's comparisons (a dictionary's, by id) are one integer comparison.
        let prefixes = out.withUnsafeBufferPointer { out in
            members[range].map { Self.sortingPrefix(of: out[($0.start + 1)..<$0.nameEnd]) }
        }
        var order = Array(range)
        order.sort { left, right in
            let (l, r) = (prefixes[left - range.lowerBound], prefixes[right - range.lowerBound])
            return l != r ? l < r : precedes(members[left], members[right])
        }
        for position in order.indices.dropFirst()
        where !precedes(members[order[position - 1]], members[order[position]]) {
            return false
        }
        if hasNonASCIINames {
            var names = Set<String>()
            for index in range {
                let member = members[index]
                let name = String(decoding: out[(member.start + 1)..<member.nameEnd], as: UTF8.self)
                guard names.insert(name).inserted else { return false }
            }
        }
        // Each member's bytes: from its name's quote to the comma before the next, or the end.
        func bytes(_ index: Int) -> Range<Int> {
            members[index].start..<(index + 1 < range.upperBound ? members[index + 1].start - 1 : out.count)
        }
        let regionStart = members[range.lowerBound].start
        let largest = range.max { bytes($0).count < bytes($1).count }!
        var aside: [UInt8] = []
        var asideStart = [Int](repeating: 0, count: range.count)
        for index in range where index != largest {
            asideStart[index - range.lowerBound] = aside.count
            aside.append(contentsOf: out[bytes(index)])
        }
        // Where the largest goes: after the members that sort before it, and their commas.
        var target = regionStart
        for index in order {
            if index == largest { break }
            target += bytes(index).count + 1
        }
        let moved = bytes(largest)
        out.withUnsafeMutableBufferPointer { out in
            let base = out.baseAddress!
            memmove(base + target, base + moved.lowerBound, moved.count)
            var position = regionStart
            for (rank, index) in order.enumerated() {
                if rank > 0 {
                    base[position] = UInt8(ascii: ",")
                    position += 1
                }
                if index == largest {
                    position += moved.count
                    continue
                }
                let count = bytes(index).count
                aside.withUnsafeBufferPointer { aside in
                    _ = memcpy(base + position, aside.baseAddress! + asideStart[index - range.lowerBound], count)
                }
                position += count
            }
        }
        return true
    }
}

// MARK: - Encoder

/// The encoder handed to a value's `encode(to:)`: the place its value fills.
struct CanonicalStreamEncoder: Encoder, SingleValueEncodingContainer {
    let stream: CanonicalStream
    let slot: Int

    // The stream keeps no paths: a value that reads one is encoded by the tree.
    var codingPath: [any CodingKey] {
        _ = stream.leave()
        return []
    }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy _: Key.Type) -> KeyedEncodingContainer<Key> {
        let isOrdered = Key.self is any CanonicallyOrderedKey.Type
        return KeyedEncodingContainer(
            CanonicalStreamKeyedContainer<Key>(
                stream: stream,
                id: stream.container(for: slot, isObject: true, isOrdered: isOrdered)
            )
        )
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        CanonicalStreamUnkeyedContainer(stream: stream, id: stream.container(for: slot, isObject: false))
    }

    func singleValueContainer() -> any SingleValueEncodingContainer { self }

    func encodeNil() throws {
        try stream.fillWithValue(slot)
        stream.appendLiteral("null")
    }
    func encode(_ value: Bool) throws {
        try stream.fillWithValue(slot)
        stream.appendLiteral(value ? "true" : "false")
    }
    func encode(_ value: String) throws {
        try stream.fillWithValue(slot)
        stream.appendString(value)
    }
    func encode(_ value: Double) throws {
        try stream.fillWithValue(slot)
        try stream.appendFloatingPoint(value)
    }
    func encode(_ value: Float) throws {
        try stream.fillWithValue(slot)
        try stream.appendFloatingPoint(value)
    }
    func encode(_ value: Int) throws { try integer(value) }
    func encode(_ value: Int8) throws { try integer(value) }
    func encode(_ value: Int16) throws { try integer(value) }
    func encode(_ value: Int32) throws { try integer(value) }
    func encode(_ value: Int64) throws { try integer(value) }
    func encode(_ value: Int128) throws { try integer(value) }
    func encode(_ value: UInt) throws { try integer(value) }
    func encode(_ value: UInt8) throws { try integer(value) }
    func encode(_ value: UInt16) throws { try integer(value) }
    func encode(_ value: UInt32) throws { try integer(value) }
    func encode(_ value: UInt64) throws { try integer(value) }
    func encode(_ value: UInt128) throws { try integer(value) }

    private func integer<T: FixedWidthInteger>(_ value: T) throws {
        try stream.fillWithValue(slot)
        stream.appendIntegerValue(value)
    }

    // What it writes is this place's; if it writes nothing, the tree works out what Foundation does.
    func encode<T: Encodable>(_ value: T) throws {
        try stream.fillWithValue(slot)
        try stream.encodeValue(value, emptyIsObject: false)
    }
}

struct CanonicalStreamKeyedContainer<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let stream: CanonicalStream
    let id: Int

    var codingPath: [any CodingKey] {
        _ = stream.leave()
        return []
    }

    private func member(_ key: Key) throws { try stream.beginMember(of: id, key) }

    mutating func encodeNil(forKey key: Key) throws {
        try member(key)
        stream.appendLiteral("null")
    }
    mutating func encode(_ value: Bool, forKey key: Key) throws {
        try member(key)
        stream.appendLiteral(value ? "true" : "false")
    }
    mutating func encode(_ value: String, forKey key: Key) throws {
        try member(key)
        stream.appendString(value)
    }
    mutating func encode(_ value: Double, forKey key: Key) throws {
        try member(key)
        try stream.appendFloatingPoint(value)
    }
    mutating func encode(_ value: Float, forKey key: Key) throws {
        try member(key)
        try stream.appendFloatingPoint(value)
    }
    mutating func encode(_ value: Int, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: Int8, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: Int16, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: Int32, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: Int64, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: Int128, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: UInt, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: UInt8, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: UInt16, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: UInt32, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: UInt64, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: UInt128, forKey key: Key) throws { try integer(value, key) }

    private func integer<T: FixedWidthInteger>(_ value: T, _ key: Key) throws {
        try member(key)
        stream.appendIntegerValue(value)
    }

    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        try member(key)
        try stream.encodeValue(value, emptyIsObject: true)
    }

    mutating func nestedContainer<NestedKey: CodingKey>(
        keyedBy _: NestedKey.Type,
        forKey key: Key
    ) -> KeyedEncodingContainer<NestedKey> {
        KeyedEncodingContainer(
            CanonicalStreamKeyedContainer<NestedKey>(stream: stream, id: nested(key, isObject: true))
        )
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        CanonicalStreamUnkeyedContainer(stream: stream, id: nested(key, isObject: false))
    }

    /// A container as member `key`, or 0 (which every write refuses) off this path.
    private func nested(_ key: Key, isObject: Bool) -> Int {
        (try? member(key)) == nil ? 0 : stream.open(isObject: isObject)
    }

    mutating func superEncoder() -> any Encoder { detached() }
    mutating func superEncoder(forKey _: Key) -> any Encoder { detached() }

    /// An encoder for no place: `superEncoder()` is left to the tree.
    private func detached() -> any Encoder {
        _ = stream.leave()
        return CanonicalStreamEncoder(stream: stream, slot: 0)
    }
}

struct CanonicalStreamUnkeyedContainer: UnkeyedEncodingContainer {
    let stream: CanonicalStream
    let id: Int

    var count: Int { stream.count(of: id) }

    var codingPath: [any CodingKey] {
        _ = stream.leave()
        return []
    }

    private func element() throws { try stream.beginElement(of: id) }

    mutating func encodeNil() throws {
        try element()
        stream.appendLiteral("null")
    }
    mutating func encode(_ value: Bool) throws {
        try element()
        stream.appendLiteral(value ? "true" : "false")
    }
    mutating func encode(_ value: String) throws {
        try element()
        stream.appendString(value)
    }
    mutating func encode(_ value: Double) throws {
        try element()
        try stream.appendFloatingPoint(value)
    }
    mutating func encode(_ value: Float) throws {
        try element()
        try stream.appendFloatingPoint(value)
    }
    mutating func encode(_ value: Int) throws { try integer(value) }
    mutating func encode(_ value: Int8) throws { try integer(value) }
    mutating func encode(_ value: Int16) throws { try integer(value) }
    mutating func encode(_ value: Int32) throws { try integer(value) }
    mutating func encode(_ value: Int64) throws { try integer(value) }
    mutating func encode(_ value: Int128) throws { try integer(value) }
    mutating func encode(_ value: UInt) throws { try integer(value) }
    mutating func encode(_ value: UInt8) throws { try integer(value) }
    mutating func encode(_ value: UInt16) throws { try integer(value) }
    mutating func encode(_ value: UInt32) throws { try integer(value) }
    mutating func encode(_ value: UInt64) throws { try integer(value) }
    mutating func encode(_ value: UInt128) throws { try integer(value) }

    private mutating func integer<T: FixedWidthInteger>(_ value: T) throws {
        try element()
        stream.appendIntegerValue(value)
    }

    mutating func encode<T: Encodable>(_ value: T) throws {
        try element()
        try stream.encodeValue(value, emptyIsObject: true)
    }

    mutating func nestedContainer<NestedKey: CodingKey>(
        keyedBy _: NestedKey.Type
    ) -> KeyedEncodingContainer<NestedKey> {
        KeyedEncodingContainer(CanonicalStreamKeyedContainer<NestedKey>(stream: stream, id: nested(isObject: true)))
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        CanonicalStreamUnkeyedContainer(stream: stream, id: nested(isObject: false))
    }

    private mutating func nested(isObject: Bool) -> Int {
        (try? element()) == nil ? 0 : stream.open(isObject: isObject)
    }

    mutating func superEncoder() -> any Encoder {
        _ = stream.leave()
        return CanonicalStreamEncoder(stream: stream, slot: 0)
    }
}
