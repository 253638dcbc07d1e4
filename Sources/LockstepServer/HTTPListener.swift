import Foundation
import Lockstep
import Logging
import Synchronization
import ZeroMQ

/// A request the HTTP listener read: its method and path (the query string cut off).
package struct HTTPRequest: Hashable, Sendable {
    package var method: String
    package var path: String
}

/// What the listener sends back; every response closes its connection.
package struct HTTPResponse: Hashable, Sendable {
    package var status: Int
    package var contentType: String
    package var body: [UInt8]

    package init(status: Int, contentType: String = "text/plain; charset=utf-8", body: [UInt8]) {
        self.status = status
        self.contentType = contentType
        self.body = body
    }

    /// A plain-text response.
    package static func text(_ status: Int, _ text: String) -> HTTPResponse {
        HTTPResponse(status: status, body: Array((text + "\n").utf8))
    }

    static let reasons = [
        200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
        431: "Request Header Fields Too Large", 503: "Service Unavailable",
    ]

    /// The bytes on the wire; without the body for a HEAD request.
    package func encoded(head: Bool = false) -> [UInt8] {
        let header =
            "HTTP/1.1 \(status) \(Self.reasons[status] ?? "Status")\r\nContent-Type: \(contentType)\r\n"
            + "Content-Length: \(body.count)\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n"
        return Array(header.utf8) + (head ? [] : body)
    }
}

/// The HTTP/1.1 connections of a ZeroMQ STREAM socket, without the socket: what arrives on each (its id and bytes),
/// and what to send back. One request per connection, answered and closed — a scraper or a page's fetch needs no
/// more. A request head over ``maximumHeadBytes``, a connection idle past ``idleTimeout`` and connections past
/// ``maximumConnections`` are closed, so no peer can make the listener hold more than that.
package struct HTTPConnections {
    /// What to do on the socket.
    package enum Output: Hashable {
        /// Send this response on the connection, then close it.
        case respond(id: [UInt8], HTTPResponse, head: Bool)
        /// Close the connection without a word.
        case close(id: [UInt8])
    }

    package static let maximumHeadBytes = 16 * 1_024
    package static let maximumConnections = 64
    package static let idleTimeout = Duration.seconds(10)

    private var open: [[UInt8]: (bytes: [UInt8], since: ContinuousClock.Instant)] = [:]

    package init() {}

    /// How many connections are open.
    package var count: Int { open.count }

    /// `bytes` arrived on connection `id` (none: the connection came or went); `route` answers a whole request.
    package mutating func received(
        id: [UInt8],
        _ bytes: [UInt8],
        now: ContinuousClock.Instant,
        route: (HTTPRequest) -> HTTPResponse
    ) -> [Output] {
        guard !bytes.isEmpty else {
            if open.removeValue(forKey: id) != nil { return [] }
            guard open.count < Self.maximumConnections else { return [.close(id: id)] }
            open[id] = ([], now)
            return []
        }
        // Bytes after the answer (a pipelined request) are dropped with the connection.
        guard var connection = open[id] else { return [] }
        connection.bytes += bytes
        guard let end = Self.headEnd(connection.bytes) else {
            guard connection.bytes.count <= Self.maximumHeadBytes else {
                open[id] = nil
                let reason = "the request's head is over \(Self.maximumHeadBytes) bytes"
                return [.respond(id: id, .text(431, reason), head: false)]
            }
            open[id] = connection
            return []
        }
        open[id] = nil
        // The request line, up to its CR LF (bytes: Swift reads "\r\n" as one character).
        let line = String(decoding: connection.bytes[..<end].prefix { $0 != 13 && $0 != 10 }, as: UTF8.self)
        let parts = line.split(separator: " ", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[2].hasPrefix("HTTP/1."), parts[1].hasPrefix("/") else {
            return [
                .respond(
                    id: id,
                    .text(400, "expected a request line such as 'GET /metrics HTTP/1.1', got '\(line.prefix(100))'"),
                    head: false
                )
            ]
        }
        let method = String(parts[0])
        let path = String(parts[1].prefix { $0 != "?" && $0 != "#" })
        guard method == "GET" || method == "HEAD" else {
            return [.respond(id: id, .text(405, "\(method.prefix(20)) is not served here; use GET"), head: false)]
        }
        return [.respond(id: id, route(HTTPRequest(method: method, path: path)), head: method == "HEAD")]
    }

    /// Closes the connections that sent no whole request within ``idleTimeout``.
    package mutating func expire(now: ContinuousClock.Instant) -> [Output] {
        let idle = open.filter { now - $0.value.since >= Self.idleTimeout }.keys
        for id in idle { open[id] = nil }
        return idle.map { .close(id: $0) }
    }

    /// Where the head ends (past its blank line), if it has.
    static func headEnd(_ bytes: [UInt8]) -> Int? {
        guard bytes.count >= 4 else { return nil }
        for index in 3..<bytes.count
        where bytes[index] == 10 && bytes[index - 1] == 13 && bytes[index - 2] == 10 && bytes[index - 3] == 13 {
            return index + 1
        }
        return nil
    }
}

/// The daemon's HTTP listener (`[http] listen`, `--http-listen`): one thread that owns a ZeroMQ STREAM socket on
/// `HOST:PORT` and answers GET requests with what `route` makes of them — `/metrics` in Prometheus text.
///
/// Built on libzmq's raw-TCP socket rather than an HTTP server library: the daemon serves a handful of small GET
/// responses, and SwiftNIO with an HTTP framework would add minutes to every build of every package that links the
/// daemon (docs/operations.md, "Metrics").
final class HTTPListener: Sendable {
    /// The address it listens on, as `HOST:PORT` (the port chosen when 0 was asked).
    let address: String
    private let wakeup: Wakeup
    private let stopping = LockedValue(false)
    private let finished = DispatchSemaphore(value: 0)

    /// Binds `listen` (`HOST:PORT`, port 0 for any free one) on a thread of its own and serves until ``stop()``;
    /// throws, naming the address, when it cannot bind.
    init(
        listen: String,
        logger: Logger,
        route: @escaping @Sendable (HTTPRequest) -> HTTPResponse
    ) throws(ServerError) {
        let (host, port) = try Self.split(listen)
        let endpoint = "tcp://\(host.contains(":") ? "[\(host)]" : host):\(port == 0 ? "*" : "\(port)")"
        do {
            wakeup = try Wakeup()
        } catch {
            throw ServerError(code: .system, "could not make the HTTP listener's wake-up pipe: \(error)")
        }
        let bound = Mutex<Result<String, ServerError>?>(nil)
        let ready = DispatchSemaphore(value: 0)
        let (wakeup, stopping, finished) = (self.wakeup, self.stopping, self.finished)
        let thread = Thread {
            nameCurrentThread("lockstepd http")
            defer { finished.signal() }
            let context: Context
            let socket: Socket
            do {
                context = try Context(ioThreads: 1)
                socket = try Socket(context, type: .stream)
                try socket.set(.linger, 0)
                try socket.bind(endpoint)
                let last = try socket.lastEndpoint
                let address = last.hasPrefix("tcp://") ? String(last.dropFirst(6)) : last
                bound.withLock { $0 = .success(address) }
            } catch {
                bound.withLock {
                    $0 = .failure(
                        ServerError(
                            code: .bind,
                            "cannot listen for HTTP on '\(listen)' (\(endpoint)): \(error); give [http] listen (or "
                                + "--http-listen) an address of this host and a free port, e.g. 127.0.0.1:9464"
                        )
                    )
                }
                ready.signal()
                return
            }
            ready.signal()
            defer {
                socket.close()
                context.shutdown()
            }
            var connections = HTTPConnections()
            while !stopping.withLockedValue({ $0 }) {
                do {
                    let items: [Poller.Item] = [
                        .socket(socket, .readable), .fileDescriptor(wakeup.descriptor, .readable),
                    ]
                    let ready = try Poller(items).poll(timeout: .seconds(1))
                    if ready[1].contains(.readable) { wakeup.drain() }
                    var outputs = connections.expire(now: .now)
                    while let frames = try socket.receive(wait: false), frames.count == 2 {
                        outputs += connections.received(id: frames[0], frames[1], now: .now, route: route)
                    }
                    for output in outputs {
                        switch output {
                        case let .respond(id, response, head):
                            _ = try socket.send([id, response.encoded(head: head)], wait: false)
                            _ = try socket.send([id, []], wait: false)
                        case let .close(id):
                            _ = try socket.send([id, []], wait: false)
                        }
                    }
                } catch {
                    logger.error("the HTTP listener stopped", metadata: ["error": "\(error)"])
                    return
                }
            }
        }
        thread.start()
        ready.wait()
        switch bound.withLock({ $0 })! {
        case let .success(address): self.address = address
        case let .failure(error): throw error
        }
    }

    /// Stops the thread and closes the socket; returns once it has.
    func stop() {
        let stopped = stopping.withLockedValue { stopping in
            defer { stopping = true }
            return stopping
        }
        guard !stopped else { return }
        wakeup.signal()
        finished.wait()
    }

    /// `HOST:PORT` (IPv6 hosts in brackets) as its host and port, or an error naming the value.
    static func split(_ listen: String) throws(ServerError) -> (host: String, port: Int) {
        let problem = ServerError(
            code: .configuration,
            "HTTP listen address '\(listen)' is not HOST:PORT; e.g. 127.0.0.1:9464, [::1]:9464, or 0.0.0.0:9464 for "
                + "every interface (port 0 takes any free one)"
        )
        guard let colon = listen.lastIndex(of: ":"), let port = Int(listen[listen.index(after: colon)...]),
            (0...65_535).contains(port)
        else { throw problem }
        var host = String(listen[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty, !host.contains(" ") else { throw problem }
        return (host, port)
    }
}
