import Foundation
import Lockstep

/// One ZeroMQ message part, as bytes.
public typealias Frame = [UInt8]

/// A store's position in its history: the number of actions it has applied. The first action gets 1.
public typealias SequenceNumber = UInt64

/// A random identifier of one journal's lifetime. A replica that sees a new epoch throws away what it has
/// and joins again.
public struct Epoch: RawRepresentable, Hashable, Sendable, Codable, CustomStringConvertible {
    /// The 64 random bits, as the wire and the journal carry them (a `u64`).
    public var rawValue: UInt64
    /// The epoch with these bits, as read from a message or the journal.
    public init(rawValue: UInt64) { self.rawValue = rawValue }
    /// 16 hex digits.
    public var description: String {
        let hex = String(rawValue, radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex
    }
}

/// Who sent a dispatch: 16 bytes a client picks at random once, the first half of every idempotency key.
public struct ClientID: Hashable, Sendable, CustomStringConvertible {
    /// The length of every client id, in bytes.
    public static let byteCount = 16
    /// The 16 bytes, held inline: the daemon keeps one per idempotency entry (100,000 by default), and an array
    /// each would cost a heap allocation and most of a cache line.
    private let high: UInt64
    private let low: UInt64

    /// The id's 16 bytes, as the wire carries them.
    public var bytes: [UInt8] {
        withUnsafeBytes(of: (high.bigEndian, low.bigEndian)) { Array($0) }
    }

    /// `nil` unless `bytes` holds exactly 16 bytes.
    public init?(bytes: [UInt8]) {
        guard bytes.count == Self.byteCount else { return nil }
        high = bytes[0..<8].reduce(0) { $0 << 8 | UInt64($1) }
        low = bytes[8..<16].reduce(0) { $0 << 8 | UInt64($1) }
    }

    /// A fresh random id.
    public static func random() -> ClientID {
        var generator = SystemRandomNumberGenerator()
        return ClientID(bytes: (0..<byteCount).map { _ in UInt8.random(in: .min ... .max, using: &generator) })!
    }

    /// 32 hex digits.
    public var description: String {
        bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
    }
}

/// A store's name as it travels on the wire: 1 to 64 bytes of ASCII letters, digits, `-`, `_` and `.`.
public struct StoreName: Hashable, Sendable, Comparable, CustomStringConvertible {
    /// The longest store name the wire allows, in bytes.
    public static let maximumLength = 64
    /// The name, as checked by ``init(_:)``.
    public let rawValue: String

    /// Checks the name; the error says which character or length is wrong.
    public init(_ rawValue: String) throws(ProtocolError) {
        let bytes = Array(rawValue.utf8)
        guard (1...Self.maximumLength).contains(bytes.count) else {
            throw ProtocolError(
                code: .malformed,
                "store name must be 1 to \(Self.maximumLength) bytes, got \(bytes.count)"
            )
        }
        for byte in bytes where !Self.isAllowed(byte) {
            throw ProtocolError(
                code: .malformed,
                "store name \"\(rawValue)\" contains byte 0x\(String(byte, radix: 16)); "
                    + "only ASCII letters, digits, '-', '_' and '.' are allowed"
            )
        }
        self.rawValue = rawValue
    }

    /// The name itself.
    public var description: String { rawValue }

    /// Orders names by their string, so a list of stores (an `unknown_store` error's, for one) comes out the same
    /// each time.
    public static func < (lhs: StoreName, rhs: StoreName) -> Bool { lhs.rawValue < rhs.rawValue }

    static func isAllowed(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "."):
            true
        default:
            false
        }
    }
}

/// What went wrong with a message, as a code programs can match and a sentence people can act on.
public struct ProtocolError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The error codes of the wire protocol; their numbers are part of it (docs/protocol.md).
    public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        /// The code's number on the wire: the `u16` of an ERROR reply.
        public var rawValue: UInt16
        /// The code with this number; a number this peer does not know is kept as it is, and shown as `error_<number>`.
        public init(rawValue: UInt16) { self.rawValue = rawValue }

        /// The message is not one this protocol can read: bad magic, short header, wrong frame count.
        public static let malformed = Code(rawValue: 1)
        /// The message starts with a protocol version this peer does not speak.
        public static let unsupportedVersion = Code(rawValue: 2)
        /// The message type byte names no message this peer knows, or one that must not be sent this way.
        public static let unknownMessageType = Code(rawValue: 3)
        /// A frame, an action or the whole message is larger than the limits allow.
        public static let tooLarge = Code(rawValue: 4)
        /// The daemon hosts no store of that name.
        public static let unknownStore = Code(rawValue: 5)
        /// The client's domain version differs from the daemon's.
        public static let domainVersionMismatch = Code(rawValue: 6)
        /// An action is not valid JSON for the store's domain.
        public static let undecodableAction = Code(rawValue: 7)
        /// The same idempotency key arrived with different actions.
        public static let idempotencyConflict = Code(rawValue: 8)
        /// The range asked for is empty or reversed, or lies beyond the store's last seq.
        public static let invalidRange = Code(rawValue: 9)
        /// The daemon could not make the request durable (journal full or failing); nothing was applied.
        public static let unavailable = Code(rawValue: 10)
        /// Anything else the daemon could not do; the reason says what.
        public static let `internal` = Code(rawValue: 11)
        /// The daemon is a standby: another daemon holds the journal's lease and applies every action; nothing was
        /// applied. Send the request to the leader (STATUS names it), or here again after a takeover, with the same
        /// key.
        public static let notLeader = Code(rawValue: 12)
        /// An EFFECTS retry or drop names no effect it can act on: none has that id, or it is running (drop), or it
        /// is not a dead letter (retry).
        public static let unknownEffect = Code(rawValue: 13)
        /// The daemon's policy grants the sender no right to this: to read that store, or to dispatch that action
        /// to it (docs/security.md). Nothing was sequenced.
        public static let forbidden = Code(rawValue: 14)

        /// The code's name as docs/protocol.md spells it (`unknown_store`), or `error_<number>` for a number this peer
        /// does not know.
        public var description: String {
            switch self {
            case .malformed: "malformed"
            case .unsupportedVersion: "unsupported_version"
            case .unknownMessageType: "unknown_message_type"
            case .tooLarge: "too_large"
            case .unknownStore: "unknown_store"
            case .domainVersionMismatch: "domain_version_mismatch"
            case .undecodableAction: "undecodable_action"
            case .idempotencyConflict: "idempotency_conflict"
            case .invalidRange: "invalid_range"
            case .unavailable: "unavailable"
            case .internal: "internal"
            case .notLeader: "not_leader"
            case .unknownEffect: "unknown_effect"
            case .forbidden: "forbidden"
            default: "error_\(rawValue)"
            }
        }
    }

    /// What kind of failure, for programs to match.
    public var code: Code
    /// What failed, with which value, and what to do, for people.
    public var reason: String

    /// An error with a code and a sentence.
    public init(code: Code, _ reason: String) {
        self.code = code
        self.reason = reason
    }

    /// The reason followed by the code in brackets, as logs show it.
    public var description: String { "\(reason) [\(code)]" }
}

/// A JSON string literal for `text`, as `JSONEncoder` writes one (slashes unescaped).
package func jsonString(_ text: String) -> String {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.withoutEscapingSlashes]
    return (try? String(decoding: encoder.encode(text), as: UTF8.self)) ?? "\"\""
}
