import Foundation
import Logging
import ServiceLifecycle
import ZeroMQ

/// The daemon as a swift-service-lifecycle `Service`: recovery, binding and the command loop run on a thread
/// of their own; graceful shutdown (SIGTERM, SIGINT through a `ServiceGroup`) lets the loop finish the batch
/// in flight, publish it, close the journal and return.
public final class LockstepDaemon: Service, Sendable {
    private let loop: CommandLoop

    /// A daemon serving `domains` as `configuration` says, running their effects with `effects` (one handler per
    /// domain that declares effects); `environment` is read for systemd's variables.
    public init(
        configuration: DaemonConfiguration,
        domains: [HostedDomain],
        effects: [EffectHandler] = [],
        environment: [String: String],
        logger: Logger
    ) throws {
        let known = domains.map(\.name)
        try configuration.validate(knownDomains: known)
        try EffectHandler.check(effects, for: domains)
        let hosted = configuration.domains.compactMap { name in domains.first { $0.name == name } }
        if !Failpoint.compiledIn, let value = environment["LOCKSTEP_FAILPOINT"], !value.isEmpty {
            logger.warning(
                "LOCKSTEP_FAILPOINT is ignored: failpoints exist only in test (debug) builds, not in this one",
                metadata: ["LOCKSTEP_FAILPOINT": "\(value)"]
            )
        }
        loop = try CommandLoop(
            configuration: configuration,
            domains: hosted,
            notifier: SystemdNotifier(environment: environment),
            failpoint: try Failpoint(environment: environment),
            effectHandlers: effects,
            logger: logger
        )
    }

    /// Recovers, binds and serves until graceful shutdown or until its task is cancelled; either way the batch in
    /// flight is committed, replied to and published, the journal closed, and `run()` returns.
    public func run() async throws {
        // SIGHUP reloads the list of CURVE clients.
        loop.installHangupHandler()
        try await withTaskCancellationHandler {
            try await withGracefulShutdownHandler {
                try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                    let thread = Thread { [loop] in
                        nameCurrentThread("lockstepd loop")
                        do {
                            try loop.run()
                            continuation.resume()
                        } catch {
                            continuation.resume(throwing: error)
                        }
                    }
                    thread.start()
                }
            } onGracefulShutdown: { [loop] in
                loop.stop()
            }
        } onCancel: { [loop] in
            loop.stop()
        }
    }
}
