import Foundation
import LockstepTesting
import TestSupport
import Testing
import ZeroMQ

/// `lockstep bench` end to end on a tiny run: every part runs as real processes and reports every figure
/// docs/performance.md documents. Only completeness and consistency are checked, never a speed.
@Suite(.serialized) struct BenchProcessTests {
    @Test func aShortBenchReportsEveryFigureAndLosesNoAcknowledgedDispatch() async throws {
        let output = try await runProduct(
            "lockstep",
            ["bench", "--json", "--seconds", "0.3", "--histories", "300", "--state-sizes", "1", "--no-redis"],
            timeout: .seconds(300)
        )
        #expect(output.status == 0, "\(output.standardError)")
        let json = try #require(
            try JSONSerialization.jsonObject(with: Data(output.standardOutput.utf8)) as? [String: Any],
            "not one JSON object: \(output.standardOutput)"
        )
        for key in [
            "baselines", "p1", "p2", "optimistic", "effects", "p3", "p4", "p5", "p6", "p7", "outside", "transport",
            "build", "total_seconds",
        ] {
            #expect(json[key] != nil, "no \(key) in \(json.keys.sorted())")
        }
        let allBaselines = try #require(json["baselines"] as? [String: Any])
        let baselines = allBaselines.compactMapValues { $0 as? Double }
        for key in [
            "req_rep_p50_us", "req_rep_p99_us", "req_rep_round_trips_per_s", "router8_req_round_trips_per_s",
            "router8_req_p50_us", "pub4_sub_msgs_per_s", "fsync_p50_us", "fsync_p99_us",
        ] {
            #expect((baselines[key] ?? 0) > 0, "baseline \(key) is \(baselines[key] ?? -1)")
        }
        // The raw clients answered as late as P2's at 8 wait: every figure made, and no echo came before its delay.
        let late = try #require(allBaselines["late_echo"] as? [String: Double], "\(allBaselines)")
        for key in ["p50_us", "round_trips_per_s", "echo_cpu_per_round_trip_us", "client_cpu_per_round_trip_us"] {
            #expect((late[key] ?? 0) > 0, "late_echo \(key): \(late)")
        }
        #expect((late["delay_us"] ?? -1) >= 0 && (late["p50_us"] ?? 0) >= late["delay_us"] ?? .infinity, "\(late)")
        let p1 = try #require(json["p1"] as? [String: Any])
        #expect((p1["dispatches"] as? Int ?? 0) > 0)
        #expect(p1["ratio_p50"] as? Double != nil)

        let p2 = try #require(json["p2"] as? [[String: Any]])
        #expect(p2.compactMap { $0["clients"] as? Int } == [1, 8, 32, 1, 1])
        // Then one process pipelining through a Dispatcher: its dispatches, all acknowledged, are all the seq advance.
        #expect(p2.compactMap { $0["in_flight"] as? Int } == [1, 1, 1, 32, 256])
        for row in p2 {
            // The daemon's seq advanced by exactly the dispatches acknowledged: nothing lost, nothing extra.
            #expect(row["acknowledged"] as? Int == row["committed"] as? Int, "\(row)")
            #expect(row["failures"] as? Int == 0, "\(row)")
            #expect((row["actions_per_s"] as? Double ?? 0) > 0)
            // The daemon's threads were found by their names and, with the clients, used some CPU per action. The
            // journal thread is found too, but with SQLite the loop commits and it stays (nearly) idle.
            for key in ["loop_cpu_per_action_us", "daemon_cpu_per_action_us", "client_cpu_per_action_us"] {
                #expect((row[key] as? Double ?? 0) > 0, "\(key): \(row)")
            }
            #expect((row["journal_cpu_per_action_us"] as? Double).map { $0 >= 0 } == true, "\(row)")
        }
        #expect((baselines["router8_req_client_cpu_per_round_trip_us"] ?? 0) > 0)
        // Optimistic dispatch through a replica: both latencies of every dispatch, none failed or rolled back.
        let optimistic = try #require(json["optimistic"] as? [String: Any])
        #expect((optimistic["dispatches"] as? Int ?? 0) > 0, "\(optimistic)")
        #expect(optimistic["failures"] as? Int == 0, "\(optimistic)")
        #expect(optimistic["resyncs"] as? Int == 0, "\(optimistic)")
        for key in ["optimistic_p50_us", "optimistic_p99_us", "confirmed_p50_us", "confirmed_p99_us"] {
            #expect((optimistic[key] as? Double ?? 0) > 0, "\(key): \(optimistic)")
        }
        let effects = try #require(json["effects"] as? [String: Any])
        #expect(effects["every_effect_ran_once"] as? Bool == true, "\(effects)")
        #expect((effects["dispatches"] as? Int ?? 0) > 0 && (effects["effects_run"] as? Int ?? 0) > 0, "\(effects)")
        for key in ["dispatch_to_start_p50_us", "dispatch_to_start_p99_us", "effects_per_s", "batched_actions_per_s"] {
            #expect((effects[key] as? Double ?? 0) > 0, "\(key): \(effects)")
        }
        // Each dispatch showed in the optimistic state before its handle resolved, so every percentile is no later.
        for percentile in ["p50", "p99"] {
            let shown = optimistic["optimistic_\(percentile)_us"] as? Double ?? .infinity
            #expect(shown <= optimistic["confirmed_\(percentile)_us"] as? Double ?? 0, "\(optimistic)")
        }
        // P1 and P2 again on a PostgreSQL journal, beside SQLite's (make deps installs PostgreSQL; without it the bench
        // says why it left the rows out, and this fails).
        let postgres = try #require(json["postgres"] as? [String: Any], "no PostgreSQL rows")
        let rows = try #require(postgres["p2"] as? [[String: Any]])
        #expect(rows.compactMap { $0["clients"] as? Int } == [1, 8, 32])
        for row in rows {
            #expect(row["acknowledged"] as? Int == row["committed"] as? Int, "\(row)")
            #expect(row["failures"] as? Int == 0, "\(row)")
        }
        let p3 = try #require(json["p3"] as? [[String: Any]])
        #expect(p3.compactMap { $0["replicas"] as? Int } == [4, 16])
        for row in p3 {
            #expect(row["resyncs"] as? Int == 0, "\(row)")
            #expect((row["replica_cpu_per_event_us"] as? Double ?? 0) > 0, "\(row)")
        }

        let p4 = try #require(json["p4"] as? [[String: Any]])
        #expect(p4.compactMap { $0["events"] as? Int } == [300, 1_000])
        let posts = try #require(p4.last)
        #expect((posts["state_bytes"] as? Int ?? 0) > 1_000_000)

        let p5 = try #require(json["p5"] as? [[String: Any]])
        #expect(p5.compactMap { $0["subscribers"] as? Int } == [0, 1, 100, 10, 10])
        // (d): the array and the DigestedDictionary, each named.
        #expect(p5.compactMap { $0["state"] as? String }.count == 2, "\(p5)")
        #expect(p5.allSatisfy { ($0["dispatches_per_s"] as? Double ?? 0) > 0 }, "\(p5)")
        let p6 = try #require(json["p6"] as? [String: Any])
        let peaks = (p6["daemon_peak_bytes"] as? Int ?? 0, p6["replica_peak_bytes"] as? Int ?? 0)
        #expect(peaks.0 > 0 && peaks.1 > 0)
        let budget = try #require(p6["budget_bytes"] as? Int)
        #expect(budget == 64 << 20 + 3 * (posts["state_bytes"] as? Int ?? 0))
        #expect(p6["within_budget"] as? Bool == (max(peaks.0, peaks.1) <= budget), "\(p6)")

        // P7: an empty todos store and one of ~1 MB, then the same shaped as a tree, each with every figure; nothing
        // lost or failed; in the largest array and the largest tree of the same size, a planted divergence found.
        let p7 = try #require(json["p7"] as? [[String: Any]])
        #expect(p7.compactMap { $0["megabytes"] as? Int } == [0, 1, 0, 1])
        #expect(p7.compactMap { $0["store"] as? String } == ["todos", "todos", "tree-todos", "tree-todos"])
        for row in p7 {
            #expect(row["failures"] as? Int == 0, "\(row)")
            #expect(row["replica_resyncs"] as? Int == 0, "\(row)")
            for key in ["p1_p50_us", "p1_p99_us", "p2_actions_per_s", "replica_cpu_per_event_us"] {
                #expect((row[key] as? Double ?? 0) > 0, "\(key): \(row)")
            }
        }
        let largest = try #require(p7.count == 4 ? p7[1] : nil)
        #expect((largest["state_bytes"] as? Int ?? 0) > 1_000_000, "\(largest)")
        #expect(largest["p2_ratio"] as? Double != nil, "\(largest)")
        #expect((largest["divergence_found_seconds"] as? Double ?? 0) > 0, "\(largest)")
        #expect((largest["divergence_events"] as? Int ?? -1) >= 0, "\(largest)")
        let tree = p7[3]
        #expect((tree["state_bytes"] as? Int ?? 0) > 1_000_000, "\(tree)")
        #expect(tree["p2_ratio"] as? Double != nil, "\(tree)")
        // Found over the digest form, which condenses the todos to their count and sum.
        #expect((tree["divergence_found_seconds"] as? Double ?? 0) > 0, "\(tree)")
        #expect((tree["divergence_events"] as? Int ?? -1) >= 0, "\(tree)")

        // From outside: the C clients against the raw C echo and against lockstepd, every reply checked by them, and
        // what they were acknowledged is what the daemon committed.
        let outside = try #require(json["outside"] as? [[String: Any]])
        #expect(outside.compactMap { $0["clients"] as? Int } == [1, 8, 32, 1, 1])
        #expect(outside.compactMap { $0["in_flight"] as? Int } == [1, 1, 1, 32, 256])
        for row in outside {
            #expect((row["acknowledged"] as? Int ?? 0) > 0, "\(row)")
            #expect(row["acknowledged"] as? Int == row["committed"] as? Int, "\(row)")
            for key in [
                "raw_round_trips_per_s", "actions_per_s", "ratio_to_raw", "daemon_cpu_per_action_us",
                "raw_server_cpu_per_round_trip_us", "client_cpu_per_action_us", "raw_client_cpu_per_round_trip_us",
            ] {
                #expect((row[key] as? Double ?? 0) > 0, "\(key): \(row)")
            }
        }
    }

    /// The C clients check every reply: a raw echo answers a DISPATCH with the DISPATCH itself, and a load that
    /// expects lockstepd's replies stops at the first, naming what it got.
    @Test func theCClientsStopAtAReplyThatIsNotAnAcceptance() async throws {
        let folder = try temporaryDirectory("cload")
        defer { try? FileManager.default.removeItem(at: folder) }
        let endpoint = "ipc://\(folder.path)/echo"
        let echo = try ChildProcess("lockstep-cload", ["echo", endpoint])
        defer { echo.kill() }
        let ready = try await eventually(within: .seconds(30)) {
            await echo.read(for: .milliseconds(50))
            return echo.takeLines().contains("ready")
        }
        try #require(ready, "the echo did not print ready: \(echo.errors())")
        let refused = try await runProduct(
            "lockstep-cload",
            ["load", endpoint, "2", "0.2", "counter", "1", #"{"increment":{}}"#]
        )
        #expect(refused.status == 1, "\(refused.standardOutput) \(refused.standardError)")
        #expect(refused.standardError.contains("type 0x01 to request 1, not ACCEPTED"), "\(refused.standardError)")
        let echoed = try await runProduct(
            "lockstep-cload",
            ["load", endpoint, "2", "0.2", "counter", "1", #"{"increment":{}}"#, "--echo"]
        )
        #expect(echoed.status == 0, "\(echoed.standardError)")
        #expect(echoed.standardOutput.hasPrefix(#"{"clients":2,"#), "\(echoed.standardOutput)")
    }

    /// `bench-worker echo-router --delay-us`, the late baseline's echo: two clients' messages come back whole, each no
    /// sooner than the delay after it was sent.
    @Test func aLateEchoAnswersEachMessageNoSoonerThanItsDelay() async throws {
        let directory = try temporaryDirectory("late-echo")
        defer { try? FileManager.default.removeItem(at: directory) }
        let endpoint = "ipc://\(directory.path)/echo"
        let echo = try ChildProcess(
            "lockstep",
            ["bench-worker", "echo-router", "--endpoint", endpoint, "--delay-us", "40000"]
        )
        defer { echo.kill() }
        let ready = try await eventually(within: .seconds(30)) {
            await echo.read(for: .milliseconds(50))
            return echo.takeLines().contains("ready")
        }
        try #require(ready, "the echo did not print ready: \(echo.errors())")
        let answers = try await offPool("late-echo clients") {
            let context = try Context()
            defer { context.shutdown() }
            let clients = try (0..<2).map { _ in
                let socket = try Socket(context, type: .request)
                try socket.connect(endpoint)
                return socket
            }
            defer { for client in clients { client.close() } }
            var sentAt: [ContinuousClock.Instant] = []
            for (index, client) in clients.enumerated() {
                try client.send([[UInt8(index)], [1, 2, 3]])
                sentAt.append(.now)
            }
            return try zip(clients, sentAt).map { client, sent in
                (try client.receive(timeout: .seconds(10)), ContinuousClock.now - sent)
            }
        }
        for (index, (frames, waited)) in answers.enumerated() {
            #expect(frames == [[UInt8(index)], [1, 2, 3]], "client \(index)")
            #expect(waited >= .milliseconds(40), "client \(index) was answered after \(waited)")
        }
    }

    @Test func badOptionsAreRefusedNamingTheValue() async throws {
        let output = try await runProduct("lockstep", ["bench", "--only", "p9"])
        #expect(output.status == 64)
        #expect(output.standardError.contains("no part 'p9'"))
        let histories = try await runProduct("lockstep", ["bench", "--histories", "10,x"])
        #expect(histories.status == 64)
        #expect(histories.standardError.contains("'10,x'"))
        let negative = try await runProduct(
            "lockstep",
            ["bench-worker", "echo-router", "--endpoint", "inproc://x", "--delay-us=-5"]
        )
        #expect(negative.status == 64)
        #expect(negative.standardError.contains("0 or more; it is -5"), "\(negative.standardError)")
        let notAnEcho = try await runProduct(
            "lockstep",
            ["bench-worker", "req", "--endpoint", "inproc://x", "--delay-us", "5"]
        )
        #expect(notAnEcho.status == 64)
        #expect(notAnEcho.standardError.contains("a req worker sends none"), "\(notAnEcho.standardError)")
    }
}
