import Foundation
import Lockstep

/// One place where two states differ: the path from the root, and the value on each side (`nil`: absent).
public struct StateDifference: Hashable, Sendable, Codable, CustomStringConvertible {
    /// Like `list.items[3].completed`; empty for the root.
    public var path: String
    /// The value on the left side; `nil` when the left state has nothing at ``path``.
    public var left: JSONValue?
    /// The value on the right side; `nil` when the right state has nothing at ``path``.
    public var right: JSONValue?

    /// A difference at `path`.
    public init(path: String, left: JSONValue?, right: JSONValue?) {
        self.path = path
        self.left = left
        self.right = right
    }

    /// `path: left ≠ right`, with `(root)` and `(absent)` for an empty path and a missing value.
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
