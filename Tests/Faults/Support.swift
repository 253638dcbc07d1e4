import Foundation
import Lockstep
import LockstepClient
import LockstepJournal
import LockstepProtocol
import LockstepTesting
import ZeroMQ

#if canImport(Glibc)
import Glibc
#endif

/// The suite failed to set something up (not a fault the daemon failed to survive).
struct SuiteError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// This package's executables, next to the suite's own.
enum Binaries {
    static let directory = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
    static let lockstepd = directory.appendingPathComponent("lockstepd")
    static let lockstep = directory.appendingPathComponent("lockstep")
}

/// A `lockstepd` in `folder` with the suite's configuration file, on its default endpoints there: the one
/// ``DaemonProcess`` launcher, plus the journal's place and each store's digest.
final class Daemon {
    let process: DaemonProcess
    let configuration: String
    /// The journal's directory.
    let data: String

    /// A daemon in `folder`; with `host`, run on that test host (its ipc endpoints, in `folder`, reach it from any
    /// namespace: only its tcp connections, PostgreSQL's, go through the host's network). `endpoints`: where
    /// `configuration` binds its command and events sockets, when not at the defaults in `folder`.
    init(
        folder: URL,
        configuration: String = "",
        environment: [String: String] = [:],
        data: String? = nil,
        host: (hosts: TestHosts, name: String)? = nil,
        endpoints: (command: String, events: String)? = nil,
        curve: ClientCurve? = nil
    ) throws {
        let arguments = ["--config", "lockstepd.toml", "--log-level", "notice"]
        let (executable, wrapped) =
            host.map { $0.hosts.command(on: $0.name, Binaries.lockstepd, arguments) }
            ?? (Binaries.lockstepd, arguments)
        process = try DaemonProcess(
            executable: executable,
            folder: folder,
            arguments: wrapped,
            environment: environment,
            command: endpoints?.command,
            events: endpoints?.events,
            curve: curve
        )
        self.data = data ?? "\(folder.path)/.lockstep/data"
        self.configuration = configuration
        try configuration.write(to: folder.appendingPathComponent("lockstepd.toml"), atomically: true, encoding: .utf8)
    }

    var command: String { process.command }
    var events: String { process.events }
    var isRunning: Bool { process.isRunning }
    var log: URL { process.log }
    /// What the current (or last) start has written to its log so far.
    var output: String { process.output }
    func signal(_ signal: Int32) { process.signal(signal) }
    func kill() { process.kill() }
    @discardableResult func stop() -> Int32? { process.stop() }
    func memory() -> (residentKiB: Int, peakKiB: Int) { process.memory() }
    /// Its STATUS, if it answers within `timeout`.
    func status(timeout: Duration = .milliseconds(300)) -> DaemonStatus? { process.status(timeout: timeout) }

    /// Starts it (with extra environment) and waits until it answers, at most 15 s; or, with `waitForReady`
    /// false, returns at once.
    func start(environment extra: [String: String] = [:], arguments: [String] = [], waitForReady: Bool = true) throws {
        try process.start(arguments: arguments, environment: extra)
        if waitForReady { try process.waitUntilServing(within: .seconds(15)) }
    }

    /// Its STATUS once `condition` holds of it, asked every 20 ms by a wait that holds this thread (an answer's own
    /// wait is at most 300 ms); `nil` if it did not within `timeout`.
    func waitForStatus(within timeout: Duration, until condition: (DaemonStatus) -> Bool) -> DaemonStatus? {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if let status = status(), condition(status) { return status }
            Thread.sleep(forTimeInterval: 0.02)
        }
        return nil
    }

    /// SIGSTOP, and a wait until every thread of it has stopped (at most 2 s; false if one had not): the kernel
    /// stops a process's threads after `kill` returns, and on a busy machine they may run on for milliseconds —
    /// long enough to take and commit a request meant to find it stopped.
    func pause() -> Bool {
        signal(SIGSTOP)
        let tasks = "/proc/\(process.processIdentifier)/task"
        let deadline = ContinuousClock.now + .seconds(2)
        while ContinuousClock.now < deadline {
            let threads = (try? FileManager.default.contentsOfDirectory(atPath: tasks)) ?? []
            let states = threads.compactMap { thread in
                // The state is the field after the name, which is in parentheses and may hold spaces.
                (try? String(contentsOfFile: "\(tasks)/\(thread)/stat", encoding: .utf8))
                    .flatMap { $0.split(separator: ")").last?.split(separator: " ").first }
            }
            if !states.isEmpty, states.allSatisfy({ $0 == "T" }) { return true }
            Thread.sleep(forTimeInterval: 0.001)
        }
        return false
    }

    /// Each store's (seq, digest) from its snapshot.
    func digests(_ stores: [String]) throws -> [String: Digest] {
        try process.digests(of: stores).mapValues { Digest(seq: $0.seq, digest: $0.digest.hex) }
    }
}

/// CURVE for a class whose daemons serve tcp: the daemons' key pair and one client's, in files as lockstepd and the
/// tool read them (mode 0600 for the secret keys), the client listed in the daemons' allowed clients file.
struct SuiteCurve {
    let server: CurveKeyPair
    let client: CurveKeyPair
    let serverKeyFile: String
    let clientKeyFile: String
    let clientsFile: String

    init(in folder: URL) throws {
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        server = try CurveKeyPair.generate()
        client = try CurveKeyPair.generate()
        serverKeyFile = folder.appendingPathComponent("server.key").path
        clientKeyFile = folder.appendingPathComponent("client.key").path
        clientsFile = folder.appendingPathComponent("clients").path
        for (path, keys) in [(serverKeyFile, server), (clientKeyFile, client)] {
            guard
                FileManager.default.createFile(
                    atPath: path,
                    contents: Data((Z85.encode(keys.secretKey) + "\n").utf8),
                    attributes: [.posixPermissions: 0o600]
                )
            else { throw SuiteError("cannot write \(path)") }
        }
        try "\(Z85.encode(client.publicKey))\n".write(toFile: clientsFile, atomically: true, encoding: .utf8)
    }

    /// The daemons' `[curve]` section.
    var configuration: String {
        "[curve]\nserver_key_file = \"\(serverKeyFile)\"\nallowed_clients_file = \"\(clientsFile)\"\n"
    }

    /// What the suite's own clients use.
    var clientCurve: ClientCurve { ClientCurve(keys: client, serverPublicKey: server.publicKey) }

    /// What a `lockstep` process is given.
    var toolArguments: [String] {
        ["--curve-server-key", Z85.encode(server.publicKey), "--curve-key-file", clientKeyFile]
    }
}

struct Digest: Hashable, CustomStringConvertible {
    var seq: SequenceNumber
    var digest: String
    var description: String { "seq \(seq) \(digest.prefix(12))" }
}

extension CommandClient {
    /// Dispatches `count` copies of `action` to `store` as request `number` of `clientID`.
    func dispatch(
        _ store: String,
        _ action: String,
        count: Int = 1,
        number: UInt64,
        clientID: ClientID
    ) throws
        -> Reply
    {
        let request = DispatchRequest(
            requestID: number,
            domainVersion: 1,
            clientID: clientID,
            store: try StoreName(store),
            actions: Array(repeating: Array(action.utf8), count: count)
        )
        return try call(.dispatch(request))
    }

    /// The same, for set-up: anything but ACCEPTED stops the fault class.
    func mustAccept(_ store: String, _ action: String, count: Int = 1, number: UInt64, clientID: ClientID) throws {
        let reply = try dispatch(store, action, count: count, number: number, clientID: clientID)
        guard case .accepted = reply else { throw SuiteError("the daemon answered a set-up dispatch with \(reply)") }
    }
}

/// An acknowledged dispatch: the todo's text and the seq the daemon answered with.
struct Ack: Hashable {
    var text: String
    var seq: SequenceNumber
}

/// Client threads adding todos with unique texts through Lazy Pirate clients, keeping every acknowledgement. Given
/// several daemons' command endpoints (a leader and its standbys), each client finds the leader by asking.
// Shared between threads without the compiler's check, and why that is sound: every stored property is a `let`,
// and the one that changes, `shared`, is a `LockedValue`, read and written only inside `withLockedValue`.
final class Load: @unchecked Sendable {
    /// What the threads are asked to do.
    private enum Phase {
        case running
        case paused
        case stopping
    }

    /// What the threads and the suite share.
    private struct Shared {
        var phase = Phase.running
        var acks: [Ack] = []
        /// The highest seq acknowledged so far.
        var highest: SequenceNumber = 0
        var unanswered = 0
        var refused: [String] = []
        /// Threads not finished.
        var running = 0
        /// Threads with a dispatch in flight.
        var busy = 0
    }

    private let endpoints: [String]
    /// How many client threads dispatch, each with at most one dispatch in flight.
    let threads: Int
    private let timeout: Duration
    private let retries: Int
    private let shared = LockedValue(Shared())
    private let label: String
    private let curve: ClientCurve?

    init(
        endpoints: [String],
        label: String,
        threads: Int = 4,
        timeout: Duration = .milliseconds(300),
        retries: Int = 40,
        curve: ClientCurve? = nil
    ) {
        self.endpoints = endpoints
        self.curve = curve
        self.label = label
        self.threads = threads
        self.timeout = timeout
        self.retries = retries
    }

    var acks: [Ack] { shared.withLockedValue { $0.acks } }
    /// The highest seq acknowledged so far: every read a client makes after it must see at least it.
    var highestAcknowledged: SequenceNumber { shared.withLockedValue { $0.highest } }
    var unanswered: Int { shared.withLockedValue { $0.unanswered } }
    var refused: [String] { shared.withLockedValue { $0.refused } }

    func start() {
        for thread in 0..<threads {
            shared.withLockedValue { $0.running += 1 }
            let worker = Thread { [self] in
                defer { shared.withLockedValue { $0.running -= 1 } }
                guard let context = try? Context() else { return }
                let client = CommandClient(
                    context: context,
                    endpoints: endpoints,
                    timeout: timeout,
                    retries: retries,
                    curve: curve
                )
                let clientID = ClientID.random()
                var number: UInt64 = 0
                while true {
                    // Busy from the moment it reads `running`, under the same lock: `pause()` waits for every
                    // dispatch begun before it.
                    let phase = shared.withLockedValue { shared in
                        if shared.phase == .running { shared.busy += 1 }
                        return shared.phase
                    }
                    if phase == .stopping { break }
                    if phase == .paused {
                        Thread.sleep(forTimeInterval: 0.005)
                        continue
                    }
                    number += 1
                    let text = "\(label)-\(thread)-\(number)"
                    let request = Request.dispatch(
                        DispatchRequest(
                            requestID: number,
                            domainVersion: 1,
                            clientID: clientID,
                            store: try! StoreName("todos"),
                            actions: [Array(#"{"add":{"text":"\#(text)"}}"#.utf8)]
                        )
                    )
                    let reply = try? client.call(request)
                    shared.withLockedValue { shared in
                        shared.busy -= 1
                        switch reply {
                        case let .accepted(_, _, seq, _)?:
                            shared.acks.append(Ack(text: text, seq: seq))
                            shared.highest = max(shared.highest, seq)
                        case let .error(_, error)?: shared.refused.append("\(error)")
                        case let reply?: shared.refused.append("\(reply)")
                        case nil: shared.unanswered += 1
                        }
                    }
                }
            }
            worker.start()
        }
    }

    /// Holds the threads and waits until none has a dispatch in flight (each finishes the one it has, at most
    /// every try of it): nothing is dispatched until ``resume()``. False if one was still in flight then.
    @discardableResult
    func pause() -> Bool {
        shared.withLockedValue { if $0.phase == .running { $0.phase = .paused } }
        return waitUntil { $0.busy == 0 }
    }

    /// Lets paused threads dispatch again.
    func resume() {
        shared.withLockedValue { if $0.phase == .paused { $0.phase = .running } }
    }

    /// Stops the threads and waits for them (each finishes its dispatch in flight).
    func stop() {
        shared.withLockedValue { $0.phase = .stopping }
        waitUntil { $0.running == 0 }
    }

    /// Waits until `condition` holds of what the threads share, at most as long as every try of a dispatch.
    @discardableResult
    private func waitUntil(_ condition: (Shared) -> Bool) -> Bool {
        let deadline = ContinuousClock.now + timeout * (retries + 2)
        while !shared.withLockedValue({ condition($0) }) {
            guard ContinuousClock.now < deadline else { return false }
            Thread.sleep(forTimeInterval: 0.01)
        }
        return true
    }
}

/// What the journal holds for `todos`, against what the clients were told.
struct JournalCheck {
    /// The todos events in the journal.
    var events = 0
    /// Acknowledged dispatches not found exactly once at the seq they were acknowledged with.
    var lost = 0
    /// Texts the journal holds more than once.
    var duplicated = 0
    /// Seqs missing between 1 and the last.
    var holes = 0
    /// Texts that must not be there (refused dispatches) that are.
    var unexpected = 0
    /// The first problems, described.
    var problems: [String] = []
}

/// Checks the `todos` store of `journal` against the acknowledgements: each acknowledged text at the seq it was
/// acknowledged with, every text at most once, none of `absent`, and the seqs `first`…N without a hole (`first` is
/// past a history written before the daemon started, which its snapshots compact).
func checkJournal(
    _ journal: any Journal,
    acks: [Ack],
    absent: Set<String> = [],
    from first: SequenceNumber = 1
) throws -> JournalCheck {
    var texts: [SequenceNumber: String] = [:]
    var seen: [String: Int] = [:]
    var from = first
    while true {
        guard case let .events(events) = try journal.events(store: "todos", from: from, to: .max, limit: 10_000) else {
            throw SuiteError("the todos history was compacted; the suite keeps it whole")
        }
        for event in events {
            struct Add: Decodable {
                struct Text: Decodable { var text: String }
                var add: Text
            }
            let text = (try? JSONDecoder().decode(Add.self, from: Data(event.action)).add.text) ?? "?"
            texts[event.seq] = text
            seen[text, default: 0] += 1
        }
        guard let last = events.last, events.count == 10_000 else { break }
        from = last.seq + 1
    }
    var check = JournalCheck(events: texts.count)
    for ack in acks where texts[ack.seq] != ack.text || seen[ack.text] != 1 {
        check.lost += 1
        if check.problems.count < 5 {
            check.problems.append(
                "'\(ack.text)' was acknowledged as seq \(ack.seq); the journal has "
                    + "'\(texts[ack.seq] ?? "nothing")' there and the text \(seen[ack.text] ?? 0) times"
            )
        }
    }
    for (text, count) in seen where count > 1 {
        check.duplicated += 1
        if check.problems.count < 10 { check.problems.append("'\(text)' is in the journal \(count) times") }
    }
    for text in absent.sorted() where seen[text] != nil {
        check.unexpected += 1
        if check.problems.count < 10 { check.problems.append("'\(text)' was refused, yet is in the journal") }
    }
    let last = texts.keys.max() ?? (first - 1)
    check.holes = Int(last) - Int(first - 1) - texts.count
    if check.holes > 0, let first = (first...last).first(where: { texts[$0] == nil }) {
        check.problems.append("\(check.holes) seqs missing below the last, \(last); the first is \(first)")
    }
    return check
}

extension ReplicaClient {
    /// A demo client that only watches: of one daemon, or of a leader and its standbys, following whichever leads.
    convenience init(
        watching daemons: [Daemon],
        stores: [String],
        eventsQueue: Int = 100_000,
        on host: (hosts: TestHosts, name: String)? = nil,
        curve: SuiteCurve? = nil
    ) throws {
        try self.init(
            lockstep: Binaries.lockstep,
            daemons: daemons.map { ($0.command, $0.events) },
            stores: stores,
            actions: 0,
            extra: ["--events-queue", "\(eventsQueue)"] + (curve?.toolArguments ?? []),
            on: host?.hosts,
            host: host?.name
        )
    }

    /// Waits until every store is at `expected`.
    func converge(on expected: [String: Digest], within timeout: Duration) -> Bool {
        converge(on: expected.mapValues { (seq: $0.seq, digest: $0.digest) }, within: timeout)
    }
}

/// A dispatch sent straight to one daemon on a DEALER of its own, e.g. while the daemon is stopped (it waits in the
/// daemon's socket until the daemon reads it); its answer is read from the same socket.
final class QueuedDispatch {
    /// The todo's text: unique, so the journal shows whether it was kept.
    let text: String
    private let socket: Socket

    init(to daemon: Daemon, text: String) throws {
        self.text = text
        socket = try Socket(try Context(), type: .dealer)
        try socket.set(.linger, 0)
        try socket.connect(daemon.command)
        let request = Request.dispatch(
            DispatchRequest(
                requestID: 1,
                domainVersion: 1,
                clientID: ClientID.random(),
                store: try StoreName("todos"),
                actions: [Array(#"{"add":{"text":"\#(text)"}}"#.utf8)]
            )
        )
        guard try socket.send(request.encode(), wait: false) else {
            throw SuiteError("could not queue a dispatch for \(daemon.command)")
        }
    }

    deinit { socket.close() }

    /// The daemon's answer, waiting at most `timeout`; `nil` if none came.
    func answer(within timeout: Duration) throws -> Reply? {
        try socket.set(.receiveTimeout, Int32(timeout / .milliseconds(1)))
        return try socket.receive().map { try Reply.decode($0) }
    }
}

/// What leaders woken after a takeover did with the dispatches queued for them while they were stopped, and what
/// their logs say: the proof that the fence holds.
struct Woken {
    /// The queued dispatches' texts: none may be in the journal.
    private(set) var texts: Set<String> = []
    /// How each queued dispatch was answered.
    private var answers: [String: Int] = [:]
    /// Per woken leader, its commits the fence refused (`[fenced]` on a `commit failed` line of its log) and its
    /// renewals it refused (`[fenced]` on a line of a renewal: an idle leader's, or the one after a commit whose
    /// session the server ended while the daemon slept).
    private var fenced: [(commits: Int, renewals: Int)] = []

    /// Reads the answer to `queued` from the daemon, woken just now; a problem, if it accepted the dispatch or did
    /// not answer.
    mutating func check(_ queued: QueuedDispatch) throws -> String? {
        texts.insert(queued.text)
        switch try queued.answer(within: .seconds(10)) {
        case let .error(_, error)? where error.code == .notLeader && error.reason.contains("no longer leads"):
            answers["not_leader (its leadership ended)", default: 0] += 1
        case let .error(_, error)? where error.code == .notLeader:
            answers["not_leader (standing by)", default: 0] += 1
        case let .error(_, error)?:
            answers["\(error.code)", default: 0] += 1
        case let reply?:
            return "the leader woken after the takeover answered a dispatch queued while it was stopped with \(reply)"
        case nil:
            return "the leader woken after the takeover did not answer a dispatch queued while it was stopped"
        }
        return nil
    }

    /// Counts what the fence refused in the lines `daemon`'s log gained since it held `offset` bytes; read once
    /// the daemon stands by, so the lines are all there. False when it refused nothing.
    mutating func readLog(_ daemon: Daemon, since offset: Int) -> Bool {
        let lines = String(decoding: daemon.output.utf8.dropFirst(offset), as: UTF8.self).split(separator: "\n")
        let refused = lines.filter { $0.contains("[fenced]") }
        fenced.append(
            (
                refused.filter { $0.contains("commit failed") }.count,
                refused.filter { $0.contains("renewal:") }.count
            )
        )
        return fenced.last!.commits + fenced.last!.renewals > 0
    }

    /// One line for the report.
    var summary: String {
        let how = answers.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", ")
        let perWake = fenced.map { "\($0.commits)+\($0.renewals)" }.joined(separator: ", ")
        return "woken leaders: \(texts.count) dispatches queued while stopped, none kept: \(how); fenced commits + "
            + "renewals logged per wake: \(perWake) (\(fenced.map(\.commits).reduce(0, +)) commits, "
            + "\(fenced.map(\.renewals).reduce(0, +)) renewals in all)"
    }
}

/// `duration` in seconds with two decimals, e.g. `3.07 s`; `-` for none.
func seconds(_ duration: Duration?) -> String {
    duration.map { String(format: "%.2f s", Double($0 / .milliseconds(1)) / 1_000) } ?? "-"
}

/// The median of `durations` (the upper one of an even count); `nil` for none.
func median(_ durations: [Duration]) -> Duration? {
    durations.isEmpty ? nil : durations.sorted()[durations.count / 2]
}

/// The power-cut filesystem (Tests/PowerCut/unsyncedfs.py) mounted for one fault class: a FUSE passthrough that
/// forgets every write not made durable by fsync when it is told to cut the power. Driven through its CLI.
final class UnsyncedFileSystem {
    static let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("PowerCut/unsyncedfs.py")
    let backing: URL
    let mountPoint: URL
    private var mounted = false

    /// Mounts a fresh backing folder at `folder/mnt`; throws, saying why, where FUSE cannot be used.
    init(folder: URL) throws {
        backing = folder.appendingPathComponent("backing")
        mountPoint = folder.appendingPathComponent("mnt")
        for directory in [backing, mountPoint] {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        }
        try run(["mount", backing.path, mountPoint.path])
        mounted = true
    }

    deinit { unmount() }

    /// Throws away everything not durable: `mode` all, prefix (a random prefix of each file's unsynced writes)
    /// or torn (the same, the last write torn at a 512-byte boundary).
    func cut(mode: String, seed: UInt64) throws {
        try run(["cut", mountPoint.path, "--mode", mode, "--seed", "\(seed)", "--sector", "512", "--wait", "10"])
    }

    /// Makes the next `count` fsyncs of files matching `pattern` fail with EIO (their writes are then lost).
    func failFsync(matching pattern: String, count: Int) throws {
        try run(["inject", mountPoint.path, "fsync-eio", "--pattern", pattern, "--count", "\(count)"])
    }

    /// Lifts every injected fault.
    func clearFaults() throws { try run(["clear", mountPoint.path]) }

    func unmount() {
        guard mounted else { return }
        mounted = false
        _ = try? run(["unmount", mountPoint.path])
    }

    /// Runs the CLI and checks its one line of JSON says `"ok": true`.
    @discardableResult
    private func run(_ arguments: [String]) throws -> [String: Any] {
        let child = try ChildProcess(
            executable: URL(fileURLWithPath: "/usr/bin/python3"),
            [Self.script.path] + arguments
        )
        let output = try child.finish(within: .seconds(60))
        let line = output.standardOutput.split(separator: "\n").last.map(String.init) ?? ""
        let reply = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any] ?? [:]
        guard output.status == 0, reply["ok"] as? Bool == true else {
            throw SuiteError(
                "unsyncedfs \(arguments.prefix(1).joined()) failed (exit \(output.status)): \(line) "
                    + output.standardError
            )
        }
        return reply
    }
}
