import Foundation
import Lockstep
import LockstepJournal
import LockstepProtocol
import LockstepTesting
import TestSupport
import Testing
import ZeroMQ

#if canImport(Glibc)
import Glibc
#endif

extension DaemonProcess {
    /// A daemon of this package's `executable`, started at once in `directory`: the tests' usual case. It is
    /// killed, if it still runs, when the test releases it.
    convenience init(
        directory: String,
        arguments: [String] = [],
        environment: [String: String] = [:],
        executable: String = "lockstepd"
    ) throws {
        try self.init(executable: productURL(executable), folder: URL(fileURLWithPath: directory))
        try start(arguments: arguments, environment: environment)
    }
}

/// A REQ client speaking the wire protocol with bounded waits.
struct Client {
    let socket: Socket
    let clientID: ClientID

    init(_ context: Context, endpoint: String, clientID: ClientID = .random()) throws {
        self.clientID = clientID
        socket = try Socket(context, type: .request)
        try socket.set(.receiveTimeout, 5_000)
        try socket.set(.sendTimeout, 5_000)
        try socket.connect(endpoint)
    }

    func call(_ body: [Frame]) throws -> Reply {
        try socket.send(body)
        guard let reply = try socket.receive() else { throw ClientTimeout() }
        return try Reply.decode(reply)
    }

    func dispatch(_ store: String, _ actions: [String], number: UInt64) throws -> Reply {
        try call(
            Request.dispatch(
                DispatchRequest(
                    requestID: number,
                    domainVersion: 1,
                    clientID: clientID,
                    store: try StoreName(store),
                    actions: actions.map { Array($0.utf8) }
                )
            ).encode()
        )
    }
}

struct ClientTimeout: Error {}

@Suite struct DaemonProcessTests {
    func temporaryDirectory() throws -> String {
        try TestSupport.temporaryDirectory("lockstepd").path
    }

    @Test func servesRemembersAndStopsCleanly() async throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let context = try Context()
        var daemon = try DaemonProcess(directory: directory, arguments: ["--domain", "counter", "--domain", "numbers"])

        let events = try Socket(context, type: .subscriber)
        try events.set(.receiveTimeout, 5_000)
        try events.subscribe(Event.topic(for: try StoreName("counter")))
        try events.connect(daemon.events)
        let client = try Client(context, endpoint: daemon.command)

        // The first request waits for the daemon to bind, and the events for its heartbeats: off the pool.
        let accepted = try await offPool("dispatch", lending: client) {
            try $0.dispatch("counter", [#"{"increment":{}}"#, #"{"increment":{}}"#], number: 1)
        }
        guard case let .accepted(_, epoch, firstSeq, count) = accepted else {
            Issue.record("expected ACCEPTED, got \(accepted); log:\n\(daemon.output)")
            return
        }
        #expect(firstSeq == 1 && count == 2)
        // Events follow the ack (the subscription may miss the first ones while it connects; heartbeats come).
        let seen = try await offPool("events", lending: events) { events in
            var seen: [Event] = []
            let deadline = ContinuousClock.now + .seconds(5)
            while ContinuousClock.now < deadline,
                !seen.contains(where: { if case .heartbeat = $0 { true } else { false } })
            {
                guard let frames = try events.receive() else { break }
                seen.append(try Event.decode(frames))
            }
            return seen
        }
        #expect(seen.contains(.heartbeat(store: try StoreName("counter"), epoch: epoch, lastSeq: 2)), "\(seen)")

        // A retry gets the first reply; garbage gets an error and changes nothing.
        #expect(try client.dispatch("counter", [#"{"increment":{}}"#, #"{"increment":{}}"#], number: 1) == accepted)
        guard case let .error(_, garbage) = try client.call([Array("garbage".utf8)]) else {
            Issue.record("expected ERROR for garbage")
            return
        }
        #expect(garbage.code == .malformed)
        guard
            case let .rejected(_, index, rejection) = try client.dispatch(
                "numbers",
                [#"{"delete":{"index":3}}"#],
                number: 2
            )
        else {
            Issue.record("expected REJECTED")
            return
        }
        #expect(index == 0 && rejection.code == "out_of_range")

        #expect(await daemon.stop() == 0, "\(daemon.output)")

        // After a restart: the same state and epoch, and the retry still gets its first reply.
        daemon = try DaemonProcess(directory: directory, arguments: ["--domain", "counter", "--domain", "numbers"])
        let again = try Client(context, endpoint: daemon.command)
        let counter = try StoreName("counter")
        let first = try await offPool("snapshot", lending: again) {
            try $0.call(Request.snapshot(requestID: 5, store: counter).encode())
        }
        guard case let .snapshot(_, snapshot) = first else {
            Issue.record("expected SNAPSHOT; log:\n\(daemon.output)")
            return
        }
        #expect(snapshot.seq == 2 && snapshot.epoch == epoch)
        #expect(snapshot.state == Array(#"{"count":2}"#.utf8))
        #expect(snapshot.digest == StateDigest(of: snapshot.state))
        let retry = try Client(context, endpoint: daemon.command)
        let sameKey = try retry.call(
            Request.dispatch(
                DispatchRequest(
                    requestID: 1,
                    domainVersion: 1,
                    clientID: client.clientID,
                    store: try StoreName("counter"),
                    actions: [Array(#"{"increment":{}}"#.utf8), Array(#"{"increment":{}}"#.utf8)]
                )
            ).encode()
        )
        #expect(sameKey == accepted)
        guard
            case let .range(_, _, _, first, actions, _) = try again.call(
                Request.range(requestID: 6, store: try StoreName("counter"), from: 1, to: 9).encode()
            )
        else {
            Issue.record("expected RANGE")
            return
        }
        #expect(first == 1 && actions.count == 2)

        // `lockstep stats` finds it and reports the store's seq.
        let stats = try await runProduct("lockstep", ["stats", "--json", "--command-endpoint", daemon.command])
        #expect(stats.status == 0, "\(stats.standardError)")
        let status = try JSONSerialization.jsonObject(with: Data(stats.standardOutput.utf8)) as? [String: Any]
        let stores = status?["stores"] as? [[String: Any]]
        #expect(stores?.first { $0["name"] as? String == "counter" }?["seq"] as? Int == 2)
        #expect(await daemon.stop() == 0, "\(daemon.output)")
    }

    @Test func systemdHearsReadyThenWatchdogThenStopping() async throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let systemd = try SystemdNotifierTests.FakeSystemd(abstract: true)
        let daemon = try DaemonProcess(
            directory: directory,
            arguments: ["--domain", "counter", "--journal", "memory"],
            environment: ["NOTIFY_SOCKET": systemd.name, "WATCHDOG_USEC": "200000"]
        )
        // The receives and the stop run back to back on a thread of their own, as systemd reads: the socket's queue
        // is short (net.unix.max_dgram_qlen, often 10), and a daemon whose WATCHDOG=1 finds it full blocks in
        // sendto, so a wait for a thread of the cooperative pool between them would stall its stop. The test checks
        // what came; the messages after the stop are read only if the stop was clean, as the test goes on only then.
        let heard = await offPool("systemd", lending: (systemd, daemon)) { lent in
            let (systemd, daemon) = lent
            let first = (0..<3).map { _ in systemd.receive() }
            let stopped = daemon.stop()
            var before: [String] = []
            var sawStopping = false
            while stopped == 0, let message = systemd.receive() {
                if message == "STOPPING=1" {
                    sawStopping = true
                    break
                }
                before.append(message)
            }
            return (first: first, stopped: stopped, before: before, sawStopping: sawStopping)
        }
        let ready = heard.first[0]
        #expect(ready?.hasPrefix("READY=1") == true, "\(String(describing: ready)); log:\n\(daemon.output)")
        #expect(heard.first[1] == "WATCHDOG=1")
        #expect(heard.first[2] == "WATCHDOG=1")
        try #require(heard.stopped == 0)
        for message in heard.before {
            #expect(message == "WATCHDOG=1")
        }
        let sawStopping = heard.sawStopping
        #expect(sawStopping)
    }

    /// Dispatches 20 increments of the counter, numbered 1…20; false, with an issue recorded, if one was refused.
    /// The dispatches (the first waits for the daemon to bind) run on a thread of their own.
    func twentyIncrements(_ daemon: DaemonProcess, _ context: Context) async throws -> Bool {
        let endpoint = daemon.command
        let refused = try await offPool("increments") { () throws -> UInt64? in
            let client = try Client(context, endpoint: endpoint)
            for number: UInt64 in 1...20 {
                guard case .accepted = try client.dispatch("counter", [#"{"increment":{}}"#], number: number) else {
                    return number
                }
            }
            return nil
        }
        if let number = refused {
            Issue.record("dispatch \(number) was not accepted; log:\n\(daemon.output)")
            return false
        }
        return true
    }

    /// The counter store's SNAPSHOT reply, or `nil` with an issue recorded; asked on a thread of its own.
    func counterSnapshot(_ daemon: DaemonProcess, _ context: Context) async throws -> SnapshotReply? {
        let endpoint = daemon.command
        let reply = try await offPool("snapshot") {
            try Client(context, endpoint: endpoint).call(
                Request.snapshot(requestID: 1, store: try StoreName("counter")).encode()
            )
        }
        guard case let .snapshot(_, snapshot) = reply else {
            Issue.record("expected SNAPSHOT; log:\n\(daemon.output)")
            return nil
        }
        return snapshot
    }

    @Test func relaxedDurabilityServesAndKeepsWhatItAcknowledgedAcrossARestart() async throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let context = try Context()
        let arguments = ["--domain", "counter", "--durability", "relaxed"]
        var daemon = try DaemonProcess(directory: directory, arguments: arguments)
        guard try await twentyIncrements(daemon, context) else { return }
        #expect(await daemon.stop() == 0)
        daemon = try DaemonProcess(directory: directory, arguments: arguments)
        let snapshot = try await counterSnapshot(daemon, context)
        #expect(snapshot?.seq == 20)
        #expect(await daemon.stop() == 0)
    }

    /// `--journal postgres`: what a daemon acknowledged is in the database, whichever folder the next daemon runs
    /// in; a second daemon on the same database while the first runs stands by (FailoverProcessTests), and the
    /// next daemon takes the lease the first let go when it stopped at once.
    @Test func aPostgresJournalKeepsWhatItAcknowledgedAndTakesOneDaemon() async throws {
        let server = try await PostgresServer.start()
        // After a failure; otherwise the stop at the end, which waits off the cooperative pool, has done it.
        defer { server.stop() }
        let connection = try server.createDatabase()
        let first = try temporaryDirectory()
        let second = try temporaryDirectory()
        defer {
            try? FileManager.default.removeItem(atPath: first)
            try? FileManager.default.removeItem(atPath: second)
        }
        let context = try Context()
        let arguments = ["--domain", "counter", "--journal", "postgres", "--postgres", connection]
        var daemon = try DaemonProcess(directory: first, arguments: arguments)
        guard try await twentyIncrements(daemon, context) else { return }
        let rival = try DaemonProcess(directory: second, arguments: arguments)
        #expect(try await rival.waitUntilServing().role == "standby", "\(rival.output)")
        #expect(await rival.stop() == 0)
        #expect(await daemon.stop() == 0)

        daemon = try DaemonProcess(directory: second, arguments: arguments)
        let snapshot = try await counterSnapshot(daemon, context)
        #expect(snapshot?.seq == 20)
        #expect(snapshot.map { String(decoding: $0.state, as: UTF8.self) } == #"{"count":20}"#)
        #expect(await daemon.stop() == 0)
        await server.stop()
    }

    @Test func fourClientProcessesAndThreeSubscribersAgreeOnOneGapFreeSequence() async throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let context = try Context()
        let daemon = try DaemonProcess(directory: directory, arguments: ["--domain", "counter"])
        let topic = Event.topic(for: try StoreName("counter"))
        let subscribers = try (0..<3).map { _ in
            let socket = try Socket(context, type: .subscriber)
            try socket.set(.receiveTimeout, 5_000)
            try socket.set(.receiveHighWaterMark, 0)
            try socket.subscribe(topic)
            try socket.connect(daemon.events)
            return socket
        }
        // Each subscription is live once it has seen a heartbeat; only then may clients start. The receives wait
        // on a thread of their own, up to the first subscriber that saw none.
        let lives = try await offPool("heartbeats", lending: subscribers) { subscribers in
            var lives: [Bool] = []
            for socket in subscribers where !lives.contains(false) {
                var live = false
                while !live, let frames = try socket.receive() {
                    if case .heartbeat = try Event.decode(frames) { live = true }
                }
                lives.append(live)
            }
            return lives
        }
        for live in lives {
            try #require(live, "a subscriber saw no heartbeat; log:\n\(daemon.output)")
        }

        let perClient = 100
        let clients = try (0..<4).map { _ in
            try ChildProcess(
                "lockstep",
                [
                    "dispatch", "counter", #"{"increment":{}}"#, "--repeat", "\(perClient)", "--json",
                    "--command-endpoint", daemon.command,
                ]
            )
        }
        var acknowledged: [UInt64] = []
        for client in clients {
            let result = try await client.finish(within: .seconds(60))
            #expect(result.status == 0, "\(result.standardError)")
            for line in result.standardOutput.split(separator: "\n") {
                let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
                if let seq = object?["seq"] as? Int { acknowledged.append(UInt64(seq)) }
            }
        }
        let total = UInt64(4 * perClient)
        #expect(acknowledged.sorted() == Array(1...total))

        let received = try await offPool("events", lending: subscribers) { subscribers in
            try subscribers.map { socket in
                var seqs: [UInt64] = []
                // Heartbeats keep arriving, so a lost event must end the wait by the deadline, not by silence.
                let deadline = ContinuousClock.now + .seconds(30)
                while seqs.count < Int(total), ContinuousClock.now < deadline, let frames = try socket.receive() {
                    if case let .event(_, _, seq, _, _) = try Event.decode(frames) { seqs.append(seq) }
                }
                return seqs
            }
        }
        for (index, seqs) in received.enumerated() {
            #expect(seqs == Array(1...total), "subscriber \(index) saw \(seqs.count) events")
        }

        // SIGTERM drains and exits 0, and every acknowledged action is in the journal.
        #expect(await daemon.stop() == 0)
        let journal = try openLocalJournal(directory: "\(directory)/.lockstep/data", readOnly: true)
        defer { try? journal.close() }
        guard case let .events(events) = try journal.events(store: "counter", from: 1, to: total, limit: 10_000) else {
            Issue.record("the journal's history was compacted")
            return
        }
        #expect(events.map(\.seq) == Array(1...total))
    }

    /// A new data directory gets the log journal; `lockstep journal backup` copies it while the daemon serves and a
    /// client dispatches; the copy verifies, and a daemon started on it serves the counter from where the copy was
    /// taken: at least what was acknowledged before the backup began, at most what was by the end.
    @Test func aBackupTakenWhileTheDaemonServesStartsADaemonOfItsOwn() async throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // A snapshot every 20 events: the copy has snapshot files to take.
        let configuration = "\(directory)/lockstepd.toml"
        try "[snapshots]\nevery_events = 20\n".write(toFile: configuration, atomically: true, encoding: .utf8)
        let daemon = try DaemonProcess(
            directory: directory,
            arguments: ["--domain", "counter", "--config", configuration]
        )
        try await daemon.waitUntilServing()
        let data = "\(directory)/.lockstep/data"
        #expect(LogJournal.exists(in: data) && !SQLiteJournal.exists(in: data))
        let dispatch = ["dispatch", "counter", #"{"increment":{}}"#, "--json", "--command-endpoint", daemon.command]
        let before = try await runProduct("lockstep", dispatch + ["--repeat", "50"], timeout: .seconds(60))
        #expect(before.status == 0, "\(before.standardError)")
        let client = try ChildProcess("lockstep", dispatch + ["--repeat", "300"])
        let copy = "\(directory)/copy"
        let backup = try await runProduct("lockstep", ["journal", "backup", data, copy], timeout: .seconds(60))
        #expect(backup.status == 0, "\(backup.standardError)")
        #expect(backup.standardOutput.contains("intact"), "\(backup.standardOutput)")
        let snapshots = (try? FileManager.default.contentsOfDirectory(atPath: "\(copy)/snapshots")) ?? []
        #expect(!snapshots.isEmpty && snapshots.allSatisfy { $0.hasSuffix(".snap") }, "\(snapshots)")
        let during = try await client.finish(within: .seconds(60))
        #expect(during.status == 0, "\(during.standardError)")
        #expect(await daemon.stop() == 0)
        // A second backup into the same directory is refused: it is not empty.
        let again = try await runProduct("lockstep", ["journal", "backup", data, copy], timeout: .seconds(60))
        #expect(again.status == 1)
        #expect(again.standardError.contains("is not empty"), "\(again.standardError)")

        let restored = try DaemonProcess(
            directory: "\(directory)/restored",
            arguments: ["--domain", "counter", "--data-dir", copy]
        )
        let status = try await restored.waitUntilServing()
        let seq = try #require(status.stores.first { $0.name == "counter" }?.seq)
        #expect((50...350).contains(seq), "the copy's daemon serves the counter at seq \(seq)")
        #expect(await restored.stop() == 0)
    }

    @Test func stateAndTailWorkForAnyStoreWithoutItsDomain() async throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let daemon = try DaemonProcess(directory: directory, arguments: ["--domain", "todos"])
        try await daemon.waitUntilServing()
        func run(_ arguments: [String]) async throws -> (status: Int32, output: String) {
            let result = try await runProduct("lockstep", arguments, timeout: .seconds(30))
            return (result.status, result.standardOutput)
        }
        let tail = try ChildProcess(
            "lockstep",
            ["tail", "todos", "--count", "2", "--json", "--events-endpoint", daemon.events]
        )
        // The subscription needs a moment to reach the daemon; dispatch until tail has seen two events.
        var number = 0
        _ = try await eventually(within: .seconds(30), every: .milliseconds(50)) {
            guard tail.process.isRunning else { return true }
            number += 1
            let sent = try await run([
                "dispatch", "todos", #"{"add":{"text":"item \#(number)"}}"#, "--command-endpoint", daemon.command,
            ])
            #expect(sent.status == 0)
            return false
        }
        #expect(!tail.process.isRunning, "tail saw fewer than 2 of \(number) events; daemon log:\n\(daemon.output)")
        let lines = try await tail.finish(within: .seconds(5)).standardOutput.split(separator: "\n")
        #expect(lines.count == 2)
        try #require(!lines.isEmpty)
        let first = try JSONSerialization.jsonObject(with: Data(lines[0].utf8)) as? [String: Any]
        #expect((first?["action"] as? [String: Any])?["add"] != nil)

        let state = try await run(["state", "todos", "--json", "--command-endpoint", daemon.command])
        #expect(state.status == 0)
        let object = try JSONSerialization.jsonObject(with: Data(state.output.utf8)) as? [String: Any]
        #expect(object?["seq"] as? Int == number)
        let items = ((object?["state"] as? [String: Any])?["list"] as? [String: Any])?["items"] as? [Any]
        #expect(items?.count == number)
        #expect(await daemon.stop() == 0)
    }
}
