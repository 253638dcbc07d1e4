import ArgumentParser
import Foundation
import Lockstep
import LockstepClient
import LockstepProtocol
import ZeroMQ

/// Prints a store's state as the daemon holds it, from a snapshot.
struct StateCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "state",
        abstract: "Print a store's state, seq, epoch and digest, from the daemon's snapshot.",
        discussion: """
            Works for any domain: the state is printed as the daemon encodes it (canonical JSON). The snapshot comes \
            from the daemon that leads, a takeover waited out as dispatch does. Exit 64 when the leader hosts no \
            such store, 69 when no daemon leads within the tries.
            """
    )

    @Argument(help: "The store's name.")
    var store: String

    @OptionGroup var daemon: DaemonOptions

    @Flag(help: "Print {\"store\":…,\"epoch\":…,\"seq\":…,\"digest\":…,\"state\":…}.")
    var json = false

    func run() throws {
        let name = try storeName(store)
        let reply = try daemon.call(try daemon.client(), .snapshot(requestID: 1, store: name))
        switch reply {
        case let .snapshot(_, snapshot):
            guard StateDigest(of: snapshot.state) == snapshot.digest else {
                printError(
                    "\(Tool.commandName): the snapshot's state does not match its digest; it was damaged on the way"
                )
                throw ExitCode.failure
            }
            let state = String(decoding: snapshot.state, as: UTF8.self)
            if json {
                print(
                    #"{"store":"\#(name)","epoch":"\#(snapshot.epoch)","seq":\#(snapshot.seq),"#
                        + #""digest":"\#(snapshot.digest)","state":\#(state)}"#
                )
            } else {
                print("store   \(name)")
                print("epoch   \(snapshot.epoch)")
                print("seq     \(snapshot.seq)")
                print("digest  \(snapshot.digest)")
                print("state   \(state)")
            }
        case let other:
            throw unexpected(other, to: "SNAPSHOT")
        }
    }
}

/// Prints a store's events as the daemon publishes them.
struct TailCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tail",
        abstract: "Print a store's events as the daemon publishes them, one per line.",
        discussion: """
            Stops after --count events, or runs until interrupted. Heartbeats and digests are not printed. First it \
            asks the leading daemon (--command-endpoint, as dispatch does) whether it hosts the store: exit 64 when \
            not, 69 when no daemon leads within the tries; with --events-endpoint given and no --command-endpoint \
            it does not ask. It listens on every events endpoint (only the leader publishes, so it follows a \
            takeover) and exits 69 when nothing arrives for --silence-ms.
            """
    )

    @Argument(help: "The store's name.")
    var store: String

    @Option(
        name: .customLong("events-endpoint"),
        help: ArgumentHelp(
            "The daemon's events endpoint (default ipc://.lockstep/run/events).",
            discussion: "Give it once for each daemon of a failover group: only the leader publishes."
        )
    )
    var eventsEndpoints: [String] = []

    @Option(help: "Stop after this many events.")
    var count: Int?

    @Option(help: "Give up when nothing (not even a heartbeat) arrives for this many milliseconds.")
    var silenceMs = 10_000

    @Flag(help: "Print {\"store\":…,\"epoch\":…,\"seq\":…,\"action\":…} per event.")
    var json = false

    @OptionGroup var daemon: DaemonOptions

    func run() throws {
        let name = try storeName(store)
        if let count, count < 1 { throw ValidationError("--count must be at least 1, got \(count)") }
        if eventsEndpoints.isEmpty || !daemon.commandEndpoints.isEmpty {
            _ = try daemon.requireStore(name, try daemon.client())
        }
        let context = try Context()
        let socket = try Socket(context, type: .subscriber)
        try socket.set(.receiveTimeout, Int32(clamping: silenceMs))
        try socket.set(.receiveHighWaterMark, 0)
        try daemon.curve.clientCurve()?.configure(socket)
        try socket.subscribe(Event.topic(for: name))
        let endpoints = eventsEndpoints.isEmpty ? [DaemonEndpoints.defaults.events] : eventsEndpoints
        if endpoints.count == 1 { try requireSocket(endpoints[0], flag: "--events-endpoint") }
        for endpoint in endpoints { try socket.connect(endpoint) }
        var printed = 0
        while count.map({ printed < $0 }) ?? true {
            guard let frames = try socket.receive() else {
                printError(
                    "\(Tool.commandName): nothing from \(endpoints.joined(separator: ", ")) for \(silenceMs) ms (not "
                        + "even a heartbeat); is the daemon running and hosting '\(name)'?"
                )
                throw ExitCodes.unavailable
            }
            guard case let .event(_, epoch, seq, action, author) = try Event.decode(frames) else { continue }
            let text = String(decoding: action, as: UTF8.self)
            // An author is a name of the daemon's policy (letters, digits, '-', '_'): nothing to escape in JSON.
            let by = author.isUnknown ? "" : json ? #","author":"\#(author.name)""# : "  by \(author.name)"
            print(
                json
                    ? #"{"store":"\#(name)","epoch":"\#(epoch)","seq":\#(seq),"action":\#(text)\#(by)}"#
                    : "\(seq)  \(text)\(by)"
            )
            fflush(nil)
            printed += 1
        }
    }
}
