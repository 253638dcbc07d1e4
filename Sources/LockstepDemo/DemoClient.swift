import Foundation
import Lockstep
import LockstepClient
import LockstepExamples
import LockstepProtocol
import LockstepTesting
import LockstepTool
import Logging
import ServiceLifecycle

/// One client process of the demo: it holds a replica of each example store in `stores` (a store named twice gets
/// two), all on one ``ReplicaHub``, dispatches `actions`
/// generated actions through them (`concurrency` at a time), and prints a JSON report line every `reportMs`
/// until SIGTERM (then one final line). With `conflictCommands`, once every dispatch is answered it plays its part
/// of the demo's optimistic conflict on the commands its standard input brings (``ConflictPlayer``).
package struct DemoClient: Sendable {
    package var stores: String
    package var actions: Int
    package var concurrency: Int
    package var seed: UInt64
    package var reportMs: Int
    package var tag: String?
    package var eventsQueue: Int
    package var timeoutMs: Int
    package var retries: Int
    package var daemons: [DaemonEndpoints]
    /// CURVE keys for `tcp://` endpoints (one server key for every daemon); `nil` for none.
    package var curve: ClientCurve?
    package var printState: Bool
    package var conflictCommands: Bool
    /// What the replicas log, to standard error: a takeover's moves (`sending to another daemon`) are at notice.
    package var logLevel: Logger.Level
    /// Dispatch through `dispatchOptimistically`, waiting for each handle's answer.
    package var optimistic = false
    /// Check every optimistic read a subscriber gets (``OptimisticReadCheck``), counting reads and problems in the
    /// report.
    package var checkReads = false
    /// A control: drop the first pending dispatch from each read before it is checked, so the check must find
    /// problems.
    package var breakReads = false
    /// How long an optimistic dispatch stays pending without an acceptance.
    package var pendingTimeout = Duration.seconds(60)

    package init(
        stores: String,
        actions: Int,
        concurrency: Int,
        seed: UInt64,
        reportMs: Int,
        tag: String?,
        eventsQueue: Int,
        timeoutMs: Int,
        retries: Int,
        daemons: [DaemonEndpoints],
        curve: ClientCurve? = nil,
        printState: Bool,
        conflictCommands: Bool = false,
        logLevel: Logger.Level = .warning
    ) {
        self.stores = stores
        self.actions = actions
        self.concurrency = concurrency
        self.seed = seed
        self.reportMs = reportMs
        self.tag = tag
        self.eventsQueue = eventsQueue
        self.timeoutMs = timeoutMs
        self.retries = retries
        self.daemons = daemons
        self.curve = curve
        self.printState = printState
        self.conflictCommands = conflictCommands
        self.logLevel = logLevel
    }

    package func run() async throws {
        var logger = Logger(label: "lockstep.demo-client")
        logger.logLevel = logLevel
        var configuration = ReplicaConfiguration(daemons: daemons)
        configuration.eventsQueue = eventsQueue
        configuration.curve = curve
        configuration.requestTimeout = .milliseconds(timeoutMs)
        configuration.retries = retries
        configuration.pendingTimeout = pendingTimeout
        // Every replica of the process on one thread and one ZeroMQ context.
        let hub = try ReplicaHub()
        var replicas: [any DemoReplica] = []
        var checks: [Cancellation] = []
        defer { for check in checks { check.cancel() } }
        for name in stores.split(separator: ",").map(String.init) {
            guard let domain = Examples.domain(named: name) else {
                let known = Examples.domains.map { $0.name }.joined(separator: ", ")
                throw CommandFailure("--stores: no example store '\(name)'; the examples are \(known)")
            }
            let replica = try makeReplica(domain, configuration: configuration, hub: hub, logger: logger)
            if checkReads || breakReads { checks.append(replica.checkReads(breaking: breakReads)) }
            replicas.append(replica)
        }
        var conflict: ConflictPlayer?
        if conflictCommands {
            guard let numbers = replicas.lazy.compactMap({ ($0 as? DemoReplicaOf<Numbers>)?.replica }).first else {
                throw CommandFailure("--conflict-commands needs a replica of numbers in --stores")
            }
            conflict = ConflictPlayer(replica: numbers)
        }
        let workload = DemoWorkload(
            replicas: replicas,
            actions: actions,
            concurrency: concurrency,
            seed: seed,
            tag: tag,
            optimistic: optimistic,
            reportInterval: .milliseconds(reportMs),
            printState: printState,
            conflict: conflict
        )
        let group = ServiceGroup(
            configuration: .init(
                services: replicas.map { .init(service: $0.service) } + [.init(service: workload)],
                gracefulShutdownSignals: [.sigterm, .sigint],
                logger: logger
            )
        )
        try await group.run()
    }

    private func makeReplica<D: ActionGenerating>(
        _ domain: D.Type,
        configuration: ReplicaConfiguration,
        hub: ReplicaHub,
        logger: Logger
    ) throws -> any DemoReplica {
        DemoReplicaOf<D>(replica: try Replica(D.self, configuration: configuration, hub: hub, logger: logger))
    }
}

/// A replica of one example store, behind a face the workload can hold in a list.
protocol DemoReplica: Sendable {
    var name: String { get }
    var service: any Service { get }
    /// Dispatches an action generated from the replica's state (optimistically, waiting for the handle's answer,
    /// when `optimistic`); `false` if the domain rejected it.
    func dispatchGenerated(using random: inout SplitMix64, tag: String?, optimistic: Bool) async throws -> Bool
    func report(withState: Bool) -> ReplicaReport.Store
    /// Checks every optimistic read from now on (``OptimisticReadCheck``) until cancelled; with `breaking`, each
    /// read loses its first pending dispatch before it is checked.
    func checkReads(breaking: Bool) -> Cancellation
    /// Returns once the replica has joined (an optimistic dispatch needs a confirmed state to validate on).
    func waitUntilLive() async throws
}

final class DemoReplicaOf<D: ActionGenerating>: DemoReplica {
    let replica: Replica<D>
    private let digest = LockedValue<(seq: SequenceNumber, epoch: Epoch?, hex: String)?>(nil)
    /// Optimistic reads checked, the problems found, and the first one.
    private let checked = LockedValue((reads: 0, problems: 0, first: String?.none))

    init(replica: Replica<D>) {
        self.replica = replica
    }

    var name: String { D.name }
    var service: any Service { replica }

    func dispatchGenerated(using random: inout SplitMix64, tag: String?, optimistic: Bool) async throws -> Bool {
        var action = D.randomAction(for: replica.state, using: &random)
        if let tag, case let .add(text)? = action as? Todos.Action,
            let tagged = Todos.Action.add(text: "\(tag) \(text)")
                as? D.Action
        {
            action = tagged
        }
        do {
            if optimistic {
                _ = try await replica.dispatchOptimistically(action).seqs
            } else {
                try await replica.dispatch(action)
            }
            return true
        } catch is Rejection {
            return false
        }
    }

    func waitUntilLive() async throws {
        try await replica.waitUntilLive(timeout: .seconds(60))
    }

    func checkReads(breaking: Bool) -> Cancellation {
        replica.subscribe(optimistic: { $0 }) { [checked] read in
            var read = read
            if breaking, !read.pending.isEmpty { read.pending.removeFirst() }
            let problems = OptimisticReadCheck.problems(read)
            checked.withLockedValue { checked in
                checked.reads += 1
                checked.problems += problems.count
                if checked.first == nil { checked.first = problems.first }
            }
        }
    }

    func report(withState: Bool) -> ReplicaReport.Store {
        let current = replica.current
        let status = replica.status
        let pending = replica.pending
        // The digest costs an encoding of the state: only when the state moved.
        let hex = digest.withLockedValue { cached in
            if let cached, cached.seq == current.seq, cached.epoch == current.epoch { return cached.hex }
            let hex = (try? CanonicalEncoding.digest(of: current.state).hex) ?? "unencodable"
            cached = (current.seq, current.epoch, hex)
            return hex
        }
        return ReplicaReport.Store(
            store: D.name,
            phase: status.phase.rawValue,
            epoch: current.epoch?.description,
            seq: current.seq,
            digest: hex,
            lag: status.lag,
            resyncs: status.resyncs,
            repairs: status.repairs,
            divergences: status.divergences,
            state: withState
                ? (try? CanonicalEncoding.encode(current.state)).map { String(decoding: $0, as: UTF8.self) } : nil,
            pending: pending.isEmpty ? nil : pending.map(\.description),
            checkedReads: checked.withLockedValue { $0.reads == 0 ? nil : ($0.reads, $0.problems, $0.first) }
        )
    }
}

/// Dispatches the client's actions from `concurrency` tasks, then plays the conflict's commands if any, and reports
/// until the group shuts down.
struct DemoWorkload: Service {
    let replicas: [any DemoReplica]
    let actions: Int
    let concurrency: Int
    let seed: UInt64
    let tag: String?
    let optimistic: Bool
    let reportInterval: Duration
    let printState: Bool
    let conflict: ConflictPlayer?
    private let counts = LockedValue(ReplicaReport(pid: ProcessInfo.processInfo.processIdentifier))

    init(
        replicas: [any DemoReplica],
        actions: Int,
        concurrency: Int,
        seed: UInt64,
        tag: String?,
        optimistic: Bool = false,
        reportInterval: Duration,
        printState: Bool,
        conflict: ConflictPlayer? = nil
    ) {
        self.replicas = replicas
        self.actions = actions
        self.concurrency = concurrency
        self.seed = seed
        self.tag = tag
        self.optimistic = optimistic
        self.reportInterval = reportInterval
        self.printState = printState
        self.conflict = conflict
    }

    func run() async throws {
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await dispatchAll()
                await conflict?.serve()
            }
            group.addTask {
                while !Task.isCancelled {
                    report(final: false)
                    try? await Task.sleep(for: reportInterval)
                }
            }
            try? await gracefulShutdown()
            group.cancelAll()
        }
        report(final: true)
    }

    private func dispatchAll() async {
        if optimistic {
            // Nothing is dispatched optimistically before a replica joined: there is no state to validate on.
            for replica in replicas {
                do {
                    try await replica.waitUntilLive()
                } catch {
                    printError("lockstep demo-client: \(replica.name) did not join: \(error)")
                }
            }
        }
        let remaining = LockedValue(actions)
        await withTaskGroup(of: Void.self) { group in
            for worker in 0..<concurrency {
                group.addTask {
                    var random = SplitMix64(seed: seed &* 0x9E37_79B9_7F4A_7C15 &+ UInt64(worker))
                    while !Task.isCancelled,
                        remaining.withLockedValue({ left in
                            defer { left -= 1 }
                            return left > 0
                        })
                    {
                        let replica = replicas[Int(random.next() % UInt64(replicas.count))]
                        var outcome: Result<Bool, any Error>
                        do {
                            outcome = .success(
                                try await replica.dispatchGenerated(using: &random, tag: tag, optimistic: optimistic)
                            )
                        } catch {
                            outcome = .failure(error)
                            printError("lockstep demo-client: dispatch to \(replica.name) failed: \(error)")
                        }
                        counts.withLockedValue { counts in
                            counts.dispatched += 1
                            switch outcome {
                            case .success(true): counts.accepted += 1
                            case .success(false): counts.rejected += 1
                            case .failure: counts.failed += 1
                            }
                        }
                    }
                }
            }
        }
        counts.withLockedValue { $0.done = true }
    }

    private func report(final: Bool) {
        var report = counts.withLockedValue { $0 }
        report.final = final
        report.stores = replicas.map { $0.report(withState: final && printState) }
        guard let line = try? JSONEncoder().encode(report) else { return }
        print(String(decoding: line, as: UTF8.self))
        fflush(nil)
    }
}
