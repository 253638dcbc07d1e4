/// The subset of TOML that `lockstepd`'s configuration file uses: comments, `[table]` headers, and
/// `key = value` with strings (basic and literal), integers, booleans and arrays of those.
///
/// Anything else — dotted keys, inline tables, dates, floats, multi-line strings — is refused with the line
/// and column, never guessed at.
///
/// Why not TOMLKit (0.6.0, the maintained package on hand): its manifest depends on karwa/swift-checkit, which
/// the package mirrors here do not hold, so the package cannot resolve in CI (checked: `Package.swift` of the
/// 0.6.0 tag names it for its tests, and SwiftPM resolves every dependency of a manifest). It would also bring
/// toml++ in through a C++ target built with exceptions, for a file of a dozen keys. If the dependency resolves
/// one day, `DaemonConfiguration.apply(_:file:)` is the only reader to move.
package enum TOMLValue: Hashable, Sendable, CustomStringConvertible {
    /// A basic (`"…"`) or literal (`'…'`) string, escapes resolved.
    case string(String)
    /// A whole number, with an optional sign, that fits 64 bits.
    case integer(Int64)
    /// `true` or `false`.
    case boolean(Bool)
    /// An array, `[…]`, of values of these kinds.
    case array([TOMLValue])

    /// The value written back as TOML, for error messages ("expected a string, got 5").
    package var description: String {
        switch self {
        case let .string(value): "\"\(value)\""
        case let .integer(value): "\(value)"
        case let .boolean(value): "\(value)"
        case let .array(values): "[" + values.map(\.description).joined(separator: ", ") + "]"
        }
    }
}

/// A TOML document read by ``TOMLDocument/parse(_:)``: tables of keys, the root table named "".
package struct TOMLDocument: Hashable, Sendable {
    /// Table name → key → value. Keys at the top of the file are in the table "".
    package private(set) var tables: [String: [String: TOMLValue]] = ["": [:]]

    /// What is wrong with a configuration file, and where.
    package struct ParseError: Error, Hashable, Sendable, CustomStringConvertible {
        /// The line of the problem, from 1.
        package var line: Int
        /// The column of the problem, in bytes from 1.
        package var column: Int
        /// What was found, and what was expected.
        package var reason: String
        /// `line L, column C: reason`.
        package var description: String { "line \(line), column \(column): \(reason)" }
    }

    /// Parses `text`; the error names the line and column of the first problem.
    package static func parse(_ text: String) throws(ParseError) -> TOMLDocument {
        var parser = Parser(Array(text.utf8))
        return try parser.document()
    }

    private struct Parser {
        let bytes: [UInt8]
        var index = 0
        var line = 1
        var lineStart = 0

        init(_ bytes: [UInt8]) { self.bytes = bytes }

        func fail(_ reason: String) -> ParseError {
            ParseError(line: line, column: index - lineStart + 1, reason: reason)
        }

        var current: UInt8? { index < bytes.count ? bytes[index] : nil }

        /// The byte `offset` past the current one, if any.
        func peek(_ offset: Int) -> UInt8? { index + offset < bytes.count ? bytes[index + offset] : nil }

        mutating func advance() {
            if current == UInt8(ascii: "\n") {
                line += 1
                lineStart = index + 1
            }
            index += 1
        }

        /// Spaces and tabs, and with `newlines` also line ends and comments.
        mutating func skipBlank(newlines: Bool) {
            while let byte = current {
                if byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") || byte == UInt8(ascii: "\r") {
                    advance()
                } else if newlines, byte == UInt8(ascii: "\n") {
                    advance()
                } else if newlines, byte == UInt8(ascii: "#") {
                    while let next = current, next != UInt8(ascii: "\n") { advance() }
                } else {
                    return
                }
            }
        }

        /// After a value or header: only blanks and a comment may follow on the line.
        mutating func endOfLine() throws(ParseError) {
            skipBlank(newlines: false)
            if current == UInt8(ascii: "#") {
                while let next = current, next != UInt8(ascii: "\n") { advance() }
            }
            guard current == nil || current == UInt8(ascii: "\n") else {
                throw fail("unexpected text after the value; put one key = value on each line")
            }
        }

        mutating func document() throws(ParseError) -> TOMLDocument {
            var document = TOMLDocument()
            var table = ""
            while true {
                skipBlank(newlines: true)
                guard let byte = current else { return document }
                if byte == UInt8(ascii: "[") {
                    advance()
                    skipBlank(newlines: false)
                    table = try key()
                    skipBlank(newlines: false)
                    guard current == UInt8(ascii: "]") else { throw fail("expected ']' to close the table name") }
                    advance()
                    if document.tables[table] != nil { throw fail("table [\(table)] is defined twice") }
                    document.tables[table] = [:]
                    try endOfLine()
                } else {
                    let name = try key()
                    skipBlank(newlines: false)
                    guard current == UInt8(ascii: "=") else { throw fail("expected '=' after key '\(name)'") }
                    advance()
                    skipBlank(newlines: false)
                    let value = try self.value()
                    if document.tables[table]?[name] != nil {
                        throw fail("key '\(name)' is set twice\(table.isEmpty ? "" : " in [\(table)]")")
                    }
                    document.tables[table, default: [:]][name] = value
                    try endOfLine()
                }
            }
        }

        mutating func key() throws(ParseError) -> String {
            let start = index
            while let byte = current, isBareKey(byte) { advance() }
            guard index > start else { throw fail("expected a key (letters, digits, '_' or '-')") }
            if current == UInt8(ascii: ".") { throw fail("dotted keys are not supported; use a [table] header") }
            return String(decoding: bytes[start..<index], as: UTF8.self)
        }

        func isBareKey(_ byte: UInt8) -> Bool {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "_"), UInt8(ascii: "-"):
                true
            default:
                false
            }
        }

        mutating func value() throws(ParseError) -> TOMLValue {
            guard let byte = current else { throw fail("expected a value at the end of the file") }
            switch byte {
            case UInt8(ascii: "\""): return .string(try basicString())
            case UInt8(ascii: "'"): return .string(try literalString())
            case UInt8(ascii: "["): return try array()
            case UInt8(ascii: "t"), UInt8(ascii: "f"): return .boolean(try boolean())
            case UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                return .integer(try integer())
            default: throw fail("expected a string, an integer, true, false or an array")
            }
        }

        mutating func basicString() throws(ParseError) -> String {
            advance()
            var out: [UInt8] = []
            while true {
                guard let byte = current, byte != UInt8(ascii: "\n") else { throw fail("string is not closed") }
                advance()
                if byte == UInt8(ascii: "\"") { break }
                guard byte == UInt8(ascii: "\\") else {
                    out.append(byte)
                    continue
                }
                guard let escape = current else { throw fail("string is not closed") }
                advance()
                switch escape {
                case UInt8(ascii: "\""): out.append(UInt8(ascii: "\""))
                case UInt8(ascii: "\\"): out.append(UInt8(ascii: "\\"))
                case UInt8(ascii: "n"): out.append(UInt8(ascii: "\n"))
                case UInt8(ascii: "t"): out.append(UInt8(ascii: "\t"))
                case UInt8(ascii: "r"): out.append(UInt8(ascii: "\r"))
                case UInt8(ascii: "u"):
                    guard index + 4 <= bytes.count,
                        let scalar = UInt32(String(decoding: bytes[index..<index + 4], as: UTF8.self), radix: 16)
                            .flatMap(Unicode.Scalar.init)
                    else { throw fail("\\u needs four hex digits naming a Unicode scalar") }
                    for _ in 0..<4 { advance() }
                    out.append(contentsOf: Array(String(Character(scalar)).utf8))
                default:
                    throw fail("unknown escape '\\\(Character(Unicode.Scalar(escape)))'")
                }
            }
            return String(decoding: out, as: UTF8.self)
        }

        mutating func literalString() throws(ParseError) -> String {
            advance()
            let start = index
            while let byte = current, byte != UInt8(ascii: "'") {
                guard byte != UInt8(ascii: "\n") else { throw fail("string is not closed") }
                advance()
            }
            guard current == UInt8(ascii: "'") else { throw fail("string is not closed") }
            let text = String(decoding: bytes[start..<index], as: UTF8.self)
            advance()
            return text
        }

        mutating func boolean() throws(ParseError) -> Bool {
            for (word, value) in [("true", true), ("false", false)] where bytes[index...].starts(with: word.utf8) {
                for _ in word.utf8 { advance() }
                return value
            }
            throw fail("expected true or false")
        }

        /// A decimal integer as TOML writes one: an optional sign, then `0` or digits that do not start with `0`, an
        /// underscore only between two digits (`1_000`; `01`, `1_`, `1__0` and `_1` are not TOML), and no fraction or
        /// exponent.
        mutating func integer() throws(ParseError) -> Int64 {
            let start = index
            var digits: [UInt8] = []
            if let sign = current, sign == UInt8(ascii: "+") || sign == UInt8(ascii: "-") {
                digits.append(sign)
                advance()
            }
            let firstDigit = index
            var afterDigit = false
            while let byte = current,
                (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) || byte == UInt8(ascii: "_")
            {
                if byte == UInt8(ascii: "_") {
                    guard afterDigit, let next = peek(1), (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(next) else {
                        throw fail("an underscore in a number must stand between two digits")
                    }
                    afterDigit = false
                } else {
                    digits.append(byte)
                    afterDigit = true
                }
                advance()
            }
            if let byte = current, byte == UInt8(ascii: ".") || byte == UInt8(ascii: "e") || byte == UInt8(ascii: "E") {
                throw fail("only whole numbers are supported")
            }
            let written = String(decoding: bytes[start..<index], as: UTF8.self)
            if index - firstDigit > 1, bytes[firstDigit] == UInt8(ascii: "0") {
                index = start
                throw fail("'\(written)' has a leading zero, which TOML does not allow; write it without")
            }
            guard let value = Int64(String(decoding: digits, as: UTF8.self)) else {
                index = start
                throw fail("'\(written)' is not a 64-bit integer")
            }
            return value
        }

        mutating func array() throws(ParseError) -> TOMLValue {
            advance()
            var values: [TOMLValue] = []
            while true {
                skipBlank(newlines: true)
                if current == UInt8(ascii: "]") {
                    advance()
                    return .array(values)
                }
                values.append(try value())
                skipBlank(newlines: true)
                if current == UInt8(ascii: ",") {
                    advance()
                } else if current != UInt8(ascii: "]") {
                    throw fail("expected ',' or ']' in the array")
                }
            }
        }
    }
}
