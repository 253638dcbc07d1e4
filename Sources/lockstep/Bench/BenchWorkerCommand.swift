import ArgumentParser
import Foundation
import Lockstep
import LockstepBench
import LockstepClient
import LockstepExamples
import LockstepProtocol
import LockstepServer
import LockstepTesting
import LockstepTool
import Logging
import ZeroMQ

/// One process of `lockstep bench`: a raw libzmq echo server or client, a Lockstep dispatcher, a replica (following,
/// or dispatching optimistically), a Redis client. Clients print `ready`, wait for `go` on standard input, work
/// for `--seconds`, then print one JSON ``WorkerReport`` line and exit. Hidden from `lockstep --help`.
struct BenchWorkerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench-worker",
        abstract: "One process of lockstep bench.",
        shouldDisplay: false
    )

    @Argument(help: "What this worker does: \(BenchWorker.Role.allCases.map(\.rawValue).joined(separator: ", ")).")
    var role: BenchWorker.Role

    @Option(help: "The endpoint: the ZeroMQ endpoint, the daemon's command endpoint, or Redis's unix socket.")
    var endpoint: String

    @Option(help: "The daemon's events endpoint (replica, optimistic, join).")
    var eventsEndpoint = ""

    @Option(help: "How long to work after go, in seconds.")
    var seconds = 2.0

    @Option(help: "sub: messages to wait for; join: the seq to reach.")
    var count = 0

    @Option(help: "join: the store to replicate (counter or posts).")
    var store = "counter"

    @Option(help: "dispatch (counter), redis: how many requests to keep in flight at once.")
    var inFlight = 1

    @Option(help: "echo-router: answer each message this many microseconds after it came.")
    var delayUs = 0

    @Flag(help: "dispatch: report the seq each dispatch got and when it was sent.")
    var recordSeqs = false

    // Z85 keys may begin with '-' (one in 85 does): `.unconditional` takes the next argument as the value, where the
    // default would read such a key as an unknown option and fail the bench's tcp run now and then.
    @Option(
        parsing: .unconditional,
        help: "CURVE client (tcp): the server's public key and this client's secret key, Z85, comma-separated."
    )
    var curve: String?

    @Option(parsing: .unconditional, help: "CURVE server (tcp echo): the server's secret key, Z85.")
    var curveServer: String?

    func validate() throws {
        guard delayUs >= 0 else {
            throw ValidationError("--delay-us is how many microseconds an echo waits, 0 or more; it is \(delayUs)")
        }
        guard delayUs == 0 || role == .echoRouter else {
            throw ValidationError("--delay-us delays an echo-router's answers; a \(role.rawValue) worker sends none")
        }
    }

    func run() async throws {
        let worker = BenchWorker(
            role: role,
            endpoint: endpoint,
            eventsEndpoint: eventsEndpoint,
            seconds: seconds,
            count: count,
            store: store,
            recordSeqs: recordSeqs,
            curve: curve,
            curveServer: curveServer,
            inFlight: inFlight,
            delay: .microseconds(delayUs)
        )
        try await worker.run()
    }
}

extension BenchWorker.Role: ExpressibleByArgument {}

/// The daemon of `lockstep bench`'s tree-shaped P7 rows: `todos` and ``TreeTodos`` (the same todos in a
/// `DigestedDictionary`, as docs/domains.md recommends for a large state), with the daemon's flags after the
/// subcommand.
/// Hidden from `lockstep --help`.
struct BenchDaemonCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench-daemon",
        abstract: "The daemon of lockstep bench's tree-shaped stores.",
        shouldDisplay: false
    )

    @Argument(parsing: .captureForPassthrough, help: "The daemon's flags, as lockstepd takes them.")
    var daemonArguments: [String] = []

    func run() async throws {
        await LockstepDaemonMain.run(
            domains: [Todos.self, TreeTodos.self],
            commandName: "lockstep bench-daemon",
            arguments: daemonArguments
        )
    }
}
