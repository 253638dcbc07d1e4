import Foundation
import Lockstep
import LockstepClient
import LockstepJournal
import LockstepProtocol
import LockstepTesting
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Failover across hosts (issue #21, step 4): PostgreSQL on host `db`, lockstepd on hosts `a` and `b`, replicas and
/// the tool on host `c`, each host a network namespace of its own (`TestHosts`), every socket between them tcp
/// with CURVE and nothing on ipc. Needs root; where namespaces cannot be made the test is skipped, saying why
/// (`LOCKSTEP_HOSTS_REQUIRED=1` makes that a failure).
@Suite(.serialized) struct HostsFailoverTests {
    /// The ports every daemon binds on its own host's address.
    static let commandPort = 7400
    static let eventsPort = 7401
    /// The stores the daemons host and the replicas hold.
    static let stores = ["counter", "todos"]

    /// The hosts, the keys, PostgreSQL and the two daemons; all stopped and removed by ``close()`` (off the
    /// cooperative pool) or, failing that, when released, hosts last. Its blocking helpers are async and wait on
    /// threads of their own, except ``status(_:)``, which ``HostsFailoverTests/waitForRole(_:of:in:limit:)`` calls
    /// in its polling loop on a thread of its own.
    final class Site {
        let hosts: TestHosts
        let folder: URL
        let lockstep = productURL("lockstep")
        let server: PostgresServer
        /// The replicas' and the tool's CURVE options: the daemons' shared public key and each client's key file.
        let replicaCurve: [String]
        let toolCurve: [String]
        /// A client whose key is not in the daemons' allowed clients file.
        let intruderCurve: [String]
        /// The tool's own key with another server key than the daemons'.
        let wrongServerCurve: [String]
        let passwordFile: String
        private(set) var daemons: [String: DaemonProcess] = [:]
        var replicas: [ReplicaClient] = []

        init(_ hosts: TestHosts) async throws {
            self.hosts = hosts
            let folder = try temporaryDirectory("hosts")
            self.folder = folder
            // Keys as an operator makes them: the daemons' on host a (both daemons use it), each client's on c.
            var publicKeys: [String: String] = [:]
            for (name, host) in [("server", "a"), ("replica", "c"), ("tool", "c"), ("intruder", "c")] {
                let path = folder.appendingPathComponent(name).path
                let made = try await hosts.run(on: host, lockstep, ["keygen", "--out", path])
                    .finish(within: .seconds(30))
                guard made.status == 0 else {
                    throw DaemonProcessError(
                        "lockstep keygen --out \(path) exited \(made.status): \(made.standardError)"
                    )
                }
                publicKeys[name] = try String(contentsOfFile: path + ".pub", encoding: .utf8)
                    .trimmingCharacters(in: .whitespacesAndNewlines)
            }
            func curve(_ server: String, _ client: String) -> [String] {
                [
                    "--curve-server-key", publicKeys[server]!, "--curve-key-file",
                    folder.appendingPathComponent(client).path + ".key",
                ]
            }
            replicaCurve = curve("server", "replica")
            toolCurve = curve("server", "tool")
            intruderCurve = curve("server", "intruder")
            wrongServerCurve = curve("intruder", "tool")
            try "# the replicas on host c\n\(publicKeys["replica"]!)\n# lockstep on host c\n\(publicKeys["tool"]!)\n"
                .write(to: folder.appendingPathComponent("clients"), atomically: true, encoding: .utf8)

            // PostgreSQL on db, over tcp for the subnet only, with a password the daemons read from PGPASSFILE.
            let db = hosts["db"]
            server = try await PostgresServer.start(
                on: hosts,
                host: "db",
                tcp: PostgresServer.TCP(address: db.address, clients: hosts.subnet, authentication: .password)
            )
            let password = "pw\(UInt64.random(in: 0...UInt64.max))"
            try server.createRole("lockstep", password: password)
            _ = try server.createDatabase(named: "hosts", owner: "lockstep")
            passwordFile = folder.appendingPathComponent("pgpass").path
            guard
                FileManager.default.createFile(
                    atPath: passwordFile,
                    contents: Data("\(db.address):\(server.port):hosts:lockstep:\(password)\n".utf8),
                    attributes: [.posixPermissions: 0o600]
                )
            else { throw DaemonProcessError("cannot write \(passwordFile)") }
        }

        deinit {
            for replica in replicas { replica.child.kill() }
            for daemon in daemons.values { daemon.kill() }
            server.stop()
            hosts.tearDown()
            try? FileManager.default.removeItem(at: folder)
        }

        /// What releasing it does, with PostgreSQL's stop and the hosts' tear-down waited for off the cooperative
        /// pool; the release then finds nothing left to do.
        func close() async {
            for replica in replicas { replica.child.kill() }
            for daemon in daemons.values { daemon.kill() }
            await server.stop()
            await hosts.tearDown()
            try? FileManager.default.removeItem(at: folder)
        }

        func command(_ host: String) -> String { "tcp://\(hosts[host].address):\(HostsFailoverTests.commandPort)" }
        func events(_ host: String) -> String { "tcp://\(hosts[host].address):\(HostsFailoverTests.eventsPort)" }

        /// Starts lockstepd on `host` with a configuration of its own: its endpoints on its own address, the
        /// journal at db's, CURVE with the shared server key and the clients file.
        @discardableResult
        func startDaemon(on host: String) throws -> DaemonProcess {
            let directory = folder.appendingPathComponent(host)
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let configuration = directory.appendingPathComponent("lockstepd.toml")
            try """
            journal = "postgres"
            postgres = "\(server.tcpConnection(database: "hosts", user: "lockstep"))"
            command_endpoint = "\(command(host))"
            events_endpoint = "\(events(host))"
            domains = [\(HostsFailoverTests.stores.map { "\"\($0)\"" }.joined(separator: ", "))]

            [lease]
            name = "\(host)"

            [curve]
            server_key_file = "\(folder.appendingPathComponent("server.key").path)"
            allowed_clients_file = "\(folder.appendingPathComponent("clients").path)"
            """.write(to: configuration, atomically: true, encoding: .utf8)
            let (executable, arguments) = hosts.command(
                on: host,
                productURL("lockstepd"),
                ["--config", configuration.path]
            )
            let daemon = try DaemonProcess(
                executable: executable,
                folder: directory,
                arguments: arguments,
                environment: ["PGPASSFILE": passwordFile]
            )
            try daemon.start()
            daemons[host] = daemon
            return daemon
        }

        /// Runs `lockstep ARGUMENTS` on host c to its end (at most 20 s).
        func tool(_ arguments: [String]) throws -> ProcessOutput {
            try hosts.run(on: "c", lockstep, arguments).finish(within: .seconds(20))
        }

        /// The same, waiting on a thread of its own.
        func tool(_ arguments: [String]) async throws -> ProcessOutput {
            try await hosts.run(on: "c", lockstep, arguments).finish(within: .seconds(20))
        }

        /// The STATUS of the daemon on `host`, as `lockstep stats --json` reads it from host c; `nil` if it does not
        /// answer within 500 ms. Stats exits 0 for a leader and 69 for a standby (no leader answered), printing
        /// either's status.
        func status(_ host: String) throws -> DaemonStatus? {
            let output = try tool(
                ["stats", "--json", "--command-endpoint", command(host), "--timeout-ms", "500", "--retries", "0"]
                    + toolCurve
            )
            let status = try? JSONDecoder().decode(DaemonStatus.self, from: Data(output.standardOutput.utf8))
            guard let status, status.leads == (output.status == 0) else {
                lastStatusFailure = "exit \(output.status): \(output.standardOutput) \(output.standardError)"
                return nil
            }
            return status
        }

        /// What the last ``status(_:)`` that got no status said.
        var lastStatusFailure = ""

        /// The network as the hosts see it, for a failure's message.
        func diagnostics() async -> String {
            var lines: [String] = []
            for (host, arguments) in [
                ("c", ["ip", "addr"]), ("c", ["ip", "neigh"]), ("c", ["ss", "-tanp"]), ("a", ["ss", "-tanp"]),
                ("a", ["ip", "addr"]),
            ] {
                let output = try? await hosts.run(on: host, URL(fileURLWithPath: "/usr/bin/env"), arguments)
                    .finish(within: .seconds(10))
                lines.append("--- \(host): \(arguments.joined(separator: " "))\n\(output?.standardOutput ?? "")")
            }
            let bridge = try? await offPool("ip", lending: hosts) {
                try $0.ip(["-n", $0.switchNamespace, "-d", "link"])
            }
            lines.append("--- switch: ip -d link\n\(bridge ?? "")")
            return lines.joined(separator: "\n")
        }

        /// Each store's epoch, seq and digest at the daemon on `host`, from `lockstep state --json` on host c.
        func states(_ host: String) async throws -> [String: StoreState] {
            var states: [String: StoreState] = [:]
            for store in HostsFailoverTests.stores {
                let output = try await tool(
                    ["state", store, "--json", "--command-endpoint", command(host)] + toolCurve
                )
                guard output.status == 0 else {
                    throw DaemonProcessError(
                        "lockstep state \(store) at \(host) exited \(output.status): \(output.standardError)"
                    )
                }
                states[store] = try JSONDecoder().decode(StoreState.self, from: Data(output.standardOutput.utf8))
            }
            return states
        }

        /// A `lockstep demo-client` on host c following the daemons on `daemons` (in that order: the first is asked
        /// first), over tcp with the replica's key, patient enough to outlast a takeover (1 s × 20 tries).
        func replica(of daemons: [String], actions: Int, seed: Int) throws -> ReplicaClient {
            let client = try ReplicaClient(
                lockstep: lockstep,
                daemons: daemons.map { (command($0), events($0)) },
                stores: HostsFailoverTests.stores,
                actions: actions,
                extra: ["--seed", "\(seed)", "--timeout-ms", "1000", "--retries", "20"] + replicaCurve,
                on: hosts,
                host: "c"
            )
            replicas.append(client)
            return client
        }

        /// The listening sockets on `host`, by `ss`: tcp (`ADDRESS:PORT`) and Unix (paths).
        func listening(on host: String) async throws -> (tcp: Set<String>, unix: [String]) {
            func run(_ arguments: [String]) async throws -> [String] {
                let output = try await hosts.run(on: host, URL(fileURLWithPath: "/usr/bin/ss"), arguments)
                    .finish(within: .seconds(10))
                return output.standardOutput.split(separator: "\n").map(String.init)
            }
            // `ss -H -tln`: State Recv-Q Send-Q Local Peer; `ss -H -xl`: Netid State Recv-Q Send-Q Local ...
            let tcp = try await run(["-H", "-t", "-l", "-n"]).compactMap {
                $0.split(separator: " ", omittingEmptySubsequences: true).dropFirst(3).first.map(String.init)
            }
            return (Set(tcp), try await run(["-H", "-x", "-l"]))
        }
    }

    /// `lockstep state --json`: what the test compares.
    struct StoreState: Decodable, Equatable {
        var epoch: String
        var seq: UInt64
        var digest: String
    }

    /// Polls the daemon on `host` from host c until its STATUS says `role`; the status and how long it took, or
    /// `nil` after `limit`. The loop runs on a thread of its own (`offPool`), which the takeover is timed with: an
    /// async wait could sit behind other tests for a thread of the cooperative pool (two on a two-core machine).
    func waitForRole(
        _ role: DaemonStatus.Role,
        of host: String,
        in site: Site,
        limit: Duration
    ) async throws -> (DaemonStatus, Duration)? {
        try await offPool("wait for role", lending: site) { site throws -> (DaemonStatus, Duration)? in
            let start = ContinuousClock.now
            while ContinuousClock.now - start < limit {
                if let status = try site.status(host), status.role == role, status.leader != nil {
                    return (status, ContinuousClock.now - start)
                }
                usleep(20_000)
            }
            return nil
        }
    }

    @Test func theStandbyOnAnotherHostTakesOverOverTcpWithCurve() async throws {
        let began = ContinuousClock.now
        guard let hosts = try await testHostsOrSkip(["db", "a", "b", "c"]) else { return }
        let site = try await Site(hosts)
        print("HostsFailoverTests: hosts \(hosts.hosts.map { "\($0.name) \($0.address)" }.joined(separator: ", "))")

        // a leads, b stands by; each answers the tool on c over tcp with CURVE.
        let a = try site.startDaemon(on: "a")
        guard let (leading, _) = try await waitForRole("leader", of: "a", in: site, limit: .seconds(30)) else {
            let diagnostics = await site.diagnostics()
            Issue.record(
                "a never led; the last stats: \(site.lastStatusFailure); log:\n\(a.output)\n\(diagnostics)"
            )
            return
        }
        #expect(leading.leader?.name == "a" && leading.leader?.term == 1)
        let b = try site.startDaemon(on: "b")
        guard let (standing, _) = try await waitForRole("standby", of: "b", in: site, limit: .seconds(30)) else {
            let diagnostics = await site.diagnostics()
            Issue.record(
                "b never stood by; the last stats: \(site.lastStatusFailure); log:\n\(b.output)\n\(diagnostics)"
            )
            return
        }
        #expect(standing.leader?.name == "a" && standing.leader?.term == 1)
        // `lockstep stats` given both daemons prints each one's status.
        let both = ["--command-endpoint", site.command("a"), "--command-endpoint", site.command("b")]
        let stats = try await site.tool(["stats"] + both + site.toolCurve)
        #expect(stats.status == 0, "\(stats.standardError)")
        for line in ["role     leader as a (leader a, term 1)", "role     standby as b (leader a, term 1)"] {
            #expect(stats.standardOutput.contains(line), "\(stats.standardOutput)")
        }

        // Only tcp: each daemon listens on its own address's two ports and on no Unix socket, and both reach the
        // journal over tcp from their own addresses.
        for host in ["a", "b"] {
            let listening = try await site.listening(on: host)
            #expect(
                listening.tcp == ["\(hosts[host].address):7400", "\(hosts[host].address):7401"],
                "\(host): \(listening)"
            )
            #expect(listening.unix.isEmpty, "\(host) listens on Unix sockets: \(listening.unix)")
        }
        let postgres = site.server.connection(database: "postgres")
        let journalClients = try await offPool("pg_stat_activity") {
            try PostgresJournal.execute(
                "SELECT DISTINCT host(client_addr) FROM pg_stat_activity "
                    + "WHERE datname = 'hosts' AND client_addr IS NOT NULL ORDER BY 1",
                connection: postgres
            )
        }
        #expect(
            journalClients == [hosts["a"].address, hosts["b"].address],
            "sessions on the journal: \(journalClients)"
        )

        // On c: a replica that only watches, and one that dispatches 150 actions; both are given both daemons
        // (the watcher a first, the writer the standby first, so it is refused `not_leader` before it finds a).
        // They converge on a's state.
        let watcher = try site.replica(of: ["a", "b"], actions: 0, seed: 1)
        let first = try site.replica(of: ["b", "a"], actions: 150, seed: 2)
        let firstDone = await first.wait(within: .seconds(60)) { $0.done }
        try #require(
            firstDone?.done == true,
            "the replica did not finish: \(String(describing: firstDone)); a's log:\n\(a.output)"
        )
        let atA = try await site.states("a")
        let acceptedAtA = UInt64(firstDone?.accepted ?? 0)
        #expect(atA.values.reduce(0) { $0 + $1.seq } == acceptedAtA, "every accepted dispatch once: \(atA)")
        let expectedAtA = atA.mapValues { (seq: $0.seq, digest: $0.digest) }
        for replica in [watcher, first] {
            #expect(
                await replica.converge(on: expectedAtA, within: .seconds(20)),
                "\(String(describing: replica.last))"
            )
        }

        // A client without the right CURVE keys gets nothing, and nothing is applied.
        let refusals = try [
            ("an unlisted key", site.intruderCurve), ("no CURVE", []), ("another server key", site.wrongServerCurve),
        ]
        .map { name, curve in
            (
                name,
                try hosts.run(
                    on: "c",
                    site.lockstep,
                    [
                        "dispatch", "counter", #"{"increment":{}}"#, "--command-endpoint", site.command("a"),
                        "--timeout-ms", "1500", "--retries", "0",
                    ] + curve
                )
            )
        }
        for (name, process) in refusals {
            let output = try await process.finish(within: .seconds(20))
            #expect(
                output.status == 69,
                "\(name): exit \(output.status), \(output.standardOutput) \(output.standardError)"
            )
        }
        #expect(try await site.states("a") == atA, "a refused client changed nothing")
        #expect(a.output.contains("refused a connection"), "\(a.output)")

        // A second writer dispatches 400 actions; a's process is killed with SIGKILL while it does. b, on another
        // host, leads with the same epoch and seqs, and the same three replica processes follow it: the writer's
        // dispatches go on at b (those in flight sent again with their keys), and nobody starts over.
        let second = try site.replica(of: ["a", "b"], actions: 400, seed: 3)
        let underway = await second.wait(within: .seconds(60)) { $0.accepted >= 60 }
        try #require((underway?.accepted ?? 0) >= 60, "\(String(describing: underway)); a's log:\n\(a.output)")
        a.kill()
        let acceptedBeforeKill = second.last?.accepted ?? 0
        guard let (led, takeover) = try await waitForRole("leader", of: "b", in: site, limit: .seconds(20)) else {
            Issue.record(
                "b did not lead within 20 s of the kill; the last stats: \(site.lastStatusFailure); log:\n\(b.output)"
            )
            return
        }
        // Printed, not asserted: a loaded machine would fail a bound here for nothing. The fault suite's failover
        // class holds every takeover to the 5 s target; a b that never leads fails the 20 s wait above.
        print("HostsFailoverTests: after kill -9 of a, b leads \(takeover) later across hosts (target: 5 s)")
        #expect(led.leader?.name == "b" && led.leader?.term == 2)
        #expect(led.stores.map(\.name).sorted() == HostsFailoverTests.stores, "\(led.stores)")
        #expect(led.stores.allSatisfy { $0.epoch == atA[$0.name]?.epoch }, "the same epoch: \(led.stores)")
        let secondDone = await second.wait(within: .seconds(90)) { $0.done }
        try #require(
            secondDone?.done == true,
            "the writer did not finish after the takeover: \(String(describing: secondDone)); b's log:\n\(b.output)"
        )
        #expect(secondDone?.failed == 0, "\(String(describing: secondDone))")
        #expect((secondDone?.accepted ?? 0) > acceptedBeforeKill, "nothing was applied after the kill")
        let atB = try await site.states("b")
        let accepted = acceptedAtA + UInt64(secondDone?.accepted ?? 0)
        #expect(atB.values.reduce(0) { $0 + $1.seq } == accepted, "every accepted dispatch once, a's then b's: \(atB)")
        #expect(atB.allSatisfy { $0.value.epoch == atA[$0.key]?.epoch }, "the same epoch: \(atB)")
        let expectedAtB = atB.mapValues { (seq: $0.seq, digest: $0.digest) }
        for (name, replica) in [("watcher", watcher), ("first writer", first), ("second writer", second)] {
            let report = await replica.wait(within: .seconds(30)) { $0.matches(expectedAtB) }
            #expect(
                report?.matches(expectedAtB) == true,
                "the \(name) did not converge on b: \(String(describing: report))"
            )
            #expect(
                report?.stores.allSatisfy { $0.resyncs == 0 } == true,
                "the \(name) started over: \(String(describing: report))"
            )
        }
        for replica in [watcher, first, second] { #expect(try await replica.stop().status == 0) }
        // a is gone: stats marks it silent (and says so on standard error) and prints b's status; b leads, so it
        // exits 0.
        let leads = try await site.tool(["stats", "--timeout-ms", "500", "--retries", "0"] + both + site.toolCurve)
        #expect(leads.status == 0 && leads.standardError.contains(site.command("a")), "\(leads.standardError)")
        #expect(leads.standardOutput.contains("silent   no reply from the daemon at"), "\(leads.standardOutput)")
        #expect(leads.standardOutput.contains("role     leader as b (leader b, term 2)"), "\(leads.standardOutput)")
        #expect(await b.stop() == 0, "\(b.output)")
        func seqs(_ states: [String: StoreState]) -> String {
            states.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value.seq)" }.joined(separator: ", ")
        }
        print(
            "HostsFailoverTests: a applied \(acceptedAtA) dispatches (\(seqs(atA))); 3 clients without the right keys "
                + "were refused; the second writer had \(acceptedBeforeKill) of 400 accepted at the kill, b took over "
                + "(term 2) and the same 3 replica processes followed it to \(seqs(atB)) in epoch "
                + "\(atB["counter"]?.epoch ?? "?"), 0 resyncs; \(ContinuousClock.now - began) in all"
        )
        await site.close()
    }
}
