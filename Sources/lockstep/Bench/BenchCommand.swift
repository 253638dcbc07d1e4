import ArgumentParser
import Foundation
import Lockstep
import LockstepBench
import LockstepExamples
import LockstepJournal
import LockstepTool
import ZeroMQ

/// `lockstep bench`: Lockstep next to the raw transport under it, measured in one run on this machine.
struct BenchCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench",
        abstract: "Measure Lockstep next to raw libzmq (and Redis Streams, when installed) on this machine.",
        discussion: """
            Runs lockstepd (found next to this executable), raw libzmq echo servers and clients, replicas and, \
            when redis-server is on the PATH, Redis with appendfsync always, all as separate processes in a \
            temporary folder, and prints each figure next to its baseline. Build with -c release first \
            (make bench does). The figures and the JSON keys are explained in docs/performance.md.
            """
    )

    @Flag(help: "Print one JSON object (keys in docs/performance.md) instead of the table.")
    var json = false

    @Option(help: "The transport every socket uses: ipc, or tcp on 127.0.0.1 (with CURVE, as lockstepd requires).")
    var transport = Bench.Transport.ipc

    @Option(help: "How long each latency and throughput measurement runs, in seconds.")
    var seconds = 2.0

    @Option(help: "The history lengths late joins are timed against, comma-separated.")
    var histories = "10000,100000,1000000"

    @Option(
        help: "The sizes P7 grows its store to, in MB of state, comma-separated (an empty store is always measured)."
    )
    var stateSizes = "1,10,100"

    @Option(
        help: """
            Run only these parts, comma-separated: baselines, p1, p2, optimistic, effects, postgres, redis, p3, p4, \
            p5, p7, outside (p6 comes with the others).
            """
    )
    var only: String?

    @Flag(help: "Leave Redis out even when redis-server is installed.")
    var noRedis = false

    @Flag(help: "Keep the bench's folder (journals and every process's log) and say where it is.")
    var keep = false

    @Option(
        help: """
            The journal of the daemons of P1, P2, P3, P7 and outside: log (Lockstep's own, the daemon's default in a \
            new data directory; docs/operations.md "The journal"), or sqlite. P4 fills SQLite journals.
            """
    )
    var journal = Bench.LocalJournal.log

    @Flag(
        help: """
            Run P1 and P2 against a daemon with a policy (docs/security.md) that checks every request: the bench's \
            OS user (and CURVE key) as an identity granted the counter store's increment case.
            """
    )
    var policy = false

    @Flag(
        help: """
            Run P1 and P2 against a daemon that serves /metrics over HTTP (docs/operations.md, "Metrics"): every \
            commit recorded in its Prometheus registry.
            """
    )
    var metrics = false

    @Flag(
        help: """
            Run P1 and P2 with a page open on the daemon's inspector (docs/operations.md, "The inspector"): its live \
            stream read all along, as a browser's would be.
            """
    )
    var inspector = false

    func validate() throws {
        guard (0.2...60).contains(seconds) else { throw ValidationError("--seconds must be 0.2...60, got \(seconds)") }
        _ = try historyLengths()
        _ = try sizes()
        _ = try parts()
    }

    static let allParts = [
        "baselines", "p1", "p2", "optimistic", "effects", "postgres", "redis", "p3", "p4", "p5", "p7", "outside",
    ]

    private func parts() throws -> Set<String> {
        guard let only else { return Set(Self.allParts) }
        let parts = Set(only.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces).lowercased() })
        if let unknown = parts.first(where: { !Self.allParts.contains($0) }) {
            throw ValidationError(
                "--only: no part '\(unknown)'; the parts are \(Self.allParts.joined(separator: ", "))"
            )
        }
        return parts
    }

    private func historyLengths() throws -> [Int] {
        let lengths = histories.split(separator: ",").map { Int($0.trimmingCharacters(in: .whitespaces)) }
        guard !lengths.isEmpty, lengths.allSatisfy({ $0.map { (1...10_000_000).contains($0) } ?? false }) else {
            throw ValidationError("--histories wants event counts 1...10000000, comma-separated; got '\(histories)'")
        }
        return lengths.compactMap { $0 }
    }

    private func sizes() throws -> [Int] {
        let sizes = stateSizes.split(separator: ",").map { Int($0.trimmingCharacters(in: .whitespaces)) }
        guard !sizes.isEmpty, sizes.allSatisfy({ $0.map { (1...1_000).contains($0) } ?? false }) else {
            throw ValidationError("--state-sizes wants sizes in MB 1...1000, comma-separated; got '\(stateSizes)'")
        }
        return sizes.compactMap { $0 }
    }

    func run() throws {
        signal(SIGPIPE, SIG_IGN)
        let (lockstep, lockstepd) = try executablesBesideThis(build: "swift build -c release")
        let bench = try Bench(
            lockstep: lockstep,
            lockstepd: lockstepd,
            transport: transport,
            seconds: seconds,
            keep: keep,
            journal: journal,
            policy: policy,
            metrics: metrics,
            inspector: inspector,
            progressToStandardError: json
        )
        let results: BenchResults
        do {
            var parts = try parts()
            if noRedis { parts.remove("redis") }
            results = try bench.run(histories: try historyLengths(), parts: parts, stateSizes: try sizes())
        } catch let failure as BenchFailure {
            printError("lockstep bench: \(failure.description) (logs in \(bench.folder.path))")
            throw ExitCode.failure
        }
        if json {
            let encoder = JSONEncoder()
            encoder.keyEncodingStrategy = .convertToSnakeCase
            encoder.outputFormatting = [.sortedKeys]
            print(String(decoding: try encoder.encode(results), as: UTF8.self))
        } else {
            print(BenchTable(results).text)
        }
    }
}

extension Bench.Transport: ExpressibleByArgument {}
extension Bench.LocalJournal: ExpressibleByArgument {}
