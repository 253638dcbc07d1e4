import Foundation
import Lockstep
import LockstepProtocol

/// How to start a child process that replays: an executable that calls ``ReplayChild/serve(domains:)``
/// when given `arguments` (`lockstep replay-child` for the example domains).
///
/// A child has its own hash seed, so a reducer that depends on `Set` or `Dictionary` order diverges there.
public struct ReplayChildCommand: Sendable, Hashable {
    /// The path of the executable to start.
    public var executable: String
    /// The arguments that make it serve one replay, e.g. `["replay-child"]`.
    public var arguments: [String]
    /// The longest a child may take; it is killed after that.
    public var timeout: Duration

    /// A child started as `executable arguments…`, killed after `timeout`.
    public init(executable: String, arguments: [String], timeout: Duration = .seconds(600)) {
        self.executable = executable
        self.arguments = arguments
        self.timeout = timeout
    }

    /// The package's own tool `name` — an executable made with `LockstepToolMain.run(domains:)`, built beside the
    /// running tests (``packageExecutable(_:)``) — serving each replay through its hidden `replay-child` command:
    /// `DeterminismCheck(Board.self, children: [.packageTool("board")])`.
    public static func packageTool(_ name: String, timeout: Duration = .seconds(600)) -> ReplayChildCommand {
        ReplayChildCommand(executable: packageExecutable(name).path, arguments: ["replay-child"], timeout: timeout)
    }

    func run<D: Domain>(_: D.Type, log: ReplayLog<D>, plan: TracePlan) throws -> ReplicaTrace {
        var input = try JSONEncoder().encode(
            ReplayChild.Header(
                store: D.name,
                startSeq: log.startSeq,
                startState: Data(log.startState),
                plan: plan,
                authors: log.authors.isEmpty ? nil : log.authors.map(\.name)
            )
        )
        input.append(0x0A)
        for action in log.actions {
            input.append(try CanonicalEncoding.encode(action))
            input.append(0x0A)
        }
        guard FileManager.default.isExecutableFile(atPath: executable) else {
            throw ReplayChildError(
                "no executable at \(executable) to replay in a child process; build it first (`swift build` builds "
                    + "every product of the package)"
            )
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        let stdin = Pipe()
        let stdout = Pipe()
        let stderr = Pipe()
        process.standardInput = stdin
        process.standardOutput = stdout
        process.standardError = stderr
        try process.run()
        let deadline = ContinuousClock.now + timeout
        // Feed the child and drain both of its pipes on other threads, so that a child that stops reading or
        // writes a lot to one pipe cannot block this one past the deadline.
        let collected = LockedValue<(output: Data, errors: Data)>((Data(), Data()))
        let pipes = DispatchGroup()
        let writer = stdin.fileHandleForWriting
        let bytes = input
        DispatchQueue.global().async {
            writer.write(bytes)
            try? writer.close()
        }
        for (handle, isOutput) in [(stdout.fileHandleForReading, true), (stderr.fileHandleForReading, false)] {
            pipes.enter()
            DispatchQueue.global().async {
                let data = handle.readDataToEndOfFile()
                collected.withLockedValue { if isOutput { $0.output = data } else { $0.errors = data } }
                pipes.leave()
            }
        }
        while process.isRunning {
            if ContinuousClock.now > deadline {
                kill(process.processIdentifier, SIGKILL)
                process.waitUntilExit()
                throw ReplayChildError("\(executable) did not finish within \(timeout) and was killed")
            }
            Thread.sleep(forTimeInterval: 0.005)
        }
        // The child is gone, so its pipes are closed and the readers end at once.
        _ = pipes.wait(timeout: .now() + 5)
        let (output, errors) = collected.withLockedValue { $0 }
        guard process.terminationStatus == 0 else {
            throw ReplayChildError(
                "\(executable) \(arguments.joined(separator: " ")) exited with \(process.terminationStatus): "
                    + String(decoding: errors, as: UTF8.self)
            )
        }
        var trace = ReplicaTrace()
        let decoder = JSONDecoder()
        for line in output.split(separator: 0x0A) {
            let record = try decoder.decode(ReplayChild.Record.self, from: Data(line))
            let digest = CheckpointDigest(state: record.digest, effects: record.effects ?? EffectChain.start)
            trace.digests.append((record.seq, digest))
            if let state = record.state {
                let effects =
                    record.effectList.map { EffectList(bytes: Array($0), lines: record.effectLines ?? []) } ?? .none
                trace.captures[record.seq] = Capture(
                    state: Array(state),
                    effects: effects,
                    effectsDigest: digest.effects
                )
            }
        }
        if !plan.captureAgainst.isEmpty {
            trace.firstMismatch = trace.captures.keys.filter { !plan.statesAt.contains($0) }.min()
        }
        return trace
    }
}

/// A child replica failed to run; the message says how.
public struct ReplayChildError: Error, CustomStringConvertible {
    /// What happened: the child timed out, or exited with an error and wrote this to standard error; or, in the
    /// child, the request on standard input could not be served.
    public var description: String
    init(_ description: String) { self.description = description }
}

/// The child side of a replay: reads a log on standard input, writes digests (of the state and of the effects) on
/// standard output.
public enum ReplayChild {
    struct Header: Codable {
        var store: String
        var startSeq: SequenceNumber
        var startState: Data
        var plan: TracePlan
        /// Each action's author, when any is known.
        var authors: [String]?
    }

    /// One checkpoint of the child's replica, one JSON line on its standard output.
    struct Record: Codable {
        var seq: SequenceNumber
        /// The state's digest.
        var digest: StateDigest
        /// The digest of every effect set going up to ``seq`` (``EffectChain``); `nil` from a child built before
        /// the harness compared effects, whose domains had none, so their chain is ``EffectChain/start``.
        var effects: StateDigest?
        /// The state's canonical JSON, where the plan asked for it or the digests first differed.
        var state: Data?
        /// With ``state``: the effects of the action at ``seq`` in their canonical form (``EffectList/bytes``);
        /// `nil` when it set nothing going.
        var effectList: Data?
        /// With ``effectList``: the same effects, one `EffectRecord.description` line each.
        var effectLines: [String]?
    }

    /// Serves one replay request for whichever of `domains` it names; call it from an executable's
    /// `replay-child` command. Returns the exit status.
    public static func serve(domains: [any Domain.Type]) -> Int32 {
        let input = FileHandle.standardInput.readDataToEndOfFile()
        do {
            guard let newline = input.firstIndex(of: 0x0A) else { throw ReplayChildError("no header line on stdin") }
            let header = try JSONDecoder().decode(Header.self, from: input[..<newline])
            guard let domain = domains.first(where: { $0.name == header.store }) else {
                throw ReplayChildError(
                    "no domain named '\(header.store)' here; this child knows "
                        + domains.map { $0.name }.joined(separator: ", ")
                )
            }
            let output = try serve(domain, header: header, lines: input[(newline + 1)...])
            FileHandle.standardOutput.write(output)
            return 0
        } catch {
            FileHandle.standardError.write(Data("replay-child: \(error)\n".utf8))
            return 1
        }
    }

    private static func serve<D: Domain>(_ domain: D.Type, header: Header, lines: Data) throws -> Data {
        let decoder = JSONDecoder()
        let actions = try lines.split(separator: 0x0A).map { try decoder.decode(D.Action.self, from: Data($0)) }
        let trace = try ReplicaRunner.run(
            domain,
            startSeq: header.startSeq,
            startState: Array(header.startState),
            actions: actions,
            authors: (header.authors ?? []).map { Author($0) },
            plan: header.plan
        )
        var output = Data()
        let encoder = JSONEncoder()
        for (seq, digest) in trace.digests {
            let capture = trace.captures[seq]
            let effects = capture?.effects.lines.isEmpty == false ? capture?.effects : nil
            let record = Record(
                seq: seq,
                digest: digest.state,
                effects: digest.effects,
                state: capture.map { Data($0.state) },
                effectList: effects.map { Data($0.bytes) },
                effectLines: effects?.lines
            )
            output.append(try encoder.encode(record))
            output.append(0x0A)
        }
        return output
    }
}
