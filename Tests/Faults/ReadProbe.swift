import Foundation
import Lockstep
import LockstepClient
import LockstepProtocol
import LockstepTesting
import ZeroMQ

/// Reads a pair of daemons as clients do, all through a fault class, and checks the two properties a split brain
/// breaks (docs/operations.md, "Partitions"):
///
/// - **no stale read:** a daemon that answers a read answers from a state at least as new as the newest one a client
///   had been acknowledged before asking. A thread per daemon reads the highest seq the load has been acknowledged,
///   then asks the daemon for the todos action at that seq (RANGE) and for its STATUS, every 20 ms: a RANGE
///   answered "empty" (the daemon is behind that seq) or a STATUS saying it leads at a lower seq is stale.
/// - **one leader at a time:** no two daemons say they lead within 0.5 s of each other (between the sending of one
///   STATUS and the answer to the other): a lease hands over only after the old leader's trusted two thirds have
///   run out and its last third has passed, ≥ 1 s with the default 3 s lease.
///
/// A daemon that does not answer within 300 ms, or answers `not_leader`, serves nothing and breaks nothing.
// Shared between the probe's threads and the suite without the compiler's check, and why that is sound: every stored
// property is a `let`; the two that change, `shared` and `loads`, are `LockedValue`s, read and written only inside
// `withLockedValue`; the `Load`s they hold are themselves shared that way.
final class ReadProbe: @unchecked Sendable {
    struct Counts {
        /// Reads answered with a state (RANGE events, a leader's STATUS).
        var served = 0
        /// Reads answered from a state older than one already acknowledged.
        var stale = 0
        /// Times a daemon said it leads within 0.5 s of another saying so.
        var twoLeaders = 0
        /// The first of them, described.
        var problems: [String] = []

        mutating func note(_ problem: String) {
            if problems.count < 5 { problems.append(problem) }
        }
    }

    /// A STATUS that said its daemon leads: asked at `sent`, answered at `answered`.
    private struct Leading {
        var name: String
        var term: UInt64
        var sent: ContinuousClock.Instant
        var answered: ContinuousClock.Instant
    }

    private struct Shared {
        var counts = Counts()
        /// Each daemon's newest STATUS saying it leads.
        var leading: [String: Leading] = [:]
        var stopping = false
        var running = 0
    }

    private let daemons: [(name: String, command: String)]
    private let curve: ClientCurve?
    private let shared = LockedValue(Shared())
    /// The loads whose acknowledgements a read must not fall behind.
    private let loads: LockedValue<[Load]>

    init(_ daemons: [(name: String, command: String)], load: Load, curve: ClientCurve? = nil) {
        self.daemons = daemons
        self.curve = curve
        loads = LockedValue([load])
    }

    /// Reads must not fall behind what `load` is acknowledged either.
    func observe(_ load: Load) {
        loads.withLockedValue { $0.append(load) }
    }

    /// The highest seq any load has been acknowledged.
    private var seen: SequenceNumber {
        loads.withLockedValue { $0 }.map(\.highestAcknowledged).max() ?? 0
    }

    var counts: Counts { shared.withLockedValue { $0.counts } }

    func start() {
        for (name, command) in daemons {
            shared.withLockedValue { $0.running += 1 }
            Thread { [self] in
                defer { shared.withLockedValue { $0.running -= 1 } }
                probe(name, command)
            }.start()
        }
    }

    private func probe(_ name: String, _ command: String) {
        guard let context = try? Context() else { return }
        let client = CommandClient(
            context: context,
            endpoint: command,
            timeout: .milliseconds(300),
            retries: 0,
            curve: curve
        )
        let store = try! StoreName("todos")
        var requestID: UInt64 = 0
        while !shared.withLockedValue({ $0.stopping }) {
            let seen = self.seen
            requestID += 1
            let sent = ContinuousClock.now
            if let status = (try? client.call(.status(requestID: requestID))).flatMap(DaemonStatus.init),
                status.role == "leader", let leader = status.leader
            {
                let now = Leading(name: name, term: leader.term, sent: sent, answered: .now)
                let seq = status.stores.first { $0.name == "todos" }?.seq ?? 0
                shared.withLockedValue { shared in
                    shared.counts.served += 1
                    if seq < seen {
                        shared.counts.stale += 1
                        shared.counts.note(
                            "\(name) said it leads (term \(leader.term)) at todos seq \(seq) after seq \(seen) was "
                                + "acknowledged"
                        )
                    }
                    for other in shared.leading.values where other.name != name {
                        let apart = max(now.sent - other.answered, other.sent - now.answered, .zero)
                        if apart < .milliseconds(500) {
                            shared.counts.twoLeaders += 1
                            shared.counts.note(
                                "\(other.name) (term \(other.term)) and \(name) (term \(leader.term)) said they lead "
                                    + "\(seconds(apart)) apart"
                            )
                        }
                    }
                    shared.leading[name] = now
                }
            }
            if seen > 0 {
                requestID += 1
                switch try? client.call(.range(requestID: requestID, store: store, from: seen, to: seen)) {
                case .range?:
                    shared.withLockedValue { $0.counts.served += 1 }
                case let .error(_, error)? where error.code == .invalidRange:
                    shared.withLockedValue {
                        $0.counts.served += 1
                        $0.counts.stale += 1
                        $0.counts.note(
                            "\(name) answered a read of todos seq \(seen), already acknowledged, with: \(error)"
                        )
                    }
                default:
                    break
                }
            }
            Thread.sleep(forTimeInterval: 0.02)
        }
    }

    /// Stops the probe's threads and waits for them (at most a round's reads); then ``counts`` are final.
    func stop() {
        shared.withLockedValue { $0.stopping = true }
        let deadline = ContinuousClock.now + .seconds(5)
        while shared.withLockedValue({ $0.running > 0 }), ContinuousClock.now < deadline {
            Thread.sleep(forTimeInterval: 0.01)
        }
    }

    /// Adds the probe's findings to `result`: stale reads and two leaders count in ``FaultResult/stale``.
    func record(into result: inout FaultResult) {
        stop()
        let counts = self.counts
        result.stale += counts.stale + counts.twoLeaders
        result.notes.append(
            "reads through the faults: \(counts.served) served, \(counts.stale) stale, \(counts.twoLeaders) times two "
                + "leaders"
        )
        result.notes += counts.problems
    }
}
