import Foundation
import Lockstep

/// Any JSON value, with object keys kept sorted so a walk over two values is deterministic.
public indirect enum JSONValue: Hashable, Sendable, Codable, CustomStringConvertible {
    case null
    case bool(Bool)
    case integer(Int64)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

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

    /// Compact JSON with sorted keys.
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

/// One place where two states differ: the path from the root, and the value on each side (`nil`: absent).
public struct StateDifference: Hashable, Sendable, Codable, CustomStringConvertible {
    /// Like `list.items[3].completed`; empty for the root.
    public var path: String
    public var left: JSONValue?
    public var right: JSONValue?

    public init(path: String, left: JSONValue?, right: JSONValue?) {
        self.path = path
        self.left = left
        self.right = right
    }

    public var description: String {
        "\(path.isEmpty ? "(root)" : path): \(left?.description ?? "(absent)") ≠ \(right?.description ?? "(absent)")"
    }
}

/// A structural diff of two states through their canonical JSON.
public enum StateDiff {
    /// The differences between two encoded states, in path order, at most `limit` of them.
    public static func compare(_ left: [UInt8], _ right: [UInt8], limit: Int = 50) -> [StateDifference] {
        let decoder = JSONDecoder()
        guard let leftValue = try? decoder.decode(JSONValue.self, from: Data(left)),
            let rightValue = try? decoder.decode(JSONValue.self, from: Data(right))
        else {
            return left == right
                ? [] : [StateDifference(path: "", left: .string("<not JSON>"), right: .string("<not JSON>"))]
        }
        var differences: [StateDifference] = []
        walk(leftValue, rightValue, path: "", into: &differences, limit: limit)
        return differences
    }

    private static func walk(
        _ left: JSONValue?,
        _ right: JSONValue?,
        path: String,
        into differences: inout [StateDifference],
        limit: Int
    ) {
        guard differences.count < limit, left != right else { return }
        switch (left, right) {
        case let (.object(leftObject)?, .object(rightObject)?):
            for key in Set(leftObject.keys).union(rightObject.keys).sorted() {
                walk(
                    leftObject[key],
                    rightObject[key],
                    path: path.isEmpty ? key : "\(path).\(key)",
                    into: &differences,
                    limit: limit
                )
            }
        case let (.array(leftArray)?, .array(rightArray)?):
            for index in 0..<max(leftArray.count, rightArray.count) {
                walk(
                    index < leftArray.count ? leftArray[index] : nil,
                    index < rightArray.count ? rightArray[index] : nil,
                    path: "\(path)[\(index)]",
                    into: &differences,
                    limit: limit
                )
            }
        default:
            differences.append(StateDifference(path: path, left: left, right: right))
        }
    }
}
