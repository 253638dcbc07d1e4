import Foundation
import Lockstep
import LockstepClient
import LockstepExamples
import LockstepProtocol
import LockstepTesting
import TestSupport
import Testing
import ZeroMQ

#if canImport(Glibc)
import Glibc
#endif

/// `/metrics` on a real daemon: what it counts is what the clients were told, and a replica's lag is seen rising
/// while it is stopped and falling once it goes on (docs/operations.md, "Metrics").
@Suite struct MetricsProcessTests {
    /// The daemon's metrics, scraped over HTTP.
    func scrape(_ address: String) async throws -> String {
        let answer = try await offPool("scrape") { try httpGet(address, "/metrics") }
        #expect(answer.status == 200, "\(answer.head)")
        #expect(answer.head.contains("Content-Type: text/plain; version=0.0.4"), "\(answer.head)")
        return answer.body
    }

    @Test func metricsCountWhatClientsWereToldAndAStoppedReplicasLagRisesAndFalls() async throws {
        let directory = try TestSupport.temporaryDirectory("metrics").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // A snapshot every 100 events, so the journal compacts during the run.
        let file = "\(directory)/lockstepd.toml"
        try "[snapshots]\nevery_events = 100\n".write(toFile: file, atomically: true, encoding: .utf8)
        let daemon = try DaemonProcess(
            directory: directory,
            arguments: [
                "--config", file, "--domain", "todos", "--domain", "reminders", "--http-listen", "127.0.0.1:0",
            ]
        )
        let address = try #require(try await daemon.waitUntilServing().http)
        // A replica in another process, which reports to the daemon every second (the default).
        let watcher = try ReplicaClient(daemon, stores: ["todos"], actions: 0)

        // Load: 8 tasks dispatching adds (each acknowledged is counted) and toggles of ids that do not exist (each
        // rejected), while the metrics are scraped.
        var configuration = DispatcherConfiguration(commandEndpoints: [daemon.command])
        configuration.requestTimeout = .seconds(2)
        configuration.retries = 10
        let dispatcher = try Dispatcher(Todos.self, configuration: configuration)
        let (accepted, rejected, scrapedDuringLoad) = try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await dispatcher.run() }
            let tally = AnswerTally()
            async let scraped = { () async throws -> Int in
                var scrapes = 0
                // Until the dispatches are answered; bounded, and cut short when they fail (the task is cancelled).
                for _ in 0..<5_000 where !Task.isCancelled {
                    guard await tally.total < 8 * 60 else { break }
                    let text = try await scrape(address)
                    if prometheusSample(text, "lockstep_actions_accepted_total", ["store": "todos"]) != nil {
                        scrapes += 1
                    }
                }
                return scrapes
            }()
            try await withThrowingTaskGroup(of: Void.self) { tasks in
                for task in 0..<8 {
                    tasks.addTask {
                        for index in 0..<60 {
                            if index % 4 == 3 {
                                do {
                                    try await dispatcher.dispatch(.toggle(id: 1_000_000 + task * 100 + index))
                                    Issue.record("toggling an unknown id was accepted")
                                } catch is Rejection {
                                    await tally.rejected()
                                }
                            } else {
                                try await dispatcher.dispatch(.add(text: "task \(task) item \(index)"))
                                await tally.accepted()
                            }
                        }
                    }
                }
                try await tasks.waitForAll()
            }
            let counts = (await tally.acceptedCount, await tally.rejectedCount, try await scraped)
            group.cancelAll()
            while try await group.next() != nil {}
            return counts
        }
        #expect(accepted == 8 * 45 && rejected == 8 * 15)
        #expect(scrapedDuringLoad >= 1)
        // One action no case of the domain has: an ERROR, counted by its code.
        let wrong = try await runProduct(
            "lockstep",
            ["dispatch", "todos", #"{"restock":{}}"#, "--command-endpoint", daemon.command]
        )
        #expect(wrong.status != 0)

        // The metrics catch up within their second.
        var text = ""
        let counted = try await eventually(within: .seconds(10), every: .milliseconds(200)) {
            text = try await scrape(address)
            return prometheusSample(text, "lockstep_actions_accepted_total", ["store": "todos"]) == Double(accepted)
                && prometheusSample(text, "lockstep_actions_rejected_total", ["store": "todos", "code": "unknown_id"])
                    == Double(rejected)
                && prometheusSample(text, "lockstep_errors_total", ["code": "undecodable_action"]) == 1
        }
        #expect(counted, "the metrics never matched what the clients were told:\n\(text)")
        #expect(prometheusSample(text, "lockstep_store_seq", ["store": "todos"]) == Double(accepted))
        #expect(prometheusSample(text, "lockstep_leader") == 1)
        // Every commit's batch recorded: as many actions in the histogram as were journaled.
        #expect(prometheusSample(text, "lockstep_commit_batch_actions_sum") == Double(accepted))
        #expect((prometheusSample(text, "lockstep_journal_commit_seconds_count", ["journal": "log"]) ?? 0) >= 1)
        // 360 events, a snapshot once 100 more are in (at a commit's end): three; two are kept, so the events are
        // compacted away through the second, at 200 or a little past it.
        #expect(prometheusSample(text, "lockstep_snapshots_total", ["store": "todos"]) == 3)
        let compacted = prometheusSample(text, "lockstep_journal_compacted_through", ["store": "todos"]) ?? 0
        #expect((200..<Double(accepted)).contains(compacted), "compacted through \(compacted)")

        // The watcher, caught up, reported itself.
        func watcherLag(_ text: String) -> (events: Double, seconds: Double)? {
            let line = text.split(separator: "\n").first {
                $0.hasPrefix("lockstep_replica_lag_events{") && $0.contains(#"store="todos""#)
            }
            let seconds = text.split(separator: "\n").first {
                $0.hasPrefix("lockstep_replica_lag_seconds{") && $0.contains(#"store="todos""#)
            }
            guard let line, let seconds, let events = Double(line.split(separator: " ").last ?? ""),
                let time = Double(seconds.split(separator: " ").last ?? "")
            else { return nil }
            return (events, time)
        }
        // At the last seq: a replica that has not heard of the last events yet reports no lag too (a CI run under
        // load once read the roster while the watcher stood 48 events behind, reporting 0).
        let caughtUp = try await eventually(within: .seconds(30), every: .milliseconds(200)) {
            text = try await scrape(address)
            guard watcherLag(text)?.events == 0, prometheusSample(text, "lockstep_replicas", ["store": "todos"]) == 1
            else { return false }
            return await daemon.status()?.replicas?.first { $0.store == "todos" }?.seq == UInt64(accepted)
        }
        #expect(caughtUp, "the watcher never reported itself caught up:\n\(text)")
        // The dashboard and the alerts in deploy/ name only metrics a daemon serves (`lease_term` on a PostgreSQL
        // journal only; `lockstep_client_*` are a replica process's own).
        let served = Set(
            text.split(separator: "\n").filter { !$0.hasPrefix("#") }.map {
                String($0.prefix { $0 != "{" && $0 != " " })
            }
        )
        let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        for (file, least) in [
            ("deploy/grafana/lockstep-dashboard.json", 20), ("deploy/prometheus/lockstep-alerts.yml", 4),
        ] {
            let content = try String(contentsOf: repository.appendingPathComponent(file), encoding: .utf8)
            let names = Set(content.matches(of: try Regex("lockstep_[a-z_]+")).map { String(content[$0.range]) })
            #expect(names.count >= least, "\(file) names \(names.count) metrics")
            for name in names.sorted() where !name.hasPrefix("lockstep_client_") && name != "lockstep_lease_term" {
                // A histogram by its own name, as its description may call it.
                let known = served.contains(name) || served.contains(name + "_count")
                #expect(known, "\(file) names \(name), which the daemon does not serve")
            }
        }
        let replica = try #require(await daemon.status()?.replicas?.first { $0.store == "todos" })
        #expect(replica.seq == UInt64(accepted) && replica.lagEvents == 0 && replica.divergences == 0)

        // Stopped, it reports nothing: once its report is overdue, its lag is the events committed since. It leaves
        // the roster 10 s after its last report (`ReplicaRoster.minimumExpiry`), so what is checked meanwhile is kept
        // short: 50 dispatches, then the metrics and `lockstep stats` read together until both show the lag.
        watcher.child.signal(SIGSTOP)
        let more = try await runProduct(
            "lockstep",
            [
                "dispatch", "todos", #"{"add":{"text":"while it sleeps"}}"#, "--repeat", "50", "--command-endpoint",
                daemon.command,
            ]
        )
        #expect(more.status == 0, "\(more.standardError)")
        var stats = ""
        let behind = try await eventually(within: .seconds(8), every: .milliseconds(200)) {
            text = try await scrape(address)
            guard let lag = watcherLag(text), lag.events == 50, lag.seconds >= 1 else { return false }
            stats = try await runProduct("lockstep", ["stats", "--command-endpoint", daemon.command]).standardOutput
            let row = stats.split(separator: "\n").first { $0.hasPrefix("todos") && $0.contains("repairs") }
            return row?.split(separator: " ").prefix(5).contains("50") == true
        }
        #expect(behind, "the stopped replica's lag never rose to 50 events and 1 s in both:\n\(text)\n\(stats)")

        // Going on, it applies them and says so: the lag falls to nothing.
        watcher.child.signal(SIGCONT)
        let recovered = try await eventually(within: .seconds(30), every: .milliseconds(200)) {
            text = try await scrape(address)
            return watcherLag(text)?.events == 0
        }
        #expect(recovered, "the replica's lag never fell back after SIGCONT:\n\(text)")
        #expect(prometheusSample(text, "lockstep_replica_divergences_total", ["store": "todos"]) == 0)
        #expect(try await watcher.stop().status == 0)
        #expect(await daemon.stop() == 0)
    }

    @Test func theInspectorReadsTheJournalOfARestartedDaemon() async throws {
        let directory = try TestSupport.temporaryDirectory("inspector-restart").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let daemon = try DaemonProcess(directory: directory, arguments: ["--http-listen", "127.0.0.1:0"])
        _ = try await daemon.waitUntilServing()
        let added = try await runProduct(
            "lockstep",
            [
                "dispatch", "todos", #"{"add":{"text":"before the restart"}}"#, "--repeat", "3", "--command-endpoint",
                daemon.command,
            ]
        )
        #expect(added.status == 0, "\(added.standardError)")
        #expect(await daemon.stop() == 0)
        // Started again, with nothing dispatched since: the inspector reads what the journal holds.
        try daemon.start(arguments: ["--http-listen", "127.0.0.1:0"])
        let address = try #require(try await daemon.waitUntilServing().http)
        var page: HTTPAnswer?
        let read = try await eventually(within: .seconds(10), every: .milliseconds(100)) {
            page = try await offPool("get") { try httpGet(address, "/api/state?store=todos") }
            return page?.status == 200
        }
        #expect(read, "\(String(describing: page?.body))")
        let body = page?.body ?? ""
        #expect(body.hasPrefix(#"{"store":"todos","seq":3,"#) && body.contains("before the restart"), "\(body)")
        let actions = try await offPool("get") { try httpGet(address, "/api/actions?store=todos&from=1&to=3") }
        #expect(actions.status == 200 && actions.body.components(separatedBy: #""add""#).count == 4, "\(actions.body)")
        #expect(await daemon.stop() == 0)
    }

    @Test func aListenAddressThatCannotBeBoundStopsTheDaemonNamingIt() async throws {
        let directory = try TestSupport.temporaryDirectory("metrics-bind").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let first = try DaemonProcess(
            directory: directory + "/a",
            arguments: ["--http-listen", "127.0.0.1:0", "--no-http-inspector"]
        )
        let address = try #require(try await first.waitUntilServing().http)
        // The same port again: taken.
        let second = try DaemonProcess(directory: directory + "/b", arguments: ["--http-listen", address])
        let status = await second.waitForExit(within: .seconds(30))
        #expect(status == 1)
        #expect(second.output.contains("cannot listen for HTTP on '\(address)'"), "\(second.output)")
        // A malformed address never gets that far.
        let usage = try await runProduct("lockstepd", ["--http-listen", "localhost"])
        #expect(usage.status == 78)
        #expect(usage.standardError.contains("http.listen: HTTP listen address 'localhost' is not HOST:PORT"))
        // Its inspector switched off (--no-http-inspector): no page, and a word on how to have one.
        let page = try await offPool("get") { try httpGet(address, "/") }
        #expect(page.status == 404 && page.body.contains("its inspector is off"), "\(page.body)")
        #expect(await first.stop() == 0)
    }
}

/// What the dispatching tasks were told.
private actor AnswerTally {
    private(set) var acceptedCount = 0
    private(set) var rejectedCount = 0
    var total: Int { acceptedCount + rejectedCount }
    func accepted() { acceptedCount += 1 }
    func rejected() { rejectedCount += 1 }
}
