import LockstepProtocol
import Testing

/// Where a client of a failover group sends next, stated step by step.
@Suite struct LeaderSearchTests {
    @Test func aSilentLeaderSendsTheClientToTheNextDaemon() {
        var search = LeaderSearch(endpoints: ["a", "b", "c"])
        #expect(search.endpoint == "a")
        search.timedOut()
        #expect(search.endpoint == "b")
        search.timedOut()
        search.timedOut()
        #expect(search.endpoint == "a", "every daemon is asked again in turn")
    }

    @Test func standbysAreSkippedAtOnceThenAskedAgainAfterAPause() {
        var search = LeaderSearch(endpoints: ["a", "b", "c"])
        #expect(search.notLeader() == .zero)
        #expect(search.endpoint == "b")
        #expect(search.notLeader() == .zero)
        #expect(search.endpoint == "c")
        // All three stand by (a takeover is under way): from the next one on, after a pause.
        #expect(search.notLeader() == LeaderSearch.pause)
        #expect(search.endpoint == "a")
        #expect(search.notLeader() == .zero)
        #expect(search.endpoint == "b")
        // b leads now: what was learnt is forgotten, so a later refusal moves on at once.
        search.answered()
        #expect(search.notLeader() == .zero)
        #expect(search.endpoint == "c")
    }

    @Test func aDaemonThatWentSilentIsNotAskedUntilTheNextTimeout() {
        // a (the leader) was killed; b stands by until it takes the lease.
        var search = LeaderSearch(endpoints: ["a", "b"])
        search.timedOut()
        #expect(search.endpoint == "b")
        // b says not_leader: a is silent, so b is asked again, after a pause, not the dead a at once.
        #expect(!search.currentIsStandingBy)
        #expect(search.notLeader() == LeaderSearch.pause)
        #expect(search.currentIsStandingBy)
        #expect(search.endpoint == "b")
        #expect(search.notLeader() == LeaderSearch.pause)
        #expect(search.endpoint == "b")
        // A request's timeout while at b sends the client to a again: a daemon that came back is found.
        search.timedOut()
        #expect(search.endpoint == "a")
        // a came back as a standby: b, no longer silent, is next, at once.
        #expect(search.notLeader() == .zero)
        #expect(search.endpoint == "b")
    }

    @Test func aDaemonThatAnsweredIsSlowNotSilent() {
        var search = LeaderSearch(endpoints: ["a", "b"])
        // a answered something (an `unavailable`, say), then let a request's timeout pass.
        search.answered()
        search.timedOut()
        #expect(search.endpoint == "b")
        // b stands by: a, slow but alive, is asked again at once.
        #expect(search.notLeader() == .zero)
        #expect(search.endpoint == "a")
    }

    @Test func aStandbyThatFallsSilentCountsAsSilentAtItsNextTimeout() {
        var search = LeaderSearch(endpoints: ["a", "b"])
        search.timedOut()
        #expect(search.notLeader() == LeaderSearch.pause)
        #expect(search.endpoint == "b")
        // b said not_leader, then died: its first timeout is forgiven, its next is not.
        search.timedOut()
        search.timedOut()
        #expect(search.endpoint == "b")
        search.timedOut()
        // a came back as a standby: b is silent now, so a is asked again after a pause rather than the dead b.
        #expect(search.endpoint == "a")
        #expect(search.notLeader() == LeaderSearch.pause)
        #expect(search.endpoint == "a")
    }

    @Test func aSingleDaemonIsAlwaysTheOneAsked() {
        var search = LeaderSearch(endpoints: ["a"])
        search.timedOut()
        #expect(search.endpoint == "a")
        #expect(search.notLeader() == LeaderSearch.pause)
        #expect(search.endpoint == "a")
    }
}
