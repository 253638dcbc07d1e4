import Foundation
import HashTreeCollections
import Lockstep
import Testing

/// A `TreeDictionary` keyed by `Int` or `String` — the shape docs/domains.md recommends for a large state — has one
/// canonical form: an object whose members are sorted, whatever the order of insertion and the process's hash seed
/// (which orders the tree's iteration), made and read by the fast coders without falling back to Foundation's.
@Suite struct TreeDictionaryCanonicalTests {
    struct Item: Codable, Equatable, Sendable {
        var name: String
        var count: Int
    }

    struct State: Codable, Equatable, Sendable {
        var byID = TreeDictionary<Int, Item>()
        var byName = TreeDictionary<String, Int>()
    }

    static func state(ids: [Int]) -> State {
        var state = State()
        for id in ids {
            state.byID[id] = Item(name: "item \(id)", count: id * 3)
            state.byName["item \(id)"] = id
        }
        return state
    }

    @Test func theSameContentsInAnyOrderAreTheSameSortedBytes() throws {
        let ids = Array(1...300)
        var random = SplitMix64(seed: 35)
        let shuffled = ids.shuffled(using: &random)
        let fallbacks = CanonicalEncoding.Fallbacks()
        try CanonicalEncoding.Fallbacks.$current.withValue(fallbacks) {
            let one = Array(try CanonicalEncoding.encode(Self.state(ids: ids)))
            let other = Array(try CanonicalEncoding.encode(Self.state(ids: shuffled)))
            #expect(one == other)
            // Foundation's encoder with sorted keys makes the same bytes.
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            #expect(Array(try encoder.encode(Self.state(ids: shuffled))) == one)
            let text = String(decoding: one, as: UTF8.self)
            // Members sorted by their names' bytes: "1", "10", "100", "101", …, "2", …
            #expect(
                text.hasPrefix(#"{"byID":{"1":{"count":3,"name":"item 1"},"10":{"count":30,"name":"item 10"},"100":"#)
            )
            #expect(try CanonicalEncoding.decode(State.self, from: Data(one)) == Self.state(ids: ids))
        }
        #expect(fallbacks.encodes == 0 && fallbacks.decodes == 0, "the fast coders did the work")
        #expect(fallbacks.treeEncodes == 0, "the one-pass writer did")
    }
}
