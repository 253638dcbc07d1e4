import Foundation
import Lockstep
import LockstepExamples
import LockstepProtocol
import LockstepTesting
import ReplayFixtures
import TestSupport
import Testing

/// The harness's child replica, built next to the test bundle.
func fixtureChild() -> ReplayChildCommand {
    ReplayChildCommand(executable: productURL("replay-fixtures").path, arguments: [], timeout: .seconds(60))
}

/// Replays `actions` and returns the divergence the harness must find.
///
/// It takes `sourceLocation` as the async overload below does: were that the only one of the two with a default
/// argument left over, an async test that gives every other argument would call this one, on the cooperative pool.
func expectDivergence<D: Domain>(
    _: D.Type,
    _ actions: [D.Action],
    settings: ReplaySettings = ReplaySettings(),
    children: [ReplayChildCommand] = [],
    sourceLocation: SourceLocation = #_sourceLocation
) throws -> Divergence? {
    let harness = ReplayHarness<D>(settings: settings, children: children)
    do {
        _ = try harness.replay(try ReplayLog<D>(actions))
        Issue.record("\(D.name): the harness found no divergence", sourceLocation: sourceLocation)
        return nil
    } catch let divergence as Divergence {
        return divergence
    }
}

/// The same for a replay with child processes, which the harness waits for: the replay runs on a thread of its
/// own (`offPool`), not on one of the cooperative pool, and the issue is recorded in the test's task.
func expectDivergence<D: Domain>(
    _: D.Type,
    _ actions: [D.Action],
    settings: ReplaySettings = ReplaySettings(),
    children: [ReplayChildCommand] = [],
    sourceLocation: SourceLocation = #_sourceLocation
) async throws -> Divergence? {
    let found = try await onCheckThread { () throws -> Divergence? in
        do {
            _ = try ReplayHarness<D>(settings: settings, children: children).replay(try ReplayLog<D>(actions))
            return nil
        } catch let divergence as Divergence {
            return divergence
        }
    }
    if found == nil { Issue.record("\(D.name): the harness found no divergence", sourceLocation: sourceLocation) }
    return found
}

@Suite struct ReplayHarnessTests {
    @Test func readingTheClockIsCaughtAtTheFirstAction() throws {
        let divergence = try #require(try expectDivergence(ClockDomain.self, Array(repeating: .stamp, count: 5)))
        #expect(divergence.seq == 1)
        #expect(divergence.action == #"{"stamp":{}}"#)
        #expect(divergence.differences.map(\.path) == ["stamps[0]"])
    }

    @Test func randomNumbersAreCaughtAtTheFirstAction() throws {
        let divergence = try #require(try expectDivergence(DiceDomain.self, Array(repeating: .roll, count: 5)))
        #expect(divergence.seq == 1)
        #expect(divergence.differences.map(\.path) == ["rolls[0]"])
    }

    @Test func setOrderIsCaughtInAnotherProcess() async throws {
        // Three plain actions, then a Set of 20 tags: its encoded order depends on the hash seed.
        let actions: [TagsDomain.Action] = [.count, .count, .count, .tag((0..<20).map { "tag-\($0)" }), .count]
        let divergence = try #require(
            try await expectDivergence(TagsDomain.self, actions, children: [fixtureChild()])
        )
        #expect(divergence.seq == 4)
        #expect(divergence.action.hasPrefix(#"{"tag":"#))
        #expect(!divergence.differences.isEmpty)
        #expect(divergence.differences.allSatisfy { $0.path.hasPrefix("tags[") })
    }

    @Test func stateLostInARoundTripIsCaughtWhereItIsFirstUsed() throws {
        var settings = ReplaySettings()
        settings.roundTripRate = 0
        settings.roundTripAt = [3]
        let actions: [LossyDomain.Action] = [.add(5), .add(3), .add(1), .repeatLast, .repeatLast]
        let exact = try #require(try expectDivergence(LossyDomain.self, actions, settings: settings))
        // The round trip after seq 3 loses `lastAmount = 1`, and seq 4 is the first action to read it.
        #expect(exact.seq == 4)
        #expect(exact.action == #"{"repeatLast":{}}"#)
        #expect(exact.differences == [StateDifference(path: "total", left: .integer(10), right: .integer(9))])
    }

    @Test func aSharedReferenceIsCaughtAtTheFirstAction() throws {
        let divergence = try #require(try expectDivergence(TallyDomain.self, Array(repeating: .bump, count: 3)))
        #expect(divergence.seq == 1)
        #expect(divergence.differences == [StateDifference(path: "tally.count", left: .integer(0), right: .integer(1))])
    }

    @Test func aDivergenceThroughProcessHistoryIsShownFromTheFirstRunAndSaidNotToReproduce() throws {
        // Keys no other test used: the cache outlives every store of this process.
        let key = "k-\(UUID().uuidString.prefix(8))"
        let actions: [WarmCacheDomain.Action] = [.look("\(key)-a"), .look("\(key)-a"), .look("\(key)-b")]
        let divergence = try #require(try expectDivergence(WarmCacheDomain.self, actions))
        #expect(divergence.seq == 1)
        #expect(!divergence.reproduced)
        #expect(divergence.rerunAfter == 0)
        // The first run's states: the reference met the key cold, the next replica warm.
        #expect(divergence.leftDigest != divergence.rightDigest)
        #expect(
            divergence.differences == [
                StateDifference(path: "lookups[0]", left: .string("\(key)-a cold"), right: .string("\(key)-a warm"))
            ]
        )
        #expect(divergence.description.contains("did not part at or before seq 1"))
        #expect(divergence.description.contains("process history or global state"))
        #expect(!divergence.description.contains("the decoded states are equal"))
    }

    @Test func aReproducibleDivergenceIsNotSaidToDependOnHistory() throws {
        let divergence = try #require(try expectDivergence(DiceDomain.self, Array(repeating: .roll, count: 3)))
        #expect(divergence.reproduced)
        #expect(!divergence.description.contains("process history"))
    }

    @Test func sparseCheckpointsStillNameTheFirstDivergentSeq() throws {
        var settings = ReplaySettings()
        settings.checkpointInterval = 50
        settings.roundTripRate = 0
        settings.roundTripAt = [120]
        let actions: [LossyDomain.Action] = (1...200).map { $0 == 121 ? .repeatLast : .add(1) }
        let divergence = try #require(try expectDivergence(LossyDomain.self, actions, settings: settings))
        #expect(divergence.seq == 121)
    }

    @Test func divergenceReadsWellInATerminalAndAsJSON() throws {
        let divergence = try #require(try expectDivergence(TallyDomain.self, [.bump]))
        #expect(divergence.description.contains("divergence at seq 1"))
        #expect(divergence.description.contains("tally.count: 0 ≠ 1"))
        let object = try JSONSerialization.jsonObject(with: Data(divergence.json.utf8)) as? [String: Any]
        #expect(object?["seq"] as? Int == 1)
    }

    @Test(arguments: Examples.domains.map { $0.name })
    func exampleDomainsPassInAndAcrossProcesses(store: String) async throws {
        let domain = try #require(Examples.domain(named: store))
        // The check waits for its child processes: on the check thread, not on one of the cooperative pool.
        try await onCheckThread { try check(domain) }
    }

    func check<D: ActionGenerating>(_: D.Type) throws {
        var check = DeterminismCheck(D.self, children: [fixtureChild()])
        check.sequences = 3
        check.length = 300
        try check.run()
    }

    @Test func effectsThatReadTheClockAreCaughtAtTheFirstActionThatSetsThemGoing() throws {
        let actions: [ClockEffectsDomain.Action] = [.note, .note, .stamp, .note, .stamp]
        let divergence = try #require(try expectDivergence(ClockEffectsDomain.self, actions))
        #expect(divergence.seq == 3)
        #expect(divergence.action == #"{"stamp":{}}"#)
        #expect(divergence.reproduced)
        // The states agree: only the effect differs, and the report says which.
        #expect(divergence.differences.isEmpty)
        #expect(divergence.leftDigest == divergence.rightDigest)
        #expect(divergence.leftEffectsDigest != divergence.rightEffectsDigest)
        #expect(divergence.effectDifferences.map(\.path) == ["[0].body.stamp.nanos"])
        #expect(divergence.leftEffects?.count == 1)
        #expect(divergence.rightEffects?.first?.hasPrefix(#"run {"stamp":{"nanos":"#) == true)
        #expect(divergence.description.contains("effects differ (the states are equal)"))
        #expect(divergence.description.contains("effects[0].body.stamp.nanos: "))
        #expect(!divergence.description.contains("the decoded states are equal"))
    }

    @Test func timerKeysFromACounterAreCaughtAtTheFirstActionThatSetsOne() throws {
        let actions: [TicketDomain.Action] = [.quiet, .remind, .quiet, .remind]
        let divergence = try #require(try expectDivergence(TicketDomain.self, actions))
        #expect(divergence.seq == 2)
        #expect(divergence.differences.isEmpty)
        #expect(divergence.effectDifferences.map(\.path) == ["[0].key"])
        #expect(divergence.leftEffects?.first?.hasPrefix(#"schedule {"ring":{}} at 1764234000000 as "ticket-"#) == true)
    }

    @Test func effectsThatReadTheClockAreCaughtInAnotherProcess() async throws {
        var settings = ReplaySettings()
        settings.replicas = 1  // the reference alone here: only the child can part from it
        let actions: [ClockEffectsDomain.Action] = [.note, .stamp, .note]
        let divergence = try #require(
            try await expectDivergence(ClockEffectsDomain.self, actions, settings: settings, children: [fixtureChild()])
        )
        #expect(divergence.seq == 2)
        #expect(divergence.right == "replica 1 (child process)")
        #expect(divergence.reproduced)
        #expect(divergence.differences.isEmpty)
        #expect(divergence.effectDifferences.map(\.path) == ["[0].body.stamp.nanos"])
        #expect(divergence.rightEffects?.count == 1)
    }

    @Test func timerKeysFromACounterAreCaughtInAnotherProcess() async throws {
        // A fresh child's counter starts where this process's did: move this one on, as any process that has done
        // something has, so that the two draw other tickets for the same action.
        _ = TicketDomain.nextTicket()
        var settings = ReplaySettings()
        settings.replicas = 1
        let actions: [TicketDomain.Action] = [.quiet, .quiet, .remind]
        let divergence = try #require(
            try await expectDivergence(TicketDomain.self, actions, settings: settings, children: [fixtureChild()])
        )
        #expect(divergence.seq == 3)
        #expect(divergence.right == "replica 1 (child process)")
        #expect(divergence.effectDifferences.map(\.path) == ["[0].key"])
    }

    @Test func sparseCheckpointsStillNameTheFirstSeqWhoseEffectsDiffer() async throws {
        var settings = ReplaySettings()
        settings.checkpointInterval = 50
        let actions: [ClockEffectsDomain.Action] = (1...200).map { $0 == 121 ? .stamp : .note }
        let here = try #require(try await expectDivergence(ClockEffectsDomain.self, actions, settings: settings))
        #expect(here.seq == 121)
        #expect(here.effectDifferences.map(\.path) == ["[0].body.stamp.nanos"])
        settings.replicas = 1
        let across = try #require(
            try await expectDivergence(ClockEffectsDomain.self, actions, settings: settings, children: [fixtureChild()])
        )
        #expect(across.seq == 121)
        #expect(across.right == "replica 1 (child process)")
        #expect(across.effectDifferences.map(\.path) == ["[0].body.stamp.nanos"])
    }

    @Test func effectsThroughProcessHistoryAreShownFromTheFirstRunAndSaidNotToReproduce() throws {
        // A name no other test used: the cache outlives every store of this process. With a checkpoint every 10
        // actions, the first run parts at seq 10, whose own action set nothing going: the report says the effects
        // of an earlier action differ.
        let name = "n-\(UUID().uuidString.prefix(8))"
        var settings = ReplaySettings()
        settings.checkpointInterval = 10
        let actions: [WarmGreetingDomain.Action] = [.greet(name)] + Array(repeating: .wait, count: 11)
        let divergence = try #require(try expectDivergence(WarmGreetingDomain.self, actions, settings: settings))
        #expect(divergence.seq == 10)
        #expect(!divergence.reproduced)
        #expect(divergence.differences.isEmpty)
        #expect(divergence.leftEffectsDigest != divergence.rightEffectsDigest)
        #expect(divergence.leftEffects == nil)
        #expect(divergence.description.contains("process history or global state"))
        #expect(divergence.description.contains("those of an earlier action differ, at or after seq 1"))
    }

    @Test func aDomainWithEffectsThatAreDeterministicPassesInAndAcrossProcesses() async throws {
        let actions = DeterminismCheck<Reminders>.generate(length: 300, seed: 11)
        // Every action the harness compared effects of: as many as set anything going here.
        var state = Reminders.initialState
        var withEffects = 0
        for action in actions {
            Reminders.reduce(into: &state, action)
            if !Reminders.effects(of: action, in: state).isEmpty { withEffects += 1 }
        }
        let report = try await offPool("replay") {
            try ReplayHarness<Reminders>(children: [fixtureChild()]).replay(try ReplayLog<Reminders>(actions))
        }
        #expect(report.replicas == 4)
        #expect(withEffects > 100)
        #expect(report.actionsWithEffects == withEffects)
        #expect(report.finalEffectsDigest != nil)
    }

    @Test func anEffectsDivergenceReadsAsJSONAndOldJSONStillDecodes() throws {
        let divergence = try #require(try expectDivergence(TicketDomain.self, [.remind]))
        let object = try #require(
            try JSONSerialization.jsonObject(with: Data(divergence.json.utf8)) as? [String: Any]
        )
        let differences = object["effectDifferences"] as? [[String: Any]]
        #expect(differences?.first?["path"] as? String == "[0].key")
        #expect((object["leftEffects"] as? [String])?.count == 1)
        #expect(object["leftEffectsDigest"] as? String == divergence.leftEffectsDigest?.hex)
        let decoded = try JSONDecoder().decode(Divergence.self, from: Data(divergence.json.utf8))
        #expect(decoded.effectDifferences == divergence.effectDifferences)
        // A divergence written before effects were compared (or before `reproduced` was written) still decodes.
        var old = object
        for key in [
            "leftEffectsDigest", "rightEffectsDigest", "leftEffects", "rightEffects", "effectDifferences", "reproduced",
        ] {
            old[key] = nil
        }
        let oldJSON = try JSONSerialization.data(withJSONObject: old)
        let oldDecoded = try JSONDecoder().decode(Divergence.self, from: oldJSON)
        #expect(oldDecoded.seq == 1)
        #expect(oldDecoded.effectDifferences.isEmpty)
        #expect(oldDecoded.leftEffectsDigest == nil)
        #expect(oldDecoded.reproduced)
    }

    @Test func journalSnapshotsMustMatchTheReplay() throws {
        let actions: [Counter.Action] = [.increment, .increment, .decrement]
        let good = StateDigest(of: Array(#"{"count":2}"#.utf8))
        var log = try ReplayLog<Counter>(actions)
        log.expected = [2: (good, nil)]
        _ = try ReplayHarness<Counter>().replay(log)
        log.expected = [2: (StateDigest(of: Array(#"{"count":3}"#.utf8)), Array(#"{"count":3}"#.utf8))]
        let divergence = try #require(throws: Divergence.self) { try ReplayHarness<Counter>().replay(log) }
        #expect(divergence.seq == 2)
        #expect(divergence.differences == [StateDifference(path: "count", left: .integer(3), right: .integer(2))])
    }

    @Test func replayCanStartFromASnapshot() throws {
        let log = ReplayLog<Counter>(startSeq: 10, startState: Array(#"{"count":10}"#.utf8), actions: [.increment])
        let report = try ReplayHarness<Counter>().replay(log)
        #expect(report.finalSeq == 11)
        #expect(report.finalDigest == StateDigest(of: Array(#"{"count":11}"#.utf8)))
        // A domain without effects computes none.
        #expect(report.finalEffectsDigest == nil)
        #expect(report.actionsWithEffects == 0)
    }
}

@Suite struct ReplayCostTests {
    /// A long log is checkpointed about 128 times, not at every event (each encodes the whole state: a growing state
    /// made `replay --generate 10000` quadratic), and tells its progress; a short one is checked at every event.
    @Test func aLongLogGetsAbout128CheckpointsAndTellsItsProgressAShortOneEveryEvent() throws {
        let actions = DeterminismCheck<Counter>.generate(length: 3_000, seed: 1)
        var harness = ReplayHarness<Counter>()
        let told = LockedValue<[Int]>([])
        harness.progress = { step in
            if case let .inProcess(replayed, total) = step, total == actions.count {
                told.withLockedValue { $0.append(replayed) }
            }
        }
        let report = try harness.replay(try ReplayLog<Counter>(actions))
        #expect((128...136).contains(report.checkpoints), "\(report.checkpoints) checkpoints")
        #expect(told.withLockedValue { $0 } == Array(stride(from: 0, to: actions.count, by: 256)))
        let short = try ReplayHarness<Counter>().replay(try ReplayLog<Counter>(Array(actions.prefix(200))))
        #expect(short.checkpoints == 200)
    }
}

@Suite struct DeterminismCheckTests {
    /// The package's own tool is the child in one line; a tool that is not built is named, with what to do.
    @Test func thePackagesOwnToolIsTheChildInOneLine() async throws {
        try await onCheckThread {
            var check = DeterminismCheck(Todos.self, children: [.packageTool("lockstep")])
            check.sequences = 2
            check.length = 100
            try check.run()
        }
        let missing = await onCheckThread { () -> String? in
            var check = DeterminismCheck(Todos.self, children: [.packageTool("no-such-tool")])
            check.sequences = 1
            do {
                try check.run()
                return nil
            } catch {
                return "\(error)"
            }
        }
        #expect(
            missing?.contains("no-such-tool") == true && missing?.contains("build it first") == true,
            "\(missing ?? "")"
        )
    }

    @Test func reportsTheSeedAndAShortFailingLog() throws {
        var settings = ReplaySettings()
        settings.roundTripRate = 0.5
        var check = DeterminismCheck(LossyDomain.self, settings: settings)
        check.sequences = 5
        check.length = 100
        let failure = try #require(throws: DeterminismFailure.self) { try check.run() }
        #expect(failure.seed >= 1)
        // Losing `lastAmount` needs at least an add, a round trip, and a repeat that reads it.
        #expect(failure.actions.count >= 2)
        #expect(failure.actions.count <= 10)
        #expect(failure.actions.last == #"{"repeatLast":{}}"#)
        #expect(failure.description.contains("seed \(failure.seed)"))
    }

    @Test func effectsThatReadTheClockAreCaughtWithTheFirstSeqAndTheDifferingEffect() throws {
        var check = DeterminismCheck(ClockEffectsDomain.self)
        check.sequences = 1
        check.length = 100
        check.shrinkBudget = 0  // the generated log as it is: its first stamp is the first seq that differs
        let failure = try #require(throws: DeterminismFailure.self) { try check.run() }
        let generated = DeterminismCheck<ClockEffectsDomain>.generate(length: 100, seed: failure.seed)
        let firstStamp = try #require(generated.firstIndex(of: .stamp))
        #expect(failure.divergence.seq == SequenceNumber(firstStamp + 1))
        #expect(failure.divergence.effectDifferences.map(\.path) == ["[0].body.stamp.nanos"])
        #expect(failure.description.contains("effects[0].body.stamp.nanos: "))
        // Shrunk, the log is the one action that reads the clock.
        check.shrinkBudget = 200
        let shrunk = try #require(throws: DeterminismFailure.self) { try check.run() }
        #expect(shrunk.actions == [#"{"stamp":{}}"#])
        #expect(shrunk.divergence.seq == 1)
    }

    @Test func timerKeysFromACounterAreCaughtWithTheFirstSeqAndTheDifferingEffect() throws {
        var check = DeterminismCheck(TicketDomain.self)
        check.sequences = 1
        check.length = 100
        check.shrinkBudget = 0
        let failure = try #require(throws: DeterminismFailure.self) { try check.run() }
        let generated = DeterminismCheck<TicketDomain>.generate(length: 100, seed: failure.seed)
        let firstReminder = try #require(generated.firstIndex(of: .remind))
        #expect(failure.divergence.seq == SequenceNumber(firstReminder + 1))
        #expect(failure.divergence.effectDifferences.map(\.path) == ["[0].key"])
        #expect(failure.description.contains("effects[0].key: "))
    }

    @Test func aDeterministicDomainPasses() async throws {
        var check = DeterminismCheck(Todos.self)
        check.sequences = 5
        // Seconds of replays: on the check thread, not on one of the cooperative pool.
        try await onCheckThread { try check.run() }
    }
}

@Suite struct StateDiffTests {
    @Test func namesEveryDifferingPath() {
        let left = Array(#"{"a":1,"b":{"c":[1,2,3]},"d":"x"}"#.utf8)
        let right = Array(#"{"a":1,"b":{"c":[1,5]},"e":true}"#.utf8)
        #expect(
            StateDiff.compare(left, right).map(\.description) == [
                "b.c[1]: 2 ≠ 5", "b.c[2]: 3 ≠ (absent)", "d: \"x\" ≠ (absent)", "e: (absent) ≠ true",
            ]
        )
        #expect(StateDiff.compare(left, left).isEmpty)
    }
}
