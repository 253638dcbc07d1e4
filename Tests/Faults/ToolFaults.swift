import Foundation
import Lockstep
import LockstepClient
import LockstepJournal
import LockstepProtocol
import LockstepTesting
import ZeroMQ

#if canImport(Glibc)
import Glibc
#endif

extension Faults {
    /// The command-line tool through takeovers (docs/operations.md, "Clients of the pair"): two daemons on one
    /// PostgreSQL journal; whichever leads is killed -9 or stopped, in turn, and fresh `lockstep` processes — two
    /// dispatches (given both daemons, and given only the standby), `state`, `tail` and `stats` — start at random
    /// moments from just before the fault to after the takeover, with the tries the docs recommend (1 s × 21).
    /// Every one must exit as documented: dispatch, state and tail 0 (no give-up: the takeover is waited out),
    /// stats 0 with a leader in its output or 69 without; every dispatch a tool acknowledged is in the journal
    /// once, at the seq it printed.
    func toolThroughTakeovers() throws -> FaultResult {
        let (server, connection, daemons) = try pair("tool")
        defer { server.stop() }
        defer { for daemon in daemons { daemon.kill() } }
        let tries = ["--timeout-ms", "1000", "--retries", "20"]
        let nudger = CommandClient(
            context: try Context(),
            endpoints: daemons.map(\.command),
            timeout: .seconds(1),
            retries: 20
        )
        let nudgerID = ClientID.random()
        var nudges: UInt64 = 0
        var result = FaultResult(injected: 0, survived: 0, lost: 0)
        var acks: [Ack] = []
        var exits: [String: [Int32: Int]] = [:]
        // Quick mode: 10 cycles (5 kills, 5 stops), ~40 s of `make test`; long mode 200.
        for cycle in 1...(long ? 200 : 10) {
            guard let (killing, fault, leading, term, successor) = takeover(cycle, of: daemons) else {
                result.failure = result.failure ?? "no daemon said it leads within 10 s before cycle \(cycle)"
                break
            }
            let both = daemons.flatMap { ["--command-endpoint", $0.command] }
            let events = daemons.flatMap { ["--events-endpoint", $0.events] }
            var commands: [(name: String, text: String?, arguments: [String])] = [
                ("dispatch", "tool-\(cycle)-both", both),
                ("dispatch", "tool-\(cycle)-standby", ["--command-endpoint", successor.command]),
                ("state", nil, ["state", "todos", "--json"] + both + tries),
                ("tail", nil, ["tail", "todos", "--count", "1", "--json"] + both + events + tries),
                ("stats", nil, ["stats"] + both + ["--timeout-ms", "1000", "--retries", "1"]),
            ]
            for index in commands.indices where commands[index].name == "dispatch" {
                let action = #"{"add":{"text":"\#(commands[index].text!)"}}"#
                commands[index].arguments = ["dispatch", "todos", action, "--json"] + commands[index].arguments + tries
            }
            // Each starts at its own moment, from 300 ms before the fault to 4 s after it (a takeover takes ~3.5 s).
            var moments = commands.map { _ in Int.random(in: -300...4_000, using: &random) }
            let order = moments.indices.sorted { moments[$0] < moments[$1] }
            moments.sort()
            let start = ContinuousClock.now + .milliseconds(300)
            var started: [(index: Int, child: ChildProcess)] = []
            var injected = false
            for (position, index) in order.enumerated() {
                let at = start + .milliseconds(moments[position])
                if !injected, at >= start {
                    sleep(until: start)
                    if killing {
                        leading.kill()
                    } else {
                        _ = leading.pause()
                    }
                    injected = true
                }
                sleep(until: at)
                started.append((index, try ChildProcess(executable: Binaries.lockstep, commands[index].arguments)))
            }
            if !injected {
                sleep(until: start)
                if killing { leading.kill() } else { _ = leading.pause() }
            }
            result.injected += 1
            var problems: [String] = []
            let led = successor.waitForStatus(within: .seconds(20)) { $0.leads && ($0.leader?.term ?? 0) > term }
            if led == nil { problems.append("the standby did not lead within 20 s of the \(fault)") }
            if killing { try leading.start() } else { leading.signal(SIGCONT) }
            // A tail started after the dispatches' events waits for one more: nudged until it has printed one.
            let tail = started.first { commands[$0.index].name == "tail" }!.child
            let nudging = ContinuousClock.now + .seconds(30)
            while tail.process.isRunning, ContinuousClock.now < nudging {
                nudges += 1
                let text = "nudge-\(nudges)"
                if case let .accepted(_, _, seq, _) = try nudger.dispatch(
                    "todos",
                    #"{"add":{"text":"\#(text)"}}"#,
                    number: nudges,
                    clientID: nudgerID
                ) {
                    acks.append(Ack(text: text, seq: seq))
                }
                Thread.sleep(forTimeInterval: 0.2)
            }
            for (index, child) in started {
                let command = commands[index]
                let output: ProcessOutput
                do {
                    output = try child.finish(within: .seconds(40))
                } catch {
                    problems.append("lockstep \(command.name) did not finish within 40 s")
                    continue
                }
                exits[command.name, default: [:]][output.status, default: 0] += 1
                let said = output.standardError.split(separator: "\n").last.map(String.init) ?? ""
                switch command.name {
                case "dispatch":
                    guard output.status == 0,
                        let line = output.standardOutput.split(separator: "\n").last,
                        let printed = try? JSONDecoder().decode(Printed.self, from: Data(line.utf8))
                    else {
                        problems.append("dispatch of '\(command.text!)' exited \(output.status): \(said)")
                        continue
                    }
                    acks.append(Ack(text: command.text!, seq: printed.seq))
                case "stats":
                    let leaderShown = output.standardOutput.contains("role     leader")
                    if !(output.status == 0 && leaderShown) && !(output.status == 69 && !leaderShown) {
                        problems.append("stats exited \(output.status) with a leader \(leaderShown ? "" : "not ")shown")
                    }
                default:
                    if output.status != 0 { problems.append("\(command.name) exited \(output.status): \(said)") }
                }
            }
            let standing = leading.waitForStatus(within: .seconds(15)) { $0.role == .standby && $0.leader != nil }
            if standing == nil { problems.append("after the \(fault) it did not stand by") }
            if problems.isEmpty {
                result.survived += 1
            } else {
                let failure = "cycle \(cycle) (\(fault)): " + problems.joined(separator: "; ")
                if result.failure == nil { result.failure = failure } else { result.notes.append(failure) }
            }
        }
        let summary = exits.sorted { $0.key < $1.key }.map { name, statuses in
            "\(name) "
                + statuses.sorted { $0.key < $1.key }.map { "exit \($0.key) × \($0.value)" }.joined(separator: ", ")
        }
        result.notes.append("tool processes: " + summary.joined(separator: "; "))
        for daemon in daemons where daemon.stop() != 0 && daemon.isRunning {
            result.failure = result.failure ?? "lockstepd did not exit 0 on SIGTERM; see \(daemon.log.path)"
        }
        let journal = try PostgresJournal(connection: connection, readOnly: true)
        defer { try? journal.close() }
        let check = try checkJournal(journal, acks: acks)
        result.lost += check.lost + check.duplicated + check.unexpected
        result.notes += check.problems
        if check.holes > 0 { result.failure = result.failure ?? "the journal's seqs have \(check.holes) holes" }
        result.notes.append("\(acks.count) dispatches acknowledged (tools and nudges) and found once at their seq")
        return result
    }

    /// What `lockstep dispatch --json` prints.
    private struct Printed: Decodable {
        var seq: SequenceNumber
    }

    private func sleep(until instant: ContinuousClock.Instant) {
        let wait = instant - ContinuousClock.now
        if wait > .zero { Thread.sleep(forTimeInterval: Double(wait / .microseconds(1)) / 1_000_000) }
    }
}
