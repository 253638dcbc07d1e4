import Foundation
import Lockstep
import LockstepClient
import LockstepExamples
import LockstepProtocol
import LockstepTesting
import TestSupport
import Testing
import ZeroMQ

/// Effects and timers through `lockstepd` in its own process, with the reminders domain and its notification service
/// (a directory): a completion's notification is sent once and its receipt applied once, through a crash between the
/// run and its result; an overdue timer fires once, across a restart; a failing effect becomes a dead letter that
/// the tool lists, retries and drops (docs/effects.md).
@Suite(.serialized, .timeLimit(.minutes(3))) struct EffectsProcessTests {
    /// A daemon's reminders: its state, and the actions of its journal up to that state, read over the wire.
    struct Reminders_ {
        var state: Reminders.State
        var actions: [Reminders.Action]

        func count(_ match: (Reminders.Action) -> Bool) -> Int { actions.filter(match).count }
    }

    func read(_ daemon: DaemonProcess) async throws -> Reminders_ {
        try await offPool("read reminders", lending: daemon) { daemon in
            let client = CommandClient(context: try Context(), endpoint: daemon.command, timeout: .seconds(5))
            let store = try StoreName("reminders")
            guard case let .snapshot(_, snapshot) = try client.call(.snapshot(requestID: 1, store: store)) else {
                throw DaemonProcessError("no snapshot of reminders")
            }
            let state = try JSONDecoder().decode(Reminders.State.self, from: Data(snapshot.state))
            var actions: [Reminders.Action] = []
            while actions.count < snapshot.seq {
                let from = UInt64(actions.count + 1)
                let reply = try client.call(.range(requestID: from, store: store, from: from, to: snapshot.seq))
                guard case let .range(_, _, _, _, frames, _) = reply, !frames.isEmpty else {
                    throw DaemonProcessError("RANGE from \(from) answered \(reply)")
                }
                actions += try frames.map { try JSONDecoder().decode(Reminders.Action.self, from: Data($0)) }
            }
            return Reminders_(state: state, actions: actions)
        }
    }

    func dispatch(_ daemon: DaemonProcess, _ actions: [String]) async throws {
        let output = try await runProduct(
            "lockstep",
            ["dispatch", "reminders"] + actions + ["--command-endpoint", daemon.command]
        )
        try #require(output.status == 0, "\(output)")
    }

    func now(plus milliseconds: Int64) -> Int64 { Int64(Date().timeIntervalSince1970 * 1_000) + milliseconds }

    func add(_ text: String, due: Int64) -> String { #"{"add":{"text":"\#(text)","dueMilliseconds":\#(due)}}"# }

    /// A completion's notification is sent once, its receipt applied once, and each timer fires once: the one due
    /// flags its reminder overdue, the one of the completed reminder never fires.
    @Test func aCompletionIsNotifiedOnceAndAnOverdueTimerFiresOnce() async throws {
        let directory = try temporaryDirectory("effects")
        defer { try? FileManager.default.removeItem(at: directory) }
        let daemon = try DaemonProcess(directory: directory.path)
        try await daemon.waitUntilServing()
        // Reminder 2 is completed in the same batch, so its timer is cancelled before it can be due.
        try await dispatch(
            daemon,
            [add("soon", due: now(plus: 300)), add("later", due: now(plus: 1_000)), #"{"complete":{"id":2}}"#]
        )
        var seen = try await read(daemon)
        let settled = try await eventually(within: .seconds(20)) {
            seen = try await read(daemon)
            return seen.state.reminder(1)?.overdue == true && seen.state.reminder(2)?.receipt != nil
        }
        try #require(settled, "the timer or the notification did not come: \(seen.state)")
        let service = Reminders.Notifications(directory: "\(directory.path)/.lockstep/data/notifications")
        let sent = try service.sent()
        #expect(sent.count == 1 && sent[0].contains(#""id":2"#), "\(sent)")
        // The receipt names the effect's id: the completion is seq 3, its notification its effect 1 (0 cancels).
        #expect(seen.state.reminder(2)?.receipt == "notified:reminders/3/1")
        #expect(seen.count { if case .notified = $0 { true } else { false } } == 1, "\(seen.actions)")
        #expect(seen.count { $0 == .flagOverdue(id: 1) } == 1, "\(seen.actions)")
        // Reminder 2's timer was cancelled by its completion: past its due time, it still has not fired.
        let due = try #require(seen.state.reminder(2)?.dueMilliseconds)
        try #require(try await eventually(within: .seconds(10)) { now(plus: 0) > due + 300 })
        let status = try #require(await daemon.status())
        let effects = status.stores.first { $0.name == "reminders" }?.effects
        #expect(effects == DaemonStatus.Effects(pending: 0, dead: 0, timers: 0), "\(String(describing: effects))")
        seen = try await read(daemon)
        #expect(seen.count { $0 == .flagOverdue(id: 2) } == 0, "\(seen.actions)")
        #expect(await daemon.stop() == 0)
    }

    /// The daemon is killed after a run ended and before its result is sequenced: restarted, it runs the effect
    /// again (the service receives it twice and sends it once) and applies the receipt once; a timer set before the
    /// kill fires once after the restart.
    @Test func aCrashBetweenARunAndItsResultRunsItAgainAndAppliesItOnce() async throws {
        let directory = try temporaryDirectory("effects-crash")
        defer { try? FileManager.default.removeItem(at: directory) }
        let daemon = try DaemonProcess(directory: directory.path, environment: ["LOCKSTEP_FAILPOINT": "effect-ran"])
        try await daemon.waitUntilServing()
        // One batch, so the seqs (and the effect's id) do not depend on when the timer fires.
        try await dispatch(
            daemon,
            [add("crash", due: now(plus: 2_000)), add("notify", due: now(plus: 600_000)), #"{"complete":{"id":2}}"#]
        )
        let status = await daemon.waitForExit(within: .seconds(20))
        try #require(status != nil, "the daemon did not reach the failpoint")
        let service = Reminders.Notifications(directory: "\(directory.path)/.lockstep/data/notifications")
        #expect(try service.received().count == 1 && service.sent().count == 1, "the run ended before the crash")

        try daemon.start()
        try await daemon.waitUntilServing()
        var seen = try await read(daemon)
        let settled = try await eventually(within: .seconds(20)) {
            seen = try await read(daemon)
            return seen.state.reminder(1)?.overdue == true && seen.state.reminder(2)?.receipt != nil
        }
        try #require(settled, "after the restart: \(seen.state)")
        #expect(try service.received() == ["reminders/3/1", "reminders/3/1"], "run again after the crash")
        #expect(try service.sent().count == 1, "sent once")
        #expect(seen.count { if case .notified = $0 { true } else { false } } == 1, "\(seen.actions)")
        #expect(seen.count { $0 == .flagOverdue(id: 1) } == 1, "\(seen.actions)")
        #expect(await daemon.stop() == 0)
    }

    /// A notification service that fails makes the effect a dead letter after its tries; the tool lists it with its
    /// error, a retry once the service is back runs it, a drop removes another, and an id that is no effect is
    /// refused with exit 64 and changes nothing.
    @Test func aFailingEffectIsADeadLetterThatTheToolListsRetriesAndDrops() async throws {
        let directory = try temporaryDirectory("effects-dead")
        defer { try? FileManager.default.removeItem(at: directory) }
        // The service's directory is a file: every send fails, until it is made a directory.
        let notifications = directory.appendingPathComponent("service")
        try Data("not a directory".utf8).write(to: notifications)
        let configuration = directory.appendingPathComponent("lockstepd.toml")
        try Data("[effects]\ntries = 2\nbackoff_ms = 50\n".utf8).write(to: configuration)
        let daemon = try DaemonProcess(
            directory: directory.path,
            arguments: ["--config", configuration.path],
            environment: ["LOCKSTEP_NOTIFICATIONS": notifications.path]
        )
        try await daemon.waitUntilServing()
        let far = now(plus: 3_600_000)
        try await dispatch(daemon, [add("a", due: far), add("b", due: far)])
        try await dispatch(daemon, [#"{"complete":{"id":1}}"#])
        try await dispatch(daemon, [#"{"complete":{"id":2}}"#])
        let endpoint = ["--command-endpoint", daemon.command]
        var listing: EffectsListing?
        let dead = try await eventually(within: .seconds(20)) {
            let output = try await runProduct("lockstep", ["effects", "list", "--json"] + endpoint)
            listing = try JSONDecoder().decode(EffectsListing.self, from: Data(output.standardOutput.utf8))
            return listing?.effects.count == 2 && listing!.effects.allSatisfy { $0.phase == "dead" }
        }
        try #require(dead, "\(String(describing: listing))")
        #expect(listing!.effects.map(\.id) == ["reminders/3/1", "reminders/4/1"])
        #expect(
            listing!.effects.allSatisfy { $0.attempts == 2 && $0.lastError?.contains(notifications.path) == true },
            "\(listing!.effects)"
        )
        #expect(listing!.timers.count == 0, "both timers were cancelled by the completions")
        let status = try #require(await daemon.status())
        #expect(
            status.stores.first { $0.name == "reminders" }?.effects
                == DaemonStatus.Effects(pending: 0, dead: 2, timers: 0)
        )

        let wrong = try await runProduct("lockstep", ["effects", "retry", "reminders/9/0"] + endpoint)
        #expect(wrong.status == 64 && wrong.standardError.contains("no effect reminders/9/0"), "\(wrong)")

        try FileManager.default.removeItem(at: notifications)
        let retried = try await runProduct("lockstep", ["effects", "retry", "reminders/3/1"] + endpoint)
        #expect(retried.status == 0 && retried.standardOutput.contains("reminders/3/1"), "\(retried)")
        let dropped = try await runProduct("lockstep", ["effects", "drop", "reminders/4/1"] + endpoint)
        #expect(dropped.status == 0 && !dropped.standardOutput.contains("reminders/4/1"), "\(dropped)")
        var seen = try await read(daemon)
        let notified = try await eventually(within: .seconds(20)) {
            seen = try await read(daemon)
            return seen.state.reminder(1)?.receipt != nil
        }
        try #require(notified, "\(seen.state)")
        #expect(seen.state.reminder(2)?.receipt == nil, "dropped: never run")
        #expect(try Reminders.Notifications(directory: notifications.path).sent().count == 1)
        let after = try #require(await daemon.status()).stores.first { $0.name == "reminders" }?.effects
        #expect(after == DaemonStatus.Effects(pending: 0, dead: 0, timers: 0), "\(String(describing: after))")
        #expect(await daemon.stop() == 0)
    }
}
