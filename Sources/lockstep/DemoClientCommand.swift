import ArgumentParser
import Foundation
import Lockstep
import LockstepClient
import LockstepDemo
import LockstepExamples
import LockstepProtocol
import LockstepTesting
import LockstepTool
import Logging
import ServiceLifecycle

/// One client process of the demo: it holds a replica of each example store, dispatches generated actions
/// through them, and prints a JSON report line every `--report-ms` until SIGTERM (then one final line).
/// The demo and the integration tests start it; it is hidden from `lockstep --help`.
struct DemoClientCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo-client",
        abstract: "A demo client: replicas of the example stores, dispatching generated actions.",
        shouldDisplay: false
    )

    @Option(help: "The stores to hold replicas of, comma-separated.")
    var stores = Examples.domains.map { $0.name }.joined(separator: ",")

    @Option(help: "How many actions to dispatch in all; 0 only watches.")
    var actions = 1_000

    @Option(help: "How many dispatches this client keeps in flight at once.")
    var concurrency = 4

    @Option(help: "Seed of the action generators.")
    var seed: UInt64 = 1

    @Option(help: "Print a report line this often, in milliseconds.")
    var reportMs = 200

    @Option(help: "Prefix the text of the todos this client adds with this tag.")
    var tag: String?

    @Option(help: "Events queued on this side before the newest are dropped (the SUB high-water mark).")
    var eventsQueue = 100_000

    @Option(help: "How long one try of a dispatch waits, in milliseconds.")
    var timeoutMs = 2_000

    @Option(help: "How many times a dispatch is sent again after a silence.")
    var retries = 5

    @Option(
        name: .customLong("command-endpoint"),
        help:
            "The daemon's command endpoint (default ipc://.lockstep/run/command); once per daemon of a failover group."
    )
    var commandEndpoints: [String] = []

    @Option(
        name: .customLong("events-endpoint"),
        help: "The daemon's events endpoint (default ipc://.lockstep/run/events); once per daemon, in the same order."
    )
    var eventsEndpoints: [String] = []

    @Option(help: "What the replicas log to standard error: trace … critical (notice shows a takeover's moves).")
    var logLevel = "warning"

    @OptionGroup var curve: CurveClientOptions

    @Flag(help: "Put each store's state in the final report.")
    var printState = false

    @Flag(help: "Once every dispatch is answered, play the demo's optimistic conflict on commands from standard input.")
    var conflictCommands = false

    @Flag(help: "Dispatch optimistically (dispatchOptimistically), waiting for each handle's answer.")
    var optimistic = false

    @Flag(help: "Check every optimistic read a subscriber gets; the report counts reads and problems.")
    var checkReads = false

    @Flag(help: "A control for --check-reads: each read loses its first pending dispatch before it is checked.")
    var breakReads = false

    @Option(help: "How long an optimistic dispatch stays pending without an acceptance, in milliseconds.")
    var pendingTimeoutMs = 60_000

    func validate() throws {
        guard actions >= 0 else { throw ValidationError("--actions must be 0 or more, got \(actions)") }
        guard (1...1_000).contains(concurrency) else { throw ValidationError("--concurrency must be 1...1000") }
        guard (10...60_000).contains(reportMs) else { throw ValidationError("--report-ms must be 10...60000") }
        guard commandEndpoints.count == eventsEndpoints.count else {
            throw ValidationError(
                "give one --events-endpoint for each --command-endpoint, in the same order; got "
                    + "\(commandEndpoints.count) command and \(eventsEndpoints.count) events endpoints"
            )
        }
        guard Logger.Level(rawValue: logLevel) != nil else {
            let levels = Logger.Level.allCases.map(\.rawValue).joined(separator: ", ")
            throw ValidationError("--log-level must be one of \(levels), got '\(logLevel)'")
        }
    }

    func run() async throws {
        var client = DemoClient(
            stores: stores,
            actions: actions,
            concurrency: concurrency,
            seed: seed,
            reportMs: reportMs,
            tag: tag,
            eventsQueue: eventsQueue,
            timeoutMs: timeoutMs,
            retries: retries,
            daemons: commandEndpoints.isEmpty
                ? [DaemonEndpoints.defaults]
                : zip(commandEndpoints, eventsEndpoints).map { DaemonEndpoints(command: $0, events: $1) },
            curve: try curve.clientCurve(),
            printState: printState,
            conflictCommands: conflictCommands,
            logLevel: Logger.Level(rawValue: logLevel) ?? .warning
        )
        client.optimistic = optimistic
        client.checkReads = checkReads
        client.breakReads = breakReads
        client.pendingTimeout = .milliseconds(pendingTimeoutMs)
        try await client.run()
    }
}
