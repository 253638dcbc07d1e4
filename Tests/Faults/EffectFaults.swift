import Foundation
import Lockstep
import LockstepClient
import LockstepExamples
import LockstepJournal
import LockstepProtocol
import LockstepTesting
import ZeroMQ

/// A thread adding reminders, one batch at a time: `add`, due within `dueWithin` of now, and for every other one
/// `complete` of the same reminder in the same batch (its timer cancelled, its notification set going). One thread,
/// each batch answered before the next, so the k-th reminder added has id k; a batch left unanswered after every try
/// ends the load (its reminder's id would be unknown).
final class ReminderLoad: Sendable {
    struct Sent: Hashable {
        var id: Int
        var text: String
        var completed: Bool
    }

    private struct Shared {
        var stopping = false
        var running = false
        var sent: [Sent] = []
        var problem: String?
    }

    private let endpoints: [String]
    private let label: String
    private let dueWithin: Int64
    private let shared = LockedValue(Shared())

    init(endpoints: [String], label: String, dueWithin milliseconds: Int64 = 1_500) {
        self.endpoints = endpoints
        self.label = label
        dueWithin = milliseconds
    }

    /// The batches acknowledged.
    var sent: [Sent] { shared.withLockedValue { $0.sent } }
    /// Why the load ended early: a batch unanswered or refused.
    var problem: String? { shared.withLockedValue { $0.problem } }

    func start(seed: UInt64) {
        shared.withLockedValue { $0.running = true }
        let worker = Thread { [self] in
            defer { shared.withLockedValue { $0.running = false } }
            var random = SplitMix64(seed: seed)
            guard let context = try? Context() else { return }
            let client = CommandClient(context: context, endpoints: endpoints, timeout: .milliseconds(300), retries: 60)
            let clientID = ClientID.random()
            var id = 0
            while !shared.withLockedValue({ $0.stopping }) {
                id += 1
                let text = "\(label)-\(id)"
                let due = Int64(Date().timeIntervalSince1970 * 1_000) + Int64(random.next() % UInt64(dueWithin))
                let completed = id % 2 == 0
                var actions = [#"{"add":{"dueMilliseconds":\#(due),"text":"\#(text)"}}"#]
                if completed { actions.append(#"{"complete":{"id":\#(id)}}"#) }
                let request = DispatchRequest(
                    requestID: UInt64(id),
                    domainVersion: Reminders.version,
                    clientID: clientID,
                    store: try! StoreName(Reminders.name),
                    actions: actions.map { Array($0.utf8) }
                )
                // `unavailable`: nothing was applied (a failed commit); the same request again, as the reason says.
                var reply = try? client.call(.dispatch(request))
                for _ in 0..<100 {
                    guard case let .error(_, error)? = reply, error.code == .unavailable else { break }
                    Thread.sleep(forTimeInterval: 0.1)
                    reply = try? client.call(.dispatch(request))
                }
                let stop = shared.withLockedValue { shared -> Bool in
                    switch reply {
                    case .accepted?:
                        shared.sent.append(Sent(id: id, text: text, completed: completed))
                        return false
                    case let reply?:
                        shared.problem = "batch \(id) was answered \(reply)"
                    case nil:
                        shared.problem = "batch \(id) was unanswered after every try"
                    }
                    return true
                }
                if stop { break }
            }
        }
        worker.start()
    }

    /// Stops the thread after its batch in flight, at most as long as every try of it.
    func stop() {
        shared.withLockedValue { $0.stopping = true }
        let deadline = ContinuousClock.now + .seconds(30)
        while shared.withLockedValue({ $0.running }), ContinuousClock.now < deadline {
            Thread.sleep(forTimeInterval: 0.01)
        }
    }
}

/// What the journal and the notification service hold of a ``ReminderLoad``'s reminders, against the promises of
/// docs/effects.md: every effect ran at least once, every result is applied exactly once, every timer due fired
/// exactly once and every cancelled one never, and the outbox is empty at the end.
struct EffectsCheck {
    var broken = 0
    var problems: [String] = []
    var notes: [String] = []

    init(journal: any Journal, service: Reminders.Notifications, sent: [ReminderLoad.Sent]) throws {
        var adds: [String] = []
        var overdue: [Int: Int] = [:]
        var notified: [Int: Int] = [:]
        var completions: [Int: UInt64] = [:]
        var from: SequenceNumber = 1
        let decoder = JSONDecoder()
        while true {
            guard case let .events(events) = try journal.events(store: "reminders", from: from, to: .max, limit: 10_000)
            else { throw SuiteError("the reminders history was compacted; the suite keeps it whole") }
            for event in events {
                switch try decoder.decode(Reminders.Action.self, from: Data(event.action)) {
                case let .add(text, _): adds.append(text)
                case let .complete(id): completions[id] = event.seq
                case let .flagOverdue(id): overdue[id, default: 0] += 1
                case let .notified(id, _): notified[id, default: 0] += 1
                }
            }
            guard let last = events.last, events.count == 10_000 else { break }
            from = last.seq + 1
        }
        func problem(_ text: String) {
            broken += 1
            if problems.count < 8 { problems.append(text) }
        }
        let received = Dictionary(try service.received().map { ($0, 1) }, uniquingKeysWith: +)
        let notifications = try service.sent()
        for reminder in sent {
            guard reminder.id <= adds.count, adds[reminder.id - 1] == reminder.text else {
                problem(
                    "reminder \(reminder.id) ('\(reminder.text)') was acknowledged but is not the \(reminder.id)th add"
                )
                continue
            }
            if reminder.completed {
                // Its notification is effect 1 of its completion (0 cancels the timer).
                let key = completions[reminder.id].map { "reminders/\($0)/1" } ?? "?"
                if (received[key] ?? 0) < 1 {
                    problem("the notification of reminder \(reminder.id) (\(key)) never ran")
                }
                if notified[reminder.id] != 1 {
                    problem("reminder \(reminder.id)'s receipt was applied \(notified[reminder.id] ?? 0) times")
                }
                if overdue[reminder.id] != nil { problem("reminder \(reminder.id)'s cancelled timer fired") }
            } else if overdue[reminder.id] != 1 {
                problem("reminder \(reminder.id)'s timer fired \(overdue[reminder.id] ?? 0) times")
            }
        }
        let completed = sent.filter(\.completed).count
        if notifications.count != completed {
            problem("the service sent \(notifications.count) notifications for \(completed) completions")
        }
        let outbox = try journal.outbox()
        if !outbox.effects.isEmpty || !outbox.timers.isEmpty {
            problem("the outbox still holds \(outbox.effects.count) effects and \(outbox.timers.count) timers")
        }
        let runs = received.values.reduce(0, +)
        let applied = notified.values.reduce(0, +)
        let fired = overdue.values.reduce(0, +)
        notes.append(
            "\(sent.count) reminders: \(completed) notifications ran \(runs) times in all, their receipts applied "
                + "\(applied) times; \(sent.count - completed) timers due fired \(fired) times in all"
        )
    }
}

extension Faults {
    /// The reminders' effects and timers under kill -9 at random moments and at every failpoint, between the commit
    /// and a handler's start (`effect-start`) and between its end and its result's dispatch (`effect-ran`) among
    /// them; quick 20 cycles, long 200.
    func effects() throws -> FaultResult {
        let service = folder.appendingPathComponent("effects-service")
        let daemon = try Daemon(
            folder: folder.appendingPathComponent("effects"),
            configuration: "domains = [\"reminders\"]\n" + Self.keepHistory,
            environment: ["LOCKSTEP_NOTIFICATIONS": service.path]
        )
        try daemon.start()
        let load = ReminderLoad(endpoints: [daemon.command], label: "effects")
        load.start(seed: random.next())
        defer { load.stop() }
        var result = FaultResult(injected: 0, survived: 0, lost: 0)
        try crashCycles(
            daemon,
            points: ["before-commit", "after-commit", "after-reply", "effect-start", "effect-ran"],
            upTo: 4,
            into: &result
        ) {
            let before = load.sent.count
            let deadline = ContinuousClock.now + .seconds(15)
            while load.sent.count <= before, load.problem == nil, ContinuousClock.now < deadline {
                Thread.sleep(forTimeInterval: 0.01)
            }
            return (load.sent.count > before, load.problem)
        }
        load.stop()
        try settleEffects(load, leader: daemon, service: service, into: &result) {
            try openLocalJournal(directory: daemon.data, readOnly: true)
        }
        return result
    }

    /// Waits until the leader has run every effect and fired every timer of `load`'s reminders, stops the daemon,
    /// and checks the journal and the service.
    func settleEffects(
        _ load: ReminderLoad,
        leader: Daemon,
        service: URL,
        into result: inout FaultResult,
        journal: () throws -> any Journal
    ) throws {
        drainEffects(load, leader: leader, into: &result)
        if leader.stop() != 0 {
            result.failure = result.failure ?? "lockstepd did not exit 0 on SIGTERM; see \(leader.log.path)"
        }
        try checkEffects(load, service: service, into: &result, journal: journal)
    }

    /// Waits until `leader` has run every effect and fired every timer of `load`'s reminders, at most 30 s.
    func drainEffects(_ load: ReminderLoad, leader: Daemon, into result: inout FaultResult) {
        if let problem = load.problem { result.failure = result.failure ?? problem }
        let drained = leader.waitForStatus(within: .seconds(30)) { status in
            guard let effects = status.stores.first(where: { $0.name == "reminders" })?.effects else { return false }
            return effects.pending == 0 && effects.timers == 0 && effects.dead == 0
        }
        if drained == nil {
            let effects = leader.status()?.stores.first { $0.name == "reminders" }?.effects
            result.failure =
                result.failure ?? "the effects and timers did not drain within 30 s: \(String(describing: effects))"
        }
    }

    /// Checks the journal and the service against `load` (``EffectsCheck``), once the daemons are stopped.
    func checkEffects(
        _ load: ReminderLoad,
        service: URL,
        into result: inout FaultResult,
        journal: () throws -> any Journal
    ) throws {
        let opened = try journal()
        defer { try? opened.close() }
        let check = try EffectsCheck(
            journal: opened,
            service: Reminders.Notifications(directory: service.path),
            sent: load.sent
        )
        result.lost += check.broken
        result.notes += check.problems + check.notes
    }
}
