import ArgumentParser
import Foundation
import Lockstep
import LockstepExamples
import LockstepProtocol
import LockstepTesting

/// Replays an action log through several replicas of an example domain, here and in child processes.
struct ReplayCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "replay",
        abstract: "Replay an action log through several replicas and report where they diverge.",
        discussion: """
            The log is a file of JSON lines — plain actions, or the {"store","seq","action"} lines that \
            'lockstep journal dump' writes — or a seeded sequence from the domain's generator. Replicas run in \
            this process (with encode/decode round trips at seeded points) and in child processes (with their \
            own hash seeds); digests are compared at every checkpoint. Exit 0 when all agree, 4 on a \
            divergence, which is printed with its first seq, action and a diff of the two states.
            """
    )

    @Argument(help: "The example store: \(Examples.domains.map { $0.name }.joined(separator: ", ")).")
    var store: String

    @Option(help: "A file of JSON lines to replay; - reads standard input.")
    var input: String?

    @Option(help: "Instead of a file, generate this many actions with the domain's generator.")
    var generate: Int?

    @Option(help: "Seed for --generate and for the round-trip points.")
    var seed: UInt64 = 1

    @Option(help: "Replicas in this process.")
    var replicas = 3

    @Option(help: "Replicas in child processes.")
    var processes = 1

    @Option(help: "Compare digests every N events (default: every event up to 10,000 events, else every 1,000).")
    var checkpointEvery: Int?

    @Flag(help: "Print one JSON object.")
    var json = false

    func validate() throws {
        guard (input == nil) != (generate == nil) else {
            throw ValidationError("give exactly one of --input FILE or --generate N")
        }
        guard (1...64).contains(replicas) else { throw ValidationError("--replicas must be 1...64, got \(replicas)") }
        guard (0...64).contains(processes) else {
            throw ValidationError("--processes must be 0...64, got \(processes)")
        }
        if let checkpointEvery, checkpointEvery < 1 {
            throw ValidationError("--checkpoint-every must be at least 1, got \(checkpointEvery)")
        }
    }

    func run() throws {
        guard let domain = Examples.domain(named: store) else {
            throw ValidationError(
                "unknown store '\(store)'; the example stores are "
                    + Examples.domains.map { $0.name }.joined(separator: ", ")
            )
        }
        try replay(domain)
    }

    private func replay<D: ActionGenerating>(_: D.Type) throws {
        let actions: [D.Action]
        if let generate {
            actions = DeterminismCheck<D>.generate(length: generate, seed: seed)
        } else {
            actions = try readLog(D.self)
        }
        var settings = ReplaySettings()
        settings.replicas = replicas
        settings.checkpointInterval = checkpointEvery
        settings.roundTripSeed = seed
        let child = ReplayChildCommand(executable: try currentExecutable(), arguments: ["replay-child"])
        let harness = ReplayHarness<D>(settings: settings, children: Array(repeating: child, count: processes))
        do {
            let report = try harness.replay(try ReplayLog<D>(actions))
            if json {
                print(
                    #"{"store":"\#(D.name)","events":\#(report.events),"replicas":\#(report.replicas),"#
                        + #""checkpoints":\#(report.checkpoints),"seq":\#(report.finalSeq),"#
                        + #""digest":"\#(report.finalDigest?.hex ?? "")","divergence":null}"#
                )
            } else {
                print(
                    "\(D.name): \(report.events) events through \(report.replicas) replicas "
                        + "(\(replicas) here, \(processes) in child processes), \(report.checkpoints) checkpoints: "
                        + "all agree"
                )
                print("final seq \(report.finalSeq), digest \(report.finalDigest?.hex ?? "-")")
            }
        } catch let divergence as Divergence {
            if json {
                print(#"{"store":"\#(D.name)","events":\#(actions.count),"divergence":\#(divergence.json)}"#)
            } else {
                print("\(D.name): \(divergence)")
            }
            throw ExitCodes.diverged
        }
    }

    /// Reads JSON lines: either actions, or `journal dump`'s {"store","seq","action"} objects.
    private func readLog<D: Domain>(_: D.Type) throws -> [D.Action] {
        let text: String
        do {
            text = input == "-" ? readStandardInput() : try String(contentsOfFile: input ?? "", encoding: .utf8)
        } catch {
            printError("lockstep: cannot read \(input ?? ""): \(error.localizedDescription)")
            throw ExitCodes.badInput
        }
        var actions: [D.Action] = []
        let decoder = JSONDecoder()
        for (number, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated()
        where !line.allSatisfy(\.isWhitespace) {
            do {
                var value = try decoder.decode(JSONValue.self, from: Data(line.utf8))
                if case let .object(fields) = value, let action = fields["action"], fields["seq"] != nil {
                    if case let .string(name)? = fields["store"], name != D.name { continue }
                    value = action
                }
                actions.append(try decoder.decode(D.Action.self, from: try CanonicalEncoding.encode(value)))
            } catch {
                printError(
                    "lockstep: \(input ?? "") line \(number + 1): not a \(D.name) action: "
                        + CanonicalEncoding.describe(error)
                )
                throw ExitCodes.badInput
            }
        }
        return actions
    }
}

/// The child side of `lockstep replay`: not for people; the parent runs it.
struct ReplayChildSubcommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "replay-child",
        abstract: "Serve one replay for 'lockstep replay' (reads its log on standard input).",
        shouldDisplay: false
    )

    func run() throws {
        let status = ReplayChild.serve(domains: Examples.domains)
        if status != 0 { throw ExitCode(status) }
    }
}

/// The path of the running executable, so child replicas run the very same code.
func currentExecutable() throws -> String {
    let path = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
    return path
}
