import Lockstep
import LockstepProtocol
import Testing

/// The one request/retry machine of `CommandClient` and the replica's dispatcher, stated step by step.
@Suite struct LazyPirateTests {
    let start = ContinuousClock.now
    let settings = LazyPirate<String>.Settings(timeout: .seconds(2), retries: 2)

    func status(_ id: UInt64) -> Request { .status(requestID: id) }

    /// The outputs as text, so each test states every step it expects.
    func describe(_ outputs: [LazyPirate<String>.Output]) -> [String] {
        outputs.map {
            switch $0 {
            case let .send(request): "send \(request.requestID)"
            case .renewSocket: "renew"
            case let .gaveUp(request, payload, tries): "gave up \(request.requestID) (\(payload)) after \(tries)"
            }
        }
    }

    @Test func aRequestIsSentAndItsReplyEndsIt() {
        var pirate = LazyPirate<String>(settings)
        #expect(describe(pirate.submit(status(1), "a", now: start)) == ["send 1"])
        #expect(pirate.nextDeadline == start + .seconds(2))
        #expect(describe(pirate.tick(now: start + .seconds(1))) == [])
        #expect(pirate.answered(1)?.payload == "a")
        #expect(pirate.count == 0)
        #expect(pirate.nextDeadline == nil)
        // A late reply to it, or a reply to a request never sent, is no one's.
        #expect(pirate.answered(1) == nil)
        #expect(pirate.answered(7) == nil)
    }

    @Test func aCancelledRequestIsNeverSentAgain() {
        var pirate = LazyPirate<String>(settings)
        _ = pirate.submit(status(1), "a", now: start)
        _ = pirate.submit(status(2), "b", now: start)
        #expect(pirate.cancel(1)?.payload == "a")
        #expect(pirate.cancel(1) == nil)
        #expect(describe(pirate.tick(now: start + .seconds(2))) == ["renew", "send 2"])
        #expect(describe(pirate.redirect(now: start + .seconds(3), pause: .zero)) == ["send 2"])
    }

    @Test func silenceRenewsTheSocketAndSendsTheSameRequestUntilTheTriesRunOut() {
        var pirate = LazyPirate<String>(settings)
        _ = pirate.submit(status(1), "a", now: start)
        #expect(describe(pirate.tick(now: start + .seconds(2))) == ["renew", "send 1"])
        #expect(pirate.nextDeadline == start + .seconds(4))
        #expect(describe(pirate.tick(now: start + .seconds(4))) == ["renew", "send 1"])
        #expect(describe(pirate.tick(now: start + .seconds(6))) == ["gave up 1 (a) after 3", "renew"])
        #expect(pirate.count == 0)
    }

    @Test func everyRequestInFlightGoesOutAgainOnTheFreshSocketWithItsOwnTries() {
        var pirate = LazyPirate<String>(settings)
        _ = pirate.submit(status(2), "b", now: start)
        _ = pirate.submit(status(1), "a", now: start + .seconds(1))
        // Request 2's silence renews the socket; request 1, not yet late, goes out again on it too, in id order.
        #expect(describe(pirate.tick(now: start + .seconds(2))) == ["renew", "send 1", "send 2"])
        #expect(describe(pirate.tick(now: start + .seconds(4))) == ["renew", "send 1", "send 2"])
        // Only a request whose own wait ran out spends a try: 1 went out early at 2 s, so it has one left.
        #expect(describe(pirate.tick(now: start + .seconds(6))) == ["gave up 2 (b) after 3", "renew", "send 1"])
        #expect(describe(pirate.tick(now: start + .seconds(8))) == ["gave up 1 (a) after 3", "renew"])
        #expect(pirate.count == 0)
    }

    @Test func noRetriesGivesUpAtTheFirstSilence() {
        var pirate = LazyPirate<String>(.init(timeout: .milliseconds(300), retries: 0))
        _ = pirate.submit(status(5), "e", now: start)
        #expect(describe(pirate.tick(now: start + .milliseconds(300))) == ["gave up 5 (e) after 1", "renew"])
    }

    @Test func aRedirectSendsWhatIsInFlightAgainWithoutEndingATry() {
        var pirate = LazyPirate<String>(settings)
        _ = pirate.submit(status(1), "a", now: start)
        _ = pirate.submit(status(2), "b", now: start + .milliseconds(500))
        // A `not_leader` with another daemon left to ask: at once, on the owner's new socket.
        #expect(describe(pirate.redirect(now: start + .seconds(1), pause: .zero)) == ["send 1", "send 2"])
        #expect(pirate.nextDeadline == start + .seconds(2))
        // With a pause: nothing now, both when it is over.
        #expect(describe(pirate.redirect(now: start + .milliseconds(1_100), pause: .milliseconds(200))) == [])
        #expect(pirate.nextDeadline == start + .milliseconds(1_300))
        #expect(describe(pirate.tick(now: start + .milliseconds(1_200))) == [])
        #expect(describe(pirate.tick(now: start + .milliseconds(1_300))) == ["send 1", "send 2"])
        #expect(describe(pirate.tick(now: start + .milliseconds(1_400))) == [])
        // The tries ran on meanwhile: request 1's first try ends at 2 s, as if nothing had been answered.
        #expect(describe(pirate.tick(now: start + .seconds(2))) == ["renew", "send 1", "send 2"])
        // A try's end during a pause sends at once, and the pause is over.
        _ = pirate.redirect(now: start + .milliseconds(3_900), pause: .milliseconds(200))
        #expect(describe(pirate.tick(now: start + .seconds(4))) == ["renew", "send 1", "send 2"])
        #expect(describe(pirate.tick(now: start + .milliseconds(4_100))) == [])
    }

    @Test func aRedirectWithNothingInFlightLeavesNoResendBehind() {
        var pirate = LazyPirate<String>(settings)
        #expect(describe(pirate.redirect(now: start, pause: .milliseconds(200))) == [])
        #expect(pirate.nextDeadline == nil)
        // A request submitted during that pause goes out once.
        #expect(describe(pirate.submit(status(1), "a", now: start + .milliseconds(100))) == ["send 1"])
        #expect(describe(pirate.tick(now: start + .milliseconds(300))) == [])
    }

    @Test func removeAllHandsBackEveryPayloadInIdOrder() {
        var pirate = LazyPirate<String>(settings)
        _ = pirate.submit(status(3), "c", now: start)
        _ = pirate.submit(status(1), "a", now: start)
        #expect(pirate.removeAll().map(\.payload) == ["a", "c"])
        #expect(pirate.count == 0)
    }
}
