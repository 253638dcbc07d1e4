import Foundation
import Lockstep
import LockstepClient
import LockstepProtocol
import Testing
import ZeroMQ

#if canImport(Glibc)
import Glibc
#endif

/// A `CommandClient` given several daemons, against fake daemons in this process: inproc ROUTERs on a thread of
/// their own.
@Suite struct CommandClientTests {
    /// Fake standbys that answer every request `not_leader` — STATUS too, unless `statusAsStandby`, when they answer
    /// it as a standby does — and count what they heard, until stopped. Their sockets are made, used and closed by
    /// their thread.
    final class Standbys {
        let endpoints: [String]
        private let heard: LockedValue<[Int]>
        /// Set by the thread: bound (or failed to), then finished.
        private let state = LockedValue((bound: false, failure: String?.none, finished: false))
        private let stopping = LockedValue(false)

        /// Starts `count` standbys on `context` and returns once they are bound (at most 5 s).
        init(_ context: Context, count: Int, statusAsStandby: Bool = false) throws {
            let endpoints = (0..<count).map { "inproc://standby-\($0)-\(UInt32.random(in: 0...UInt32.max))" }
            self.endpoints = endpoints
            heard = LockedValue(Array(repeating: 0, count: count))
            let serving = Thread { [heard, state, stopping] in
                defer { state.withLockedValue { $0.finished = true } }
                let routers: [Socket]
                do {
                    routers = try endpoints.map { endpoint in
                        let router = try Socket(context, type: .router)
                        try router.set(.linger, 0)
                        try router.bind(endpoint)
                        return router
                    }
                } catch {
                    state.withLockedValue { $0.failure = "\(error)" }
                    return
                }
                defer { for router in routers { router.close() } }
                state.withLockedValue { $0.bound = true }
                while !stopping.withLockedValue({ $0 }) {
                    let ready = try? Poller(routers.map { .socket($0, .readable) }).poll(timeout: .milliseconds(20))
                    for (index, router) in routers.enumerated() where ready?[index].contains(.readable) == true {
                        // A REQ's request: its identity, the empty delimiter, the request.
                        guard let frames = try? router.receive(wait: false), frames.count > 2,
                            let request = try? Request.decode(Array(frames.dropFirst(2)))
                        else { continue }
                        heard.withLockedValue { $0[index] += 1 }
                        var answer = Reply.error(
                            requestID: request.requestID,
                            ProtocolError(code: .notLeader, "standby \(index) applies nothing")
                        )
                        if statusAsStandby, case .status = request {
                            answer = DaemonStatus(
                                uptimeSeconds: 1,
                                role: .standby,
                                name: "standby \(index)",
                                leader: DaemonStatus.Leader(
                                    name: "gone",
                                    term: 1,
                                    expiresAt: "2026-11-27T00:00:00.000Z"
                                ),
                                journal: "postgres",
                                stores: []
                            ).reply(to: request.requestID)
                        }
                        _ = try? router.send(Array(frames.prefix(2)) + answer.encode(), wait: false)
                    }
                }
            }
            serving.start()
            let deadline = ContinuousClock.now + .seconds(5)
            while !state.withLockedValue({ $0.bound || $0.finished }), ContinuousClock.now < deadline { usleep(1_000) }
            if let failure = state.withLockedValue({ $0.failure }) {
                throw ClientError(code: .transport, "the fake standbys could not bind: \(failure)")
            }
        }

        /// How many requests each standby heard.
        var requests: [Int] { heard.withLockedValue { $0 } }

        /// Stops the thread and waits for it, at most 5 s.
        func stop() {
            stopping.withLockedValue { $0 = true }
            let deadline = ContinuousClock.now + .seconds(5)
            while !state.withLockedValue({ $0.finished }), ContinuousClock.now < deadline { usleep(5_000) }
        }
    }

    /// The CPU time this thread has used.
    func threadCPUTime() -> Duration {
        var time = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time)
        return .seconds(time.tv_sec) + .nanoseconds(time.tv_nsec)
    }

    /// While every daemon says `not_leader` (a takeover under way), the client waits out each pause of the search
    /// in a poll, and asks again after it: a second of searching costs its thread next to no CPU. It used to spin
    /// through every pause — the socket was closed on `not_leader` and reopened only to send, so the wait for a
    /// reply returned at once — which the failover fault class showed as its 4 load threads busy in
    /// `LazyPirate.tick` and `nextDeadline` on a 2-core machine while the standby was taking over.
    @Test func aSearchWhereEveryDaemonStandsByWaitsOutItsPausesWithoutSpinning() throws {
        let context = try Context()
        let standbys = try Standbys(context, count: 2)
        defer { standbys.stop() }
        let client = CommandClient(
            context: context,
            endpoints: standbys.endpoints,
            timeout: .milliseconds(500),
            retries: 1
        )
        let before = threadCPUTime()
        let started = ContinuousClock.now
        let error = #expect(throws: ClientError.self) { try client.call(.status(requestID: 1)) }
        let searched = ContinuousClock.now - started
        let used = threadCPUTime() - before
        #expect(error?.code == .unavailable)
        #expect(error?.reason.contains("would lead") == true, "\(String(describing: error))")
        // Spinning through the pauses used most of the second (a quarter of it on a loaded machine); waiting in a
        // poll, a few ms: 100 ms is far from both.
        #expect(used < .milliseconds(100), "the client's thread used \(used) of CPU in a search of \(searched)")
        // Each pass asks each standby once, and a pass starts a pause after the last: at most one more pass than
        // the pauses the search lasted (spinning asked hundreds of times). Every standby is asked again.
        let requests = standbys.requests
        let passes = Int(searched / LeaderSearch.pause) + 1
        #expect(requests.reduce(0, +) <= 2 * passes, "\(requests) in \(searched)")
        #expect(requests.allSatisfy { $0 >= 2 }, "\(requests)")
    }

    /// A standby's STATUS is never taken for the leader's: `leaderStatus()` goes on asking, the standbys in turn and
    /// then again after a pause, until the tries are over — with one endpoint (a lone standby) as with two — and
    /// says that no daemon would lead and what the last one said. `status()` takes any daemon's.
    @Test(arguments: [1, 2])
    func aStandbysStatusIsNotTheLeaders(count: Int) throws {
        let context = try Context()
        let standbys = try Standbys(context, count: count, statusAsStandby: true)
        defer { standbys.stop() }
        let client = CommandClient(
            context: context,
            endpoints: standbys.endpoints,
            timeout: .milliseconds(300),
            retries: 1
        )
        let error = #expect(throws: ClientError.self) { try client.leaderStatus() }
        #expect(error?.code == .unavailable)
        #expect(error?.reason.contains("would lead") == true, "\(String(describing: error))")
        #expect(error?.reason.contains("stands by: gone leads (term 1") == true, "\(String(describing: error))")
        #expect(standbys.requests.allSatisfy { $0 >= 2 }, "asked again after a pause: \(standbys.requests)")
        let (status, _) = try client.status()
        #expect(status.role == .standby && status.name?.hasPrefix("standby") == true)
    }

    /// A lone standby's `not_leader` is not the reply either: a dispatch given one endpoint waits for it to lead,
    /// within its tries, and never returns the refusal.
    @Test func aLoneStandbysRefusalIsAskedAgainUntilTheTriesAreOver() throws {
        let context = try Context()
        let standbys = try Standbys(context, count: 1)
        defer { standbys.stop() }
        let client = CommandClient(
            context: context,
            endpoint: standbys.endpoints[0],
            timeout: .milliseconds(300),
            retries: 1
        )
        let dispatch = Request.dispatch(
            DispatchRequest(
                requestID: 7,
                domainVersion: 1,
                clientID: .random(),
                store: try StoreName("counter"),
                actions: [Array(#"{"increment":{}}"#.utf8)]
            )
        )
        let error = #expect(throws: ClientError.self) { try client.call(dispatch) }
        #expect(error?.code == .unavailable)
        #expect(
            error?.reason.contains("the daemon at \(standbys.endpoints[0]) would lead") == true,
            "\(String(describing: error))"
        )
        #expect(standbys.requests[0] >= 2, "asked again after a pause: \(standbys.requests)")
    }
}
