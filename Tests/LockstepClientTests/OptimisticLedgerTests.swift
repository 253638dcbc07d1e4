import Lockstep
import LockstepClient
import LockstepExamples
import LockstepProtocol
import Testing

/// The optimistic ledger, transition by transition, on a clock the test moves (docs/testing.md lists them), and the
/// invariant every read keeps, over random runs of events.
@Suite struct OptimisticLedgerTests {
    typealias Ledger = OptimisticLedger<Numbers>

    let start = ContinuousClock.now
    func at(_ milliseconds: Int) -> ContinuousClock.Instant { start + .milliseconds(milliseconds) }
    let one = Epoch(rawValue: 1)
    let two = Epoch(rawValue: 2)

    func confirmed(
        _ numbers: [Int],
        seq: SequenceNumber,
        epoch: Epoch? = Epoch(rawValue: 1)
    ) -> Replicated<Numbers.State> {
        Replicated(epoch: epoch, seq: seq, state: Numbers.State(numbers: numbers))
    }

    /// A ledger on the confirmed state [1, 2] at seq 2 (confirmed change 1), nothing pending.
    func joined(pendingTimeout: Duration = .seconds(60), maximumPending: Int = 10) -> Ledger {
        var ledger = Ledger(
            base: Replicated(epoch: nil, seq: 0, state: Numbers.initialState),
            pendingTimeout: pendingTimeout,
            maximumPending: maximumPending
        )
        _ = ledger.confirmed(1, confirmed([1, 2], seq: 2))
        _ = ledger.catchUp()
        return ledger
    }

    /// Each action as one line, so a test states every action it expects, in order.
    func lines(_ actions: [Ledger.Action]) -> [String] {
        actions.map { action in
            switch action {
            case let .resolve(_, seqs): "resolve \(seqs)"
            case let .rollBack(number, _, _, error):
                "roll back #\(number) \((error as? ClientError)?.code.description ?? (error as? Rejection)?.code ?? "?")"
            case let .abandon(number): "abandon #\(number)"
            case let .publish(read): "publish v\(read.version)"
            }
        }
    }

    /// Re-derives the optimistic state from a read's base and pending list with the domain's own validate and
    /// reduce: what every read must agree with.
    static func rederived(_ read: OptimisticRead<Numbers>) -> (state: Numbers.State, leftOut: [Bool]) {
        var state = read.base.state
        var leftOut: [Bool] = []
        for entry in read.pending {
            var scratch = state
            var passes = true
            for action in entry.actions {
                guard (try? Numbers.validate(action, in: scratch)) != nil else {
                    passes = false
                    break
                }
                Numbers.reduce(into: &scratch, action)
            }
            leftOut.append(!passes)
            if passes { state = scratch }
        }
        return (state, leftOut)
    }

    @Test func nothingIsDispatchedBeforeTheFirstConfirmedState() {
        var ledger = Ledger(base: confirmed([], seq: 0, epoch: nil), pendingTimeout: .seconds(60), maximumPending: 10)
        #expect(throws: Ledger.Refusal.self) { try ledger.dispatch(1, [.add(number: 3)], outcome: .init(), now: at(0)) }
        #expect(ledger.entries.isEmpty)
    }

    @Test func aDispatchIsValidatedAppliedAndPendingAndRefusalsChangeNothing() throws {
        var ledger = joined(maximumPending: 2)
        let version = ledger.version
        #expect(try ledger.dispatch(1, [.delete(index: 1)], outcome: .init(), now: at(0)).isEmpty, "nobody watches")
        #expect(ledger.state.numbers == [1] && ledger.base.state.numbers == [1, 2])
        #expect(ledger.version == version + 1)
        #expect(ledger.status(of: 1) == .queued)
        // The validator runs on the optimistic state: index 1 is gone there.
        #expect {
            try ledger.dispatch(2, [.delete(index: 1)], outcome: .init(), now: at(0))
        } throws: { error in
            guard case let .rejected(rejection) = error as? Ledger.Refusal else { return false }
            return rejection.code == "out_of_range"
        }
        // A batch is validated in turn; the bound counts actions.
        #expect(throws: Ledger.Refusal.self) {
            try ledger.dispatch(3, [.add(number: 5), .add(number: 6)], outcome: .init(), now: at(0))
        }
        #expect(ledger.entries.map(\.number) == [1] && ledger.state.numbers == [1] && ledger.version == version + 1)
    }

    @Test func aSendIsCountedAndTheFirstSendSaysWhatTheReplicaHadHeard() throws {
        var ledger = joined()
        _ = try ledger.dispatch(1, [.add(number: 3)], outcome: .init(), now: at(0))
        _ = ledger.sent(1, heard: 1)
        _ = ledger.sent(1, heard: 4)
        #expect(ledger.status(of: 1) == .sent(tries: 2))
        #expect(ledger.entries[0].heardAtSend == 1)
    }

    @Test func anAcceptedDispatchIsConfirmedByTheRebaseThatHoldsIt() throws {
        var ledger = joined()
        let outcome = DispatchOutcome()
        _ = try ledger.dispatch(1, [.add(number: 3)], outcome: outcome, now: at(0))
        _ = ledger.sent(1, heard: 1)
        #expect(ledger.accepted(1, epoch: one, seqs: 3...3, confirmBy: at(10_000)).isEmpty)
        #expect(ledger.status(of: 1) == .accepted(epoch: one, seqs: 3...3))
        #expect(lines(ledger.confirmed(2, confirmed([1, 2, 3], seq: 3))) == ["resolve 3...3"])
        #expect(ledger.entries.isEmpty && ledger.base.seq == 3 && ledger.state.numbers == [1, 2, 3])
    }

    @Test func aRebaseWaitsForTheAnswerOfADispatchSentBeforeTheChangeArrived() throws {
        var ledger = joined()
        _ = try ledger.dispatch(1, [.add(number: 3)], outcome: .init(), now: at(0))
        _ = ledger.sent(1, heard: 1)
        // Change 2 may hold dispatch 1 (events do not say who sent them): the optimistic state stays on change 1.
        #expect(ledger.confirmed(2, confirmed([1, 2, 3], seq: 3)).isEmpty)
        #expect(ledger.baseNumber == 1 && ledger.state.numbers == [1, 2, 3], "not [1, 2, 3, 3]")
        // Its answer says it is seq 3: the rebase goes on, and it is confirmed.
        #expect(lines(ledger.accepted(1, epoch: one, seqs: 3...3, confirmBy: at(10_000))) == ["resolve 3...3"])
        #expect(ledger.baseNumber == 2 && ledger.entries.isEmpty && ledger.state.numbers == [1, 2, 3])
    }

    @Test func underASteadyStreamTheRebaseGoesAsFarAsNoUnansweredDispatchHoldsIt() throws {
        var ledger = joined()
        _ = try ledger.dispatch(1, [.add(number: 3)], outcome: .init(), now: at(0))
        _ = ledger.sent(1, heard: 1)
        _ = ledger.confirmed(2, confirmed([1, 2, 7], seq: 3))  // another process's 7: held, 1 may be in it
        _ = try ledger.dispatch(2, [.add(number: 4)], outcome: .init(), now: at(1))
        _ = ledger.sent(2, heard: 2)
        _ = ledger.confirmed(3, confirmed([1, 2, 7, 3], seq: 4))  // held by both
        // 1's answer: seq 4. Dispatch 2, sent after change 2 arrived, holds change 3 up, not change 2.
        _ = ledger.accepted(1, epoch: one, seqs: 4...4, confirmBy: at(10_000))
        #expect(ledger.baseNumber == 2 && ledger.status(of: 1) != nil, "1 is not in change 2: still pending")
        #expect(ledger.state.numbers == [1, 2, 7, 3, 4])
        // 2 could not be taken for now: in no history until sent again, it holds nothing up.
        #expect(lines(ledger.notTaken(2)) == ["resolve 4...4"])
        #expect(ledger.baseNumber == 3 && ledger.entries.map(\.number) == [2])
        #expect(ledger.state.numbers == [1, 2, 7, 3, 4])
    }

    @Test func aDispatchTheDaemonRejectedLeavesTheOptimisticState() throws {
        var ledger = joined()
        _ = try ledger.dispatch(1, [.delete(index: 0)], outcome: .init(), now: at(0))
        _ = try ledger.dispatch(2, [.add(number: 9)], outcome: .init(), now: at(0))
        let actions = ledger.rolledBack(1, Rejection(code: "out_of_range", "gone"))
        #expect(lines(actions) == ["roll back #1 out_of_range"])
        #expect(ledger.entries.map(\.number) == [2] && ledger.state.numbers == [1, 2, 9])
        #expect(ledger.rolledBack(1, Rejection(code: "x", "twice")).isEmpty, "once only")
    }

    @Test func aDispatchTheNewBaseNoLongerAllowsIsLeftOutWhole() throws {
        var ledger = joined()
        _ = try ledger.dispatch(1, [.delete(index: 1)], outcome: .init(), now: at(0))
        _ = try ledger.dispatch(2, [.add(number: 5)], outcome: .init(), now: at(0))
        _ = ledger.sent(1, heard: 1)
        _ = ledger.notTaken(1)
        // Another process deleted index 1 first: on [1] the delete no longer passes.
        _ = ledger.confirmed(2, confirmed([1], seq: 3))
        let read = ledger.read
        #expect(read.pending.map(\.isLeftOut) == [true, false])
        #expect(read.state.numbers == [1, 5])
    }

    @Test func anAcceptanceOfALostHistoryIsRolledBackOnceTheReplicaIsOnTheNewEpoch() throws {
        var ledger = joined()
        _ = try ledger.dispatch(1, [.add(number: 3)], outcome: .init(), now: at(0))
        _ = ledger.sent(1, heard: 1)
        _ = ledger.accepted(1, epoch: one, seqs: 3...3, confirmBy: at(10_000))
        // The daemon's journal was replaced: a new epoch without seq 3.
        let actions = ledger.confirmed(2, confirmed([], seq: 0, epoch: two))
        #expect(lines(actions) == ["roll back #1 not_applied"])
        #expect(ledger.entries.isEmpty && ledger.state.numbers == [])
    }

    @Test func aDispatchNotAcceptedWithinThePendingTimeoutIsGivenUpAndSentNoMore() throws {
        var ledger = joined(pendingTimeout: .seconds(3))
        _ = try ledger.dispatch(1, [.add(number: 3)], outcome: .init(), now: at(0))
        _ = try ledger.dispatch(2, [.add(number: 4)], outcome: .init(), now: at(1_000))
        #expect(ledger.nextDeadline == at(3_000))
        #expect(ledger.tick(now: at(2_999)).isEmpty)
        #expect(lines(ledger.tick(now: at(3_000))) == ["abandon #1", "roll back #1 unavailable"])
        #expect(ledger.state.numbers == [1, 2, 4] && ledger.nextDeadline == at(4_000))
    }

    @Test func anAcceptedDispatchNotAppliedInTimeIsRolledBackNotApplied() throws {
        var ledger = joined(pendingTimeout: .seconds(3))
        _ = try ledger.dispatch(1, [.add(number: 3)], outcome: .init(), now: at(0))
        _ = ledger.accepted(1, epoch: one, seqs: 3...3, confirmBy: at(10_000))
        // Accepted: the pending timeout no longer applies, the read-your-writes bound does.
        #expect(ledger.tick(now: at(5_000)).isEmpty)
        #expect(ledger.nextDeadline == at(10_000))
        #expect(lines(ledger.tick(now: at(10_000))) == ["roll back #1 not_applied"])
    }

    @Test func withNothingPendingAndNobodyWatchingTheOptimisticStateCatchesUpOnlyWhenAsked() throws {
        var ledger = joined()
        #expect(ledger.confirmed(2, confirmed([1, 2, 3], seq: 3)).isEmpty)
        #expect(ledger.baseNumber == 1, "not rebuilt on each confirmed change")
        _ = ledger.catchUp()
        #expect(ledger.baseNumber == 2 && ledger.state.numbers == [1, 2, 3])
        // A dispatch catches up before it is validated: index 2 exists only in change 3.
        _ = ledger.confirmed(3, confirmed([1, 2, 3, 4], seq: 4))
        _ = try ledger.dispatch(1, [.delete(index: 3)], outcome: .init(), now: at(0))
        #expect(ledger.state.numbers == [1, 2, 3])
    }

    @Test func anIdleLedgerLetsTheConfirmedStateGoAndTakesTheCurrentOneWhenADispatchComes() throws {
        var ledger = joined()
        ledger.letsIdleStateGo = true
        var local = confirmed([1, 2, 3], seq: 3)
        #expect(ledger.confirmed(2, local).isEmpty)
        // Not kept: the local store's next change then changes its state in place instead of copying it.
        let before = local.state.numbers.withUnsafeBufferPointer { $0.baseAddress }
        local.state.numbers[0] = 9
        #expect(local.state.numbers.withUnsafeBufferPointer { $0.baseAddress } == before)
        // A dispatch comes: the owner hands over the local store's state now, and the ledger rebases on it.
        ledger.restore(confirmed([1, 2, 3, 4], seq: 4))
        _ = try ledger.dispatch(1, [.delete(index: 3)], outcome: .init(), now: at(0))
        #expect(ledger.baseNumber == 2 && ledger.state.numbers == [1, 2, 3])
    }

    @Test func aWatcherGetsTheNewestReadAtOnceAndOnEveryChange() throws {
        var ledger = joined()
        _ = ledger.confirmed(2, confirmed([1, 2, 3], seq: 3))
        let first = lines(ledger.watch())
        #expect(first == ["publish v\(ledger.version)"] && ledger.baseNumber == 2)
        #expect(lines(ledger.confirmed(3, confirmed([1, 2, 3, 4], seq: 4))) == ["publish v\(ledger.version)"])
        #expect(lines(try ledger.dispatch(1, [.add(number: 5)], outcome: .init(), now: at(0))).count == 1)
        #expect(lines(ledger.sent(1, heard: 3)) == ["publish v\(ledger.version)"], "a status change is a new read")
        ledger.unwatch()
        #expect(ledger.sent(1, heard: 3).isEmpty)
    }

    @Test func aStopFailsEveryPendingDispatchAndShowsTheConfirmedState() throws {
        var ledger = joined()
        _ = try ledger.dispatch(1, [.add(number: 3)], outcome: .init(), now: at(0))
        _ = try ledger.dispatch(2, [.add(number: 4)], outcome: .init(), now: at(0))
        let actions = ledger.stop(ClientError(code: .stopped, "stopped"))
        #expect(lines(actions) == ["roll back #1 stopped", "roll back #2 stopped"])
        #expect(ledger.entries.isEmpty && ledger.state == ledger.base.state)
    }

    /// Random runs of every event, checking each read as a subscriber would: its state is its base with its pending
    /// dispatches re-applied by the domain's own validate and reduce, its left-out flags are those that fail, and
    /// nothing accepted at a seq the base holds is still pending. A model daemon sequences what was sent (and not
    /// refused for now since), and other processes' actions; its answers and its changes reach the ledger in any
    /// order, as reply and events do on their two sockets.
    @Test(arguments: 0..<20)
    func everyReadAgreesWithItself(seed: UInt64) throws {
        var random = SplitMix64(seed: seed)
        var ledger = joined(pendingTimeout: .seconds(5))
        var daemon = (numbers: [1, 2], seq: SequenceNumber(2))
        var change: UInt64 = 1
        var number: UInt64 = 0
        var clock = 0
        var committed: Set<UInt64> = []
        var answers: [(number: UInt64, seq: SequenceNumber?)] = []
        var violations: [String] = []
        func check(_ label: String) {
            let read = ledger.read
            let (state, leftOut) = Self.rederived(read)
            if state != read.state {
                violations.append("\(label): state \(read.state.numbers), rederived \(state.numbers)")
            }
            if leftOut != read.pending.map(\.isLeftOut) { violations.append("\(label): left out \(leftOut)") }
            for entry in read.pending {
                guard case let .accepted(epoch, seqs) = entry.status, epoch == read.base.epoch,
                    seqs.upperBound <= read.base.seq
                else { continue }
                violations.append("\(label): #\(entry.requestNumber) accepted at \(seqs), pending on \(read.base.seq)")
            }
        }
        for step in 0..<400 {
            clock += Int(random.next() % 50)
            switch random.next() % 9 {
            case 0, 1:
                number += 1
                let action: Numbers.Action =
                    random.next() % 2 == 0
                    ? .add(number: Int(random.next() % 9)) : .delete(index: Int(random.next() % 4))
                _ = try? ledger.dispatch(number, [action], outcome: .init(), now: at(clock))
            case 2:
                if let entry = ledger.entries.randomElement(using: &random) {
                    _ = ledger.sent(entry.number, heard: change)
                }
            case 3:
                // The daemon sequences the oldest dispatch sent and not refused since, if its validator allows it.
                guard
                    let entry = ledger.entries.first(where: {
                        $0.heardAtSend != nil && !committed.contains($0.number)
                    }), let action = entry.actions.first
                else { break }
                committed.insert(entry.number)
                guard (try? Numbers.validate(action, in: Numbers.State(numbers: daemon.numbers))) != nil else {
                    answers.append((entry.number, nil))
                    break
                }
                var state = Numbers.State(numbers: daemon.numbers)
                Numbers.reduce(into: &state, action)
                daemon = (state.numbers, daemon.seq + 1)
                answers.append((entry.number, daemon.seq))
            case 4:
                daemon = (daemon.numbers + [Int(random.next() % 9)], daemon.seq + 1)
            case 5:
                change += 1
                _ = ledger.confirmed(change, confirmed(daemon.numbers, seq: daemon.seq))
            case 6:
                guard !answers.isEmpty else { break }
                let answer = answers.removeFirst()
                if let seq = answer.seq {
                    _ = ledger.accepted(answer.number, epoch: one, seqs: seq...seq, confirmBy: at(clock + 60_000))
                } else {
                    _ = ledger.rolledBack(answer.number, Rejection(code: "out_of_range", "gone"))
                }
            case 7:
                if let entry = ledger.entries.first(where: { !committed.contains($0.number) }) {
                    _ = ledger.notTaken(entry.number)
                }
            default:
                _ = ledger.tick(now: at(clock))
            }
            check("seed \(seed) step \(step)")
        }
        let agreed = violations.isEmpty
        #expect(agreed, "\(violations.count) violations; the first: \(violations.prefix(3))")
    }

    /// The check catches a read that does not agree with itself: one pending dispatch dropped from the list while
    /// its effect stays in the state.
    @Test func theCheckCatchesAReadMissingAPendingDispatch() throws {
        var ledger = joined()
        _ = try ledger.dispatch(1, [.add(number: 3)], outcome: .init(), now: at(0))
        _ = try ledger.dispatch(2, [.add(number: 4)], outcome: .init(), now: at(0))
        var broken = ledger.read
        #expect(Self.rederived(broken).state == broken.state)
        broken.pending.removeFirst()
        #expect(Self.rederived(broken).state != broken.state)
    }
}
