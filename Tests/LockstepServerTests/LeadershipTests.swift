import LockstepJournal
import LockstepServer
import Testing

/// Leadership of a PostgreSQL journal, transition by transition, on a clock the test moves (docs/testing.md lists
/// them).
@Suite struct LeadershipTests {
    let start = ContinuousClock.now
    func at(_ milliseconds: Int) -> ContinuousClock.Instant { start + .milliseconds(milliseconds) }
    let lease = Duration.seconds(3)

    func leader(_ holder: String, term: UInt64, expiresIn: Duration) -> JournalLeader {
        JournalLeader(holder: holder, term: term, expiresAt: "2026-11-27T10:00:00.000Z", expiresIn: expiresIn)
    }

    @Test func aLocalJournalLeadsFromTheStartForGood() {
        var leadership = Leadership.unleased
        #expect(leadership.isLeading && leadership.role == .leading(nil))
        #expect(leadership.nextDeadline == nil)
        #expect(leadership.tick(now: at(10_000)).isEmpty)
        #expect(leadership.lost(stillHeld: nil, holder: "a", now: at(0)).isEmpty, "there is no lease to lose")
        #expect(leadership.isLeading)
    }

    @Test func aDaemonThatTakesTheLeaseAtStartLeads() {
        let leadership = Leadership(
            leaseDuration: lease,
            startedWith: .leading(term: 4, previousHolder: "b"),
            now: at(0)
        )
        #expect(leadership.role == .leading(Leadership.Takeover(term: 4, previousHolder: "b", since: at(0))))
        #expect(leadership.nextDeadline == nil && !leadership.isWaitingForWriter)
    }

    @Test func aStandbyTriesWhenTheHoldersLeaseMayExpireAndNotAgainWhileTrying() {
        var leadership = Leadership(
            leaseDuration: lease,
            startedWith: .standingBy(leader("b", term: 3, expiresIn: .milliseconds(400))),
            now: at(0)
        )
        #expect(leadership.role == .standingBy && !leadership.isLeading)
        #expect(leadership.nextDeadline == at(400), "the holder's expiry, sooner than a third of the lease")
        #expect(leadership.tick(now: at(399)).isEmpty)
        #expect(leadership.tick(now: at(400)) == [.attemptLease])
        #expect(leadership.isWaitingForWriter && leadership.nextDeadline == nil)
        #expect(leadership.tick(now: at(5_000)).isEmpty, "one attempt at a time")
    }

    @Test func aStandbyWaitsAThirdOfTheLeaseAtMostAndTenMillisecondsAtLeast() {
        let far = Leadership(
            leaseDuration: lease,
            startedWith: .standingBy(leader("b", term: 3, expiresIn: .seconds(60))),
            now: at(0)
        )
        #expect(far.nextDeadline == at(1_000))
        let expired = Leadership(
            leaseDuration: lease,
            startedWith: .standingBy(leader("b", term: 3, expiresIn: .zero)),
            now: at(0)
        )
        #expect(expired.nextDeadline == at(10))
    }

    @Test func takingTheLeaseRecoversTheStoresThenLeads() {
        var leadership = standby()
        let actions = leadership.attempted(.success(.leading(term: 4, previousHolder: "b")), now: at(50))
        #expect(actions == [.announce, .recover(term: 4)])
        let takeover = Leadership.Takeover(term: 4, previousHolder: "b", since: at(50))
        #expect(leadership.role == .recovering(takeover))
        #expect(leadership.isWaitingForWriter && !leadership.isLeading)
        #expect(leadership.refusal(holder: "a").contains("it holds the lease (term 4) and is recovering its stores"))
        #expect(leadership.recovered(.success(()), now: at(80)) == [.lead(takeover)])
        #expect(leadership.isLeading && !leadership.isWaitingForWriter)
    }

    @Test func aRecoveryThatFailsStandsByAndTriesAgainAfterAThirdOfTheLease() {
        var leadership = standby()
        _ = leadership.attempted(.success(.leading(term: 4, previousHolder: "b")), now: at(50))
        let actions = leadership.recovered(.failure(Leadership.Failure("a newer domain version")), now: at(80))
        #expect(actions == [.recoveryFailed(reason: "a newer domain version"), .announce])
        #expect(leadership.role == .standingBy && leadership.leader == nil)
        #expect(leadership.problem == "could not recover: a newer domain version")
        #expect(leadership.nextDeadline == at(1_080))
        #expect(
            leadership.refusal(holder: "a").contains("no leader is known (could not recover: a newer domain version)")
        )
    }

    @Test func anotherLeaderIsAnnouncedOnlyWhenItChanges() {
        var leadership = standby()
        let same = leader("b", term: 3, expiresIn: .seconds(2))
        #expect(leadership.attempted(.success(.standingBy(same)), now: at(0)).isEmpty)
        #expect(leadership.nextDeadline == at(1_000))
        _ = leadership.tick(now: at(1_000))
        let next = leader("c", term: 4, expiresIn: .milliseconds(200))
        #expect(leadership.attempted(.success(.standingBy(next)), now: at(1_010)) == [.announce])
        #expect(leadership.leader == next && leadership.nextDeadline == at(1_210))
        #expect(leadership.refusal(holder: "a").contains("c leads the journal (term 4"))
    }

    @Test func aFailedAttemptIsLoggedOncePerProblem() {
        var leadership = standby()
        #expect(
            leadership.attempted(.failure(Leadership.Failure("unreachable")), now: at(0)) == [
                .attemptFailed(reason: "unreachable")
            ]
        )
        #expect(leadership.leader == nil && leadership.problem == "unreachable")
        #expect(leadership.nextDeadline == at(1_000))
        _ = leadership.tick(now: at(1_000))
        #expect(leadership.attempted(.failure(Leadership.Failure("unreachable")), now: at(1_000)).isEmpty)
        _ = leadership.tick(now: at(2_000))
        // Reached again: the leader found is news, and the problem is gone.
        #expect(
            leadership.attempted(.success(.standingBy(leader("b", term: 3, expiresIn: .seconds(1)))), now: at(2_000))
                == [.announce]
        )
        #expect(leadership.problem == nil)
    }

    @Test func aLeaderFencedOutStandsByAndTriesAtOnce() {
        var leadership = leading()
        #expect(leadership.lost(stillHeld: nil, holder: "a", now: at(100)) == [.announce])
        #expect(leadership.role == .standingBy && leadership.leader == nil)
        #expect(leadership.tick(now: at(100)) == [.attemptLease])
    }

    @Test func aLeaderWhoseCommitFailedRecoversInTheSameTerm() {
        var leadership = leading()
        #expect(leadership.lost(stillHeld: 4, holder: "a", now: at(100)) == [.announce, .recover(term: 4)])
        let takeover = Leadership.Takeover(term: 4, previousHolder: "a", since: at(100), afterFailedCommit: true)
        #expect(leadership.role == .recovering(takeover))
        #expect(leadership.recovered(.success(()), now: at(200)) == [.lead(takeover)])
    }

    @Test func answersThatDoNotFitTheRoleChangeNothing() {
        var leadership = Leadership(
            leaseDuration: lease,
            startedWith: .standingBy(leader("b", term: 3, expiresIn: .seconds(1))),
            now: at(0)
        )
        #expect(leadership.attempted(.success(.leading(term: 9, previousHolder: "")), now: at(0)).isEmpty, "not asked")
        #expect(leadership.recovered(.success(()), now: at(0)).isEmpty, "not recovering")
        #expect(leadership.lost(stillHeld: nil, holder: "a", now: at(0)).isEmpty, "not leading")
        #expect(leadership.role == .standingBy)
    }

    /// A standby whose first attempt found b leading in term 3; its next attempt is due at once.
    func standby() -> Leadership {
        var leadership = Leadership(
            leaseDuration: lease,
            startedWith: .standingBy(leader("b", term: 3, expiresIn: .zero)),
            now: at(-10)
        )
        _ = leadership.tick(now: at(0))
        return leadership
    }

    func leading() -> Leadership {
        Leadership(leaseDuration: lease, startedWith: .leading(term: 4, previousHolder: ""), now: at(0))
    }
}
