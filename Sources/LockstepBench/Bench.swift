import ArgumentParser
import Foundation
import Lockstep
import LockstepClient
import LockstepExamples
import LockstepJournal
import LockstepProtocol
import LockstepTesting
import LockstepTool
import ZeroMQ

/// One run of `lockstep bench`: owns its folder and every process it starts (killed when released).
package final class Bench {
    /// The transport every socket of the bench uses.
    package enum Transport: String, CaseIterable, Sendable {
        case ipc, tcp
    }

    /// The journal of the daemons that P1, P2, P3, P7 and `outside` start (P7 fills it first).
    package enum LocalJournal: String, CaseIterable, Sendable {
        case sqlite, log

        /// The daemon's setting for it, first in its file.
        var setting: String { "journal = \"\(rawValue)\"\n" }
    }

    package let folder: URL
    let transport: Transport
    let seconds: Double
    let keep: Bool
    let journal: LocalJournal
    private let progressToStandardError: Bool
    let lockstep: URL
    private let lockstepd: URL
    /// Whether P1 and P2 run against a daemon with a policy (`--policy`).
    private let policy: Bool
    /// Whether P1 and P2 run against a daemon that serves /metrics (`--metrics`).
    private let metrics: Bool
    /// Whether P1 and P2 run with an inspector page open on the daemon (`--inspector`).
    private let inspector: Bool
    /// With tcp: the daemon's (and the raw servers') key pair and the one client pair every client uses.
    let curve: (server: CurveKeyPair, client: CurveKeyPair)?
    private var workers = 0
    var results: BenchResults

    /// A bench of these `lockstep` (its hidden `bench-worker` command) and `lockstepd` executables, in a new
    /// temporary folder.
    package init(
        lockstep: URL,
        lockstepd: URL,
        transport: Transport,
        seconds: Double,
        keep: Bool,
        journal: LocalJournal = .log,
        policy: Bool = false,
        metrics: Bool = false,
        inspector: Bool = false,
        progressToStandardError: Bool
    ) throws {
        self.transport = transport
        self.seconds = seconds
        self.keep = keep
        self.journal = journal
        self.policy = policy
        self.metrics = metrics
        self.inspector = inspector
        self.progressToStandardError = progressToStandardError
        self.lockstep = lockstep
        self.lockstepd = lockstepd
        folder = try freshTemporaryFolder("lockstep-bench-\(getpid())")
        curve = transport == .tcp ? (try CurveKeyPair.generate(), try CurveKeyPair.generate()) : nil
        #if DEBUG
        let build = "debug"
        #else
        let build = "release"
        #endif
        results = BenchResults(
            build: build,
            transport: transport.rawValue,
            cores: ProcessInfo.processInfo.activeProcessorCount,
            secondsPerMeasurement: seconds
        )
        results.policy = policy
        results.journal = journal.rawValue
        results.metrics = metrics
        results.inspector = inspector
    }

    deinit {
        if !keep { try? FileManager.default.removeItem(at: folder) }
    }

    package func run(histories: [Int], parts: Set<String>, stateSizes: [Int] = [1, 10, 100]) throws -> BenchResults {
        let started = ContinuousClock.now
        if results.build == "debug" {
            say("this lockstep is a debug build: the figures say little; make bench builds -c release")
        }
        say("lockstep bench: \(transport), \(results.cores) cores, \(seconds) s per measurement, in \(folder.path)")
        if parts.contains("baselines") { try measureBaselines() }
        if !parts.isDisjoint(with: ["p1", "p2", "optimistic"]) { try measureDispatch(parts) }
        if parts.contains("effects") { try measureEffects() }
        if parts.contains("postgres") { try measurePostgres() }
        if parts.contains("redis") { try measureRedis() }
        if parts.contains("p3") { try measureFanOut() }
        if parts.contains("p4") { try measureLateJoin(histories: histories) }
        if parts.contains("p5") { measureStore() }
        if parts.contains("p7") { try measureStateSizes(megabytes: stateSizes) }
        if parts.contains("outside") { try measureOutside() }
        let p6 = results.p4.last.map { $0.stateBytes } ?? 0
        results.p6.stateBytes = p6
        results.p6.budgetBytes = 64 << 20 + 3 * p6
        if results.p4.isEmpty {
            results.p6.notJudged = "P4 did not run, so the largest state is not known"
        } else if results.p6.daemonPeakBytes == 0 || results.p6.replicaPeakBytes == 0 {
            results.p6.notJudged = "no part that runs a daemon and a replica process ran"
        } else {
            results.p6.withinBudget =
                max(results.p6.daemonPeakBytes, results.p6.replicaPeakBytes) <= results.p6.budgetBytes
        }
        results.totalSeconds = ((ContinuousClock.now - started) / .milliseconds(100)).rounded() / 10
        if keep { say("kept \(folder.path)") }
        return results
    }

    // MARK: - Baselines

    private func measureBaselines() throws {
        say("baselines: fsync, raw REQ/REP, ROUTER ← 8 REQ, PUB → 4 SUB")
        let fsync = try fsyncLatencies(count: 2_000, inPlace: false)
        results.baselines.fsyncP50Us = fsync.p50
        results.baselines.fsyncP99Us = fsync.p99
        let inPlace = try fsyncLatencies(count: 2_000, inPlace: true)
        results.baselines.fsyncInPlaceP50Us = inPlace.p50
        results.baselines.fsyncInPlaceP99Us = inPlace.p99

        let repEndpoint = endpoint("echo-rep")
        let rep = try worker("echo-rep", ["--endpoint", repEndpoint], curve: .server, input: false)
        _ = try awaitLine(rep, within: .seconds(30)) { $0 == "ready" }
        let single = try runClients([try worker("req", ["--endpoint", repEndpoint, "--seconds", "\(seconds)"])])
        rep.kill()
        let singleLatencies = Latencies(single.flatMap(\.latencies))
        results.baselines.reqRepP50Us = singleLatencies.p50
        results.baselines.reqRepP99Us = singleLatencies.p99
        results.baselines.reqRepRoundTripsPerS = rate(single)

        let routerEndpoint = endpoint("echo-router")
        let router = try worker("echo-router", ["--endpoint", routerEndpoint], curve: .server, input: false)
        _ = try awaitLine(router, within: .seconds(30)) { $0 == "ready" }
        let routerCPU = cpuTime(ofProcess: router.process.processIdentifier)
        let eight = try runClients(
            try (0..<8).map { _ in try worker("req", ["--endpoint", routerEndpoint, "--seconds", "\(seconds)"]) }
        )
        results.baselines.router8EchoCpuPerRoundTripUs = cpu(
            of: router,
            since: routerCPU,
            per: eight.reduce(0) { $0 + $1.count }
        )
        router.kill()
        results.baselines.router8ReqRoundTripsPerS = rate(eight)
        results.baselines.router8ReqP50Us = Latencies(eight.flatMap(\.latencies)).p50
        results.baselines.router8ReqClientCpuPerRoundTripUs = cpuPerOperation(eight)

        results.baselines.pub4SubMsgsPerS = try publishToFour()
    }

    /// The raw ROUTER ← 8 REQ again, the echo answering each message late enough that its clients wait about
    /// `wait` (P2's p50 at 8 clients): a client's CPU a round trip grows with how long it sleeps between them (a
    /// longer sleep costs more to wake from, in the kernel and on cold caches), so a raw client that waits as long
    /// is the baseline a dispatching client is compared with like for like. The wait is not the delay plus the
    /// at-once round trip (each wake-up from idle adds to it), so the delay is found in three runs, each by the secant
    /// through the two runs before it — the at-once run being the one at delay 0 — and the run whose p50 came closest
    /// is kept.
    private func lateEcho(waiting wait: Microseconds) throws -> BenchResults.LateEcho {
        say("baselines: ROUTER ← 8 REQ answered late, as long a wait as P2's at 8 clients (p50 \(wait))")
        var runs = [BenchResults.LateEcho(p50Us: results.baselines.router8ReqP50Us)]
        for _ in 0..<3 {
            let (a, b) = (runs[max(0, runs.count - 2)], runs[runs.count - 1])
            let slope =
                b.p50Us != a.p50Us ? (b.delayUs.value - a.delayUs.value) / (b.p50Us.value - a.p50Us.value) : 1
            let delay = Int(max(0, b.delayUs.value + (wait.value - b.p50Us.value) * min(4, max(0.25, slope))))
            let address = endpoint("echo-late")
            let router = try worker(
                "echo-router",
                ["--endpoint", address, "--delay-us", "\(delay)"],
                curve: .server,
                input: false
            )
            _ = try awaitLine(router, within: .seconds(30)) { $0 == "ready" }
            let routerCPU = cpuTime(ofProcess: router.process.processIdentifier)
            let eight = try runClients(
                try (0..<8).map { _ in try worker("req", ["--endpoint", address, "--seconds", "\(seconds)"]) }
            )
            runs.append(
                .init(
                    delayUs: Microseconds(Double(delay)),
                    p50Us: Latencies(eight.flatMap(\.latencies)).p50,
                    roundTripsPerS: rate(eight),
                    echoCpuPerRoundTripUs: cpu(
                        of: router,
                        since: routerCPU,
                        per: eight.reduce(0) { $0 + $1.count }
                    ),
                    clientCpuPerRoundTripUs: cpuPerOperation(eight)
                )
            )
            router.kill()
        }
        return runs.dropFirst().min { abs($0.p50Us.value - wait.value) < abs($1.p50Us.value - wait.value) }!
    }

    /// `count` durable writes of 200 bytes: appended and `fsync`ed, or (`inPlace`) written inside a file of zeros
    /// written and synced first and `fdatasync`ed — no file size to sync, one write to the disk fewer.
    private func fsyncLatencies(count: Int, inPlace: Bool) throws -> Latencies {
        let path = folder.appendingPathComponent("fsync-probe").path
        let descriptor = open(path, O_RDWR | O_CREAT | O_TRUNC, 0o600)
        guard descriptor >= 0 else { throw BenchFailure("cannot open \(path): \(String(cString: strerror(errno)))") }
        defer {
            close(descriptor)
            unlink(path)
        }
        let record = [UInt8](repeating: UInt8(ascii: "x"), count: 200)
        let failure = { (what: String) in
            BenchFailure("\(what) of \(path) failed: \(String(cString: strerror(errno)))")
        }
        if inPlace {
            let zeros = [UInt8](repeating: 0, count: record.count * count)
            guard zeros.withUnsafeBytes({ write(descriptor, $0.baseAddress, $0.count) }) == zeros.count,
                fsync(descriptor) == 0
            else { throw failure("writing zeros") }
        }
        var samples: [UInt64] = []
        samples.reserveCapacity(count)
        for index in 0..<count {
            let start = monotonicNanos()
            let offset = off_t(index * record.count)
            guard record.withUnsafeBytes({ pwrite(descriptor, $0.baseAddress, $0.count, offset) }) == record.count,
                (inPlace ? fdatasync(descriptor) : fsync(descriptor)) == 0
            else { throw failure("write + fsync") }
            samples.append(monotonicNanos() - start)
        }
        return Latencies(samples)
    }

    /// PUB in this process, 4 SUB processes: the rate at which all four received every message.
    private func publishToFour() throws -> Double {
        let count = 200_000
        let context = try Context()
        let publisher = try Socket(context, type: .publisher)
        defer { publisher.close() }
        try publisher.set(.sendHighWaterMark, 0)
        try publisher.set(.linger, 0)
        if let curve {
            try publisher.set(.curveServer, 1)
            try publisher.set(.curveSecretKey, curve.server.secretKey)
        }
        let address = endpoint("pub")
        try publisher.bind(address)
        let subscribers = try (0..<4).map { _ in
            try worker("sub", ["--endpoint", address, "--count", "\(count)", "--seconds", "60"], input: false)
        }
        // A subscription takes a moment to reach the publisher: announce until every subscriber heard one.
        var ready = Set<Int>()
        let deadline = ContinuousClock.now + .seconds(30)
        while ready.count < subscribers.count {
            guard ContinuousClock.now < deadline else {
                throw BenchFailure("only \(ready.count) of 4 subscribers heard the publisher within 30 s")
            }
            _ = try publisher.send([[UInt8(ascii: "w")]])
            for (index, subscriber) in subscribers.enumerated() where !ready.contains(index) {
                subscriber.read(for: .milliseconds(2))
                if subscriber.takeLines().contains("ready") { ready.insert(index) }
            }
        }
        let message = [UInt8](repeating: UInt8(ascii: "d"), count: 200)
        let start = monotonicNanos()
        for _ in 0..<count { _ = try publisher.send([message]) }
        let reports = try subscribers.map { try report(of: $0, within: .seconds(90)) }
        if let short = reports.first(where: { $0.count < count }) {
            throw BenchFailure("a subscriber received \(short.count) of \(count) messages")
        }
        return perSecond(count, nanoseconds: (reports.map(\.finishedAt).max() ?? start) - start)
    }

    // MARK: - P1, P2

    /// P1 and P2, then optimistic dispatch, against one lockstepd with an SQLite journal.
    private func measureDispatch(_ parts: Set<String>) throws {
        // With --metrics: the Prometheus registry records every commit, and the loop mirrors its tallies each second.
        // With --inspector: a page open on the daemon's inspector all along, sent every action it can be.
        let http = metrics || inspector ? "[http]\nlisten = \"127.0.0.1:0\"\n" : ""
        let daemon = try startDaemon(
            "dispatch",
            domains: [Counter.name],
            extra: journal.setting + (policy ? policyTables : "") + http
        )
        let page = try inspector ? daemon.status()?.http.map { try InspectorWatcher(address: $0) } : nil
        if !parts.isDisjoint(with: ["p1", "p2"]) {
            (results.p1, results.p2) = try dispatchRows(daemon, journal: "", pipelined: Self.pipelined)
            if results.baselines.router8ReqRoundTripsPerS > 0,
                let eight = results.p2.first(where: { $0.clients == 8 && $0.inFlight == 1 })
            {
                results.baselines.lateEcho = try lateEcho(waiting: eight.p50Us)
            }
        }
        results.inspectorActionsSent = page?.stop()
        if parts.contains("optimistic") { try measureOptimistic(daemon) }
        results.p6.daemonPeakBytes = max(results.p6.daemonPeakBytes, daemon.memory().peakKiB * 1_024)
    }

    /// One process dispatching optimistically through a `Replica<Counter>`, one at a time, against `daemon`: when
    /// the replica's own optimistic state showed each increment, and when its handle resolved.
    private func measureOptimistic(_ daemon: DaemonProcess) throws {
        say("optimistic: a replica process dispatching optimistically, one at a time")
        let reports = try runClients([
            try worker(
                "optimistic",
                ["--endpoint", daemon.command, "--events-endpoint", daemon.events, "--seconds", "\(seconds)"]
            )
        ])
        let optimistic = Latencies(reports.flatMap(\.latencies))
        let confirmed = Latencies(reports.flatMap(\.confirmed))
        results.optimistic = .init(
            dispatches: reports.reduce(0) { $0 + $1.count },
            optimisticP50Us: optimistic.p50,
            optimisticP99Us: optimistic.p99,
            confirmedP50Us: confirmed.p50,
            confirmedP99Us: confirmed.p99,
            failures: reports.reduce(0) { $0 + $1.failures },
            resyncs: reports.reduce(0) { $0 + $1.resyncs },
            firstFailure: reports.compactMap(\.firstFailure).first
        )
        results.p6.replicaPeakBytes = max(results.p6.replicaPeakBytes, reports.map(\.peakResident).max() ?? 0)
    }

    /// Effects with a no-op handler, in a daemon of their own (a bench worker hosting `pulse`, over ipc whatever the
    /// transport): one client's pings one at a time, for the latency from commit to handler start; then 8 clients'
    /// batches of 100, for effects per second.
    private func measureEffects() throws {
        say("effects: a no-op handler's start after each commit; effects per second under 8 batching clients")
        let command = "ipc://\(folder.path)/effects-command"
        let daemon = try worker(
            "effects-daemon",
            ["--endpoint", command, "--events-endpoint", "ipc://\(folder.path)/effects-events"],
            curve: .none
        )
        defer { daemon.kill() }
        _ = try awaitLine(daemon, within: .seconds(60)) { $0 == "ready" }
        func clients(_ count: Int, batch: Int) throws -> [WorkerReport] {
            try runClients(
                try (0..<count).map { _ in
                    try worker(
                        "dispatch",
                        [
                            "--endpoint", command, "--store", Pulse.name, "--count", "\(batch)", "--seconds",
                            "\(seconds)", "--record-seqs",
                        ],
                        curve: .none
                    )
                }
            )
        }
        let single = try clients(1, batch: 1)
        let batched = try clients(8, batch: 100)
        daemon.send("stop")
        let runs = try report(of: daemon, within: .seconds(120)).applied
        var started: [UInt64: UInt64] = [:]
        var twice = 0
        for run in runs where started.updateValue(run.at, forKey: run.seq) != nil { twice += 1 }
        var toStart: [UInt64] = []
        var fromAck: [Double] = []
        for report in single {
            for (index, sent) in report.sent.enumerated() {
                guard let start = started[sent.seq] else { continue }
                toStart.append(start - min(start, sent.at))
                fromAck.append(Double(start) - Double(sent.at + report.latencies[index]))
            }
        }
        fromAck.sort()
        func quantile(_ values: [Double], _ q: Double) -> Microseconds {
            guard !values.isEmpty else { return Microseconds(0) }
            return Microseconds(
                values[min(values.count - 1, max(0, Int((q * Double(values.count)).rounded(.up)) - 1))] / 1_000
            )
        }
        // The batched load's effects: from the first to the last start among the seqs it got.
        let batchedSeqs = batched.flatMap { $0.sent.flatMap { sent in (0..<UInt64(100)).map { sent.seq + $0 } } }
        let batchedStarts = batchedSeqs.compactMap { started[$0] }
        let span = (batchedStarts.max() ?? 0) - (batchedStarts.min() ?? 0)
        let expected = Set(single.flatMap { $0.sent.map(\.seq) } + batchedSeqs)
        let latencies = Latencies(toStart)
        results.effects = .init(
            dispatches: toStart.count,
            dispatchToStartP50Us: latencies.p50,
            dispatchToStartP99Us: latencies.p99,
            ackToStartP50Us: quantile(fromAck, 0.5),
            ackToStartP99Us: quantile(fromAck, 0.99),
            batchedActionsPerS: rate(batched) * 100,
            effectsPerS: perSecond(batchedStarts.count, nanoseconds: span).rounded(),
            effectsRun: runs.count,
            everyEffectRanOnce: twice == 0 && expected.isSubset(of: Set(started.keys))
        )
    }

    /// P1 and P2 again with the journal in PostgreSQL (a throwaway server of Debian's `postgresql`, its data in
    /// the bench's folder's disk, `synchronous_commit = on`), beside SQLite's in the same run.
    private func measurePostgres() throws {
        let server: PostgresServer
        do {
            server = try PostgresServer.start()
        } catch {
            say("PostgreSQL: \(error); skipped (apt-get install postgresql)")
            return
        }
        defer { server.stop() }
        let connection = try server.createDatabase(named: "bench")
        let daemon = try startDaemon(
            "dispatch-postgres",
            domains: [Counter.name],
            extra: "journal = \"postgres\"\npostgres = \"\(connection)\"\n"
        )
        let (p1, p2) = try dispatchRows(daemon, journal: " (PostgreSQL journal)")
        let version = (try? PostgresJournal.execute("SHOW server_version", connection: connection).first) ?? nil
        results.postgres = .init(version: version ?? "unknown", p1: p1, p2: p2)
        results.p6.daemonPeakBytes = max(results.p6.daemonPeakBytes, daemon.memory().peakKiB * 1_024)
    }

    /// How many requests P2's and Redis's pipelining process keep in flight: the `outside` part's C client too.
    static let pipelined = [32, 256]

    /// P1 and P2 against `daemon`: 1, 8 and 32 dispatching processes, one dispatch in flight each; then, for each of
    /// `pipelined`, one process keeping that many in flight through a `Dispatcher`.
    private func dispatchRows(
        _ daemon: DaemonProcess,
        journal: String,
        pipelined: [Int] = []
    ) throws -> (BenchResults.P1, [BenchResults.P2]) {
        var p1 = BenchResults.P1()
        var p2: [BenchResults.P2] = []
        for (clients, inFlight) in [(1, 1), (8, 1), (32, 1)] + pipelined.map({ (1, $0) }) {
            say(
                inFlight > 1
                    ? "P2: 1 dispatching process, \(inFlight) in flight through a Dispatcher" + journal
                    : "P\(clients == 1 ? "1, P2" : "2"): \(clients) dispatching \(clients == 1 ? "process" : "processes")"
                        + journal
            )
            let before = try seq(of: daemon)
            let cpuBefore = DaemonCPU(daemon)
            let reports = try runClients(
                try (0..<clients).map { _ in
                    try worker(
                        "dispatch",
                        ["--endpoint", daemon.command, "--seconds", "\(seconds)", "--in-flight", "\(inFlight)"]
                    )
                }
            )
            // Each client dispatched once before go, to connect.
            let committed = Int(try seq(of: daemon) - before) - clients
            let cpu = DaemonCPU(daemon).perAction(since: cpuBefore, actions: committed)
            let latencies = Latencies(reports.flatMap(\.latencies))
            let acknowledged = reports.reduce(0) { $0 + $1.count }
            p2.append(
                .init(
                    clients: clients,
                    inFlight: inFlight,
                    actionsPerS: rate(reports),
                    ratioToRouter8Req: ratio(rate(reports), results.baselines.router8ReqRoundTripsPerS),
                    p50Us: latencies.p50,
                    p99Us: latencies.p99,
                    acknowledged: acknowledged,
                    committed: committed,
                    failures: reports.reduce(0) { $0 + $1.failures },
                    loopCpuPerActionUs: cpu.loop,
                    journalCpuPerActionUs: cpu.journal,
                    daemonCpuPerActionUs: cpu.process,
                    clientCpuPerActionUs: cpuPerOperation(reports)
                )
            )
            if clients == 1, inFlight == 1 {
                let baseline = results.baselines.reqRepP50Us + results.baselines.fsyncInPlaceP50Us
                p1 = .init(
                    dispatches: acknowledged,
                    p50Us: latencies.p50,
                    p99Us: latencies.p99,
                    baselineUs: baseline,
                    ratioP50: ratio(latencies.p50.value, baseline.value),
                    ratioP99: ratio(latencies.p99.value, baseline.value)
                )
            }
        }
        return (p1, p2)
    }

    // MARK: - Redis Streams

    private func measureRedis() throws {
        guard let server = executableOnPath("redis-server") else {
            say("Redis: redis-server is not installed; skipped (apt-get install redis-server)")
            return
        }
        let directory = folder.appendingPathComponent("redis")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let socketPath = directory.appendingPathComponent("redis.sock").path
        let process = try ChildProcess(
            executable: server,
            [
                "--port", "0", "--unixsocket", socketPath, "--unixsocketperm", "700", "--dir", directory.path,
                "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
            ],
            directory: directory,
            errorFile: directory.appendingPathComponent("redis.log")
        )
        defer { process.kill() }
        let deadline = ContinuousClock.now + .seconds(15)
        var connection: RedisConnection?
        while connection == nil {
            connection = try? RedisConnection(path: socketPath)
            guard connection == nil else { break }
            guard ContinuousClock.now < deadline, process.process.isRunning else {
                throw BenchFailure(
                    "redis-server did not open \(socketPath) within 15 s; see \(directory.path)/redis.log"
                )
            }
            Thread.sleep(forTimeInterval: 0.02)
        }
        var version = "unknown"
        if case let .bulk(info?) = try connection?.call("INFO", "server") {
            let line = String(decoding: info, as: UTF8.self).split(separator: "\r\n")
                .first { $0.hasPrefix("redis_version:") }
            version = line.map { String($0.dropFirst("redis_version:".count)) } ?? version
        }
        var rows: [BenchResults.RedisStreams.Row] = []
        for (clients, inFlight) in [(1, 1), (8, 1), (32, 1)] + Self.pipelined.map({ (1, $0) }) {
            say(
                "Redis Streams \(version): XADD from \(clients) \(clients == 1 ? "process" : "processes")"
                    + (inFlight > 1 ? ", pipelined \(inFlight) at a time" : "")
            )
            let reports = try runClients(
                try (0..<clients).map { _ in
                    try worker(
                        "redis",
                        ["--endpoint", socketPath, "--seconds", "\(seconds)", "--in-flight", "\(inFlight)"],
                        curve: .none
                    )
                }
            )
            let latencies = Latencies(reports.flatMap(\.latencies))
            rows.append(
                .init(
                    clients: clients,
                    inFlight: inFlight,
                    xaddsPerS: rate(reports),
                    p50Us: latencies.p50,
                    p99Us: latencies.p99
                )
            )
        }
        results.redis = .init(version: version, rows: rows)
        for index in results.p2.indices {
            let p2 = results.p2[index]
            let redisRate = rows.first { $0.clients == p2.clients && $0.inFlight == p2.inFlight }?.xaddsPerS ?? 0
            results.p2[index].ratioToRedis = ratio(results.p2[index].actionsPerS, redisRate)
        }
    }

    // MARK: - P3

    private func measureFanOut() throws {
        let daemon = try startDaemon("fanout", domains: [Counter.name], extra: journal.setting)
        let p2Rate = results.p2.first { $0.clients == 8 }?.actionsPerS ?? 0
        for count in [4, 16] {
            say("P3: \(count) replicas while 8 processes dispatch")
            let rawSub = try worker(
                "sub",
                ["--endpoint", daemon.events, "--count", "\(Int.max)", "--seconds", "600"],
                input: false
            )
            defer { rawSub.kill() }
            let replicas = try (0..<count).map { _ in
                try worker("replica", ["--endpoint", daemon.command, "--events-endpoint", daemon.events])
            }
            for replica in replicas { _ = try awaitLine(replica, within: .seconds(60)) { $0 == "ready" } }
            // Beside them, a raw SUB on the same events (it connected while the replicas joined): the floor.
            let rawSubCPU = cpuTime(ofProcess: rawSub.process.processIdentifier)
            let seqBefore = try seq(of: daemon)
            let dispatchers = try runClients(
                try (0..<8).map { _ in
                    try worker(
                        "dispatch",
                        ["--endpoint", daemon.command, "--seconds", "\(seconds)", "--record-seqs"]
                    )
                }
            )
            let lastSeq = dispatchers.flatMap(\.sent).map(\.seq).max() ?? 0
            let lastAck =
                dispatchers.compactMap { report in
                    zip(report.sent, report.latencies).map { $0.at + $1 }.max()
                }.max() ?? 0
            for replica in replicas { replica.send("until \(lastSeq)") }
            let applied = try replicas.map { try report(of: $0, within: .seconds(60)) }
            let rawSubCpuPerEvent = cpu(of: rawSub, since: rawSubCPU, per: Int(lastSeq) - Int(seqBefore))
            let timelines = applied.map { AppliedTimeline($0.applied) }
            var latencies: [UInt64] = []
            for sample in dispatchers.flatMap(\.sent) {
                let times = timelines.map { $0.time(reaching: sample.seq) }
                if times.allSatisfy({ $0 != nil }), let last = times.compactMap({ $0 }).max(), last > sample.at {
                    latencies.append(last - sample.at)
                }
            }
            let reachedAll = applied.allSatisfy { $0.seq >= lastSeq }
            let caughtUp = timelines.compactMap { $0.time(reaching: lastSeq) }.max() ?? 0
            let catchUpMs = reachedAll && caughtUp > lastAck ? Double((caughtUp - lastAck) / 1_000) / 1_000 : 0
            let resyncs = applied.reduce(0) { $0 + $1.resyncs }
            let summary = Latencies(latencies)
            results.p3.append(
                .init(
                    replicas: count,
                    actionsPerS: rate(dispatchers),
                    ratioToP2: ratio(rate(dispatchers), p2Rate),
                    keptUp: reachedAll && resyncs == 0 && catchUpMs <= 100,
                    catchUpMs: catchUpMs,
                    p50Us: summary.p50,
                    p99Us: summary.p99,
                    resyncs: resyncs,
                    repairs: applied.reduce(0) { $0 + $1.repairs },
                    replicaPeakBytes: applied.map(\.peakResident).max() ?? 0,
                    replicaCpuPerEventUs: replicaCPU(applied),
                    rawSubCpuPerEventUs: rawSubCpuPerEvent
                )
            )
            results.p6.replicaPeakBytes = max(results.p6.replicaPeakBytes, applied.map(\.peakResident).max() ?? 0)
            for replica in replicas { replica.kill() }
        }
        results.p6.daemonPeakBytes = max(results.p6.daemonPeakBytes, daemon.memory().peakKiB * 1_024)
    }

    // MARK: - P4

    private func measureLateJoin(histories: [Int]) throws {
        let increment = try CanonicalEncoding.bytes(of: Counter.Action.increment)
        for events in histories {
            say("P4: a late join against \(events) counter events")
            try lateJoin(Counter.self, events: events) { _ in (.increment, increment) }
        }
        // About 1 MB of state: 10,000 posts of 100-character ids, 10 per event (the example's reducer checks
        // every append against the whole list, so one post per event would spend seconds filling).
        say("P4: a late join against 1 MB of state (10,000 posts in 1,000 events)")
        try lateJoin(Posts.self, events: 1_000) { seq in
            let ids = (0..<10).map { String(repeating: "p", count: 80) + String(format: "%020llu", seq * 10 + $0) }
            let action = Posts.Action.appendPosts(posts: ids)
            return (action, (try? CanonicalEncoding.encode(action)).map { Array($0) } ?? [])
        }
    }

    private func lateJoin<D: Domain>(
        _ domain: D.Type,
        events: Int,
        action: (UInt64) -> (D.Action, [UInt8])
    ) throws {
        let name = "join-\(D.name)-\(events)"
        let directory = folder.appendingPathComponent(name)
        let fillStart = ContinuousClock.now
        do {
            let journal = try SQLiteJournal(directory: directory.path, policy: JournalPolicy(), relaxed: true)
            _ = try fill(journal, D.self, events: events, batchSize: 10_000, action: action)
            try journal.sync()
            try journal.close()
        } catch {
            throw BenchFailure("could not write the \(events)-event journal in \(directory.path): \(error)")
        }
        let fill = ContinuousClock.now - fillStart
        let daemonStart = ContinuousClock.now
        let daemon = try startDaemon(name, domains: [D.name])
        let started = ContinuousClock.now - daemonStart
        let joiner = try worker(
            "join",
            [
                "--endpoint", daemon.command, "--events-endpoint", daemon.events, "--store", D.name,
                "--count", "\(events)",
            ],
            input: false
        )
        let joined = try report(of: joiner, within: .seconds(90))
        guard joined.seq == UInt64(events) else {
            throw BenchFailure("the joining \(D.name) replica reached seq \(joined.seq) of \(events) within 60 s")
        }
        let row = BenchResults.P4(
            store: D.name,
            events: events,
            stateBytes: joined.stateBytes,
            joinSeconds: Double(joined.elapsed / 100_000) / 10_000,
            daemonStartSeconds: (started / .milliseconds(1)).rounded() / 1_000,
            fillSeconds: (fill / .milliseconds(10)).rounded() / 100,
            replicaPeakBytes: joined.peakResident,
            daemonPeakBytes: daemon.memory().peakKiB * 1_024
        )
        results.p4.append(row)
        results.p6.daemonPeakBytes = max(results.p6.daemonPeakBytes, row.daemonPeakBytes)
        results.p6.replicaPeakBytes = max(results.p6.replicaPeakBytes, row.replicaPeakBytes)
    }

    // MARK: - P5

    /// An in-process `Store<Counter>` dispatching from one thread, with 0, 1 and 100 subscribers selecting the
    /// count (so every subscriber is told of every change).
    private func measureStore() {
        for subscribers in [0, 1, 100] {
            say("P5: in-process Store with \(subscribers) subscribers")
            let store = Store(Counter.self)
            let cancellations = (0..<subscribers).map { _ in store.subscribe({ $0.count }) { _ in } }
            for _ in 0..<10_000 { store.send(.increment) }
            let start = monotonicNanos()
            let end = start + UInt64(seconds * 1e9)
            var dispatched = 0
            var now = start
            while now < end {
                for _ in 0..<1_000 { store.send(.increment) }
                dispatched += 1_000
                now = monotonicNanos()
            }
            precondition(store.state.count == dispatched + 10_000, "the store lost dispatches")
            results.p5.append(
                .init(subscribers: subscribers, dispatchesPerS: perSecond(dispatched, nanoseconds: now - start))
            )
            for cancellation in cancellations { cancellation.cancel() }
        }
        // (d): toggle one of 10,000 todos, 10 subscribers each selecting the todos (as a list view would): the
        // example's array, then the tree docs/domains.md recommends for a large state.
        say("P5: toggling one of 10,000 todos with 10 subscribers, as an array and as a DigestedDictionary")
        results.p5.append(
            .init(
                subscribers: 10,
                dispatchesPerS: toggleRate(Todos.self, add: { .add(text: "todo \($0)") }, toggle: { .toggle(id: $0) }) {
                    $0.list.items
                },
                state: "10,000 todos in an array, toggle one"
            )
        )
        results.p5.append(
            .init(
                subscribers: 10,
                dispatchesPerS: toggleRate(
                    TreeTodos.self,
                    add: { .add(text: "todo \($0)") },
                    toggle: { .toggle(id: $0) }
                ) { $0.todos },
                state: "10,000 todos in a DigestedDictionary, toggle one"
            )
        )
    }

    /// Toggles of random todos per second in a store of `D` holding 10,000 of them, with 10 subscribers selecting the
    /// todos with `select`.
    private func toggleRate<D: Domain, Selected: Equatable & Sendable>(
        _ domain: D.Type,
        add: (Int) -> D.Action,
        toggle: (Int) -> D.Action,
        select: @escaping @Sendable (D.State) -> Selected
    ) -> Double where D.Action: Encodable {
        let store = Store(D.self, observers: ActionObservers())
        for id in 1...10_000 { store.send(add(id)) }
        let cancellations = (0..<10).map { _ in store.subscribe(select) { _ in } }
        defer { for cancellation in cancellations { cancellation.cancel() } }
        var random = SplitMix64(seed: 35)
        let start = monotonicNanos()
        let end = start + UInt64(seconds * 1e9)
        var dispatched = 0
        var now = start
        while now < end {
            for _ in 0..<100 { store.send(toggle(Int(random.next() % 10_000) + 1)) }
            dispatched += 100
            now = monotonicNanos()
        }
        precondition(store.appliedCount == UInt64(10_000 + dispatched), "the store refused or lost toggles")
        return perSecond(dispatched, nanoseconds: now - start)
    }

    // MARK: - Processes

    enum CurveRole { case client, server, none }

    func say(_ line: String) {
        if progressToStandardError {
            FileHandle.standardError.write(Data((line + "\n").utf8))
        } else {
            print(line)
            fflush(nil)
        }
    }

    /// An endpoint of the bench's transport: a socket file in the folder, or a free loopback port.
    func endpoint(_ name: String) -> String {
        switch transport {
        case .ipc: "ipc://\(folder.path)/\(name)"
        case .tcp: "tcp://127.0.0.1:\(freeLoopbackPort())"
        }
    }

    func worker(
        _ role: String,
        _ arguments: [String],
        curve role2: CurveRole = .client,
        input: Bool = true
    ) throws -> ChildProcess {
        workers += 1
        var curveArguments: [String] = []
        if let curve {
            switch role2 {
            case .client:
                curveArguments = [
                    "--curve", "\(Z85.encode(curve.server.publicKey)),\(Z85.encode(curve.client.secretKey))",
                ]
            case .server: curveArguments = ["--curve-server", Z85.encode(curve.server.secretKey)]
            case .none: break
            }
        }
        return try ChildProcess(
            executable: lockstep,
            ["bench-worker", role] + arguments + curveArguments,
            directory: folder,
            errorFile: folder.appendingPathComponent("worker-\(workers)-\(role).log"),
            input: input
        )
    }

    /// The first line `child` prints that `matches`, waiting at most `timeout`.
    func awaitLine(
        _ child: ChildProcess,
        within timeout: Duration,
        matching matches: (String) -> Bool
    ) throws -> String {
        let deadline = ContinuousClock.now + timeout
        while true {
            if let line = child.takeLines().first(where: matches) { return line }
            guard !child.reachedEndOfOutput else {
                throw BenchFailure("\(child.command) ended early: \(child.errors().suffix(500))")
            }
            guard ContinuousClock.now < deadline else {
                throw BenchFailure("\(child.command) did not answer within \(timeout)")
            }
            child.read(for: .milliseconds(50))
        }
    }

    func report(of child: ChildProcess, within timeout: Duration) throws -> WorkerReport {
        let line = try awaitLine(child, within: timeout) { $0.hasPrefix("{") }
        return try JSONDecoder().decode(WorkerReport.self, from: Data(line.utf8))
    }

    /// Waits until every client is ready, tells them all to go, and collects their reports.
    func runClients(_ clients: [ChildProcess]) throws -> [WorkerReport] {
        for client in clients { _ = try awaitLine(client, within: .seconds(60)) { $0 == "ready" } }
        for client in clients { client.send("go") }
        return try clients.map { try report(of: $0, within: .seconds(seconds + 60)) }
    }

    /// Operations per second summed over clients, each over its own measured window.
    func rate(_ reports: [WorkerReport]) -> Double {
        reports.reduce(0) { $0 + perSecond($1.count, nanoseconds: $1.elapsed) }.rounded()
    }

    /// The clients' own CPU per operation, in µs (all their CPU ÷ all their operations); `nil` without any.
    func cpuPerOperation(_ reports: [WorkerReport]) -> Double? {
        let operations = reports.reduce(0) { $0 + $1.count }
        guard operations > 0 else { return nil }
        return tenths(Double(reports.reduce(0) { $0 + $1.cpuNanos }) / 1_000 / Double(operations))
    }

    /// The CPU time `process` used since `start` per operation, in µs to a tenth; `nil` without a reading or an
    /// operation.
    private func cpu(of process: ChildProcess, since start: Duration?, per operations: Int) -> Double? {
        microseconds(from: start, to: cpuTime(ofProcess: process.process.processIdentifier), per: operations)
    }

    /// A replica's process CPU per event it applied, in µs: the mean over `reports`; `nil` without events.
    func replicaCPU(_ reports: [WorkerReport]) -> Double? {
        let perEvent = reports.filter { $0.eventsApplied > 0 }
            .map { Double($0.cpuNanos) / 1_000 / Double($0.eventsApplied) }
        guard !perEvent.isEmpty else { return nil }
        return (perEvent.reduce(0, +) / Double(perEvent.count) * 10).rounded() / 10
    }

    /// The sum of the seqs of the daemon's stores.
    func seq(of daemon: DaemonProcess) throws -> UInt64 {
        guard let status = daemon.status(timeout: .milliseconds(500)) else {
            throw BenchFailure("lockstepd at \(daemon.command) did not answer STATUS with a readable status")
        }
        return status.stores.reduce(0) { $0 + $1.seq }
    }

    /// A policy that names this process's OS user (on ipc) and the clients' CURVE key (on tcp) and grants them the
    /// counter's increments: each request goes through every check a policy makes — the identity, the store, the
    /// action's case.
    private var policyTables: String {
        let key = curve.map { ", \"key:\(Z85.encode($0.client.publicKey))\"" } ?? ""
        return """
            [identities]
            bench = ["uid:\(getuid())"\(key)]
            [read]
            bench = ["*"]
            [dispatch]
            bench = ["\(Counter.name):increment"]

            """
    }

    /// A lockstepd serving `domains` from the folder `name` (its journal, config and log), answering; with
    /// `benchDaemon`, `lockstep bench-daemon` instead, which hosts ``TreeTodos`` too.
    func startDaemon(
        _ name: String,
        domains: [String],
        extra: String = "",
        benchDaemon: Bool = false
    ) throws -> DaemonProcess {
        let directory = folder.appendingPathComponent(name)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let command = endpoint("\(name)-command")
        let events = endpoint("\(name)-events")
        var toml = """
            data_dir = "\(directory.path)"
            command_endpoint = "\(command)"
            events_endpoint = "\(events)"
            domains = [\(domains.map { "\"\($0)\"" }.joined(separator: ", "))]
            \(extra)
            """
        var clientCurve: ClientCurve?
        if let curve {
            let keyFile = directory.appendingPathComponent("server.key").path
            let clientsFile = directory.appendingPathComponent("clients").path
            _ = FileManager.default.createFile(
                atPath: keyFile,
                contents: Data((Z85.encode(curve.server.secretKey) + "\n").utf8),
                attributes: [.posixPermissions: 0o600]
            )
            try (Z85.encode(curve.client.publicKey) + "\n").write(
                toFile: clientsFile,
                atomically: true,
                encoding: .utf8
            )
            toml += "[curve]\nserver_key_file = \"\(keyFile)\"\nallowed_clients_file = \"\(clientsFile)\"\n"
            clientCurve = ClientCurve(keys: curve.client, serverPublicKey: curve.server.publicKey)
        }
        let configuration = directory.appendingPathComponent("lockstepd.toml")
        try toml.write(to: configuration, atomically: true, encoding: .utf8)
        let daemon = try DaemonProcess(
            executable: benchDaemon ? lockstep : lockstepd,
            folder: directory,
            arguments: (benchDaemon ? ["bench-daemon"] : []) + [
                "--config", configuration.path, "--log-level", "warning",
            ],
            command: command,
            events: events,
            curve: clientCurve
        )
        try daemon.start()
        do {
            try daemon.waitUntilServing(within: .seconds(60))
        } catch {
            throw BenchFailure("\(error)")
        }
        return daemon
    }
}

/// When a replica's state reached each seq: its samples in seq order, searched for the first at or past one.
private struct AppliedTimeline {
    private let samples: [WorkerReport.Sample]

    init(_ samples: [WorkerReport.Sample]) {
        self.samples = samples.sorted { $0.seq < $1.seq }
    }

    func time(reaching seq: UInt64) -> UInt64? {
        var low = 0
        var high = samples.count
        while low < high {
            let middle = (low + high) / 2
            if samples[middle].seq < seq { low = middle + 1 } else { high = middle }
        }
        return low < samples.count ? samples[low].at : nil
    }
}

/// The full path of `name` on the PATH, if it is there.
func executableOnPath(_ name: String) -> URL? {
    let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin"
    return path.split(separator: ":").map { URL(fileURLWithPath: String($0)).appendingPathComponent(name) }
        .first { FileManager.default.isExecutableFile(atPath: $0.path) }
}

/// A loopback port nothing listens on right now (the kernel's pick; free again once this returns).
func freeLoopbackPort() -> Int {
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(descriptor) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
            bind(descriptor, pointer, length)
            return getsockname(descriptor, pointer, &length)
        }
    }
    return Int(UInt16(bigEndian: address.sin_port))
}

/// The daemon's CPU time so far, by thread, from /proc: taken before and after a measurement.
private struct DaemonCPU {
    var loop: Duration?
    var journal: Duration?
    var process: Duration?

    init(_ daemon: DaemonProcess) {
        loop = cpuTime(ofThreadNamed: "lockstepd loop", in: daemon.processIdentifier)
        journal = cpuTime(ofThreadNamed: "lockstepd journal", in: daemon.processIdentifier)
        process = cpuTime(ofProcess: daemon.processIdentifier)
    }

    /// Each figure's growth since `start` per action, in µs to a tenth; `nil` where either reading is missing.
    func perAction(since start: DaemonCPU, actions: Int) -> (loop: Double?, journal: Double?, process: Double?) {
        (
            microseconds(from: start.loop, to: loop, per: actions),
            microseconds(from: start.journal, to: journal, per: actions),
            microseconds(from: start.process, to: process, per: actions)
        )
    }
}

/// The CPU time from `start` to `end` per operation, in µs to a tenth; `nil` without either reading or an operation.
func microseconds(from start: Duration?, to end: Duration?, per operations: Int) -> Double? {
    guard let start, let end, operations > 0 else { return nil }
    return tenths((end - start) / .microseconds(1) / Double(operations))
}

/// `value` rounded to a tenth.
func tenths(_ value: Double) -> Double { (value * 10).rounded() / 10 }
