import Foundation
import Lockstep
import LockstepProtocol
import Tracing
import ZeroMQ

/// The replica's two ways to its daemons: the events of its store, from the hub's SUB for those daemons (shared with
/// the hub's other replicas of them), and a DEALER of its own for requests, connected to the one ``search`` points
/// at. Owned by the hub's thread.
struct Link {
    let context: Context
    let configuration: ReplicaConfiguration
    var search: LeaderSearch
    /// Where the hub puts the events of the replica's topic.
    let events: EventInbox
    private let subscriber: SharedSubscriber
    private let topic: [UInt8]
    /// The store's trace topic, followed when the process traces (a tracer is bootstrapped).
    private let traceTopic: [UInt8]?
    var commands: Socket

    init(hub: HubSockets, configuration: ReplicaConfiguration, topic: [UInt8], traceTopic: [UInt8]? = nil) throws {
        context = hub.context
        self.configuration = configuration
        self.topic = topic
        self.traceTopic = traceTopic
        search = LeaderSearch(endpoints: configuration.daemons.map(\.command))
        events = EventInbox()
        subscriber = try hub.subscriber(
            to: configuration.daemons.map(\.events),
            curve: configuration.curve,
            queue: configuration.eventsQueue
        )
        commands = try Self.commandSocket(context, curve: configuration.curve, search.endpoint)
        do {
            // Every other command endpoint is tried now: one libzmq cannot connect to (a typo) fails the start, not
            // the first failover.
            for endpoint in search.endpoints.dropFirst() {
                try Self.commandSocket(context, curve: configuration.curve, endpoint).close()
            }
            // The trace topic first: an event heard on the store's topic then shows that both subscriptions reached
            // the daemon (they go in order).
            if let traceTopic { try subscriber.join(traceTopic, events) }
            try subscriber.join(topic, events)
        } catch {
            commands.close()
            throw error
        }
    }

    /// A DEALER to the command endpoint `endpoint`, with CURVE when `curve` is given; it drops what it holds when
    /// closed.
    static func commandSocket(_ context: Context, curve: ClientCurve?, _ endpoint: String) throws -> Socket {
        let socket = try Socket(context, type: .dealer)
        try socket.set(.linger, 0)
        try curve?.configure(socket)
        try socket.connect(endpoint)
        return socket
    }

    /// Lazy Pirate: a socket whose peer went silent may hold lost requests; start a fresh one, to the daemon
    /// ``search`` points at now.
    mutating func renewCommandSocket() throws {
        commands.close()
        commands = try Self.commandSocket(context, curve: configuration.curve, search.endpoint)
    }

    func send(_ request: Request) {
        // A full queue (no daemon for a long while) counts as lost; the request's timeout sends it again.
        _ = try? commands.send(request.encode(), wait: false)
    }

    func close() {
        subscriber.leave(topic, events)
        if let traceTopic { subscriber.leave(traceTopic, events) }
        commands.close()
    }
}

/// A replica on its hub's thread (``ReplicaHub``): its engine, its DEALER on the hub's context, its topic on the
/// hub's SUB.
final class ReplicaDriver<D: Domain>: HubDriver {
    let replica: Replica<D>
    private var engine: Engine<D>
    private var link: Link

    /// Opens the replica's sockets on `context` and asks the daemon for its snapshot.
    init(_ replica: Replica<D>, hub: HubSockets) throws {
        self.replica = replica
        link = try Link(
            hub: hub,
            configuration: replica.configuration,
            topic: Event.runTopic(for: replica.store),
            traceTopic: InstrumentationSystem.tracer is NoOpTracer ? nil : Event.traceTopic(for: replica.store)
        )
        engine = Engine(replica: replica, sync: ReplicaSync(settings: replica.configuration.sync, now: .now))
        do {
            try engine.perform(engine.sync.start(now: .now), on: &link)
        } catch {
            link.close()
            throw error
        }
    }

    var pollItems: [Poller.Item] {
        [
            .socket(link.commands, .readable), .fileDescriptor(replica.wakeup.descriptor, .readable),
        ]
    }

    func nextDeadline(after now: ContinuousClock.Instant) -> ContinuousClock.Instant {
        engine.nextDeadline(after: now)
    }

    var hasEvents: Bool { !link.events.isEmpty }

    func turn(_ ready: ArraySlice<PollEvents>, resumedAt: ContinuousClock.Instant?) throws -> Bool {
        try replica.turn(&engine, &link, ready, resumedAt: resumedAt)
    }

    func close(_ error: (any Error)?) {
        if let error {
            engine.failAll([], ClientError(code: .stopped, "the replica of '\(replica.store)' stopped: \(error)"))
        }
        link.close()
        replica.finish()
    }
}

/// The events of one replica's topic, put there by the hub's thread from a shared SUB and taken by the replica's
/// turn on the same thread.
final class EventInbox {
    private var messages: [[[UInt8]]] = []
    private var head = 0

    var isEmpty: Bool { head == messages.count }

    func put(_ frames: [[UInt8]]) { messages.append(frames) }

    /// The oldest message not taken yet.
    func take() -> [[UInt8]]? {
        guard head < messages.count else { return nil }
        defer {
            head += 1
            if head == messages.count {
                messages.removeAll(keepingCapacity: true)
                head = 0
            }
        }
        return messages[head]
    }
}

/// One SUB socket to a set of daemons' events endpoints, shared by every replica of the hub that follows them: a
/// topic is subscribed while one replica follows it, and each message goes to the inboxes of its topic (two
/// replicas of one store each get it). Used on the hub's thread only.
final class SharedSubscriber {
    let socket: Socket
    private var inboxes: [[UInt8]: [EventInbox]] = [:]

    init(_ context: Context, endpoints: [String], curve: ClientCurve?, queue: Int) throws {
        socket = try Socket(context, type: .subscriber)
        do {
            try socket.set(.linger, 0)
            try socket.set(.receiveHighWaterMark, Int32(clamping: queue))
            try curve?.configure(socket)
            for endpoint in endpoints { try socket.connect(endpoint) }
        } catch {
            socket.close()
            throw error
        }
    }

    var isUnused: Bool { inboxes.isEmpty }

    func join(_ topic: [UInt8], _ inbox: EventInbox) throws {
        if inboxes[topic] == nil { try socket.subscribe(topic) }
        inboxes[topic, default: []].append(inbox)
    }

    func leave(_ topic: [UInt8], _ inbox: EventInbox) {
        inboxes[topic]?.removeAll { $0 === inbox }
        guard inboxes[topic]?.isEmpty == true else { return }
        inboxes[topic] = nil
        try? socket.unsubscribe(topic)
    }

    /// Hands what the socket holds (at most `limit` messages) to the inboxes of their topics.
    func deliver(limit: Int = 10_000) throws {
        for _ in 0..<limit {
            guard let frames = try socket.receive(wait: false) else { return }
            // A message of a topic no one follows now (subscribed a moment ago) is dropped, as the SUB would.
            guard let topic = frames.first, let followers = inboxes[topic] else { continue }
            for inbox in followers { inbox.put(frames) }
        }
    }
}
