import Foundation
import Lockstep
import LockstepClient
import LockstepProtocol
import LockstepTesting
import LockstepTool
import ZeroMQ

#if canImport(Glibc)
import Glibc
#endif

/// What the demo found.
package struct DemoSummary: Codable {
    struct Store: Codable {
        var store: String
        var seq: SequenceNumber
        var digest: String
        /// Each client's replica's digest, in client order.
        var replicas: [String]
    }

    struct Client: Codable {
        var pid: Int32
        var accepted: Int
        var rejected: Int
        var failed: Int
        var resyncs: Int
        var repairs: Int
        var divergences: Int
        var exitStatus: Int32?
    }

    var committed: SequenceNumber
    var seconds: Double
    var actionsPerSecond: Double
    var daemonRestartMilliseconds: Double
    var stoppedClient: Int
    var stoppedSeconds: Double
    var stores: [Store]
    var clients: [Client]
    package var converged: Bool

    package func print() {
        Swift.print("")
        Swift.print("store       seq  daemon digest      replicas")
        for store in stores {
            let marks = store.replicas.map { $0 == store.digest ? "✓" : "✗ \($0.prefix(8))" }
            Swift.print(
                store.store.padding(toLength: 8, withPad: " ", startingAt: 0) + String(store.seq).leftPadded(to: 7),
                " " + store.digest.prefix(16) + "  ",
                marks.joined(separator: " ")
            )
        }
        Swift.print("")
        for (index, client) in clients.enumerated() {
            Swift.print(
                "client \(index + 1) (pid \(client.pid)): \(client.accepted) accepted, \(client.rejected) rejected by "
                    + "validators, \(client.failed) failed; replicas resynced \(client.resyncs)×, repaired "
                    + "\(client.repairs) gaps, diverged \(client.divergences)×"
                    + (index == stoppedClient ? "  (stopped \(Self.format(stoppedSeconds)) s)" : "")
            )
        }
        Swift.print("")
        Swift.print(
            "\(committed) actions committed in \(Self.format(seconds)) s: \(Int(actionsPerSecond)) actions/s; "
                + "the daemon was killed and back in \(Int(daemonRestartMilliseconds)) ms"
        )
        Swift.print(converged ? "every replica converged on the daemon's digest" : "NOT CONVERGED")
    }

    static func format(_ value: Double) -> String { String(format: "%.1f", value) }
}

/// One demo: the folder, the daemon and the clients, played through its stages.
package final class DemoRun {
    package let folder: URL
    let clientCount: Int
    let actions: Int
    let seed: UInt64
    let quiet: Bool
    private let lockstepd: URL
    private let lockstep: URL
    private let daemon: DaemonProcess
    private var clients: [ChildProcess] = []
    private var reports: [ReplicaReport?] = []
    private let terminal = isatty(STDOUT_FILENO) == 1
    private var drawnLines = 0

    /// Events the daemon queues for one subscriber before it drops them: small, so a stopped client loses some.
    static let eventsQueue = 500

    /// A demo of `clients` processes of `lockstep` (its hidden `demo-client` command) dispatching `actions` each
    /// to a `lockstepd`, in a new temporary folder.
    package init(lockstep: URL, lockstepd: URL, clients: Int, actions: Int, seed: UInt64, quiet: Bool) throws {
        self.clientCount = clients
        self.actions = actions
        self.seed = seed
        self.quiet = quiet
        self.lockstep = lockstep
        self.lockstepd = lockstepd
        folder = try freshTemporaryFolder("lockstep-demo-\(getpid())")
        daemon = try DaemonProcess(
            executable: lockstepd,
            folder: folder,
            arguments: ["--config", "lockstepd.toml", "--log-level", "warning"]
        )
        try "[limits]\nevents_queue = \(Self.eventsQueue)\n".write(
            to: folder.appendingPathComponent("lockstepd.toml"),
            atomically: true,
            encoding: .utf8
        )
    }

    package func play() throws -> DemoSummary {
        defer {
            for client in clients { client.kill() }
            daemon.kill()
        }
        say("lockstep demo: lockstepd in \(folder.path), \(clientCount) clients × \(actions) actions")
        try startDaemon()
        for index in 0..<clientCount {
            clients.append(
                try ChildProcess(
                    executable: lockstep,
                    [
                        "demo-client", "--actions", "\(actions)", "--seed", "\(seed &+ UInt64(index))",
                        "--report-ms", "100", "--events-queue", "\(Self.eventsQueue)",
                    ],
                    directory: folder,
                    errorFile: folder.appendingPathComponent("client-\(index + 1).log")
                )
            )
        }
        reports = Array(repeating: nil, count: clientCount)
        let started = ContinuousClock.now
        let stopped = clientCount - 1
        var stoppedAt: (instant: ContinuousClock.Instant, seqs: [SequenceNumber])?
        var stoppedFor = Duration.zero
        var resumedAt = started
        var restartTook = Duration.zero
        var stage = Stage.running
        var finalSeqs: [String: (seq: SequenceNumber, digest: String)] = [:]
        var finishedAt = started
        var lastDraw = started - .seconds(1)
        var lastProgress = (value: -1.0, at: started)
        while stage != .converged {
            Thread.sleep(forTimeInterval: 0.05)
            try readReports()
            let now = ContinuousClock.now
            let progress = Double(reports.reduce(0) { $0 + ($1?.dispatched ?? 0) }) / Double(clientCount * actions)
            if progress != lastProgress.value || stage == .settling || stage == .clientStopped {
                lastProgress = (progress, now)
            } else if now - lastProgress.at > .seconds(60) {
                throw CommandFailure("no client dispatched anything for 60 s (see client-*.log)")
            }
            switch stage {
            case .running where progress >= 0.2:
                // The daemon's seqs now, to see when it has moved on far enough; ask again next turn if silent.
                guard let seqs = daemonSeqs() else { break }
                clients[stopped].signal(SIGSTOP)
                stoppedAt = (now, seqs)
                stage = .clientStopped
                say("client \(stopped + 1) stopped (SIGSTOP): its replicas hear nothing while the others go on")
            case .clientStopped:
                // Go on until every store moved well past what the daemon and the kernel queue for it.
                guard let seqs = daemonSeqs() else { break }
                let moved = zip(seqs, stoppedAt!.seqs).map { $0 - $1 }
                if moved.allSatisfy({ $0 > SequenceNumber(Self.eventsQueue * 3) })
                    || now - stoppedAt!.instant > .seconds(3)
                {
                    clients[stopped].signal(SIGCONT)
                    stoppedFor = now - stoppedAt!.instant
                    resumedAt = now
                    stage = .clientResumed
                    say("client \(stopped + 1) resumed after \(moved.map(String.init).joined(separator: "/")) events")
                }
            case .clientResumed where progress >= 0.5 && now - resumedAt > .seconds(1):
                let seqs = daemonSeqs() ?? []
                daemon.kill()
                let killedAt = ContinuousClock.now
                say("lockstepd killed (SIGKILL) at seqs \(seqs.map(String.init).joined(separator: "/")); restarting")
                try startDaemon()
                restartTook = ContinuousClock.now - killedAt
                stage = .restarted
            case .restarted where reports.allSatisfy({ $0?.done == true }):
                finishedAt = now
                finalSeqs = try daemonDigests()
                stage = .settling
            case .settling:
                let settled = reports.allSatisfy { $0?.matches(finalSeqs) ?? false }
                if settled {
                    stage = .converged
                } else if now - finishedAt > .seconds(60) {
                    say("the replicas did not reach the daemon's digests within 60 s")
                    break
                }
            default:
                break
            }
            if now - lastDraw >= .milliseconds(terminal ? 100 : 1_000) || stage == .converged {
                draw(progress: progress)
                lastDraw = now
            }
            if stage == .settling, now - finishedAt > .seconds(60) { break }
        }
        let elapsed = finishedAt - started
        // Let each client print its final report, then stop the daemon the way systemd would.
        var statuses: [Int32?] = []
        for client in clients { client.signal(SIGTERM) }
        for (index, client) in clients.enumerated() {
            let status = client.waitForExit(within: .seconds(10))
            statuses.append(status)
            if let report = client.newestReport(waiting: .zero) { reports[index] = report }
        }
        daemon.stop()
        return summary(
            finalSeqs: finalSeqs,
            elapsed: elapsed,
            restartTook: restartTook,
            stopped: stopped,
            stoppedFor: stoppedFor,
            statuses: statuses,
            converged: stage == .converged
        )
    }

    private enum Stage { case running, clientStopped, clientResumed, restarted, settling, converged }

    private func startDaemon() throws {
        try daemon.start()
        do {
            try daemon.waitUntilServing(within: .seconds(15))
        } catch {
            throw CommandFailure("\(error)")
        }
    }

    /// The daemon's seq per example store, in the daemon's order; `nil` while it does not answer.
    private func daemonSeqs() -> [SequenceNumber]? {
        daemon.status(timeout: .milliseconds(200))?.stores.map(\.seq)
    }

    /// Each store's seq and digest, from the daemon's snapshots.
    private func daemonDigests() throws -> [String: (seq: SequenceNumber, digest: String)] {
        do {
            return try daemon.digests(of: reports.first??.stores.map(\.store) ?? []).mapValues {
                ($0.seq, $0.digest.hex)
            }
        } catch {
            throw CommandFailure("\(error)")
        }
    }

    private func readReports() throws {
        for (index, client) in clients.enumerated() {
            if let report = client.newestReport(waiting: .zero) { reports[index] = report }
            if !client.process.isRunning {
                throw CommandFailure("client \(index + 1) exited early; see client-\(index + 1).log")
            }
        }
    }

    private func say(_ line: String) {
        guard !quiet else { return }
        if terminal, drawnLines > 0 {
            print("\u{1B}[\(drawnLines)A\u{1B}[J", terminator: "")
            drawnLines = 0
        }
        print(line)
        fflush(nil)
    }

    /// The live view: a progress bar, then per client each store's seq, digest prefix and lag.
    private func draw(progress: Double) {
        guard !quiet else { return }
        let width = 40
        let filled = Int(min(1, progress) * Double(width))
        var lines = [
            "[" + String(repeating: "#", count: filled) + String(repeating: ".", count: width - filled) + "] "
                + "\(Int(min(1, progress) * 100))%"
        ]
        for (index, report) in reports.enumerated() {
            let stores = report?.stores.map { store in
                "\(store.store) \(store.seq) \(store.digest.prefix(8)) lag \(store.lag)"
                    + (store.phase == "live" ? "" : " \(store.phase)")
            }
            lines.append("  client \(index + 1)  " + (stores?.joined(separator: " | ") ?? "starting"))
        }
        if terminal {
            if drawnLines > 0 { print("\u{1B}[\(drawnLines)A\u{1B}[J", terminator: "") }
            drawnLines = lines.count
            print(lines.joined(separator: "\n"))
        } else {
            print(lines[0])
        }
        fflush(nil)
    }

    private func summary(
        finalSeqs: [String: (seq: SequenceNumber, digest: String)],
        elapsed: Duration,
        restartTook: Duration,
        stopped: Int,
        stoppedFor: Duration,
        statuses: [Int32?],
        converged: Bool
    ) -> DemoSummary {
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        let committed = finalSeqs.values.reduce(0) { $0 + $1.seq }
        let stores = finalSeqs.keys.sorted().map { name in
            DemoSummary.Store(
                store: name,
                seq: finalSeqs[name]!.seq,
                digest: finalSeqs[name]!.digest,
                replicas: reports.map { $0?.stores.first { $0.store == name }?.digest ?? "none" }
            )
        }
        let clients = zip(reports, statuses).map { report, status in
            DemoSummary.Client(
                pid: report?.pid ?? 0,
                accepted: report?.accepted ?? 0,
                rejected: report?.rejected ?? 0,
                failed: report?.failed ?? 0,
                resyncs: report?.stores.reduce(0) { $0 + $1.resyncs } ?? 0,
                repairs: report?.stores.reduce(0) { $0 + $1.repairs } ?? 0,
                divergences: report?.stores.reduce(0) { $0 + $1.divergences } ?? 0,
                exitStatus: status
            )
        }
        let everyoneAgrees = stores.allSatisfy { store in store.replicas.allSatisfy { $0 == store.digest } }
        let clean = clients.allSatisfy { $0.exitStatus == 0 && $0.divergences == 0 && $0.failed == 0 }
        return DemoSummary(
            committed: committed,
            seconds: seconds,
            actionsPerSecond: seconds > 0 ? Double(committed) / seconds : 0,
            daemonRestartMilliseconds: Double(restartTook / .microseconds(1)) / 1_000,
            stoppedClient: stopped,
            stoppedSeconds: Double(stoppedFor / .milliseconds(1)) / 1_000,
            stores: stores,
            clients: clients,
            converged: converged && everyoneAgrees && clean
        )
    }
}
