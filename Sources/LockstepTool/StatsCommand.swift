import ArgumentParser
import Foundation
import LockstepClient
import LockstepProtocol

/// Asks each running daemon for its status.
struct StatsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stats",
        abstract:
            "Print each daemon's status: its role; per store seq, epoch, events/s, last digest, rejections and refusals; journal size; uptime.",
        discussion: """
            Every --command-endpoint is asked, leader and standbys alike, one after another; a daemon silent for \
            (--retries + 1) tries of --timeout-ms is marked silent. With --json, one object per daemon and line: \
            its status with "endpoint" added, or {"endpoint":…,"silent":true,"error":…}. Exit 0 when a leading \
            daemon answered, 69 when none did.
            """
    )

    @OptionGroup var daemon: DaemonOptions

    @Flag(help: "Print each daemon's status JSON, with its endpoint, one per line.")
    var json = false

    func run() throws {
        if daemon.endpoints.count == 1 { try requireSocket(daemon.endpoints[0], flag: "--command-endpoint") }
        var led = false
        for (index, endpoint) in daemon.endpoints.enumerated() {
            if !json { print("\(index > 0 ? "\n" : "")daemon   \(endpoint)") }
            let client = try daemon.client(at: endpoint)
            do throws(ClientError) {
                let answer = try client.status()
                led = led || answer.status.leads
                show(answer, endpoint: endpoint)
            } catch {
                if json {
                    print(#"{"endpoint":\#(jsonString(endpoint)),"silent":true,"error":\#(jsonString("\(error)"))}"#)
                } else {
                    print("silent   \(error)")
                }
                printError("\(Tool.commandName): \(endpoint): \(error)")
            }
        }
        guard led else {
            printError("\(Tool.commandName): no daemon at \(daemon.endpoints.joined(separator: ", ")) leads")
            throw ExitCodes.unavailable
        }
    }

    private func show(_ answer: (status: DaemonStatus, body: [UInt8]), endpoint: String) {
        let (status, body) = answer
        if json {
            // The daemon's own JSON, as it came, with the endpoint first: readers ignore fields they do not know.
            let text = String(decoding: body, as: UTF8.self)
            let rest = text.drop { $0 != "{" }.dropFirst().drop { $0 == " " }
            print(#"{"endpoint":\#(jsonString(endpoint))\#(rest.first == "}" ? "" : ",")\#(rest)"#)
            return
        }
        let leader = status.leader.map { " (leader \($0.name), term \($0.term))" } ?? ""
        print("role     \(status.role ?? .leader)\(status.name.map { " as \($0)" } ?? "")\(leader)")
        print("uptime   \(status.uptimeSeconds) s")
        print("journal  \(status.journal)\(status.journalBytes.map { " (\($0) bytes)" } ?? "")")
        let refused = (status.refused ?? [:]).sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }
        print("refused  \(refused.isEmpty ? "none" : refused.joined(separator: ", "))")
        if let http = status.http { print("http     http://\(http)/metrics") }
        print("")
        print("store            seq         epoch               version  events/s  effects")
        for store in status.stores {
            let effects = store.effects.map { "\($0.pending) pending, \($0.dead) dead, \($0.timers) timers" } ?? "-"
            print(
                store.name.padding(toLength: 16, withPad: " ", startingAt: 0),
                String(store.seq).padding(toLength: 11, withPad: " ", startingAt: 0),
                store.epoch.padding(toLength: 19, withPad: " ", startingAt: 0),
                String(store.domainVersion).padding(toLength: 8, withPad: " ", startingAt: 0),
                String(format: "%.1f", store.eventsPerSecond).padding(toLength: 9, withPad: " ", startingAt: 0),
                effects
            )
        }
        print("")
        print("store            last digest, and dispatches rejected and refused since the daemon began serving")
        for store in status.stores {
            func counts(_ counts: [String: UInt64]?) -> String {
                let sorted = (counts ?? [:]).sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }
                return sorted.isEmpty ? "none" : sorted.joined(separator: ", ")
            }
            print(
                store.name.padding(toLength: 16, withPad: " ", startingAt: 0),
                store.digest.map { "\($0.digest) at seq \($0.seq)" } ?? "no digest yet"
            )
            print(
                String(repeating: " ", count: 16),
                "rejected \(counts(store.rejected)); refused \(counts(store.refused))"
            )
        }
        guard let replicas = status.replicas else { return }
        print("")
        print("store            replica                    seq         lag events  lag ms    heard ms ago  counts")
        for replica in replicas {
            print(
                replica.store.padding(toLength: 16, withPad: " ", startingAt: 0),
                "\(replica.name) \(replica.client.prefix(8))".padding(toLength: 26, withPad: " ", startingAt: 0),
                String(replica.seq).padding(toLength: 11, withPad: " ", startingAt: 0),
                String(replica.lagEvents).padding(toLength: 11, withPad: " ", startingAt: 0),
                String(replica.lagMs).padding(toLength: 9, withPad: " ", startingAt: 0),
                String(replica.heardMsAgo).padding(toLength: 13, withPad: " ", startingAt: 0),
                "\(replica.repairs) repairs, \(replica.resyncs) resyncs, \(replica.divergences) divergences"
            )
        }
        if replicas.isEmpty { print("(no replica reported lately)") }
    }
}
