import Foundation
import LockstepExamples
import LockstepTesting
import ZeroMQ

extension Bench {
    /// What `lockstep-cload load` prints: one JSON line.
    private struct OutsideReport: Decodable {
        var clients: Int
        /// Round trips checked, the connecting one of each client included.
        var acknowledged: Int
        /// Round trips in the measured window.
        var measured: Int
        var elapsedNanos: UInt64
        var p50Nanos: UInt64
        var p99Nanos: UInt64
        /// The whole load process's CPU over the measured window.
        var cpuNanos: UInt64
        var firstSeq: UInt64
        var lastSeq: UInt64

        var rate: Double { perSecond(measured, nanoseconds: elapsedNanos).rounded() }
    }

    /// The `outside` part: C clients (`lockstep-cload`, next to `lockstep`) — 1, 8 and 32 threads with one request in
    /// flight each, then one thread with 32 and with 256 in flight — against a raw C ROUTER echo of the same DISPATCH
    /// bytes, then against lockstepd with the counter: what lockstepd costs with no Swift on the other side of the
    /// socket, and what it can take when a client pipelines.
    func measureOutside() throws {
        let cload = lockstep.deletingLastPathComponent().appendingPathComponent("lockstep-cload")
        guard FileManager.default.isExecutableFile(atPath: cload.path) else {
            throw BenchFailure("\(cload.path) is not there: build it with swift build (the package's lockstep-cload)")
        }
        say(
            "outside: C clients (lockstep-cload) against a raw C echo, then against lockstepd: 1, 8, 32; 1 × 32, 1 × 256"
        )
        let counts = [(1, 1), (8, 1), (32, 1)] + Self.pipelined.map { (1, $0) }
        let echoEndpoint = endpoint("outside-echo")
        let echo = try ChildProcess(
            executable: cload,
            ["echo", echoEndpoint] + (curve.map { ["--curve-server", Z85.encode($0.server.secretKey)] } ?? []),
            directory: folder,
            errorFile: folder.appendingPathComponent("outside-echo.log"),
            input: false
        )
        defer { echo.kill() }
        _ = try awaitLine(echo, within: .seconds(30)) { $0 == "ready" }
        var raw: [(report: OutsideReport, serverCpu: Double?)] = []
        for (clients, inFlight) in counts {
            let before = cpuTime(ofProcess: echo.process.processIdentifier)
            let report = try load(cload, echoEndpoint, clients: clients, inFlight: inFlight, echo: true)
            let after = cpuTime(ofProcess: echo.process.processIdentifier)
            raw.append((report, microseconds(from: before, to: after, per: report.measured)))
        }
        echo.kill()

        let daemon = try startDaemon("outside", domains: [Counter.name], extra: journal.setting)
        for (index, (clients, inFlight)) in counts.enumerated() {
            let before = try seq(of: daemon)
            let cpuBefore = cpuTime(ofProcess: daemon.processIdentifier)
            let report = try load(cload, daemon.command, clients: clients, inFlight: inFlight, echo: false)
            let committed = Int(try seq(of: daemon) - before)
            let cpuAfter = cpuTime(ofProcess: daemon.processIdentifier)
            let (rawReport, rawServerCpu) = raw[index]
            results.outside.append(
                .init(
                    clients: clients,
                    inFlight: inFlight,
                    rawRoundTripsPerS: rawReport.rate,
                    rawP50Us: Microseconds(nanoseconds: rawReport.p50Nanos),
                    rawP99Us: Microseconds(nanoseconds: rawReport.p99Nanos),
                    rawServerCpuPerRoundTripUs: rawServerCpu,
                    rawClientCpuPerRoundTripUs: tenths(Double(rawReport.cpuNanos) / 1_000 / Double(rawReport.measured)),
                    actionsPerS: report.rate,
                    ratioToRaw: ratio(report.rate, rawReport.rate),
                    p50Us: Microseconds(nanoseconds: report.p50Nanos),
                    p99Us: Microseconds(nanoseconds: report.p99Nanos),
                    acknowledged: report.acknowledged,
                    committed: committed,
                    daemonCpuPerActionUs: microseconds(from: cpuBefore, to: cpuAfter, per: committed),
                    clientCpuPerActionUs: tenths(Double(report.cpuNanos) / 1_000 / Double(report.measured))
                )
            )
            guard committed == report.acknowledged, report.lastSeq - report.firstSeq + 1 == UInt64(committed)
            else {
                throw BenchFailure(
                    "outside, \(clients) C clients × \(inFlight) in flight: \(report.acknowledged) acknowledged at seqs \(report.firstSeq)"
                        + "…\(report.lastSeq), the daemon committed \(committed)"
                )
            }
        }
        results.p6.daemonPeakBytes = max(results.p6.daemonPeakBytes, daemon.memory().peakKiB * 1_024)
    }

    /// `lockstep-cload load` with `clients` threads, `inFlight` requests each, for the bench's seconds, its report
    /// once it is done; it exits non-zero at the first reply that fails its checks, which fails the bench with what
    /// it said.
    private func load(
        _ cload: URL,
        _ endpoint: String,
        clients: Int,
        inFlight: Int,
        echo: Bool
    ) throws -> OutsideReport {
        var arguments = [
            "load", endpoint, "\(clients)", "\(seconds)", Counter.name, "\(Counter.version)", #"{"increment":{}}"#,
            "--in-flight", "\(inFlight)",
        ]
        if echo { arguments.append("--echo") }
        if let curve {
            arguments += ["--curve", "\(Z85.encode(curve.server.publicKey)),\(Z85.encode(curve.client.secretKey))"]
        }
        let child = try ChildProcess(
            executable: cload,
            arguments,
            directory: folder,
            errorFile: folder.appendingPathComponent("outside-load-\(clients)x\(inFlight)\(echo ? "-echo" : "").log"),
            input: false
        )
        defer { child.kill() }
        let line = try awaitLine(child, within: .seconds(seconds + 60)) { $0.hasPrefix("{") }
        return try JSONDecoder().decode(OutsideReport.self, from: Data(line.utf8))
    }
}
