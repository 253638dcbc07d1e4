import Foundation
import Lockstep
import LockstepExamples
import LockstepProtocol
import Testing

@Suite struct SequencerTests {
    let epoch = Epoch(rawValue: 7)
    let client = ClientID(bytes: Array(repeating: 0xAB, count: 16))!

    func sequencer() throws -> Sequencer {
        Sequencer(stores: [try DomainStore(Numbers.self, epoch: epoch), try DomainStore(Counter.self, epoch: epoch)])
    }

    func request(
        _ number: UInt64,
        _ actions: [String],
        store: String = "numbers",
        version: UInt32 = 1
    ) throws
        -> DispatchRequest
    {
        DispatchRequest(
            requestID: number,
            domainVersion: version,
            clientID: client,
            store: try StoreName(store),
            actions: actions.map { Array($0.utf8) }
        )
    }

    func numbers(_ sequencer: Sequencer) throws -> [Int] {
        let state = try #require(sequencer.stores[try StoreName("numbers")]).encodedState()
        return try JSONDecoder().decode(Numbers.State.self, from: Data(state)).numbers
    }

    /// A domain's effects are worked out with its action, on the state the action left, and travel with the
    /// sequenced action (the daemon journals them in the same transaction); a domain without effects has none.
    @Test func effectsAreWorkedOutOnTheStateTheActionLeft() throws {
        var sequencer = Sequencer(stores: [try DomainStore(Reminders.self, epoch: epoch)])
        let add = #"{"add":{"dueMilliseconds":1764234000000,"text":"call Ann"}}"#
        let complete = #"{"complete":{"id":1}}"#
        guard case let .commit(first) = sequencer.dispatch(try request(1, [add], store: "reminders")) else {
            Issue.record("expected a commit")
            return
        }
        #expect(
            first.events.map(\.effects) == [
                [
                    EffectRecord(
                        seq: 1,
                        index: 0,
                        kind: .schedule,
                        body: Array(#"{"flagOverdue":{"id":1}}"#.utf8),
                        key: "due-1",
                        dueMilliseconds: 1_764_234_000_000
                    )
                ]
            ]
        )
        // In a batch, each action's effects on the state the actions before it left.
        guard case let .commit(batch) = sequencer.dispatch(try request(2, [add, complete], store: "reminders")) else {
            Issue.record("expected a commit")
            return
        }
        #expect(
            batch.events.map { $0.effects.map(\.description) } == [
                [#"schedule {"flagOverdue":{"id":2}} at 1764234000000 as "due-2""#],
                [#"cancel "due-1""#, #"run {"notify":{"id":1,"text":"call Ann"}}"#],
            ]
        )
        #expect(batch.events[1].effects.map(\.seq) == [3, 3] && batch.events[1].effects.map(\.index) == [0, 1])
        // A rejected action sets nothing going.
        guard case .reply(.rejected) = sequencer.dispatch(try request(3, [complete], store: "reminders")) else {
            Issue.record("expected a rejection: reminder 1 is done")
            return
        }
        var plain = try self.sequencer()
        guard case let .commit(none) = plain.dispatch(try request(1, [#"{"add":{"number":5}}"#])) else {
            Issue.record("expected a commit")
            return
        }
        #expect(none.events.allSatisfy { $0.effects.isEmpty })
    }

    @Test func acceptsAndNumbersABatchInOrder() throws {
        var sequencer = try sequencer()
        guard
            case let .commit(commit) = sequencer.dispatch(
                try request(1, [#"{"add":{"number":5}}"#, #"{"add":{"number":6}}"#])
            )
        else {
            Issue.record("expected a commit")
            return
        }
        #expect(commit.events.map(\.seq) == [1, 2])
        #expect(
            commit.events.map(\.action) == [Array(#"{"add":{"number":5}}"#.utf8), Array(#"{"add":{"number":6}}"#.utf8)]
        )
        #expect(commit.reply == .accepted(requestID: 1, epoch: epoch, firstSeq: 1, count: 2))
        #expect(try numbers(sequencer) == [5, 6])
        guard case let .commit(next) = sequencer.dispatch(try request(2, [#"{"delete":{"index":0}}"#])) else {
            Issue.record("expected a commit")
            return
        }
        #expect(next.events.map(\.seq) == [3])
        #expect(try numbers(sequencer) == [6])
    }

    @Test func aBatchIsAllOrNone() throws {
        var sequencer = try sequencer()
        let decision = sequencer.dispatch(
            try request(1, [#"{"add":{"number":5}}"#, #"{"delete":{"index":4}}"#, #"{"add":{"number":6}}"#])
        )
        guard case let .reply(.rejected(requestID, index, rejection)) = decision else {
            Issue.record("expected a rejection, got \(decision)")
            return
        }
        #expect(requestID == 1)
        #expect(index == 1)
        #expect(rejection.code == "out_of_range")
        #expect(try numbers(sequencer) == [])
        #expect(sequencer.stores[try StoreName("numbers")]?.lastSeq == 0)
    }

    @Test func aRetryGetsTheFirstReplyAndIsNotAppliedTwice() throws {
        var sequencer = try sequencer()
        let first = sequencer.dispatch(try request(9, [#"{"add":{"number":1}}"#]))
        guard case let .commit(commit) = first else {
            Issue.record("expected a commit")
            return
        }
        guard case let .reply(again) = sequencer.dispatch(try request(9, [#"{"add":{"number":1}}"#])) else {
            Issue.record("a retry must not commit again")
            return
        }
        #expect(again == commit.reply)
        #expect(try numbers(sequencer) == [1])
        // A rejected request's retry gets the same rejection.
        let rejected = sequencer.dispatch(try request(10, [#"{"delete":{"index":3}}"#]))
        let retried = sequencer.dispatch(try request(10, [#"{"delete":{"index":3}}"#]))
        guard case let .reply(firstReply) = rejected, case let .reply(secondReply) = retried else {
            Issue.record("expected replies")
            return
        }
        #expect(firstReply == secondReply)
    }

    @Test func theSameKeyWithOtherActionsIsRefused() throws {
        var sequencer = try sequencer()
        _ = sequencer.dispatch(try request(3, [#"{"add":{"number":1}}"#]))
        let decision = sequencer.dispatch(try request(3, [#"{"add":{"number":2}}"#]))
        guard case let .reply(.error(_, error)) = decision else {
            Issue.record("expected an error, got \(decision)")
            return
        }
        #expect(error.code == .idempotencyConflict)
        #expect(try numbers(sequencer) == [1])
    }

    @Test(arguments: [
        (store: "nosuch", version: UInt32(1), action: #"{"add":{"number":1}}"#, code: ProtocolError.Code.unknownStore),
        (store: "numbers", version: UInt32(2), action: #"{"add":{"number":1}}"#, code: .domainVersionMismatch),
        (store: "numbers", version: UInt32(1), action: #"{"add":{"nomber":1}}"#, code: .undecodableAction),
        (store: "numbers", version: UInt32(1), action: "not json", code: .undecodableAction),
    ])
    func badRequestsGetAnErrorAndChangeNothing(
        store: String,
        version: UInt32,
        action: String,
        code: ProtocolError.Code
    )
        throws
    {
        var sequencer = try sequencer()
        let decision = sequencer.dispatch(try request(1, [action], store: store, version: version))
        guard case let .reply(.error(requestID, error)) = decision else {
            Issue.record("expected an error, got \(decision)")
            return
        }
        #expect(requestID == 1)
        #expect(error.code == code)
        #expect(!error.reason.isEmpty)
        #expect(try numbers(sequencer) == [])
        #expect(sequencer.idempotency.count == 0)
    }

    /// Bytes that mean the same action are journaled, published and fingerprinted as the same canonical bytes.
    @Test(arguments: [
        (sent: #"{ "increment" : { } }"#, store: "counter", canonical: #"{"increment":{}}"#),
        (sent: "{\"increment\":{}}\n", store: "counter", canonical: #"{"increment":{}}"#),
        (sent: #"{"add":{"number":1.0}}"#, store: "numbers", canonical: #"{"add":{"number":1}}"#),
        (sent: #"{"add":{"number":5e1}}"#, store: "numbers", canonical: #"{"add":{"number":50}}"#),
        (sent: #"{"fetched":{"numbers":[ 3, 1 ]}}"#, store: "numbers", canonical: #"{"fetched":{"numbers":[3,1]}}"#),
    ])
    func actionsAreTakenInCanonicalForm(sent: String, store: String, canonical: String) throws {
        var sequencer = try sequencer()
        guard case let .commit(commit) = sequencer.dispatch(try request(1, [sent], store: store)) else {
            Issue.record("expected a commit")
            return
        }
        #expect(commit.events.map(\.action) == [Array(canonical.utf8)])
        #expect(
            commit.fingerprint == Sequencer.fingerprint(store: try StoreName(store), actions: [Array(canonical.utf8)])
        )
        // A retry written another way is the same request: the first reply again, applied once.
        guard case let .reply(again) = sequencer.dispatch(try request(1, [canonical], store: store)) else {
            Issue.record("a retry in canonical form must not commit again")
            return
        }
        #expect(again == commit.reply)
        #expect(sequencer.stores[try StoreName(store)]?.lastSeq == 1)
    }

    /// What the domain would not keep as sent is refused, naming what and where; nothing is applied.
    @Test(arguments: [
        (sent: #"{"increment":{"by":2}}"#, says: "member 'increment.by' is not part of the type"),
        (
            sent: #"{"increment":{},"decrement":{}}"#,
            says:
                "an action is an object with one member, named after its case; this one has 2: 'decrement', 'increment'"
        ),
        // A case the domain does not have is named, and the domain's actions listed (from its generator).
        (
            sent: #"{"restock":{"sku":"x"}}"#,
            says: "it has no case named 'restock'; its actions include 'decrement', 'increment'"
        ),
        (sent: #"{"increment":{},"increment":{}}"#, says: "member 'increment' appears twice in one object"),
        (sent: #"{"increment":{}} x"#, says: "not valid JSON: unexpected bytes after the value at byte 17"),
    ])
    func actionsTheDomainWouldNotKeepAreRefused(sent: String, says: String) throws {
        var sequencer = try sequencer()
        let decision = sequencer.dispatch(try request(1, [sent], store: "counter"))
        guard case let .reply(.error(_, error)) = decision else {
            Issue.record("expected an error, got \(decision)")
            return
        }
        #expect(error.code == .undecodableAction)
        #expect(error.reason.contains(says), "\(error.reason)")
        #expect(sequencer.stores[try StoreName("counter")]?.lastSeq == 0)
        #expect(sequencer.idempotency.count == 0)
    }

    @Test func recoveryReplaysOnlyTheNextSeq() throws {
        var store = try DomainStore(Counter.self, epoch: epoch)
        try store.replay(SequencedAction(seq: 1, action: Array(#"{"increment":{}}"#.utf8)))
        #expect(throws: ProtocolError.self) {
            try store.replay(SequencedAction(seq: 3, action: Array(#"{"increment":{}}"#.utf8)))
        }
        #expect(store.lastSeq == 1)
        #expect(store.state.count == 1)
    }

    @Test func theIdempotencyCacheKeepsTheNewestEntries() throws {
        var cache = IdempotencyCache(capacity: 3)
        let entry = IdempotencyCache.Entry(
            fingerprint: StateDigest(of: [1]),
            reply: .accepted(requestID: 0, epoch: epoch, firstSeq: 1, count: 1)
        )
        for number: UInt64 in 1...10 { cache.insert(.init(client: client, requestNumber: number), entry) }
        #expect(cache.count == 3)
        #expect(cache[.init(client: client, requestNumber: 7)] == nil)
        #expect(cache[.init(client: client, requestNumber: 8)] == entry)
        #expect(cache[.init(client: client, requestNumber: 10)] == entry)
    }

    /// An entry is its fingerprint, its request id and an acceptance inline (64 bytes): the default window of 100,000
    /// is ~23 MB of dictionary buckets, not 29 (a rejection, rare, is boxed). Both replies come back as they went in.
    @Test func anIdempotencyEntryHoldsAnAcceptanceInline() {
        #expect(MemoryLayout<IdempotencyCache.Entry>.stride <= 64)
        let rejected = Reply.rejected(requestID: 7, actionIndex: 2, Rejection(code: "out_of_stock", "none left"))
        let accepted = Reply.accepted(requestID: 8, epoch: epoch, firstSeq: 5, count: 3)
        #expect(IdempotencyCache.Entry(fingerprint: StateDigest(of: [2]), reply: rejected).reply == rejected)
        #expect(IdempotencyCache.Entry(fingerprint: StateDigest(of: [3]), reply: accepted).reply == accepted)
    }
}
