import ArgumentParser
import Foundation
import LockstepClient
import LockstepProtocol
import ZeroMQ

/// Asks a running daemon for its status.
struct StatsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stats",
        abstract: "Print a running daemon's status: per store seq, epoch and events/s; journal size; uptime."
    )

    @OptionGroup var daemon: DaemonOptions

    @Flag(help: "Print the daemon's status JSON as it came.")
    var json = false

    func run() throws {
        // Each daemon of a failover group for itself: which leads, and what each sees.
        guard daemon.endpoints.count > 1 else { return try show(daemon.status(daemon.client())) }
        let curve = try daemon.curve.clientCurve()
        var answered = 0
        for (index, endpoint) in daemon.endpoints.enumerated() {
            if !json { print("\(index > 0 ? "\n" : "")daemon   \(endpoint)") }
            do {
                let client = CommandClient(
                    context: try Context(),
                    endpoint: endpoint,
                    timeout: .milliseconds(daemon.timeoutMs),
                    retries: daemon.retries,
                    curve: curve
                )
                let reply = try client.call(.status(requestID: 1))
                guard case let .status(_, body) = reply, let status = DaemonStatus(reply) else {
                    throw ClientError(code: .protocolViolation, "not a readable status: \(reply)")
                }
                try show((status, body))
                answered += 1
            } catch {
                printError("\(Tool.commandName): \(endpoint): \(error)")
            }
        }
        if answered == 0 { throw ExitCodes.unavailable }
    }

    private func show(_ answer: (status: DaemonStatus, body: [UInt8])) throws {
        let (status, body) = answer
        if json {
            print(String(decoding: body, as: UTF8.self))
            return
        }
        let leader = status.leader.map { " (leader \($0.name), term \($0.term))" } ?? ""
        print("role     \(status.role ?? "leader")\(status.name.map { " as \($0)" } ?? "")\(leader)")
        print("uptime   \(status.uptimeSeconds) s")
        print("journal  \(status.journal)\(status.journalBytes.map { " (\($0) bytes)" } ?? "")")
        let refused = (status.refused ?? [:]).sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }
        print("refused  \(refused.isEmpty ? "none" : refused.joined(separator: ", "))")
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
    }
}
