import Foundation
import Lockstep
import LockstepProtocol
import ZeroMQ

/// The replica's two sockets: SUB for events, connected to every daemon (only a leader publishes), and DEALER
/// for requests, connected to the one ``search`` points at. Owned by the replica's thread.
struct Link {
    let context: Context
    let configuration: ReplicaConfiguration
    var search: LeaderSearch
    var events: Socket
    var commands: Socket

    init(context: Context, configuration: ReplicaConfiguration, topic: [UInt8]) throws {
        self.context = context
        self.configuration = configuration
        search = LeaderSearch(endpoints: configuration.daemons.map(\.command))
        events = try Socket(context, type: .subscriber)
        try events.set(.linger, 0)
        try events.set(.receiveHighWaterMark, Int32(clamping: configuration.eventsQueue))
        try configuration.curve?.configure(events)
        try events.subscribe(topic)
        for daemon in configuration.daemons { try events.connect(daemon.events) }
        commands = try Self.commandSocket(context, curve: configuration.curve, search.endpoint)
        // Every other command endpoint is tried now: one libzmq cannot connect to (a typo) fails the start, not the
        // first failover.
        for endpoint in search.endpoints.dropFirst() {
            try Self.commandSocket(context, curve: configuration.curve, endpoint).close()
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
        events.close()
        commands.close()
    }
}

/// A replica on its hub's thread (``ReplicaHub``): its engine and its sockets, opened on the hub's context.
final class ReplicaDriver<D: Domain>: HubDriver {
    let replica: Replica<D>
    private var engine: Engine<D>
    private var link: Link

    /// Opens the replica's sockets on `context` and asks the daemon for its snapshot.
    init(_ replica: Replica<D>, context: Context) throws {
        self.replica = replica
        link = try Link(
            context: context,
            configuration: replica.configuration,
            topic: Event.runTopic(for: replica.store)
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
            .socket(link.events, .readable), .socket(link.commands, .readable),
            .fileDescriptor(replica.wakeup.descriptor, .readable),
        ]
    }

    func nextDeadline(after now: ContinuousClock.Instant) -> ContinuousClock.Instant {
        engine.nextDeadline(after: now)
    }

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
