import LockstepServer
import Testing

/// The leader's commit pipeline, transition by transition, on a clock the test moves (docs/testing.md lists them).
@Suite struct CommitPipelineTests {
    typealias Pipeline = CommitPipeline<String, Int>

    let start = ContinuousClock.now
    func at(_ milliseconds: Int) -> ContinuousClock.Instant { start + .milliseconds(milliseconds) }

    /// A lease of 3 s in term 7, fenced at 0 ms.
    var lease: Pipeline.Lease { Pipeline.Lease(duration: .seconds(3), term: 7, fencedAt: at(0)) }

    /// Each action as one line, so a test states every action it expects, in order.
    func lines(_ actions: [Pipeline.Action]) -> [String] {
        actions.map { action in
            func group(_ group: Pipeline.Group) -> String {
                "\(group.entries.joined(separator: ","))|\(group.commits.map(String.init).joined(separator: ","))"
            }
            switch action {
            case let .commit(g, sync, place): return "commit \(group(g)) sync:\(sync) \(place)"
            case let .sync(place): return "sync \(place)"
            case .renewLease: return "renew"
            case let .answer(g, committed, publish):
                return "answer \(group(g)) committed:\(committed) publish:\(publish)"
            case let .refuse(g, reason): return "refuse \(group(g)) \(reason)"
            case let .stepDown(_, stillHeld): return "step down held:\(stillHeld.map(String.init) ?? "-")"
            case .recoverStores: return "recover"
            case .stop: return "stop"
            case .renewalFailed: return "renewal failed"
            case .commitFailed: return "commit failed"
            }
        }
    }

    @Test func aGroupWithoutDispatchesIsAnsweredAtOnce() {
        var pipeline = Pipeline(commitsOnLoop: true)
        pipeline.sequenced("status")
        pipeline.sequenced("rejected")
        #expect(
            lines(pipeline.advance(now: at(0), readersBusy: false)) == [
                "answer status,rejected| committed:true publish:false"
            ]
        )
        #expect(pipeline.isIdle)
        #expect(pipeline.advance(now: at(1), readersBusy: false).isEmpty, "nothing waits")
    }

    @Test func aGroupWithDispatchesIsCommittedOnceThenAnsweredAndPublished() {
        var pipeline = Pipeline(commitsOnLoop: true)
        pipeline.sequenced("a", commit: 1)
        pipeline.sequenced("status")
        pipeline.sequenced("b", commit: 2)
        #expect(lines(pipeline.advance(now: at(0), readersBusy: false)) == ["commit a,status,b|1,2 sync:false loop"])
        #expect(pipeline.isBusy)
        // Sequenced while the commit is in flight: the next group, handed over only once the first is answered.
        pipeline.sequenced("c", commit: 3)
        #expect(pipeline.advance(now: at(1), readersBusy: false).isEmpty)
        #expect(pipeline.nextDeadline == nil, "nothing is due while a commit is in flight")
        #expect(
            lines(pipeline.completed(.success(()), now: at(2))) == ["answer a,status,b|1,2 committed:true publish:true"]
        )
        #expect(lines(pipeline.advance(now: at(3), readersBusy: false)) == ["commit c|3 sync:false loop"])
        #expect(lines(pipeline.completed(.success(()), now: at(4))) == ["answer c|3 committed:true publish:true"])
        #expect(pipeline.isIdle)
    }

    @Test(arguments: [(true, false, "loop"), (true, true, "writer"), (false, false, "writer"), (false, true, "writer")])
    func aLocalJournalCommitsOnTheLoopUnlessAReaderHoldsIt(commitsOnLoop: Bool, readersBusy: Bool, place: String) {
        var pipeline = Pipeline(commitsOnLoop: commitsOnLoop)
        pipeline.sequenced("a", commit: 1)
        #expect(lines(pipeline.advance(now: at(0), readersBusy: readersBusy)) == ["commit a|1 sync:false \(place)"])
    }

    @Test func theOpenGroupStopsAcceptingAtItsBound() {
        var pipeline = Pipeline(commitsOnLoop: false)
        for index in 0..<Pipeline.maximumOpen {
            #expect(pipeline.accepting)
            pipeline.sequenced("\(index)")
        }
        #expect(!pipeline.accepting)
    }

    @Test func aFailedCommitAnswersItAndWhatFollowedItUnavailableAndRebuildsTheStores() {
        var pipeline = Pipeline(commitsOnLoop: false)
        pipeline.sequenced("a", commit: 1)
        _ = pipeline.advance(now: at(0), readersBusy: false)
        pipeline.sequenced("b", commit: 2)
        let actions = pipeline.completed(.failure(CommitFailure(.other, "the disk is full")), now: at(1))
        #expect(
            lines(actions) == [
                "commit failed", "answer a|1 committed:false publish:false", "answer b|2 committed:false publish:false",
                "recover",
            ]
        )
        #expect(pipeline.isIdle)
    }

    @Test func aFailedWriteOrFsyncStopsTheDaemon() {
        var pipeline = Pipeline(commitsOnLoop: true)
        pipeline.sequenced("a", commit: 1)
        _ = pipeline.advance(now: at(0), readersBusy: false)
        let actions = pipeline.completed(.failure(CommitFailure(.disk, "EIO")), now: at(1))
        #expect(
            lines(actions) == [
                "commit failed", "answer a|1 committed:false publish:false", "answer | committed:false publish:false",
                "stop",
            ]
        )
    }

    @Test func aFailedCommitOnALeasedJournalStandsByAndRecoversInTheSameTerm() {
        var pipeline = Pipeline(commitsOnLoop: false, lease: lease)
        pipeline.sequenced("a", commit: 1)
        _ = pipeline.advance(now: at(0), readersBusy: false)
        let actions = pipeline.completed(.failure(CommitFailure(.other, "connection lost")), now: at(1))
        #expect(
            lines(actions) == [
                "commit failed", "answer a|1 committed:false publish:false", "answer | committed:false publish:false",
                "step down held:7",
            ]
        )
    }

    @Test func aFencedCommitRefusesEverythingNotLeaderAndEndsTheLeadership() {
        var pipeline = Pipeline(commitsOnLoop: false, lease: lease)
        pipeline.sequenced("a", commit: 1)
        _ = pipeline.advance(now: at(0), readersBusy: false)
        pipeline.sequenced("b", commit: 2)
        let actions = pipeline.completed(.failure(CommitFailure(.fenced, "term 8 holds the lease")), now: at(1))
        #expect(
            lines(actions) == [
                "commit failed", "refuse a|1 term 8 holds the lease", "refuse b|2 term 8 holds the lease",
                "step down held:-",
            ]
        )
        #expect(pipeline.isIdle)
    }

    @Test func aCommitRenewsTheLeaseAsOfWhenItWasSent() {
        var pipeline = Pipeline(commitsOnLoop: false, lease: lease)
        #expect(pipeline.nextDeadline == at(1_000), "an idle leader renews a third of the lease after its fence")
        pipeline.sequenced("a", commit: 1)
        _ = pipeline.advance(now: at(500), readersBusy: false)
        _ = pipeline.completed(.success(()), now: at(900))
        #expect(pipeline.lease?.fencedAt == at(500))
        #expect(pipeline.nextDeadline == at(1_500))
    }

    @Test func anIdleLeaderRenewsEveryThirdOfTheLease() {
        var pipeline = Pipeline(commitsOnLoop: false, lease: lease)
        #expect(pipeline.advance(now: at(999), readersBusy: false).isEmpty)
        #expect(lines(pipeline.advance(now: at(1_000), readersBusy: false)) == ["renew"])
        #expect(pipeline.isBusy)
        #expect(pipeline.completed(.success(()), now: at(1_050)).isEmpty)
        #expect(pipeline.lease?.fencedAt == at(1_000))
        #expect(pipeline.nextDeadline == at(2_000))
    }

    @Test func answersThatNeedNoCommitWaitForARenewalOnceTheLeaseMayHaveLapsed() {
        var pipeline = Pipeline(commitsOnLoop: false, lease: lease)
        pipeline.sequenced("status")
        // 2 s after the fence (the lease less a third), another daemon may lead: renew first.
        #expect(lines(pipeline.advance(now: at(2_000), readersBusy: false)) == ["renew"])
        #expect(
            lines(pipeline.completed(.success(()), now: at(2_100))) == ["answer status| committed:true publish:false"]
        )
        #expect(pipeline.lease?.fencedAt == at(2_000))
    }

    @Test func aRenewalTheFenceRefusesRefusesWhatItHeldAndWhatFollowed() {
        var pipeline = Pipeline(commitsOnLoop: false, lease: lease)
        pipeline.sequenced("status")
        _ = pipeline.advance(now: at(2_500), readersBusy: false)
        pipeline.sequenced("d", commit: 1)
        let actions = pipeline.completed(.failure(CommitFailure(.fenced, "b took it")), now: at(2_600))
        #expect(lines(actions) == ["refuse status| b took it", "refuse d|1 b took it", "step down held:-"])
    }

    @Test func aRenewalThatFailsIsTriedAgainSoonUntilTheLeaseMayHaveLapsed() {
        var pipeline = Pipeline(commitsOnLoop: false, lease: lease)
        pipeline.sequenced("status")
        _ = pipeline.advance(now: at(2_000), readersBusy: false)
        let first = pipeline.completed(.failure(CommitFailure(.other, "timeout")), now: at(2_200))
        #expect(lines(first) == ["answer status| committed:false publish:false", "renewal failed"])
        #expect(pipeline.nextDeadline == at(2_500), "a tenth of the lease later")
        #expect(lines(pipeline.advance(now: at(2_500), readersBusy: false)) == ["renew"])
        pipeline.sequenced("e", commit: 1)
        let last = pipeline.completed(.failure(CommitFailure(.other, "timeout")), now: at(3_000))
        #expect(
            lines(last) == [
                "refuse e|1 the lease could not be renewed for longer than it lasts: timeout", "step down held:-",
            ]
        )
    }

    @Test func relaxedDurabilitySyncsWhatItCommittedWithinItsDelay() {
        var pipeline = Pipeline(commitsOnLoop: true, relaxed: true)
        pipeline.sequenced("a", commit: 1)
        _ = pipeline.advance(now: at(0), readersBusy: false)
        _ = pipeline.completed(.success(()), now: at(1))
        #expect(pipeline.syncDue == at(1) + Pipeline.relaxedSyncDelay)
        #expect(pipeline.nextDeadline == pipeline.syncDue)
        #expect(pipeline.advance(now: at(5), readersBusy: false).isEmpty)
        #expect(lines(pipeline.advance(now: at(11), readersBusy: false)) == ["sync loop"])
        #expect(pipeline.completed(.success(()), now: at(12)).isEmpty)
        #expect(pipeline.syncDue == nil && pipeline.isIdle)
    }

    @Test func aCommitWhenASyncIsDueSyncsWithItAndNeedsNoOtherSync() {
        var pipeline = Pipeline(commitsOnLoop: true, relaxed: true)
        pipeline.sequenced("a", commit: 1)
        _ = pipeline.advance(now: at(0), readersBusy: false)
        _ = pipeline.completed(.success(()), now: at(0))
        pipeline.sequenced("b", commit: 2)
        #expect(lines(pipeline.advance(now: at(20), readersBusy: false)) == ["commit b|2 sync:true loop"])
        _ = pipeline.completed(.success(()), now: at(21))
        #expect(pipeline.syncDue == nil)
    }

    @Test func aFailedSyncStopsTheDaemon() {
        var pipeline = Pipeline(commitsOnLoop: true, relaxed: true)
        pipeline.sequenced("a", commit: 1)
        _ = pipeline.advance(now: at(0), readersBusy: false)
        _ = pipeline.completed(.success(()), now: at(0))
        pipeline.sequenced("status")
        #expect(
            lines(pipeline.advance(now: at(10), readersBusy: false)) == [
                "answer status| committed:true publish:false", "sync loop",
            ]
        )
        #expect(
            lines(pipeline.completed(.failure(CommitFailure(.disk, "EIO")), now: at(11))) == [
                "commit failed", "answer | committed:false publish:false", "answer | committed:false publish:false",
                "stop",
            ]
        )
    }

    @Test func aCompletionWithNothingInFlightChangesNothing() {
        var pipeline = Pipeline(commitsOnLoop: true)
        pipeline.sequenced("a", commit: 1)
        #expect(pipeline.completed(.success(()), now: at(0)).isEmpty)
        #expect(!pipeline.isBusy && pipeline.open.commits == [1])
    }
}
