import LockstepJournal
import LockstepServer
import Testing

/// The leader's effects and timers, decision by decision, on clocks the test moves (docs/effects.md).
@Suite(.timeLimit(.minutes(1))) struct EffectLedgerTests {
    let start = ContinuousClock.now
    func at(_ milliseconds: Int) -> ContinuousClock.Instant { start + .milliseconds(milliseconds) }

    let policy = EffectLedger.Policy(
        maximumRunning: 2,
        maximumAttempts: 3,
        timeout: .seconds(1),
        backoff: .milliseconds(100),
        maximumBackoff: .milliseconds(150)
    )

    func effect(_ seq: UInt64, _ index: Int = 0, store: String = "s") -> JournalEffect {
        JournalEffect(store: store, seq: seq, index: index, body: Array(#"{"e":\#(seq)}"#.utf8))
    }

    func timer(_ key: String, due: Int64, seq: UInt64 = 1) -> JournalTimer {
        JournalTimer(
            store: "s",
            key: key,
            dueMilliseconds: due,
            action: Array(#"{"fire":"\#(key)"}"#.utf8),
            seq: seq,
            index: 0
        )
    }

    /// The ids of the runs among `actions`, with their attempt.
    func runs(_ actions: [EffectLedger.Action]) -> [String] {
        actions.compactMap { if case let .run(id, _, attempt) = $0 { "\(id)#\(attempt)" } else { nil } }
    }

    @Test func anEffectRunsOnlyOnceItsActionIsDurable() {
        var ledger = EffectLedger(outbox: JournalOutbox(), policy: policy, now: at(0))
        ledger.sequenced([effect(1)], timers: [], now: at(0))
        #expect(runs(ledger.tick(now: at(10), wallMilliseconds: 0)).isEmpty, "not committed yet")
        #expect(ledger.nextDeadline(now: at(0)).monotonic == nil, "nothing to wake for before the commit")
        ledger.committed([effect(1).id], now: at(20))
        #expect(runs(ledger.tick(now: at(20), wallMilliseconds: 0)) == ["s/1/0#1"])
        #expect(runs(ledger.tick(now: at(30), wallMilliseconds: 0)).isEmpty, "running: not started twice")
    }

    /// Idle — nothing runs, waits or is set — is what lets a daemon whose domains set nothing going skip the
    /// ledger on every turn; anything the ledger would act on makes it busy.
    @Test func theLedgerIsIdleOnlyWhileNothingRunsWaitsOrIsSet() {
        var ledger = EffectLedger(outbox: JournalOutbox(), policy: policy, now: at(0))
        #expect(ledger.isIdle)
        ledger.sequenced([effect(1)], timers: [], now: at(0))
        ledger.committed([effect(1).id], now: at(1))
        #expect(!ledger.isIdle, "an effect free to run")
        #expect(runs(ledger.tick(now: at(1), wallMilliseconds: 0)) == ["s/1/0#1"])
        #expect(!ledger.isIdle, "a run whose outcome or timeout is awaited")
        _ = ledger.finished(effect(1).id, attempt: 1, .failure(EffectFailure("down")), now: at(2))
        #expect(!ledger.isIdle, "a retry after its backoff")
        _ = ledger.tick(now: at(102), wallMilliseconds: 0)
        _ = ledger.finished(effect(1).id, attempt: 2, .success([]), now: at(103))
        #expect(ledger.isIdle)
        ledger.sequenced([], timers: [.set(timer("t", due: 50))], now: at(104))
        #expect(!ledger.isIdle, "a timer set")
    }

    @Test func noMoreThanTheLimitRunAtOnceAndTheRestFollowAsRunsEnd() {
        var ledger = EffectLedger(
            outbox: JournalOutbox(effects: [effect(1), effect(2), effect(3)]),
            policy: policy,
            now: at(0)
        )
        #expect(runs(ledger.tick(now: at(0), wallMilliseconds: 0)) == ["s/1/0#1", "s/2/0#1"])
        #expect(ledger.running == 2)
        let done = ledger.finished(effect(1).id, attempt: 1, .success([Array(#"{"a":1}"#.utf8)]), now: at(5))
        #expect(done == [.complete(effect(1).id, actions: [Array(#"{"a":1}"#.utf8)])])
        #expect(runs(ledger.tick(now: at(5), wallMilliseconds: 0)) == ["s/3/0#1"])
    }

    @Test func aFailedRunIsTriedAgainAfterABackoffThatDoublesUpToItsCapThenGivenUp() {
        var ledger = EffectLedger(outbox: JournalOutbox(effects: [effect(1)]), policy: policy, now: at(0))
        let id = effect(1).id
        #expect(runs(ledger.tick(now: at(0), wallMilliseconds: 0)) == ["s/1/0#1"])
        let first = ledger.finished(id, attempt: 1, .failure(EffectFailure("down")), now: at(10))
        #expect(
            first == [
                .failed(id, attempt: 1, error: "down", givenUp: false),
                .journal(JournalEffectUpdate(id, .failed(attempts: 1, error: "down", dead: false))),
            ]
        )
        #expect(runs(ledger.tick(now: at(109), wallMilliseconds: 0)).isEmpty, "waits 100 ms")
        #expect(ledger.nextDeadline(now: at(0)).monotonic == at(110))
        #expect(runs(ledger.tick(now: at(110), wallMilliseconds: 0)) == ["s/1/0#2"])
        _ = ledger.finished(id, attempt: 2, .failure(EffectFailure("down")), now: at(200))
        #expect(runs(ledger.tick(now: at(349), wallMilliseconds: 0)).isEmpty, "waits 200 ms, capped at 150")
        #expect(runs(ledger.tick(now: at(350), wallMilliseconds: 0)) == ["s/1/0#3"])
        let last = ledger.finished(id, attempt: 3, .failure(EffectFailure("down")), now: at(400))
        #expect(last.contains(.journal(JournalEffectUpdate(id, .failed(attempts: 3, error: "down", dead: true)))))
        #expect(ledger.effects[id]?.phase == .dead)
        #expect(runs(ledger.tick(now: at(100_000), wallMilliseconds: 0)).isEmpty, "a dead letter never runs")
        #expect(ledger.counts()["s"]?.dead == 1)
    }

    @Test func aPermanentFailureIsGivenUpAtOnce() {
        var ledger = EffectLedger(outbox: JournalOutbox(effects: [effect(1)]), policy: policy, now: at(0))
        _ = ledger.tick(now: at(0), wallMilliseconds: 0)
        let actions = ledger.finished(
            effect(1).id,
            attempt: 1,
            .failure(EffectFailure("unreadable", permanent: true)),
            now: at(1)
        )
        #expect(actions.contains(.failed(effect(1).id, attempt: 1, error: "unreadable", givenUp: true)))
        #expect(ledger.effects[effect(1).id]?.phase == .dead)
    }

    @Test func aRunPastItsTimeoutFailsAndItsLateAnswerChangesNothing() {
        var ledger = EffectLedger(outbox: JournalOutbox(effects: [effect(1)]), policy: policy, now: at(0))
        let id = effect(1).id
        _ = ledger.tick(now: at(0), wallMilliseconds: 0)
        #expect(ledger.nextDeadline(now: at(0)).monotonic == at(1_000))
        let timedOut = ledger.tick(now: at(1_000), wallMilliseconds: 0)
        #expect(timedOut.contains(.failed(id, attempt: 1, error: "no answer within 1.0 seconds", givenUp: false)))
        #expect(ledger.finished(id, attempt: 1, .success([]), now: at(1_050)).isEmpty, "attempt 1 was given up on")
        #expect(runs(ledger.tick(now: at(1_100), wallMilliseconds: 0)) == ["s/1/0#2"])
        #expect(ledger.finished(id, attempt: 2, .success([]), now: at(1_200)) == [.complete(id, actions: [])])
        #expect(
            ledger.finished(id, attempt: 2, .success([]), now: at(1_300)).isEmpty,
            "done: a second answer is ignored"
        )
    }

    @Test func timersFireOnceWhenTheWallClockReachesThemInDueOrder() {
        var ledger = EffectLedger(
            outbox: JournalOutbox(timers: [timer("b", due: 2_000), timer("a", due: 1_000)]),
            policy: policy,
            now: at(0)
        )
        #expect(ledger.nextDeadline(now: at(0)).wallMilliseconds == 1_000)
        #expect(ledger.tick(now: at(0), wallMilliseconds: 999).isEmpty)
        #expect(
            ledger.tick(now: at(0), wallMilliseconds: 5_000) == [
                .fire(timer("a", due: 1_000)), .fire(timer("b", due: 2_000)),
            ]
        )
        #expect(ledger.tick(now: at(0), wallMilliseconds: 9_000).isEmpty, "each fires once")
        #expect(ledger.nextDeadline(now: at(0)).wallMilliseconds == nil)
    }

    @Test func aTimerSetAgainUnderItsKeyReplacesItAndACancelRemovesIt() {
        var ledger = EffectLedger(outbox: JournalOutbox(), policy: policy, now: at(0))
        ledger.sequenced([], timers: [.set(timer("a", due: 1_000))], now: at(0))
        ledger.sequenced([], timers: [.set(timer("a", due: 3_000, seq: 2))], now: at(0))
        #expect(ledger.tick(now: at(0), wallMilliseconds: 2_000).isEmpty, "moved to 3000")
        ledger.sequenced([], timers: [.remove(store: "s", key: "a")], now: at(0))
        #expect(ledger.tick(now: at(0), wallMilliseconds: 10_000).isEmpty, "cancelled")
    }

    @Test func aDeadLetterIsRetriedByHandAndAWaitingOneDroppedButARunningOneIsNot() {
        var outbox = JournalOutbox(effects: [effect(1), effect(2)])
        outbox.effects[0].dead = true
        outbox.effects[0].attempts = 3
        var ledger = EffectLedger(outbox: outbox, policy: policy, now: at(0))
        #expect(ledger.retry(effect(2).id, now: at(0)) == nil, "not a dead letter")
        #expect(ledger.retry(effect(1).id, now: at(0)) == [.journal(JournalEffectUpdate(effect(1).id, .retry))])
        // Its tries start again, behind the effect that was waiting already.
        #expect(runs(ledger.tick(now: at(0), wallMilliseconds: 0)) == ["s/2/0#1", "s/1/0#1"])
        #expect(ledger.drop(effect(1).id) == nil, "running")
        #expect(ledger.refusal(effect(1).id, retrying: false).contains("running"))
        _ = ledger.finished(effect(2).id, attempt: 1, .failure(EffectFailure("down")), now: at(1))
        #expect(ledger.drop(effect(2).id) == [.journal(JournalEffectUpdate(effect(2).id, .drop))])
        #expect(ledger.effects[effect(2).id] == nil)
        #expect(ledger.refusal(effect(2).id, retrying: true).contains("no effect s/2/0"))
        #expect(ledger.listing().effects.map(\.id) == ["s/1/0"])
    }

    @Test func effectIDsReadBackAsTheyAreWrittenAndNothingElseDoes() {
        #expect(JournalEffectID("reminders/12/0") == JournalEffectID(store: "reminders", seq: 12, index: 0))
        for bad in [
            "", "reminders", "reminders/12", "/12/0", "reminders/-1/0", "reminders/12/-1", "reminders/012/0", "a/1/2/3",
        ] {
            #expect(JournalEffectID(bad) == nil, "\(bad)")
        }
    }

    @Test func effectsRunInTheOrderTheirActionsBecameDurableAndADroppedOneIsSkipped() {
        var ledger = EffectLedger(outbox: JournalOutbox(), policy: policy, now: at(0))
        let effects = (1...2_000).map { effect(UInt64($0)) }
        ledger.sequenced(effects, timers: [], now: at(0))
        ledger.committed(effects.suffix(1_000).map(\.id), now: at(1))
        ledger.committed(effects.prefix(1_000).map(\.id), now: at(2))
        #expect(ledger.drop(effect(1_001).id) != nil)
        var order: [String] = []
        // Each turn's runs end at once; a bounded number of turns, however the ledger behaves.
        for turn in 0..<2_000 {
            let started = runs(ledger.tick(now: at(3 + turn), wallMilliseconds: 0))
            if started.isEmpty { break }
            for run in started {
                order.append(run)
                let id = JournalEffectID(String(run.prefix { $0 != "#" }))!
                _ = ledger.finished(id, attempt: 1, .success([]), now: at(3 + turn))
            }
        }
        #expect(order.count == 1_999, "every effect but the dropped one ran once")
        #expect(Set(order).count == order.count)
        #expect(order.prefix(2) == ["s/1002/0#1", "s/1003/0#1"], "the first committed first, the dropped skipped")
        #expect(order.last == "s/1000/0#1" && !order.contains("s/1001/0#1"))
    }
}
