import ArgumentParser
import Foundation
import LockstepClient
import LockstepProtocol

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
        guard daemon.endpoints.count > 1 else { return show(try daemon.status(daemon.client())) }
        var answered = 0
        for (index, endpoint) in daemon.endpoints.enumerated() {
            if !json { print("\(index > 0 ? "\n" : "")daemon   \(endpoint)") }
            let client = try daemon.client(only: [endpoint])
            do throws(ClientError) {
                show(try client.leaderStatus())
                answered += 1
            } catch {
                printError("\(Tool.commandName): \(endpoint): \(error)")
            }
        }
        if answered == 0 { throw ExitCodes.unavailable }
    }

    private func show(_ answer: (status: DaemonStatus, body: [UInt8])) {
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
