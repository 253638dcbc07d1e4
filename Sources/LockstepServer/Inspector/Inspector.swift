import Foundation
import Lockstep
import LockstepJournal
import LockstepProtocol
import Logging
import Prometheus

/// What the daemon's HTTP listener serves: `/metrics`, and with the inspector on, its page and what the page reads.
struct DaemonSite: HTTPSite {
    let registry: PrometheusCollectorRegistry?
    var inspector: Inspector?

    mutating func answer(_ request: HTTPRequest, connection id: [UInt8]) -> HTTPResponse {
        if request.path == "/metrics" { return DaemonMetrics.page(request, registry) }
        guard inspector != nil else {
            return .text(
                404,
                "nothing at \(request.path.prefix(200)); this daemon serves /metrics, and its inspector is off: it "
                    + "is served on a loopback address unless [http] inspector = false, elsewhere only with [http] "
                    + "inspector = true or --http-inspector (docs/operations.md, \"The inspector\")"
            )
        }
        return inspector!.answer(request, connection: id)
    }

    mutating func streamed(now: ContinuousClock.Instant) -> [(id: [UInt8], bytes: [UInt8])] {
        inspector?.streamed(now: now) ?? []
    }

    mutating func closed(_ id: [UInt8]) { inspector?.closed(id) }

    var isStreaming: Bool { inspector?.isStreaming ?? false }
}

/// The inspector (docs/operations.md, "The inspector"): a page at `/` and what it reads — `/api/status`, the live
/// stream `/api/live` (server-sent events), a store's state at any seq (`/api/state`) and its actions between two
/// (`/api/actions`). Read-only, on the HTTP listener's thread: actions and states from a read-only journal of its
/// own, the rest from the loop's ``InspectorFeed``. The loop never waits for it, and a page that cannot keep up is
/// dropped (it reconnects and starts again from the newest).
struct Inspector {
    /// The page, kept in the repository as plain HTML, CSS and JavaScript and built into the binary.
    static let page: [UInt8] = PackageResources.inspector_html
    /// The most recent events kept for a page that opens (its backlog).
    static let backlogCapacity = 1_024
    /// The most actions of one store a stream is sent per 100 ms (a busy store's others are counted as skipped).
    static let actionsPerTick: UInt64 = 50
    /// The actions a page that opens is sent from before.
    static let backlog: UInt64 = 100
    /// The most actions `/api/actions` returns at once.
    static let actionsPerRequest = 500
    /// The most pages open at once: each may hold ``HTTPListener/queuedMessages`` messages queued.
    static let maximumPages = 16
    /// A comment this often on a quiet stream, so that a page that went away is found out.
    static let keepalive = Duration.seconds(15)

    let feed: InspectorFeed
    let domains: [String: HostedDomain]
    let openReader: @Sendable () throws -> any Journal
    /// Under an access policy: the page's peer proves no identity, so it is shown no store's actions or state.
    let restricted: Bool
    let logger: Logger

    private var reader: (any Journal)?
    /// The newest events, `text/event-stream` encoded (and whether each is a status): those not yet sent to the
    /// open streams, after those a page that opens is sent first.
    private var timeline: [(bytes: [UInt8], isStatus: Bool)] = []
    /// How many of `timeline`'s events the open streams have been sent.
    private var sent = 0
    /// The open streams.
    private var streams: Set<[UInt8]> = []
    /// The last seq of each store sent to the streams.
    private var tailed: [StoreName: UInt64] = [:]
    private var nextNotice = 0
    private var status: DaemonStatus?
    private var lastEventAt = ContinuousClock.now
    /// The last journal error reported to the streams, so it is reported once, not every 100 ms.
    private var readerProblem: String?

    init(
        feed: InspectorFeed,
        domains: [HostedDomain],
        restricted: Bool,
        logger: Logger,
        openReader: @escaping @Sendable () throws -> any Journal
    ) {
        self.feed = feed
        self.domains = Dictionary(domains.map { ($0.name, $0) }) { first, _ in first }
        self.restricted = restricted
        self.logger = logger
        self.openReader = openReader
    }

    var isStreaming: Bool { !streams.isEmpty }

    mutating func answer(_ request: HTTPRequest, connection id: [UInt8]) -> HTTPResponse {
        switch request.path {
        case "/", "/index.html":
            return HTTPResponse(status: 200, contentType: "text/html; charset=utf-8", body: Self.page)
        case "/api/status":
            guard let status = feed.current.status else {
                return Self.problem(503, "the daemon has not finished starting; try again in a second")
            }
            return .json(200, status.json)
        case "/api/live":
            guard streams.count < Self.maximumPages else {
                return Self.problem(503, "\(Self.maximumPages) pages are open on this daemon already; close one")
            }
            if streams.isEmpty {
                refresh(now: .now)
                sent = timeline.count
            }
            streams.insert(id)
            var body = Array("retry: 1000\n\n".utf8)
            if let status { body += Self.event("status", status.json) }
            // The backlog's actions and happenings: of the statuses, only the newest.
            for event in timeline[..<sent] where !event.isStatus { body += event.bytes }
            return .events(body)
        case "/api/state", "/api/actions":
            do throws(Refusal) {
                let store = try readable(request.query)
                return request.path == "/api/state" ? state(of: store, request.query) : actions(of: store, request.query)
            } catch {
                return error.response
            }
        default:
            return .text(404, "nothing at \(request.path.prefix(200)); the inspector's page is at /")
        }
    }

    mutating func closed(_ id: [UInt8]) {
        streams.remove(id)
        guard streams.isEmpty else { return }
        // Nobody watches: the next page starts from the newest, not from where this one left off.
        timeline = []
        tailed = [:]
    }

    mutating func streamed(now: ContinuousClock.Instant) -> [(id: [UInt8], bytes: [UInt8])] {
        refresh(now: now)
        guard sent < timeline.count else { return [] }
        let bytes = Array(timeline[sent...].map(\.bytes).joined())
        sent = timeline.count
        if timeline.count > 2 * Self.backlogCapacity {
            timeline.removeFirst(timeline.count - Self.backlogCapacity)
            sent = timeline.count
        }
        // A page that cannot take them is closed by the listener (its queue is full), never waited for.
        return streams.map { ($0, bytes) }
    }

    // MARK: The live stream

    /// Adds what happened since the last call to the timeline: status changes and what they mean, rejections and
    /// ERRORs, and each store's new actions.
    private mutating func refresh(now: ContinuousClock.Instant) {
        let read = feed.read(noticesFrom: nextNotice)
        nextNotice = read.next
        if let new = read.status, new != status {
            for happening in InspectorHappenings.between(status, new) {
                append(
                    "happening",
                    Array(#"{"kind":\#(jsonString(happening.kind)),"text":\#(jsonString(happening.text))}"#.utf8)
                )
            }
            status = new
            append("status", new.json)
        }
        if read.lost > 0 { append("lost", Array(#"{"notices":\#(read.lost)}"#.utf8)) }
        for notice in read.notices { append(notice) }
        if !restricted {
            for (store, seq) in read.published.sorted(by: { $0.key < $1.key }) { tail(store, through: seq) }
        }
        if now - lastEventAt >= Self.keepalive { append(nil, Array(": keepalive".utf8)) }
    }

    private mutating func append(_ notice: InspectorFeed.Notice) {
        switch notice {
        case let .rejected(store, author, code, reason, actions):
            guard !restricted else {
                return append("rejected", Array(#"{"store":\#(jsonString(store)),"code":\#(jsonString(code))}"#.utf8))
            }
            var json = Array(#"{"store":\#(jsonString(store)),"author":\#(jsonString(author)),"#.utf8)
            json += Array(#""code":\#(jsonString(code)),"reason":\#(jsonString(reason)),"actions":["#.utf8)
            for (index, action) in actions.enumerated() {
                if index > 0 { json.append(UInt8(ascii: ",")) }
                json += Self.oneLine(action)
            }
            append("rejected", json + Array("]}".utf8))
        case let .error(code, reason):
            // Under a policy a reason may name an identity or a store: the anonymous page gets the code.
            let told = restricted ? "" : #","reason":\#(jsonString(reason))"#
            append("refused", Array(#"{"code":\#(jsonString(code))\#(told)}"#.utf8))
        }
    }

    /// Sends `store`'s actions after the last one sent through `seq` — the newest ``actionsPerTick`` of them, the
    /// others counted as skipped.
    private mutating func tail(_ store: StoreName, through seq: UInt64) {
        let last = tailed[store] ?? seq - min(seq, Self.backlog)
        guard seq > last else {
            tailed[store] = seq
            return
        }
        var from = last + 1
        if seq - last > Self.actionsPerTick {
            from = seq - Self.actionsPerTick + 1
            if tailed[store] != nil {
                let name = jsonString(store.rawValue)
                append("skipped", Array(#"{"store":\#(name),"from":\#(last + 1),"to":\#(from - 1)}"#.utf8))
            }
        }
        do {
            switch try journal().events(store: store.rawValue, from: from, to: seq, limit: Int(Self.actionsPerTick)) {
            case let .events(events):
                for event in events { append("action", Self.json(event)) }
                tailed[store] = events.last?.seq ?? last
            case let .compacted(firstAvailable):
                tailed[store] = firstAvailable - 1
            }
            readerProblem = nil
        } catch {
            let problem = "cannot read \(store)'s actions from the journal: \(error)"
            guard problem != readerProblem else { return }
            readerProblem = problem
            logger.warning("the inspector cannot read the journal", metadata: ["error": "\(error)"])
            append("happening", Array(#"{"kind":"problem","text":\#(jsonString(problem))}"#.utf8))
        }
    }

    /// Adds one server-sent event (`name` nil: a comment) to the timeline.
    private mutating func append(_ name: String?, _ data: [UInt8]) {
        lastEventAt = .now
        timeline.append((name.map { Self.event($0, data) } ?? data + [10, 10], name == "status"))
    }

    static func event(_ name: String, _ data: [UInt8]) -> [UInt8] {
        Array("event: \(name)\ndata: ".utf8) + oneLine(data) + [10, 10]
    }

    /// JSON on one line: the line breaks JSON allows between tokens become spaces (inside a string it has none).
    static func oneLine(_ json: [UInt8]) -> [UInt8] {
        json.contains { $0 == 10 || $0 == 13 } ? json.map { $0 == 10 || $0 == 13 ? 32 : $0 } : json
    }

    static func json(_ event: JournalEvent) -> [UInt8] {
        Array(
            #"{"store":\#(jsonString(event.store)),"seq":\#(event.seq),"author":\#(jsonString(event.author)),"action":"#
                .utf8
        )
            + oneLine(event.action) + [UInt8(ascii: "}")]
    }

    // MARK: Reads

    /// The journal the inspector reads, opened at first use (the daemon may not have made it yet).
    private mutating func journal() throws -> any Journal {
        if let reader { return reader }
        let opened = try openReader()
        reader = opened
        return opened
    }

    /// `/api/state?store=NAME&seq=N`: the store's state after its event `seq` (the newest without one), with its
    /// digest.
    private mutating func state(of store: Readable, _ query: [String: String]) -> HTTPResponse {
        guard let seq = query["seq"].map({ UInt64($0) }) ?? store.published, seq <= store.published else {
            return Self.problem(
                400,
                "seq '\(query["seq"] ?? "")' is not a seq of \(store.name): give one from 0 to \(store.published)"
            )
        }
        do {
            let state = try store.domain.state(try journal(), seq)
            var body = Array(#"{"store":\#(jsonString(store.name.rawValue)),"seq":\#(seq),"#.utf8)
            body += Array(#""digest":"\#(StateDigest(of: state))","bytes":\#(state.count),"state":"#.utf8)
            return .json(200, body + state + [UInt8(ascii: "}")])
        } catch {
            return Self.problem(409, "cannot show \(store.name) at seq \(seq): \(error)")
        }
    }

    /// `/api/actions?store=NAME&from=A&to=B`: the store's actions `A...B` (at most ``actionsPerRequest``).
    private mutating func actions(of store: Readable, _ query: [String: String]) -> HTTPResponse {
        guard let from = query["from"].flatMap({ UInt64($0) }), let to = query["to"].flatMap({ UInt64($0) }),
            from >= 1, from <= to
        else {
            return Self.problem(
                400,
                "from '\(query["from"] ?? "")' and to '\(query["to"] ?? "")' are not a range of seqs: give "
                    + "1 ≤ from ≤ to (\(store.name) is at \(store.published))"
            )
        }
        do {
            let range = try journal().events(
                store: store.name.rawValue,
                from: from,
                to: min(to, store.published),
                limit: Self.actionsPerRequest
            )
            guard case let .events(events) = range else {
                guard case let .compacted(first) = range else { return Self.problem(500, "unexpected range") }
                return Self.problem(
                    409,
                    "\(store.name)'s actions before seq \(first) are compacted away (snapshots keep their states)"
                )
            }
            return .json(
                200,
                Array("[".utf8) + Array(events.map(Self.json).joined(separator: [UInt8(ascii: ",")])) + Array("]".utf8)
            )
        } catch {
            return Self.problem(409, "cannot read \(store.name)'s actions \(from)...\(to): \(error)")
        }
    }

    /// A store the page may read: its name, its domain and the seq it has published.
    typealias Readable = (name: StoreName, domain: HostedDomain, published: UInt64)

    /// The store a query names, if the page may read it.
    private func readable(_ query: [String: String]) throws(Refusal) -> Readable {
        guard !restricted else {
            throw Refusal(
                response: Self.problem(
                    403,
                    "this daemon has an access policy, and the inspector's HTTP peer proves no identity: it shows no "
                        + "store's actions or state (docs/security.md)"
                )
            )
        }
        let text = query["store"] ?? ""
        guard let domain = domains[text], let name = try? StoreName(text) else {
            throw Refusal(
                response: Self.problem(
                    404,
                    "no store named '\(text.prefix(100))'; this daemon hosts \(domains.keys.sorted().joined(separator: ", "))"
                )
            )
        }
        guard let published = feed.current.published[name] else {
            throw Refusal(
                response: Self.problem(503, "this daemon does not lead \(name) now: ask the leader's inspector")
            )
        }
        return (name, domain, published)
    }

    /// A request the inspector will not answer, with the response that says why.
    struct Refusal: Error {
        var response: HTTPResponse
    }

    static func problem(_ status: Int, _ message: String) -> HTTPResponse {
        .json(status, Array(#"{"error":\#(jsonString(message))}"#.utf8))
    }
}

/// What a change of STATUS means to a person watching: a takeover, a replica that joined, left, repaired, resynced or
/// diverged.
enum InspectorHappenings {
    struct Happening: Hashable {
        var kind: String
        var text: String
    }

    static func between(_ old: DaemonStatus?, _ new: DaemonStatus) -> [Happening] {
        guard let old else { return [] }
        var happenings: [Happening] = []
        if old.role != new.role {
            happenings.append(.init(kind: "role", text: "this daemon is now \(new.role?.rawValue ?? "leader")"))
        }
        if let leader = new.leader, leader != old.leader, leader.term != old.leader?.term {
            happenings.append(.init(kind: "takeover", text: "\(leader.name) leads, term \(leader.term)"))
        }
        for store in new.stores {
            if let before = old.stores.first(where: { $0.name == store.name }), before.epoch != store.epoch {
                happenings.append(.init(kind: "epoch", text: "\(store.name) has a new epoch \(store.epoch)"))
            }
        }
        func key(_ replica: DaemonStatus.Replica) -> String { "\(replica.store) \(replica.client)" }
        let before = Dictionary((old.replicas ?? []).map { (key($0), $0) }) { first, _ in first }
        let now = Dictionary((new.replicas ?? []).map { (key($0), $0) }) { first, _ in first }
        for replica in new.replicas ?? [] {
            let who = "replica \(replica.name) of \(replica.store)"
            guard let was = before[key(replica)] else {
                happenings.append(.init(kind: "joined", text: "\(who) reports, at seq \(replica.seq)"))
                continue
            }
            if replica.divergences > was.divergences {
                happenings.append(.init(kind: "divergence", text: "\(who) diverged (\(replica.divergences) in all)"))
            }
            if replica.resyncs > was.resyncs {
                happenings.append(.init(kind: "resync", text: "\(who) resynced (\(replica.resyncs) in all)"))
            }
            if replica.repairs > was.repairs {
                happenings.append(.init(kind: "repair", text: "\(who) repaired a gap (\(replica.repairs) in all)"))
            }
        }
        for replica in old.replicas ?? [] where now[key(replica)] == nil {
            happenings.append(.init(kind: "left", text: "replica \(replica.name) of \(replica.store) went silent"))
        }
        return happenings
    }
}
