import LockstepJournal
import LockstepProtocol

/// The leader's effects and timers as a value (docs/effects.md): which effects wait to run, which run, when a failed
/// one is tried again and when it is given up; which timers are set and which are due. No clock, no journal, no task
/// in it: every event carries the time, and every decision comes back as an ``Action`` for the loop to carry out.
///
/// An effect is run only once the action that set it going is durable, and at most `maximumRunning` at a time. A run
/// that fails (or outlives its timeout) is tried again after a backoff that doubles, up to `maximumAttempts` runs in
/// all; then it is given up, a dead letter kept until it is sent back or dropped. A run's result is taken only from
/// the attempt the ledger is waiting for: a late answer of an attempt it gave up on changes nothing, so a result is
/// applied once even when a handler ran twice.
///
/// Timers follow the order of sequencing, not of commits: a timer an action set or cancelled counts from the moment
/// the action is sequenced (a commit that fails rebuilds the ledger from the journal, as the stores are). A due timer
/// is fired once: its action is sequenced and the timer leaves the ledger at that moment.
package struct EffectLedger {
    /// How effects are run.
    package struct Policy: Hashable, Sendable {
        /// The most effects running at once.
        package var maximumRunning: Int
        /// Runs in all before an effect is given up.
        package var maximumAttempts: Int
        /// How long a run may take before it counts as failed.
        package var timeout: Duration
        /// The wait before the second run; it doubles after each failure, up to ``maximumBackoff``.
        package var backoff: Duration
        package var maximumBackoff: Duration

        package init(
            maximumRunning: Int = 8,
            maximumAttempts: Int = 5,
            timeout: Duration = .seconds(30),
            backoff: Duration = .milliseconds(200),
            maximumBackoff: Duration = .seconds(30)
        ) {
            self.maximumRunning = maximumRunning
            self.maximumAttempts = maximumAttempts
            self.timeout = timeout
            self.backoff = backoff
            self.maximumBackoff = maximumBackoff
        }
    }

    /// Where an effect stands.
    package enum Phase: Hashable, Sendable {
        /// Waiting to run, not before this time.
        case waiting(notBefore: ContinuousClock.Instant)
        /// Running as attempt `attempt`, counted failed at `deadline`.
        case running(attempt: Int, deadline: ContinuousClock.Instant)
        /// Given up: a dead letter.
        case dead
    }

    /// An effect in the ledger.
    package struct Entry: Hashable, Sendable {
        package var effect: JournalEffect
        package var phase: Phase
    }

    /// What the loop must do.
    package enum Action: Hashable, Sendable {
        /// Hand effect `id` (its JSON `body`) to its handler as run number `attempt`.
        case run(JournalEffectID, body: [UInt8], attempt: Int)
        /// Sequence `timer`'s action now, and remove the timer in the same commit.
        case fire(JournalTimer)
        /// Sequence the actions a run returned (their JSON), and mark the effect done in the same commit.
        case complete(JournalEffectID, actions: [[UInt8]])
        /// Journal this change to an effect (a failure, a dead letter, a retry, a drop).
        case journal(JournalEffectUpdate)
        /// Log that a run failed (`error`), and whether the effect was given up.
        case failed(JournalEffectID, attempt: Int, error: String, givenUp: Bool)
    }

    package let policy: Policy
    /// The effects waiting or running, by id.
    private var live: [JournalEffectID: Entry] = [:]
    /// The dead letters, kept apart so that however many there are, a turn costs no more.
    private var dead: [JournalEffectID: Entry] = [:]
    /// Effects free to run now, in the order their actions became durable: a turn takes from the front. An id whose
    /// effect was dropped meanwhile is skipped when it comes up.
    private var ready = Queue()
    /// Effects waiting out a backoff, soonest first: few, as only failed runs wait.
    private var delayed: [(notBefore: ContinuousClock.Instant, id: JournalEffectID)] = []
    /// The effects running: at most ``Policy/maximumRunning``, all a turn looks at for timeouts.
    private var runningIDs: Set<JournalEffectID> = []
    /// Timers by store and key, as sequenced.
    package private(set) var timers: [TimerKey: JournalTimer] = [:]
    /// The earliest due time of ``timers``; `.none` when it must be worked out again (a timer left or moved): a turn
    /// with no timer due costs one comparison, however many are set.
    private var earliestDue: Int64?? = .some(nil)
    /// Effects whose action is sequenced but not yet durable: run once it is.
    private var uncommitted: Set<JournalEffectID> = []

    package struct TimerKey: Hashable, Sendable {
        package var store: String
        package var key: String
    }

    /// A first-in, first-out queue of ids: an array read from a moving head, compacted now and then.
    private struct Queue {
        private var items: [JournalEffectID] = []
        private var head = 0

        var isEmpty: Bool { head == items.count }

        mutating func push(_ id: JournalEffectID) { items.append(id) }

        mutating func pop() -> JournalEffectID? {
            guard head < items.count else { return nil }
            defer {
                head += 1
                if head == items.count {
                    items.removeAll(keepingCapacity: true)
                    head = 0
                } else if head >= 1_024, head * 2 >= items.count {
                    items.removeFirst(head)
                    head = 0
                }
            }
            return items[head]
        }
    }

    /// A ledger of what the journal's outbox holds, as a new leadership finds it: every effect waits to run at once,
    /// in id order, dead letters stay dead, every timer is set.
    package init(outbox: JournalOutbox, policy: Policy, now: ContinuousClock.Instant) {
        self.policy = policy
        for effect in outbox.effects.sorted(by: { $0.id < $1.id }) {
            if effect.dead {
                dead[effect.id] = Entry(effect: effect, phase: .dead)
            } else {
                live[effect.id] = Entry(effect: effect, phase: .waiting(notBefore: now))
                ready.push(effect.id)
            }
        }
        for timer in outbox.timers { set(timer) }
    }

    /// How many effects are running.
    package var running: Int { runningIDs.count }
    /// Nothing runs, waits or is set to fire: ``tick(now:wallMilliseconds:)`` would do nothing and
    /// ``nextDeadline(now:)`` has none — the state of a daemon whose domains set nothing going, which then pays
    /// nothing for effects per turn.
    package var isIdle: Bool { runningIDs.isEmpty && ready.isEmpty && delayed.isEmpty && timers.isEmpty }

    /// Every effect in the ledger, waiting, running or dead, by id.
    package var effects: [JournalEffectID: Entry] { live.merging(dead) { first, _ in first } }

    private mutating func set(_ timer: JournalTimer) {
        if timers.updateValue(timer, forKey: TimerKey(store: timer.store, key: timer.key)) != nil {
            earliestDue = .none  // the one it replaced may have been the earliest
        } else if case let .some(earliest) = earliestDue {
            earliestDue = .some(min(earliest ?? timer.dueMilliseconds, timer.dueMilliseconds))
        }
    }

    private mutating func removeTimer(_ key: TimerKey) {
        if timers.removeValue(forKey: key) != nil { earliestDue = .none }
    }

    /// The earliest due time of a timer set, worked out again when a timer left or moved since.
    private mutating func earliest() -> Int64? {
        if case let .some(earliest) = earliestDue { return earliest }
        let earliest = timers.values.lazy.map(\.dueMilliseconds).min()
        earliestDue = .some(earliest)
        return earliest
    }

    // MARK: - Events

    /// An action was sequenced with these effects (its own, in index order): its timers are set and cancelled now,
    /// its effects to run wait for its commit (``committed(_:now:)``). An effect journaled dead (it could not be
    /// encoded) is a dead letter at once.
    package mutating func sequenced(
        _ records: [JournalEffect],
        timers changes: [JournalTimerChange],
        now: ContinuousClock.Instant
    ) {
        for effect in records {
            if effect.dead {
                dead[effect.id] = Entry(effect: effect, phase: .dead)
                continue
            }
            live[effect.id] = Entry(effect: effect, phase: .waiting(notBefore: now))
            uncommitted.insert(effect.id)
        }
        for change in changes {
            switch change {
            case let .set(timer): set(timer)
            case let .remove(store, key): removeTimer(TimerKey(store: store, key: key))
            }
        }
    }

    /// The actions that set `ids` going are durable: the effects may run from `now`, in this order.
    package mutating func committed(_ ids: [JournalEffectID], now: ContinuousClock.Instant) {
        for id in ids where uncommitted.remove(id) != nil && live[id] != nil {
            live[id]?.phase = .waiting(notBefore: now)
            ready.push(id)
        }
    }

    /// Time passed: due timers fire (those due at or before `wallMilliseconds`, wall-clock time), runs past their
    /// timeout count as failed, and effects whose wait is over run, up to ``Policy/maximumRunning``.
    ///
    /// A turn costs what is due and what runs, not what waits: one comparison for the timers however many are set,
    /// a look at the runs (at most ``Policy/maximumRunning``) and at the front of the queues.
    package mutating func tick(now: ContinuousClock.Instant, wallMilliseconds: Int64) -> [Action] {
        var actions: [Action] = []
        if let earliest = earliest(), earliest <= wallMilliseconds {
            let due = timers.filter { $0.value.dueMilliseconds <= wallMilliseconds }.sorted {
                ($0.value.dueMilliseconds, $0.key.store, $0.key.key) < (
                    $1.value.dueMilliseconds, $1.key.store, $1.key.key
                )
            }
            for (key, timer) in due {
                removeTimer(key)
                actions.append(.fire(timer))
            }
        }
        for id in runningIDs.sorted() {
            guard case let .running(attempt, deadline)? = live[id]?.phase, deadline <= now else { continue }
            actions += failed(id, attempt: attempt, error: "no answer within \(policy.timeout)", now: now)
        }
        while let first = delayed.first, first.notBefore <= now {
            delayed.removeFirst()
            if case .waiting? = live[first.id]?.phase { ready.push(first.id) }
        }
        while runningIDs.count < policy.maximumRunning, let id = ready.pop() {
            // Skipped: dropped meanwhile.
            guard let entry = live[id], case .waiting = entry.phase, !uncommitted.contains(id) else { continue }
            let attempt = entry.effect.attempts + 1
            live[id]?.phase = .running(attempt: attempt, deadline: now + policy.timeout)
            runningIDs.insert(id)
            actions.append(.run(id, body: entry.effect.body, attempt: attempt))
        }
        return actions
    }

    /// Run `attempt` of effect `id` ended. A success completes the effect with the actions it returned (their JSON);
    /// a failure is tried again later, or given up after the last attempt. An answer the ledger no longer waits for
    /// (the attempt timed out, the effect is done or gone) changes nothing.
    package mutating func finished(
        _ id: JournalEffectID,
        attempt: Int,
        _ outcome: Result<[[UInt8]], EffectFailure>,
        now: ContinuousClock.Instant
    ) -> [Action] {
        guard case let .running(current, _)? = live[id]?.phase, current == attempt else { return [] }
        switch outcome {
        case let .success(actions):
            live[id] = nil
            runningIDs.remove(id)
            return [.complete(id, actions: actions)]
        case let .failure(failure):
            return failed(id, attempt: attempt, error: failure.description, now: now, permanent: failure.permanent)
        }
    }

    private mutating func failed(
        _ id: JournalEffectID,
        attempt: Int,
        error: String,
        now: ContinuousClock.Instant,
        permanent: Bool = false
    ) -> [Action] {
        guard var entry = live[id] else { return [] }
        runningIDs.remove(id)
        let givenUp = permanent || attempt >= policy.maximumAttempts
        entry.effect.attempts = attempt
        entry.effect.lastError = error
        entry.effect.dead = givenUp
        if givenUp {
            entry.phase = .dead
            live[id] = nil
            dead[id] = entry
        } else {
            var wait = policy.backoff
            for _ in 1..<attempt { wait = min(wait * 2, policy.maximumBackoff) }
            entry.phase = .waiting(notBefore: now + wait)
            live[id] = entry
            let index = delayed.firstIndex { $0.notBefore > now + wait } ?? delayed.endIndex
            delayed.insert((now + wait, id), at: index)
        }
        return [
            .failed(id, attempt: attempt, error: error, givenUp: givenUp),
            .journal(JournalEffectUpdate(id, .failed(attempts: attempt, error: error, dead: givenUp))),
        ]
    }

    /// A dead letter is sent back to be run (by hand): its tries start again. `nil` when `id` is not a dead letter.
    package mutating func retry(_ id: JournalEffectID, now: ContinuousClock.Instant) -> [Action]? {
        guard var entry = dead.removeValue(forKey: id) else { return nil }
        entry.effect.attempts = 0
        entry.effect.dead = false
        entry.phase = .waiting(notBefore: now)
        live[id] = entry
        ready.push(id)
        return [.journal(JournalEffectUpdate(id, .retry))]
    }

    /// An effect is dropped without running (by hand). `nil` when there is no such effect, or it is running.
    package mutating func drop(_ id: JournalEffectID) -> [Action]? {
        if dead.removeValue(forKey: id) != nil { return [.journal(JournalEffectUpdate(id, .drop))] }
        guard let entry = live[id] else { return nil }
        if case .running = entry.phase { return nil }
        live[id] = nil
        uncommitted.remove(id)
        return [.journal(JournalEffectUpdate(id, .drop))]
    }

    /// When ``tick(now:wallMilliseconds:)`` has something to do on the monotonic clock: now, when an effect is free
    /// to run and a run may start; the end of a run's time or of a backoff; and on the wall clock, the next timer.
    package func nextDeadline(
        now: ContinuousClock.Instant
    ) -> (
        monotonic: ContinuousClock.Instant?, wallMilliseconds: Int64?
    ) {
        var next = delayed.first?.notBefore
        for id in runningIDs {
            guard case let .running(_, deadline)? = live[id]?.phase else { continue }
            next = next.map { min($0, deadline) } ?? deadline
        }
        if !ready.isEmpty, runningIDs.count < policy.maximumRunning { next = now }
        // Worked out again only after a timer left and before the turn's ``tick(now:wallMilliseconds:)`` did.
        let earliest = earliestDue ?? timers.values.lazy.map(\.dueMilliseconds).min()
        return (next, earliest)
    }

    /// Why ``retry(_:now:)`` or ``drop(_:)`` of `id` does nothing: there is no such effect, or it is in the wrong
    /// phase.
    package func refusal(_ id: JournalEffectID, retrying: Bool) -> String {
        guard let entry = live[id] ?? dead[id] else {
            return "no effect \(id) is waiting, running or given up (it ran, was dropped, or never was); "
                + "`lockstep effects list` shows the effects there are"
        }
        switch (entry.phase, retrying) {
        case (.running, false): return "effect \(id) is running; drop it once its run has ended"
        case (_, true): return "effect \(id) is not a dead letter, it will run anyway; only one given up is retried"
        default: return "effect \(id) cannot be dropped now"
        }
    }

    /// What EFFECTS lists: every effect by id, every timer by due time.
    package func listing() -> EffectsListing {
        let effects = self.effects.sorted { $0.key < $1.key }.map { id, entry in
            let phase =
                switch entry.phase {
                case .waiting: "waiting"
                case .running: "running"
                case .dead: "dead"
                }
            return EffectsListing.Effect(
                id: id.description,
                phase: phase,
                attempts: entry.effect.attempts,
                lastError: entry.effect.lastError,
                effect: String(decoding: entry.effect.body, as: UTF8.self)
            )
        }
        let timers = self.timers.values.sorted {
            ($0.dueMilliseconds, $0.store, $0.key) < ($1.dueMilliseconds, $1.store, $1.key)
        }
        .map {
            EffectsListing.Timer(
                store: $0.store,
                key: $0.key,
                dueMilliseconds: $0.dueMilliseconds,
                action: String(decoding: $0.action, as: UTF8.self)
            )
        }
        return EffectsListing(effects: effects, timers: timers)
    }

    /// Counts for STATUS: per store, effects waiting or running, dead letters, and timers set.
    package func counts() -> [String: (pending: Int, dead: Int, timers: Int)] {
        var counts: [String: (pending: Int, dead: Int, timers: Int)] = [:]
        for entry in live.values { counts[entry.effect.store, default: (0, 0, 0)].pending += 1 }
        for entry in dead.values { counts[entry.effect.store, default: (0, 0, 0)].dead += 1 }
        for timer in timers.values { counts[timer.store, default: (0, 0, 0)].timers += 1 }
        return counts
    }
}

/// Why a run of an effect failed.
package struct EffectFailure: Error, Hashable, Sendable, CustomStringConvertible {
    package var description: String
    /// Whether trying again cannot help (the effect cannot be decoded by this build): it is given up at once.
    package var permanent: Bool

    package init(_ description: String, permanent: Bool = false) {
        self.description = description
        self.permanent = permanent
    }
}
