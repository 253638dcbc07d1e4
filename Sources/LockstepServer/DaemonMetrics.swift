import CoreMetrics
import Foundation
import LockstepProtocol
import Prometheus

/// The daemon's metrics, through swift-metrics (docs/operations.md, "Metrics" lists each).
///
/// The loop already tallies what it answers (for STATUS); once a second it hands what changed to a
/// ``MetricsMirror``, so an action costs the metrics nothing on the loop. Only the journal's timings
/// (``JournalTimings``) are recorded as they happen, once per commit, on the thread that commits.
enum DaemonMetrics {
    /// How often the loop brings the metrics up to date.
    static let interval = Duration.seconds(1)

    /// The handles a commit records into, on whichever thread commits.
    struct JournalTimings: Sendable {
        let commit: CoreMetrics.Timer
        let sync: CoreMetrics.Timer
        let batch: CoreMetrics.Recorder

        /// Runs `work` — one commit — recording how long it took.
        func commit<T, E: Error>(_ work: () throws(E) -> T) throws(E) -> T {
            try Self.time(commit, work)
        }

        /// Runs `work` — one fsync — recording how long it took.
        func sync<T, E: Error>(_ work: () throws(E) -> T) throws(E) -> T {
            try Self.time(sync, work)
        }

        private static func time<T, E: Error>(_ timer: CoreMetrics.Timer, _ work: () throws(E) -> T) throws(E) -> T {
            let start = ContinuousClock.now
            defer {
                let elapsed = (ContinuousClock.now - start).components
                timer.recordNanoseconds(elapsed.seconds * 1_000_000_000 + elapsed.attoseconds / 1_000_000_000)
            }
            return try work()
        }
    }

    static func timings(factory: any MetricsFactory, journalKind: String) -> JournalTimings {
        let dimensions = [("journal", journalKind)]
        return JournalTimings(
            commit: Timer(label: "lockstep_journal_commit_seconds", dimensions: dimensions, factory: factory),
            sync: Timer(label: "lockstep_journal_fsync_seconds", dimensions: dimensions, factory: factory),
            batch: CoreMetrics.Recorder(
                label: "lockstep_commit_batch_actions",
                dimensions: [],
                aggregate: true,
                factory: factory
            )
        )
    }

    /// The Prometheus factory of `/metrics`, with buckets that fit a commit (tens of µs to a second) and a batch
    /// (1 to the largest `max_batch`).
    static func prometheus(_ registry: PrometheusCollectorRegistry) -> PrometheusMetricsFactory {
        var factory = PrometheusMetricsFactory(registry: registry)
        let times: [Duration] = [
            .microseconds(50), .microseconds(100), .microseconds(250), .microseconds(500), .milliseconds(1),
            .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50),
            .milliseconds(100), .milliseconds(250), .seconds(1),
        ]
        factory.durationHistogramBuckets = [
            "lockstep_journal_commit_seconds": times, "lockstep_journal_fsync_seconds": times,
        ]
        factory.valueHistogramBuckets = [
            "lockstep_commit_batch_actions": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1_000]
        ]
        return factory
    }

    /// What the HTTP listener answers: `/metrics` from `registry`, and a word on what is served for anything else.
    static func page(_ request: HTTPRequest, _ registry: PrometheusCollectorRegistry?) -> HTTPResponse {
        guard request.path == "/metrics", let registry else {
            return .text(404, "nothing at \(request.path.prefix(200)); this daemon serves /metrics")
        }
        return HTTPResponse(
            status: 200,
            contentType: "text/plain; version=0.0.4; charset=utf-8",
            body: registry.emitToBuffer()
        )
    }
}
