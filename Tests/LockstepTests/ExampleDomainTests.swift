import Foundation
import Lockstep
import LockstepExamples
import Testing

@Suite struct ExampleDomainTests {
    /// The action forms DESIGN.md promises, decoded and written back byte for byte.
    @Test(arguments: [
        ("counter", #"{"increment":{}}"#),
        ("counter", #"{"decrement":{}}"#),
        ("todos", #"{"add":{"text":"Eat food"}}"#),
        ("todos", #"{"toggle":{"id":1}}"#),
        ("todos", #"{"setFilter":{"filter":"showCompleted"}}"#),
        ("posts", #"{"setPosts":{"posts":["a","b"]}}"#),
        ("posts", #"{"appendPosts":{"posts":["c"]}}"#),
        ("numbers", #"{"fetched":{"numbers":[3,1]}}"#),
        ("numbers", #"{"add":{"number":5}}"#),
        ("numbers", #"{"delete":{"index":0}}"#),
    ])
    func actionJSONRoundTrips(store: String, json: String) throws {
        let domain = try #require(Examples.domain(named: store))
        #expect(try roundTrip(domain, json) == json)
    }

    func roundTrip<D: Domain>(_: D.Type, _ json: String) throws -> String {
        let action = try CanonicalEncoding.decode(D.Action.self, from: Data(json.utf8))
        return String(decoding: try CanonicalEncoding.encode(action), as: UTF8.self)
    }

    @Test func todosAddsTogglesAndFilters() async throws {
        let store = Store(Todos.self, observers: ActionObservers())
        try await store.dispatch(.add(text: "Eat food"))
        try await store.dispatch(.add(text: "Sleep"))
        try await store.dispatch(.toggle(id: 1))
        try await store.dispatch(.setFilter(filter: .showCompleted))
        #expect(
            store.state
                == Todos.State(
                    list: .init(
                        items: [
                            .init(id: 1, text: "Eat food", completed: true),
                            .init(id: 2, text: "Sleep", completed: false),
                        ],
                        nextID: 3
                    ),
                    filter: .showCompleted
                )
        )
        await #expect(throws: Rejection.self) { try await store.dispatch(.toggle(id: 9)) }
        await #expect(throws: Rejection.self) { try await store.dispatch(.add(text: "")) }
    }

    @Test func postsStayOrderedWithoutDuplicates() async throws {
        let store = Store(Posts.self, observers: ActionObservers())
        try await store.dispatch(.setPosts(posts: ["a", "b", "a"]))
        try await store.dispatch(.appendPosts(posts: ["c", "b", "d", "c"]))
        #expect(store.state.posts == ["a", "b", "c", "d"])
        try await store.dispatch(.setPosts(posts: ["z"]))
        #expect(store.state.posts == ["z"])
    }

    @Test func numbersRejectAnOutOfRangeDeleteWithAClearReason() async throws {
        let store = Store(Numbers.self, observers: ActionObservers())
        let empty = await #expect(throws: Rejection.self) { try await store.dispatch(.delete(index: 0)) }
        #expect(
            empty?.reason == "numbers: delete index 0 is out of range: the list has 0 numbers, so the list is empty"
        )
        try await store.dispatch(.fetched(numbers: [3, 1]))
        try await store.dispatch(.add(number: 5))
        let error = await #expect(throws: Rejection.self) { try await store.dispatch(.delete(index: -1)) }
        #expect(
            error?.reason
                == "numbers: delete index -1 is out of range: the list has 3 numbers, so valid indices are 0...2"
        )
        try await store.dispatch(.delete(index: 0))
        #expect(store.state.numbers == [1, 5])
    }

    @Test func counterRefusesToOverflow() async throws {
        var state = Counter.State(count: .max)
        #expect(throws: Rejection.self) { try Counter.validate(.increment, in: state) }
        Counter.reduce(into: &state, .decrement)
        #expect(state.count == .max - 1)
    }
}

@Suite struct CanonicalEncodingTests {
    struct Unsorted: Codable, Equatable {
        var zeta = 1
        var alpha = "a/b"
        var middle = [2.5, 1]
    }

    @Test func keysAreSortedAndSlashesPlain() throws {
        let bytes = try CanonicalEncoding.encode(Unsorted())
        #expect(String(decoding: bytes, as: UTF8.self) == #"{"alpha":"a/b","middle":[2.5,1],"zeta":1}"#)
    }

    @Test func digestIsSHA256OfTheCanonicalBytes() throws {
        // SHA-256 of the three bytes "abc", the FIPS 180-2 test vector.
        #expect(
            StateDigest(of: Array("abc".utf8)).hex
                == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        )
        let digest = try CanonicalEncoding.digest(of: Unsorted())
        #expect(StateDigest(hex: digest.hex) == digest)
        #expect(StateDigest(hex: "xyz") == nil)
        #expect(StateDigest(bytes: [1, 2, 3]) == nil)
    }
}
