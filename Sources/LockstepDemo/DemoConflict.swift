import Foundation
import Lockstep
import LockstepClient
import LockstepExamples
import LockstepProtocol
import LockstepTool

#if canImport(Glibc)
import Glibc
#endif

/// A line a demo client prints in the optimistic conflict step, answering one of the demo's commands. Its
/// `conflict` key tells it from a ``LockstepTesting/ReplicaReport`` line.
package struct ConflictLine: Codable, Sendable {
    package enum Event: String, Codable, Sendable {
        /// `seed`: the numbers list is ``ConflictPlayer/seedNumbers``, confirmed at `seq`.
        case seeded
        /// `prepare`: the client's confirmed numbers list, `numbers` at `seq`.
        case prepared
        /// `go`: `action` dispatched optimistically as request `request`; the optimistic state showed `numbers`
        /// (with `pending` optimistic dispatches) `micros` after the call.
        case dispatched
        /// The handle resolved: the confirmed state holds the action at `seq`, `micros` after the call.
        case accepted
        /// The daemon rejected it: `rollback` (request, actions, why: `code`, `reason`) came from `rollbacks()`;
        /// once the optimistic view was rebuilt on a confirmed state past the prepared seq, it showed `numbers` at
        /// `seq`, with `pending` optimistic dispatches left.
        case rolledBack
        /// The replica's own validator refused the action (it already held the other client's delete): nothing
        /// was sent.
        case refusedLocally
        /// Anything else went wrong: `reason`.
        case failed
    }

    package var conflict: Event
    package var seq: SequenceNumber?
    package var numbers: [Int]?
    package var request: UInt64?
    package var action: String?
    package var pending: Int?
    package var micros: Double?
    package var rollback: String?
    package var code: String?
    package var reason: String?

    init(_ event: Event) { conflict = event }
}

/// The client's part of the demo's optimistic conflict, played on the parent's commands, one per line of standard
/// input, through the client's replica of the numbers store:
///
/// - `seed`: dispatches `fetched` of ``seedNumbers`` (not optimistically) and answers `seeded` with its seq.
/// - `prepare SEQ`: waits until the replica's confirmed state is at SEQ and answers `prepared` with it.
/// - `go AT`: at AT (nanoseconds on CLOCK_MONOTONIC, which every process shares) dispatches optimistically the
///   delete of the last number of the prepared list; answers `dispatched`, then `accepted` or `rolledBack` (or
///   `refusedLocally`, `failed`).
///
/// Two clients told `go` with the same AT both delete the same last index: the daemon takes whichever it reads
/// first, and the other's index is then out of range.
struct ConflictPlayer: Sendable {
    /// The list the step starts from.
    static let seedNumbers = [11, 22, 33, 44, 55]
    /// How long the client waits for its replica to reach a seq, or for a rollback to be told.
    static let patience = Duration.seconds(15)

    let replica: Replica<Numbers>

    /// Answers commands until standard input ends or the task is cancelled.
    func serve() async {
        var prepared: Replicated<Numbers.State>?
        for await line in standardInputLines() {
            let words = line.split(separator: " ").map(String.init)
            switch (words.first, words.count) {
            case ("seed"?, 1):
                await seed()
            case ("prepare"?, 2):
                prepared = await prepare(at: SequenceNumber(words[1]) ?? 0)
            case ("go"?, 2):
                if let prepared, let at = UInt64(words[1]) {
                    await go(at: at, from: prepared)
                } else {
                    emit(failure: "go before a prepare that succeeded, or a bad time: \(line)")
                }
            default:
                emit(failure: "unknown command: \(line)")
            }
        }
    }

    private func seed() async {
        do {
            var line = ConflictLine(.seeded)
            line.seq = try await replica.dispatch(.fetched(numbers: Self.seedNumbers))
            emit(line)
        } catch {
            emit(failure: "the seed's fetched was not applied: \(error)")
        }
    }

    private func prepare(at seq: SequenceNumber) async -> Replicated<Numbers.State>? {
        let current: Replicated<Numbers.State>
        do {
            current = try await replica.wait(for: seq, timeout: Self.patience)
        } catch {
            emit(failure: "the numbers replica did not reach seq \(seq): \(error)")
            return nil
        }
        // Every optimistic dispatch of the run was answered, and confirmed, before this.
        guard replica.pending.isEmpty else {
            emit(
                failure: "the numbers replica still holds \(replica.pending.count) optimistic dispatches at seq \(seq)"
            )
            return nil
        }
        var line = ConflictLine(.prepared)
        line.seq = current.seq
        line.numbers = current.state.numbers
        emit(line)
        return current
    }

    private func go(at start: UInt64, from prepared: Replicated<Numbers.State>) async {
        let action = Numbers.Action.delete(index: prepared.state.numbers.count - 1)
        // Listening before dispatching, so the rollback cannot be told before anyone hears.
        let rollbacks = replica.rollbacks()
        await sleep(untilMonotonic: start)
        let handle: OptimisticDispatch
        do {
            handle = try await replica.dispatchOptimistically(action)
        } catch let rejection as Rejection {
            var line = ConflictLine(.refusedLocally)
            line.seq = replica.seq
            line.numbers = replica.confirmedState.numbers
            line.code = rejection.code
            line.reason = rejection.reason
            return emit(line)
        } catch {
            return emit(failure: "dispatchOptimistically threw \(error)")
        }
        var line = ConflictLine(.dispatched)
        line.micros = Double(monotonicNanoseconds() - start) / 1_000
        line.request = handle.requestNumber
        line.action = (try? CanonicalEncoding.encode(action)).map { String(decoding: $0, as: UTF8.self) }
        line.numbers = replica.state.numbers
        line.pending = replica.pending.count
        emit(line)
        do {
            var line = ConflictLine(.accepted)
            line.seq = try await handle.seq
            line.micros = Double(monotonicNanoseconds() - start) / 1_000
            emit(line)
        } catch let rejection as Rejection {
            guard let rollback = await first(of: rollbacks, request: handle.requestNumber) else {
                return emit(failure: "the daemon rejected request \(handle.requestNumber), but no rollback was told")
            }
            // The action the daemon took instead moved the confirmed state past the prepared seq: the optimistic
            // view, rebuilt on it, shows that action.
            guard let view = await optimisticView(past: prepared.seq) else {
                return emit(failure: "the optimistic view is not past seq \(prepared.seq) after \(Self.patience)")
            }
            var line = ConflictLine(.rolledBack)
            line.rollback =
                "#\(rollback.requestNumber) "
                + rollback.actions.map {
                    (try? CanonicalEncoding.encode($0)).map { String(decoding: $0, as: UTF8.self) } ?? "?"
                }
                .joined(separator: " ")
            line.code = rejection.code
            line.reason = rejection.reason
            line.seq = view.seq
            line.numbers = view.state.numbers
            line.pending = replica.pending.count
            emit(line)
        } catch {
            emit(failure: "the optimistic dispatch failed: \(error)")
        }
    }

    /// The rollback of `request` told on `stream`, or `nil` after ``patience``.
    private func first(
        of stream: AsyncStream<OptimisticRollback<Numbers>>,
        request: UInt64
    ) async -> OptimisticRollback<Numbers>? {
        await Self.first(of: stream) { $0.requestNumber == request }
    }

    /// The optimistic view once it is built on a confirmed state past `seq`, or `nil` after ``patience``.
    private func optimisticView(past seq: SequenceNumber) async -> Replicated<Numbers.State>? {
        await Self.first(of: replica.states(view: .optimistic)) { $0.seq > seq }
    }

    /// The first element of `stream` that `matches`, or `nil` after ``patience``.
    private static func first<Element: Sendable>(
        of stream: AsyncStream<Element>,
        where matches: @escaping @Sendable (Element) -> Bool
    ) async -> Element? {
        await withTaskGroup(of: Element?.self) { group in
            group.addTask {
                for await element in stream where matches(element) { return element }
                return nil
            }
            group.addTask {
                try? await Task.sleep(for: patience)
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
    }

    private func emit(_ line: ConflictLine) {
        guard let bytes = try? JSONEncoder().encode(line) else { return }
        print(String(decoding: bytes, as: UTF8.self))
        fflush(nil)
    }

    private func emit(failure reason: String) {
        var line = ConflictLine(.failed)
        line.reason = reason
        emit(line)
    }
}

/// Nanoseconds on CLOCK_MONOTONIC: one clock for every process on the machine, so the demo can name an instant
/// to two clients.
func monotonicNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

/// Returns at `instant` (CLOCK_MONOTONIC nanoseconds), or at once when it has passed: sleeps to within 2 ms of
/// it, then spins, so two processes told the same instant go within microseconds of each other.
func sleep(untilMonotonic instant: UInt64) async {
    while monotonicNanoseconds() + 2_000_000 < instant {
        try? await Task.sleep(for: .milliseconds(1))
    }
    while monotonicNanoseconds() < instant {}
}
