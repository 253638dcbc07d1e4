import Foundation
import Synchronization
import ZeroMQ

/// One thread, one ZeroMQ context and one subscription per set of daemons that many replicas in a process share:
/// give the same hub to each (`Replica(Todos.self, configuration: …, hub: hub)`). The hub's SUB to a set of daemons
/// subscribes to the topic of each store its replicas follow and hands each message to the replicas of that store;
/// each replica keeps its own DEALER for requests and its own wake-up descriptor. The hub's thread polls them all at
/// once and runs each replica's turn in that thread, one after another. A replica made without a hub gets one of its own, so it runs
/// exactly as it would in a shared one.
///
/// The thread and the context exist while at least one replica runs: the first ``Replica/run()`` starts them, and
/// they end when the last one returns. A replica's divergence digests for states too large to take on the thread
/// go to one background thread of the hub's, at a low priority.
///
/// What a replica costs in a shared hub: no thread, a DEALER and a descriptor, and its state.
public final class ReplicaHub: Sendable {
    private struct Joining: Sendable {
        var open: @Sendable (HubSockets) throws -> any HubDriver
        var done: @Sendable (Result<Void, any Error>) -> Void
    }

    private struct State {
        var joining: [Joining] = []
        var running = false
    }

    private let state = Mutex(State())
    private let wakeup: Wakeup
    /// Encodes and hashes replicas' states for their digest checks, off the hub's thread.
    let digests = BackgroundThread(name: "replica digests")

    /// A hub with no replica yet: no thread and no context until one runs.
    public init() throws {
        wakeup = try Wakeup()
    }

    deinit {
        digests.stop()
    }

    /// Runs the driver `open` makes on the hub's thread (its sockets on the hub's context) until its turn says it is
    /// done; throws what it threw.
    func run(_ open: @escaping @Sendable (HubSockets) throws -> any HubDriver) async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            let start = state.withLock { state in
                state.joining.append(Joining(open: open, done: { continuation.resume(with: $0) }))
                defer { state.running = true }
                return !state.running
            }
            guard start else { return wakeup.signal() }
            let thread = Thread { self.loop() }
            thread.name = "lockstep replicas"
            thread.start()
        }
    }

    /// The hub's thread: it alone touches the members' sockets.
    private func loop() {
        nameCurrentThread("replicas")
        var members: [(driver: any HubDriver, done: @Sendable (Result<Void, any Error>) -> Void)] = []
        var sockets: HubSockets?
        defer { sockets?.close() }
        while true {
            let joining = state.withLock { state -> [Joining]? in
                defer { state.joining.removeAll() }
                if members.isEmpty, state.joining.isEmpty {
                    state.running = false
                    return nil
                }
                return state.joining
            }
            guard let joining else { return }
            for member in joining {
                do {
                    if sockets == nil { sockets = HubSockets(context: try Context()) }
                    members.append((try member.open(sockets!), member.done))
                } catch {
                    member.done(.failure(error))
                }
            }
            guard let hub = sockets, !members.isEmpty else { continue }
            let now = ContinuousClock.now
            // A member with events in its inbox still (more than one turn reads) goes on at once.
            let deadline =
                members.contains { $0.driver.hasEvents }
                ? now : members.reduce(now + .milliseconds(100)) { min($0, $1.driver.nextDeadline(after: now)) }
            let subscribers = hub.subscribers
            var items: [Poller.Item] = [.fileDescriptor(wakeup.descriptor, .readable)]
            items += subscribers.map { .socket($0.socket, .readable) }
            var ranges: [Range<Int>] = []
            for member in members {
                let first = items.count
                items += member.driver.pollItems
                ranges.append(first..<items.count)
            }
            let timeout = max(.zero, deadline - now)
            var failure: (any Error)?
            do {
                let ready = try Poller(items).poll(timeout: timeout)
                if ready[0].contains(.readable) { wakeup.drain() }
                for (index, subscriber) in subscribers.enumerated() where ready[1 + index].contains(.readable) {
                    try subscriber.deliver()
                }
                // Woken far later than asked: this process was stopped, and the silence meanwhile is not the daemons'.
                let woke = ContinuousClock.now
                let resumed = woke - now > timeout + .seconds(1) ? woke : nil
                var index = 0
                for (member, range) in zip(members, ranges) {
                    do {
                        if try member.driver.turn(ready[range], resumedAt: resumed) {
                            index += 1
                            continue
                        }
                        member.driver.close(nil)
                        member.done(.success(()))
                    } catch {
                        member.driver.close(error)
                        member.done(.failure(error))
                    }
                    members.remove(at: index)
                }
            } catch {
                failure = error
            }
            if let failure {
                // The poll or a shared socket failed: every member learns it, as it would alone.
                for member in members {
                    member.driver.close(failure)
                    member.done(.failure(failure))
                }
                members.removeAll()
            }
            hub.closeUnused()
        }
    }
}

/// The hub's context and its SUB sockets, one per set of daemons its replicas follow. Used on the hub's thread only.
final class HubSockets {
    let context: Context
    private var shared: [Key: SharedSubscriber] = [:]

    private struct Key: Hashable {
        var endpoints: [String]
        var curve: ClientCurve?
    }

    init(context: Context) {
        self.context = context
    }

    var subscribers: [SharedSubscriber] { Array(shared.values) }

    /// The SUB to the events `endpoints` with `curve`, made (with a queue of `queue` messages) for the first replica
    /// that follows them.
    func subscriber(to endpoints: [String], curve: ClientCurve?, queue: Int) throws -> SharedSubscriber {
        let key = Key(endpoints: endpoints, curve: curve)
        if let subscriber = shared[key] { return subscriber }
        let subscriber = try SharedSubscriber(context, endpoints: endpoints, curve: curve, queue: queue)
        shared[key] = subscriber
        return subscriber
    }

    /// Closes the SUBs no replica follows any more.
    func closeUnused() {
        for (key, subscriber) in shared where subscriber.isUnused {
            subscriber.socket.close()
            shared[key] = nil
        }
    }

    func close() {
        for subscriber in shared.values { subscriber.socket.close() }
        shared.removeAll()
        context.shutdown()
    }
}

/// A replica as the hub's thread drives it: the sockets and descriptors to poll, and a turn after each poll. Used on
/// the hub's thread only.
protocol HubDriver: AnyObject {
    /// What to poll for it, in an order its turn knows.
    var pollItems: [Poller.Item] { get }
    /// Whether events wait in its inbox (the hub's SUB put them there).
    var hasEvents: Bool { get }
    /// When its next turn is due at the latest, with nothing to read.
    func nextDeadline(after now: ContinuousClock.Instant) -> ContinuousClock.Instant
    /// One turn after a poll: `ready` holds what ``pollItems`` got, in order; `resumedAt` says the process was
    /// stopped meanwhile. `false` once it is done.
    func turn(_ ready: ArraySlice<PollEvents>, resumedAt: ContinuousClock.Instant?) throws -> Bool
    /// Closes its sockets and answers what still waits; `error` when it failed.
    func close(_ error: (any Error)?)
}
