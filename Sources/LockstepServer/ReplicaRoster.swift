import LockstepProtocol

/// The replicas the leader hears from (REPORT, docs/protocol.md) and how far behind each is, without sockets or
/// clocks of its own: the loop tells it what was committed when, what each replica reported, and what time it is.
///
/// A replica's lag is measured at its report — the events it had not applied then, and how long ago the first of them
/// was committed — and, once its next report is overdue (twice its interval), as if it had applied nothing since:
/// a stopped or cut-off replica's lag grows while it is silent. One silent for ``expiryReports`` of its intervals
/// (and at least ``minimumExpiry``) leaves the roster.
package struct ReplicaRoster {
    /// A replica is dropped after this many of its report intervals without a report…
    package static let expiryReports = 10
    /// …and never sooner than this.
    package static let minimumExpiry = Duration.seconds(10)
    /// Commit times kept per store, for the lag in time; a replica further behind is at least as late as the oldest.
    package static let commitTimesKept = 4_096

    package struct Key: Hashable, Sendable, Comparable {
        package var store: StoreName
        package var client: ClientID

        package static func < (lhs: Key, rhs: Key) -> Bool {
            (lhs.store, lhs.client.description) < (rhs.store, rhs.client.description)
        }
    }

    /// One replica as last heard.
    package struct Entry: Sendable {
        package var report: ReplicaProgress
        package var heardAt: ContinuousClock.Instant
        /// Its lag when its report came.
        package var lagAtReport: Lag
    }

    /// How far behind a replica is.
    package struct Lag: Hashable, Sendable {
        package var events: UInt64
        package var time: Duration
    }

    /// What a report added to the replicas' totals, for the daemon's counters.
    package struct Counts: Hashable, Sendable {
        package var repairs: UInt64 = 0
        package var resyncs: UInt64 = 0
        package var divergences: UInt64 = 0
    }

    package private(set) var replicas: [Key: Entry] = [:]
    private var commits: [StoreName: [(lastSeq: SequenceNumber, at: ContinuousClock.Instant)]] = [:]

    package init() {}

    /// Events of `store` up to `lastSeq` were committed `now`.
    package mutating func committed(_ store: StoreName, through lastSeq: SequenceNumber, now: ContinuousClock.Instant) {
        commits[store, default: []].append((lastSeq, now))
        if commits[store]!.count > Self.commitTimesKept + Self.commitTimesKept / 4 {
            commits[store]!.removeFirst(Self.commitTimesKept / 4)
        }
    }

    /// A replica's report, with its store's `epoch` and last `seq` now; returns what it adds to the totals (the whole
    /// of a new replica's counts, the growth of a known one's).
    package mutating func heard(
        _ report: ReplicaProgress,
        epoch: Epoch,
        seq: SequenceNumber,
        now: ContinuousClock.Instant
    ) -> Counts {
        let key = Key(store: report.store, client: report.clientID)
        let before = replicas[key]?.report
        replicas[key] = Entry(
            report: report,
            heardAt: now,
            lagAtReport: lag(report, epoch: epoch, seq: seq, now: now)
        )
        func grown(_ path: KeyPath<ReplicaProgress, UInt64>) -> UInt64 {
            let previous = before?[keyPath: path] ?? 0
            return report[keyPath: path] >= previous ? report[keyPath: path] - previous : report[keyPath: path]
        }
        return Counts(repairs: grown(\.repairs), resyncs: grown(\.resyncs), divergences: grown(\.divergences))
    }

    /// Drops the replicas silent for too long; returns them.
    @discardableResult
    package mutating func expire(now: ContinuousClock.Instant) -> [Key] {
        let gone = replicas.filter { now - $0.value.heardAt >= Self.expiry(of: $0.value.report) }.keys
        for key in gone { replicas[key] = nil }
        return gone.sorted()
    }

    /// How long a replica that reports every `interval` may be silent before it leaves the roster.
    package static func expiry(of report: ReplicaProgress) -> Duration {
        max(report.interval * expiryReports, minimumExpiry)
    }

    /// Each replica's lag now, given each store's epoch and last seq.
    package func lags(
        stores: [StoreName: (epoch: Epoch, seq: SequenceNumber)],
        now: ContinuousClock.Instant
    ) -> [(key: Key, entry: Entry, lag: Lag)] {
        replicas.sorted { $0.key < $1.key }.map { key, entry in
            guard now - entry.heardAt > entry.report.interval * 2, let store = stores[key.store] else {
                return (key, entry, entry.lagAtReport)
            }
            return (key, entry, lag(entry.report, epoch: store.epoch, seq: store.seq, now: now))
        }
    }

    /// The lag of a replica at `report`'s seq against a store at `seq` of `epoch`: a replica of another epoch has
    /// applied nothing of this one.
    private func lag(_ report: ReplicaProgress, epoch: Epoch, seq: SequenceNumber, now: ContinuousClock.Instant) -> Lag
    {
        let applied = report.epoch == epoch ? min(report.appliedSeq, seq) : 0
        guard applied < seq else { return Lag(events: 0, time: .zero) }
        return Lag(events: seq - applied, time: now - committedAt(report.store, seq: applied + 1, now: now))
    }

    /// When `seq` of `store` was committed: the time of the first commit that reached it, or the oldest one kept.
    private func committedAt(
        _ store: StoreName,
        seq: SequenceNumber,
        now: ContinuousClock.Instant
    ) -> ContinuousClock.Instant {
        guard let times = commits[store], !times.isEmpty else { return now }
        var (low, high) = (0, times.count - 1)
        guard times[high].lastSeq >= seq else { return times[high].at }
        while low < high {
            let middle = (low + high) / 2
            if times[middle].lastSeq >= seq { high = middle } else { low = middle + 1 }
        }
        return times[low].at
    }
}
