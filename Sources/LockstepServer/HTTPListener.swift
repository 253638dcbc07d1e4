import Foundation
import Lockstep
import Logging
import Synchronization
import ZeroMQ

/// A request the HTTP listener read: its method, its path and its query's parameters (percent-decoded).
package struct HTTPRequest: Hashable, Sendable {
    package var method: String
    package var path: String
    package var query: [String: String] = [:]

    /// The parameters of a query string `a=1&b=two%20words` (`+` is a space; a name without `=` has "").
    static func parameters(_ query: Substring) -> [String: String] {
        var parameters: [String: String] = [:]
        for pair in query.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            func decoded(_ text: Substring) -> String {
                let spaced = text.replacingOccurrences(of: "+", with: " ")
                return spaced.removingPercentEncoding ?? spaced
            }
            parameters[decoded(parts[0])] = parts.count == 2 ? decoded(parts[1]) : ""
        }
        return parameters
    }
}

/// What the listener sends back. A response closes its connection once sent, unless it ``streams``: then the
/// connection stays open for what the site sends on it later (server-sent events), until either side closes it.
package struct HTTPResponse: Hashable, Sendable {
    package var status: Int
    package var contentType: String
    package var body: [UInt8]
    /// Whether the body goes on after these bytes (no Content-Length; the end of the connection ends it).
    package var streams = false

    package init(status: Int, contentType: String = "text/plain; charset=utf-8", body: [UInt8]) {
        self.status = status
        self.contentType = contentType
        self.body = body
    }

    /// A JSON response.
    package static func json(_ status: Int, _ body: [UInt8]) -> HTTPResponse {
        HTTPResponse(status: status, contentType: "application/json", body: body)
    }

    /// The head of a stream of server-sent events, with its first events.
    package static func events(_ body: [UInt8]) -> HTTPResponse {
        var response = HTTPResponse(status: 200, contentType: "text/event-stream", body: body)
        response.streams = true
        return response
    }

    /// A plain-text response.
    package static func text(_ status: Int, _ text: String) -> HTTPResponse {
        HTTPResponse(status: status, body: Array((text + "\n").utf8))
    }

    static let reasons = [
        200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
        431: "Request Header Fields Too Large", 503: "Service Unavailable",
    ]

    /// The bytes on the wire; without the body for a HEAD request.
    package func encoded(head: Bool = false) -> [UInt8] {
        let header =
            "HTTP/1.1 \(status) \(Self.reasons[status] ?? "Status")\r\nContent-Type: \(contentType)\r\n"
            + (streams ? "" : "Content-Length: \(body.count)\r\n")
            + "Connection: close\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n\r\n"
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
        let target = parts[1].prefix { $0 != "#" }
        let path = String(target.prefix { $0 != "?" })
        let query = target.drop { $0 != "?" }.dropFirst()
        guard method == "GET" || method == "HEAD" else {
            return [.respond(id: id, .text(405, "\(method.prefix(20)) is not served here; use GET"), head: false)]
        }
        let request = HTTPRequest(method: method, path: path, query: HTTPRequest.parameters(query))
        return [.respond(id: id, route(request), head: method == "HEAD")]
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

/// What an HTTP listener serves: made on the listener's thread and used only there, so it may own what is not
/// `Sendable` (a read-only journal, say).
package protocol HTTPSite {
    /// The answer to `request`, which came on connection `id`. An answer that ``HTTPResponse/streams`` keeps the
    /// connection open: the site names it in ``streamed(now:)`` from then on.
    mutating func answer(_ request: HTTPRequest, connection id: [UInt8]) -> HTTPResponse
    /// What to send on each open stream now. A stream whose queue is full (its peer reads too slowly) is closed.
    mutating func streamed(now: ContinuousClock.Instant) -> [(id: [UInt8], bytes: [UInt8])]
    /// Stream `id` is closed: its peer went away, or a send to it would have blocked.
    mutating func closed(_ id: [UInt8])
    /// Whether any stream is open (the listener then calls ``streamed(now:)`` ten times a second).
    var isStreaming: Bool { get }
}

extension HTTPSite {
    package mutating func streamed(now: ContinuousClock.Instant) -> [(id: [UInt8], bytes: [UInt8])] { [] }
    package mutating func closed(_ id: [UInt8]) {}
    package var isStreaming: Bool { false }
}

/// The daemon's HTTP listener (`[http] listen`, `--http-listen`): one thread that owns a ZeroMQ STREAM socket on
/// `HOST:PORT` and answers GET requests with what its ``HTTPSite`` makes of them — `/metrics` in Prometheus text,
/// and the inspector's page and its live stream.
///
/// Built on libzmq's raw-TCP socket rather than an HTTP server library: the daemon serves a handful of GET
/// responses, and SwiftNIO with an HTTP framework would add minutes to every build of every package that links the
/// daemon (docs/operations.md, "Metrics").
final class HTTPListener: Sendable {
    /// How often open streams are sent what is new.
    static let streamInterval = Duration.milliseconds(100)
    /// The most messages queued for one connection; a stream's next send past it closes the stream.
    static let queuedMessages: Int32 = 100

    /// The address it listens on, as `HOST:PORT` (the port chosen when 0 was asked).
    let address: String
    private let wakeup: Wakeup
    private let stopping = LockedValue(false)
    private let finished = DispatchSemaphore(value: 0)

    /// Binds `listen` (`HOST:PORT`, port 0 for any free one) on a thread of its own, makes the site there with
    /// `site`, and serves until ``stop()``; throws, naming the address, when it cannot bind.
    init(
        listen: String,
        logger: Logger,
        site makeSite: @escaping @Sendable () -> any HTTPSite
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
                // A page's stream gets a message every 100 ms at most: 100 queued is 10 s it did not read, and
                // the next send closes it.
                try socket.set(.sendHighWaterMark, Self.queuedMessages)
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
            var site = makeSite()
            var connections = HTTPConnections()
            var streams: Set<[UInt8]> = []
            /// Sends `frames`; `false` when the peer is gone or its queue is full.
            func send(_ frames: [[UInt8]]) -> Bool { (try? socket.send(frames, wait: false)) ?? false }
            func close(_ id: [UInt8]) {
                _ = send([id, []])
                if streams.remove(id) != nil { site.closed(id) }
            }
            while !stopping.withLockedValue({ $0 }) {
                do {
                    let items: [Poller.Item] = [
                        .socket(socket, .readable), .fileDescriptor(wakeup.descriptor, .readable),
                    ]
                    let timeout = site.isStreaming ? Self.streamInterval : .seconds(1)
                    let ready = try Poller(items).poll(timeout: timeout)
                    if ready[1].contains(.readable) { wakeup.drain() }
                    var outputs = connections.expire(now: .now)
                    while let frames = try socket.receive(wait: false), frames.count == 2 {
                        let id = frames[0]
                        if streams.contains(id) {
                            // A stream's peer sends nothing more: bytes are ignored, an empty frame is its end.
                            if frames[1].isEmpty, streams.remove(id) != nil { site.closed(id) }
                            continue
                        }
                        outputs += connections.received(id: id, frames[1], now: .now) { request in
                            site.answer(request, connection: id)
                        }
                    }
                    for output in outputs {
                        switch output {
                        case let .respond(id, response, head):
                            if send([id, response.encoded(head: head)]), response.streams, !head {
                                streams.insert(id)
                                continue
                            }
                            // Answered and closed — a stream too, when its head could not be sent or was all asked.
                            if response.streams { site.closed(id) }
                            close(id)
                        case let .close(id):
                            close(id)
                        }
                    }
                    guard site.isStreaming else { continue }
                    for (id, bytes) in site.streamed(now: .now) where streams.contains(id) && !send([id, bytes]) {
                        // Its queue is full: nothing more is sent to it, and it ends once it reads what is queued.
                        logger.notice(
                            "dropped an HTTP stream whose reader fell behind",
                            metadata: ["queued": "\(Self.queuedMessages) messages"]
                        )
                        close(id)
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
