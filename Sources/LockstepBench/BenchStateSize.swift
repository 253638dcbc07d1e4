import Foundation
import Lockstep
import LockstepClient
import LockstepExamples
import LockstepJournal
import LockstepProtocol
import LockstepTesting
import ZeroMQ

extension Bench {
    // MARK: - P7

    /// P7: the per-action cost against the size of the state. For an empty `todos` store and for one grown to each
    /// of `megabytes` (of canonical JSON; 180-character todos), a lockstepd on that journal (default settings: a digest
    /// every 1,000 events, snapshots by the journal's policy): a new replica's join, then P1 (one client) and P2 (8
    /// clients) adding todos while a replica follows, its CPU per event, and the peak memory of both processes. Then
    /// the same todos shaped as docs/domains.md recommends for a large state (``TreeTodos``: a `DigestedDictionary`
    /// by id), empty and at the largest size, on a daemon of the same library with the same settings.
    func measureStateSizes(megabytes sizes: [Int]) throws {
        var rows: [BenchResults.P7] = []
        func measure<D: Domain>(_ domain: D.Type, _ sizes: [Int], add: (String) -> D.Action) throws {
            var empty: BenchResults.P7?
            for megabytes in sizes {
                say("P7: a \(D.name) store of \(megabytes) MB")
                var row = try stateSizeRow(
                    D.self,
                    megabytes: megabytes,
                    plantDivergence: megabytes > 0 && megabytes == sizes.max(),
                    add: add
                )
                if let empty {
                    row.p1RatioP50 = ratio(row.p1P50Us.value, empty.p1P50Us.value)
                    row.p1RatioP99 = ratio(row.p1P99Us.value, empty.p1P99Us.value)
                    row.p2Ratio = ratio(row.p2ActionsPerS, empty.p2ActionsPerS)
                } else {
                    empty = row
                }
                rows.append(row)
            }
        }
        try measure(Todos.self, [0] + sizes) { .add(text: $0) }
        if let largest = sizes.max(), largest > 0 { try measure(TreeTodos.self, [0, largest]) { .add(text: $0) } }
        results.p7 = rows
    }

    /// One row of `D`'s store (`todos` or ``TreeTodos``, the same actions); with `plantDivergence`, also how long a
    /// replica whose reducer misapplies one action takes to find out.
    private func stateSizeRow<D: Domain>(
        _: D.Type,
        megabytes: Int,
        plantDivergence: Bool,
        add: (String) -> D.Action
    ) throws -> BenchResults.P7 {
        let name = "size-\(D.name)-\(megabytes)"
        let directory = folder.appendingPathComponent(name)
        // ~220 bytes of canonical JSON a todo: {"completed":false,"id":N,"text":"…180…"} and a comma.
        let todos = megabytes << 20 / 220
        let fillStart = ContinuousClock.now
        var stateBytes = 0
        var floors = (encode: 0.0, hash: 0.0, decode: 0.0, stream: 0.0)
        if todos > 0 {
            do {
                // One snapshot, at the end: the store starts from it, as a daemon that has run a long time does.
                let policy = JournalPolicy(snapshotEveryEvents: todos, snapshotEveryBytes: .max)
                let journal: any Journal =
                    self.journal == .log
                    ? try LogJournal(directory: directory.path, policy: policy)
                    : try SQLiteJournal(directory: directory.path, policy: policy, relaxed: true)
                let state = try fill(journal, D.self, events: todos, batchSize: 10_000) { seq in
                    (add(BenchWorker.todoText(seq)), BenchWorker.todoAdd(seq))
                }
                try journal.sync()
                try journal.close()
                // The floors under a join and a checkpoint: encoding, hashing and decoding the state once, here.
                let encodeStart = ContinuousClock.now
                let bytes = try CanonicalEncoding.bytes(of: state)
                let hashStart = ContinuousClock.now
                _ = StateDigest(of: bytes)
                let decodeStart = ContinuousClock.now
                _ = try CanonicalEncoding.Coder().decode(D.State.self, from: bytes)
                let decodeEnd = ContinuousClock.now
                guard CanonicalEncoding.streamed(state, digestForm: false, into: { _ in }) != nil else {
                    throw BenchFailure("the \(D.name) state did not stream")
                }
                let streamEnd = ContinuousClock.now
                floors = (
                    seconds(hashStart - encodeStart), seconds(decodeStart - hashStart),
                    seconds(decodeEnd - decodeStart),
                    seconds(streamEnd - decodeEnd)
                )
                stateBytes = bytes.count
            } catch {
                throw BenchFailure("could not write the \(todos)-todo \(D.name) journal in \(directory.path): \(error)")
            }
        } else {
            stateBytes = try CanonicalEncoding.bytes(of: D.initialState).count
        }
        let fill = ContinuousClock.now - fillStart
        let daemonStart = ContinuousClock.now
        let daemon = try startDaemon(
            name,
            domains: [D.name],
            extra: journal.setting,
            benchDaemon: D.self != Todos.self
        )
        defer { _ = daemon.stop() }
        let started = ContinuousClock.now - daemonStart
        let endpoints = ["--endpoint", daemon.command, "--events-endpoint", daemon.events, "--store", D.name]
        let joiner = try worker("join", endpoints + ["--count", "\(todos)"], input: false)
        let joined = try report(of: joiner, within: .seconds(120))
        guard joined.seq >= UInt64(todos) else {
            throw BenchFailure("the joining \(D.name) replica reached seq \(joined.seq) of \(todos) within 120 s")
        }
        let follower = try worker("replica", endpoints)
        _ = try awaitLine(follower, within: .seconds(120)) { $0 == "ready" }
        let dispatch = ["--endpoint", daemon.command, "--store", D.name, "--seconds", "\(seconds)"]
        let one = try runClients([try worker("dispatch", dispatch)])
        let eight = try runClients(try (0..<8).map { _ in try worker("dispatch", dispatch) })
        follower.send("until \(try seq(of: daemon))")
        let followed = try report(of: follower, within: .seconds(120))
        // A join again, now that the store has moved past its journal's newest snapshot: the state is encoded for it.
        let seqNow = try seq(of: daemon)
        let rejoined = try report(
            of: try worker("join", endpoints + ["--count", "\(seqNow)"], input: false),
            within: .seconds(120)
        )
        let divergence =
            plantDivergence ? try timeToFindADivergence(D.self, daemon, endpoints: endpoints) : nil
        let p1 = Latencies(one.flatMap(\.latencies))
        let budget = 64 << 20 + 3 * stateBytes
        let daemonPeak = daemon.memory().peakKiB * 1_024
        let replicaPeak = max(joined.peakResident, followed.peakResident, rejoined.peakResident)
        return BenchResults.P7(
            store: D.name,
            megabytes: megabytes,
            stateBytes: stateBytes,
            fillSeconds: seconds(fill),
            daemonStartSeconds: seconds(started),
            joinSeconds: Double(joined.elapsed / 1_000_000) / 1_000,
            joinAfterLoadSeconds: Double(rejoined.elapsed / 1_000_000) / 1_000,
            encodeSeconds: floors.encode,
            hashSeconds: floors.hash,
            decodeSeconds: floors.decode,
            streamSeconds: floors.stream,
            p1P50Us: p1.p50,
            p1P99Us: p1.p99,
            p2ActionsPerS: rate(eight),
            failures: (one + eight).reduce(0) { $0 + $1.failures },
            replicaCpuPerEventUs: replicaCPU([followed]),
            replicaResyncs: followed.resyncs + joined.resyncs,
            daemonPeakBytes: daemonPeak,
            replicaPeakBytes: replicaPeak,
            budgetBytes: budget,
            withinBudget: max(daemonPeak, replicaPeak) <= budget,
            divergenceFoundSeconds: divergence?.seconds,
            divergenceEvents: divergence?.events
        )
    }

    /// A replica of `D` with a planted bug (``Poisoned``) joins; one poisoned add is dispatched, then one client adds
    /// todos as fast as it can until the replica reports the divergence: how long after the poisoned add's
    /// acceptance, and how many events after its seq (the daemon's digest of a large array-shaped state comes from a
    /// checkpoint off its loop; of a `DigestedDictionary`, from its loop, over the digest form).
    private func timeToFindADivergence<D: Domain>(
        _: D.Type,
        _ daemon: DaemonProcess,
        endpoints: [String]
    ) throws -> (seconds: Double, events: Int) {
        say("P7: a \(D.name) replica that misapplies one action, in the largest state")
        let poisoned = try worker("diverging", endpoints)
        defer { poisoned.kill() }
        _ = try awaitLine(poisoned, within: .seconds(120)) { $0 == "ready" }
        let client = CommandClient(context: try Context(), endpoint: daemon.command, timeout: .seconds(10), retries: 0)
        let action = Array(#"{"add":{"text":"\#(Poisoned<Todos>.poison)"}}"#.utf8)
        let request = Request.dispatch(
            DispatchRequest(
                requestID: 1,
                domainVersion: D.version,
                clientID: .random(),
                store: try StoreName(D.name),
                actions: [action]
            )
        )
        guard case let .accepted(_, _, seq, _) = try client.call(request) else {
            throw BenchFailure("the daemon did not accept the poisoned add")
        }
        let accepted = monotonicNanos()
        let load = try worker("dispatch", ["--endpoint", daemon.command, "--store", D.name, "--seconds", "120"])
        defer { load.kill() }
        _ = try awaitLine(load, within: .seconds(60)) { $0 == "ready" }
        load.send("go")
        let found = try report(of: poisoned, within: .seconds(120))
        guard found.seq >= seq else {
            throw BenchFailure("the replica diverged at seq \(found.seq), before the poison's \(seq)")
        }
        return (Double((found.finishedAt - accepted) / 1_000_000) / 1_000, Int(found.seq - seq))
    }

    private func seconds(_ duration: Duration) -> Double { (duration / .milliseconds(1)).rounded() / 1_000 }
}
