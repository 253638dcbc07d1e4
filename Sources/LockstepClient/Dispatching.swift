import Foundation
import Lockstep
import LockstepProtocol
import Logging
import ServiceLifecycle
import Tracing
import ZeroMQ

// What the two dispatching clients — `Replica` and `Dispatcher` — share: the request a caller queues, the actions'
// canonical form, what the daemon's answer says, and the thread each runs on.

/// A dispatch a caller queued for the client's thread to send.
struct Outgoing: Sendable {
    /// The request number of its idempotency key.
    var number: UInt64
    var actions: [Frame]
    var outcome: DispatchOutcome
    var optimistic = false
    /// A ``Replica/sync(timeout:)``: no actions, but a STATUS, and the seq it names waited for until then.
    var barrier: ContinuousClock.Instant? = nil
    /// The trace context of the dispatch's span, carried by the DISPATCH; empty when nothing traces.
    var trace: [String: String] = [:]
}

/// What both dispatching clients' shared state keeps for their callers' dispatches.
protocol QueuesDispatches: Sendable {
    /// Whether a dispatch may be queued now (the client has not stopped).
    var takesDispatches: Bool { get }
    var lastRequestID: UInt64 { get set }
    var outbox: [Outgoing] { get set }
}

extension QueuesDispatches {
    /// Queues `outgoing` and says whether the caller must wake the client's thread: only when the outbox was empty.
    /// Each turn the thread empties its wake-up pipe and then takes the whole outbox, under the lock, so a dispatch
    /// queued behind others goes out with them, and one queued after the take finds the outbox empty. With many tasks
    /// dispatching at once, that is one write to the pipe (and one wake-up) a turn, not one a dispatch.
    mutating func queue(_ outgoing: Outgoing) -> Bool {
        let first = outbox.isEmpty
        outbox.append(outgoing)
        return first
    }
}

/// A batch of `frames` to `store` as both dispatching clients send it: queued in `shared`'s outbox — unless the client
/// stopped, which throws `stopped` — inside a client span whose trace context it carries, the client's thread woken,
/// and its answer awaited.
func queueAndAwait<Shared: QueuesDispatches>(
    _ frames: [Frame],
    to store: StoreName,
    in shared: LockedValue<Shared>,
    waking wakeup: Wakeup,
    stopped: String
) async throws -> ClosedRange<SequenceNumber> {
    try await traced(dispatchOf: frames.count, to: store) { trace in
        let outcome = DispatchOutcome()
        let wake = shared.withLockedValue { shared -> Bool? in
            guard shared.takesDispatches else { return nil }
            shared.lastRequestID += 1
            return shared.queue(Outgoing(number: shared.lastRequestID, actions: frames, outcome: outcome, trace: trace))
        }
        guard let wake else { throw ClientError(code: .stopped, stopped) }
        if wake { wakeup.signal() }
        return try await outcome.value
    }
}

/// Runs `body` — a dispatch of `count` actions to `store`, sent and answered — inside a client span
/// `lockstep.dispatch` of the task's trace (swift-distributed-tracing), handing it the span's trace context for the
/// DISPATCH to carry (docs/operations.md, "Traces"). Without a tracer the span is a no-op and the context empty.
func traced<T>(
    dispatchOf count: Int,
    to store: StoreName,
    _ body: (_ trace: [String: String]) async throws -> T
) async throws -> T {
    try await withSpan("lockstep.dispatch", ofKind: .client) { span in
        span.attributes["lockstep.store"] = store.rawValue
        span.attributes["lockstep.actions"] = count
        var trace: [String: String] = [:]
        InstrumentationSystem.instrument.inject(span.context, into: &trace, using: TraceFields())
        return try await body(trace)
    }
}

/// `actions` in canonical JSON, or a `badRequest` naming the one that cannot be encoded; `function` names the call in
/// the message.
func canonicalFrames<Action: Encodable>(_ actions: [Action], for function: String) throws(ClientError) -> [Frame] {
    guard !actions.isEmpty else {
        throw ClientError(code: .badRequest, "\(function) needs at least one action; it got none")
    }
    var frames: [Frame] = []
    frames.reserveCapacity(actions.count)
    for (index, action) in actions.enumerated() {
        do {
            frames.append(try CanonicalEncoding.bytes(of: action))
        } catch {
            throw ClientError(
                code: .badRequest,
                "action \(index) cannot be encoded as JSON: \(CanonicalEncoding.describe(error))"
            )
        }
    }
    return frames
}

/// "the daemon at X", or "any of the daemons at X, Y": for messages.
func daemonsPhrase(_ commandEndpoints: [String]) -> String {
    commandEndpoints.count == 1
        ? "the daemon at \(commandEndpoints[0])" : "any of the daemons at \(commandEndpoints.joined(separator: ", "))"
}

/// What a daemon's reply to a DISPATCH of `count` actions to `store` says.
enum DispatchReply {
    /// Sequenced in `epoch` at `seqs`, and durable.
    case accepted(Epoch, ClosedRange<SequenceNumber>)
    /// Not applied, and the same key may go again later: the daemon could not take it now.
    case notNow(ClientError)
    /// Not applied: the domain's `Rejection`, or a ``ClientError``.
    case failed(any Error)

    init(_ reply: Reply, count: Int, store: StoreName) {
        switch reply {
        case let .accepted(_, epoch, firstSeq, accepted) where accepted == count && count > 0:
            self = .accepted(epoch, firstSeq...(firstSeq + SequenceNumber(count) - 1))
        case let .rejected(_, index, rejection):
            self = .failed(
                count == 1
                    ? rejection : Rejection(code: rejection.code, "action \(index) of the batch: \(rejection.reason)")
            )
        case let .error(_, refusal) where refusal.code == .unavailable || refusal.code == .notLeader:
            self = .notNow(ClientError(code: .unavailable, "the daemon could not take the dispatch now: \(refusal)"))
        case let .error(_, refusal):
            self = .failed(ClientError(code: .refused, "the daemon refused the dispatch to '\(store)': \(refusal)"))
        default:
            self = .failed(ClientError(code: .protocolViolation, "the daemon answered a dispatch with \(reply)"))
        }
    }
}

/// Runs `loop` on a thread of its own, named `name`, until it returns or throws; the task's cancellation or a
/// graceful shutdown of its service group calls `stop`, which must make `loop` return soon.
func runOnOwnThread(
    named name: String,
    _ loop: @escaping @Sendable () throws -> Void,
    stop: @escaping @Sendable () -> Void
) async throws {
    try await withTaskCancellationHandler {
        try await withGracefulShutdownHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let thread = Thread {
                    nameCurrentThread(name)
                    do {
                        try loop()
                        continuation.resume()
                    } catch {
                        continuation.resume(throwing: error)
                    }
                }
                thread.name = "lockstep \(name)"
                thread.start()
            }
        } onGracefulShutdown: {
            stop()
        }
    } onCancel: {
        stop()
    }
}

extension Logger {
    /// This logger with the store's name as `store` metadata: what a client of one store logs through.
    func forStore(_ name: String) -> Logger {
        var logger = self
        logger[metadataKey: "store"] = "\(name)"
        return logger
    }
}
