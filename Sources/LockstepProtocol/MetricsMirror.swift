import CoreMetrics

/// Counters and gauges kept up to date from tallies a loop keeps anyway: the daemon's loop and a replica's hand
/// them what they counted now and then (once a second), so an action or an event costs the metrics nothing.
/// Owned by one thread.
package struct MetricsMirror {
    package let factory: any MetricsFactory
    private var counters: [Key: (counter: CoreMetrics.Counter, total: UInt64)] = [:]
    private var gauges: [Key: CoreMetrics.Gauge] = [:]

    private struct Key: Hashable {
        var label: String
        var dimensions: [String]
    }

    package init(factory: any MetricsFactory) {
        self.factory = factory
    }

    /// Sets counter `label` to `total`, a tally kept elsewhere: it grows by what the tally grew since the last call.
    /// A tally that starts again from zero (a new leadership's) is taken as growing from zero.
    package mutating func count(_ label: String, _ dimensions: [(String, String)] = [], total: UInt64) {
        let key = Key(label: label, dimensions: Self.dimensionKey(dimensions))
        let entry = counters[key] ?? (CoreMetrics.Counter(label: label, dimensions: dimensions, factory: factory), 0)
        let grown = total >= entry.total ? total - entry.total : total
        if grown > 0 { entry.counter.increment(by: Int64(clamping: grown)) }
        counters[key] = (entry.counter, total)
    }

    /// Sets gauge `label`, without dimensions, to `value`.
    package mutating func gauge(_ label: String, _ value: Double) { gauge(label, [], value) }

    /// Sets gauge `label` to `value`.
    package mutating func gauge(_ label: String, _ dimensions: [(String, String)], _ value: Double) {
        let key = Key(label: label, dimensions: Self.dimensionKey(dimensions))
        let gauge = gauges[key] ?? CoreMetrics.Gauge(label: label, dimensions: dimensions, factory: factory)
        gauges[key] = gauge
        gauge.record(value)
    }

    /// Removes every gauge of `label` whose dimensions (as ``dimensionKey(_:)`` gives them) are not in `keep` — a
    /// replica that left, say — so the metrics stop naming it.
    package mutating func dropGauges(_ label: String, keeping keep: Set<[String]>) {
        for key in gauges.keys where key.label == label && !keep.contains(key.dimensions) {
            gauges.removeValue(forKey: key)?.destroy()
        }
    }

    /// Dimensions as one array, the way ``dropGauges(_:keeping:)`` compares them.
    package static func dimensionKey(_ dimensions: [(String, String)]) -> [String] {
        dimensions.flatMap { [$0.0, $0.1] }
    }
}
