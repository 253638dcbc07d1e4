import ArgumentParser
import Foundation
import LockstepExamples
import LockstepServer
import Logging
import ServiceLifecycle

/// `lockstepd`: the daemon, linked with the example domains.
@main
struct LockstepDaemonCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lockstepd",
        abstract: "The Lockstep daemon: validates, sequences, journals and publishes every action.",
        discussion: """
            With no flags it keeps its journal in $STATE_DIRECTORY or ./.lockstep/data and listens on ipc:// \
            sockets in $RUNTIME_DIRECTORY or ./.lockstep/run, hosting the example domains. Flags win over \
            --config, which wins over the defaults. SIGTERM or SIGINT stops it after the batch in flight.
            """
    )

    @Option(help: "A TOML configuration file (see deploy/lockstepd.toml).")
    var config: String?

    @Option(help: "The journal's directory.")
    var dataDir: String?

    @Option(help: "The command endpoint (ROUTER), e.g. ipc:///run/lockstep/command.")
    var commandEndpoint: String?

    @Option(help: "The events endpoint (PUB), e.g. ipc:///run/lockstep/events.")
    var eventsEndpoint: String?

    @Option(name: .customLong("domain"), help: "A domain to host (repeatable); default: all examples.")
    var domains: [String] = []

    @Option(help: "fsync (every action durable before its ack) or relaxed.")
    var durability: String?

    @Option(help: "sqlite or memory.")
    var journal: String?

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel: String = "info"

    func run() async throws {
        let level = Logger.Level(rawValue: logLevel) ?? .info
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        let logger = Logger(label: "lockstepd")
        let hosted = Examples.domains.map { HostedDomain($0) }
        var settings = DaemonConfiguration(
            environment: ProcessInfo.processInfo.environment,
            domains: hosted.map(\.name)
        )
        do {
            if let config {
                let text = try String(contentsOfFile: config, encoding: .utf8)
                do {
                    try settings.apply(try TOMLDocument.parse(text), file: config)
                } catch let error as TOMLDocument.ParseError {
                    throw ConfigurationError(file: config, key: "syntax", error.description)
                }
            }
            if let dataDir { settings.dataDirectory = dataDir }
            if let commandEndpoint { settings.commandEndpoint = commandEndpoint }
            if let eventsEndpoint { settings.eventsEndpoint = eventsEndpoint }
            if !domains.isEmpty { settings.domains = domains }
            if let durability {
                guard let value = DaemonConfiguration.Durability(rawValue: durability) else {
                    throw ValidationError("--durability must be fsync or relaxed, got '\(durability)'")
                }
                settings.durability = value
            }
            if let journal {
                guard let value = DaemonConfiguration.JournalKind(rawValue: journal) else {
                    throw ValidationError("--journal must be sqlite or memory, got '\(journal)'")
                }
                settings.journal = value
            }
            let daemon = try LockstepDaemon(
                configuration: settings,
                domains: hosted,
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
        } catch let error as ValidationError {
            throw error
        } catch {
            logger.critical("lockstepd cannot run: \(error)")
            throw ExitCode(1)
        }
    }
}
