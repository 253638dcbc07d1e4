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
    /// Fake standbys that answer every request `not_leader` and count what they heard, until stopped. Their sockets
    /// are made, used and closed by their thread.
    final class Standbys {
        let endpoints: [String]
        private let heard: LockedValue<[Int]>
        /// Set by the thread: bound (or failed to), then finished.
        private let state = LockedValue((bound: false, failure: String?.none, finished: false))
        private let stopping = LockedValue(false)

        /// Starts `count` standbys on `context` and returns once they are bound (at most 5 s).
        init(_ context: Context, count: Int) throws {
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
                        let refusal = Reply.error(
                            requestID: request.requestID,
                            ProtocolError(code: .notLeader, "standby \(index) applies nothing")
                        )
                        _ = try? router.send(Array(frames.prefix(2)) + refusal.encode(), wait: false)
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
        // Spinning, the thread used most of the second (a quarter of it on a loaded machine); waiting, a few ms.
        #expect(used < .milliseconds(100), "the client's thread used \(used) of CPU in a search of \(searched)")
        // Asked again after every pause of 200 ms, and no more often: about 8 requests in the second.
        let requests = standbys.requests
        #expect((4...16).contains(requests.reduce(0, +)), "\(requests)")
        #expect(requests.allSatisfy { $0 >= 2 }, "\(requests)")
    }
}
