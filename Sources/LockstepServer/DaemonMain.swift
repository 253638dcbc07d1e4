import ArgumentParser
import Foundation
import Lockstep
import Logging
import ServiceLifecycle

/// The whole of `lockstepd` for any domains: one call makes a user's executable a Lockstep daemon.
///
/// ```swift
/// import LockstepServer
/// import Shelf
///
/// await LockstepDaemonMain.run(domains: [Shelf.self])
/// ```
///
/// The executable then takes every flag of `lockstepd` (`--help` lists them) and `--config` TOML files, logs to
/// standard error (or to the handler given), speaks systemd's notify protocol (READY=1 after recovery and binding,
/// the watchdog, STOPPING=1), drains the batch in flight on SIGTERM or SIGINT, and exits 0 after a clean stop, 64 for
/// a wrong flag, 78 for a configuration it cannot serve (a domain with effects and no handler among them) and 1
/// when it cannot go on (the log says why). `lockstepd` is
/// this call with the example domains.
///
/// It leaves the process's global logging alone (it never calls `LoggingSystem.bootstrap`): the daemon's loggers
/// are made with the handler given, so an application that bootstraps its own logging, or sends the daemon's
/// lines elsewhere, keeps control of it.
public enum LockstepDaemonMain {
    /// Makes the log handler for a logger of this label: e.g. `StreamLogHandler.standardOutput(label:)`, or a
    /// handler of a logging backend. The daemon sets its level from `--log-level`.
    public typealias LogHandlerFactory = @Sendable (_ label: String) -> any LogHandler

    /// Runs the daemon hosting `domains` (by default all of them; `--domain` picks some) with `arguments` (this
    /// process's, by default: a tool that serves as a daemon under a subcommand passes what follows it), and exits
    /// the process when it stops.
    ///
    /// - Parameters:
    ///   - domains: every domain the executable links; their names must differ.
    ///   - effects: what runs the effects of the domains that declare them (docs/effects.md): one handler for each.
    ///   - commandName: the daemon's name in its messages and its log's label; the executable's file name when
    ///     `nil`.
    ///   - logHandler: what the daemon's log lines go to; standard error when `nil`.
    ///   - arguments: the daemon's flags (`--config FILE`, …), without the executable's name.
    public static func run(
        domains: [any Domain.Type],
        effects: [EffectHandler] = [],
        commandName: String? = nil,
        logHandler: LogHandlerFactory? = nil,
        arguments: [String] = Array(CommandLine.arguments.dropFirst())
    ) async -> Never {
        let names = domains.map { $0.name }
        precondition(Set(names).count == names.count, "two domains share a name: \(names)")
        let hosted = domains.map { HostedDomain($0) }
        let name = commandName ?? DaemonCommand.executableName
        let command: DaemonCommand
        do {
            command = try DaemonCommand.parse(arguments)
        } catch {
            if DaemonCommand.exitCode(for: error) == .success, !(error is ExitCode) {
                // --help: which domains this daemon hosts, then the flags.
                print("\(name) hosts the Lockstep domains \(names.joined(separator: ", ")).\n")
            }
            DaemonCommand.exit(withError: error)
        }
        let status = await command.serve(
            domains: hosted,
            effects: effects,
            name: name,
            logHandler: logHandler ?? { StreamLogHandler.standardError(label: $0) }
        )
        exit(status)
    }
}

/// The flags of `lockstepd` and of every daemon made with ``LockstepDaemonMain``.
public struct DaemonFlags: ParsableArguments, Sendable {
    /// `--config FILE`: a TOML file whose settings go over the defaults.
    @Option(
        help: ArgumentHelp(
            "A TOML configuration file.",
            discussion: "Settings at the top level and in [lease], [intervals], [snapshots], [limits], [effects], "
                + "[curve], [http] and the access tables; one the daemon does not know is refused, naming the ones its table "
                + "has. Lockstep's docs/operations.md lists every setting, and its deploy/lockstepd.toml is an example."
        )
    )
    public var config: String?

    /// `--data-dir DIR`.
    @Option(help: "The journal's directory.")
    public var dataDir: String?

    /// `--command-endpoint`.
    @Option(help: "The command endpoint (ROUTER), e.g. ipc:///run/lockstep/command.")
    public var commandEndpoint: String?

    /// `--events-endpoint`.
    @Option(help: "The events endpoint (PUB), e.g. ipc:///run/lockstep/events.")
    public var eventsEndpoint: String?

    /// `--domain NAME`, repeatable: the domains to host; all linked in when none is named.
    @Option(name: .customLong("domain"), help: "A domain to host (repeatable); default: every domain linked in.")
    public var domains: [String] = []

    /// `--durability fsync|relaxed`.
    @Option(help: "fsync (every action durable before its ack) or relaxed.")
    public var durability: String?

    /// `--journal sqlite|memory|postgres|log`.
    @Option(help: "sqlite, memory, postgres (with --postgres) or log.")
    public var journal: String?

    /// `--postgres CONNINFO`: the libpq connection string of the `postgres` journal's database.
    @Option(help: "The postgres journal's libpq connection string, e.g. 'host=/run/postgresql dbname=lockstep'.")
    public var postgres: String?

    /// `--lease-ms MS`: how long the `postgres` journal's lease lasts unless renewed.
    @Option(help: "How long the postgres journal's lease lasts, in ms (default 3000); a standby takes over after it.")
    public var leaseMs: Int?

    /// `--name NAME`: this daemon's name in the `postgres` journal's lease.
    @Option(help: "This daemon's name in the postgres journal's lease (default HOSTNAME:PID).")
    public var name: String?

    /// `--http-listen HOST:PORT`: serve `/metrics` over HTTP there.
    @Option(help: "Serve /metrics (Prometheus text) over HTTP on HOST:PORT, e.g. 127.0.0.1:9464; default: no listener.")
    public var httpListen: String?

    /// `--http-inspector` / `--no-http-inspector`: serve the inspector's page at `/` of the HTTP listener, or not.
    @Flag(
        inversion: .prefixedNo,
        help: "Serve the inspector's page at / of the HTTP listener (default: only on a loopback address)."
    )
    public var httpInspector: Bool?

    /// `--log-level LEVEL`, one of swift-log's levels.
    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical.")
    public var logLevel: String = "info"

    /// Options as parsed; every one unset.
    public init() {}

    /// The configuration these options give: the defaults for `environment` hosting `domains`, then the
    /// `--config` file over them, then the flags over that.
    ///
    /// Throws ``ConfigurationError`` naming the file or flag and the value when one cannot be read.
    public func configuration(environment: [String: String], domains known: [String]) throws -> DaemonConfiguration {
        var settings = DaemonConfiguration(environment: environment, domains: known)
        if let config { try settings.apply(file: config) }
        if let dataDir { settings.dataDirectory = dataDir }
        if let commandEndpoint { settings.commandEndpoint = commandEndpoint }
        if let eventsEndpoint { settings.eventsEndpoint = eventsEndpoint }
        if !domains.isEmpty { settings.domains = domains }
        if let durability {
            guard let value = DaemonConfiguration.Durability(rawValue: durability) else {
                throw ConfigurationError(
                    file: nil,
                    key: "--durability",
                    "must be fsync or relaxed, got '\(durability)'"
                )
            }
            settings.durability = value
        }
        if let journal {
            guard let value = DaemonConfiguration.JournalKind(rawValue: journal) else {
                throw ConfigurationError(
                    file: nil,
                    key: "--journal",
                    "must be sqlite, memory, postgres or log, got '\(journal)'"
                )
            }
            settings.journal = value
        }
        if let postgres { settings.postgresConnection = postgres }
        if let leaseMs {
            guard (100...600_000).contains(leaseMs) else {
                throw ConfigurationError(file: nil, key: "--lease-ms", "must be 100…600000, got \(leaseMs)")
            }
            settings.leaseDuration = .milliseconds(leaseMs)
        }
        if let name { settings.leaseHolder = name }
        if let httpListen { settings.httpListen = httpListen }
        if let httpInspector { settings.inspector = httpInspector }
        try settings.validate(knownDomains: known)
        return settings
    }

    /// The `--log-level`, or an error naming the value.
    public func level() throws -> Logger.Level {
        guard let level = Logger.Level(rawValue: logLevel) else {
            let levels = Logger.Level.allCases.map(\.rawValue).joined(separator: ", ")
            throw ConfigurationError(file: nil, key: "--log-level", "must be one of \(levels), got '\(logLevel)'")
        }
        return level
    }
}

/// The command behind ``LockstepDaemonMain``: its flags and help; ``LockstepDaemonMain/run(domains:effects:commandName:logHandler:arguments:)``
/// parses it and calls ``serve(domains:effects:name:logHandler:)`` with what the executable hosts.
struct DaemonCommand: ParsableCommand {
    /// A configuration it cannot serve: sysexits' EX_CONFIG.
    static let configurationExit: Int32 = 78

    /// The executable's file name, e.g. `lockstepd`.
    static var executableName: String {
        CommandLine.arguments.first.map { URL(fileURLWithPath: $0).lastPathComponent } ?? "lockstepd"
    }

    static var configuration: CommandConfiguration {
        CommandConfiguration(
            commandName: executableName,
            abstract: "A Lockstep daemon: validates, sequences, journals and publishes every action of its domains.",
            discussion: """
                With no flags it keeps its journal in $STATE_DIRECTORY or ./.lockstep/data and listens on ipc:// \
                sockets in $RUNTIME_DIRECTORY or ./.lockstep/run, hosting every domain it links. Flags win over \
                --config, which wins over the defaults. SIGTERM or SIGINT stops it after the batch in flight.
                Exit codes: 0 stopped cleanly, 1 could not go on (the log says why), 64 bad usage, 78 a \
                configuration it cannot serve.
                """
        )
    }

    @OptionGroup var options: DaemonFlags

    /// Serves `domains` as the flags say until SIGTERM or SIGINT; the exit status.
    func serve(
        domains: [HostedDomain],
        effects: [EffectHandler],
        name: String,
        logHandler: @escaping LockstepDaemonMain.LogHandlerFactory
    ) async
        -> Int32
    {
        let settings: DaemonConfiguration
        let level: Logger.Level
        do {
            level = try options.level()
            try EffectHandler.check(effects, for: domains)
            settings = try options.configuration(
                environment: ProcessInfo.processInfo.environment,
                domains: domains.map(\.name)
            )
        } catch {
            FileHandle.standardError.write(Data("\(name): \(error)\n".utf8))
            return Self.configurationExit
        }
        let logger = Logger(label: name) { label in
            var handler = logHandler(label)
            handler.logLevel = level
            return handler
        }
        do {
            let daemon = try LockstepDaemon(
                configuration: settings,
                domains: domains,
                effects: effects,
                environment: ProcessInfo.processInfo.environment,
                logger: logger
            )
            let group = ServiceGroup(
                configuration: .init(
                    services: [.init(service: daemon)],
                    gracefulShutdownSignals: [.sigterm, .sigint],
                    logger: logger
                )
            )
            try await group.run()
            return 0
        } catch {
            logger.critical("\(name) cannot run", metadata: ["error": "\(error)"])
            return 1
        }
    }
}
