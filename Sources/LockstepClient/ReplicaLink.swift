import Foundation
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
