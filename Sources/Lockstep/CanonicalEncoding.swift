import Crypto
import Foundation

/// The one byte form of a state that every process agrees on: JSON with sorted keys, no escaped slashes.
///
/// Two processes holding equal states produce equal bytes, and so equal digests — provided the state's
/// `Encodable` conformance is itself deterministic. `Set`, and `Dictionary` with keys other than `String`
/// or `Int`, encode in hash order, which Swift seeds per process; the replay harness catches that.
public enum CanonicalEncoding {
    /// The canonical bytes of `value`.
    public static func encode<Value: Encodable>(_ value: Value) throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return try encoder.encode(value)
    }

    /// Decodes bytes written by ``encode(_:)`` (or any JSON of the same shape).
    public static func decode<Value: Decodable>(_ type: Value.Type, from data: Data) throws -> Value {
        try JSONDecoder().decode(type, from: data)
    }

    /// A decoding error as one line a person can act on: what was wrong, and where in the JSON.
    public static func describe(_ error: any Error) -> String {
        func path(_ context: DecodingError.Context) -> String {
            context.codingPath.isEmpty
                ? "the top level" : context.codingPath.map(\.stringValue).joined(separator: ".")
        }
        switch error {
        case let DecodingError.dataCorrupted(context):
            return context.codingPath.isEmpty
                ? "not valid JSON (\(context.debugDescription))" : "\(context.debugDescription) at \(path(context))"
        case let DecodingError.keyNotFound(key, context):
            return "missing key '\(key.stringValue)' at \(path(context))"
        case let DecodingError.typeMismatch(type, context), let DecodingError.valueNotFound(type, context):
            return "expected \(type) at \(path(context))"
        default:
            return "\(error)"
        }
    }

    /// The SHA-256 digest of the canonical bytes of `value`.
    public static func digest<Value: Encodable>(of value: Value) throws -> StateDigest {
        StateDigest(of: try encode(value))
    }
}

/// A SHA-256 digest of a state's canonical encoding, shown as 64 lowercase hex digits.
public struct StateDigest: Hashable, Sendable, Codable, CustomStringConvertible {
    /// The 32 bytes of the digest.
    public let bytes: [UInt8]

    /// The digest of `data`.
    public init<Bytes: DataProtocol>(of data: Bytes) {
        bytes = Array(SHA256.hash(data: data))
    }

    /// A digest received from elsewhere; `nil` unless it is exactly 32 bytes.
    public init?(bytes: [UInt8]) {
        guard bytes.count == 32 else { return nil }
        self.bytes = bytes
    }

    /// Parses 64 hex digits; `nil` for anything else.
    public init?(hex: String) {
        let utf8 = Array(hex.utf8)
        guard utf8.count == 64 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(32)
        for index in stride(from: 0, to: 64, by: 2) {
            guard let high = Self.nibble(utf8[index]), let low = Self.nibble(utf8[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
        }
        self.bytes = bytes
    }

    /// The 64 lowercase hex digits.
    public var hex: String {
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(64)
        for byte in bytes {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    public var description: String { hex }

    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let digest = StateDigest(hex: text) else {
            throw DecodingError.dataCorrupted(
                .init(codingPath: decoder.codingPath, debugDescription: "expected 64 hex digits, got \"\(text)\"")
            )
        }
        self = digest
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(hex)
    }

    private static func nibble(_ char: UInt8) -> UInt8? {
        switch char {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): char - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): char - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): char - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}
