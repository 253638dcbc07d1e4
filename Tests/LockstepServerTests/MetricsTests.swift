import Foundation
import LockstepProtocol
import Testing

@testable import LockstepServer

/// The HTTP listener's connections and the leader's roster of replicas, as values: no socket, no clock.
@Suite struct MetricsTests {
    let start = ContinuousClock.now
    let id: [UInt8] = [0, 1, 2, 3, 4]

    func route(_ request: HTTPRequest) -> HTTPResponse { .text(200, "\(request.method) \(request.path)") }

    @Test func aRequestInPiecesIsAnsweredOnceWholeAndClosed() {
        var connections = HTTPConnections()
        #expect(connections.received(id: id, [], now: start, route: route).isEmpty)
        #expect(connections.count == 1)
        #expect(connections.received(id: id, Array("GET /metrics?x=1 HT".utf8), now: start, route: route).isEmpty)
        let outputs = connections.received(id: id, Array("TP/1.1\r\nHost: a\r\n\r\n".utf8), now: start, route: route)
        #expect(outputs == [.respond(id: id, .text(200, "GET /metrics"), head: false)])
        #expect(connections.count == 0)
        let bytes = String(decoding: HTTPResponse.text(200, "GET /metrics").encoded(), as: UTF8.self)
        #expect(bytes.hasPrefix("HTTP/1.1 200 OK\r\n") && bytes.contains("Content-Length: 13\r\n"))
        #expect(bytes.contains("Connection: close\r\n") && bytes.hasSuffix("\r\n\r\nGET /metrics\n"))
        #expect(!String(decoding: HTTPResponse.text(200, "x").encoded(head: true), as: UTF8.self).contains("x\n"))
    }

    @Test func badRequestsAreRefusedNamingWhatWasWrong() {
        func answer(_ text: String) -> HTTPConnections.Output? {
            var connections = HTTPConnections()
            _ = connections.received(id: id, [], now: start, route: route)
            return connections.received(id: id, Array(text.utf8), now: start, route: route).first
        }
        guard case let .respond(_, bad, _) = answer("HELLO\r\n\r\n") else { return #expect(Bool(false)) }
        #expect(bad.status == 400 && String(decoding: bad.body, as: UTF8.self).contains("got 'HELLO'"))
        guard case let .respond(_, post, _) = answer("POST /metrics HTTP/1.1\r\n\r\n") else {
            return #expect(Bool(false))
        }
        #expect(post.status == 405 && String(decoding: post.body, as: UTF8.self).contains("POST is not served"))
        guard case let .respond(_, head, true) = answer("HEAD /metrics HTTP/1.0\r\n\r\n") else {
            return #expect(Bool(false))
        }
        #expect(head.status == 200)
        var connections = HTTPConnections()
        _ = connections.received(id: id, [], now: start, route: route)
        let endless = Array(repeating: UInt8(ascii: "a"), count: HTTPConnections.maximumHeadBytes + 1)
        guard case let .respond(_, big, _) = connections.received(id: id, endless, now: start, route: route).first
        else { return #expect(Bool(false)) }
        #expect(big.status == 431 && connections.count == 0)
    }

    @Test func idleAndSurplusConnectionsAreClosed() {
        var connections = HTTPConnections()
        for index in 0..<HTTPConnections.maximumConnections {
            #expect(connections.received(id: [UInt8(index)], [], now: start, route: route).isEmpty)
        }
        #expect(connections.received(id: [255], [], now: start, route: route) == [.close(id: [255])])
        #expect(connections.expire(now: start + .seconds(9)).isEmpty)
        #expect(
            connections.expire(now: start + HTTPConnections.idleTimeout).count == HTTPConnections.maximumConnections
        )
        #expect(connections.count == 0)
        // A connection that went away is forgotten; bytes on one never announced are dropped.
        _ = connections.received(id: id, [], now: start, route: route)
        _ = connections.received(id: id, [], now: start, route: route)
        #expect(connections.count == 0)
        #expect(connections.received(id: id, Array("GET / HTTP/1.1\r\n\r\n".utf8), now: start, route: route).isEmpty)
    }

    func report(
        _ client: ClientID,
        applied: SequenceNumber,
        epoch: Epoch? = Epoch(rawValue: 7),
        divergences: UInt64 = 0
    ) -> ReplicaProgress {
        ReplicaProgress(
            clientID: client,
            store: try! StoreName("todos"),
            name: "host:1",
            epoch: epoch,
            appliedSeq: applied,
            interval: .seconds(1),
            divergences: divergences
        )
    }

    @Test func aReplicasLagIsMeasuredAtItsReportAndGrowsOnceItIsOverdue() throws {
        let store = try StoreName("todos")
        let epoch = Epoch(rawValue: 7)
        var roster = ReplicaRoster()
        for seq in stride(from: 10, through: 100, by: 10) {
            roster.committed(store, through: SequenceNumber(seq), now: start + .milliseconds(seq * 10))
        }
        let client = ClientID.random()
        // At 1.1 s it has applied 50 of 100: 50 behind, and seq 51 was committed at 0.6 s.
        let now = start + .milliseconds(1_100)
        _ = roster.heard(report(client, applied: 50), epoch: epoch, seq: 100, now: now)
        let lag = try #require(roster.lags(stores: [store: (epoch, 100)], now: now).first?.lag)
        #expect(lag == ReplicaRoster.Lag(events: 50, time: .milliseconds(500)))
        // On time (within two intervals) its report stands, though 20 more were committed since.
        roster.committed(store, through: 120, now: now + .milliseconds(500))
        let onTime = roster.lags(stores: [store: (epoch, 120)], now: now + .milliseconds(1_900))
        #expect(onTime.first?.lag == lag)
        // Overdue: measured now, as if it had applied nothing since.
        let overdue = roster.lags(stores: [store: (epoch, 120)], now: now + .milliseconds(2_500))
        #expect(overdue.first?.lag == ReplicaRoster.Lag(events: 70, time: .milliseconds(3_000)))
        // A replica of another epoch has none of this one's events.
        let other = ClientID.random()
        _ = roster.heard(report(other, applied: 500, epoch: Epoch(rawValue: 8)), epoch: epoch, seq: 120, now: now)
        let lags = roster.lags(stores: [store: (epoch, 120)], now: now)
        #expect(lags.first { $0.key.client == other }?.lag.events == 120)
        // Silent for ten intervals, it leaves.
        #expect(roster.expire(now: now + .seconds(9)).isEmpty)
        #expect(roster.expire(now: now + .seconds(10)).count == 2)
        #expect(roster.replicas.isEmpty)
    }

    @Test func aReportAddsOnlyWhatItsCountsGrewBy() {
        var roster = ReplicaRoster()
        let client = ClientID.random()
        let epoch = Epoch(rawValue: 7)
        #expect(
            roster.heard(report(client, applied: 1, divergences: 2), epoch: epoch, seq: 1, now: start).divergences == 2
        )
        #expect(
            roster.heard(report(client, applied: 1, divergences: 2), epoch: epoch, seq: 1, now: start).divergences == 0
        )
        #expect(
            roster.heard(report(client, applied: 1, divergences: 3), epoch: epoch, seq: 1, now: start).divergences == 1
        )
        // A replica that started again counts from zero.
        #expect(
            roster.heard(report(client, applied: 1, divergences: 1), epoch: epoch, seq: 1, now: start).divergences == 1
        )
    }

    @Test func listenAddressesAreReadOrRefusedNamingTheValue() throws {
        #expect(try HTTPListener.split("127.0.0.1:9464") == ("127.0.0.1", 9464))
        #expect(try HTTPListener.split("[::1]:0") == ("::1", 0))
        for bad in ["localhost", "127.0.0.1:", ":80", "1.2.3.4:70000", "a b:1"] {
            #expect(throws: ServerError.self) { try HTTPListener.split(bad) }
        }
        var configuration = DaemonConfiguration(environment: [:], domains: ["todos"])
        configuration.httpListen = "nowhere"
        #expect(throws: ConfigurationError.self) { try configuration.validate(knownDomains: ["todos"]) }
    }
}
