import ArgumentParser
import Foundation
import Lockstep
import LockstepClient
import LockstepJournal
import LockstepProtocol
import LockstepTesting

/// Replays an action log through several replicas of one of the tool's domains, here and in child processes.
struct ReplayCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "replay",
        abstract: "Replay an action log through several replicas and report where they diverge.",
        discussion: """
            The log is a file of JSON lines — plain actions, or the {"store","seq","action"} lines that \
            'journal dump' writes — a seeded sequence from the domain's generator, or a journal \
            (--journal DIR: every store of this tool's domains in it, from its oldest kept snapshot, and each kept snapshot's \
            digest must come out of the replay). Replicas run in \
            this process (with encode/decode round trips at seeded points) and in child processes (with their \
            own hash seeds); digests of the state and of the effects set going are compared at every \
            checkpoint. Exit 0 when all agree, 4 on a divergence, which is printed with its first seq, action \
            and a diff of the two states or of the effects.
            """
    )

    @Argument(
        help: ArgumentHelp(
            "The store: \(Tool.domainList); with --journal, every store of these domains in the journal when "
                + "left out."
        )
    )
    var store: String?

    @Option(help: "A file of JSON lines to replay; - reads standard input.")
    var input: String?

    @Option(help: "A data directory whose journal to replay.")
    var journal: String?

    @Option(help: "A divergence evidence file a replica wrote (ReplicaConfiguration.evidenceDirectory).")
    var evidence: String?

    @Option(help: "Instead of a file, generate this many actions with the domain's generator.")
    var generate: Int?

    @Option(help: "Seed for --generate and for the round-trip points.")
    var seed: UInt64 = 1

    @Option(help: "Replicas in this process.")
    var replicas = 3

    @Option(help: "Replicas in child processes.")
    var processes = 1

    @Option(
        help: "Compare digests every N events (default: about 128 times in the log, every event for fewer than 256)."
    )
    var checkpointEvery: Int?

    @Flag(help: "Print one JSON object.")
    var json = false

    func validate() throws {
        guard [input != nil, generate != nil, journal != nil, evidence != nil].filter({ $0 }).count == 1 else {
            throw ValidationError("give exactly one of --input FILE, --generate N, --journal DIR or --evidence FILE")
        }
        guard store != nil || journal != nil || evidence != nil else {
            throw ValidationError("name the store to replay")
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
        if let journal {
            try replayJournal(journal)
            return
        }
        if let evidence {
            try replayEvidence(evidence)
            return
        }
        try replay(try Tool.requireDomain(store ?? ""), journal: nil)
    }

    /// Replays every store of a journal whose domain the tool has (or the one named); the first divergence stops it.
    private func replayJournal(_ directory: String) throws {
        let opened: any Journal
        do {
            opened = try openLocalJournal(directory: directory, readOnly: true)
        } catch {
            printError("\(Tool.commandName): cannot open the journal in \(directory): \(error)")
            throw ExitCode.failure
        }
        defer { try? opened.close() }
        let names = try opened.stats().stores.map(\.name)
        let chosen = store.map { [$0] } ?? names.filter { Tool.domain(named: $0) != nil }
        if let store, !names.contains(store) {
            printError(
                "\(Tool.commandName): the journal in \(directory) has no store '\(store)'; it has \(names.joined(separator: ", "))"
            )
            throw ExitCode.failure
        }
        for name in names where !chosen.contains(name) && store == nil {
            printError(
                "\(Tool.commandName): store '\(name)' is not a domain of this tool; its reducer is not here, so it is skipped"
            )
        }
        for name in chosen { try replay(try Tool.requireDomain(name), journal: opened) }
    }

    /// Progress on standard error, once a second after the first: a short replay says nothing.
    static func showProgress<D: Domain>(of store: String) -> ReplayHarness<D>.Progress {
        let started = ContinuousClock.now
        let lastShown = LockedValue(started)
        return { step in
            let now = ContinuousClock.now
            guard now - started >= .seconds(1) else { return }
            // A child's start always shows (it replays the whole log, silently); the replicas here once a second.
            let due = lastShown.withLockedValue { shown in
                guard case .inProcess = step, now - shown < .seconds(1) else {
                    shown = now
                    return true
                }
                return false
            }
            guard due else { return }
            switch step {
            case let .inProcess(replayed, total):
                printError(
                    "\(Tool.commandName) replay: \(store): \(replayed) of \(total) actions through the replicas here"
                )
            case let .child(index, total):
                printError("\(Tool.commandName) replay: \(store): child process \(index + 1) of \(total) replaying")
            }
        }
    }

    private func replay<D: Domain>(_: D.Type, journal: (any Journal)?) throws {
        let log: ReplayLog<D>
        if let journal {
            log = try journalLog(D.self, journal)
        } else if let generate {
            log = try ReplayLog<D>(try generated(D.self, length: generate))
        } else {
            log = try ReplayLog<D>(try readLog(D.self))
        }
        let actions = log.actions
        var settings = ReplaySettings()
        settings.replicas = replicas
        settings.checkpointInterval = checkpointEvery
        settings.roundTripSeed = seed
        let child = ReplayChildCommand(executable: currentExecutable().path, arguments: ["replay-child"])
        var harness = ReplayHarness<D>(settings: settings, children: Array(repeating: child, count: processes))
        harness.progress = Self.showProgress(of: D.name)
        do {
            let report = try harness.replay(log)
            if json {
                print(
                    #"{"store":"\#(D.name)","events":\#(report.events),"replicas":\#(report.replicas),"#
                        + #""checkpoints":\#(report.checkpoints),"seq":\#(report.finalSeq),"#
                        + #""digest":"\#(report.finalDigest?.hex ?? "")","#
                        + (report.finalEffectsDigest.map {
                            #""effectsDigest":"\#($0.hex)","actionsWithEffects":\#(report.actionsWithEffects),"#
                        } ?? "")
                        + #""divergence":null}"#
                )
            } else {
                print(
                    "\(D.name): \(report.events) events through \(report.replicas) replicas "
                        + "(\(replicas) here, \(processes) in child processes), \(report.checkpoints) checkpoints: "
                        + "all agree"
                )
                print(
                    "final seq \(report.finalSeq), digest \(report.finalDigest?.hex ?? "-")"
                        + (report.finalEffectsDigest.map {
                            "; effects of \(report.actionsWithEffects) actions agree too, digest \($0.hex)"
                        } ?? "")
                        + (log.expected.isEmpty
                            ? ""
                            : "; every digest the journal recorded matched "
                                + "(\(report.recordedDigestsMatched) snapshots)")
                )
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

    /// Replays what a replica saw when it diverged, and prints the report; exits 4 (a divergence is the point).
    private func replayEvidence(_ path: String) throws {
        let file: DivergenceEvidence
        do {
            file = try DivergenceEvidence(contentsOf: URL(fileURLWithPath: path))
        } catch {
            printError("\(Tool.commandName): cannot read the evidence file \(path): \(error)")
            throw ExitCodes.badInput
        }
        guard let domain = Tool.domain(named: file.store) else {
            printError("\(Tool.commandName): the evidence is of store '\(file.store)', which this tool does not host")
            throw ExitCode.validationFailure
        }
        func report<D: Domain>(_: D.Type) throws {
            var settings = ReplaySettings()
            settings.replicas = replicas
            settings.roundTripSeed = seed
            let child = ReplayChildCommand(executable: currentExecutable().path, arguments: ["replay-child"])
            let divergence: Divergence
            do {
                divergence = try file.replay(
                    D.self,
                    settings: settings,
                    children: Array(repeating: child, count: processes)
                )
            } catch let error as DivergenceEvidence.Unreplayable {
                printError("\(Tool.commandName): \(error)")
                throw ExitCode.failure
            }
            if json {
                print(#"{"store":"\#(D.name)","evidence":"\#(path)","divergence":\#(divergence.json)}"#)
            } else {
                print("\(D.name), from the evidence of a replica (\(file.writtenAt), \(file.build)):")
                print("\(divergence)")
            }
            throw ExitCodes.diverged
        }
        try report(domain)
    }

    /// The journal's history of one store (``ReplayLog/init(history:)``), or the error said plainly.
    private func journalLog<D: Domain>(_: D.Type, _ journal: any Journal) throws -> ReplayLog<D> {
        do {
            return try ReplayLog<D>(history: journal)
        } catch let error as HistoryError {
            printError("\(Tool.commandName): \(error)")
            if case .undecodable = error.kind { throw ExitCodes.badInput }
            throw ExitCode.failure
        }
    }

    /// `length` actions from the domain's generator, or an error when it has none.
    private func generated<D: Domain>(_: D.Type, length: Int) throws -> [D.Action] {
        guard let generating = D.self as? any ActionGenerating.Type else {
            throw ValidationError(
                "--generate needs the domain's generator, and \(D.name) does not conform to ActionGenerating; "
                    + "give --input FILE (or --journal DIR) instead"
            )
        }
        func generate<G: ActionGenerating>(_: G.Type) -> [Any] {
            DeterminismCheck<G>.generate(length: length, seed: seed)
        }
        return generate(generating).compactMap { $0 as? D.Action }
    }

    /// Reads JSON lines: either actions, or `journal dump`'s {"store","seq","action"} objects.
    private func readLog<D: Domain>(_: D.Type) throws -> [D.Action] {
        let text: String
        do {
            text = input == "-" ? readStandardInput() : try String(contentsOfFile: input ?? "", encoding: .utf8)
        } catch {
            printError("\(Tool.commandName): cannot read \(input ?? ""): \(error.localizedDescription)")
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
                    "\(Tool.commandName): \(input ?? "") line \(number + 1): not an action of '\(D.name)': "
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
        let status = ReplayChild.serve(domains: Tool.domains)
        if status != 0 { throw ExitCode(status) }
    }
}
