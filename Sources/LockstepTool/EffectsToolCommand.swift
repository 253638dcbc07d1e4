import ArgumentParser
import Foundation
import LockstepClient
import LockstepProtocol

/// The leader's effects and timers: list them, send a dead letter back to run, drop one (docs/effects.md).
struct EffectsToolCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "effects",
        abstract: "List the leader's effects and timers; retry or drop an effect.",
        discussion: """
            lockstep effects lists every effect waiting, running or given up (a dead letter), with its failed runs \
            and last error, and every timer set. lockstep effects retry ID sends a dead letter back to run, its tries \
            counted afresh; lockstep effects drop ID removes an effect that waits or was given up, without running \
            it. ID is store/seq/index, as the list shows. A retry or drop is journaled before the tool prints the \
            list as it left it. Exit 64 when no effect ID can be retried or dropped (the message says why), 69 when \
            no daemon leads within the tries.
            """,
        subcommands: [List.self, Retry.self, Drop.self],
        defaultSubcommand: List.self
    )

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "list",
            abstract: "List the effects waiting, running or given up, and the timers set."
        )
        @OptionGroup var daemon: DaemonOptions
        @Flag(help: "Print the daemon's JSON: {\"effects\":[…],\"timers\":[…]}.")
        var json = false

        func run() throws { try EffectsToolCommand.send(.list, daemon, json: json) }
    }

    struct Retry: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "retry",
            abstract: "Send a dead letter back to run, its tries counted afresh."
        )
        @Argument(help: "The effect's id, store/seq/index.")
        var id: String
        @OptionGroup var daemon: DaemonOptions
        @Flag(help: "Print the daemon's JSON.")
        var json = false

        func run() throws { try EffectsToolCommand.send(.retry(id), daemon, json: json) }
    }

    struct Drop: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "drop",
            abstract: "Drop an effect that waits or was given up, without running it."
        )
        @Argument(help: "The effect's id, store/seq/index.")
        var id: String
        @OptionGroup var daemon: DaemonOptions
        @Flag(help: "Print the daemon's JSON.")
        var json = false

        func run() throws { try EffectsToolCommand.send(.drop(id), daemon, json: json) }
    }

    static func send(_ command: LockstepProtocol.EffectsCommand, _ daemon: DaemonOptions, json: Bool) throws {
        let client = try daemon.client()
        let reply = try daemon.call(client, .effects(requestID: 1, command))
        if case let .error(_, error) = reply, error.code == .unknownEffect {
            printError("\(Tool.commandName): \(error.reason)")
            throw ExitCodes.unknownStore
        }
        guard case let .effects(_, body) = reply, let listing = EffectsListing(reply) else {
            throw unexpected(reply, to: "EFFECTS")
        }
        if json {
            print(String(decoding: body, as: UTF8.self))
            return
        }
        print("effect                    phase     failed  effect / last error")
        for effect in listing.effects {
            print(
                effect.id.padding(toLength: 25, withPad: " ", startingAt: 0),
                effect.phase.padding(toLength: 9, withPad: " ", startingAt: 0),
                String(effect.attempts).padding(toLength: 7, withPad: " ", startingAt: 0),
                effect.effect
            )
            if let error = effect.lastError { print(String(repeating: " ", count: 44), error) }
        }
        if listing.effects.isEmpty { print("(none)") }
        print("")
        print("timer                     due (UTC)                 action")
        let format = ISO8601DateFormatter()
        for timer in listing.timers {
            let due = format.string(from: Date(timeIntervalSince1970: Double(timer.dueMilliseconds) / 1_000))
            print(
                "\(timer.store)/\(timer.key)".padding(toLength: 25, withPad: " ", startingAt: 0),
                due.padding(toLength: 25, withPad: " ", startingAt: 0),
                timer.action
            )
        }
        if listing.timers.isEmpty { print("(none)") }
    }
}
