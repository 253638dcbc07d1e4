import Crypto
import Foundation
import HashTreeCollections
import Lockstep
import TestSupport
import Testing

/// A `DigestedDictionary` keeps the sum of its members' digests as it changes: a state's digest form condenses it to
/// its count and sum, equal for equal members however they were reached — built, changed, decoded from a snapshot or
/// copied — and its canonical form is the tree's, byte for byte.
@Suite struct DigestedDictionaryTests {
    struct Item: Codable, Hashable, Sendable {
        var name: String
        var count: Int
        var weight: Double = 1
    }

    struct State: Codable, Equatable, Sendable {
        var items = DigestedDictionary<Int, Item>()
        var nextID = 1
    }

    static func item(_ id: Int) -> Item { Item(name: "item \(id)", count: id * 3) }

    /// The digest form's count and sum, read back.
    static func summary(of state: State) throws -> (count: Int, sum: String) {
        let form = try CanonicalEncoding.digestForm(of: state)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(form.bytes)) as? [String: Any])
        let items = try #require(object["items"] as? [String: Any])
        return (try #require(items["count"] as? Int), try #require(items["sum"] as? String))
    }

    @Test func theDigestFormIsTheCountAndTheSumOfEachMembersDigestAsDocsProtocolSays() throws {
        var state = State()
        state.items[7] = Item(name: "seven", count: 1)
        state.items[12] = Item(name: "twelve", count: 2)
        let form = try CanonicalEncoding.digestForm(of: state)
        #expect(!form.isCanonicalForm)
        // Each member's digest: SHA-256 of the canonical `[key, value]`; their sum modulo 2^256, big-endian.
        func digest(_ json: String) -> [UInt8] { Array(SHA256.hash(data: Array(json.utf8))) }
        let one = digest(#"[7,{"count":1,"name":"seven","weight":1}]"#)
        let other = digest(#"[12,{"count":2,"name":"twelve","weight":1}]"#)
        var sum = [UInt8](repeating: 0, count: 32)
        var carry = 0
        for index in (0..<32).reversed() {
            let total = Int(one[index]) + Int(other[index]) + carry
            sum[index] = UInt8(total & 0xff)
            carry = total >> 8
        }
        let hex = sum.map { String(format: "%02x", $0) }.joined()
        #expect(String(decoding: form.bytes, as: UTF8.self) == #"{"items":{"count":2,"sum":"\#(hex)"},"nextID":1}"#)
        #expect(form.digest == StateDigest(of: form.bytes))
        // The canonical form's digest is another: what a SNAPSHOT and `lockstep state` show.
        #expect(try CanonicalEncoding.digest(of: state) == StateDigest(of: try CanonicalEncoding.bytes(of: state)))
    }

    @Test func theCanonicalFormIsTheTreesAndAStateWithoutOneIsItsOwnDigestForm() throws {
        var state = State()
        var tree = TreeDictionary<Int, Item>()
        for id in [5, 100, 20, 1] {
            state.items[id] = Self.item(id)
            tree[id] = Self.item(id)
        }
        let bytes = try CanonicalEncoding.bytes(of: state)
        let treeBytes = try CanonicalEncoding.bytes(of: tree)
        #expect(
            String(decoding: bytes, as: UTF8.self).hasPrefix(
                #"{"items":\#(String(decoding: treeBytes, as: UTF8.self))"#
            )
        )
        #expect(try CanonicalEncoding.decode(State.self, from: Data(bytes)) == state)
        // No dictionary to condense: the digest form is the canonical form, and the digest its SHA-256, as before.
        let plain = try CanonicalEncoding.digestForm(of: tree)
        #expect(plain.isCanonicalForm && plain.bytes == treeBytes)
        #expect(plain.digest == StateDigest(of: treeBytes))
    }

    /// An encoder that keeps the names of an object's members in the order they are written, and nothing else.
    final class MemberOrder: Encoder {
        var names: [String] = []
        var codingPath: [any CodingKey] { [] }
        var userInfo: [CodingUserInfoKey: Any] { [:] }

        func container<Key: CodingKey>(keyedBy _: Key.Type) -> KeyedEncodingContainer<Key> {
            KeyedEncodingContainer(Members<Key>(order: self))
        }
        func unkeyedContainer() -> any UnkeyedEncodingContainer { Elements(order: self) }
        func singleValueContainer() -> any SingleValueEncodingContainer { Elements(order: self) }

        struct Members<Key: CodingKey>: KeyedEncodingContainerProtocol {
            let order: MemberOrder
            var codingPath: [any CodingKey] { [] }
            func encodeNil(forKey key: Key) { order.names.append(key.stringValue) }
            func encode<T: Encodable>(_: T, forKey key: Key) { order.names.append(key.stringValue) }
            func nestedContainer<N: CodingKey>(keyedBy _: N.Type, forKey key: Key) -> KeyedEncodingContainer<N> {
                order.names.append(key.stringValue)
                return KeyedEncodingContainer(Members<N>(order: MemberOrder()))
            }
            func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
                order.names.append(key.stringValue)
                return Elements(order: MemberOrder())
            }
            func superEncoder() -> any Encoder { MemberOrder() }
            func superEncoder(forKey key: Key) -> any Encoder { MemberOrder() }
        }

        /// Anything but an object: written down as "not an object".
        struct Elements: UnkeyedEncodingContainer, SingleValueEncodingContainer {
            let order: MemberOrder
            var codingPath: [any CodingKey] { [] }
            var count: Int { 0 }
            func encodeNil() { order.names.append("not an object") }
            func encode<T: Encodable>(_: T) { order.names.append("not an object") }
            func nestedContainer<N: CodingKey>(keyedBy _: N.Type) -> KeyedEncodingContainer<N> {
                KeyedEncodingContainer(Members<N>(order: MemberOrder()))
            }
            func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer { self }
            func superEncoder() -> any Encoder { MemberOrder() }
        }
    }

    /// A large dictionary is written in the canonical order to begin with (the encoder then sets nothing aside to
    /// reorder it): the order is the names' UTF-8 — "10" before "9", a shorter name before a longer one it begins,
    /// names alike in their first eight bytes, non-ASCII after ASCII — and the bytes are still the tree's, for `Int`
    /// and `String` keys, through the canonical encoder and Foundation's.
    @Test func membersAreWrittenInTheOrderOfTheirNamesUTF8() throws {
        var names = ["9", "10", "-1", "", "a", "ab", "abcdefgh1", "abcdefgh0", "abcdefgh", "é", "z", "Z", "ÿ", "日本"]
        var generator = SplitMix64(seed: 35)
        let alphabet = Array("09az-_é日 ")
        for _ in 0..<500 {
            let length = Int(generator.next() % 12)
            names.append(String((0..<length).map { _ in alphabet[Int(generator.next() % UInt64(alphabet.count))] }))
        }
        let order = DigestedDictionary<String, Int>.canonicalOrder(of: names)
        let expected = names.indices.sorted { names[$0].utf8.lexicographicallyPrecedes(names[$1].utf8) }
        #expect(order.map { names[$0] } == expected.map { names[$0] })

        var byName = DigestedDictionary<String, Item>()
        var byNameTree = TreeDictionary<String, Item>()
        var byID = State()
        var byIDTree = TreeDictionary<Int, Item>()
        for (index, name) in Set(names).enumerated() {
            byName[name] = Self.item(index)
            byNameTree[name] = Self.item(index)
        }
        for id in (0..<2_000).map({ $0 * 7_919 % 100_003 - 50 }) {
            byID.items[id] = Self.item(id)
            byIDTree[id] = Self.item(id)
        }
        #expect(try CanonicalEncoding.bytes(of: byName) == CanonicalEncoding.bytes(of: byNameTree))
        #expect(try CanonicalEncoding.bytes(of: byID.items) == CanonicalEncoding.bytes(of: byIDTree))
        let foundation = JSONEncoder()
        foundation.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        #expect(try foundation.encode(byName) == foundation.encode(byNameTree))
        #expect(try foundation.encode(byID.items) == foundation.encode(byIDTree))
        #expect(
            try CanonicalEncoding.decode(DigestedDictionary<String, Item>.self, from: foundation.encode(byName))
                == byName
        )
        // What the dictionary itself writes, before any encoder could put it in order.
        for (dictionary, keys) in [
            (byName as any Encodable, Set(names).map { $0 }),
            (byID.items as any Encodable, byID.items.keys.map(String.init)),
        ] {
            let written = MemberOrder()
            try dictionary.encode(to: written)
            let sorted = keys.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
            #expect(written.names.count == sorted.count && written.names.elementsEqual(sorted))
        }
        // ASCII names only: read by the fast decoder, not left to Foundation's.
        let ascii = byName.filter { $0.key.utf8.allSatisfy { $0 < 0x80 } }
        let fallbacks = CanonicalEncoding.Fallbacks()
        let asciiDictionary = DigestedDictionary(TreeDictionary(uniqueKeysWithValues: ascii.map { ($0.key, $0.value) }))
        let decoded = try CanonicalEncoding.Fallbacks.$current.withValue(fallbacks) {
            try CanonicalEncoding.decode(
                DigestedDictionary<String, Item>.self,
                from: try CanonicalEncoding.encode(asciiDictionary)
            )
        }
        #expect(fallbacks.decodes == 0 && decoded == asciiDictionary && decoded.count > 100)
    }

    /// Random inserts, changes in place and removals: the sum kept as they happen is the one taken from the members
    /// whole, and the same as that of the same members inserted in another order.
    @Test func theSumKeptAsItChangesIsTheSumOfTheMembersHoweverTheyWereReached() throws {
        var random = SplitMix64(seed: 39)
        var state = State()
        for step in 0..<2_000 {
            let id = Int.random(in: 1...300, using: &random)
            switch Int.random(in: 0..<4, using: &random) {
            case 0: state.items[id] = Self.item(id + step)
            case 1: state.items[id]?.count += 1
            case 2: state.items.removeValue(forKey: id)
            default: state.items.updateValue(Item(name: "updated \(step)", count: step), forKey: id)
            }
        }
        var rebuilt = State()
        var members = Array(state.items)
        members.shuffle(using: &random)
        for (key, value) in members { rebuilt.items[key] = value }
        #expect(rebuilt == state)
        #expect(rebuilt.items.hashValue == state.items.hashValue)
        #expect(try Self.summary(of: rebuilt) == Self.summary(of: state))
        #expect(try Self.summary(of: state).count == state.items.count)
        // From the members whole: a dictionary made from the tree takes its sum when asked.
        var whole = State()
        whole.items = DigestedDictionary(state.items.tree)
        #expect(try Self.summary(of: whole) == Self.summary(of: state))
    }

    /// Keys are read as the tree reads them: an `Int` key that is not a number is an error naming it, whichever
    /// decoder reads it, and a `String` key is any name.
    @Test func aKeyThatIsNotANumberIsAnError() throws {
        let json = Data(
            #"{"items":{"1":{"count":3,"name":"a","weight":1},"x":{"count":3,"name":"b","weight":1}},"nextID":2}"#.utf8
        )
        for decode in [
            { try CanonicalEncoding.decode(State.self, from: json) },
            { try JSONDecoder().decode(State.self, from: json) },
        ] {
            #expect {
                _ = try decode()
            } throws: { error in
                guard case let DecodingError.typeMismatch(type, context) = error else { return false }
                return type == Int.self && context.codingPath.map(\.stringValue) == ["items", "x"]
            }
        }
        // A member whose key and value are both wrong: the key is named, as the tree names it.
        let both = Data(#"{"items":{"x":5},"nextID":1}"#.utf8)
        #expect {
            _ = try CanonicalEncoding.decode(State.self, from: both)
        } throws: { error in
            guard case let DecodingError.typeMismatch(type, context) = error else { return false }
            return type == Int.self && context.codingPath.map(\.stringValue) == ["items", "x"]
        }
        let byName = try JSONDecoder().decode(
            DigestedDictionary<String, Int>.self,
            from: Data(#"{"x":1,"10":2,"é":3}"#.utf8)
        )
        #expect(byName == ["x": 1, "10": 2, "é": 3])
    }

    /// A decoded dictionary's sum is taken once, by whichever copy asks first, and shared with the copies that changed
    /// since: each one's digest is still its own members'.
    @Test func copiesOfADecodedDictionaryShareItsSumAndKeepTheirOwnChanges() throws {
        var state = State()
        for id in 1...500 { state.items[id] = Self.item(id) }
        // Read by the fast decoder (not left to Foundation's), into the members Foundation's decoder reads.
        let fallbacks = CanonicalEncoding.Fallbacks()
        let bytes = try CanonicalEncoding.encode(state)
        let decoded = try CanonicalEncoding.Fallbacks.$current.withValue(fallbacks) {
            try CanonicalEncoding.decode(State.self, from: bytes)
        }
        #expect(fallbacks.decodes == 0)
        #expect(decoded == (try JSONDecoder().decode(State.self, from: bytes)))
        var changed = decoded
        changed.items[3]?.name = "three"
        changed.items[501] = Self.item(501)
        changed.items.removeValue(forKey: 9)
        var expected = state
        expected.items[3]?.name = "three"
        expected.items[501] = Self.item(501)
        expected.items.removeValue(forKey: 9)
        // The unchanged copy asks first (it takes the sum), then the changed one adds its changes to it.
        #expect(try Self.summary(of: decoded) == Self.summary(of: state))
        #expect(try Self.summary(of: changed) == Self.summary(of: expected))
        // And the other way round, from a fresh decoding.
        var later = try CanonicalEncoding.decode(State.self, from: try CanonicalEncoding.encode(state))
        later.items[3]?.name = "three"
        later.items[501] = Self.item(501)
        later.items.removeValue(forKey: 9)
        #expect(try Self.summary(of: later) == Self.summary(of: expected))
    }

    @Test func oneMemberDifferentIsADifferentDigest() throws {
        var state = State()
        for id in 1...1_000 { state.items[id] = Self.item(id) }
        var other = state
        other.items[500]?.count += 1
        #expect(try CanonicalEncoding.digestForm(of: other).digest != CanonicalEncoding.digestForm(of: state).digest)
        other.items[500]?.count -= 1
        #expect(try CanonicalEncoding.digestForm(of: other).digest == CanonicalEncoding.digestForm(of: state).digest)
    }

    /// A member that does not encode (NaN) makes the digest form throw, as the state's canonical form does; once it
    /// is gone the sum is right again, taken from the members whole.
    @Test func aMemberThatDoesNotEncodeFailsTheDigestUntilItIsGone() throws {
        var state = State()
        for id in 1...10 { state.items[id] = Self.item(id) }
        let clean = try Self.summary(of: state)
        state.items[11] = Item(name: "bad", count: 0, weight: .nan)
        #expect(throws: (any Error).self) { try CanonicalEncoding.digestForm(of: state) }
        #expect(throws: (any Error).self) { try CanonicalEncoding.bytes(of: state) }
        state.items.removeValue(forKey: 11)
        #expect(try Self.summary(of: state) == clean)
    }

    /// The vectors the Python client checks too (Tests/Interop/digest-form-vectors.json, written by its
    /// `digested_dictionary`): Swift's digest form of each state is the same bytes.
    struct Vector: Decodable, CustomTestStringConvertible {
        var name: String
        var state: String
        var keys: String
        var digest_form: String
        var digest: String
        var testDescription: String { name }
    }

    struct Keyed<Key: Hashable & Codable & Sendable>: Codable, Sendable {
        var items: DigestedDictionary<Key, JSONValue>
        var next: Int
    }

    struct TreeKeyed<Key: Hashable & Codable & Sendable>: Codable, Sendable {
        var items: TreeDictionary<Key, JSONValue>
        var next: Int
    }

    static let vectors = interopVectors("digest-form-vectors.json", as: Vector.self)

    @Test func theVectorFileIsThere() {
        #expect(Self.vectors.count >= 5, "Tests/Interop/digest-form-vectors.json is missing or unreadable")
    }

    @Test(arguments: vectors)
    func eachVectorHasItsDigestForm(_ vector: Vector) throws {
        func check<Key: Hashable & Codable & Sendable>(_: Key.Type) throws {
            let state = try CanonicalEncoding.decode(Keyed<Key>.self, from: Data(vector.state.utf8))
            // The members Foundation's decoder reads into the tree, through the tree's own `init(from:)`.
            let viaTree = try JSONDecoder().decode(TreeKeyed<Key>.self, from: Data(vector.state.utf8))
            #expect(state.items.tree == viaTree.items)
            #expect(String(decoding: try CanonicalEncoding.bytes(of: state), as: UTF8.self) == vector.state)
            let form = try CanonicalEncoding.digestForm(of: state)
            #expect(String(decoding: form.bytes, as: UTF8.self) == vector.digest_form)
            #expect(form.digest.hex == vector.digest)
        }
        try vector.keys == "int" ? check(Int.self) : check(String.self)
    }
}
