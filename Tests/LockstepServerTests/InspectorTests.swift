import Foundation
import Lockstep
import LockstepExamples
import LockstepJournal
import LockstepProtocol
import Logging
import Testing

@testable import LockstepServer

/// The inspector as values: what it answers, what its stream carries, what a change of STATUS means. No socket:
/// Tests/Inspector drives the page in a real browser against a real daemon.
@Suite struct InspectorTests {
    let id: [UInt8] = [9, 9, 9, 9, 9]

    /// An inspector over an in-memory journal holding todos' first `count` adds, published through that seq.
    func inspector(count: UInt64 = 3, restricted: Bool = false) throws -> (Inspector, InspectorFeed) {
        let journal = InMemoryJournal()
        _ = try journal.recover(Todos.self)
        let events = (1...count).map { seq in
            JournalEvent(
                store: "todos",
                seq: seq,
                action: Array(try! CanonicalEncoding.encode(Todos.Action.add(text: "todo \(seq)"))),
                clientID: Array(repeating: 1, count: 16),
                requestNumber: seq,
                author: seq == 2 ? "alice" : ""
            )
        }
        try journal.commit(JournalBatch(events: events))
        let feed = InspectorFeed()
        feed.published([try StoreName("todos"): count])
        let inspector = Inspector(
            feed: feed,
            domains: [HostedDomain(Todos.self)],
            restricted: restricted,
            logger: Logger(label: "test")
        ) { journal }
        return (inspector, feed)
    }

    func get(_ inspector: inout Inspector, _ path: String, _ query: [String: String] = [:]) -> (Int, String) {
        let response = inspector.answer(HTTPRequest(method: "GET", path: path, query: query), connection: id)
        return (response.status, String(decoding: response.body, as: UTF8.self))
    }

    @Test func queriesArePercentDecodedAndStreamsHaveNoLength() {
        var connections = HTTPConnections()
        var seen: HTTPRequest?
        _ = connections.received(id: id, [], now: .now) { _ in .text(200, "") }
        _ = connections.received(
            id: id,
            Array("GET /api/state?store=to%64os&seq=12&q=a+b HTTP/1.1\r\n\r\n".utf8),
            now: .now
        ) {
            seen = $0
            return .text(200, "")
        }
        #expect(
            seen == HTTPRequest(method: "GET", path: "/api/state", query: ["store": "todos", "seq": "12", "q": "a b"])
        )
        let head = String(decoding: HTTPResponse.events(Array("x".utf8)).encoded(), as: UTF8.self)
        #expect(head.contains("Content-Type: text/event-stream\r\n") && !head.contains("Content-Length"))
        #expect(HTTPResponse.text(200, "y").encoded().count > 0)
    }

    @Test func theStateAtAnySeqAndTheActionsBetween() throws {
        var (inspector, _) = try inspector()
        let (status, body) = get(&inspector, "/api/state", ["store": "todos", "seq": "1"])
        #expect(status == 200)
        let json = try #require(try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any])
        #expect(json["seq"] as? Int == 1 && (json["digest"] as? String)?.count == 64)
        let state = try #require(json["state"] as? [String: Any])
        let list = try #require(state["list"] as? [String: Any])
        #expect((list["items"] as? [Any])?.count == 1 && list["nextID"] as? Int == 2)
        // Without a seq, the newest published.
        #expect(get(&inspector, "/api/state", ["store": "todos"]).1.contains(#""seq":3"#))
        let (listed, actions) = get(&inspector, "/api/actions", ["store": "todos", "from": "2", "to": "9"])
        #expect(listed == 200)
        #expect(
            actions == #"[{"store":"todos","seq":2,"author":"alice","action":{"add":{"text":"todo 2"}}},"#
                + #"{"store":"todos","seq":3,"author":"","action":{"add":{"text":"todo 3"}}}]"#
        )
        #expect(get(&inspector, "/").1.contains("<title>Lockstep inspector</title>"))
    }

    @Test func badReadsAreRefusedNamingTheValue() throws {
        var (inspector, _) = try inspector()
        let cases: [([String: String], String, Int, String)] = [
            (["store": "nope"], "/api/state", 404, "no store named 'nope'; this daemon hosts todos"),
            (["store": "todos", "seq": "4"], "/api/state", 400, "seq '4' is not a seq of todos: give one from 0 to 3"),
            (["store": "todos", "seq": "x"], "/api/state", 400, "seq 'x' is not a seq of todos"),
            (["store": "todos", "from": "3", "to": "1"], "/api/actions", 400, "are not a range of seqs"),
        ]
        for (query, path, status, message) in cases {
            let (got, body) = get(&inspector, path, query)
            #expect(got == status && body.contains(message), "\(query): \(got) \(body)")
        }
        #expect(get(&inspector, "/nothing").0 == 404)
        var (restricted, feed) = try self.inspector(restricted: true)
        let (forbidden, why) = get(&restricted, "/api/state", ["store": "todos"])
        #expect(forbidden == 403 && why.contains("access policy"))
        // Its stream: no actions, rejections by store and code, ERRORs by code.
        let opened = String(decoding: restricted.answer(HTTPRequest(method: "GET", path: "/api/live"), connection: id).body, as: UTF8.self)
        #expect(!opened.contains("event: action"))
        feed.notice(.rejected(store: "todos", author: "bob", code: "unknown_id", reason: "no id 9", actions: [[1]]))
        feed.notice(.error(code: "forbidden", reason: "identity 'observer' may not read store 'todos'"))
        let told = String(decoding: restricted.streamed(now: .now).first?.bytes ?? [], as: UTF8.self)
        #expect(told.contains(#"data: {"store":"todos","code":"unknown_id"}"#) && !told.contains("bob"))
        #expect(told.contains(#"data: {"code":"forbidden"}"#) && !told.contains("observer"))
    }

    @Test func theStreamCarriesStatusActionsRejectionsAndErrorsAsTheyCome() throws {
        var (inspector, feed) = try inspector()
        feed.status(
            DaemonStatus(uptimeSeconds: 1, role: .leader, journal: "memory", stores: []),
            published: [try StoreName("todos"): 3]
        )
        let opened = inspector.answer(HTTPRequest(method: "GET", path: "/api/live"), connection: id)
        #expect(opened.streams && inspector.isStreaming)
        let first = String(decoding: opened.body, as: UTF8.self)
        // The status once, then the backlog: the three actions.
        #expect(first.components(separatedBy: "event: status").count == 2)
        #expect(first.components(separatedBy: "event: action").count == 4)
        #expect(first.contains(#"data: {"store":"todos","seq":2,"author":"alice","action":{"add":{"text":"todo 2"}}}"#))
        #expect(inspector.streamed(now: .now).isEmpty)

        feed.notice(
            .rejected(
                store: "todos",
                author: "bob",
                code: "unknown_id",
                reason: "no id 9",
                actions: [Array("{\n\"toggle\":{\"id\":9}}".utf8)]
            )
        )
        feed.notice(.error(code: "undecodable_action", reason: "not JSON"))
        let next = inspector.streamed(now: .now)
        #expect(next.count == 1 && next.first?.id == id)
        let text = String(decoding: next.first?.bytes ?? [], as: UTF8.self)
        #expect(text.contains("event: rejected\ndata: {\"store\":\"todos\",\"author\":\"bob\",\"code\":\"unknown_id\""))
        // JSON's line breaks between tokens never split an event's data line.
        #expect(text.contains(#""actions":[{ "toggle":{"id":9}}]}"#))
        #expect(text.contains("event: refused\ndata: {\"code\":\"undecodable_action\",\"reason\":\"not JSON\"}\n\n"))

        inspector.closed(id)
        #expect(!inspector.isStreaming)
        // At most so many pages at once: each may hold a queue of its own at the listener.
        for page in 0..<Inspector.maximumPages {
            #expect(inspector.answer(HTTPRequest(method: "GET", path: "/api/live"), connection: [UInt8(page)]).streams)
        }
        let refused = inspector.answer(HTTPRequest(method: "GET", path: "/api/live"), connection: [99])
        #expect(!refused.streams && refused.status == 503)
        #expect(String(decoding: refused.body, as: UTF8.self).contains("pages are open on this daemon already"))
    }

    @Test func aBusyStoreIsSentItsNewestActionsAndTheRestCountedAsSkipped() throws {
        var (inspector, feed) = try inspector(count: 200)
        feed.published([try StoreName("todos"): 100])
        _ = inspector.answer(HTTPRequest(method: "GET", path: "/api/live"), connection: id)
        feed.published([try StoreName("todos"): 200])
        let text = String(decoding: inspector.streamed(now: .now).first?.bytes ?? [], as: UTF8.self)
        #expect(text.contains(#"event: skipped"# + "\n" + #"data: {"store":"todos","from":101,"to":150}"#))
        #expect(text.components(separatedBy: "event: action").count == 51)
        #expect(text.contains(#""seq":151,"#) && text.contains(#""seq":200,"#) && !text.contains(#""seq":150,"#))
    }

    @Test func changesOfStatusAreToldAsHappenings() {
        func replica(_ name: String, divergences: UInt64 = 0, resyncs: UInt64 = 0) -> DaemonStatus.Replica {
            DaemonStatus.Replica(
                store: "todos",
                name: name,
                client: name,
                seq: 1,
                lagEvents: 0,
                lagMs: 0,
                heardMsAgo: 0,
                repairs: 0,
                resyncs: resyncs,
                divergences: divergences
            )
        }
        var old = DaemonStatus(uptimeSeconds: 1, role: .leader, journal: "j", stores: [])
        old.replicas = [replica("a"), replica("b")]
        old.leader = DaemonStatus.Leader(name: "one", term: 1, expiresAt: nil)
        var new = old
        new.replicas = [replica("a", divergences: 1, resyncs: 1), replica("c")]
        new.leader = DaemonStatus.Leader(name: "two", term: 2, expiresAt: nil)
        let told = InspectorHappenings.between(old, new).map(\.kind)
        #expect(told == ["takeover", "divergence", "resync", "joined", "left"])
        #expect(InspectorHappenings.between(nil, new).isEmpty)
        #expect(InspectorHappenings.between(new, new).isEmpty)
    }

    @Test func theFeedKeepsTheNewestNoticesAndCountsTheLost() {
        let feed = InspectorFeed()
        for index in 0..<(2 * InspectorFeed.capacity + 1) { feed.notice(.error(code: "c", reason: "\(index)")) }
        let read = feed.read(noticesFrom: 0)
        #expect(read.notices.count == InspectorFeed.capacity)
        #expect(read.lost == InspectorFeed.capacity + 1 && read.next == 2 * InspectorFeed.capacity + 1)
        #expect(read.notices.last == .error(code: "c", reason: "\(2 * InspectorFeed.capacity)"))
        #expect(feed.read(noticesFrom: read.next).notices.isEmpty)
    }
}
