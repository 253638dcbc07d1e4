import Foundation
import Lockstep
import LockstepClient
import LockstepProtocol
import LockstepTesting
import TestSupport
import Testing
import ZeroMQ

#if canImport(Glibc)
import Glibc
#endif

/// A real lockstepd with a policy (docs/security.md), tried by real processes under other OS users (made here; the
/// tests run as root, as CI does) and with other CURVE keys: every allowed and forbidden path, by request and by
/// events, and policy changes on SIGHUP.
@Suite(.serialized) struct AccessPolicyProcessTests {
    static let probe = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Interop/policy_probe.py")

    /// The OS users the tests run probes as: a member (named by user), an observer (named by a group it belongs to
    /// beside its own) and a stranger (named nowhere).
    static let member = "lockstep-t-member"
    static let observer = "lockstep-t-observer"
    static let stranger = "lockstep-t-stranger"
    static let watchers = "lockstep-t-watchers"

    static func makeUsers() throws {
        func run(_ arguments: [String]) throws {
            let output = try ChildProcess(executable: URL(fileURLWithPath: arguments[0]), Array(arguments.dropFirst()))
                .finish(within: .seconds(30))
            guard output.status == 0 else {
                throw SuiteFailure("\(arguments.joined(separator: " ")) failed: \(output.standardError)")
            }
        }
        if getgrnam(watchers) == nil { try run(["/usr/sbin/groupadd", "--system", watchers]) }
        for user in [member, observer, stranger] where getpwnam(user) == nil {
            try run(["/usr/sbin/useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "-U", user])
        }
        try run(["/usr/sbin/usermod", "-aG", watchers, observer])
    }

    struct SuiteFailure: Error, CustomStringConvertible {
        var description: String
        init(_ description: String) { self.description = description }
    }

    /// The probe's lines for `steps`, run as OS user `user` (or as root with a CURVE key).
    static func requests(
        as user: String?,
        _ endpoint: String,
        _ steps: [String],
        curve: [String] = []
    ) throws
        -> [[String: String]]
    {
        var command = ["/usr/bin/python3", probe.path, "requests", endpoint] + curve + steps
        if let user { command = ["/usr/bin/setpriv", "--reuid=\(user)", "--regid=\(user)", "--init-groups"] + command }
        let output = try ChildProcess(
            executable: URL(fileURLWithPath: command[0]),
            Array(command.dropFirst()),
            environment: ["PYTHONDONTWRITEBYTECODE": "1"]
        ).finish(within: .seconds(60))
        guard output.status == 0 else {
            throw SuiteFailure("the probe as \(user ?? "root") failed (\(output.status)): \(output.standardError)")
        }
        return output.standardOutput.split(separator: "\n").map { line in
            let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any] ?? [:]
            return object.mapValues { "\($0)" }
        }
    }

    /// A subscriber probe, connected, as `user`.
    static func subscriber(
        as user: String?,
        _ endpoint: String,
        _ stores: [String],
        curve: [String] = []
    ) throws
        -> ChildProcess
    {
        var command = ["/usr/bin/python3", probe.path, "subscribe", endpoint] + curve + stores
        if let user { command = ["/usr/bin/setpriv", "--reuid=\(user)", "--regid=\(user)", "--init-groups"] + command }
        let child = try ChildProcess(
            executable: URL(fileURLWithPath: command[0]),
            Array(command.dropFirst()),
            environment: ["PYTHONDONTWRITEBYTECODE": "1"],
            input: true
        )
        guard try lines(of: child, rounds: 600, until: { $0["ready"] != nil }) != nil else {
            throw SuiteFailure("the subscriber as \(user ?? "root") did not connect: \(child.errors())")
        }
        return child
    }

    /// Reads `child`'s JSON lines until one satisfies `done` (returned) or `rounds` reads of up to 100 ms each pass
    /// (`nil`); every line read goes to `seen`.
    @discardableResult
    static func lines(
        of child: ChildProcess,
        seen: inout [[String: String]],
        rounds: Int = 200,
        until done: ([String: String]) -> Bool
    ) throws -> [String: String]? {
        for _ in 0..<rounds {
            child.read(for: .milliseconds(100))
            for line in child.takeLines() {
                let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any] ?? [:]
                let fields = object.mapValues { "\($0)" }
                seen.append(fields)
                if done(fields) { return fields }
            }
        }
        return nil
    }

    static func lines(
        of child: ChildProcess,
        rounds: Int = 200,
        until done: ([String: String]) -> Bool
    ) throws -> [String: String]? {
        var seen: [[String: String]] = []
        return try lines(of: child, seen: &seen, rounds: rounds, until: done)
    }

    /// What the daemon's STATUS says of stores and refusals, asked as root (the policy's operator).
    static func status(_ daemon: DaemonProcess) throws -> DaemonStatus {
        guard let status = daemon.status(timeout: .seconds(5)) else { throw SuiteFailure("no STATUS") }
        return status
    }

    /// Whether the daemon's log has said `text` at least `times` times, waiting for it at most 10 s.
    static func logged(_ text: String, times: Int, by daemon: DaemonProcess) -> Bool {
        for _ in 0..<200 {
            let log = (try? String(contentsOf: daemon.log, encoding: .utf8)) ?? ""
            if log.components(separatedBy: text).count - 1 >= times { return true }
            usleep(50_000)
        }
        return false
    }

    static func seq(_ store: String, _ daemon: DaemonProcess) throws -> UInt64 {
        try status(daemon).stores.first { $0.name == store }?.seq ?? 0
    }

    static func policy(observerReads: String, observerDispatches: String) -> String {
        """
        [identities]
        member = ["user:\(member)"]
        observer = ["group:\(watchers)"]
        operator = ["uid:0"]

        [read]
        member = ["*"]
        observer = [\(observerReads)]
        operator = ["*"]

        [dispatch]
        member = ["counter", "todos:add"]
        observer = [\(observerDispatches)]
        operator = ["*"]
        """
    }

    @Test func osUsersGetWhatThePolicyGrantsAndNothingElse() async throws {
        try await offPool("policy test") { try Self.osUsers() }
    }

    static func osUsers() throws {
        try makeUsers()
        let directory = try temporaryDirectory("policy")
        defer { try? FileManager.default.removeItem(at: directory) }
        // Other users reach the sockets: a directory they may enter, sockets they may write (as UMask=0000 would
        // make them). With a policy, that is what the daemon checks instead of the file system.
        chmod(directory.path, 0o755)
        let run = directory.appendingPathComponent(".lockstep/run").path
        try FileManager.default.createDirectory(atPath: run, withIntermediateDirectories: true)
        chmod(directory.appendingPathComponent(".lockstep").path, 0o755)
        chmod(run, 0o755)
        let config = directory.appendingPathComponent("lockstepd.toml").path
        try policy(observerReads: "\"counter\"", observerDispatches: "").write(
            toFile: config,
            atomically: true,
            encoding: .utf8
        )
        // Under umask 0, as UMask=0000 in a unit would: the sockets, and the events socket made anew on a reload,
        // are open to every local user, and the policy decides.
        let daemon = try DaemonProcess(executable: URL(fileURLWithPath: "/bin/sh"), folder: directory)
        try daemon.start(arguments: [
            "-c", "umask 000 && exec \"$0\" \"$@\"", productURL("lockstepd").path, "--config", config, "--journal",
            "memory", "--domain", "counter", "--domain", "todos",
        ])
        defer { _ = daemon.stop() }
        _ = try daemon.waitUntilServing()
        let command = "ipc://\(run)/command"
        let events = "ipc://\(run)/events"

        // The observer subscribes to both stores before anything happens; the daemon refuses todos (counted).
        let watching = try subscriber(as: observer, events, ["todos", "counter"])
        defer { watching.kill() }
        let member = try subscriber(as: Self.member, events, ["todos", "counter"])
        defer { member.kill() }
        var forbiddenSubscriptions: UInt64 = 0
        for _ in 0..<100 where forbiddenSubscriptions == 0 {
            forbiddenSubscriptions = try status(daemon).refused?["forbidden"] ?? 0
            if forbiddenSubscriptions == 0 { usleep(50_000) }
        }
        #expect(forbiddenSubscriptions == 1, "the observer's subscription to todos was refused and counted")

        let memberSaid = try requests(
            as: Self.member,
            command,
            [
                "dispatch:counter:{\"increment\":{}}", "dispatch:todos:{\"add\":{\"text\":\"mine\"}}",
                "dispatch:todos:{\"toggle\":{\"id\":1}}", "snapshot:todos", "range:todos:1:1",
            ]
        )
        #expect(memberSaid.map { $0["reply"] ?? "" } == ["accepted", "accepted", "error", "snapshot", "range"])
        #expect(memberSaid[2]["code"] == "forbidden")
        #expect(memberSaid[4]["authors"] == "member", "the journal keeps who dispatched each action")
        #expect(
            memberSaid[2]["reason"]?.contains("identity 'member' may not dispatch action 'toggle' to store 'todos'")
                == true
        )

        let observerSaid = try requests(
            as: observer,
            command,
            [
                "snapshot:counter", "range:counter:1:1", "snapshot:todos", "range:todos:1:1",
                "dispatch:counter:{\"increment\":{}}", "status",
            ]
        )
        #expect(observerSaid.map { $0["reply"] ?? "" } == ["snapshot", "range", "error", "error", "error", "status"])
        #expect(observerSaid[2...4].allSatisfy { $0["code"] == "forbidden" })
        #expect(observerSaid[2]["reason"]?.contains("identity 'observer' may not read store 'todos'") == true)
        #expect(observerSaid[4]["reason"]?.contains("may not dispatch to store 'counter'") == true)

        let strangerSaid = try requests(
            as: stranger,
            command,
            ["status", "snapshot:counter", "dispatch:counter:{\"increment\":{}}"]
        )
        #expect(strangerSaid.map { $0["reply"] ?? "" } == ["status", "error", "error"])
        #expect(strangerSaid[1]["reason"]?.contains("whom the daemon's policy names nowhere") == true)

        // Only what was granted was sequenced: one counter action, one todo.
        #expect(try seq("counter", daemon) == 1)
        #expect(try seq("todos", daemon) == 1)
        #expect(try status(daemon).refused?["forbidden"] == 1 + 1 + 3 + 2)

        // Events: the member saw both stores' events; the observer saw counter's, and nothing of todos — its
        // connection delivers in order, so a todos event would have come before counter's.
        var seenByMember: [[String: String]] = []
        let todo = try lines(of: member, seen: &seenByMember) { $0["store"] == "todos" && $0["type"] == "event" }
        #expect(todo?["author"] == "member", "an event carries its author")
        var seenByObserver: [[String: String]] = []
        #expect(
            try lines(of: watching, seen: &seenByObserver) { $0["store"] == "counter" && $0["type"] == "event" } != nil
        )
        #expect(!seenByObserver.contains { $0["store"] == "todos" })

        // SIGHUP: the observer may now increment; nobody's read narrowed, so the subscribers stay connected.
        try policy(observerReads: "\"counter\"", observerDispatches: "\"counter:increment\"").write(
            toFile: config,
            atomically: true,
            encoding: .utf8
        )
        daemon.signal(SIGHUP)
        #expect(logged("reloaded the policy", times: 1, by: daemon), "no reload in \(daemon.log.path)")
        let reloadedSaid = try requests(
            as: observer,
            command,
            ["dispatch:counter:{\"increment\":{}}", "dispatch:counter:{\"decrement\":{}}"]
        )
        #expect(reloadedSaid[0]["reply"] == "accepted", "the reloaded policy lets the observer increment")
        #expect(reloadedSaid[1]["code"] == "forbidden")
        #expect(
            try lines(of: member, seen: &seenByMember) { $0["store"] == "counter" && $0["seq"] == "2" }?["author"]
                == "observer"
        )
        #expect(try lines(of: watching, seen: &seenByObserver) { $0["store"] == "counter" && $0["seq"] == "2" } != nil)

        // SIGHUP again: the observer reads todos instead of counter. Its subscription to counter goes (the events
        // socket is made anew and every subscriber subscribes again, checked); the member's come back by themselves.
        try policy(observerReads: "\"todos\"", observerDispatches: "").write(
            toFile: config,
            atomically: true,
            encoding: .utf8
        )
        let before = try seq("counter", daemon)
        daemon.signal(SIGHUP)
        #expect(logged("made the events socket anew", times: 1, by: daemon), "no new events socket")
        // Until the observer sees a todos event: each round a counter action then a todos action, by the operator
        // (this process, root), from here.
        let context = try Context()
        let operatorClient = try Client(context, endpoint: command)
        // Its own bound: in a full run's busy first minute a dispatch has taken seconds.
        try operatorClient.socket.set(.receiveTimeout, 60_000)
        var sawTodos = false
        for round in 0..<50 where !sawTodos {
            for (store, action) in [
                ("counter", #"{"increment":{}}"#), ("todos", #"{"add":{"text":"round \#(round)"}}"#),
            ] {
                guard
                    case .accepted = try operatorClient.dispatch(
                        store,
                        [action],
                        number: UInt64(2 * round + 1 + (store == "todos" ? 1 : 0))
                    )
                else {
                    Issue.record("the operator's \(store) dispatch was not accepted")
                    return
                }
            }
            sawTodos = try lines(of: watching, seen: &seenByObserver, rounds: 5) { $0["store"] == "todos" } != nil
        }
        #expect(sawTodos, "the observer, now a reader of todos, gets its events")
        let leaked = seenByObserver.filter { $0["store"] == "counter" && (UInt64($0["seq"] ?? "") ?? 0) > before }
        #expect(leaked.isEmpty, "counter events after the observer lost counter: \(leaked)")
        let after = try seq("counter", daemon)
        #expect(
            try lines(of: member, seen: &seenByMember) { $0["store"] == "counter" && $0["seq"] == "\(after)" } != nil,
            "the member's subscriber, narrowed in nothing, receives on"
        )

        // SIGHUP a third time, widening only: the observer may read counter again. The subscription to counter it
        // made at the start was refused and libzmq sends it no more, so the events socket is made anew for this too:
        // the observer subscribes again and now gets counter's events.
        try policy(observerReads: "\"todos\", \"counter\"", observerDispatches: "").write(
            toFile: config,
            atomically: true,
            encoding: .utf8
        )
        daemon.signal(SIGHUP)
        #expect(logged("made the events socket anew", times: 2, by: daemon), "no new events socket for a widening")
        var sawCounter = false
        for round in 0..<50 where !sawCounter {
            guard
                case .accepted = try operatorClient.dispatch(
                    "counter",
                    [#"{"increment":{}}"#],
                    number: 1_000 + UInt64(round)
                )
            else {
                Issue.record("the operator's counter dispatch was not accepted")
                return
            }
            sawCounter =
                try lines(of: watching, seen: &seenByObserver, rounds: 5) {
                    $0["store"] == "counter" && $0["type"] == "event" && (UInt64($0["seq"] ?? "") ?? 0) > after
                } != nil
        }
        #expect(sawCounter, "the observer, a reader of counter again, gets its events without reconnecting itself")
    }

    @Test func curveKeysAreIdentitiesToo() async throws {
        try await offPool("curve policy test") { try Self.curveKeys() }
    }

    static func curveKeys() throws {
        let directory = try temporaryDirectory("policy-curve").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let server = try CurveKeyPair.generate()
        let writer = try CurveKeyPair.generate()
        let reader = try CurveKeyPair.generate()
        let keyFile = "\(directory)/server.key"
        _ = FileManager.default.createFile(
            atPath: keyFile,
            contents: Data((Z85.encode(server.secretKey) + "\n").utf8),
            attributes: [.posixPermissions: 0o600]
        )
        try "\(Z85.encode(writer.publicKey))\n\(Z85.encode(reader.publicKey))\n".write(
            toFile: "\(directory)/clients",
            atomically: true,
            encoding: .utf8
        )
        let port = Int.random(in: 30_000..<60_000)
        let config = """
            command_endpoint = "tcp://127.0.0.1:\(port)"
            events_endpoint = "tcp://127.0.0.1:\(port + 1)"
            [curve]
            server_key_file = "\(keyFile)"
            allowed_clients_file = "\(directory)/clients"
            [identities]
            writer = ["key:\(Z85.encode(writer.publicKey))"]
            reader = ["key:\(Z85.encode(reader.publicKey))"]
            [read]
            writer = ["*"]
            reader = ["counter"]
            [dispatch]
            writer = ["*"]
            """
        try config.write(toFile: "\(directory)/lockstepd.toml", atomically: true, encoding: .utf8)
        let command = "tcp://127.0.0.1:\(port)"
        let daemon = try DaemonProcess(
            executable: productURL("lockstepd"),
            folder: URL(fileURLWithPath: directory),
            command: command,
            events: "tcp://127.0.0.1:\(port + 1)",
            curve: ClientCurve(keys: writer, serverPublicKey: server.publicKey)
        )
        try daemon.start(arguments: [
            "--config", "\(directory)/lockstepd.toml", "--journal", "memory", "--domain", "counter", "--domain",
            "todos",
        ])
        defer { _ = daemon.stop() }
        _ = try daemon.waitUntilServing()
        func curve(_ keys: CurveKeyPair) -> [String] {
            ["--curve", Z85.encode(server.publicKey), Z85.encode(keys.publicKey), Z85.encode(keys.secretKey)]
        }
        let watching = try subscriber(
            as: nil,
            "tcp://127.0.0.1:\(port + 1)",
            ["todos", "counter"],
            curve: curve(reader)
        )
        defer { watching.kill() }
        let writerSaid = try requests(
            as: nil,
            command,
            ["dispatch:todos:{\"add\":{\"text\":\"a\"}}", "dispatch:counter:{\"increment\":{}}"],
            curve: curve(writer)
        )
        #expect(writerSaid.map { $0["reply"] ?? "" } == ["accepted", "accepted"])
        let readerSaid = try requests(
            as: nil,
            command,
            ["snapshot:counter", "snapshot:todos", "dispatch:counter:{\"increment\":{}}"],
            curve: curve(reader)
        )
        #expect(readerSaid.map { $0["reply"] ?? "" } == ["snapshot", "error", "error"])
        #expect(readerSaid[1]["reason"]?.contains("identity 'reader' may not read store 'todos'") == true)
        var seen: [[String: String]] = []
        // The subscription may have come after the first dispatches: until a counter event reaches it, more come.
        var sawCounter = false
        for _ in 0..<20 where !sawCounter {
            sawCounter =
                try lines(of: watching, seen: &seen, rounds: 10) { $0["store"] == "counter" && $0["type"] == "event" }
                != nil
            if !sawCounter {
                _ = try requests(
                    as: nil,
                    command,
                    ["dispatch:todos:{\"add\":{\"text\":\"b\"}}", "dispatch:counter:{\"increment\":{}}"],
                    curve: curve(writer)
                )
            }
        }
        #expect(sawCounter)
        #expect(
            !seen.contains { $0["store"] == "todos" },
            "todos events reached a key that may not read todos: \(seen)"
        )
    }
}
