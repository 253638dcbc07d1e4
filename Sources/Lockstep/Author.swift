/// Who dispatched an action: the name the daemon's access policy gives the identity that sent it
/// (docs/security.md), recorded with the action in the journal and in its event, so that a validator may use it (only
/// a card's owner may move it) and a reducer may record it, the same in every process.
public struct Author: Hashable, Sendable, Codable, Comparable, CustomStringConvertible, ExpressibleByStringLiteral {
    /// The identity's name; empty for ``unknown``.
    public let name: String

    /// The author named `name`.
    public init(_ name: String) { self.name = name }

    /// The author named by a literal.
    public init(stringLiteral name: String) { self.name = name }

    /// The author of an action sent to a daemon without a policy, which does not tell who sends what; and of every
    /// action journaled before authors were.
    public static let unknown = Author("")

    /// The name of the daemon's own actions: a timer that fires, what an effect brought back.
    public static let daemonName = "lockstepd"

    /// The author of the daemon's own actions (``daemonName``).
    public static let daemon = Author(daemonName)

    /// The longest name, in bytes: names are those of the policy (letters, digits, `-`, `_`), at most 64 bytes.
    public static let maximumLength = 64

    /// Whether `byte` may be part of a name.
    public static func isAllowed(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "_"):
            true
        default:
            false
        }
    }

    /// Whether this is ``unknown``.
    public var isUnknown: Bool { name.isEmpty }

    /// The name, or `(unknown)`.
    public var description: String { name.isEmpty ? "(unknown)" : name }

    public static func < (lhs: Author, rhs: Author) -> Bool { lhs.name < rhs.name }

    public init(from decoder: any Decoder) throws {
        name = try decoder.singleValueContainer().decode(String.self)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(name)
    }
}
