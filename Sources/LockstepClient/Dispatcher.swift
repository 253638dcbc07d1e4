import Foundation
import Lockstep
import LockstepProtocol
import Logging
import ServiceLifecycle
import ZeroMQ

/// Where a ``Dispatcher`` sends, and how long it tries.
public struct DispatcherConfiguration: Sendable {
    /// The command endpoints of the daemons to dispatch to (a leader and its standbys, in the order they are tried);
    /// by default the daemon's own, `ipc://.lockstep/run/command` relative to this process's folder.
    public var commandEndpoints = [DaemonEndpoints.defaults.command]
    /// CURVE keys, when the daemons listen on `tcp://` with CURVE.
    public var curve: ClientCurve?
    /// How long one try of a dispatch waits for its answer before it is sent again on a fresh socket.
    public var requestTimeout = Duration.seconds(2)
    /// How many times an unanswered dispatch is sent again (with the same idempotency key) before it fails
    /// `unavailable`: a takeover or a restart shorter than `requestTimeout` × (`retries` + 1) is waited out.
    public var retries = 3
    /// The first half of the idempotency keys; random unless given (give it only to a process that stays one
    /// client across restarts and numbers its requests on).
    public var clientID: ClientID?

    /// The defaults: the daemon's default endpoint, no CURVE, 2 s per try and 3 retries, a random client id.
    public init() {}

    /// The defaults, dispatching to the daemons at `commandEndpoints` (a leader and its standbys).
    public init(commandEndpoints: [String]) {
        self.commandEndpoints = commandEndpoints
    }
}

/// Sends a domain's actions to the daemon that leads and returns the seqs they were given — from any task, many at
/// once over one connection, without a replica: for server code that changes a store it does not read (a web
/// handler, a job) and must not block a thread of Swift's cooperative pool while it waits.
///
/// ``run()`` is its life: a thread that owns one DEALER socket until the task is cancelled or the service group
/// shuts down. Dispatches made before it runs wait for it. Each dispatch is retried the Lazy Pirate way with the
/// same idempotency key, so the daemon applies it at most once; a `not_leader` moves it to the next daemon.
///
/// ```swift
/// let dispatcher = try Dispatcher(Todos.self)
/// try await withThrowingDiscardingTaskGroup { group in
///     group.addTask { try await dispatcher.run() }
///     let seq = try await dispatcher.dispatch(.add(text: "milk"))  // durable at `seq`
///     group.cancelAll()
/// }
/// ```
///
/// A seq it returns is what another process's replica waits for to read the write (``Replica/wait(for:timeout:)``).
public final class Dispatcher<D: Domain>: Service, Sendable {
    /// The store on the daemon this dispatcher sends to: the domain's name.
    public let store: StoreName
    /// The endpoints and timeouts it was made with.
    public let configuration: DispatcherConfiguration
    /// The first half of this dispatcher's idempotency keys.
    public let clientID: ClientID
    private let logger: Logger
    private let shared = LockedValue(Shared())
    private let wakeup: Wakeup

    private struct Shared: QueuesDispatches {
        var started = false
        var stopRequested = false
        var stopped = false
        var lastRequestID: UInt64 = 0
        var outbox: [Outgoing] = []
        var takesDispatches: Bool { !stopped && !stopRequested }
    }

    /// A dispatcher to `domain`'s store at the daemons `configuration` names; not running until ``run()``. It logs
    /// through `logger` (by default the task-local `Logger.current`) with the store's name as `store` metadata.
    public init(
        _ domain: D.Type = D.self,
        configuration: DispatcherConfiguration = DispatcherConfiguration(),
        logger: Logger = .current
    ) throws {
        guard !configuration.commandEndpoints.isEmpty, !configuration.commandEndpoints.contains(where: \.isEmpty) else {
            throw ClientError(
                code: .badRequest,
                "DispatcherConfiguration.commandEndpoints must name at least one daemon's command endpoint; it is "
                    + "\(configuration.commandEndpoints)"
            )
        }
        store = try StoreName(D.name)
        self.configuration = configuration
        clientID = configuration.clientID ?? .random()
        self.logger = logger.forStore(D.name)
        wakeup = try Wakeup()
    }

    /// Sends `action` and returns its seq once the daemon has journaled it.
    ///
    /// Throws the domain's `Rejection` (with the daemon's reason) when the validator refused it, or a
    /// ``ClientError``: `unavailable` after every try went unanswered (or the daemon could not take it now),
    /// `refused` when the daemon would not take the request (another domain version, an unknown store),
    /// `badRequest` when it cannot be encoded, `stopped` when the dispatcher stopped first.
    @discardableResult
    public func dispatch(_ action: D.Action) async throws -> SequenceNumber {
        try await dispatch(batch: [action]).upperBound
    }

    /// Sends `actions` as one batch, sequenced together or not at all, and returns their seqs once the daemon has
    /// journaled them. A rejection names the action's index in the batch.
    @discardableResult
    public func dispatch(batch actions: [D.Action]) async throws -> ClosedRange<SequenceNumber> {
        let frames = try canonicalFrames(actions, for: "dispatch(batch:)")
        return try await queueAndAwait(
            frames,
            to: store,
            in: shared,
            waking: wakeup,
            stopped: "the dispatcher to '\(store)' has stopped"
        )
    }

    /// Runs the dispatcher until the task is cancelled or a graceful shutdown begins; then fails what is still
    /// waiting with ``ClientError/Code/stopped`` and returns. A dispatcher runs once.
    public func run() async throws {
        let first = shared.withLockedValue { shared in
            defer { shared.started = true }
            return !shared.started
        }
        guard first else {
            throw ClientError(code: .stopped, "this dispatcher to '\(store)' already ran; make a new one")
        }
        try await runOnOwnThread(named: "dispatcher \(D.name)", { try self.loop() }, stop: { self.stop() })
    }

    private func stop() {
        shared.withLockedValue { $0.stopRequested = true }
        wakeup.signal()
    }

    // MARK: - The dispatcher's thread

    /// The requests in flight and the socket they went out on: owned by the dispatcher's thread.
    private struct Channel {
        let context: Context
        let curve: ClientCurve?
        var search: LeaderSearch
        var socket: Socket
        var inFlight: LazyPirate<Flight>

        /// A dispatch waiting for its answer.
        struct Flight {
            var count: Int
            var outcome: DispatchOutcome
        }
    }

    private func loop() throws {
        let context = try Context()
        defer { context.shutdown() }
        let search = LeaderSearch(endpoints: configuration.commandEndpoints)
        var link = Channel(
            context: context,
            curve: configuration.curve,
            search: search,
            socket: try Link.commandSocket(context, curve: configuration.curve, search.endpoint),
            inFlight: LazyPirate(
                LazyPirate.Settings(timeout: configuration.requestTimeout, retries: configuration.retries)
            )
        )
        defer { link.socket.close() }
        while true {
            let now = ContinuousClock.now
            let deadline = min(link.inFlight.nextDeadline ?? now + .seconds(1), now + .seconds(1))
            let ready = try Poller([.socket(link.socket, .readable), .fileDescriptor(wakeup.descriptor, .readable)])
                .poll(timeout: max(.zero, deadline - now))
            if ready[1].contains(.readable) { wakeup.drain() }
            let (outbox, stopRequested) = shared.withLockedValue { shared in
                defer { shared.outbox.removeAll() }
                if shared.stopRequested { shared.stopped = true }
                return (shared.outbox, shared.stopRequested)
            }
            if stopRequested {
                let error = ClientError(
                    code: .stopped,
                    "the dispatcher to '\(store)' stopped before the daemon answered"
                )
                for outgoing in outbox { outgoing.outcome.fail(error) }
                for (_, flight) in link.inFlight.removeAll() { flight.outcome.fail(error) }
                return
            }
            for outgoing in outbox {
                let request = Request.dispatch(
                    DispatchRequest(
                        requestID: outgoing.number,
                        domainVersion: D.version,
                        clientID: clientID,
                        store: store,
                        actions: outgoing.actions,
                        trace: outgoing.trace
                    )
                )
                let flight = Channel.Flight(count: outgoing.actions.count, outcome: outgoing.outcome)
                try perform(link.inFlight.submit(request, flight, now: .now), on: &link)
            }
            if ready[0].contains(.readable) { try readReplies(on: &link) }
            try perform(link.inFlight.tick(now: .now), on: &link)
        }
    }

    private func readReplies(on link: inout Channel) throws {
        for _ in 0..<10_000 {
            guard let frames = try link.socket.receive(wait: false) else { return }
            let reply: Reply
            do {
                reply = try Reply.decode(frames)
            } catch {
                logger.warning(
                    "ignored an unreadable reply",
                    metadata: ["endpoint": "\(link.search.endpoint)", "error": "\(error)"]
                )
                continue
            }
            if case let .error(_, error) = reply, error.code == .notLeader {
                // A standby: nothing was applied. Everything in flight goes on at the next daemon that may lead (the
                // same one, after a pause, when it is the only one); the old socket's answers are dropped with it.
                let from = link.search.endpoint
                let pause = link.search.notLeader()
                try renewSocket(&link)
                logger.notice(
                    "sending to another daemon",
                    metadata: ["from": "\(from)", "to": "\(link.search.endpoint)", "because": "\(error)"]
                )
                try perform(link.inFlight.redirect(now: .now, pause: pause), on: &link)
                return
            }
            link.search.answered()
            guard let (_, flight) = link.inFlight.answered(reply.requestID) else { continue }
            switch DispatchReply(reply, count: flight.count, store: store) {
            case let .accepted(_, seqs): flight.outcome.resolve(.success(seqs))
            case let .notNow(error): flight.outcome.fail(error)
            case let .failed(error): flight.outcome.fail(error)
            }
        }
    }

    /// Carries out what the Lazy Pirate machine asks for.
    private func perform(_ outputs: [LazyPirate<Channel.Flight>.Output], on link: inout Channel) throws {
        for output in outputs {
            switch output {
            case let .send(request):
                // A full queue (no daemon for a long while) counts as lost; the request's timeout sends it again.
                _ = try? link.socket.send(request.encode(), wait: false)
            case .renewSocket:
                link.search.timedOut()
                try renewSocket(&link)
            case let .gaveUp(_, flight, tries):
                flight.outcome.fail(
                    ClientError(
                        code: .unavailable,
                        "no reply from \(daemonsPhrase(configuration.commandEndpoints)) after \(tries) tries of \(configuration.requestTimeout) each; is the "
                            + "daemon running, and is the endpoint right?"
                    )
                )
            }
        }
    }

    /// A fresh socket to the daemon the search points at now: what the old one held is dropped with it.
    private func renewSocket(_ link: inout Channel) throws {
        link.socket.close()
        link.socket = try Link.commandSocket(link.context, curve: link.curve, link.search.endpoint)
    }
}
