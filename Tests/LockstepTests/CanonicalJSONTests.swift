import Foundation
import Lockstep
import TestSupport
import Testing

/// The canonical JSON of docs/protocol.md, checked against the test vectors the Python client checks too.
@Suite struct CanonicalJSONTests {
    struct Vector: Decodable, CustomTestStringConvertible {
        var name: String
        var input: String
        var canonical: String
        var testDescription: String { name }
    }

    static let vectors = interopVectors("canonical-json-vectors.json", as: Vector.self)

    @Test func theVectorFileIsThere() {
        #expect(Self.vectors.count >= 20, "Tests/Interop/canonical-json-vectors.json is missing or unreadable")
    }

    @Test(arguments: vectors)
    func eachVectorHasItsCanonicalForm(_ vector: Vector) throws {
        let value = try JSONValue(parsing: Array(vector.input.utf8))
        let canonical = String(decoding: try CanonicalEncoding.encode(value), as: UTF8.self)
        #expect(canonical == vector.canonical)
        // The canonical form is a fixed point.
        let again = try JSONValue(parsing: Array(vector.canonical.utf8))
        #expect(String(decoding: try CanonicalEncoding.encode(again), as: UTF8.self) == vector.canonical)
    }

    @Test(arguments: [
        (text: #"{"a":1,"a":2}"#, says: "member 'a' appears twice in one object at byte 7"),
        (text: #"["\ud800"]"#, says: "lone surrogate"),
        (text: #"["\udc00x"]"#, says: "lone surrogate"),
        (text: "\u{FEFF}{}", says: "a byte-order mark is not part of JSON at byte 0"),
        (text: "{} {}", says: "unexpected bytes after the value at byte 3"),
        (text: "[01]", says: "expected ',' or ']' in an array at byte 2"),
        (text: "[1.]", says: "expected a digit after '.'"),
        (text: "[1e400]", says: "number 1e400 is out of range"),
        (text: "[\"a\u{01}\"]", says: "control byte 0x1 in a string must be escaped"),
        (text: #"["\x"]"#, says: "unknown escape '\\x'"),
        (text: "[1,]", says: "expected a value"),
        (text: "", says: "expected a value, found the end at byte 0"),
        (text: "[nul]", says: "expected 'null'"),
    ])
    func textsAReaderCouldTakeTwoWaysAreRefused(text: String, says: String) {
        #expect {
            _ = try JSONValue(parsing: Array(text.utf8))
        } throws: { error in
            "\(error)".contains(says)
        }
    }

    @Test func deepNestingIsRefused() {
        let deep = String(repeating: "[", count: 600) + String(repeating: "]", count: 600)
        #expect(throws: JSONValue.SyntaxError.self) { try JSONValue(parsing: Array(deep.utf8)) }
        let fine = String(repeating: "[", count: 500) + String(repeating: "]", count: 500)
        #expect((try? JSONValue(parsing: Array(fine.utf8))) != nil)
    }
}
