import Foundation

/// Any JSON value: what the harness compares states through, and what the daemon checks an action's bytes
/// against before it takes their canonical form.
///
/// A number is an ``integer(_:)`` when it is integral and fits `Int64` (`1`, `1.0` and `1e2` alike), otherwise
/// a ``number(_:)`` (negative zero, `-0`, among them); both are written by ``CanonicalEncoding`` exactly as a
/// domain's `Int` or `Double` would be.
public indirect enum JSONValue: Hashable, Sendable, Codable, CustomStringConvertible {
    /// JSON's `null`.
    case null
    /// `true` or `false`.
    case bool(Bool)
    /// An integral number that fits `Int64`.
    case integer(Int64)
    /// Any other number: one with a fraction, out of `Int64`'s range, or negative zero.
    case number(Double)
    /// A string, its escapes resolved.
    case string(String)
    /// An array, in order.
    case array([JSONValue])
    /// An object; member order is not kept (the canonical form sorts it), and the strict parser refuses a name twice.
    case object([String: JSONValue])

    /// Decodes whichever JSON value the decoder holds; bytes from outside go through the strict
    /// ``init(parsing:)`` instead.
    public init(from decoder: any Decoder) throws {
        if var array = try? decoder.unkeyedContainer() {
            var values: [JSONValue] = []
            while !array.isAtEnd { values.append(try array.decode(JSONValue.self)) }
            self = .array(values)
            return
        }
        if let object = try? decoder.container(keyedBy: AnyKey.self) {
            var values: [String: JSONValue] = [:]
            for key in object.allKeys { values[key.stringValue] = try object.decode(JSONValue.self, forKey: key) }
            self = .object(values)
            return
        }
        let single = try decoder.singleValueContainer()
        if single.decodeNil() {
            self = .null
        } else if let bool = try? single.decode(Bool.self) {
            self = .bool(bool)
        } else if let integer = try? single.decode(Int64.self) {
            self = .integer(integer)
        } else if let number = try? single.decode(Double.self) {
            self = .number(number)
        } else {
            self = .string(try single.decode(String.self))
        }
    }

    /// Encodes the value as the JSON it stands for; through ``CanonicalEncoding`` that is the canonical form.
    public func encode(to encoder: any Encoder) throws {
        switch self {
        case .null:
            var single = encoder.singleValueContainer()
            try single.encodeNil()
        case let .bool(value):
            var single = encoder.singleValueContainer()
            try single.encode(value)
        case let .integer(value):
            var single = encoder.singleValueContainer()
            try single.encode(value)
        case let .number(value):
            var single = encoder.singleValueContainer()
            try single.encode(value)
        case let .string(value):
            var single = encoder.singleValueContainer()
            try single.encode(value)
        case let .array(values):
            var array = encoder.unkeyedContainer()
            for value in values { try array.encode(value) }
        case let .object(values):
            var object = encoder.container(keyedBy: AnyKey.self)
            for (key, value) in values { try object.encode(value, forKey: AnyKey(stringValue: key)) }
        }
    }

    /// Compact canonical JSON.
    public var description: String {
        (try? CanonicalEncoding.encode(self)).map { String(decoding: $0, as: UTF8.self) } ?? "?"
    }

    struct AnyKey: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }
}

// MARK: - Strict parsing

extension JSONValue {
    /// Why bytes are not one JSON text: what was found, and at which byte offset.
    public struct SyntaxError: Error, Hashable, Sendable, CustomStringConvertible {
        /// What was wrong, e.g. "member 'x' appears twice in one object".
        public var reason: String
        /// The offset, from 0, of the byte where the parser stopped.
        public var offset: Int

        /// The reason and the byte offset, as one line.
        public var description: String { "\(reason) at byte \(offset)" }
    }

    /// Parses exactly one JSON text (RFC 8259), refusing what a reader could take two ways: a member name
    /// that appears twice in one object (readers differ on which one wins), an escaped lone surrogate, a
    /// byte-order mark, anything after the value but whitespace, and nesting deeper than 512.
    public init<Bytes: Collection<UInt8>>(parsing bytes: Bytes) throws(SyntaxError) {
        var parser = StrictParser(bytes: Array(bytes))
        parser.skipWhitespace()
        self = try parser.value(depth: 0)
        parser.skipWhitespace()
        guard parser.offset == parser.bytes.count else { throw parser.error("unexpected bytes after the value") }
    }
}

private struct StrictParser {
    let bytes: [UInt8]
    var offset = 0

    init(bytes: [UInt8]) { self.bytes = bytes }

    func error(_ reason: String) -> JSONValue.SyntaxError { JSONValue.SyntaxError(reason: reason, offset: offset) }

    var next: UInt8? { offset < bytes.count ? bytes[offset] : nil }

    mutating func skipWhitespace() {
        while let byte = next, byte == 0x20 || byte == 0x09 || byte == 0x0a || byte == 0x0d { offset += 1 }
    }

    mutating func expect(_ literal: String, _ value: JSONValue) throws(JSONValue.SyntaxError) -> JSONValue {
        let utf8 = Array(literal.utf8)
        guard bytes.count - offset >= utf8.count, Array(bytes[offset..<offset + utf8.count]) == utf8 else {
            throw error("expected '\(literal)'")
        }
        offset += utf8.count
        return value
    }

    mutating func value(depth: Int) throws(JSONValue.SyntaxError) -> JSONValue {
        guard depth < 512 else { throw error("nested deeper than 512") }
        guard let byte = next else { throw error("expected a value, found the end") }
        switch byte {
        case UInt8(ascii: "{"): return try object(depth: depth)
        case UInt8(ascii: "["): return try array(depth: depth)
        case UInt8(ascii: "\""): return .string(try string())
        case UInt8(ascii: "t"): return try expect("true", .bool(true))
        case UInt8(ascii: "f"): return try expect("false", .bool(false))
        case UInt8(ascii: "n"): return try expect("null", .null)
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try number()
        case 0xef: throw error("a byte-order mark is not part of JSON")
        default: throw error("expected a value, found byte 0x\(String(byte, radix: 16))")
        }
    }

    mutating func object(depth: Int) throws(JSONValue.SyntaxError) -> JSONValue {
        offset += 1
        var members: [String: JSONValue] = [:]
        skipWhitespace()
        if next == UInt8(ascii: "}") {
            offset += 1
            return .object(members)
        }
        while true {
            skipWhitespace()
            guard next == UInt8(ascii: "\"") else { throw error("expected a member name in quotes") }
            let nameOffset = offset
            let name = try string()
            skipWhitespace()
            guard next == UInt8(ascii: ":") else { throw error("expected ':' after member name '\(name)'") }
            offset += 1
            skipWhitespace()
            let value = try value(depth: depth + 1)
            guard members.updateValue(value, forKey: name) == nil else {
                throw JSONValue.SyntaxError(reason: "member '\(name)' appears twice in one object", offset: nameOffset)
            }
            skipWhitespace()
            switch next {
            case UInt8(ascii: ","): offset += 1
            case UInt8(ascii: "}"):
                offset += 1
                return .object(members)
            default: throw error("expected ',' or '}' in an object")
            }
        }
    }

    mutating func array(depth: Int) throws(JSONValue.SyntaxError) -> JSONValue {
        offset += 1
        var values: [JSONValue] = []
        skipWhitespace()
        if next == UInt8(ascii: "]") {
            offset += 1
            return .array(values)
        }
        while true {
            skipWhitespace()
            values.append(try value(depth: depth + 1))
            skipWhitespace()
            switch next {
            case UInt8(ascii: ","): offset += 1
            case UInt8(ascii: "]"):
                offset += 1
                return .array(values)
            default: throw error("expected ',' or ']' in an array")
            }
        }
    }

    mutating func string() throws(JSONValue.SyntaxError) -> String {
        offset += 1
        var utf8: [UInt8] = []
        while true {
            guard let byte = next else { throw error("a string is not closed") }
            switch byte {
            case UInt8(ascii: "\""):
                offset += 1
                guard let text = String(validating: utf8, as: UTF8.self) else {
                    throw error("a string is not valid UTF-8")
                }
                return text
            case UInt8(ascii: "\\"):
                offset += 1
                guard let escaped = next else { throw error("a string is not closed") }
                offset += 1
                switch escaped {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): utf8.append(escaped)
                case UInt8(ascii: "b"): utf8.append(0x08)
                case UInt8(ascii: "f"): utf8.append(0x0c)
                case UInt8(ascii: "n"): utf8.append(0x0a)
                case UInt8(ascii: "r"): utf8.append(0x0d)
                case UInt8(ascii: "t"): utf8.append(0x09)
                case UInt8(ascii: "u"): utf8.append(contentsOf: try unicodeEscape())
                default: throw error("unknown escape '\\\(Character(Unicode.Scalar(escaped)))'")
                }
            case 0x00..<0x20:
                throw error("control byte 0x\(String(byte, radix: 16)) in a string must be escaped")
            default:
                utf8.append(byte)
                offset += 1
            }
        }
    }

    /// The UTF-8 of one `\u` escape and its four hex digits (the `\u` already read), or of a surrogate pair.
    mutating func unicodeEscape() throws(JSONValue.SyntaxError) -> [UInt8] {
        let high = try hex4()
        var scalarValue = high
        if (0xd800..<0xdc00).contains(high) {
            guard bytes.count - offset >= 2, bytes[offset] == UInt8(ascii: "\\"), bytes[offset + 1] == UInt8(ascii: "u")
            else { throw error("lone surrogate \\u\(String(high, radix: 16))") }
            offset += 2
            let low = try hex4()
            guard (0xdc00..<0xe000).contains(low) else { throw error("lone surrogate \\u\(String(high, radix: 16))") }
            scalarValue = 0x10000 + ((high - 0xd800) << 10) + (low - 0xdc00)
        } else if (0xdc00..<0xe000).contains(high) {
            throw error("lone surrogate \\u\(String(high, radix: 16))")
        }
        guard let scalar = Unicode.Scalar(scalarValue) else { throw error("invalid escape") }
        return Array(String(Character(scalar)).utf8)
    }

    mutating func hex4() throws(JSONValue.SyntaxError) -> UInt32 {
        guard bytes.count - offset >= 4 else { throw error("expected 4 hex digits after \\u") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let byte = bytes[offset]
            let digit: UInt32
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(byte - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(byte - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(byte - UInt8(ascii: "A") + 10)
            default: throw error("expected 4 hex digits after \\u")
            }
            value = value << 4 | digit
            offset += 1
        }
        return value
    }

    mutating func number() throws(JSONValue.SyntaxError) -> JSONValue {
        let start = offset
        func digits(_ parser: inout StrictParser) -> Int {
            let from = parser.offset
            while let byte = parser.next, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) { parser.offset += 1 }
            return parser.offset - from
        }
        if next == UInt8(ascii: "-") { offset += 1 }
        if next == UInt8(ascii: "0") {
            offset += 1
        } else if digits(&self) == 0 {
            throw error("expected a digit")
        }
        var integral = true
        if next == UInt8(ascii: ".") {
            offset += 1
            integral = false
            guard digits(&self) > 0 else { throw error("expected a digit after '.'") }
        }
        if next == UInt8(ascii: "e") || next == UInt8(ascii: "E") {
            offset += 1
            integral = false
            if next == UInt8(ascii: "+") || next == UInt8(ascii: "-") { offset += 1 }
            guard digits(&self) > 0 else { throw error("expected a digit in the exponent") }
        }
        let text = String(decoding: bytes[start..<offset], as: UTF8.self)
        // Negative zero is the one integral value an Int64 cannot hold: it stays a double, written -0.
        if integral, let value = Int64(text), value != 0 || bytes[start] != UInt8(ascii: "-") { return .integer(value) }
        guard let value = Double(text), value.isFinite else { throw error("number \(text) is out of range") }
        if value == value.rounded(), value >= -0x1p63, value < 0x1p63, !(value == 0 && value.sign == .minus) {
            return .integer(Int64(value))
        }
        return .number(value)
    }
}
