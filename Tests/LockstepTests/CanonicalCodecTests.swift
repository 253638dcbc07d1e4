import Foundation
import Lockstep
import LockstepExamples
import TestSupport
import Testing

/// The canonical coder against Foundation's: the same bytes, the same values, the same errors; and proof that the
/// fast path, not the fallback to Foundation, does the work for the example domains.
@Suite struct CanonicalCodecTests {
    typealias Fallbacks = CanonicalEncoding.Fallbacks

    static func foundationEncode<T: Encodable>(_ value: T) throws -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return Array(try encoder.encode(value))
    }

    static func foundationDecode<T: Decodable>(_: T.Type, _ bytes: [UInt8]) throws -> T {
        try JSONDecoder().decode(T.self, from: Data(bytes))
    }

    /// What a call gave: a value, or an error as Foundation describes it.
    enum Outcome<Value: Equatable>: Equatable {
        case value(Value)
        case error(String)
    }

    static func outcome<Value: Equatable>(_ body: () throws -> Value) -> Outcome<Value> {
        do {
            return .value(try body())
        } catch {
            return .error(String(reflecting: error))
        }
    }

    /// Runs `body` counting the calls that fell back to Foundation.
    static func counting(_ body: () throws -> Void) rethrows -> Fallbacks {
        let fallbacks = Fallbacks()
        try Fallbacks.$current.withValue(fallbacks) { try body() }
        return fallbacks
    }

    /// `value` encodes as Foundation encodes it, through every entry point, and decodes back to itself; returns
    /// the calls that fell back.
    @discardableResult
    static func expectSameEncoding<T: Codable & Equatable>(
        _ value: T,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws -> Fallbacks {
        let expected = try foundationEncode(value)
        let coder = CanonicalEncoding.Coder()
        return try counting {
            #expect(Array(try CanonicalEncoding.encode(value)) == expected, sourceLocation: sourceLocation)
            #expect(try coder.encode(value) == expected, sourceLocation: sourceLocation)
            expectSameStream(value, expected, sourceLocation: sourceLocation)
            let decoded = try CanonicalEncoding.decode(T.self, from: Data(expected))
            #expect(decoded == (try foundationDecode(T.self, expected)), sourceLocation: sourceLocation)
            #expect(try coder.decode(T.self, from: expected) == decoded, sourceLocation: sourceLocation)
            #expect(decoded == value, sourceLocation: sourceLocation)
        }
    }

    /// `value` streamed in chunks of a few bytes (`CanonicalEncoding.streamed`) is `expected`, hashed as it went,
    /// when it is streamed at all; returns whether it was.
    @discardableResult
    static func expectSameStream<T: Encodable>(
        _ value: T,
        _ expected: [UInt8],
        sourceLocation: SourceLocation = #_sourceLocation
    ) -> Bool {
        var streamed: [UInt8] = []
        guard
            let result = CanonicalEncoding.streamed(
                value,
                digestForm: false,
                chunkBytes: 7,
                into: { streamed.append(contentsOf: $0) }
            )
        else { return false }
        #expect(streamed == expected, sourceLocation: sourceLocation)
        #expect(result.bytes == expected.count, sourceLocation: sourceLocation)
        #expect(result.digest == StateDigest(of: expected), sourceLocation: sourceLocation)
        return true
    }

    /// `text` decodes as a `T` to what Foundation makes of it, or fails with Foundation's error; returns the calls
    /// that fell back.
    @discardableResult
    static func expectSameDecoding<T: Decodable & Equatable>(
        _: T.Type,
        _ text: some Collection<UInt8>,
        sourceLocation: SourceLocation = #_sourceLocation
    ) -> Fallbacks {
        let bytes = Array(text)
        let expected = outcome { try foundationDecode(T.self, bytes) }
        return counting {
            #expect(
                outcome { try CanonicalEncoding.decode(T.self, from: Data(bytes)) } == expected,
                sourceLocation: sourceLocation
            )
            #expect(
                outcome { try CanonicalEncoding.Coder().decode(T.self, from: bytes) } == expected,
                sourceLocation: sourceLocation
            )
        }
    }

    // MARK: - The example domains
    //
    // Each domain's walk is seconds of encoding and decoding (twenty for todos in a debug build): it runs on the
    // run's check thread, in the test's task (`onCheckThread`), so the cooperative pool's threads stay free.

    /// Walks `count` generated actions from the initial state, applying the valid ones; checks every action and
    /// every state on the way, and that none of them left the fast path.
    static func checkDomain<D: ActionGenerating>(_: D.Type, count: Int, seed: UInt64) throws
    where D.Action: Equatable {
        var random = SplitMix64(seed: seed)
        var state = D.initialState
        let coder = CanonicalEncoding.Coder()
        let fallbacks = try counting {
            for _ in 0..<count {
                let action = D.randomAction(for: state, using: &random)
                try expectSameEncoding(action)
                let bytes = try foundationEncode(action)
                let normalized = try CanonicalEncoding.normalize(D.Action.self, bytes, with: coder)
                #expect(normalized.canonical == bytes)
                #expect(normalized.value == action)
                if (try? D.validate(action, in: state)) != nil { D.reduce(into: &state, action) }
                try expectSameEncoding(state)
                #expect(expectSameStream(state, try foundationEncode(state)), "\(D.name): a state not streamed")
            }
        }
        #expect(fallbacks.encodes == 0, "\(D.name): encodings left to Foundation")
        #expect(fallbacks.treeEncodes == 0, "\(D.name): encodings the one-pass writer left to the tree")
        #expect(fallbacks.decodes == 0, "\(D.name): decodings left to Foundation")
    }

    @Test func counterActionsAndStatesTakeTheFastPath() async throws {
        try await onCheckThread { try Self.checkDomain(Counter.self, count: 3000, seed: 1) }
    }
    @Test func todosActionsAndStatesTakeTheFastPath() async throws {
        try await onCheckThread { try Self.checkDomain(Todos.self, count: 1500, seed: 2) }
    }
    @Test func postsActionsAndStatesTakeTheFastPath() async throws {
        try await onCheckThread { try Self.checkDomain(Posts.self, count: 1500, seed: 3) }
    }
    @Test func numbersActionsAndStatesTakeTheFastPath() async throws {
        try await onCheckThread { try Self.checkDomain(Numbers.self, count: 3000, seed: 4) }
    }

    /// The counter above counts: a call that falls back is seen (else a fast path that always fell back would pass).
    @Test func fallbacksAreCounted() throws {
        let coder = CanonicalEncoding.Coder()
        let fallbacks = try Self.counting {
            _ = try coder.decode(Counter.Action.self, from: Array(#"{ "increment" : {} }"#.utf8))
            _ = try coder.encode(Date(timeIntervalSince1970: 0))
            // A Date inside a value: Foundation's at once, not the tree's first (it leaves Dates to Foundation too).
            _ = try coder.encode(["at": Date(timeIntervalSince1970: 0)])
            _ = try CanonicalEncoding.normalize(
                Numbers.Action.self,
                Array(#"{"add":{"number":1.0}}"#.utf8),
                with: coder
            )
        }
        #expect(fallbacks.decodes == 2)
        #expect(fallbacks.encodes == 2)
        #expect(fallbacks.treeEncodes == 0)
        // Bound to this task only: a call here is not counted there.
        #expect(Fallbacks.current == nil)
    }

    @Test func todosWithEveryKindOfText() throws {
        let texts = [
            "", "buy milk", "say \"hi\"", #"C:\path\to"#, "a/b", "tab\tnew\nline", "\u{0}\u{1f}\u{7f}", "é😀ﬀ",
            "\u{2028}\u{2029}", String(repeating: "x", count: 1024),
        ]
        for (id, text) in texts.enumerated() {
            let fallbacks = try Self.expectSameEncoding(Todos.Action.add(text: text))
            #expect(fallbacks.encodes + fallbacks.decodes == 0, "\(text.debugDescription)")
            let state = Todos.State(list: Todos.List(items: [Todos.Todo(id: id, text: text, completed: id % 2 == 0)]))
            try Self.expectSameEncoding(state)
        }
    }

    // MARK: - Hand-made types

    enum Shape: Codable, Equatable {
        case point
        case circle(radius: Int)
        case labelled(String, Int)
        case nested(inner: [Shape]?)
    }

    struct Empty: Codable, Equatable {}

    /// Encodes nothing at all; decodes from anything.
    struct Nothing: Codable, Equatable {
        init() {}
        init(from decoder: any Decoder) throws {}
        func encode(to encoder: any Encoder) throws {}
    }

    struct Everything: Codable, Equatable {
        var int = Int.min, int8 = Int8.min, int16 = Int16.min, int32 = Int32.min, int64 = Int64.min
        var uint = UInt.max, uint8 = UInt8.max, uint16 = UInt16.max, uint32 = UInt32.max, uint64 = UInt64.max
        var intMax = Int.max, int8Max = Int8.max, int16Max = Int16.max, int32Max = Int32.max, int64Max = Int64.max
        var uintMin = UInt.min, zero = 0, minusOne = -1
        var yes = true, no = false
        var text = "text with \"quotes\", \\ and / and é and 😀"
        var present: Int? = 5
        var absent: Int? = nil
        var presentText: String? = "here"
        var optionalStruct: Empty? = Empty()
        var arrays: [[Int]] = [[], [1], [2, 3], []]
        var arraysOfStrings: [[String]] = [["a", "b"], []]
        var byName: [String: Int] = ["b": 2, "a": 1, "a10": 10, "a9": 9, "B": 0, "": -1]
        var byNumber: [Int: String] = [10: "ten", 9: "nine", -1: "minus one", 0: "zero"]
        var shapes: [Shape] = [
            .point, .circle(radius: 3), .labelled("x", 1), .nested(inner: nil), .nested(inner: [.point]),
        ]
        var empty = Empty()
        var emptyArray: [Int] = []
        var emptyDictionary: [String: Int] = [:]
        var nothing = Nothing()
        var nothings = [Nothing(), Nothing()]
        var bools = [true, false]
        var optionals: [Int?] = [1, nil, 3]
        var double = 0.1
        var float: Float = 0.1
        var doubles = [0.0, -0.0, 1, 1.5, 1e21, 1e-7]
        var floats: [Float] = [0, -0.0, 1, 1.5, 1e21, 1e-7]
    }

    @Test func everything() throws {
        let fallbacks = try Self.expectSameEncoding(Everything())
        #expect(fallbacks.encodes + fallbacks.decodes + fallbacks.treeEncodes == 0)
    }

    // MARK: containers out of nesting order

    /// Its members arrive out of order, the largest between others: the one-pass writer moves it once.
    struct Lopsided: Codable, Equatable {
        var zebra = "small"
        var middle = Array(0..<1000)
        var apple = 1
        var quince: [String: Int] = ["b": 2, "a": 1, "c": 3]
    }

    /// Writes to its parent between a nested container's writes, asks for its container twice, and reads an
    /// unkeyed container's count: containers used one inside the other, the one-pass writer's.
    struct NestedInOrder: Encodable {
        func encode(to encoder: any Encoder) throws {
            var outer = encoder.container(keyedBy: Key.self)
            var inner = outer.nestedContainer(keyedBy: Key.self, forKey: .d)
            try inner.encode("x", forKey: .c)
            try inner.encode("y", forKey: .a)
            try outer.encode(1, forKey: .b)
            var again = encoder.container(keyedBy: Key.self)
            try again.encode([3, 1], forKey: .a)
            var list = again.nestedUnkeyedContainer(forKey: .c)
            try list.encode(list.count)
            try list.encode(list.count)
        }

        enum Key: CodingKey { case a, b, c, d }
    }

    /// Writes to a nested container after its parent went on: the tree's to write.
    struct Interleaved: Encodable {
        func encode(to encoder: any Encoder) throws {
            var outer = encoder.container(keyedBy: Key.self)
            var inner = outer.nestedContainer(keyedBy: Key.self, forKey: .b)
            try inner.encode(1, forKey: .a)
            try outer.encode(2, forKey: .a)
            try inner.encode(3, forKey: .c)
            var list = outer.nestedUnkeyedContainer(forKey: .c)
            try list.encode(4)
            try outer.encode(5, forKey: .d)
            try list.encode(6)
        }

        enum Key: CodingKey { case a, b, c, d }
    }

    @Test func containersInAndOutOfNestingOrder() throws {
        let lopsided = try Self.expectSameEncoding([Lopsided(), Lopsided(zebra: "", middle: [], apple: 2, quince: [:])])
        #expect(lopsided.encodes + lopsided.treeEncodes == 0)
        for (value, toTree) in [(NestedInOrder() as any Encodable, false), (Interleaved(), true)] {
            let fallbacks = try Self.counting { () throws in
                #expect(Array(try CanonicalEncoding.encode(value)) == (try Self.foundationEncode(value)))
            }
            #expect(fallbacks.encodes == 0)
            #expect(fallbacks.treeEncodes == (toTree ? 1 : 0), "\(type(of: value))")
        }
    }

    /// More members than a linear search is kept for: found by binary search, absent ones too.
    struct Wide: Codable, Equatable {
        var field0: Int? = nil
        var field1: Int? = 1
        var field2: Int? = 2
        var field3: Int? = nil
        var field4: Int? = 4
        var field5: Int? = 5
        var field6: Int? = nil
        var field7: Int? = 7
        var field8: Int? = 8
        var field9: Int? = nil
        var field10: Int? = 10
        var field11: Int? = 11
        var field12: Int? = nil
        var field13: Int? = 13
        var field14: Int? = 14
        var field15: Int? = nil
        var field16: Int? = 16
        var field17: Int? = 17
        var field18: Int? = nil
        var field19: Int? = 19
        var field20: Int? = 20
        var field21: Int? = nil
        var field22: Int? = 22
        var field23: Int? = 23
    }

    @Test func largeObjects() throws {
        var random = SplitMix64(seed: 8)
        var byName: [String: Int] = [:]
        var byNumber: [Int: String] = [:]
        for _ in 0..<3000 {
            byName["k\(random.next() % 100_000)"] = Int(random.next() % 1000)
            byNumber[Int(Int64(bitPattern: random.next()) >> 40)] = "v\(random.next() % 100)"
        }
        for fallbacks in [
            try Self.expectSameEncoding(byName), try Self.expectSameEncoding(byNumber),
            try Self.expectSameEncoding(Wide()),
            try Self.expectSameEncoding([Wide(), Wide()]),
        ] {
            #expect(fallbacks.encodes + fallbacks.decodes == 0)
        }
        // Each member name, and names before, between and after them.
        var text = "{" + (0..<24).map { #""field\#($0)":\#($0)"# }.sorted().joined(separator: ",") + "}"
        Self.expectSameDecoding(Wide.self, text.utf8)
        text =
            "{" + (0..<24).filter { $0 % 2 == 0 }.map { #""field\#($0)":\#($0)"# }.sorted().joined(separator: ",") + "}"
        #expect(Self.expectSameDecoding(Wide.self, text.utf8).decodes == 0)
    }

    @Test func valuesAtTheTopLevel() throws {
        for fallbacks in [
            try Self.expectSameEncoding(5), try Self.expectSameEncoding("x"), try Self.expectSameEncoding(true),
            try Self.expectSameEncoding(Int?.none), try Self.expectSameEncoding(Int?.some(1)),
            try Self.expectSameEncoding([Int]()), try Self.expectSameEncoding([String: Int]()),
            try Self.expectSameEncoding(Empty()), try Self.expectSameEncoding(-0.0),
            try Self.expectSameEncoding([[[Int]]]()),
        ] {
            #expect(fallbacks.encodes + fallbacks.decodes == 0)
        }
    }

    @Test func integersAtTheirLimits() throws {
        func check<T: FixedWidthInteger & Codable>(_: T.Type) throws {
            for value in [T.min, T.max, 0, 1, T.min / 2, T.max / 3, T.isSigned ? -1 : 2, T.isSigned ? -9 : 9] {
                let fallbacks = try Self.expectSameEncoding(value)
                #expect(fallbacks.encodes + fallbacks.decodes == 0)
                try Self.expectSameEncoding(["v": value])
            }
            // One past either end is Foundation's to refuse.
            for text in ["\(T.min)".dropLast() + "9", "\(T.max)".dropLast() + "9" + "0", "-1"] {
                Self.expectSameDecoding(T.self, text.utf8)
            }
        }
        try check(Int.self)
        try check(Int8.self)
        try check(Int16.self)
        try check(Int32.self)
        try check(Int64.self)
        try check(UInt.self)
        try check(UInt8.self)
        try check(UInt16.self)
        try check(UInt32.self)
        try check(UInt64.self)
        try Self.expectSameEncoding([Int128.min, Int128.max, 0])
        try Self.expectSameEncoding([UInt128.max, 0])
    }

    @Test func everyASCIICharacter() throws {
        let all = String(decoding: (0..<128).map { UInt8($0) }, as: UTF8.self)
        #expect(try Self.expectSameEncoding(all).decodes == 0)
        for byte in 0..<128 {
            let one = String(decoding: [UInt8(byte)], as: UTF8.self)
            let fallbacks = try Self.expectSameEncoding([one: one])
            #expect(fallbacks.encodes == 0)
        }
    }

    @Test func stringsAndTheirEscapes() throws {
        for string in ["", "😀", "\u{10FFFF}", "a\u{301}", "\u{FEFF}", "ﬀ", "\\\"/", "\u{7f}", "\u{2028}"] {
            #expect(try Self.expectSameEncoding(string).encodes == 0)
            try Self.expectSameEncoding([string: string])
        }
        // Escapes JSONEncoder would not write are Foundation's to read.
        for text in [
            #""\u00e9""#, #""\ud83d\ude00""#, #""\/""#, #""\u0041""#, #""\u001F""#, #""\u000a""#, #""\ud800""#,
            #""\x""#, #""\u12""#, "\"\u{1}\"", "\"a\u{7f}\"", #""\u0000""#, #""a\n\"\\""#,
        ] {
            Self.expectSameDecoding(String.self, text.utf8)
            Self.expectSameDecoding([String].self, "[\(text)]".utf8)
            Self.expectSameDecoding([String: Int].self, "{\(text):1}".utf8)
        }
    }

    /// Member names that are equal Strings but not the same bytes: Foundation's dictionaries keep one.
    struct TwoNames: Codable, Equatable {
        var first: String
        var second: String
        var value: Int

        enum CodingKeys: CodingKey {
            case first, second
            var stringValue: String {
                switch self {
                case .first: "K"
                case .second: "\u{212A}"  // KELVIN SIGN, canonically equivalent to "K"
                }
            }
            init?(stringValue: String) {
                switch stringValue {
                case "K": self = .first
                case "\u{212A}": self = .second
                default: return nil
                }
            }
        }

        init(value: Int) {
            first = "a"
            second = "b"
            self.value = value
        }

        init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            first = try container.decode(String.self, forKey: .first)
            second = try container.decode(String.self, forKey: .second)
            value = 0
        }

        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(first, forKey: .first)
            try container.encode(second, forKey: .second)
        }
    }

    @Test func namesThatAreEqualStrings() throws {
        let expected = Self.outcome { try Self.foundationEncode(TwoNames(value: 0)) }
        let fallbacks = Self.counting {
            #expect(Self.outcome { Array(try CanonicalEncoding.encode(TwoNames(value: 0))) } == expected)
        }
        #expect(fallbacks.encodes == 1)
        #expect(Self.expectSameDecoding(TwoNames.self, #"{"K":"x"}"#.utf8).decodes == 2)
        Self.expectSameDecoding([String: Int].self, "{\"\u{212A}\":1,\"K\":2}".utf8)
        Self.expectSameDecoding([String: Int].self, "{\"e\u{301}\":1,\"é\":2}".utf8)
        try Self.expectSameEncoding(["é": 1, "z": 2, "Ａ": 3, "😀": 4, "e": 5])
    }

    @Test func floatingPointSpellings() throws {
        let doubles: [Double] = [
            0, -0.0, 1, -1, 0.1, 1e-7, 1e21, 1e20, 1e16, 1e15, 123_456_789_012_345_680, 2e-5,
            .greatestFiniteMagnitude, -.greatestFiniteMagnitude, .leastNonzeroMagnitude, .leastNormalMagnitude,
            .pi, 100, 9_007_199_254_740_994, 0.30000000000000004, 1.0 / 3, 2.5e-300, 1e300,
        ]
        let floats: [Float] = [
            0, -0.0, 1, 0.1, 1e-7, 1e21, .greatestFiniteMagnitude, .leastNonzeroMagnitude,
            .leastNormalMagnitude, .pi, 16_777_218, 1.0 / 3, 1e-30,
        ]
        var random = SplitMix64(seed: 5)
        var allDoubles = doubles
        var allFloats = floats
        while allDoubles.count < 3000 {
            let value = Double(bitPattern: random.next())
            if value.isFinite { allDoubles.append(value) }
            let single = Float(bitPattern: UInt32(truncatingIfNeeded: random.next()))
            if single.isFinite { allFloats.append(single) }
        }
        let fallbacks = try Self.counting {
            for value in allDoubles {
                let bytes = try Self.foundationEncode(value)
                #expect(try CanonicalEncoding.Coder().encode(value) == bytes)
                let decoded = try CanonicalEncoding.Coder().decode(Double.self, from: bytes)
                #expect(decoded.bitPattern == (try Self.foundationDecode(Double.self, bytes)).bitPattern)
            }
            for value in allFloats {
                let bytes = try Self.foundationEncode(value)
                #expect(try CanonicalEncoding.Coder().encode(value) == bytes)
                let decoded = try CanonicalEncoding.Coder().decode(Float.self, from: bytes)
                #expect(decoded.bitPattern == (try Self.foundationDecode(Float.self, bytes)).bitPattern)
            }
        }
        #expect(fallbacks.encodes + fallbacks.decodes == 0)
        for value in [Double.nan, .infinity, -.infinity] {
            #expect(
                Self.outcome { Array(try CanonicalEncoding.encode(value)) }
                    == Self.outcome { try Self.foundationEncode(value) }
            )
            #expect(
                Self.outcome { Array(try CanonicalEncoding.encode(["x": [value]])) }
                    == Self.outcome { try Self.foundationEncode(["x": [value]]) }
            )
        }
        // Other spellings, read by Foundation.
        for text in [
            "1.0", "1e2", "1E2", "1.50", "-0.0", "0e0", "1e400", "-1e400", "1e-400", "2.4e-324", "1e+21",
            "12345678901234567890123", "0.1000000000000000055511151231257827", "4.9e-324",
        ] {
            Self.expectSameDecoding(Double.self, text.utf8)
            Self.expectSameDecoding(Float.self, text.utf8)
            Self.expectSameDecoding([Double].self, "[\(text)]".utf8)
        }
        for _ in 0..<2000 {
            let digits = String(random.next() % 100_000_000_000)
            let exponent = Int(random.next() % 700) - 350
            let text = "\(digits.prefix(1)).\(digits.dropFirst())e\(exponent)"
            Self.expectSameDecoding(Double.self, text.utf8)
            Self.expectSameDecoding(Float.self, text.utf8)
        }
    }

    @Test func valuesThatEncodeNothing() throws {
        #expect(
            Self.outcome { Array(try CanonicalEncoding.encode(Nothing())) }
                == Self.outcome { try Self.foundationEncode(Nothing()) }
        )
        #expect(
            Self.outcome { try CanonicalEncoding.Coder().encode(Nothing()) }
                == Self.outcome { try Self.foundationEncode(Nothing()) }
        )
        #expect(try Self.expectSameEncoding([Nothing()]).encodes == 0)
        #expect(try Self.expectSameEncoding(["a": Nothing()]).encodes == 0)
        #expect(try Self.expectSameEncoding([Nothing?.some(Nothing())]).encodes == 0)
    }

    // MARK: super

    class Animal: Codable, Equatable {
        var legs: Int
        init(legs: Int) { self.legs = legs }
        static func == (left: Animal, right: Animal) -> Bool { left.same(as: right) }
        func same(as other: Animal) -> Bool { legs == other.legs && type(of: self) == type(of: other) }
    }

    final class Dog: Animal {
        var name: String
        var tags: [String]
        enum CodingKeys: String, CodingKey { case name, tags, parent }

        init(name: String, tags: [String]) {
            self.name = name
            self.tags = tags
            super.init(legs: 4)
        }

        required init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            name = try container.decode(String.self, forKey: .name)
            var tags = try container.nestedUnkeyedContainer(forKey: .tags)
            self.tags = []
            while !tags.isAtEnd { self.tags.append(try tags.decode(String.self)) }
            try super.init(from: container.superDecoder())
            _ = try container.superDecoder(forKey: .parent).container(keyedBy: CodingKeys.self)
        }

        override func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(name, forKey: .name)
            var tags = container.nestedUnkeyedContainer(forKey: .tags)
            for tag in self.tags { try tags.encode(tag) }
            try super.encode(to: container.superEncoder())
            _ = container.superEncoder(forKey: .parent)  // unused: Foundation writes {}
        }

        override func same(as other: Animal) -> Bool {
            guard let other = other as? Dog else { return false }
            return legs == other.legs && name == other.name && tags == other.tags
        }
    }

    /// A subclass that shares its encoder and decoder with its superclass: one object, asked for twice.
    final class Cat: Animal {
        var lives: Int
        enum CodingKeys: String, CodingKey { case lives }

        init(lives: Int) {
            self.lives = lives
            super.init(legs: 4)
        }

        required init(from decoder: any Decoder) throws {
            lives = try decoder.container(keyedBy: CodingKeys.self).decode(Int.self, forKey: .lives)
            try super.init(from: decoder)
        }

        override func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(lives, forKey: .lives)
            try super.encode(to: encoder)
        }

        override func same(as other: Animal) -> Bool {
            guard let other = other as? Cat else { return false }
            return legs == other.legs && lives == other.lives
        }
    }

    /// Throws from inside a member; its parent carries on without it.
    struct Thrower: Encodable {
        struct Refusal: Error {}
        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: Cat.CodingKeys.self)
            try container.encode(1, forKey: .lives)
            throw Refusal()
        }
    }

    struct Forgiving: Encodable {
        enum CodingKeys: CodingKey { case kept, thrown }
        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(1, forKey: .kept)
            try? container.encode(Thrower(), forKey: .thrown)
        }
    }

    @Test func errorsCaughtOnTheWay() throws {
        let fallbacks = Self.counting {
            #expect(
                Self.outcome { try CanonicalEncoding.Coder().encode(Forgiving()) }
                    == Self.outcome { try Self.foundationEncode(Forgiving()) }
            )
        }
        #expect(fallbacks.encodes == 1)
    }

    /// Reads an `Int`, then maybe another, and insists the array ended there: past the end, Foundation's
    /// `decodeIfPresent(Int.self)` moves the index on, the standard library's default does not.
    struct OptionalSecond: Decodable, Equatable {
        var first: Int
        var second: Int?
        init(from decoder: any Decoder) throws {
            var container = try decoder.unkeyedContainer()
            first = try container.decode(Int.self)
            second = try container.decodeIfPresent(Int.self)
            guard container.currentIndex == container.count else {
                throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "index moved past the end"))
            }
        }
    }

    @Test func concreteDecodeIfPresentPastTheEndIsFoundations() {
        Self.expectSameDecoding(OptionalSecond.self, "[1]".utf8)
        Self.expectSameDecoding(OptionalSecond.self, "[1,2]".utf8)
        Self.expectSameDecoding(OptionalSecond.self, "[1,null]".utf8)
    }

    /// Encodes its elements' supers through an array's superEncoder(), which Foundation places at a remembered index.
    struct ArraySupers: Codable, Equatable {
        var values: [Int]
        init(values: [Int]) { self.values = values }
        init(from decoder: any Decoder) throws {
            var container = try decoder.unkeyedContainer()
            values = []
            while !container.isAtEnd { values.append(try Int(from: container.superDecoder())) }
        }
        func encode(to encoder: any Encoder) throws {
            var container = encoder.unkeyedContainer()
            for value in values {
                let superEncoder = container.superEncoder()
                try value.encode(to: superEncoder)
            }
        }
    }

    @Test func superEncoderAndSuperDecoder() throws {
        #expect(try Self.expectSameEncoding(Dog(name: "Rex", tags: ["good", "boy"])).encodes == 0)
        #expect(try Self.expectSameEncoding([Dog(name: "a", tags: []), Dog(name: "b", tags: ["c"])]).decodes == 0)
        let cat = try Self.expectSameEncoding(Cat(lives: 9))
        #expect(cat.encodes + cat.decodes == 0)
        // An array's superEncoder() is Foundation's to place.
        #expect(try Self.expectSameEncoding(ArraySupers(values: [1, 2, 3])).encodes >= 1)
        // A missing super member is decoded from null by Foundation.
        Self.expectSameDecoding(Dog.self, #"{"name":"Rex","parent":{},"tags":[]}"#.utf8)
    }

    // MARK: coding paths

    /// Keeps the coding paths it was decoded at, and encodes the coding paths it is encoded at.
    struct PathReader: Codable, Equatable {
        var path = ""

        init() {}

        static func describe(_ path: [any CodingKey]) -> String {
            path.map { "\($0.stringValue)#\($0.intValue.map(String.init) ?? "-")" }.joined(separator: "/")
        }

        /// From `{}`, or from an object with any of `inner` (an object, maybe with an `inner` reader), `list` (an
        /// array of readers) and `sup` (anything).
        init(from decoder: any Decoder) throws {
            path = Self.describe(decoder.codingPath)
            path += "|" + Self.describe(try decoder.singleValueContainer().codingPath)
            let container = try decoder.container(keyedBy: Key.self)
            path += "|" + Self.describe(container.codingPath)
            if container.contains(.inner) {
                let nested = try container.nestedContainer(keyedBy: Key.self, forKey: .inner)
                path += "|" + Self.describe(nested.codingPath)
                if nested.contains(.inner) {
                    path += "|(" + (try nested.decode(PathReader.self, forKey: .inner)).path + ")"
                }
            }
            if container.contains(.list) {
                var list = try container.nestedUnkeyedContainer(forKey: .list)
                path += "|" + Self.describe(list.codingPath)
                while !list.isAtEnd { path += "|[" + (try list.decode(PathReader.self)).path + "]" }
            }
            if container.contains(.sup) {
                path += "|" + Self.describe(try container.superDecoder(forKey: .sup).codingPath)
            }
        }

        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: Key.self)
            try container.encode(Self.describe(encoder.codingPath), forKey: .path)
            var nested = container.nestedContainer(keyedBy: Key.self, forKey: .inner)
            try nested.encode(Self.describe(nested.codingPath), forKey: .path)
            try nested.encode(Inner(), forKey: .inner)
            var array = nested.nestedUnkeyedContainer(forKey: .list)
            try array.encode(Inner())
            try array.encode(Self.describe(array.codingPath))
            var deeper = array.nestedContainer(keyedBy: Key.self)
            try deeper.encode(Inner(), forKey: .inner)
            try Inner().encode(to: container.superEncoder())
            try Inner().encode(to: nested.superEncoder(forKey: .sup))
        }

        struct Inner: Encodable {
            func encode(to encoder: any Encoder) throws {
                var single = encoder.singleValueContainer()
                try single.encode(
                    PathReader.describe(encoder.codingPath) + "|" + PathReader.describe(single.codingPath)
                )
            }
        }

        enum Key: CodingKey { case path, inner, list, sup }
    }

    struct Paths: Codable, Equatable {
        var one = PathReader()
        var list = [PathReader(), PathReader()]
        var byName = ["x": PathReader()]
        var byNumber = [7: PathReader()]
        var optional: PathReader? = PathReader()
        var shape = Wrapped.wrap(PathReader(), [PathReader()])

        enum Wrapped: Codable, Equatable {
            case wrap(PathReader, [PathReader])
        }

        enum CodingKeys: Int, CodingKey {
            case one = 1
            case list, byName, byNumber, optional, shape
        }
    }

    @Test func codingPathsAreFoundations() throws {
        let fallbacks = try Self.counting { () throws in
            #expect(try CanonicalEncoding.Coder().encode(Paths()) == (try Self.foundationEncode(Paths())))
        }
        #expect(fallbacks.encodes == 0)
        // Decoding paths, from a document with readers that look into nested containers.
        let reader = #"{"inner":{"inner":{"list":[{}]}},"list":[{},{"sup":[]}],"sup":null}"#
        let document =
            #"{"byName":{"x":R},"byNumber":{"7":R},"list":[R,{}],"one":R,"optional":R,"#
            + #""shape":{"wrap":{"_0":R,"_1":[R,R]}}}"#
        let bytes = Array(document.replacingOccurrences(of: "R", with: reader).utf8)
        let expected = try Self.foundationDecode(Paths.self, bytes)
        let decodes = Self.counting {
            #expect((try? CanonicalEncoding.decode(Paths.self, from: Data(bytes))) == expected)
        }
        #expect(decodes.decodes == 0)
        #expect(expected.one.path.hasPrefix("one#1|one#1|one#1|one#1/inner#-|(one#1/inner#-/inner#-|"))
    }

    // MARK: - Inputs Foundation must judge

    @Test(arguments: [
        #" {"increment":{}}"#, #"{"increment":{}} "#, "{\"increment\":{}}\n", #"{"increment": {}}"#,
        #"{ "increment":{}}"#,
        #"{"increment":{},"decrement":{}}"#, #"{"decrement":{},"increment":{}}"#, #"{"increment":{},"increment":{}}"#,
        #"{"increment":{"by":1}}"#, #"{"incr\u0065ment":{}}"#, #"{"increment":{}"#, #"{"increment":"#, "", "{", "}",
        #"{"increment":[]}"#, #"{"increment":null}"#, "null", "[]", "1", "\u{FEFF}{\"increment\":{}}",
        "{\"increment\":{}}\u{0}", #"{"nope":{}}"#, #"{}"#,
    ])
    func counterInputs(_ text: String) {
        Self.expectSameDecoding(Counter.Action.self, text.utf8)
    }

    @Test(arguments: [
        #"{"add":{"number":1.0}}"#, #"{"add":{"number":1e2}}"#, #"{"add":{"number":-0}}"#, #"{"add":{"number":5.5}}"#,
        #"{"add":{"number":01}}"#, #"{"add":{"number":+1}}"#, #"{"add":{"number":1e400}}"#, #"{"add":{"number":"1"}}"#,
        #"{"add":{"number":9223372036854775807}}"#, #"{"add":{"number":9223372036854775808}}"#,
        #"{"add":{"number":-9223372036854775808}}"#, #"{"add":{"number":-9223372036854775809}}"#,
        #"{"add":{"number":1,"number":2}}"#, #"{"add":{"extra":true,"number":1}}"#,
        #"{"add":{"number":1,"zz":[1,{}]}}"#,
        #"{"fetched":{"numbers":[1,2,3]}}"#, #"{"fetched":{"numbers":[1, 2]}}"#, #"{"fetched":{"numbers":[1,]}}"#,
        #"{"fetched":{"numbers":[1,null]}}"#, #"{"fetched":{"numbers":[]}}"#, #"{"fetched":{"numbers":{}}}"#,
        #"{"fetched":{"numbers":[1,2],"numbers":[3]}}"#, #"{"delete":{"index":-1}}"#, #"{"add":{"number":-}}"#,
        #"{"add":{"number":1.}}"#, #"{"add":{"number":.5}}"#, #"{"add":{"number":1e}}"#, #"{"add":{"number":tru}}"#,
    ])
    func numbersInputs(_ text: String) {
        Self.expectSameDecoding(Numbers.Action.self, text.utf8)
    }

    @Test func invalidUTF8() {
        let prefix = Array(#"{"add":{"text":""#.utf8)
        let suffix = Array(#""}}"#.utf8)
        for bad in [
            [0xff], [0xc0, 0xaf], [0xe0, 0x80, 0xaf], [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80], [0xc3],
            [0xe2, 0x82], [0x80], [0xf0, 0x9f, 0x98], [0xc3, 0xa9], [0xf0, 0x9f, 0x98, 0x80],
        ] as [[UInt8]] {
            Self.expectSameDecoding(Todos.Action.self, prefix + bad + suffix)
            // In a member no one reads.
            Self.expectSameDecoding(Counter.State.self, Array(#"{"count":1,"x":""#.utf8) + bad + suffix.dropLast())
            // In a member name.
            Self.expectSameDecoding(
                [String: Int].self,
                [UInt8(ascii: "{"), UInt8(ascii: "\"")] + bad + Array(#"":1}"#.utf8)
            )
        }
    }

    /// Canonical bytes of every domain, damaged at random: whatever the fast path accepts, it reads as Foundation
    /// does, and whatever it refuses, Foundation judges.
    @Test func damagedBytes() async throws {
        // Seconds of encoding and decoding: on a thread of its own, in this task, so the pool stays free.
        try await onCheckThread {
            var random = SplitMix64(seed: 6)
            let samples: [[UInt8]] = try [
                Self.foundationEncode(Counter.Action.increment),
                Self.foundationEncode(Todos.Action.add(text: "a é\n")),
                Self.foundationEncode(Todos.Action.toggle(id: 12)),
                Self.foundationEncode(Posts.Action.appendPosts(posts: ["a", "b"])),
                Self.foundationEncode(Numbers.Action.fetched(numbers: [1, -20, 300])),
                Self.foundationEncode(Todos.State(list: Todos.List(items: [Todos.Todo(id: 1, text: "x")], nextID: 2))),
            ]
            let alphabet =
                Array(#"{}[]":,.-+eE0123456789 \tnulltruefalse\u"#.utf8) + [0x00, 0x1f, 0x7f, 0xc3, 0xa9, 0xff]
            for _ in 0..<4000 {
                var bytes = samples[Int(random.next() % UInt64(samples.count))]
                for _ in 0...(random.next() % 3) {
                    let position = Int(random.next() % UInt64(bytes.count + 1))
                    let byte = alphabet[Int(random.next() % UInt64(alphabet.count))]
                    switch random.next() % 3 {
                    case 0 where position < bytes.count: bytes[position] = byte
                    case 1 where position < bytes.count: bytes.remove(at: position)
                    default: bytes.insert(byte, at: position)
                    }
                }
                Self.expectSameDecoding(Counter.Action.self, bytes)
                Self.expectSameDecoding(Todos.Action.self, bytes)
                Self.expectSameDecoding(Posts.Action.self, bytes)
                Self.expectSameDecoding(Numbers.Action.self, bytes)
                Self.expectSameDecoding(Todos.State.self, bytes)
                Self.expectSameDecoding(JSONValue.self, bytes)
            }
        }
    }

    @Test func deepNesting() throws {
        for depth in [10, 255, 256, 257, 300, 511, 512, 513, 600] {
            let text = String(repeating: "[", count: depth) + String(repeating: "]", count: depth)
            Self.expectSameDecoding(JSONValue.self, text.utf8)
            let value = try JSONValue(
                parsing: Array(String(repeating: "[", count: min(depth, 500)).utf8)
                    + Array(String(repeating: "]", count: min(depth, 500)).utf8)
            )
            var nested = value
            for _ in 0..<(depth - min(depth, 500)) { nested = .array([nested]) }
            #expect(
                Self.outcome { Array(try CanonicalEncoding.encode(nested)) }
                    == Self.outcome { try Self.foundationEncode(nested) }
            )
        }
    }

    /// Random JSON values, with names and strings drawn from a small alphabet that has escapes and non-ASCII in it.
    @Test func randomJSONValues() async throws {
        // Seconds of encoding and decoding: on a thread of its own, in this task, so the pool stays free.
        await onCheckThread {
            var random = SplitMix64(seed: 7)
            let pieces = [
                "a", "b", "B", "", "é", "😀", "\"", "\\", "/", "\n", "\u{1}", "\u{7f}", "a10", "a9", "K", "\u{212A}",
            ]
            func string() -> String {
                (0..<(random.next() % 4)).map { _ in pieces[Int(random.next() % UInt64(pieces.count))] }.joined()
            }
            func value(_ depth: Int) -> JSONValue {
                switch random.next() % (depth > 3 ? 5 : 7) {
                case 0: return .null
                case 1: return .bool(random.next() % 2 == 0)
                case 2: return .integer(Int64(bitPattern: random.next()) >> (random.next() % 64))
                case 3: return .number(Double(Int64(bitPattern: random.next()) >> 20) / 1024)
                case 4: return .string(string())
                case 5: return .array((0..<(random.next() % 4)).map { _ in value(depth + 1) })
                default:
                    var members: [String: JSONValue] = [:]
                    for _ in 0..<(random.next() % 5) { members[string()] = value(depth + 1) }
                    return .object(members)
                }
            }
            for _ in 0..<2000 {
                let sample = value(0)
                let bytes = Self.outcome { try Self.foundationEncode(sample) }
                #expect(Self.outcome { Array(try CanonicalEncoding.encode(sample)) } == bytes)
                #expect(Self.outcome { try CanonicalEncoding.Coder().encode(sample) } == bytes)
                if let canonical = try? Self.foundationEncode(sample) {
                    Self.expectSameStream(sample, canonical)
                    Self.expectSameDecoding(JSONValue.self, canonical)
                    Self.expectSameDecoding([String: JSONValue].self, canonical)
                    Self.expectSameDecoding([JSONValue].self, canonical)
                }
            }
        }
    }

    /// A normalized action keeps Foundation's verdict: the existing messages for bytes that are refused.
    @Test(arguments: [
        ("counter", #"{"increment":{"by":2}}"#, "member 'increment.by' is not part of the type"),
        ("counter", #"{"increment":{}} x"#, "not valid JSON: unexpected bytes after the value at byte 17"),
        ("numbers", #"{"add":{"number":5.5}}"#, "a number in it does not fit the member"),
        ("numbers", #"{"add":{"number":"5"}}"#, "expected Int at add.number"),
        ("numbers", #"{"add":{"number":5,"by":"me"}}"#, "member 'add.by' is not part of the type"),
    ])
    func normalizeKeepsItsMessages(store: String, text: String, says: String) {
        let coder = CanonicalEncoding.Coder()
        #expect {
            if store == "counter" {
                _ = try CanonicalEncoding.normalize(Counter.Action.self, Array(text.utf8), with: coder)
            } else {
                _ = try CanonicalEncoding.normalize(Numbers.Action.self, Array(text.utf8), with: coder)
            }
        } throws: { error in
            "\(error)".contains(says)
        }
    }

    @Test func normalizeTakesCanonicalForms() throws {
        let coder = CanonicalEncoding.Coder()
        for (text, canonical) in [
            (#"{ "add" : { "number" : 1.0 } }"#, #"{"add":{"number":1}}"#),
            (#"{"add":{"number":5e1}}"#, #"{"add":{"number":50}}"#),
            (#"{"add":{"number":-0}}"#, #"{"add":{"number":0}}"#), (#"{"add":{"number":3}}"#, #"{"add":{"number":3}}"#),
        ] {
            let result = try CanonicalEncoding.normalize(Numbers.Action.self, Array(text.utf8), with: coder)
            #expect(String(decoding: result.canonical, as: UTF8.self) == canonical)
        }
    }
}
