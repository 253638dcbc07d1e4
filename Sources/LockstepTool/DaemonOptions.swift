import ArgumentParser
import Foundation
import LockstepClient
import LockstepProtocol
import ZeroMQ

/// How the CLI reaches a running daemon's command socket; shared by every command that asks it something.
struct DaemonOptions: ParsableArguments {
    @Option(
        name: .customLong("command-endpoint"),
        help: ArgumentHelp(
            "The daemon's command endpoint (default ipc://.lockstep/run/command).",
            discussion: """
                Give it once for each daemon of a failover group: dispatch, state and tail go to whichever leads, \
                and stats asks each.
                """
        )
    )
    var commandEndpoints: [String] = []

    @Option(help: "How long to wait for each reply, in milliseconds.")
    var timeoutMs = 2_000

    @Option(
        help: ArgumentHelp(
            "How many times to ask again, on a fresh socket, after a silence.",
            discussion: """
                A request goes on until a leading daemon answers or its (retries + 1) tries of --timeout-ms are \
                over, so a takeover shorter than that is waited out: e.g. --timeout-ms 1000 --retries 20.
                """
        )
    )
    var retries = 3

    @OptionGroup var curve: CurveClientOptions

    func validate() throws {
        guard (1...600_000).contains(timeoutMs) else { throw ValidationError("--timeout-ms must be 1...600000") }
        guard (0...100).contains(retries) else { throw ValidationError("--retries must be 0...100") }
    }

    /// The command endpoints given, or the daemon's default.
    var endpoints: [String] { commandEndpoints.isEmpty ? [DaemonEndpoints.defaults.command] : commandEndpoints }

    /// A client of the daemon that leads among those given, with CURVE when the options give keys; it owns a socket,
    /// so one per command run. A single `ipc://` endpoint given with no socket file exits 69 at once: no daemon is
    /// there to wait for.
    func client() throws -> CommandClient {
        if endpoints.count == 1 { try requireSocket(endpoints[0], flag: "--command-endpoint") }
        return CommandClient(
            context: try Context(),
            endpoints: endpoints,
            timeout: .milliseconds(timeoutMs),
            retries: retries,
            curve: try curve.clientCurve()
        )
    }

    /// A client of the daemon at `endpoint` alone, whatever its role.
    func client(at endpoint: String) throws -> CommandClient {
        CommandClient(
            context: try Context(),
            endpoint: endpoint,
            timeout: .milliseconds(timeoutMs),
            retries: retries,
            curve: try curve.clientCurve()
        )
    }

    /// Sends `request`; no answer exits 69, any other failure 1, each with the reason on standard error.
    func call(_ client: CommandClient, _ request: Request) throws -> Reply {
        do throws(ClientError) {
            return try client.call(request)
        } catch {
            throw exit(error)
        }
    }

    /// The status of the daemon that leads (docs/operations.md), decoded, and its JSON.
    func status(_ client: CommandClient) throws -> (status: DaemonStatus, body: [UInt8]) {
        do throws(ClientError) {
            return try client.leaderStatus()
        } catch {
            throw exit(error)
        }
    }

    /// Prints `error` and returns the exit to throw: 69 when no daemon led within the tries, 1 for anything else.
    func exit(_ error: ClientError) -> ExitCode {
        printError("\(Tool.commandName): \(error)")
        return error.code == .unavailable ? ExitCodes.unavailable : ExitCode.failure
    }

    /// The status of the daemon that leads, or exit 64 when it hosts no store `name` (no daemon of the group does:
    /// they share one journal).
    func requireStore(_ name: StoreName, _ client: CommandClient) throws -> DaemonStatus.Store {
        let status = try status(client).status
        guard let store = status.stores.first(where: { $0.name == name.rawValue }) else {
            printError(
                "\(Tool.commandName): the leading daemon (at \(client.endpoint)) hosts no store '\(name)'; it hosts "
                    + status.stores.map(\.name).joined(separator: ", ")
            )
            throw ExitCodes.unknownStore
        }
        return store
    }
}

/// Reports a reply the command did not ask for (an ERROR, or another kind) and returns the exit to throw: 65 for an
/// action the store cannot read, 64 for a store the leader does not host, 77 for what the policy forbids, 1 for the
/// rest.
func unexpected(_ reply: Reply, to request: String) -> ExitCode {
    if case let .error(_, error) = reply {
        printError("\(Tool.commandName): the daemon refused the \(request) request: \(error)")
        switch error.code {
        case .undecodableAction: return ExitCodes.badInput
        case .unknownStore: return ExitCodes.unknownStore
        case .forbidden: return ExitCodes.forbidden
        default: return .failure
        }
    }
    printError("\(Tool.commandName): unexpected reply to \(request): \(reply)")
    return .failure
}

/// Exits 69 at once, saying so, when `endpoint` is an `ipc://` path with no daemon behind it: no file, or a socket
/// file nobody listens on. Retrying would only wait.
func requireSocket(_ endpoint: String, flag: String) throws {
    let path = String(endpoint.dropFirst("ipc://".count))
    let problem: String
    switch IPCProbe.probe(endpoint) {
    case .listening, .unknown: return
    case .missing: problem = "\(path) does not exist"
    case .stale: problem = "nothing listens on \(path) (a socket file left by a daemon that stopped)"
    case .denied:
        // libzmq would retry the connect in the background and the command would wait out its retries, then
        // blame the daemon: say at once that it is the file system refusing this user.
        let directory = (path as NSString).deletingLastPathComponent
        printError(
            "\(Tool.commandName): permission denied on \(path): this user may not connect to the daemon at "
                + "\(endpoint); its sockets are for the group that owns \(directory) (ls -ld \(directory)): run this "
                + "as a member of that group (docs/operations.md, \"systemd\")"
        )
        throw ExitCode.failure
    }
    printError(
        "\(Tool.commandName): no daemon at \(endpoint): \(problem); start the daemon (the default endpoint is "
            + "relative to the folder it runs in) or give its endpoint with \(flag)"
    )
    throw ExitCodes.unavailable
}

/// A store name from the command line, or a usage error saying what is wrong with it.
func storeName(_ text: String) throws -> StoreName {
    do {
        return try StoreName(text)
    } catch {
        throw ValidationError("\(error)")
    }
}
