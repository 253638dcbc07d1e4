import ArgumentParser
import Dispatch
import Foundation
import Lockstep
import LockstepExamples

/// Several clients hammer the four example stores at once; every action is recorded through the action
/// observers, and at the end a second store per domain replays the recording and must reach the same digest.
struct DemoCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo",
        abstract: "Run concurrent clients against the example stores and check that a replay converges.",
        discussion: """
            This is the in-process demo: the stores, the clients and the replaying replica share one process. \
            It exits 0 only if every replayed store reaches the live store's digest.
            """
    )

    @Option(help: "How many concurrent clients dispatch actions.")
    var clients = 4

    @Option(help: "How many actions each client dispatches.")
    var actions = 5_000

    @Option(help: "Seed of the clients' action generators; the same seed gives the same mix of actions.")
    var seed: UInt64 = 1

    func validate() throws {
        guard (1...256).contains(clients) else { throw ValidationError("--clients must be 1...256, got \(clients)") }
        guard (1...10_000_000).contains(actions) else {
            throw ValidationError("--actions must be 1...10000000, got \(actions)")
        }
    }

    func run() async throws {
        let hub = ActionObservers()
        let lanes = Examples.domains.map { DemoLane($0, observers: hub) }
        let total = clients * actions
        print(
            "lockstep demo: \(clients) clients × \(actions) actions over \(lanes.map(\.name).joined(separator: ", "))"
        )

        let started = ContinuousClock.now
        let progress = Progress(total: total, lanes: lanes)
        let display = Task { await progress.show() }
        let rejected = await withTaskGroup(of: Int.self) { group in
            for client in 0..<clients {
                group.addTask {
                    var random = SplitMix64(seed: seed &+ UInt64(client) &* 0x9E37_79B9)
                    var rejected = 0
                    for _ in 0..<actions {
                        let lane = lanes[Int(random.next() % UInt64(lanes.count))]
                        if await !lane.step(&random) { rejected += 1 }
                        progress.tick()
                    }
                    return rejected
                }
            }
            return await group.reduce(0, +)
        }
        let elapsed = ContinuousClock.now - started
        display.cancel()
        await display.value

        print("")
        print("store     applied  digest (live)     digest (replayed)  ")
        var converged = true
        for lane in lanes {
            let live = try lane.liveDigest()
            let replayed = try await lane.replayedDigest()
            converged = converged && live.digest == replayed
            print(
                lane.name.padding(toLength: 9, withPad: " ", startingAt: 0),
                String(live.seq).leftPadded(to: 7),
                String(live.digest.hex.prefix(16)),
                " " + String(replayed.hex.prefix(16)),
                live.digest == replayed ? "  converged" : "  DIVERGED"
            )
        }
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        print(
            "\(total - rejected) actions applied, \(rejected) rejected by validators, "
                + "in \(String(format: "%.2f", seconds)) s "
                + "(\(Int(Double(total) / max(seconds, 1e-9))) actions/s)"
        )
        if !converged {
            printError("lockstep demo: a replayed store did not reach the live store's digest")
            throw ExitCode.failure
        }
        print("every replayed store converged")
    }
}

/// One example store in the demo, with its recording.
struct DemoLane: Sendable {
    let name: String
    /// Dispatches one generated action; false when the validator refused it.
    let step: @Sendable (inout SplitMix64) async -> Bool
    let liveDigest: @Sendable () throws -> (seq: UInt64, digest: StateDigest)
    let replayedDigest: @Sendable () async throws -> StateDigest
    let seq: @Sendable () -> UInt64

    init<D: ActionGenerating>(_ domain: D.Type, observers: ActionObservers) {
        let store = Store(domain, observers: observers)
        let recording = LockedValue<[D.Action]>([])
        // The recording hook: every applied action, in the store's order.
        observers.observe { observed in
            guard observed.store == D.name, observed.rejection == nil, let action = observed.action as? D.Action
            else { return }
            recording.withLockedValue { $0.append(action) }
        }
        name = D.name
        step = { random in
            let action = D.randomAction(for: store.state, using: &random)
            do {
                try await store.dispatch(action)
                return true
            } catch {
                return false
            }
        }
        liveDigest = { (store.appliedCount, try CanonicalEncoding.digest(of: store.state)) }
        replayedDigest = {
            let replica = Store(domain, observers: ActionObservers())
            for action in recording.withLockedValue({ $0 }) { try await replica.dispatch(action) }
            return try CanonicalEncoding.digest(of: replica.state)
        }
        seq = { store.appliedCount }
    }
}

/// The live view: a progress bar and each store's seq and digest prefix, redrawn while clients run.
final class Progress: Sendable {
    private let total: Int
    private let lanes: [DemoLane]
    private let done = LockedValue(0)

    init(total: Int, lanes: [DemoLane]) {
        self.total = total
        self.lanes = lanes
    }

    func tick() {
        done.withLockedValue { $0 += 1 }
    }

    func show() async {
        let interactive = isatty(STDOUT_FILENO) == 1
        var lastPrinted = -1
        while true {
            let done = self.done.withLockedValue { $0 }
            let percent = done * 100 / max(total, 1)
            // On a terminal, redraw in place; in a log, one line per 25%.
            if interactive || percent / 25 != lastPrinted / 25 {
                let width = 30
                let filled = done * width / max(total, 1)
                let bar = String(repeating: "#", count: filled) + String(repeating: "-", count: width - filled)
                let stores = lanes.map { lane in
                    let digest = (try? lane.liveDigest().digest.hex.prefix(8)) ?? "--------"
                    return "\(lane.name) \(lane.seq()) \(digest)"
                }.joined(separator: " | ")
                print(
                    interactive ? "\r[\(bar)] \(percent)%  \(stores)\u{1B}[K" : "[\(bar)] \(percent)%  \(stores)",
                    terminator: interactive ? "" : "\n"
                )
                fflush(nil)
                lastPrinted = percent
            }
            if Task.isCancelled { return }
            try? await Task.sleep(for: .milliseconds(interactive ? 100 : 250))
        }
    }
}

extension String {
    func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: " ", count: width - count) + self
    }
}
