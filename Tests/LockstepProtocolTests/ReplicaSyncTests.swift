import Lockstep
import LockstepProtocol
import Testing

/// Every transition of the replica's sync machine, stated as the exact outputs it must give.
@Suite struct ReplicaSyncTests {
    let t0 = ContinuousClock.now
    let epoch = Epoch(rawValue: 0xE1)
    let newEpoch = Epoch(rawValue: 0xE2)
    let digest = StateDigest(of: [1, 2, 3])

    func action(_ seq: SequenceNumber) -> Frame { Array("a\(seq)".utf8) }
    func sequenced(_ seqs: ClosedRange<SequenceNumber>) -> [SequencedAction] {
        seqs.map { SequencedAction(seq: $0, action: action($0)) }
    }
    func at(_ milliseconds: Int) -> ContinuousClock.Instant { t0 + .milliseconds(milliseconds) }

    /// A replica that joined at `seq` with nothing kept.
    func live(at seq: SequenceNumber) -> ReplicaSync {
        var sync = ReplicaSync(now: t0)
        _ = sync.start(now: t0)
        _ = sync.snapshot(epoch: epoch, seq: seq, digest: digest, state: [], now: t0)
        return sync
    }

    @Test func joinKeepsEventsAndDropsThoseAtOrBelowTheSnapshot() {
        var sync = ReplicaSync(now: t0)
        #expect(sync.start(now: t0) == [.requestSnapshot])
        for seq: SequenceNumber in 3...6 {
            #expect(sync.event(epoch: epoch, seq: seq, action: action(seq), now: t0) == [])
        }
        #expect(sync.phase == .joining)
        let outputs = sync.snapshot(epoch: epoch, seq: 4, digest: digest, state: [9], now: t0)
        #expect(outputs == [.install(epoch: epoch, seq: 4, digest: digest, state: [9]), .apply(sequenced(5...6))])
        #expect(sync.phase == .live)
        #expect(sync.lastSeq == 6)
        #expect(sync.epoch == epoch)
    }

    /// An EVENTS is its EVENTs in turn, with what applies at once as one run: duplicates dropped, a gap repaired.
    @Test func aRunOfEventsAppliesInOneStepAndIsReadAsItsEvents() {
        var sync = live(at: 4)
        let run = (3...7).map(action)
        #expect(sync.events(epoch: epoch, firstSeq: 3, actions: run, now: t0) == [.apply(sequenced(5...7))])
        #expect(sync.lastSeq == 7)
        // A run past a gap is kept and the gap asked for; the repair then applies everything in order.
        #expect(
            sync.events(epoch: epoch, firstSeq: 10, actions: (10...11).map(action), now: t0)
                == [.requestRange(from: 8, to: 9)]
        )
        #expect(
            sync.range(epoch: epoch, firstSeq: 8, actions: (8...9).map(action), now: t0)
                == [.apply(sequenced(8...9)), .apply(sequenced(10...11))]
        )
        #expect(sync.phase == .live)
        // A run of another epoch resyncs, as an EVENT of it would.
        let outputs = sync.events(epoch: newEpoch, firstSeq: 1, actions: [action(1)], now: t0)
        #expect(outputs.first == .resync(.newEpoch(old: epoch, new: newEpoch)))
    }

    @Test func snapshotAheadOfEverythingKeptDropsItAll() {
        var sync = ReplicaSync(now: t0)
        _ = sync.start(now: t0)
        _ = sync.event(epoch: epoch, seq: 1, action: action(1), now: t0)
        _ = sync.event(epoch: epoch, seq: 2, action: action(2), now: t0)
        #expect(
            sync.snapshot(epoch: epoch, seq: 5, digest: digest, state: [], now: t0)
                == [.install(epoch: epoch, seq: 5, digest: digest, state: [])]
        )
        #expect(sync.lastSeq == 5)
        #expect(sync.event(epoch: epoch, seq: 6, action: action(6), now: t0) == [.apply(sequenced(6...6))])
    }

    @Test func gapBetweenSnapshotAndKeptEventsIsFilledByRange() {
        var sync = ReplicaSync(now: t0)
        _ = sync.start(now: t0)
        _ = sync.event(epoch: epoch, seq: 8, action: action(8), now: t0)
        _ = sync.event(epoch: epoch, seq: 9, action: action(9), now: t0)
        #expect(
            sync.snapshot(epoch: epoch, seq: 5, digest: digest, state: [], now: t0)
                == [.install(epoch: epoch, seq: 5, digest: digest, state: []), .requestRange(from: 6, to: 7)]
        )
        #expect(sync.phase == .repairing)
        #expect(
            sync.range(epoch: epoch, firstSeq: 6, actions: [action(6), action(7)], now: t0)
                == [.apply(sequenced(6...7)), .apply(sequenced(8...9))]
        )
        #expect(sync.phase == .live)
        #expect(sync.lastSeq == 9)
    }

    @Test func liveAppliesOnlyTheNextSeqAndIgnoresDuplicates() {
        var sync = live(at: 6)
        #expect(sync.event(epoch: epoch, seq: 7, action: action(7), now: t0) == [.apply(sequenced(7...7))])
        #expect(sync.event(epoch: epoch, seq: 7, action: action(7), now: t0) == [])
        #expect(sync.event(epoch: epoch, seq: 3, action: action(3), now: t0) == [])
        #expect(sync.lastSeq == 7)
    }

    @Test func gapAndReorderingAreRepairedInOrder() {
        var sync = live(at: 6)
        #expect(sync.event(epoch: epoch, seq: 8, action: action(8), now: t0) == [.requestRange(from: 7, to: 7)])
        #expect(sync.phase == .repairing)
        // The missing event turns up late, and one more arrives, while the range is out.
        #expect(sync.event(epoch: epoch, seq: 7, action: action(7), now: t0) == [])
        #expect(sync.event(epoch: epoch, seq: 9, action: action(9), now: t0) == [])
        #expect(
            sync.range(epoch: epoch, firstSeq: 7, actions: [action(7)], now: t0)
                == [.apply(sequenced(7...7)), .apply(sequenced(8...9))]
        )
        #expect(sync.lastSeq == 9)
        #expect(sync.phase == .live)
    }

    @Test func partialRangeAsksForTheRest() {
        var sync = live(at: 0)
        #expect(sync.event(epoch: epoch, seq: 5, action: action(5), now: t0) == [.requestRange(from: 1, to: 4)])
        #expect(
            sync.range(epoch: epoch, firstSeq: 1, actions: [action(1), action(2)], now: t0)
                == [.apply(sequenced(1...2)), .requestRange(from: 3, to: 4)]
        )
        #expect(
            sync.range(epoch: epoch, firstSeq: 3, actions: [action(3), action(4)], now: t0)
                == [.apply(sequenced(3...4)), .apply(sequenced(5...5))]
        )
    }

    @Test func heartbeatRevealsALostLastEvent() {
        var sync = live(at: 6)
        #expect(sync.heartbeat(epoch: epoch, lastSeq: 6, now: t0) == [])
        #expect(sync.heartbeat(epoch: epoch, lastSeq: 7, now: t0) == [.requestRange(from: 7, to: 7)])
        #expect(sync.phase == .repairing)
        // A second heartbeat while the range is out does not ask twice.
        #expect(sync.heartbeat(epoch: epoch, lastSeq: 7, now: t0) == [])
        #expect(sync.range(epoch: epoch, firstSeq: 7, actions: [action(7)], now: t0) == [.apply(sequenced(7...7))])
        #expect(sync.phase == .live)
    }

    @Test func aRefusedRangeStartsOverInsteadOfAskingForeverAndOnlyWhenARangeWasAsked() {
        var sync = live(at: 2)
        #expect(sync.rangeRefused(now: t0) == [])
        #expect(sync.heartbeat(epoch: epoch, lastSeq: 9, now: t0) == [.requestRange(from: 3, to: 9)])
        // The daemon came back with less history in the same epoch: what the replica holds may not be its.
        #expect(sync.rangeRefused(now: t0) == [.resync(.historyShorter(from: 3)), .requestSnapshot])
        #expect(sync.phase == .joining)
        #expect(sync.lastSeq == 0)
        #expect(sync.resyncCount == 1)
    }

    @Test func compactedRangeFallsBackToASnapshotKeepingLaterEvents() {
        var sync = live(at: 2)
        #expect(sync.event(epoch: epoch, seq: 10, action: action(10), now: t0) == [.requestRange(from: 3, to: 9)])
        #expect(sync.compacted(epoch: epoch, firstAvailable: 8, now: t0) == [.requestSnapshot])
        #expect(sync.phase == .repairing)
        #expect(sync.event(epoch: epoch, seq: 11, action: action(11), now: t0) == [])
        #expect(
            sync.snapshot(epoch: epoch, seq: 9, digest: digest, state: [7], now: t0)
                == [.install(epoch: epoch, seq: 9, digest: digest, state: [7]), .apply(sequenced(10...11))]
        )
        #expect(sync.phase == .live)
    }

    @Test func newEpochMidRepairStartsOverKeepingTheNewEvent() {
        var sync = live(at: 4)
        _ = sync.event(epoch: epoch, seq: 7, action: action(7), now: t0)
        #expect(sync.phase == .repairing)
        let outputs = sync.event(epoch: newEpoch, seq: 1, action: action(1), now: t0)
        #expect(outputs == [.resync(.newEpoch(old: epoch, new: newEpoch)), .requestSnapshot])
        #expect(sync.phase == .joining)
        #expect(sync.resyncCount == 1)
        // The old range's answer, arriving late, is ignored.
        #expect(sync.range(epoch: epoch, firstSeq: 5, actions: [action(5), action(6)], now: t0) == [])
        #expect(
            sync.snapshot(epoch: newEpoch, seq: 0, digest: digest, state: [], now: t0)
                == [.install(epoch: newEpoch, seq: 0, digest: digest, state: []), .apply(sequenced(1...1))]
        )
        #expect(sync.epoch == newEpoch)
    }

    @Test func rangeFromANewEpochStartsOver() {
        var sync = live(at: 4)
        _ = sync.heartbeat(epoch: epoch, lastSeq: 6, now: t0)
        #expect(
            sync.range(epoch: newEpoch, firstSeq: 5, actions: [action(5)], now: t0)
                == [.resync(.newEpoch(old: epoch, new: newEpoch)), .requestSnapshot]
        )
    }

    @Test func heartbeatFromANewEpochStartsOver() {
        var sync = live(at: 4)
        #expect(
            sync.heartbeat(epoch: newEpoch, lastSeq: 0, now: t0)
                == [.resync(.newEpoch(old: epoch, new: newEpoch)), .requestSnapshot]
        )
    }

    @Test func digestsAreVerifiedAtTheirSeqAndAMismatchStartsOver() {
        var sync = live(at: 6)
        #expect(sync.digest(epoch: epoch, seq: 6, digest: digest, now: t0) == [.verifyDigest(seq: 6, digest: digest)])
        // Past it: the replica compares it with its own digest at 5, if it kept one (a CHECKPOINT said so).
        #expect(
            sync.digest(epoch: epoch, seq: 5, digest: digest, now: t0) == [.verifyKeptDigest(seq: 5, digest: digest)]
        )
        // A digest ahead of us is kept and checked once we get there.
        #expect(sync.digest(epoch: epoch, seq: 7, digest: digest, now: t0) == [.requestRange(from: 7, to: 7)])
        #expect(sync.event(epoch: epoch, seq: 7, action: action(7), now: t0) == [])
        #expect(
            sync.range(epoch: epoch, firstSeq: 7, actions: [action(7)], now: t0)
                == [.apply(sequenced(7...7)), .verifyDigest(seq: 7, digest: digest)]
        )
        #expect(
            sync.digestMismatch(at: 7, now: t0)
                == [.reportDivergence(seq: 7), .resync(.divergence(seq: 7)), .requestSnapshot]
        )
        #expect(sync.phase == .joining)
        #expect(sync.resyncCount == 1)
    }

    @Test func divergencesInARowBackOffAndAQuietSpellStartsAfresh() {
        var sync = live(at: 4)
        let mismatch = { (sync: inout ReplicaSync, at: Int) in sync.digestMismatch(at: 4, now: self.at(at)) }
        // The first resyncs at once.
        #expect(mismatch(&sync, 0) == [.reportDivergence(seq: 4), .resync(.divergence(seq: 4)), .requestSnapshot])
        // The second, soon after, asks for the snapshot only after 100 ms; nothing goes out before.
        _ = sync.snapshot(epoch: epoch, seq: 4, digest: digest, state: [], now: at(10))
        #expect(mismatch(&sync, 20) == [.reportDivergence(seq: 4), .resync(.divergence(seq: 4))])
        #expect(sync.tick(now: at(90)) == [])
        #expect(sync.tick(now: at(120)) == [.requestSnapshot])
        // The third waits 200 ms, the fourth 400 ms: doubling, up to 5 s.
        _ = sync.snapshot(epoch: epoch, seq: 4, digest: digest, state: [], now: at(130))
        #expect(mismatch(&sync, 140) == [.reportDivergence(seq: 4), .resync(.divergence(seq: 4))])
        #expect(sync.tick(now: at(300)) == [])
        #expect(sync.tick(now: at(340)) == [.requestSnapshot])
        _ = sync.snapshot(epoch: epoch, seq: 4, digest: digest, state: [], now: at(350))
        #expect(mismatch(&sync, 360) == [.reportDivergence(seq: 4), .resync(.divergence(seq: 4))])
        #expect(sync.tick(now: at(700)) == [])
        #expect(sync.tick(now: at(760)) == [.requestSnapshot])
        // Long after the last divergence, the next one resyncs at once again.
        _ = sync.snapshot(epoch: newEpoch, seq: 9, digest: digest, state: [], now: at(800))
        #expect(
            sync.digestMismatch(at: 9, now: at(20_000))
                == [.reportDivergence(seq: 9), .resync(.divergence(seq: 9)), .requestSnapshot]
        )
    }

    @Test func silenceKeepsTheStateAndAsksForTheEventsFromTheLastHeldOn() {
        var sync = ReplicaSync(now: t0)
        _ = sync.start(now: t0)
        // Joining for the first time: nobody answers, so the request goes out again, but there is nothing
        // to keep or ask after.
        #expect(sync.tick(now: at(1_000)) == [])
        #expect(sync.tick(now: at(2_500)) == [.requestUnanswered, .requestSnapshot])
        // Each repeat in a row waits twice as long as the one before: a slow snapshot still gets through.
        #expect(sync.tick(now: at(4_600)) == [])
        #expect(sync.tick(now: at(6_600)) == [.requestUnanswered, .requestSnapshot])
        _ = sync.snapshot(epoch: epoch, seq: 3, digest: digest, state: [], now: at(7_000))
        #expect(sync.heartbeat(epoch: epoch, lastSeq: 3, now: at(8_000)) == [])
        #expect(sync.tick(now: at(10_900)) == [])
        // Silent: the state stays; the events from the last held on are asked for (a new leader answers them).
        #expect(sync.tick(now: at(11_100)) == [.silent(.milliseconds(3_100)), .requestRange(from: 3, to: .max)])
        #expect((sync.lastSeq, sync.epoch, sync.resyncCount) == (3, epoch, 0))
        // The answer to the snapshot reset the wait: unanswered after 2 s, asked again (the owner moves to another
        // daemon first); silent again, it is still out.
        #expect(sync.tick(now: at(13_200)) == [.requestUnanswered, .requestRange(from: 3, to: .max)])
        #expect(sync.tick(now: at(14_300)) == [.silent(.milliseconds(3_200))])
        // The answer holds seq 3 of the same epoch and what came after: applied, nothing lost; events go on from it.
        #expect(
            sync.range(epoch: epoch, firstSeq: 3, actions: [action(3), action(4)], now: at(14_400))
                == [.apply(sequenced(4...4))]
        )
        #expect(sync.phase == .live)
        #expect(sync.event(epoch: epoch, seq: 7, action: action(7), now: at(14_500)) == [.requestRange(from: 5, to: 6)])
        #expect(sync.resyncCount == 0)
    }

    @Test func aSilenceThatEndsInAnotherHistoryStartsOver() {
        // The daemon that answers lost the last event held (`invalid_range`)...
        var shorter = live(at: 7)
        #expect(shorter.tick(now: at(3_100)) == [.silent(.milliseconds(3_100)), .requestRange(from: 7, to: .max)])
        #expect(shorter.rangeRefused(now: at(3_200)) == [.resync(.historyShorter(from: 7)), .requestSnapshot])
        // ...or runs another journal.
        var other = live(at: 7)
        _ = other.tick(now: at(3_100))
        #expect(
            other.range(epoch: newEpoch, firstSeq: 7, actions: [action(7)], now: at(3_200))
                == [.resync(.newEpoch(old: epoch, new: newEpoch)), .requestSnapshot]
        )
        // At seq 0 there is no event to ask after: a snapshot is asked for, and the state kept until it comes.
        var empty = live(at: 0)
        #expect(empty.tick(now: at(3_100)) == [.silent(.milliseconds(3_100)), .requestSnapshot])
        #expect(empty.epoch == epoch)
    }

    @Test func aLostRequestIsSentAgainWhenTheOwnerChangesSockets() {
        var sync = live(at: 1)
        #expect(sync.resendRequest(now: t0) == [])
        _ = sync.event(epoch: epoch, seq: 4, action: action(4), now: t0)
        #expect(sync.resendRequest(now: at(100)) == [.requestRange(from: 2, to: 3)])
        // Its timeout still counts from the first send: resends to daemons that only say `not_leader` do not keep
        // it out for ever.
        #expect(sync.tick(now: at(1_900)) == [])
        #expect(sync.tick(now: at(2_100)) == [.requestUnanswered, .requestRange(from: 2, to: 3)])
    }

    @Test func whatAnOldEpochSaidIsForgottenWithItsSnapshot() {
        var sync = ReplicaSync(now: t0)
        _ = sync.start(now: t0)
        // While joining it hears the old journal at seq 1000; then the daemon comes back with a new one.
        _ = sync.heartbeat(epoch: epoch, lastSeq: 1_000, now: t0)
        let newEpoch = Epoch(rawValue: epoch.rawValue &+ 1)
        let outputs = sync.snapshot(epoch: newEpoch, seq: 0, digest: digest, state: [], now: t0)
        #expect(outputs == [.install(epoch: newEpoch, seq: 0, digest: digest, state: [])])
        #expect(sync.phase == .live)
        #expect(sync.daemonSeq == 0)
    }

    @Test func aStoppedOwnerIsNotASilentDaemon() {
        var sync = ReplicaSync(now: t0)
        _ = sync.start(now: t0)
        _ = sync.snapshot(epoch: epoch, seq: 3, digest: digest, state: [], now: t0)
        // The owner's process was stopped for 10 s; on waking it says so before it looks at the clock.
        sync.resumed(now: at(10_000))
        #expect(sync.tick(now: at(10_100)) == [])
        // What it missed arrives as a gap, repaired by range, not by starting over.
        #expect(sync.event(epoch: epoch, seq: 9, action: action(9), now: at(10_200)) == [.requestRange(from: 4, to: 8)])
        #expect(sync.resyncCount == 0)
        // A daemon that stays silent after that is still noticed (the range asked for is out already).
        #expect(sync.tick(now: at(12_300)) == [.requestUnanswered, .requestRange(from: 4, to: 8)])
        #expect(sync.tick(now: at(13_300)) == [.silent(.milliseconds(3_100))])
    }

    /// A state sent in parts: each part that arrives restarts the request's timeout (all of a large state's parts
    /// may take longer than one), and a part arriving while no snapshot is asked for changes nothing.
    @Test func eachPartOfASnapshotRestartsItsTimeout() {
        var sync = ReplicaSync(now: t0)
        _ = sync.start(now: t0)
        sync.snapshotPartArrived(now: at(1_500))
        #expect(sync.tick(now: at(3_000)) == [])
        sync.snapshotPartArrived(now: at(3_000))
        #expect(sync.tick(now: at(4_900)) == [])
        #expect(sync.tick(now: at(5_100)) == [.requestUnanswered, .requestSnapshot])
        var live = live(at: 3)
        live.snapshotPartArrived(now: at(1_000))
        #expect(live.tick(now: at(1_100)) == [])
        #expect(live.lastSeq == 3)
    }

    @Test func unansweredRangeIsSentAgain() {
        var sync = live(at: 1)
        #expect(sync.event(epoch: epoch, seq: 4, action: action(4), now: t0) == [.requestRange(from: 2, to: 3)])
        #expect(sync.tick(now: at(2_100)) == [.requestUnanswered, .requestRange(from: 2, to: 3)])
    }

    @Test func repliesNobodyAskedForAreIgnored() {
        var sync = live(at: 3)
        #expect(sync.snapshot(epoch: epoch, seq: 9, digest: digest, state: [], now: t0) == [])
        #expect(sync.range(epoch: epoch, firstSeq: 4, actions: [action(4)], now: t0) == [])
        #expect(sync.compacted(epoch: epoch, firstAvailable: 2, now: t0) == [])
        #expect(sync.lastSeq == 3)
    }

    @Test func keptEventsAreBounded() {
        var sync = ReplicaSync(settings: .init(maximumBufferedEvents: 3), now: t0)
        _ = sync.start(now: t0)
        for seq: SequenceNumber in 1...10 { _ = sync.event(epoch: epoch, seq: seq, action: action(seq), now: t0) }
        // Only 8, 9 and 10 were kept; 1...7 come by range.
        #expect(
            sync.snapshot(epoch: epoch, seq: 0, digest: digest, state: [], now: t0)
                == [.install(epoch: epoch, seq: 0, digest: digest, state: []), .requestRange(from: 1, to: 7)]
        )
    }
}
