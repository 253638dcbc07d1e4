import Foundation

/// The fast decoder of ``CanonicalEncoding``: bytes in exactly the form `JSONEncoder` writes with
/// `[.sortedKeys, .withoutEscapingSlashes]` are parsed once into a flat array of tokens, and a `Decoder` walks
/// them.
///
/// It decodes only what it is certain to decode as `JSONDecoder` does. Anything else — whitespace, members out of
/// order or twice, a member name that is not printable ASCII without escapes, an escape `JSONEncoder` would not
/// write, `1.0` or `1e2` or `-0` for an integer, a floating-point number not spelled as `description` spells it,
/// `Date`, `Data`, `URL`, `Decimal`, nesting deeper than 256, and every error at all, the caller's own included —
/// marks the document as off the fast path and throws; ``CanonicalEncoding`` then decodes the bytes again with
/// `JSONDecoder`, so every error a caller sees is Foundation's. The mark is kept even when the decoded type
/// catches the error (`try?`), because what the type does next could differ from what it does under Foundation.
///
/// Foundation's rules matched here, from swift-foundation's `JSONDecoder.swift` and `JSONScanner.swift`:
/// an object's members are looked up by `key.stringValue` (String equality, which for printable ASCII is byte
/// equality, hence the ASCII-only names: `"K"` and `"\u{212A}"` are equal Strings); `decodeIfPresent` gives
/// `nil` for a missing member and for `null`; `superDecoder()` reads the member `super`; coding paths grow by the
/// caller's own keys and by `Index n` keys (`intValue` n) for array elements; `Data`, `Date`, `URL` and `Decimal`
/// are decoded by special cases. `allKeys` lists the members in document order; Foundation lists them in its
/// dictionary's order, which no decoded value may depend on as it changes with each process's hash seed.
enum CanonicalDecoding {
    /// The value of type `Value` the canonical bytes hold, or `nil` when the fast path cannot decode them exactly
    /// as `JSONDecoder` would (including when they do not decode at all).
    static func decode<Value: Decodable>(_ type: Value.Type, from bytes: [UInt8]) -> Value? {
        guard !isSpecialCased(Value.self), let document = CanonicalDocument(bytes) else { return nil }
        do {
            let value = try Value(from: CanonicalDecoder(document: document, token: 0, path: -1))
            return document.isOffFastPath ? nil : value
        } catch {
            return nil
        }
    }

    /// The types `JSONDecoder` and `JSONEncoder` treat apart from their own `Codable` conformance.
    @inline(__always)
    static func isSpecialCased<T>(_ type: T.Type) -> Bool {
        T.self == Data.self || T.self == Date.self || T.self == URL.self || T.self == Decimal.self
    }
}

/// Thrown inside the fast coders when they cannot be certain to do what Foundation's coders do; it never leaves
/// ``CanonicalEncoding``.
struct OffTheFastPath: Error {}

/// One JSON value of a parsed document; containers are followed by their members (name, then value) or elements.
/// Twelve bytes: a scalar keeps where its bytes are, a container where it ends and how many it holds (a large
/// state's document is millions of tokens, all alive while it is decoded).
struct CanonicalToken {
    enum Kind: UInt8 {
        case null, falseLiteral, trueLiteral, number, string, array, object
    }

    var kind: Kind
    /// A string: it has escapes. A number: it is `-?(0|[1-9][0-9]*)` and not `-0`, so an integer reads it as is.
    var flag: Bool
    /// A scalar's ``start``; a container's ``next(at:)``.
    private var first: UInt32
    /// A scalar's ``end``; a container's ``count``.
    private var second: UInt32

    /// A scalar whose bytes are `start..<end`.
    init(_ kind: Kind, flag: Bool, start: UInt32, end: UInt32) {
        self.kind = kind
        self.flag = flag
        first = start
        second = end
    }

    /// A container, its end and count to be set when it closes.
    init(container kind: Kind) {
        self.init(kind, flag: false, start: 0, end: 0)
    }

    var isContainer: Bool { kind == .array || kind == .object }
    /// A string's or number's bytes (a string's without its quotes).
    var start: UInt32 { first }
    var end: UInt32 { second }
    /// A container's members or elements.
    var count: UInt32 { second }

    /// The index of the token after this one, at `index`, and everything in it.
    func next(at index: UInt32) -> UInt32 { isContainer ? first : index + 1 }

    /// A container closed: the token after it is `next`, and it holds `count`.
    mutating func close(next: UInt32, count: UInt32) {
        first = next
        second = count
    }
}

/// A key of a coding path the decoder made itself: an array element's, or `super`.
struct CanonicalCodingKey: CodingKey {
    var stringValue: String
    var intValue: Int?

    init(stringValue: String) {
        self.stringValue = stringValue
        intValue = nil
    }

    init(intValue: Int) {
        stringValue = "\(intValue)"
        self.intValue = intValue
    }

    /// Foundation's key for an element of an array: `Index 3`, with `intValue` 3.
    init(index: Int) {
        stringValue = "Index \(index)"
        intValue = index
    }

    static let `super` = CanonicalCodingKey(stringValue: "super")
}

/// The parsed bytes, and what decoding them has built up: the coding paths handed out, and whether the fast path
/// was left.
final class CanonicalDocument: CanonicalCodingState {
    let bytes: [UInt8]
    let tokens: [CanonicalToken]
    // The vars skip the runtime's exclusivity checks, which cost more than the rest of a small decoding: each
    // access is one append or one store by a method of this class, and none is open while other code runs.
    /// The name tokens of the members of each large object looked into, by the object's token.
    @exclusivity(unchecked) private var memberIndexes: [UInt32: [UInt32]] = [:]

    /// Parses `bytes`; `nil` unless they are one value in the canonical form.
    init?(_ bytes: [UInt8]) {
        guard !bytes.isEmpty, bytes.count < Int(Int32.max) else { return nil }
        let parsed: [CanonicalToken]? = bytes.withUnsafeBufferPointer { buffer in
            var parser = CanonicalParser(bytes: buffer)
            do {
                try parser.value(depth: 0)
            } catch {
                return nil
            }
            return parser.position == buffer.count ? parser.tokens : nil
        }
        guard let parsed else { return nil }
        self.bytes = bytes
        tokens = parsed
    }

    // MARK: Scalars

    func decodeNil(_ token: UInt32) -> Bool {
        tokens[Int(token)].kind == .null
    }

    func bool(_ token: UInt32) throws(OffTheFastPath) -> Bool {
        switch tokens[Int(token)].kind {
        case .trueLiteral: return true
        case .falseLiteral: return false
        default: throw leaveFastPath()
        }
    }

    func string(_ token: UInt32) throws(OffTheFastPath) -> String {
        let token = tokens[Int(token)]
        guard token.kind == .string else { throw leaveFastPath() }
        return bytes.withUnsafeBufferPointer { buffer in
            let raw = UnsafeBufferPointer(rebasing: buffer[Int(token.start)..<Int(token.end)])
            // The parser checked the UTF-8 and the escapes.
            guard token.flag else { return String(decoding: raw, as: UTF8.self) }
            return String(unsafeUninitializedCapacity: raw.count) { out in
                var read = 0
                var written = 0
                while read < raw.count {
                    var byte = raw[read]
                    read += 1
                    if byte == UInt8(ascii: "\\") {
                        let escape = raw[read]
                        read += 1
                        switch escape {
                        case UInt8(ascii: "b"): byte = 0x08
                        case UInt8(ascii: "f"): byte = 0x0c
                        case UInt8(ascii: "n"): byte = 0x0a
                        case UInt8(ascii: "r"): byte = 0x0d
                        case UInt8(ascii: "t"): byte = 0x09
                        case UInt8(ascii: "u"):
                            // \u00XX, XX in lowercase hex below 0x20: the parser let no other through.
                            byte =
                                CanonicalParser.hexValue(raw[read + 2]) << 4 | CanonicalParser.hexValue(raw[read + 3])
                            read += 4
                        default: byte = escape  // \" and \\
                        }
                    }
                    out[written] = byte
                    written += 1
                }
                return written
            }
        }
    }

    /// An integer spelled `-?(0|[1-9][0-9]*)` that fits `T`. Foundation reads `1.0`, `1e2` and `-0` into an
    /// integer too, by way of `Double` and `Decimal`; those are left to it.
    func integer<T: FixedWidthInteger>(_ token: UInt32, as _: T.Type = T.self) throws(OffTheFastPath) -> T {
        let token = tokens[Int(token)]
        guard token.kind == .number, token.flag else { throw leaveFastPath() }
        var index = Int(token.start)
        let end = Int(token.end)
        let negative = bytes[index] == UInt8(ascii: "-")
        if negative {
            guard T.isSigned else { throw leaveFastPath() }
            index += 1
        }
        var value: T = 0
        while index < end {
            let digit = T(bytes[index] &- UInt8(ascii: "0"))
            let (shifted, overflow) = value.multipliedReportingOverflow(by: 10)
            let (next, carry) =
                negative ? shifted.subtractingReportingOverflow(digit) : shifted.addingReportingOverflow(digit)
            guard !overflow, !carry else { throw leaveFastPath() }
            value = next
            index += 1
        }
        return value
    }

    /// A finite number spelled exactly as `JSONEncoder` spells the value (`description` less a trailing `.0`).
    ///
    /// Foundation reads numbers with the C library's correctly rounded `strtod`/`strtof`; `description` is the
    /// shortest spelling that reads back as the same value under correct rounding, so for such a spelling both
    /// readers give the value whose spelling it is. Any other spelling (`1.50`, `1E2`) is left to Foundation.
    func floatingPoint<T: BinaryFloatingPoint & LosslessStringConvertible>(
        _ token: UInt32,
        as _: T.Type = T.self
    ) throws(OffTheFastPath) -> T {
        let token = tokens[Int(token)]
        guard token.kind == .number else { throw leaveFastPath() }
        let spelled = bytes[Int(token.start)..<Int(token.end)]
        guard let value = T(String(decoding: spelled, as: UTF8.self)), value.isFinite else { throw leaveFastPath() }
        var canonical = value.description
        if canonical.hasSuffix(".0") { canonical.removeLast(2) }
        guard canonical.utf8.elementsEqual(spelled) else { throw leaveFastPath() }
        return value
    }

    // MARK: Values through their own conformance

    /// Any error, the type's own too, leaves the fast path: what a caller that catches it does next is its own
    /// business, but the error it saw was not Foundation's.
    func decode<T: Decodable>(_: T.Type, _ token: UInt32, path: Int32) throws -> T {
        if CanonicalDecoding.isSpecialCased(T.self) { throw leaveFastPath() }
        // What their own init(from:) would read, without the decoder in between.
        if T.self == String.self { return unsafeBitCast(try string(token), to: T.self) }
        if T.self == Int.self { return unsafeBitCast(try integer(token, as: Int.self), to: T.self) }
        if T.self == Bool.self { return unsafeBitCast(try bool(token), to: T.self) }
        if T.self == [String].self { return unsafeBitCast(try array(token) { try string($0) }, to: T.self) }
        if T.self == [Int].self { return unsafeBitCast(try array(token) { try integer($0, as: Int.self) }, to: T.self) }
        do {
            return try T(from: CanonicalDecoder(document: self, token: token, path: path))
        } catch {
            isOffFastPath = true
            throw error
        }
    }

    /// The elements of an array, as `Array.init(from:)` reads them: each in turn through `element`.
    func array<Element>(_ token: UInt32, _ element: (UInt32) throws -> Element) throws -> [Element] {
        guard tokens[Int(token)].kind == .array else { throw leaveFastPath() }
        var elements: [Element] = []
        elements.reserveCapacity(Int(tokens[Int(token)].count))
        var cursor = token + 1
        for _ in 0..<tokens[Int(token)].count {
            elements.append(try element(cursor))
            cursor = tokens[Int(cursor)].next(at: cursor)
        }
        return elements
    }

    // MARK: Members

    /// The token of the value of the member named `key`, or `nil`; off the fast path when the name is not ASCII
    /// (it may equal an ASCII name as a String without being the same bytes). A large object's members are found
    /// by binary search: the parser let names through only in increasing order.
    func member(of object: UInt32, _ key: some CodingKey) -> UInt32? {
        var name = key.stringValue
        let index = tokens[Int(object)].count > 16 ? memberIndex(of: object) : nil
        return name.withUTF8 { name -> UInt32? in
            for byte in name where byte >= 0x80 {
                isOffFastPath = true
                return nil
            }
            return tokens.withUnsafeBufferPointer { tokens in
                bytes.withUnsafeBufferPointer { bytes in
                    /// How the name of the member whose name token is `token` compares with `name`.
                    func compare(_ token: Int) -> Int {
                        let (start, end) = (Int(tokens[token].start), Int(tokens[token].end))
                        for offset in 0..<min(end - start, name.count) where bytes[start + offset] != name[offset] {
                            return bytes[start + offset] < name[offset] ? -1 : 1
                        }
                        return end - start == name.count ? 0 : (end - start < name.count ? -1 : 1)
                    }
                    if let index {
                        var (low, high) = (0, index.count)
                        while low < high {
                            let middle = (low + high) / 2
                            switch compare(Int(index[middle])) {
                            case 0: return index[middle] + 1
                            case ..<0: low = middle + 1
                            default: high = middle
                            }
                        }
                        return nil
                    }
                    var token = Int(object) + 1
                    for _ in 0..<tokens[Int(object)].count {
                        if compare(token) == 0 { return UInt32(token + 1) }
                        token = Int(tokens[token + 1].next(at: UInt32(token + 1)))
                    }
                    return nil
                }
            }
        }
    }

    /// The name tokens of the members of a large `object`, made once.
    private func memberIndex(of object: UInt32) -> [UInt32] {
        if let index = memberIndexes[object] { return index }
        var index: [UInt32] = []
        index.reserveCapacity(Int(tokens[Int(object)].count))
        var token = object + 1
        for _ in 0..<tokens[Int(object)].count {
            index.append(token)
            token = tokens[Int(token) + 1].next(at: token + 1)
        }
        memberIndexes[object] = index
        return index
    }

    /// The keys of the members' names that `Key` has, in document (sorted) order.
    func keys<Key: CodingKey>(of object: UInt32, as _: Key.Type) -> [Key] {
        var keys: [Key] = []
        keys.reserveCapacity(Int(tokens[Int(object)].count))
        var index = Int(object) + 1
        for _ in 0..<tokens[Int(object)].count {
            let nameToken = tokens[index]
            let name = String(decoding: bytes[Int(nameToken.start)..<Int(nameToken.end)], as: UTF8.self)
            if let key = Key(stringValue: name) { keys.append(key) }
            index = Int(tokens[index + 1].next(at: UInt32(index + 1)))
        }
        return keys
    }
}

// MARK: - Parsing

/// Reads one value in the canonical form into tokens, and throws at the first byte outside it.
struct CanonicalParser {
    let bytes: UnsafeBufferPointer<UInt8>
    var position = 0
    var tokens: [CanonicalToken] = []

    /// Deeper than this is left to Foundation, whose scanner refuses 512.
    static let maximumDepth = 256

    init(bytes: UnsafeBufferPointer<UInt8>) {
        self.bytes = bytes
        // A token for every 16 bytes, at least: room a large document rarely outgrows (outgrowing it, the array is
        // copied into one twice its size, the two alive together), and only what is written is touched.
        tokens.reserveCapacity(max(16, bytes.count / 16))
    }

    private var next: UInt8? { position < bytes.count ? bytes[position] : nil }

    mutating func value(depth: Int) throws(OffTheFastPath) {
        guard depth <= Self.maximumDepth, let byte = next else { throw OffTheFastPath() }
        switch byte {
        case UInt8(ascii: "{"): try container(.object, depth: depth)
        case UInt8(ascii: "["): try container(.array, depth: depth)
        case UInt8(ascii: "\""): try string()
        case UInt8(ascii: "t"): try literal("true", .trueLiteral)
        case UInt8(ascii: "f"): try literal("false", .falseLiteral)
        case UInt8(ascii: "n"): try literal("null", .null)
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): try number()
        default: throw OffTheFastPath()
        }
    }

    private mutating func append(_ kind: CanonicalToken.Kind, flag: Bool = false, start: Int, end: Int) {
        tokens.append(CanonicalToken(kind, flag: flag, start: UInt32(start), end: UInt32(end)))
    }

    private mutating func literal(_ text: StaticString, _ kind: CanonicalToken.Kind) throws(OffTheFastPath) {
        let count = text.utf8CodeUnitCount
        guard bytes.count - position >= count else { throw OffTheFastPath() }
        for offset in 0..<count where bytes[position + offset] != text.utf8Start[offset] {
            throw OffTheFastPath()
        }
        append(kind, start: position, end: position + count)
        position += count
    }

    /// An object or an array: its token, then each element — for an object a member name (in order, none twice),
    /// `:` and its value — up to the closer.
    private mutating func container(_ kind: CanonicalToken.Kind, depth: Int) throws(OffTheFastPath) {
        let index = tokens.count
        tokens.append(CanonicalToken(container: kind))
        position += 1
        let closer = kind == .object ? UInt8(ascii: "}") : UInt8(ascii: "]")
        var count: UInt32 = 0
        var previous: Range<Int>? = nil
        if next == closer {
            position += 1
        } else {
            while true {
                if kind == .object {
                    let name = try memberName()
                    if let previous, !Self.precedes(bytes, previous, name) { throw OffTheFastPath() }
                    previous = name
                    guard next == UInt8(ascii: ":") else { throw OffTheFastPath() }
                    position += 1
                }
                try value(depth: depth + 1)
                count += 1
                if next == UInt8(ascii: ",") {
                    position += 1
                } else if next == closer {
                    position += 1
                    break
                } else {
                    throw OffTheFastPath()
                }
            }
        }
        tokens[index].close(next: UInt32(tokens.count), count: count)
    }

    /// A member name of printable ASCII (DEL included) without escapes.
    private mutating func memberName() throws(OffTheFastPath) -> Range<Int> {
        guard next == UInt8(ascii: "\"") else { throw OffTheFastPath() }
        let start = position + 1
        var end = start
        while end < bytes.count {
            let byte = bytes[end]
            if byte == UInt8(ascii: "\"") { break }
            guard byte >= 0x20, byte < 0x80, byte != UInt8(ascii: "\\") else { throw OffTheFastPath() }
            end += 1
        }
        guard end < bytes.count else { throw OffTheFastPath() }
        append(.string, start: start, end: end)
        position = end + 1
        return start..<end
    }

    /// Whether the bytes of `left` come strictly before those of `right`: how `JSONEncoder` orders member names
    /// (`a.key.utf8.lexicographicallyPrecedes(b.key.utf8)`), and proof that no name is there twice.
    static func precedes(_ bytes: UnsafeBufferPointer<UInt8>, _ left: Range<Int>, _ right: Range<Int>) -> Bool {
        let common = min(left.count, right.count)
        for offset in 0..<common {
            let (l, r) = (bytes[left.lowerBound + offset], bytes[right.lowerBound + offset])
            if l != r { return l < r }
        }
        return left.count < right.count
    }

    static func hexValue(_ byte: UInt8) -> UInt8 {
        byte <= UInt8(ascii: "9") ? byte &- UInt8(ascii: "0") : byte &- UInt8(ascii: "a") &+ 10
    }

    /// A string whose escapes are those `JSONEncoder` writes — `\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, and
    /// `\u00XX` in lowercase hex for the other bytes below 0x20 — and whose other bytes are valid UTF-8 at or above
    /// 0x20.
    private mutating func string() throws(OffTheFastPath) {
        let start = position + 1
        var index = start
        var escapes = false
        let count = bytes.count
        while true {
            guard index < count else { throw OffTheFastPath() }
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") { break }
            if byte == UInt8(ascii: "\\") {
                escapes = true
                guard index + 1 < count else { throw OffTheFastPath() }
                switch bytes[index + 1] {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "b"), UInt8(ascii: "f"), UInt8(ascii: "n"),
                    UInt8(ascii: "r"), UInt8(ascii: "t"):
                    index += 2
                case UInt8(ascii: "u"):
                    guard index + 5 < count, bytes[index + 2] == UInt8(ascii: "0"),
                        bytes[index + 3] == UInt8(ascii: "0")
                    else { throw OffTheFastPath() }
                    let (high, low) = (bytes[index + 4], bytes[index + 5])
                    guard high == UInt8(ascii: "0") || high == UInt8(ascii: "1"),
                        (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(low)
                            || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains(low)
                    else { throw OffTheFastPath() }
                    switch Self.hexValue(high) << 4 | Self.hexValue(low) {
                    case 0x08, 0x09, 0x0a, 0x0c, 0x0d: throw OffTheFastPath()  // written with a short escape
                    default: index += 6
                    }
                default:
                    throw OffTheFastPath()
                }
            } else if byte < 0x20 {
                throw OffTheFastPath()
            } else if byte < 0x80 {
                index += 1
            } else {
                index = try Self.utf8Sequence(bytes, at: index)
            }
        }
        append(.string, flag: escapes, start: start, end: index)
        position = index + 1
    }

    /// The index after the well-formed UTF-8 sequence (Unicode's table 3-7) that starts at `index` with a byte of
    /// 0x80 or more.
    static func utf8Sequence(_ bytes: UnsafeBufferPointer<UInt8>, at index: Int) throws(OffTheFastPath) -> Int {
        let lead = bytes[index]
        let length: Int
        var secondRange: ClosedRange<UInt8> = 0x80...0xbf
        switch lead {
        case 0xc2...0xdf: length = 2
        case 0xe0:
            length = 3
            secondRange = 0xa0...0xbf
        case 0xe1...0xec, 0xee...0xef: length = 3
        case 0xed:
            length = 3
            secondRange = 0x80...0x9f
        case 0xf0:
            length = 4
            secondRange = 0x90...0xbf
        case 0xf1...0xf3: length = 4
        case 0xf4:
            length = 4
            secondRange = 0x80...0x8f
        default: throw OffTheFastPath()
        }
        guard index + length <= bytes.count, secondRange.contains(bytes[index + 1]) else { throw OffTheFastPath() }
        for offset in 2..<length where !(0x80...0xbf).contains(bytes[index + offset]) {
            throw OffTheFastPath()
        }
        return index + length
    }

    private mutating func number() throws(OffTheFastPath) {
        let start = position
        var index = position
        func digits(from index: inout Int) -> Int {
            let first = index
            while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) { index += 1 }
            return index - first
        }
        if bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard index < bytes.count else { throw OffTheFastPath() }
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else {
            guard digits(from: &index) > 0 else { throw OffTheFastPath() }
        }
        var integer = true
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            integer = false
            index += 1
            guard digits(from: &index) > 0 else { throw OffTheFastPath() }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            integer = false
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
                index += 1
            }
            guard digits(from: &index) > 0 else { throw OffTheFastPath() }
        }
        if integer, index - start == 2, bytes[start] == UInt8(ascii: "-"), bytes[start + 1] == UInt8(ascii: "0") {
            integer = false  // -0
        }
        append(.number, flag: integer, start: start, end: index)
        position = index
    }
}

// MARK: - Decoder

/// The decoder handed to a value's `init(from:)`: one token of the document, and the coding path to it.
struct CanonicalDecoder: Decoder, SingleValueDecodingContainer {
    let document: CanonicalDocument
    let token: UInt32
    let path: Int32

    var codingPath: [any CodingKey] { document.codingPath(path) }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy _: Key.Type) throws -> KeyedDecodingContainer<Key> {
        guard document.tokens[Int(token)].kind == .object else { throw document.leaveFastPath() }
        return KeyedDecodingContainer(
            CanonicalKeyedDecodingContainer<Key>(document: document, object: token, path: path)
        )
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        guard document.tokens[Int(token)].kind == .array else { throw document.leaveFastPath() }
        return CanonicalUnkeyedDecodingContainer(document: document, array: token, path: path)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer { self }

    func decodeNil() -> Bool { document.decodeNil(token) }
    func decode(_: Bool.Type) throws -> Bool { try document.bool(token) }
    func decode(_: String.Type) throws -> String { try document.string(token) }
    func decode(_: Double.Type) throws -> Double { try document.floatingPoint(token) }
    func decode(_: Float.Type) throws -> Float { try document.floatingPoint(token) }
    func decode(_: Int.Type) throws -> Int { try document.integer(token) }
    func decode(_: Int8.Type) throws -> Int8 { try document.integer(token) }
    func decode(_: Int16.Type) throws -> Int16 { try document.integer(token) }
    func decode(_: Int32.Type) throws -> Int32 { try document.integer(token) }
    func decode(_: Int64.Type) throws -> Int64 { try document.integer(token) }
    func decode(_: Int128.Type) throws -> Int128 { throw document.leaveFastPath() }
    func decode(_: UInt.Type) throws -> UInt { try document.integer(token) }
    func decode(_: UInt8.Type) throws -> UInt8 { try document.integer(token) }
    func decode(_: UInt16.Type) throws -> UInt16 { try document.integer(token) }
    func decode(_: UInt32.Type) throws -> UInt32 { try document.integer(token) }
    func decode(_: UInt64.Type) throws -> UInt64 { try document.integer(token) }
    func decode(_: UInt128.Type) throws -> UInt128 { throw document.leaveFastPath() }
    // The same decoder, the same path: Foundation decodes a single value's value in place too.
    func decode<T: Decodable>(_: T.Type) throws -> T { try document.decode(T.self, token, path: path) }

    /// For a large dictionary's `init(from:)`: the members of this object in the document's order, each one's key
    /// (a name `Key` does not take is passed over, as `allKeys` does) and a call that decodes its value as `Value`
    /// at its coding path. What `allKeys` and `decode(_:forKey:)` give, without an array of every key or a search
    /// for each member.
    func forEachMember<Key: CodingKey, Value: Decodable>(
        _: Key.Type,
        _: Value.Type,
        _ body: (Key, () throws -> Value) throws -> Void
    ) throws {
        let object = document.tokens[Int(token)]
        guard object.kind == .object else { throw document.leaveFastPath() }
        var name = token + 1
        for _ in 0..<object.count {
            let value = name + 1
            if let key = Key(stringValue: try document.string(name)) {
                try body(key) {
                    try document.forgettingPaths {
                        try document.decode(Value.self, value, path: document.path(path, key))
                    }
                }
            }
            name = document.tokens[Int(value)].next(at: value)
        }
    }
}

struct CanonicalKeyedDecodingContainer<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let document: CanonicalDocument
    let object: UInt32
    /// The container's coding path is `parent` followed by `lastKey`, if any: a nested container keeps its key here
    /// and puts it in the document only when a value in it needs the path, as few do.
    private let parent: Int32
    private let lastKey: (any CodingKey)?

    init(document: CanonicalDocument, object: UInt32, path: Int32) {
        self.document = document
        self.object = object
        parent = path
        lastKey = nil
    }

    init(document: CanonicalDocument, object: UInt32, parent: Int32, key: some CodingKey) {
        self.document = document
        self.object = object
        self.parent = parent
        lastKey = key
    }

    private var path: Int32 {
        guard let lastKey else { return parent }
        return document.path(parent, lastKey)
    }

    var codingPath: [any CodingKey] {
        var path = document.codingPath(parent)
        if let lastKey { path.append(lastKey) }
        return path
    }

    var allKeys: [Key] { document.keys(of: object, as: Key.self) }

    func contains(_ key: Key) -> Bool { document.member(of: object, key) != nil }

    private func value(_ key: some CodingKey) throws(OffTheFastPath) -> UInt32 {
        guard let token = document.member(of: object, key) else { throw document.leaveFastPath() }
        return token
    }

    func decodeNil(forKey key: Key) throws -> Bool { document.decodeNil(try value(key)) }
    func decode(_: Bool.Type, forKey key: Key) throws -> Bool { try document.bool(try value(key)) }
    func decode(_: String.Type, forKey key: Key) throws -> String { try document.string(try value(key)) }
    func decode(_: Double.Type, forKey key: Key) throws -> Double { try document.floatingPoint(try value(key)) }
    func decode(_: Float.Type, forKey key: Key) throws -> Float { try document.floatingPoint(try value(key)) }
    func decode(_: Int.Type, forKey key: Key) throws -> Int { try document.integer(try value(key)) }
    func decode(_: Int8.Type, forKey key: Key) throws -> Int8 { try document.integer(try value(key)) }
    func decode(_: Int16.Type, forKey key: Key) throws -> Int16 { try document.integer(try value(key)) }
    func decode(_: Int32.Type, forKey key: Key) throws -> Int32 { try document.integer(try value(key)) }
    func decode(_: Int64.Type, forKey key: Key) throws -> Int64 { try document.integer(try value(key)) }
    func decode(_: Int128.Type, forKey key: Key) throws -> Int128 { throw document.leaveFastPath() }
    func decode(_: UInt.Type, forKey key: Key) throws -> UInt { try document.integer(try value(key)) }
    func decode(_: UInt8.Type, forKey key: Key) throws -> UInt8 { try document.integer(try value(key)) }
    func decode(_: UInt16.Type, forKey key: Key) throws -> UInt16 { try document.integer(try value(key)) }
    func decode(_: UInt32.Type, forKey key: Key) throws -> UInt32 { try document.integer(try value(key)) }
    func decode(_: UInt64.Type, forKey key: Key) throws -> UInt64 { try document.integer(try value(key)) }
    func decode(_: UInt128.Type, forKey key: Key) throws -> UInt128 { throw document.leaveFastPath() }

    func decode<T: Decodable>(_: T.Type, forKey key: Key) throws -> T {
        try document.forgettingPaths { try document.decode(T.self, try value(key), path: document.path(path, key)) }
    }

    // Foundation's: `nil` for a missing member and for `null`, without asking `T`.
    func decodeIfPresent<T: Decodable>(_: T.Type, forKey key: Key) throws -> T? {
        guard let token = document.member(of: object, key), !document.decodeNil(token) else {
            if document.isOffFastPath { throw OffTheFastPath() }
            return nil
        }
        return try document.forgettingPaths { try document.decode(T.self, token, path: document.path(path, key)) }
    }

    func nestedContainer<NestedKey: CodingKey>(
        keyedBy _: NestedKey.Type,
        forKey key: Key
    ) throws -> KeyedDecodingContainer<NestedKey> {
        let token = try value(key)
        guard document.tokens[Int(token)].kind == .object else { throw document.leaveFastPath() }
        return KeyedDecodingContainer(
            CanonicalKeyedDecodingContainer<NestedKey>(document: document, object: token, parent: path, key: key)
        )
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        let token = try value(key)
        guard document.tokens[Int(token)].kind == .array else { throw document.leaveFastPath() }
        return CanonicalUnkeyedDecodingContainer(document: document, array: token, path: document.path(path, key))
    }

    // Foundation hands a decoder of `null` for a missing member; that case is left to it.
    func superDecoder() throws -> any Decoder {
        CanonicalDecoder(
            document: document,
            token: try value(CanonicalCodingKey.super),
            path: document.path(path, CanonicalCodingKey.super)
        )
    }

    func superDecoder(forKey key: Key) throws -> any Decoder {
        CanonicalDecoder(document: document, token: try value(key), path: document.path(path, key))
    }
}

/// Three words, so that it is held inline in `any UnkeyedDecodingContainer`.
struct CanonicalUnkeyedDecodingContainer: UnkeyedDecodingContainer {
    let document: CanonicalDocument
    /// The token of the next element.
    private var cursor: UInt32
    private let total: UInt32
    private let path: Int32
    private var index: Int32 = 0

    init(document: CanonicalDocument, array: UInt32, path: Int32) {
        self.document = document
        cursor = array + 1
        total = document.tokens[Int(array)].count
        self.path = path
    }

    var codingPath: [any CodingKey] { document.codingPath(path) }
    var count: Int? { Int(total) }
    var isAtEnd: Bool { UInt32(index) >= total }
    var currentIndex: Int { Int(index) }

    /// The next element's token, and the container moved past it; at the end, Foundation throws.
    private mutating func advance() throws(OffTheFastPath) -> UInt32 {
        guard UInt32(index) < total else { throw document.leaveFastPath() }
        let token = cursor
        cursor = document.tokens[Int(token)].next(at: token)
        index += 1
        return token
    }

    private func peek() throws(OffTheFastPath) -> UInt32 {
        guard UInt32(index) < total else { throw document.leaveFastPath() }
        return cursor
    }

    mutating func decodeNil() throws -> Bool {
        guard document.decodeNil(try peek()) else { return false }
        _ = try advance()
        return true
    }

    // Each reads the element before moving past it: a failed read leaves the container where it was.
    private mutating func read<T>(_ body: (CanonicalDocument, UInt32) throws -> T) throws -> T {
        let value = try body(document, try peek())
        _ = try advance()
        return value
    }

    mutating func decode(_: Bool.Type) throws -> Bool { try read { try $0.bool($1) } }
    mutating func decode(_: String.Type) throws -> String { try read { try $0.string($1) } }
    mutating func decode(_: Double.Type) throws -> Double { try read { try $0.floatingPoint($1) } }
    mutating func decode(_: Float.Type) throws -> Float { try read { try $0.floatingPoint($1) } }
    mutating func decode(_: Int.Type) throws -> Int { try read { try $0.integer($1) } }
    mutating func decode(_: Int8.Type) throws -> Int8 { try read { try $0.integer($1) } }
    mutating func decode(_: Int16.Type) throws -> Int16 { try read { try $0.integer($1) } }
    mutating func decode(_: Int32.Type) throws -> Int32 { try read { try $0.integer($1) } }
    mutating func decode(_: Int64.Type) throws -> Int64 { try read { try $0.integer($1) } }
    mutating func decode(_: Int128.Type) throws -> Int128 { throw document.leaveFastPath() }
    mutating func decode(_: UInt.Type) throws -> UInt { try read { try $0.integer($1) } }
    mutating func decode(_: UInt8.Type) throws -> UInt8 { try read { try $0.integer($1) } }
    mutating func decode(_: UInt16.Type) throws -> UInt16 { try read { try $0.integer($1) } }
    mutating func decode(_: UInt32.Type) throws -> UInt32 { try read { try $0.integer($1) } }
    mutating func decode(_: UInt64.Type) throws -> UInt64 { try read { try $0.integer($1) } }
    mutating func decode(_: UInt128.Type) throws -> UInt128 { throw document.leaveFastPath() }

    mutating func decode<T: Decodable>(_: T.Type) throws -> T {
        try document.forgettingPaths {
            let path = document.path(path, index: Int(index))
            return try read { try $0.decode(T.self, $1, path: path) }
        }
    }

    // `nil` for `null`, without asking `T`. Past the end, Foundation versions differ on whether the index moves, so
    // `decodeNil` leaves the fast path there.
    mutating func decodeIfPresent<T: Decodable>(_: T.Type) throws -> T? {
        try present { try $0.decode(T.self) }
    }

    // The standard library's defaults for these return `nil` past the end without moving; Foundation's own moves the
    // index. Each goes through `present`, which leaves the fast path there.
    mutating func decodeIfPresent(_: Bool.Type) throws -> Bool? { try present { try $0.decode(Bool.self) } }
    mutating func decodeIfPresent(_: String.Type) throws -> String? { try present { try $0.decode(String.self) } }
    mutating func decodeIfPresent(_: Double.Type) throws -> Double? { try present { try $0.decode(Double.self) } }
    mutating func decodeIfPresent(_: Float.Type) throws -> Float? { try present { try $0.decode(Float.self) } }
    mutating func decodeIfPresent(_: Int.Type) throws -> Int? { try present { try $0.decode(Int.self) } }
    mutating func decodeIfPresent(_: Int8.Type) throws -> Int8? { try present { try $0.decode(Int8.self) } }
    mutating func decodeIfPresent(_: Int16.Type) throws -> Int16? { try present { try $0.decode(Int16.self) } }
    mutating func decodeIfPresent(_: Int32.Type) throws -> Int32? { try present { try $0.decode(Int32.self) } }
    mutating func decodeIfPresent(_: Int64.Type) throws -> Int64? { try present { try $0.decode(Int64.self) } }
    mutating func decodeIfPresent(_: Int128.Type) throws -> Int128? { throw document.leaveFastPath() }
    mutating func decodeIfPresent(_: UInt.Type) throws -> UInt? { try present { try $0.decode(UInt.self) } }
    mutating func decodeIfPresent(_: UInt8.Type) throws -> UInt8? { try present { try $0.decode(UInt8.self) } }
    mutating func decodeIfPresent(_: UInt16.Type) throws -> UInt16? { try present { try $0.decode(UInt16.self) } }
    mutating func decodeIfPresent(_: UInt32.Type) throws -> UInt32? { try present { try $0.decode(UInt32.self) } }
    mutating func decodeIfPresent(_: UInt64.Type) throws -> UInt64? { try present { try $0.decode(UInt64.self) } }
    mutating func decodeIfPresent(_: UInt128.Type) throws -> UInt128? { throw document.leaveFastPath() }

    /// `nil` for a `null` element (moved past), else what `body` reads; past the end it leaves the fast path.
    private mutating func present<T>(_ body: (inout Self) throws -> T) throws -> T? {
        if try decodeNil() { return nil }
        return try body(&self)
    }

    mutating func nestedContainer<NestedKey: CodingKey>(
        keyedBy _: NestedKey.Type
    ) throws -> KeyedDecodingContainer<NestedKey> {
        let token = try peek()
        guard document.tokens[Int(token)].kind == .object else { throw document.leaveFastPath() }
        let path = document.path(path, index: Int(index))
        _ = try advance()
        return KeyedDecodingContainer(
            CanonicalKeyedDecodingContainer<NestedKey>(document: document, object: token, path: path)
        )
    }

    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
        let token = try peek()
        guard document.tokens[Int(token)].kind == .array else { throw document.leaveFastPath() }
        let path = document.path(path, index: Int(index))
        _ = try advance()
        return CanonicalUnkeyedDecodingContainer(document: document, array: token, path: path)
    }

    mutating func superDecoder() throws -> any Decoder {
        let path = document.path(path, index: Int(index))
        return CanonicalDecoder(document: document, token: try advance(), path: path)
    }
}

/// What a decoding's document and an encoding's tree both keep: the coding paths handed out, and whether the call
/// left the fast path (Foundation's coder then makes it again).
class CanonicalCodingState {
    // Unchecked: each access is one append or one store by a method of the subclass or of this class, and none is open
    // while other code (a value's `init(from:)` or `encode(to:)`, a key's `stringValue`) runs.
    @exclusivity(unchecked) private final var paths = CodingPaths()
    @exclusivity(unchecked) final var isOffFastPath = false

    /// Marks the call as off the fast path; the error is for the caller to throw.
    final func leaveFastPath() -> OffTheFastPath {
        isOffFastPath = true
        return OffTheFastPath()
    }

    /// The path `parent` followed by `key`.
    final func path(_ parent: Int32, _ key: some CodingKey) -> Int32 { paths.append(parent, .key(key)) }

    /// The path `parent` followed by the key of element `index`.
    final func path(_ parent: Int32, index: Int) -> Int32 { paths.append(parent, .index(index)) }

    final func codingPath(_ path: Int32) -> [any CodingKey] { paths.codingPath(path) }

    /// `body`, which decodes one value, and then forgets the paths handed out since it began: that value's decoder
    /// and containers end with its `init(from:)` (and an error the fast path throws is made again by Foundation's
    /// decoder), so a large state's decode keeps as many paths as it is deep rather than one for each element.
    @inline(__always)
    final func forgettingPaths<T>(_ body: () throws -> T) rethrows -> T {
        let mark = paths.mark
        defer { paths.forget(since: mark) }
        return try body()
    }
}

/// The coding paths a decode or an encode hands out, each a parent and one key, so that a path costs one entry
/// however deep it is; -1 is the top level. An entry is eight bytes — an element's key is its index, a member's the
/// place of its key in a table beside — since a large state's decode hands out one for each element.
struct CodingPaths {
    /// A key of a coding path; an element's is kept as its index, which fits where a key would take a box.
    enum Key {
        case key(any CodingKey)
        case index(Int)
    }

    /// The parent, and an element's index or `-1 - i` for the member whose key is `keys[i]`.
    private var entries: [(parent: Int32, key: Int32)] = []
    private var keys: [any CodingKey] = []

    /// The path `parent` followed by `key`.
    mutating func append(_ parent: Int32, _ key: Key) -> Int32 {
        switch key {
        case let .index(index) where index <= Int32.max:
            entries.append((parent, Int32(index)))
        case let .index(index):
            entries.append((parent, -1 - Int32(keys.count)))
            keys.append(CanonicalCodingKey(index: index))
        case let .key(key):
            entries.append((parent, -1 - Int32(keys.count)))
            keys.append(key)
        }
        return Int32(entries.count - 1)
    }

    /// How many paths were handed out.
    var mark: (entries: Int, keys: Int) { (entries.count, keys.count) }

    /// Forgets the paths handed out since `mark`, keeping the room they took.
    mutating func forget(since mark: (entries: Int, keys: Int)) {
        entries.removeSubrange(mark.entries...)
        keys.removeSubrange(mark.keys...)
    }

    /// The keys of `path`, from the top level down. (A container kept past the `init(from:)` it was made for holds
    /// a path forgotten since: it may read another value's path, never past the table.)
    func codingPath(_ path: Int32) -> [any CodingKey] {
        var path = path
        var found: [any CodingKey] = []
        while path >= 0, path < entries.count {
            let entry = entries[Int(path)]
            found.append(entry.key < 0 ? keys[Int(-1 - entry.key)] : CanonicalCodingKey(index: Int(entry.key)))
            path = entry.parent
        }
        return found.reversed()
    }
}
