/// Requests in flight on one command socket, retried the Lazy Pirate way (docs/protocol.md, "Idempotency"),
/// as a value that takes events and returns what to do — no socket and no clock in it.
///
/// Each request waits ``Settings/timeout``. When one goes unanswered the socket is replaced (a REQ socket that
/// lost its reply can never send again; a DEALER's peer may have dropped what it had) and every request still
/// in flight is sent again on the new one, with the same request id — for a DISPATCH, the same idempotency key,
/// so the daemon applies it at most once. A request unanswered ``Settings/retries`` + 1 times is given up.
///
/// `CommandClient` (one request at a time, blocking), the replica's dispatcher and `Dispatcher` (many at once) drive it;
/// `Payload` is what the owner keeps with each request (a continuation, a count). Its methods are `@inlinable`, so
/// each owner gets a copy specialized for its `Payload`: unspecialized, a client's every call went through the
/// runtime's generic metadata lookups, a third of its user-space CPU.
public struct LazyPirate<Payload> {
    /// How long to wait, and how often to try.
    public struct Settings: Hashable, Sendable {
        /// How long a request waits for its reply before it counts as lost.
        public var timeout: Duration
        /// How many times a lost request is sent again before it is given up.
        public var retries: Int

        /// Settings with `timeout` per try and `retries` more tries after the first; a negative count is taken as 0.
        @inlinable
        public init(timeout: Duration = .seconds(2), retries: Int = 3) {
            self.timeout = timeout
            self.retries = max(0, retries)
        }
    }

    /// What the owner must do, in order.
    public enum Output {
        /// Send this request on the current socket.
        case send(Request)
        /// Close the command socket and open a fresh one.
        case renewSocket
        /// No reply came after `tries` tries: tell whoever waits for it.
        case gaveUp(Request, Payload, tries: Int)
    }

    @usableFromInline
    struct Flight {
        @usableFromInline
        var request: Request
        @usableFromInline
        var payload: Payload
        @usableFromInline
        var deadline: ContinuousClock.Instant
        @usableFromInline
        var triesLeft: Int

        @inlinable
        init(request: Request, payload: Payload, deadline: ContinuousClock.Instant, triesLeft: Int) {
            self.request = request
            self.payload = payload
            self.deadline = deadline
            self.triesLeft = triesLeft
        }
    }

    /// The timeout and retry count this machine runs with.
    public let settings: Settings
    @usableFromInline
    var flights: [UInt64: Flight] = [:]
    /// When every request in flight is sent again after a ``redirect(now:pause:)`` with a pause.
    @usableFromInline
    var resendAt: ContinuousClock.Instant?

    /// A machine with nothing in flight.
    @inlinable
    public init(_ settings: Settings) {
        self.settings = settings
    }

    /// How many requests wait for a reply.
    @inlinable
    public var count: Int { flights.count }

    /// When ``tick(now:)`` has something to do next; `nil` with nothing in flight.
    @inlinable
    public var nextDeadline: ContinuousClock.Instant? {
        // A plain loop over the deadlines alone: a lazy map and `min()` copied each request (and the runtime's
        // generic value witnesses did it) on every turn of a client's wait.
        var next: ContinuousClock.Instant?
        for flight in flights.values where next.map({ flight.deadline < $0 }) ?? true {
            next = flight.deadline
        }
        guard let resendAt, let next else { return next }
        return min(resendAt, next)
    }

    /// A new request: send it. Its request id must not be in flight already.
    @inlinable
    public mutating func submit(_ request: Request, _ payload: Payload, now: ContinuousClock.Instant) -> [Output] {
        precondition(flights[request.requestID] == nil, "request \(request.requestID) is in flight already")
        flights[request.requestID] = Flight(
            request: request,
            payload: payload,
            deadline: now + settings.timeout,
            triesLeft: settings.retries
        )
        return [.send(request)]
    }

    /// A reply to request `requestID` arrived: the request and its payload, no longer in flight; `nil` when no
    /// such request waits (a late reply to one given up, or to another owner's).
    @inlinable
    public mutating func answered(_ requestID: UInt64) -> (request: Request, payload: Payload)? {
        // Not `Optional.map`: its closure made the tuple through the runtime's generic value witnesses.
        guard let flight = flights.removeValue(forKey: requestID) else { return nil }
        return (flight.request, flight.payload)
    }

    /// Request `requestID` is given up by its owner (it will not be sent again, whatever comes): its request and
    /// payload, no longer in flight; `nil` when no such request waits.
    @inlinable
    public mutating func cancel(_ requestID: UInt64) -> (request: Request, payload: Payload)? {
        answered(requestID)
    }

    /// The owner moved its socket to another daemon (one answered `not_leader`, docs/protocol.md "Failover"):
    /// every request in flight must go out again on the new socket, at once or, with a `pause`, at `now + pause`.
    /// Their deadlines and tries stand: a `not_leader` ends no try, so a request still gives up after its tries.
    @inlinable
    public mutating func redirect(now: ContinuousClock.Instant, pause: Duration) -> [Output] {
        guard !flights.isEmpty else { return [] }
        guard pause > .zero else {
            resendAt = nil
            return flights.keys.sorted().map { .send(flights[$0]!.request) }
        }
        resendAt = now + pause
        return []
    }

    /// Time passed. When a request's wait is over: give up those out of tries, renew the socket, and send every
    /// request still in flight again (in request id order) with a new deadline. When a redirect's pause is over,
    /// send them again.
    @inlinable
    public mutating func tick(now: ContinuousClock.Instant) -> [Output] {
        guard flights.values.contains(where: { $0.deadline <= now }) else {
            guard let resendAt, resendAt <= now else { return [] }
            self.resendAt = nil
            return flights.keys.sorted().map { .send(flights[$0]!.request) }
        }
        resendAt = nil
        var outputs: [Output] = []
        for id in flights.keys.sorted() where flights[id]!.deadline <= now {
            if flights[id]!.triesLeft == 0 {
                let flight = flights.removeValue(forKey: id)!
                outputs.append(.gaveUp(flight.request, flight.payload, tries: settings.retries + 1))
            } else {
                flights[id]!.triesLeft -= 1
            }
        }
        outputs.append(.renewSocket)
        for id in flights.keys.sorted() {
            flights[id]!.deadline = now + settings.timeout
            outputs.append(.send(flights[id]!.request))
        }
        return outputs
    }

    /// Every request in flight, taken out (the owner is stopping and answers them all).
    @inlinable
    public mutating func removeAll() -> [(request: Request, payload: Payload)] {
        defer {
            flights.removeAll()
            resendAt = nil
        }
        return flights.keys.sorted().map { (flights[$0]!.request, flights[$0]!.payload) }
    }
}

extension LazyPirate: Sendable where Payload: Sendable {}
extension LazyPirate.Output: Sendable where Payload: Sendable {}
extension LazyPirate.Flight: Sendable where Payload: Sendable {}
