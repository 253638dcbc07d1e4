import ArgumentParser
import Foundation
import Lockstep
import LockstepClient
import LockstepExamples
import LockstepProtocol
import LockstepTesting
import LockstepTool
import Logging
import ServiceLifecycle

/// One client process of the demo: it holds a replica of each example store, dispatches generated actions
/// through them, and prints a JSON report line every `--report-ms` until SIGTERM (then one final line).
/// The demo and the integration tests start it; it is hidden from `lockstep --help`.
struct DemoClientCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo-client",
        abstract: "A demo client: replicas of the example stores, dispatching generated actions.",
        shouldDisplay: false
    )

    @Option(help: "The stores to hold replicas of, comma-separated.")
    var stores = Examples.domains.map { $0.name }.joined(separator: ",")

    @Option(help: "How many actions to dispatch in all; 0 only watches.")
    var actions = 1_000

    @Option(help: "How many dispatches this client keeps in flight at once.")
    var concurrency = 4

    @Option(help: "Seed of the action generators.")
    var seed: UInt64 = 1

    @Option(help: "Print a report line this often, in milliseconds.")
    var reportMs = 200

    @Option(help: "Prefix the text of the todos this client adds with this tag.")
    var tag: String?

    @Option(help: "Events queued on this side before the newest are dropped (the SUB high-water mark).")
    var eventsQueue = 100_000

    @Option(help: "How long one try of a dispatch waits, in milliseconds.")
    var timeoutMs = 2_000

    @Option(help: "How many times a dispatch is sent again after a silence.")
    var retries = 5

    @Option(help: "The daemon's command endpoint.")
    var commandEndpoint = "ipc://.lockstep/run/command"

    @Option(help: "The daemon's events endpoint.")
    var eventsEndpoint = "ipc://.lockstep/run/events"

    @Flag(help: "Put each store's state in the final report.")
    var printState = false

    func validate() throws {
        guard actions >= 0 else { throw ValidationError("--actions must be 0 or more, got \(actions)") }
        guard (1...1_000).contains(concurrency) else { throw ValidationError("--concurrency must be 1...1000") }
        guard (10...60_000).contains(reportMs) else { throw ValidationError("--report-ms must be 10...60000") }
    }

    func run() async throws {
        var logger = Logger(label: "lockstep.demo-client")
        logger.logLevel = .warning
        var configuration = ReplicaConfiguration(commandEndpoint: commandEndpoint, eventsEndpoint: eventsEndpoint)
        configuration.eventsQueue = eventsQueue
        configuration.requestTimeout = .milliseconds(timeoutMs)
        configuration.retries = retries
        var replicas: [any DemoReplica] = []
        for name in stores.split(separator: ",").map(String.init) {
            guard let domain = Examples.domain(named: name) else {
                let known = Examples.domains.map { $0.name }.joined(separator: ", ")
                throw ValidationError("--stores: no example store '\(name)'; the examples are \(known)")
            }
            replicas.append(try makeReplica(domain, configuration: configuration, logger: logger))
        }
        let workload = DemoWorkload(
            replicas: replicas,
            actions: actions,
            concurrency: concurrency,
            seed: seed,
            tag: tag,
            reportInterval: .milliseconds(reportMs),
            printState: printState
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
        logger: Logger
    ) throws -> any DemoReplica {
        DemoReplicaOf<D>(replica: try Replica(D.self, configuration: configuration, logger: logger))
    }
}

/// A replica of one example store, behind a face the workload can hold in a list.
protocol DemoReplica: Sendable {
    var name: String { get }
    var service: any Service { get }
    /// Dispatches an action generated from the replica's state; `false` if the domain rejected it.
    func dispatchGenerated(using random: inout SplitMix64, tag: String?) async throws -> Bool
    func report(withState: Bool) -> ReplicaReport.Store
}

final class DemoReplicaOf<D: ActionGenerating>: DemoReplica {
    let replica: Replica<D>
    private let digest = LockedValue<(seq: SequenceNumber, epoch: Epoch?, hex: String)?>(nil)

    init(replica: Replica<D>) {
        self.replica = replica
    }

    var name: String { D.name }
    var service: any Service { replica }

    func dispatchGenerated(using random: inout SplitMix64, tag: String?) async throws -> Bool {
        var action = D.randomAction(for: replica.state, using: &random)
        if let tag, case let .add(text)? = action as? Todos.Action,
            let tagged = Todos.Action.add(text: "\(tag) \(text)")
                as? D.Action
        {
            action = tagged
        }
        do {
            try await replica.dispatch(action)
            return true
        } catch is Rejection {
            return false
        }
    }

    func report(withState: Bool) -> ReplicaReport.Store {
        let current = replica.current
        let status = replica.status
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
                ? (try? CanonicalEncoding.encode(current.state)).map { String(decoding: $0, as: UTF8.self) } : nil
        )
    }
}

/// Dispatches the client's actions from `concurrency` tasks and reports until the group shuts down.
struct DemoWorkload: Service {
    let replicas: [any DemoReplica]
    let actions: Int
    let concurrency: Int
    let seed: UInt64
    let tag: String?
    let reportInterval: Duration
    let printState: Bool
    private let counts = LockedValue(ReplicaReport(pid: ProcessInfo.processInfo.processIdentifier))

    init(
        replicas: [any DemoReplica],
        actions: Int,
        concurrency: Int,
        seed: UInt64,
        tag: String?,
        reportInterval: Duration,
        printState: Bool
    ) {
        self.replicas = replicas
        self.actions = actions
        self.concurrency = concurrency
        self.seed = seed
        self.tag = tag
        self.reportInterval = reportInterval
        self.printState = printState
    }

    func run() async throws {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await dispatchAll() }
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
                            outcome = .success(try await replica.dispatchGenerated(using: &random, tag: tag))
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
