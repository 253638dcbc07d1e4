import CoreMetrics
import Foundation
import Logging
import Prometheus
import ServiceLifecycle
import ZeroMQ

/// The daemon as a swift-service-lifecycle `Service`: recovery, binding and the command loop run on a thread
/// of their own; graceful shutdown (SIGTERM, SIGINT through a `ServiceGroup`) lets the loop finish the batch
/// in flight, publish it, close the journal and return.
///
/// Its metrics go to `metrics` — the process's `MetricsSystem` unless another factory is given — and, with
/// ``DaemonConfiguration/httpListen``, to `/metrics` as well.
public final class LockstepDaemon: Service, Sendable {
    private let loop: CommandLoop
    /// What `/metrics` serves, when the daemon has an HTTP listener.
    private let registry: PrometheusCollectorRegistry?

    /// A daemon serving `domains` as `configuration` says, running their effects with `effects` (one handler per
    /// domain that declares effects); `environment` is read for systemd's variables; its metrics go to `metrics`.
    public init(
        configuration: DaemonConfiguration,
        domains: [HostedDomain],
        effects: [EffectHandler] = [],
        environment: [String: String],
        metrics: (any MetricsFactory)? = nil,
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
        var factory = metrics ?? MetricsSystem.factory
        if configuration.httpListen != nil {
            let registry = PrometheusCollectorRegistry()
            factory = MultiplexMetricsHandler(factories: [DaemonMetrics.prometheus(registry), factory])
            self.registry = registry
        } else {
            registry = nil
        }
        loop = try CommandLoop(
            configuration: configuration,
            domains: hosted,
            notifier: SystemdNotifier(environment: environment),
            failpoint: try Failpoint(environment: environment),
            effectHandlers: effects,
            metrics: factory,
            logger: logger
        )
    }

    /// Recovers, binds and serves until graceful shutdown or until its task is cancelled; either way the batch in
    /// flight is committed, replied to and published, the journal closed, and `run()` returns.
    public func run() async throws {
        // SIGHUP reloads the list of CURVE clients.
        loop.installHangupHandler()
        let http = try loop.configuration.httpListen.map { listen in
            try HTTPListener(listen: listen, logger: loop.logger) { [registry, loop] in
                DaemonSite(
                    registry: registry,
                    inspector: loop.inspectorFeed.map { feed in
                        Inspector(
                            feed: feed,
                            domains: loop.domains,
                            restricted: loop.configuration.access != nil,
                            logger: loop.logger
                        ) { try loop.openReader() }
                    }
                )
            }
        }
        defer { http?.stop() }
        if let http {
            loop.httpAddress.withLockedValue { $0 = http.address }
            loop.logger.info(
                loop.inspectorFeed == nil
                    ? "serving /metrics over HTTP" : "serving /metrics and the inspector over HTTP",
                metadata: ["address": "\(http.address)"]
            )
        }
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
