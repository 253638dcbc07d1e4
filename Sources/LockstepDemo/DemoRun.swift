import Foundation
import Lockstep
import LockstepClient
import LockstepExamples
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

    /// Clients 1 and 2 deleting the same number optimistically at one instant: one accepted, one rolled back.
    package struct Conflict: Codable {
        /// Rounds played: more than one when a client's replica applied the other's delete before making its own,
        /// so its own validator refused it and nothing was sent.
        package var rounds: Int
        /// The numbers store's seq and list both clients held when they dispatched.
        package var seq: SequenceNumber
        package var numbers: [Int]
        /// The client (from 0) whose delete the daemon accepted, and its seq.
        package var accepted: Int
        package var acceptedSeq: SequenceNumber
        /// The client whose delete the daemon rejected: the rollback as its replica's `rollbacks()` told it (request
        /// number and actions), and the daemon's code and reason.
        package var rolledBack: Int
        package var rollback: String
        package var code: String
        package var reason: String
        /// That client's optimistic list with its own delete pending, and after the rollback, at `afterSeq` with
        /// `pendingAfter` optimistic dispatches left.
        package var before: [Int]
        package var after: [Int]
        package var afterSeq: SequenceNumber
        package var pendingAfter: Int
        /// Where the numbers store ended: the daemon's seq and digest, and the two clients' replicas' digests.
        package var finalSeq: SequenceNumber
        package var digest: String
        package var clientDigests: [String]

        /// The delete the daemon rejected was rolled back, nothing is left pending, and both clients hold the
        /// daemon's digest.
        package var converged: Bool
    }

    /// Actions committed in the main run (the conflict's come after), and how long it took.
    var committed: SequenceNumber
    var seconds: Double
    var actionsPerSecond: Double
    var daemonRestartMilliseconds: Double
    var stoppedClient: Int
    var stoppedSeconds: Double
    /// Every store at the end, the conflict's actions included.
    var stores: [Store]
    var clients: [Client]
    /// `nil` with one client, or when the main run did not converge.
    package var conflict: Conflict?
    package var converged: Bool

    package func print() { Swift.print(text) }

    /// The summary as `lockstep demo` prints it.
    package var text: String {
        var lines = ["", "store       seq  daemon digest      replicas"]
        for store in stores {
            let marks = store.replicas.map { $0 == store.digest ? "✓" : "✗ \($0.prefix(8))" }
            lines.append(
                store.store.padding(toLength: 8, withPad: " ", startingAt: 0) + String(store.seq).leftPadded(to: 7)
                    + "  " + store.digest.prefix(16) + "   " + marks.joined(separator: " ")
            )
        }
        lines.append("")
        for (index, client) in clients.enumerated() {
            lines.append(
                "client \(index + 1) (pid \(client.pid)): \(client.accepted) accepted, \(client.rejected) rejected by "
                    + "validators, \(client.failed) failed; replicas resynced \(client.resyncs)×, repaired "
                    + "\(client.repairs) gaps, diverged \(client.divergences)×"
                    + (index == stoppedClient ? "  (stopped \(Self.format(stoppedSeconds)) s)" : "")
            )
        }
        lines.append("")
        lines.append(
            "\(committed) actions committed in \(Self.format(seconds)) s: \(Int(actionsPerSecond)) actions/s; "
                + "the daemon was killed and back in \(Int(daemonRestartMilliseconds)) ms"
        )
        if let conflict {
            let (winner, loser) = (conflict.accepted + 1, conflict.rolledBack + 1)
            lines.append(
                "optimistic conflict: client \(winner)'s delete accepted at seq \(conflict.acceptedSeq), client "
                    + "\(loser)'s rolled back (\(conflict.code)); clients \(min(winner, loser)) and "
                    + "\(max(winner, loser)) on numbers seq \(conflict.finalSeq) "
                    + (conflict.converged ? "with the daemon's digest" : "NOT with the daemon's digest")
            )
        }
        lines.append(converged ? "every replica converged on the daemon's digest" : "NOT CONVERGED")
        return lines.joined(separator: "\n")
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
    /// The conflict's lines each client printed and the demo has not taken yet.
    private var conflictLines: [[ConflictLine]] = []
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
            // Clients 1 and 2 play the optimistic conflict at the end, on commands from the demo.
            let conflict = clientCount >= 2 && index < 2
            clients.append(
                try ChildProcess(
                    executable: lockstep,
                    [
                        "demo-client", "--actions", "\(actions)", "--seed", "\(seed &+ UInt64(index))",
                        "--report-ms", "100", "--events-queue", "\(Self.eventsQueue)",
                    ] + (conflict ? ["--conflict-commands"] : []),
                    directory: folder,
                    errorFile: folder.appendingPathComponent("client-\(index + 1).log"),
                    input: conflict
                )
            )
        }
        reports = Array(repeating: nil, count: clientCount)
        conflictLines = Array(repeating: [], count: clientCount)
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
        let committed = finalSeqs.values.reduce(0) { $0 + $1.seq }
        var conflict: DemoSummary.Conflict?
        if stage == .converged {
            if clientCount >= 2 {
                conflict = try playConflict()
                // Every replica again on the daemon's digests, the conflict's actions included.
                finalSeqs = try daemonDigests()
                _ = try settle(on: finalSeqs, within: .seconds(60))
            } else {
                say("the optimistic conflict needs two clients; skipped")
            }
        }
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
            committed: committed,
            conflict: conflict,
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
            take(index, waiting: .zero)
            if !client.process.isRunning {
                throw CommandFailure("client \(index + 1) exited early; see client-\(index + 1).log")
            }
        }
    }

    /// Takes what client `index` printed, waiting up to `timeout` for it: a report line replaces its report, a
    /// conflict line is queued for ``conflictLine(from:within:)``.
    private func take(_ index: Int, waiting timeout: Duration) {
        clients[index].read(for: timeout)
        let decoder = JSONDecoder()
        for line in clients[index].takeLines() {
            let data = Data(line.utf8)
            if let report = try? decoder.decode(ReplicaReport.self, from: data) {
                reports[index] = report
            } else if let conflict = try? decoder.decode(ConflictLine.self, from: data) {
                conflictLines[index].append(conflict)
            }
        }
    }

    /// Reads reports until every client's replicas are at `expected`, for at most `timeout`; whether they are.
    private func settle(
        on expected: [String: (seq: SequenceNumber, digest: String)],
        within timeout: Duration
    ) throws -> Bool {
        let deadline = ContinuousClock.now + timeout
        while !reports.allSatisfy({ $0?.matches(expected) ?? false }) {
            guard ContinuousClock.now < deadline else { return false }
            Thread.sleep(forTimeInterval: 0.05)
            try readReports()
        }
        return true
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
        committed: SequenceNumber,
        conflict: DemoSummary.Conflict?,
        elapsed: Duration,
        restartTook: Duration,
        stopped: Int,
        stoppedFor: Duration,
        statuses: [Int32?],
        converged: Bool
    ) -> DemoSummary {
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
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
            conflict: conflict,
            converged: converged && everyoneAgrees && clean && conflict?.converged != false
        )
    }
}

// MARK: - The optimistic conflict

extension DemoRun {
    /// How many rounds the conflict gets to show a daemon's rejection. A round in which one client's replica applied
    /// the other's delete before making its own ends with a local refusal (nothing sent) and is played again.
    static let conflictRounds = 5

    /// Clients 1 and 2, holding the same confirmed numbers list, each delete its last number optimistically at one
    /// instant (``ConflictPlayer``): the daemon sequences one delete first, and the other's index is then out of
    /// range, so the daemon rejects it and its client rolls it back. Both clients then hold the daemon's digest.
    fileprivate func playConflict() throws -> DemoSummary.Conflict {
        for round in 1...Self.conflictRounds {
            clients[0].send("seed")
            let seeded = try conflictLine(from: 0, within: .seconds(20))
            guard seeded.conflict == .seeded, let seq = seeded.seq else { throw unexpected(seeded, from: 0) }
            for index in 0..<2 { clients[index].send("prepare \(seq)") }
            var held: [[Int]] = []
            for index in 0..<2 {
                let line = try conflictLine(from: index, within: .seconds(20))
                guard line.conflict == .prepared, line.seq == seq, let numbers = line.numbers, !numbers.isEmpty else {
                    throw unexpected(line, from: index)
                }
                held.append(numbers)
            }
            guard held[0] == held[1] else {
                throw CommandFailure("at numbers seq \(seq) client 1 holds \(held[0]), client 2 \(held[1])")
            }
            say(
                "optimistic conflict\(round > 1 ? ", round \(round)" : ""): clients 1 and 2 hold numbers "
                    + "\(held[0]) at seq \(seq); at one instant each deletes index \(held[0].count - 1) optimistically"
            )
            // A moment ahead, so both have read the command; each then spins to the instant itself.
            let instant = monotonicNanoseconds() + 100_000_000
            for index in 0..<2 { clients[index].send("go \(instant)") }
            var first: [ConflictLine] = []
            for index in 0..<2 {
                let line = try conflictLine(from: index, within: .seconds(20))
                first.append(line)
                if line.conflict == .dispatched {
                    say(
                        "  client \(index + 1): \(line.action ?? "?") shows in its optimistic state "
                            + "\(microseconds(line.micros)) after the instant: \(line.numbers ?? []), "
                            + "\(line.pending ?? 0) pending"
                    )
                }
            }
            var last: [ConflictLine] = []
            for index in 0..<2 {
                last.append(
                    first[index].conflict == .dispatched
                        ? try conflictLine(from: index, within: .seconds(30))
                        : first[index]
                )
            }
            let kinds = last.map(\.conflict)
            if kinds.contains(.refusedLocally), kinds.contains(.accepted) {
                let loser = kinds.firstIndex(of: .refusedLocally)!
                say(
                    "  client \(loser + 1)'s replica applied the other's delete before its own dispatch: refused "
                        + "there (\(last[loser].code ?? "?")), nothing sent; again"
                )
                continue
            }
            guard let winner = kinds.firstIndex(of: .accepted), let loser = kinds.firstIndex(of: .rolledBack),
                let before = first[loser].numbers
            else {
                throw CommandFailure(
                    "the conflict ended \(kinds.map(\.rawValue).joined(separator: " and ")), not accepted and rolled "
                        + "back: \(last.map { $0.reason ?? "" }.joined(separator: "; "))"
                )
            }
            let accepted = last[winner]
            let rolledBack = last[loser]
            say(
                "  client \(winner + 1): accepted at seq \(accepted.seq ?? 0), confirmed "
                    + "\(microseconds(accepted.micros)) after the instant"
            )
            say(
                "  client \(loser + 1): rejected by lockstepd and rolled back: \(rolledBack.rollback ?? "?"): "
                    + "\(rolledBack.code ?? "?"): \(rolledBack.reason ?? "?")"
            )
            say(
                "  client \(loser + 1)'s optimistic numbers: \(before) with its own delete pending; after the "
                    + "rollback \(rolledBack.numbers ?? []) at seq \(rolledBack.seq ?? 0) (client \(winner + 1)'s "
                    + "delete, confirmed), \(rolledBack.pending ?? 0) pending"
            )
            let daemon = try daemonDigests()
            guard let numbers = daemon[Numbers.name] else { throw CommandFailure("the daemon has no numbers store") }
            _ = try settle(on: [Numbers.name: numbers], within: .seconds(30))
            let digests = (0..<2).map { reports[$0]?.store(Numbers.name)?.digest ?? "none" }
            let agree = digests.allSatisfy { $0 == numbers.digest }
            say(
                "  clients 1 and 2 on numbers seq \(numbers.seq), digest \(numbers.digest.prefix(16))"
                    + (agree ? ": the daemon's" : ", NOT the daemon's (client digests \(digests))")
            )
            return DemoSummary.Conflict(
                rounds: round,
                seq: seq,
                numbers: held[0],
                accepted: winner,
                acceptedSeq: accepted.seq ?? 0,
                rolledBack: loser,
                rollback: rolledBack.rollback ?? "",
                code: rolledBack.code ?? "",
                reason: rolledBack.reason ?? "",
                before: before,
                after: rolledBack.numbers ?? [],
                afterSeq: rolledBack.seq ?? 0,
                pendingAfter: rolledBack.pending ?? -1,
                finalSeq: numbers.seq,
                digest: numbers.digest,
                clientDigests: digests,
                converged: rolledBack.pending == 0 && agree
            )
        }
        throw CommandFailure(
            "in \(Self.conflictRounds) rounds a client's replica always applied the other's delete before its own"
        )
    }

    /// The next conflict line of client `index`, waiting at most `timeout`; the other clients' output is taken
    /// meanwhile, so none of them blocks on a full pipe.
    private func conflictLine(from index: Int, within timeout: Duration) throws -> ConflictLine {
        let deadline = ContinuousClock.now + timeout
        while conflictLines[index].isEmpty {
            guard clients[index].process.isRunning else {
                throw CommandFailure("client \(index + 1) exited; see client-\(index + 1).log")
            }
            guard ContinuousClock.now < deadline else {
                throw CommandFailure(
                    "client \(index + 1) did not answer within \(timeout) in the optimistic conflict; see "
                        + "client-\(index + 1).log"
                )
            }
            take(index, waiting: .milliseconds(20))
            for other in clients.indices where other != index { take(other, waiting: .zero) }
        }
        return conflictLines[index].removeFirst()
    }

    private func unexpected(_ line: ConflictLine, from index: Int) -> CommandFailure {
        CommandFailure(
            "client \(index + 1) answered \(line.conflict.rawValue) in the optimistic conflict"
                + (line.reason.map { ": \($0)" } ?? "")
        )
    }

    private func microseconds(_ value: Double?) -> String {
        guard let value else { return "?" }
        return value >= 10_000 ? String(format: "%.1f ms", value / 1_000) : String(format: "%.0f µs", value)
    }
}
