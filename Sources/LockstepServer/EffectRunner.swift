import Foundation
import Lockstep
import LockstepJournal
import Logging
import ZeroMQ

/// What runs a domain's effects (docs/effects.md): the user's code, given to the daemon's one call
/// (`LockstepDaemonMain.run(domains:effects:)`). The daemon that leads runs each effect at least once, off its
/// command loop, and sequences the actions a run returns exactly once, whatever runs twice.
public struct EffectHandler: Sendable {
    /// The store whose effects it runs: the domain's name.
    public let store: String
    let run: @Sendable (_ body: [UInt8], _ context: EffectContext) async throws -> [[UInt8]]

    /// Runs `domain`'s effects with `handle`: it gets the effect and its context — pass `context.id` on to the
    /// outside service as the idempotency key of what the effect does there — and returns the actions to apply
    /// (none, often). A thrown error is a failed run: tried again after a backoff, given up after the daemon's
    /// `effects.tries`. A run that outlives `effects.timeout_ms` counts as failed and its late answer is ignored.
    public init<D: Domain>(
        _ domain: D.Type,
        _ handle: @escaping @Sendable (_ effect: D.Effect, _ context: EffectContext) async throws -> [D.Action]
    ) {
        store = D.name
        run = { body, context in
            let coder = CanonicalEncoding.Coder()
            let effect: D.Effect
            do {
                effect = try coder.decode(D.Effect.self, from: body)
            } catch {
                throw EffectFailure(
                    "the effect is not an effect of \(D.name) v\(D.version) (\(CanonicalEncoding.describe(error))); was "
                        + "it journaled by another version of the domain? Drop it, or run a build that reads it",
                    permanent: true
                )
            }
            return try await handle(effect, context).map { try coder.encode($0) }
        }
    }
}

extension EffectHandler {
    /// Throws unless `handlers` run the effects of exactly the domains of `domains` that declare effects, one each.
    static func check(_ handlers: [EffectHandler], for domains: [HostedDomain]) throws(ServerError) {
        let declaring = Set(domains.filter(\.hasEffects).map(\.name))
        let handled = handlers.map(\.store)
        if let twice = Dictionary(grouping: handled, by: { $0 }).first(where: { $0.value.count > 1 })?.key {
            throw ServerError(code: .configuration, "two effect handlers are given for domain '\(twice)'; give one")
        }
        if let extra = handled.first(where: { !declaring.contains($0) }) {
            throw ServerError(
                code: .configuration,
                "an effect handler is given for '\(extra)', which is not a linked domain that declares effects "
                    + "(those are: \(declaring.sorted().joined(separator: ", ")))"
            )
        }
        if let missing = declaring.subtracting(handled).sorted().first {
            throw ServerError(
                code: .configuration,
                "domain '\(missing)' declares effects but no handler runs them: add an "
                    + "EffectHandler for its type to the effects of the daemon's one call"
            )
        }
    }
}

/// What a run of an effect knows.
public struct EffectContext: Sendable {
    /// The effect's stable id, `store/seq/index`: the same in every run of it, on any daemon. Pass it to the outside
    /// service as an idempotency key.
    public var id: String
    /// Which run this is, from 1.
    public var attempt: Int
    /// The daemon's data directory, for a handler that keeps files of its own.
    public var dataDirectory: String
    /// The daemon's logger, with the effect's id as metadata.
    public var logger: Logger
}

/// Runs effects the ``EffectLedger`` hands it, each in a task of its own on threads of the runner's own, and
/// hands each outcome back to the loop through a locked inbox and the loop's wake-up pipe. The runner owns those
/// tasks: one the ledger gave up on (past its timeout) is cancelled, and so is every one still running when the
/// daemon stops, which does not wait for them (a handler that ignores cancellation runs on, and its answer is
/// ignored).
final class EffectRunner: Sendable {
    struct Job: Sendable {
        var id: JournalEffectID
        var body: [UInt8]
        var attempt: Int
    }

    struct Outcome: Sendable {
        var id: JournalEffectID
        var attempt: Int
        var result: Result<[[UInt8]], EffectFailure>
    }

    private struct Running: Hashable, Sendable {
        var id: JournalEffectID
        var attempt: Int
    }

    private let handlers: [String: EffectHandler]
    private let dataDirectory: String
    private let logger: Logger
    private let wakeup: Wakeup
    private let threads: ThreadsExecutor
    /// What ended, what runs, whether the runner stopped, and which leadership the runs belong to (``cancelAll()``
    /// starts a new one: what a run of an earlier one comes to is dropped).
    private let state = LockedValue(
        (outcomes: [Outcome](), tasks: [Running: Task<Void, Never>](), stopped: false, generation: 0)
    )

    /// At most this many threads run handlers, however many runs `effects.concurrency` allows at once: beyond it,
    /// handlers that block wait for one another (handlers that await do not).
    static let threadLimit = 64

    init(handlers: [EffectHandler], dataDirectory: String, threads: Int, wakeup: Wakeup, logger: Logger) {
        var byStore: [String: EffectHandler] = [:]
        for handler in handlers { byStore[handler.store] = handler }
        self.handlers = byStore
        self.dataDirectory = dataDirectory
        self.wakeup = wakeup
        self.threads = ThreadsExecutor(limit: min(threads, Self.threadLimit), name: "effects")
        self.logger = logger
    }

    /// Starts a run; callable from any thread. Nothing starts once the runner stopped.
    func start(_ job: Job) {
        let key = Running(id: job.id, attempt: job.attempt)
        state.withLockedValue { state in
            guard !state.stopped else { return }
            let generation = state.generation
            state.tasks[key] = Task(executorPreference: threads) { [self] in
                let result = await execute(job)
                let current = self.state.withLockedValue { state in
                    guard state.generation == generation else { return false }
                    state.tasks[key] = nil
                    state.outcomes.append(Outcome(id: job.id, attempt: job.attempt, result: result))
                    return true
                }
                if current { wakeup.signal() }
            }
        }
    }

    /// Cancels run `attempt` of `id`, which the ledger gave up waiting for.
    func cancel(_ id: JournalEffectID, attempt: Int) {
        state.withLockedValue { $0.tasks.removeValue(forKey: Running(id: id, attempt: attempt)) }?.cancel()
    }

    /// The outcomes of the runs that ended since the last call.
    func takeOutcomes() -> [Outcome] {
        state.withLockedValue { state in
            defer { state.outcomes.removeAll() }
            return state.outcomes
        }
    }

    /// Cancels every run, and forgets what ended: the daemon leads no more (a later leadership starts afresh from the
    /// journal's outbox).
    func cancelAll() {
        let tasks = state.withLockedValue { state in
            defer {
                state.tasks.removeAll()
                state.outcomes.removeAll()
                state.generation += 1
            }
            return Array(state.tasks.values)
        }
        for task in tasks { task.cancel() }
    }

    /// Cancels every run and starts no more: the daemon stops.
    func stop() {
        state.withLockedValue { $0.stopped = true }
        cancelAll()
        threads.stop()
    }

    private func execute(_ job: Job) async -> Result<[[UInt8]], EffectFailure> {
        guard let handler = handlers[job.id.store] else {
            return .failure(
                EffectFailure(
                    "no handler runs the effects of store '\(job.id.store)'; give one to the daemon's one call "
                        + "(LockstepDaemonMain.run(domains:effects:))",
                    permanent: true
                )
            )
        }
        var logger = self.logger
        logger[metadataKey: "effect"] = "\(job.id)"
        let context = EffectContext(
            id: job.id.description,
            attempt: job.attempt,
            dataDirectory: dataDirectory,
            logger: logger
        )
        do {
            return .success(try await handler.run(job.body, context))
        } catch let failure as EffectFailure {
            return .failure(failure)
        } catch {
            return .failure(EffectFailure("the handler threw: \(error)"))
        }
    }
}
