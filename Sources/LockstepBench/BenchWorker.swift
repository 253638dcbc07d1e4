import CZeroMQ
import Foundation
import Lockstep
import LockstepClient
import LockstepExamples
import LockstepProtocol
import LockstepServer
import LockstepTesting
import LockstepTool
import Logging
import ZeroMQ

/// One process of `lockstep bench`: a raw libzmq echo server or client, a Lockstep dispatcher, a replica (following,
/// or dispatching optimistically), a Redis client. Clients print `ready`, wait for `go` on standard input, work
/// for `seconds`, then print one JSON ``WorkerReport`` line and exit.
package struct BenchWorker: Sendable {
    package enum Role: String, CaseIterable, Sendable {
        /// Raw libzmq: a REP or ROUTER that sends every message back; runs until killed.
        case echoRep = "echo-rep"
        case echoRouter = "echo-router"
        /// Raw libzmq: a REQ sending the bytes of a counter DISPATCH and waiting for them to come back.
        case req
        /// Raw libzmq: a SUB counting `--count` messages from the bench's PUB (or, in P3, from lockstepd's, until it
        /// is killed).
        case sub
        /// Lockstep: DISPATCH of a counter increment, one at a time, through the command client; with `--in-flight N`,
        /// N at a time through one `Dispatcher` (a pipelining client: N tasks, each sending its next increment the
        /// moment its last is acknowledged).
        case dispatch
        /// Lockstep: a `Replica<Counter>` that records when it reached each seq.
        case replica
        /// Lockstep: a `Replica<Counter>` dispatching increments optimistically, one at a time, timing when its
        /// own optimistic state showed each and when each was confirmed.
        case optimistic
        /// Lockstep: a replica of `--store` that joins and reports how long it took to reach seq `--count`.
        case join
        /// Redis Streams: XADD of the counter action's bytes, one at a time; with `--in-flight N`, pipelined N at a time
        /// (N commands written at once, then their N replies read, as `redis-benchmark -P N` does).
        case redis
        /// Lockstep: a daemon in this process hosting `pulse`, whose effects a no-op handler runs, recording when
        /// each run started; `ready` once it serves, its report (`applied`: each effect's seq and start) once every
        /// effect set going has run after `stop` on standard input.
        case effectsDaemon = "effects-daemon"
        /// Lockstep: a replica of `todos` or `tree-todos` whose reducer misapplies one action (``Poisoned``); `ready` once live,
        /// then its report once it found the divergence (`seq`, and `finishedAt`: when, monotonic ns).
        case diverging
    }

    package var role: Role
    package var endpoint: String
    package var eventsEndpoint: String
    package var seconds: Double
    package var count: Int
    package var store: String
    package var recordSeqs: Bool
    package var curve: String?
    package var curveServer: String?
    /// dispatch, redis: how many requests one worker keeps in flight.
    package var inFlight: Int
    /// echo-router: how long after a message came its echo goes back.
    package var delay: Duration

    package init(
        role: Role,
        endpoint: String,
        eventsEndpoint: String,
        seconds: Double,
        count: Int,
        store: String,
        recordSeqs: Bool,
        curve: String?,
        curveServer: String?,
        inFlight: Int = 1,
        delay: Duration = .zero
    ) {
        self.role = role
        self.endpoint = endpoint
        self.eventsEndpoint = eventsEndpoint
        self.seconds = seconds
        self.count = count
        self.store = store
        self.recordSeqs = recordSeqs
        self.curve = curve
        self.curveServer = curveServer
        self.inFlight = inFlight
        self.delay = delay
    }

    package func run() async throws {
        signal(SIGPIPE, SIG_IGN)
        let context = try Context()
        var report: WorkerReport
        switch role {
        case .echoRep, .echoRouter:
            try echo(context)
            return
        case .req: report = try await request(context)
        case .sub: report = try subscribe(context)
        case .dispatch: report = try await inFlight > 1 ? pipelinedDispatch() : dispatch(context)
        case .replica:
            switch store {
            case Todos.name: report = try await replica(Todos.self, count: nil)
            case TreeTodos.name: report = try await replica(TreeTodos.self, count: nil)
            default: report = try await replica(Counter.self, count: { $0.count })
            }
        case .optimistic: report = try await optimistic()
        case .join:
            switch store {
            case Posts.name: report = try await join(Posts.self)
            case Todos.name: report = try await join(Todos.self)
            case TreeTodos.name: report = try await join(TreeTodos.self)
            default: report = try await join(Counter.self)
            }
        case .redis: report = try await redis()
        case .effectsDaemon: report = try await effectsDaemon()
        case .diverging: report = try await diverging()
        }
        if report.peakResident == 0 { report.peakResident = residentMemory(of: getpid()).peakKiB * 1_024 }
        if let failure = report.firstFailure {
            // In the worker's log, which `--keep` keeps: the table only counts failures.
            FileHandle.standardError.write(Data("bench-worker \(role.rawValue): first failure: \(failure)\n".utf8))
        }
        print(String(decoding: try JSONEncoder().encode(report), as: UTF8.self))
        fflush(nil)
    }

    /// The counter DISPATCH every client sends (the raw ones send its bytes, for the same load); with `pulse`, a
    /// batch of `batch` pings instead; with `todos`, one ``todoAdd(_:)`` (P7's stores grow by it).
    package static func dispatchRequest(
        number: UInt64,
        clientID: ClientID,
        store: String = Counter.name,
        batch: Int = 1
    ) -> Request {
        let (version, actions): (UInt32, [Frame]) =
            switch store {
            case Pulse.name: (Pulse.version, Array(repeating: Pulse.ping, count: max(1, batch)))
            case Todos.name: (Todos.version, [todoAdd(number)])
            case TreeTodos.name: (TreeTodos.version, [todoAdd(number)])
            default: (Counter.version, [action])
            }
        return .dispatch(
            DispatchRequest(
                requestID: number,
                domainVersion: version,
                clientID: clientID,
                store: try! StoreName(store),
                actions: actions
            )
        )
    }

    /// The bytes of a todos `add` whose text is 180 characters, numbered `number`: ~220 bytes of state each.
    package static func todoAdd(_ number: UInt64) -> Frame {
        Array(#"{"add":{"text":""#.utf8) + Array(todoText(number).utf8) + Array(#""}}"#.utf8)
    }

    /// The 180 characters of todo `number`'s text.
    package static func todoText(_ number: UInt64) -> String {
        let label = "todo \(number) "
        return label + String(repeating: "x", count: max(0, 180 - label.utf8.count))
    }

    /// `{"increment":{}}`, as every client and Redis send it.
    package static let action = Array(#"{"increment":{}}"#.utf8)

    private func ready() async throws {
        print("ready")
        fflush(nil)
        for await line in standardInputLines() where line == "go" { return }
        throw CommandFailure("bench-worker: standard input ended before go")
    }

    /// Runs `operation` back to back for `--seconds`, timing each; failures are counted, not timed.
    private func measure(_ operation: () throws -> Void) -> WorkerReport {
        var report = WorkerReport()
        report.latencies.reserveCapacity(100_000)
        let cpuStart = processCPUTime()
        let start = monotonicNanos()
        let end = start + UInt64(seconds * 1e9)
        var now = start
        while now < end { now = report.timed(from: now, Result { try operation() }) }
        report.elapsed = now - start
        report.cpuNanos = UInt64((processCPUTime() - cpuStart) / .nanoseconds(1))
        return report
    }

    /// The CURVE keys `--curve` gives, if any.
    private func clientCurve() throws -> ClientCurve? {
        guard let curve else { return nil }
        let keys = curve.split(separator: ",").map(String.init)
        guard keys.count == 2 else {
            throw BenchFailure("--curve wants SERVER_PUBLIC,CLIENT_SECRET, got \(keys.count) keys")
        }
        return ClientCurve(
            keys: try CurveKeyPair(secretKey: try Z85.decode(keys[1])),
            serverPublicKey: try Z85.decode(keys[0])
        )
    }

    private func echo(_ context: Context) throws {
        let socket = try Socket(context, type: role == .echoRep ? .reply : .router)
        if let curveServer {
            try socket.set(.curveServer, 1)
            try socket.set(.curveSecretKey, try Z85.decode(curveServer))
        }
        try socket.bind(endpoint)
        print("ready")
        fflush(nil)
        guard delay > .zero, role == .echoRouter else {
            while let frames = try socket.receive() {
                _ = try socket.send(frames)
            }
            return
        }
        try echoLate(socket)
    }

    /// A ROUTER echo that answers each message `delay` after it came, the others going on meanwhile: a raw client
    /// that waits as long as a durable answer makes it wait. A timerfd wakes it for the first answer due (a poll's
    /// timeout is whole milliseconds); messages wait in arrival order, so the first is always the one due first.
    private func echoLate(_ socket: Socket) throws {
        let timer = timerfd_create(CLOCK_MONOTONIC, Int32(TFD_NONBLOCK))
        guard timer >= 0 else { throw BenchFailure("timerfd_create failed: \(String(cString: strerror(errno)))") }
        defer { close(timer) }
        var held: [(due: UInt64, frames: [[UInt8]])] = []
        var first = 0
        // When the timer is set to go off (absolute, on `monotonicNanos()`'s clock); `nil` once it went off.
        var armedFor: UInt64?
        while true {
            let ready = try Poller([.socket(socket, .readable), .fileDescriptor(timer, .readable)]).poll(timeout: nil)
            if ready[1].contains(.readable) {
                var expirations: UInt64 = 0
                _ = read(timer, &expirations, 8)
                armedFor = nil
            }
            while let frames = try socket.receive(wait: false) {
                held.append((monotonicNanos() + UInt64(delay.nanoseconds), frames))
            }
            let now = monotonicNanos()
            while first < held.count, held[first].due <= now {
                _ = try socket.send(held[first].frames)
                first += 1
            }
            // Sent messages are dropped a thousand at a time, not one by one from the array's front.
            if first == held.count || first >= 1_024 {
                held.removeFirst(first)
                first = 0
            }
            if first < held.count, armedFor != held[first].due {
                let due = held[first].due
                var setting = itimerspec()
                setting.it_value = timespec(tv_sec: Int(due / 1_000_000_000), tv_nsec: Int(due % 1_000_000_000))
                guard timerfd_settime(timer, Int32(TFD_TIMER_ABSTIME), &setting, nil) == 0 else {
                    throw BenchFailure("timerfd_settime failed: \(String(cString: strerror(errno)))")
                }
                armedFor = due
            }
        }
    }

    private func request(_ context: Context) async throws -> WorkerReport {
        let socket = try Socket(context, type: .request)
        try socket.set(.receiveTimeout, 5_000)
        try clientCurve()?.configure(socket)
        try socket.connect(endpoint)
        let frames = Self.dispatchRequest(number: 1, clientID: .random()).encode()
        func roundTrip() throws {
            guard try socket.send(frames), try socket.receive() != nil else {
                throw CommandFailure("no echo from \(endpoint) within 5 s")
            }
        }
        try roundTrip()
        try await ready()
        return measure(roundTrip)
    }

    private func subscribe(_ context: Context) throws -> WorkerReport {
        let socket = try Socket(context, type: .subscriber)
        try socket.set(.receiveHighWaterMark, 0)
        try socket.set(.receiveTimeout, Int32(seconds * 1_000))
        try socket.subscribe([])
        try clientCurve()?.configure(socket)
        try socket.connect(endpoint)
        var report = WorkerReport()
        var announced = false
        while report.count < count, let frames = try socket.receive() {
            // The bench publishes "w" until every subscriber is ready, then `count` data messages.
            if frames.first?.first == UInt8(ascii: "w") {
                if !announced {
                    print("ready")
                    fflush(nil)
                    announced = true
                }
                continue
            }
            report.count += 1
        }
        report.finishedAt = monotonicNanos()
        return report
    }

    private func dispatch(_ context: Context) async throws -> WorkerReport {
        let client = CommandClient(
            context: context,
            endpoint: endpoint,
            timeout: .seconds(5),
            retries: 0,
            curve: try clientCurve()
        )
        let clientID = ClientID.random()
        var number: UInt64 = 0
        var sent: [WorkerReport.Sample] = []
        func dispatchOne() throws {
            number += 1
            let at = monotonicNanos()
            let request = Self.dispatchRequest(number: number, clientID: clientID, store: store, batch: count)
            guard case let .accepted(_, _, seq, _) = try client.call(request) else {
                throw CommandFailure("the daemon did not accept dispatch \(number)")
            }
            if recordSeqs { sent.append(.init(seq: seq, at: at)) }
        }
        try dispatchOne()
        try await ready()
        sent.removeAll()
        var report = measure(dispatchOne)
        report.sent = sent
        return report
    }

    /// A replica of `D` that reports its CPU per event applied; with `count` (the counter's, which is its seq),
    /// also when its state reached each seq.
    private func replica<D: Domain>(
        _ domain: D.Type,
        count: (@Sendable (D.State) -> Int)?
    ) async throws -> WorkerReport {
        let replica = try Replica(D.self, configuration: try replicaConfiguration(), logger: quietLogger())
        let running = Task { try await replica.run() }
        defer { running.cancel() }
        try await replica.waitUntilLive(timeout: .seconds(60))
        // Every dispatch is an increment and nothing is rejected, so the count is the seq: the subscriber to the
        // confirmed state learns on the replica's own thread, the moment a run of events is applied (the optimistic
        // view, the default, is rebuilt after it).
        let applied = LockedValue<[WorkerReport.Sample]>([])
        applied.withLockedValue { $0.reserveCapacity(1 << 16) }
        let subscription = count.map { count in
            replica.subscribe(count, view: .confirmed) { count in
                let at = monotonicNanos()
                applied.withLockedValue { $0.append(.init(seq: UInt64(count), at: at)) }
            }
        }
        defer { subscription?.cancel() }
        let cpuStart = processCPUTime()
        let seqStart = replica.seq
        print("ready")
        fflush(nil)
        var target: UInt64?
        for await line in standardInputLines() {
            if line.hasPrefix("until "), let seq = UInt64(line.dropFirst(6)) {
                target = seq
                break
            }
        }
        guard let target else { throw CommandFailure("bench-worker: standard input ended before until") }
        // Past 30 s the report says how far it got.
        _ = try? await replica.wait(for: target, timeout: .seconds(30))
        var report = WorkerReport()
        let cpu = processCPUTime() - cpuStart
        report.cpuNanos = UInt64(cpu.nanoseconds)
        report.eventsApplied = replica.seq - seqStart
        report.applied = applied.withLockedValue { $0 }
        report.seq = replica.seq
        report.resyncs = replica.status.resyncs
        report.repairs = replica.status.repairs
        return report
    }

    /// Dispatches `.increment` optimistically through a replica, one at a time: each is confirmed before the next
    /// goes. `latencies` holds dispatch → the replica's optimistic state showing the increment (a subscriber in this
    /// process, told on the thread that applied it), `confirmed` dispatch → the handle's seq resolving (the
    /// replica's confirmed state holds it).
    private func optimistic() async throws -> WorkerReport {
        let replica = try Replica(Counter.self, configuration: try replicaConfiguration(), logger: quietLogger())
        let running = Task { try await replica.run() }
        defer { running.cancel() }
        try await replica.waitUntilLive(timeout: .seconds(30))
        // The optimistic count and when the subscriber saw it: nothing else dispatches to the store meanwhile, so
        // each dispatch moves it up by one, and a rebase on the confirmed state that holds it leaves it there.
        // A subscriber is told one read at a time, the newest kept: while it is being told the previous dispatch's
        // confirmation, this one's read waits for that call to end. So the time kept is when it first saw each
        // count, and the count is read once the handle resolved, waiting (at most 5 s) for the call in progress.
        let shown = LockedValue<(count: Int, at: UInt64)>((replica.state.count, 0))
        let subscription = replica.subscribe({ $0.count }) { count in
            let at = monotonicNanos()
            shown.withLockedValue { if $0.count != count { $0 = (count, at) } }
        }
        defer { subscription.cancel() }
        func dispatchOne() async throws -> (optimistic: UInt64, confirmed: UInt64) {
            let expected = replica.state.count + 1
            let start = monotonicNanos()
            let handle = try await replica.dispatchOptimistically(.increment)
            _ = try await handle.seq
            let confirmed = monotonicNanos()
            var (count, at) = shown.withLockedValue { $0 }
            let deadline = ContinuousClock.now + .seconds(5)
            while count != expected, ContinuousClock.now < deadline {
                try await Task.sleep(for: .microseconds(200))
                (count, at) = shown.withLockedValue { $0 }
            }
            guard count == expected, at >= start else {
                throw CommandFailure(
                    "the subscriber's optimistic count was \(count) after the dispatch, not \(expected)"
                )
            }
            return (at - start, confirmed - start)
        }
        _ = try await dispatchOne()
        try await ready()
        var report = WorkerReport()
        report.latencies.reserveCapacity(100_000)
        report.confirmed.reserveCapacity(100_000)
        let cpuStart = processCPUTime()
        let start = monotonicNanos()
        let end = start + UInt64(seconds * 1e9)
        var now = start
        while now < end {
            do {
                let (optimistic, confirmed) = try await dispatchOne()
                report.latencies.append(optimistic)
                report.confirmed.append(confirmed)
                report.count += 1
            } catch {
                report.failures += 1
                report.firstFailure = report.firstFailure ?? "\(error)"
            }
            now = monotonicNanos()
        }
        report.elapsed = now - start
        report.cpuNanos = UInt64((processCPUTime() - cpuStart) / .nanoseconds(1))
        report.seq = replica.seq
        report.resyncs = replica.status.resyncs
        report.repairs = replica.status.repairs
        return report
    }

    private func join<D: Domain>(_ domain: D.Type) async throws -> WorkerReport {
        let start = monotonicNanos()
        let replica = try Replica(D.self, configuration: try replicaConfiguration(), logger: quietLogger())
        let running = Task { try await replica.run() }
        defer { running.cancel() }
        var report = WorkerReport()
        _ = try? await replica.wait(for: UInt64(count), timeout: .seconds(60))
        report.elapsed = monotonicNanos() - start
        // The confirmed state and its seq, read together: `replica.state` is the optimistic view, rebuilt on a
        // confirmed change only after the change is in, so read just after the seq it can still be the one before.
        let current = replica.current
        report.seq = current.seq
        // The peak of the join, before the encoding below (a report's, not the replica's) adds its own.
        report.peakResident = residentMemory(of: getpid()).peakKiB * 1_024
        report.stateBytes = (try? CanonicalEncoding.encode(current.state).count) ?? 0
        report.resyncs = replica.status.resyncs
        report.repairs = replica.status.repairs
        return report
    }

    private func redis() async throws -> WorkerReport {
        let connection = try RedisConnection(path: endpoint)
        let arguments = [Array("XADD".utf8), Array("lockstep".utf8), [UInt8(ascii: "*")], Array("a".utf8), Self.action]
        let batch = max(1, inFlight)
        func add() throws {
            let replies = try connection.pipeline(arguments, times: batch)
            guard replies.allSatisfy({ if case .bulk(.some) = $0 { true } else { false } }) else {
                throw CommandFailure("redis did not answer each XADD with an id: \(replies.prefix(3))…")
            }
        }
        try add()
        try await ready()
        // One operation of `measure` is a batch: its latency is the whole batch's, its count the batch's XADDs.
        var report = measure(add)
        report.count *= batch
        return report
    }

    /// `--in-flight` counter increments at a time through one `Dispatcher`: as many tasks, each dispatching its next
    /// the moment its last is acknowledged, for `--seconds`. Each latency is one dispatch's, from its call to its seq.
    private func pipelinedDispatch() async throws -> WorkerReport {
        guard store == Counter.name else {
            throw BenchFailure("bench-worker dispatch --in-flight dispatches to the counter store only, not \(store)")
        }
        var configuration = DispatcherConfiguration(commandEndpoints: [endpoint])
        configuration.curve = try clientCurve()
        configuration.requestTimeout = .seconds(5)
        configuration.retries = 0
        let dispatcher = try Dispatcher(Counter.self, configuration: configuration, logger: quietLogger())
        let running = Task { try await dispatcher.run() }
        defer { running.cancel() }
        try await dispatcher.dispatch(.increment)
        try await ready()
        let cpuStart = processCPUTime()
        let start = monotonicNanos()
        let end = start + UInt64(seconds * 1e9)
        let lanes = try await withThrowingTaskGroup(of: WorkerReport.self) { group in
            for _ in 0..<inFlight {
                group.addTask {
                    var lane = WorkerReport()
                    lane.latencies.reserveCapacity(100_000 / inFlight)
                    var now = monotonicNanos()
                    while now < end {
                        let result: Result<Void, any Error>
                        do {
                            try await dispatcher.dispatch(.increment)
                            result = .success(())
                        } catch {
                            result = .failure(error)
                        }
                        now = lane.timed(from: now, result)
                    }
                    return lane
                }
            }
            return try await group.reduce(into: [WorkerReport]()) { $0.append($1) }
        }
        var report = WorkerReport()
        report.elapsed = monotonicNanos() - start
        report.cpuNanos = UInt64((processCPUTime() - cpuStart) / .nanoseconds(1))
        for lane in lanes {
            report.count += lane.count
            report.failures += lane.failures
            report.firstFailure = report.firstFailure ?? lane.firstFailure
            report.latencies += lane.latencies
        }
        return report
    }

    private func effectsDaemon() async throws -> WorkerReport {
        let starts = LockedValue([WorkerReport.Sample]())
        var configuration = DaemonConfiguration(environment: [:], domains: [Pulse.name])
        configuration.dataDirectory = FileManager.default.currentDirectoryPath + "/effects-daemon-data"
        configuration.commandEndpoint = endpoint
        configuration.eventsEndpoint = eventsEndpoint
        let daemon = try LockstepDaemon(
            configuration: configuration,
            domains: [HostedDomain(Pulse.self)],
            effects: [
                EffectHandler(Pulse.self) { _, context in
                    // No work: the figure is the machinery's. The id is `pulse/SEQ/0`.
                    let at = monotonicNanos()
                    let seq = UInt64(context.id.split(separator: "/")[1]) ?? 0
                    starts.withLockedValue { $0.append(.init(seq: seq, at: at)) }
                    return []
                }
            ],
            environment: [:],
            logger: quietLogger()
        )
        let running = Task { try await daemon.run() }
        defer { running.cancel() }
        let client = CommandClient(context: try Context(), endpoint: endpoint, timeout: .seconds(1), retries: 30)
        func pending() throws -> Int? {
            try client.leaderStatus().status.stores.first { $0.name == Pulse.name }?.effects?.pending
        }
        _ = try pending()
        print("ready")
        fflush(nil)
        for await line in standardInputLines() where line == "stop" { break }
        // Every effect set going has run, and is done, before the report.
        for _ in 0..<600 where try pending() != 0 { try await Task.sleep(for: .milliseconds(100)) }
        running.cancel()
        _ = try? await running.value
        var report = WorkerReport()
        report.applied = starts.withLockedValue { $0 }
        report.count = report.applied.count
        return report
    }

    private func diverging() async throws -> WorkerReport {
        store == TreeTodos.name
            ? try await diverging(Poisoned<TreeTodos>.self) : try await diverging(Poisoned<Todos>.self)
    }

    private func diverging<D: AddsTodos>(_: Poisoned<D>.Type) async throws -> WorkerReport {
        let replica = try Replica(Poisoned<D>.self, configuration: try replicaConfiguration(), logger: quietLogger())
        let running = Task { try await replica.run() }
        defer { running.cancel() }
        try await replica.waitUntilLive(timeout: .seconds(60))
        let notices = replica.notices()
        print("ready")
        fflush(nil)
        var report = WorkerReport()
        for await notice in notices {
            if case let .diverged(seq, _) = notice {
                report.finishedAt = monotonicNanos()
                report.seq = seq
                break
            }
        }
        return report
    }

    private func replicaConfiguration() throws -> ReplicaConfiguration {
        var configuration = ReplicaConfiguration(commandEndpoint: endpoint, eventsEndpoint: eventsEndpoint)
        configuration.curve = try clientCurve()
        configuration.requestTimeout = .seconds(10)
        return configuration
    }

    private func quietLogger() -> Logger {
        var logger = Logger(label: "lockstep.bench-worker")
        logger.logLevel = .warning
        return logger
    }
}
