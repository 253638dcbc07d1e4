import ArgumentParser
import Foundation
import Lockstep

/// The whole of the `lockstep` command for any domains: one call makes a user's executable their domains' tool.
///
/// ```swift
/// import LockstepTool
/// import Shelf
///
/// await LockstepToolMain.run(domains: [Shelf.self])
/// ```
///
/// The commands that need the reducers — `run`, `replay` (and the `replay-child` it starts), `journal state`,
/// and the recovery check of `journal verify` — work on the domains given; those that speak only the wire or the
/// journal's format — `dispatch`, `state`, `tail`, `stats`, `keygen`, `journal verify|dump|stats` — work
/// against any daemon or journal, whatever it hosts. `lockstep` is this call with the example domains (and its
/// demo and bench).
public enum LockstepToolMain {
    /// Parses this process's arguments as the tool and runs the command they name, then exits the process.
    ///
    /// - Parameters:
    ///   - domains: the domains whose reducers the tool runs; their names must differ.
    ///   - commandName: the name `--help` shows; the executable's file name when `nil`.
    ///   - commands: more top-level subcommands, after the tool's own.
    ///   - journalCommands: more `journal` subcommands, after the tool's own.
    public static func run(
        domains: [any Domain.Type],
        commandName: String? = nil,
        commands: [any ParsableCommand.Type] = [],
        journalCommands: [any ParsableCommand.Type] = []
    ) async -> Never {
        let names = domains.map { $0.name }
        precondition(Set(names).count == names.count, "two domains share a name: \(names)")
        Tool.current.withLockedValue {
            $0 = Tool(
                domains: domains,
                commandName: commandName
                    ?? CommandLine.arguments.first.map { URL(fileURLWithPath: $0).lastPathComponent } ?? "lockstep",
                commands: commands,
                journalCommands: journalCommands
            )
        }
        await ToolCommand.main()
        exit(0)
    }
}

/// What the tool was made with: set once by ``LockstepToolMain/run(domains:commandName:commands:journalCommands:)``
/// before any argument is parsed, read by the commands.
package struct Tool: Sendable {
    package var domains: [any Domain.Type]
    package var commandName: String
    package var commands: [any ParsableCommand.Type]
    package var journalCommands: [any ParsableCommand.Type]

    package static let current = LockedValue(
        Tool(domains: [], commandName: "lockstep", commands: [], journalCommands: [])
    )

    package static var domains: [any Domain.Type] { current.withLockedValue { $0.domains } }
    package static var commandName: String { current.withLockedValue { $0.commandName } }

    /// The tool's domain called `name`, or `nil`.
    package static func domain(named name: String) -> (any Domain.Type)? {
        domains.first { $0.name == name }
    }

    /// The names of the tool's domains, for help texts and errors.
    package static var domainList: String { domains.map { $0.name }.joined(separator: ", ") }

    /// The tool's domain called `name`, or a usage error that lists the ones it has.
    package static func requireDomain(_ name: String) throws -> any Domain.Type {
        guard let domain = domain(named: name) else {
            throw ValidationError("unknown store '\(name)'; this tool has the domains \(domainList)")
        }
        return domain
    }
}

/// The root command.
struct ToolCommand: AsyncParsableCommand {
    static var configuration: CommandConfiguration {
        let tool = Tool.current.withLockedValue { $0 }
        let own: [any ParsableCommand.Type] = [
            RunCommand.self, ReplayCommand.self, ReplayChildSubcommand.self, JournalCommand.self, StatsCommand.self,
            KeygenCommand.self, DispatchCommand.self, StateCommand.self, TailCommand.self, EffectsToolCommand.self,
        ]
        return CommandConfiguration(
            commandName: tool.commandName,
            abstract: "Work with Lockstep stores of \(Tool.domainList): run and replay actions, ask a daemon, "
                + "read a journal.",
            discussion: """
                Exit codes:
                  0   success
                  1   the command failed (the message says why)
                  3   an action was rejected by its domain's validator
                  4   replay: two replicas diverged (the output names the seq)
                  5   journal verify: the journal is damaged (the output names store, seq and what)
                  64  bad usage: unknown option, missing argument, a store no domain of the tool or no daemon \
                of the group hosts
                  65  bad input: an action or file that could not be read or decoded
                  69  no daemon answered, or none of those given led, within --retries × --timeout-ms
                  77  forbidden: the daemon's policy grants this user or key no right to it (docs/security.md)
                """,
            subcommands: own + tool.commands
        )
    }
}

/// The exit codes `--help` documents.
package enum ExitCodes {
    package static let rejected = ExitCode(3)
    package static let diverged = ExitCode(4)
    package static let unknownStore = ExitCode(64)
    package static let badInput = ExitCode(65)
    package static let unavailable = ExitCode(69)
    package static let forbidden = ExitCode(77)
}

/// Writes one line to standard error.
package func printError(_ message: String) {
    FileHandle.standardError.write(Data((message + "\n").utf8))
}

/// All of standard input, as text.
package func readStandardInput() -> String {
    String(decoding: FileHandle.standardInput.readDataToEndOfFile(), as: UTF8.self)
}

/// Lines of this process's standard input, without their line ends, read on a thread of their own so no task
/// blocks on them; the stream ends at end of input.
///
/// The thread reads with read(2), not `readLine()`: stdio holds stdin's lock while it waits for a line, and
/// `fflush(nil)`, which writers of report lines call, takes every stream's lock, so it would wait for the next line
/// of input.
package func standardInputLines() -> AsyncStream<String> {
    let (stream, continuation) = AsyncStream.makeStream(of: String.self)
    let thread = Thread {
        var pending: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4_096)
        func yield(_ bytes: ArraySlice<UInt8>) {
            let line = bytes.last == UInt8(ascii: "\r") ? bytes.dropLast() : bytes
            continuation.yield(String(decoding: line, as: UTF8.self))
        }
        while true {
            let count = read(STDIN_FILENO, &buffer, buffer.count)
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { break }
            pending += buffer[..<count]
            while let end = pending.firstIndex(of: UInt8(ascii: "\n")) {
                yield(pending[..<end])
                pending.removeSubrange(...end)
            }
        }
        if !pending.isEmpty { yield(pending[...]) }
        continuation.finish()
    }
    thread.start()
    return stream
}

/// The running executable, so child processes run the very same code.
package func currentExecutable() -> URL {
    URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
}

extension String {
    package func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: " ", count: width - count) + self
    }
}

/// A command could not do its work (not a usage mistake): the tool prints `Error: ` and the message, without the
/// usage text, and exits 1.
package struct CommandFailure: Error, CustomStringConvertible {
    package var description: String

    package init(_ description: String) {
        self.description = description
    }
}
