import ArgumentParser
import Foundation
import LockstepProtocol
import ZeroMQ

/// Asks a running daemon for its status.
struct StatsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stats",
        abstract: "Print a running daemon's status: per store seq, epoch and events/s; journal size; uptime."
    )

    @Option(help: "The daemon's command endpoint.")
    var commandEndpoint = "ipc://.lockstep/run/command"

    @Option(help: "How long to wait for the daemon, in milliseconds.")
    var timeout: Int32 = 3_000

    @Flag(help: "Print the daemon's status JSON as it came.")
    var json = false

    func run() throws {
        let context = try Context()
        let socket = try Socket(context, type: .request)
        try socket.set(.receiveTimeout, timeout)
        try socket.set(.sendTimeout, timeout)
        try socket.connect(commandEndpoint)
        guard try socket.send(Request.status(requestID: 1).encode()), let frames = try socket.receive() else {
            printError(
                "lockstep: no answer from a daemon at \(commandEndpoint) within \(timeout) ms; is lockstepd running "
                    + "in this folder, or is --command-endpoint right?"
            )
            throw ExitCodes.unavailable
        }
        switch try Reply.decode(frames) {
        case let .status(_, body):
            if json {
                print(String(decoding: body, as: UTF8.self))
                return
            }
            let status = try JSONDecoder().decode(DaemonStatus.self, from: Data(body))
            print("uptime   \(status.uptimeSeconds) s")
            print("journal  \(status.journal)\(status.journalBytes.map { " (\($0) bytes)" } ?? "")")
            print("")
            print("store            seq         epoch               version  events/s")
            for store in status.stores {
                print(
                    store.name.padding(toLength: 16, withPad: " ", startingAt: 0),
                    String(store.seq).padding(toLength: 11, withPad: " ", startingAt: 0),
                    store.epoch.padding(toLength: 19, withPad: " ", startingAt: 0),
                    String(store.domainVersion).padding(toLength: 8, withPad: " ", startingAt: 0),
                    String(format: "%.1f", store.eventsPerSecond)
                )
            }
        case let .error(_, error):
            printError("lockstep: the daemon refused the status request: \(error)")
            throw ExitCode.failure
        case let other:
            printError("lockstep: unexpected reply to STATUS: \(other)")
            throw ExitCode.failure
        }
    }
}

/// The STATUS reply's JSON (docs/operations.md).
struct DaemonStatus: Decodable {
    struct Store: Decodable {
        var name: String
        var seq: UInt64
        var epoch: String
        var domainVersion: UInt32
        var eventsPerSecond: Double
    }

    var uptimeSeconds: Int64
    var journal: String
    var journalBytes: Int64?
    var stores: [Store]
}
