import Foundation
import Lockstep
import LockstepExamples
import Testing

/// A large state streamed (`CanonicalEncoding.streamed`): the canonical bytes, handed out a chunk at a time as they
/// are final — never the whole held — for the shapes docs/domains.md recommends; and a value that cannot be streamed
/// says so, leaving it to the whole encoder.
@Suite struct CanonicalStreamingTests {
    /// What a stream handed out: the chunks' sizes and their bytes joined.
    struct Collected {
        var chunks: [Int] = []
        var bytes: [UInt8] = []
    }

    static func collect<T: Encodable>(
        _ value: T,
        digestForm: Bool = false,
        chunkBytes: Int
    ) -> (result: CanonicalEncoding.Streamed, collected: Collected)? {
        var collected = Collected()
        let result = CanonicalEncoding.streamed(value, digestForm: digestForm, chunkBytes: chunkBytes) {
            collected.chunks.append($0.count)
            collected.bytes.append(contentsOf: $0)
        }
        return result.map { ($0, collected) }
    }

    /// The bytes of `value` streamed in chunks of `chunkBytes`: the whole encoder's, each chunk about that size (an
    /// element or member more at most), so the writer held about a chunk, not the value.
    static func expectChunked<T: Encodable>(
        _ value: T,
        chunkBytes: Int,
        element: Int,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let whole = try CanonicalEncoding.bytes(of: value)
        let streamed = try #require(collect(value, chunkBytes: chunkBytes), sourceLocation: sourceLocation)
        #expect(streamed.collected.bytes == whole, sourceLocation: sourceLocation)
        #expect(streamed.result.digest == StateDigest(of: whole), sourceLocation: sourceLocation)
        #expect(streamed.result.isCanonicalForm, sourceLocation: sourceLocation)
        #expect(streamed.collected.chunks.count >= whole.count / (2 * chunkBytes), sourceLocation: sourceLocation)
        #expect(streamed.collected.chunks.max()! <= chunkBytes + element, sourceLocation: sourceLocation)
    }

    static func todos(_ count: Int) -> Todos.State {
        var state = Todos.State()
        for index in 0..<count {
            Todos.reduce(into: &state, .add(text: "todo \(index): " + String(repeating: "x", count: index % 200)))
        }
        state.filter = .showCompleted
        return state
    }

    /// `todos`: its list (a member of a member, after one that sorts before it) streams element by element.
    @Test func aListStreamsByElement() throws {
        try Self.expectChunked(Self.todos(5_000), chunkBytes: 16 << 10, element: 512)
    }

    struct Item: Codable, Equatable {
        var name: String
        var count: Int
        var tags: [String]
    }

    /// A state shaped as docs/domains.md recommends for a large part: keyed `DigestedDictionary`s beside small members.
    struct Inventory: Codable, Equatable {
        var items = DigestedDictionary<Int, Item>()
        var byName = DigestedDictionary<String, Item>()
        var nextID = 1
        var title = "stock"
    }

    static func inventory(_ count: Int) -> Inventory {
        var state = Inventory()
        for index in 0..<count {
            let item = Item(name: "item \(index) é", count: index * 7, tags: index % 3 == 0 ? ["a", "b"] : [])
            state.items[index * 13 % 100_003] = item
            state.byName["name-\(index)-\(String(repeating: "z", count: index % 17))"] = item
        }
        state.nextID = count + 1
        return state
    }

    /// A `DigestedDictionary`'s members come in their names' order: they stream as they are written.
    @Test func aDigestedDictionaryStreamsByMember() throws {
        try Self.expectChunked(Self.inventory(3_000), chunkBytes: 8 << 10, element: 256)
    }

    /// The digest form streamed is the one written whole: a `DigestedDictionary` in it condensed, and said so.
    @Test func theDigestFormStreamedIsTheOneWrittenWhole() throws {
        let state = Self.inventory(500)
        let whole = try CanonicalEncoding.digestForm(of: state)
        let streamed = try #require(Self.collect(state, digestForm: true, chunkBytes: 64))
        #expect(streamed.collected.bytes == whole.bytes)
        #expect(streamed.result.digest == whole.digest)
        #expect(!streamed.result.isCanonicalForm && !whole.isCanonicalForm)
        let list = Self.todos(50)
        let form = try #require(Self.collect(list, digestForm: true, chunkBytes: 64))
        #expect(form.result.isCanonicalForm)
        #expect(form.collected.bytes == (try CanonicalEncoding.bytes(of: list)))
    }

    enum Shape: Codable, Equatable {
        case circle(radius: Double)
        case square(side: Int, label: String?)
    }

    struct Mixed: Codable, Equatable {
        var zebra: [String: Int]
        var shape: Shape
        var nested: Nested
        var missing: String?
        var present: String? = "here"
        var list: [[Int]]

        struct Nested: Codable, Equatable {
            var z = 1
            var a: [String: [Int]] = ["é": [1], "e": [2], "a10": [], "a9": [3]]
            var m: Shape = .square(side: 2, label: nil)
        }
    }

    /// Objects of many members (a `Dictionary`, put in order whole), enums with payloads (nested containers: not
    /// followed by name), optionals left out, nested structs: the same bytes as the whole encoder's.
    @Test func everyShapeBelowTheTopIsTheWholeEncoders() throws {
        var zebra: [String: Int] = [:]
        for index in 0..<500 { zebra["k\(index * 7919 % 1000)"] = index }
        let value = Mixed(
            zebra: zebra,
            shape: .circle(radius: 1.5),
            nested: Mixed.Nested(),
            missing: nil,
            list: (0..<300).map { Array(0..<($0 % 5)) }
        )
        let whole = try CanonicalEncoding.bytes(of: value)
        for chunkBytes in [1, 7, 100, 4096] {
            let streamed = try #require(Self.collect(value, chunkBytes: chunkBytes))
            #expect(streamed.collected.bytes == whole, "chunks of \(chunkBytes)")
        }
    }

    /// A member name the canonical form escapes (a quote in it).
    struct Quoted: Encodable {
        enum CodingKeys: String, CodingKey {
            case plain
            case quoted = "say \"hi\""
        }
        var plain = 1
        var quoted = 2
    }

    /// A value that writes a member on its first `encode(to:)` only.
    final class Fickle: Encodable {
        var calls = 0
        enum CodingKeys: CodingKey { case b, a }
        func encode(to encoder: any Encoder) throws {
            calls += 1
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(2, forKey: .b)
            if calls == 1 { try container.encode(1, forKey: .a) }
        }
    }

    /// What is not streamed says so (and the whole encoder still writes it): a name to escape at the top, a value
    /// that is not the same on every pass, a `Date` (Foundation's to write).
    @Test func whatIsNotStreamedSaysSo() throws {
        #expect(Self.collect(Quoted(), chunkBytes: 8).map(\.collected.bytes) == nil)
        #expect(try CanonicalEncoding.bytes(of: Quoted()) == Array(#"{"plain":1,"say \"hi\"":2}"#.utf8))
        #expect(Self.collect(Fickle(), chunkBytes: 8).map(\.collected.bytes) == nil)
        #expect(Self.collect(["when": Date(timeIntervalSince1970: 0)], chunkBytes: 8).map(\.collected.bytes) == nil)
    }
}
