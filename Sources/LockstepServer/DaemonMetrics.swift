import CoreMetrics
import Foundation
import Lockstep
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
                timer.recordNanoseconds((ContinuousClock.now - start).nanoseconds)
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

// What the loop hands the metrics once a second: its own tallies and where it stands (the loop only calls these).

extension LoopThread {
    /// Brings the metrics up to date with what the loop tallied (answers, errors, commits, replicas' reports) and
    /// what it stands at now.
    mutating func recordMetrics() {
        let now = ContinuousClock.now
        nextMetrics = now + DaemonMetrics.interval
        for (code, count) in sockets.refusals { metrics.count("lockstep_errors_total", [("code", code)], total: count) }
        metrics.gauge("lockstep_subscriptions", Double(sockets.subscriptions.values.reduce(0, +)))
        metrics.gauge("lockstep_leader", serving == nil ? 0 : 1)
        metrics.count("lockstep_takeovers_total", total: takeovers)
        if let bytes = CommandLoop.journalBytes(journal) {
            metrics.gauge("lockstep_journal_bytes", Double(bytes))
        }
        serving?.record(&metrics, now: now)
        loop.inspectorFeed?.status(status, published: serving?.publishedSeq ?? [:])
    }
}

extension Serving {
    /// Brings `metrics` up to date with this leadership's tallies, its stores, and its replicas (those silent too
    /// long leave the roster, and their gauges go).
    mutating func record(_ metrics: inout MetricsMirror, now: ContinuousClock.Instant) {
        roster.expire(now: now)
        let effects = ledger.counts()
        let declaring = Set(loop.domains.filter(\.hasEffects).map(\.name))
        if let lease = pipeline.lease { metrics.gauge("lockstep_lease_term", Double(lease.term)) }
        for (name, store) in sequencer.stores {
            let dimensions = [("store", name.rawValue)]
            metrics.count("lockstep_actions_accepted_total", dimensions, total: committedEvents[name] ?? 0)
            for (code, count) in answered[name]?.rejected ?? [:] {
                metrics.count("lockstep_actions_rejected_total", dimensions + [("code", code)], total: count)
            }
            for (code, count) in answered[name]?.refused ?? [:] {
                metrics.count("lockstep_dispatches_refused_total", dimensions + [("code", code)], total: count)
            }
            metrics.count("lockstep_snapshots_total", dimensions, total: snapshotsCommitted[name] ?? 0)
            if let through = journal.compactedThrough(store: name.rawValue) {
                metrics.gauge("lockstep_journal_compacted_through", dimensions, Double(through))
            }
            metrics.gauge("lockstep_store_seq", dimensions, Double(publishedSeq[name] ?? store.lastSeq))
            if let counts = effects[name.rawValue] ?? (declaring.contains(name.rawValue) ? (0, 0, 0) : nil) {
                metrics.gauge("lockstep_effects_pending", dimensions, Double(counts.pending))
                metrics.gauge("lockstep_effects_dead", dimensions, Double(counts.dead))
            }
            let counts = reported[name] ?? .init()
            metrics.count("lockstep_replica_repairs_total", dimensions, total: counts.repairs)
            metrics.count("lockstep_replica_resyncs_total", dimensions, total: counts.resyncs)
            metrics.count("lockstep_replica_divergences_total", dimensions, total: counts.divergences)
            metrics.gauge(
                "lockstep_replicas",
                dimensions,
                Double(roster.replicas.keys.filter { $0.store == name }.count)
            )
        }
        var present: Set<[String]> = []
        for (key, entry, lag) in roster.lags(stores: storePositions, now: now) {
            let dimensions = [
                ("store", key.store.rawValue), ("replica", entry.report.name),
                ("client", String(key.client.description.prefix(8))),
            ]
            present.insert(MetricsMirror.dimensionKey(dimensions))
            metrics.gauge("lockstep_replica_lag_events", dimensions, Double(lag.events))
            metrics.gauge("lockstep_replica_lag_seconds", dimensions, Double(lag.time / .milliseconds(1)) / 1_000)
        }
        metrics.dropGauges("lockstep_replica_lag_events", keeping: present)
        metrics.dropGauges("lockstep_replica_lag_seconds", keeping: present)
    }
}
