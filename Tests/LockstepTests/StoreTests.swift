import Dispatch
import Lockstep
import LockstepExamples
import Testing

/// A domain whose validator refuses anything out of order, so a lost, repeated or reordered action shows.
enum Ticks: Domain {
    struct State: Codable, Equatable, Sendable {
        var counts: [Int]
        var total = 0
    }

    enum Action: Codable, Equatable, Sendable {
        case tick(producer: Int, number: Int)
    }

    static let name = "ticks"
    static let version: UInt32 = 1
    static let producers = 8
    static var initialState: State { State(counts: Array(repeating: 0, count: producers)) }

    static func validate(_ action: Action, in state: State) throws(Rejection) {
        guard case let .tick(producer, number) = action, state.counts.indices.contains(producer) else {
            throw Rejection("unknown producer")
        }
        if number != state.counts[producer] + 1 {
            throw Rejection(
                code: "out_of_order",
                "producer \(producer): got \(number), expected \(state.counts[producer] + 1)"
            )
        }
    }

    static func reduce(into state: inout State, _ action: Action) {
        guard case let .tick(producer, _) = action else { return }
        state.counts[producer] += 1
        state.total += 1
    }
}

/// Collects values from callbacks that may run on any thread.
final class Recorder<Value: Sendable>: Sendable {
    private let box = LockedBox<[Value]>([])
    func append(_ value: Value) { box.withLock { $0.append(value) } }
    var values: [Value] { box.withLock { $0 } }
}

final class LockedBox<Value: Sendable>: Sendable {
    private let lock = DispatchQueue(label: "test.lock")
    nonisolated(unsafe) private var value: Value
    init(_ value: Value) { self.value = value }
    func withLock<R>(_ body: (inout Value) -> R) -> R { lock.sync { body(&value) } }
}

@Suite struct StoreTests {
    @Test func eightTasksDispatchingConcurrentlyLoseNothingAndShareOneOrder() async throws {
        let hub = ActionObservers()
        let order = Recorder<(UInt64, Ticks.Action)>()
        let token = hub.observe { observed in
            order.append((observed.index, observed.action as! Ticks.Action))
        }
        defer { token.cancel() }
        let store = Store(Ticks.self, observers: hub)
        let perProducer = 10_000

        try await withThrowingTaskGroup(of: Void.self) { group in
            for producer in 0..<Ticks.producers {
                group.addTask {
                    for number in 1...perProducer {
                        try await store.dispatch(.tick(producer: producer, number: number))
                    }
                }
            }
            try await group.waitForAll()
        }

        let total = Ticks.producers * perProducer
        #expect(store.state.counts == Array(repeating: perProducer, count: Ticks.producers))
        #expect(store.state.total == total)
        #expect(store.appliedCount == UInt64(total))
        let observed = order.values
        #expect(observed.count == total)
        #expect(observed.map(\.0) == Array(1...UInt64(total)))
        // Replaying the one order the observers saw gives the same state: there was a single order.
        let replay = Store(Ticks.self, observers: ActionObservers())
        for (_, action) in observed { try await replay.dispatch(action) }
        #expect(replay.state == store.state)
        #expect(try CanonicalEncoding.digest(of: replay.state) == CanonicalEncoding.digest(of: store.state))
    }

    @Test func threadsSendingConcurrentlyLoseNothing() async throws {
        let store = Store(Ticks.self, observers: ActionObservers())
        let rejections = Recorder<Rejection>()
        let perProducer = 2_000
        let unfinished = Recorder<Int>()
        DispatchQueue.concurrentPerform(iterations: Ticks.producers) { producer in
            let done = DispatchSemaphore(value: 0)
            for number in 1...perProducer {
                store.send(.tick(producer: producer, number: number)) { result in
                    if case let .failure(rejection) = result { rejections.append(rejection) }
                    if number == perProducer { done.signal() }
                }
            }
            if done.wait(timeout: .now() + 60) == .timedOut { unfinished.append(producer) }
        }
        #expect(unfinished.values.isEmpty, "producers whose last tick was never applied")
        #expect(rejections.values.isEmpty)
        #expect(store.state.counts == Array(repeating: perProducer, count: Ticks.producers))
    }

    @Test func selectorSubscribersFireOncePerChangeOfTheirSliceOnly() async throws {
        let store = Store(Todos.self, observers: ActionObservers())
        let filters = Recorder<Todos.Filter>()
        let counts = Recorder<Int>()
        store.subscribe({ $0.filter }, onChange: { filters.append($0) })
        store.subscribe({ $0.list.items.count }, onChange: { counts.append($0) })
        // Replay-last: both got the current value at once.
        #expect(filters.values == [.showAll])
        #expect(counts.values == [0])

        try await store.dispatch(.add(text: "Eat food"))
        try await store.dispatch(.setFilter(filter: .showCompleted))
        try await store.dispatch(.toggle(id: 1))  // changes the list, not its count
        try await store.dispatch(.setFilter(filter: .showCompleted))  // same value: no change
        try await store.dispatch(.add(text: "Sleep"))
        try await store.dispatch(.setFilter(filter: .showActive))

        #expect(filters.values == [.showAll, .showCompleted, .showActive])
        #expect(counts.values == [0, 1, 2])
    }

    @Test func cancelledSubscriptionGetsNothingMore() async throws {
        let store = Store(Counter.self, observers: ActionObservers())
        let seen = Recorder<Int>()
        let subscription = store.subscribe({ $0.count }, onChange: { seen.append($0) })
        try await store.dispatch(.increment)
        subscription.cancel()
        subscription.cancel()
        try await store.dispatch(.increment)
        #expect(seen.values == [0, 1])
        #expect(store.state.count == 2)
    }

    @Test func manySubscribersComeAndGo() async throws {
        let store = Store(Counter.self, observers: ActionObservers())
        let seen = Recorder<Int>()
        var subscriptions = (0..<1_000).map { _ in store.subscribe({ $0.count }, onChange: { seen.append($0) }) }
        #expect(seen.values.count == 1_000)
        for subscription in subscriptions[1...] { subscription.cancel() }
        subscriptions.removeAll()
        try await store.dispatch(.increment)
        #expect(seen.values.count == 1_001)
        #expect(seen.values.last == 1)
    }

    @Test func dispatchFromInsideASubscriberIsQueuedNotReentered() async throws {
        let store = Store(Counter.self, observers: ActionObservers())
        let log = Recorder<String>()
        store.subscribe({ $0.count }) { count in
            log.append("begin \(count)")
            if count == 1 { store.send(.increment) }
            log.append("end \(count)")
        }
        try await store.dispatch(.increment)
        // The nested action was applied before our dispatch returned: it was queued behind ours.
        #expect(store.state.count == 2)
        #expect(log.values == ["begin 0", "end 0", "begin 1", "end 1", "begin 2", "end 2"])
    }

    @Test func rejectedActionChangesNothingAndReachesTheCaller() async throws {
        let hub = ActionObservers()
        let rejected = Recorder<Rejection>()
        let token = hub.observe { if let rejection = $0.rejection { rejected.append(rejection) } }
        defer { token.cancel() }
        let store = Store(Numbers.self, observers: hub)
        let changes = Recorder<Numbers.State>()
        store.subscribe({ $0 }, onChange: { changes.append($0) })
        try await store.dispatch(.fetched(numbers: [3, 1]))
        let before = store.state

        let error = await #expect(throws: Rejection.self) { try await store.dispatch(.delete(index: 7)) }
        #expect(error?.code == "out_of_range")
        #expect(error?.reason.contains("index 7") == true)
        #expect(error?.reason.contains("0...1") == true)
        #expect(store.state == before)
        #expect(store.appliedCount == 1)
        #expect(changes.values.count == 2)
        #expect(rejected.values == [error].compactMap { $0 })

        try await store.dispatch(.delete(index: 1))
        #expect(store.state.numbers == [3])
    }

    @Test func statesStreamStartsWithTheCurrentStateAndEndsCleanly() async throws {
        let store = Store(Counter.self, observers: ActionObservers())
        try await store.dispatch(.increment)
        let stream = store.states()
        try await store.dispatch(.increment)
        try await store.dispatch(.decrement)
        // Bounded: a stream that stopped delivering would end at the watchdog's cancellation, not hang.
        let collector = Task {
            var seen: [Int] = []
            for await state in stream {
                seen.append(state.count)
                if seen.count == 3 { break }
            }
            return seen
        }
        let watchdog = Task {
            try await Task.sleep(for: .seconds(10))
            collector.cancel()
        }
        let seen = await collector.value
        watchdog.cancel()
        #expect(seen == [1, 2, 1])
    }

    @Test func observersSeeEveryActionThroughEveryStore() async throws {
        let hub = ActionObservers()
        let seen = Recorder<String>()
        let token = hub.observe { seen.append("\($0.store)#\($0.index)") }
        let counter = Store(Counter.self, observers: hub)
        let posts = Store(Posts.self, observers: hub)
        try await counter.dispatch(.increment)
        try await posts.dispatch(.appendPosts(posts: ["a"]))
        try await counter.dispatch(.decrement)
        token.cancel()
        try await counter.dispatch(.increment)
        #expect(seen.values == ["counter#1", "posts#1", "counter#2"])
    }
}
