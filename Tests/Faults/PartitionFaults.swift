import Foundation
import Lockstep
import LockstepJournal
import LockstepTesting

#if canImport(Glibc)
import Glibc
#endif

/// Partitions, not crashes (docs/operations.md, "Partitions"): the network between the daemons and PostgreSQL cut by
/// the kernel (nftables rules on network-namespace hosts, ``TestHosts``) while every process runs on.
extension Faults {
    /// How the leader is cut off from the database in one cycle of ``leaderCutOffFromDatabase()``.
    enum DatabaseCut: String, CaseIterable {
        /// Nothing passes either way.
        case bothWays = "both ways"
        /// What the leader sends is dropped; the database's packets reach it.
        case leaderToDatabase = "leader to database only"
        /// What the database sends is dropped: the leader's statements arrive, and run, but it never hears back.
        case databaseToLeader = "database to leader only"
    }

    /// A failover pair on PostgreSQL, each daemon on a host of its own and the database on a third, clients and
    /// replicas reaching both daemons (over ipc, which no network cut touches): whichever leads is cut off from the
    /// database — both ways, or one way only, in turn — while its clients still reach it. The standby must lead; the
    /// cut-off leader must acknowledge nothing it cannot commit — every acknowledged action in the journal once, at
    /// its seq, a dispatch whose commit ran unheard answered once from the idempotency record — and, the network
    /// whole again, stand by under the new term.
    func leaderCutOffFromDatabase() throws -> FaultResult {
        try onDatabaseHosts("partition-db") { hosts, daemons, load, watchers, _, result in
            var takeovers: [DatabaseCut: [Duration]] = [:]
            var healing: [Duration] = []
            for cycle in 1...(long ? 50 * DatabaseCut.allCases.count : DatabaseCut.allCases.count) {
                let cut = DatabaseCut.allCases[(cycle - 1) % DatabaseCut.allCases.count]
                guard let (leading, host, term, successor) = leadsAndServes(daemons, load, cycle, &result)
                else { return }
                pause(20...300)
                let acked = load.acks.count
                switch cut {
                case .bothWays: try hosts.cut(host, "db")
                case .leaderToDatabase: try hosts.drop(from: host, to: "db")
                case .databaseToLeader: try hosts.drop(from: "db", to: host)
                }
                let injected = ContinuousClock.now
                result.injected += 1
                var problems: [String] = []
                let led = successor.waitForStatus(within: .seconds(30)) {
                    $0.role == "leader" && ($0.leader?.term ?? 0) > term
                }
                takeovers[cut, default: []].append(ContinuousClock.now - injected)
                guard let led, let newLeader = led.leader else {
                    try hosts.heal()
                    result.failure =
                        result.failure ?? "cycle \(cycle) (\(cut.rawValue)): the standby did not lead within 30 s; see "
                        + "\(successor.log.path) and \(leading.log.path)"
                    return
                }
                if !progresses(load, beyond: acked, within: .seconds(20)) {
                    problems.append("no dispatch was acknowledged while the old leader was cut off")
                }
                try hosts.heal()
                let healed = ContinuousClock.now
                let standing = leading.waitForStatus(within: .seconds(60)) {
                    $0.role == "standby" && $0.leader?.name == newLeader.name && $0.leader?.term == newLeader.term
                }
                healing.append(ContinuousClock.now - healed)
                if standing == nil {
                    problems.append(
                        "healed, the old leader did not stand by under \(newLeader.name), term \(newLeader.term), "
                            + "within 60 s; see \(leading.log.path)"
                    )
                }
                if !load.pause() { problems.append("a dispatch was still in flight after all its tries") }
                if let failure = try converge(watchers, on: successor) { problems.append(failure) }
                load.resume()
                result.record("cycle \(cycle) (\(cut.rawValue))", problems)
            }
            for cut in DatabaseCut.allCases {
                result.notes.append(
                    "takeover, \(cut.rawValue), cut to the standby's STATUS saying leader: "
                        + figures(takeovers[cut] ?? [])
                )
            }
            result.notes.append("healed, to the old leader standing by under the new term: \(figures(healing))")
        }
    }

    /// The same pair under lossy links: `percent` % of the packets between each daemon and the database dropped at
    /// random, both ways, under load until 200 more dispatches are acknowledged through it or for 20 s (quick mode: 50, 10 s). Nothing
    /// has to take over; dispatches must go on being acknowledged, and every acknowledged one be in the journal once.
    func lossyDatabaseLinks() throws -> FaultResult {
        try onDatabaseHosts("partition-loss") { hosts, daemons, load, watchers, _, result in
            var through: (dispatches: Int, time: Duration) = (0, .zero)
            for round in 1...(long ? 50 : 2) {
                let percent = [10, 30][(round - 1) % 2]
                guard let (leading, _) = leader(of: daemons) else {
                    result.failure = result.failure ?? "no daemon said it leads within 10 s before round \(round)"
                    return
                }
                let acked = load.acks.count
                for host in ["a", "b"] {
                    try hosts.drop(from: host, to: "db", percent: percent)
                    try hosts.drop(from: "db", to: host, percent: percent)
                }
                result.injected += 1
                // The loss holds until so many more dispatches are acknowledged through it, or for at most so long:
                // at 30 % loss TCP's backed-off retransmissions can slow a link to a few a second.
                let started = ContinuousClock.now
                _ = progresses(load, beyond: acked + (long ? 200 : 50) - 1, within: .seconds(long ? 20 : 10))
                let during = load.acks.count - acked
                through = (through.dispatches + during, through.time + (ContinuousClock.now - started))
                try hosts.heal()
                var problems: [String] = []
                if during == 0 {
                    problems.append(
                        "no dispatch was acknowledged in \(seconds(ContinuousClock.now - started)) at \(percent) % loss"
                    )
                }
                if !load.pause() { problems.append("a dispatch was still in flight after all its tries") }
                if let failure = try converge(watchers, on: leader(of: daemons)?.daemon ?? leading) {
                    problems.append(failure)
                }
                load.resume()
                result.record("round \(round) (\(percent) % loss)", problems)
            }
            result.notes.append(
                "under loss: \(through.dispatches) dispatches acknowledged in \(seconds(through.time)), "
                    + "\(Int(Double(through.dispatches) / max(through.time / .seconds(1), 0.001))) a second"
            )
        }
    }

    /// How the leader is cut off from its clients in one cycle of ``leaderCutOffFromClients()``.
    enum ClientCut: String, CaseIterable {
        /// Nothing passes either way.
        case bothWays = "both ways"
        /// The clients' requests reach the leader; its answers and events do not reach them.
        case leaderToClients = "leader to clients only"
        /// The leader's answers would reach the clients; their requests do not reach it.
        case clientsToLeader = "clients to leader only"
    }

    /// The leader cut off from every client host — both ways, or one way only, in turn — for a lease and a third
    /// (4 s), while it still reaches the database: it keeps its lease, so the standby must not lead, and nothing can
    /// be acknowledged meanwhile (the clients ask the standby, which refuses, and wait). Healed, the leader serves
    /// again: the time to the next acknowledgement is the healing time; the replicas converge without a resync.
    func leaderCutOffFromClients() throws -> FaultResult {
        try onClientHosts("partition-clients") { hosts, daemons, load, watchers, result in
            var healing: [ClientCut: [Duration]] = [:]
            for cycle in 1...(long ? 50 * ClientCut.allCases.count : ClientCut.allCases.count) {
                let cut = ClientCut.allCases[(cycle - 1) % ClientCut.allCases.count]
                guard let (leading, host, term, standby) = leadsAndServes(daemons, load, cycle, &result)
                else { return }
                pause(20...300)
                for client in ["c", "d"] {
                    switch cut {
                    case .bothWays: try hosts.cut(host, client)
                    case .leaderToClients: try hosts.drop(from: host, to: client)
                    case .clientsToLeader: try hosts.drop(from: client, to: host)
                    }
                }
                let injected = ContinuousClock.now
                result.injected += 1
                var problems: [String] = []
                // Each client thread may yet read the answer to the one dispatch it had in flight when the cut fell;
                // no more than that may be acknowledged until the heal.
                let acked = load.acks.count + load.threads
                while ContinuousClock.now - injected < .seconds(4) {
                    if let status = standby.status(timeout: .milliseconds(200)), status.role == "leader" {
                        problems.append(
                            "the standby led (term \(status.leader?.term ?? 0)) while the leader still held its lease"
                        )
                        break
                    }
                    Thread.sleep(forTimeInterval: 0.1)
                }
                if load.acks.count > acked {
                    problems.append(
                        "\(load.acks.count - acked) dispatches more than those in flight were acknowledged while the "
                            + "leader was cut off from every client"
                    )
                }
                try hosts.heal()
                let healed = ContinuousClock.now
                if progresses(load, beyond: load.acks.count, within: .seconds(30)) {
                    healing[cut, default: []].append(ContinuousClock.now - healed)
                } else {
                    problems.append("healed, no dispatch was acknowledged within 30 s")
                }
                if let (now, nowTerm) = leader(of: daemons), now !== leading || nowTerm != term {
                    problems.append("the lead moved (term \(term) to \(nowTerm)) though the leader kept its lease")
                }
                if !load.pause() { problems.append("a dispatch was still in flight after all its tries") }
                if let failure = try converge(watchers, on: leading) { problems.append(failure) }
                load.resume()
                result.record("cycle \(cycle) (\(cut.rawValue))", problems)
            }
            for cut in ClientCut.allCases {
                result.notes.append(
                    "healed (\(cut.rawValue)), to the next acknowledgement: " + figures(healing[cut] ?? [])
                )
            }
        }
    }

    /// The replicas' host cut off from both daemons for 1 to 4 s while the load goes on from another host, then
    /// healed: each replica must catch up by itself — the events it missed repaired by range, never a resync (the
    /// history is there) — and end on the leader's digest without a divergence. The time from the heal to both
    /// replicas at the leader's seq is the healing time.
    func clientHostCutOff() throws -> FaultResult {
        try onClientHosts("partition-replicas") { hosts, daemons, load, watchers, result in
            var healing: [Duration] = []
            for cycle in 1...(long ? 50 : 2) {
                guard let (leading, _) = leader(of: daemons) else {
                    result.failure = result.failure ?? "no daemon said it leads within 10 s before cycle \(cycle)"
                    return
                }
                try hosts.cut("c", "a")
                try hosts.cut("c", "b")
                result.injected += 1
                let acked = load.acks.count
                pause(1_000...4_000)
                var problems: [String] = []
                if load.acks.count == acked {
                    problems.append("no dispatch was acknowledged while the replicas were cut off")
                }
                try hosts.heal()
                let healed = ContinuousClock.now
                if !load.pause() { problems.append("a dispatch was still in flight after all its tries") }
                if let failure = try converge(watchers, on: leading) { problems.append(failure) }
                healing.append(ContinuousClock.now - healed)
                let resyncs = watchers.compactMap { $0.store("todos")?.resyncs }.reduce(0, +)
                if resyncs > 0 { problems.append("the replicas resynced \(resyncs) times; the history was there") }
                load.resume()
                result.record("cycle \(cycle)", problems)
            }
            result.notes.append(
                "healed, to both replicas at the leader's digest (the load paused): \(figures(healing))"
            )
        }
    }

    /// Every link slow at once, under load: each host's packets to the others held 50 ± 40 ms (uniform, so packets
    /// sent close together overtake each other), and in every other round 10 % of them dropped as well
    /// (``PacketDelay``: the kernel's netfilter queue, since this kernel has no netem), until 100 more dispatches are
    /// acknowledged through it or for 10 s (long mode 100 rounds, 50 of each; quick 2). Nothing has to hold but everything that
    /// always holds: dispatches go on, nothing acknowledged is lost or doubled, no read is stale, and the replicas
    /// end on the leader's digest. A takeover may happen (a renewal late past the lease) and is counted.
    func slowLinks() throws -> FaultResult {
        // A try's answer takes four one-way trips of up to 90 ms, and a fresh connection's CURVE handshake more: the
        // clients wait 2 s a try, not the 300 ms that suits a LAN.
        try onClientHosts("partition-slow", timeout: .seconds(2)) { hosts, daemons, load, watchers, result in
            var through: (dispatches: Int, time: Duration) = (0, .zero)
            var packets: (held: Int, dropped: Int) = (0, 0)
            var takeovers = 0
            for round in 1...(long ? 100 : 2) {
                let loss = round % 2 == 0 ? 10 : 0
                guard let (_, term) = leader(of: daemons) else {
                    result.failure = result.failure ?? "no daemon said it leads within 10 s before round \(round)"
                    return
                }
                let acked = load.acks.count
                let delay = try PacketDelay(
                    hosts,
                    on: hosts.hosts.map(\.name),
                    delay: .milliseconds(50),
                    jitter: .milliseconds(40),
                    lossPercent: loss,
                    seed: random.next()
                )
                result.injected += 1
                let started = ContinuousClock.now
                _ = progresses(load, beyond: acked + (long ? 100 : 50) - 1, within: .seconds(10))
                let during = load.acks.count - acked
                through = (through.dispatches + during, through.time + (ContinuousClock.now - started))
                let stopped = delay.stop()
                packets = (packets.held + stopped.held, packets.dropped + stopped.dropped)
                var problems: [String] = []
                if let failure = stopped.failure { problems.append("the packet delay failed: \(failure)") }
                if stopped.held == 0 { problems.append("no packet went through the delay") }
                if during == 0 {
                    problems.append(
                        "no dispatch was acknowledged in \(seconds(ContinuousClock.now - started)) at 50 ± 40 ms"
                            + (loss > 0 ? " and \(loss) % loss" : "")
                    )
                }
                if !load.pause() { problems.append("a dispatch was still in flight after all its tries") }
                if let (leading, now) = leader(of: daemons) {
                    if now != term { takeovers += 1 }
                    if let failure = try converge(watchers, on: leading) { problems.append(failure) }
                } else {
                    problems.append("no daemon said it leads within 10 s after round \(round)")
                }
                load.resume()
                result.record("round \(round) (50 ± 40 ms\(loss > 0 ? ", \(loss) % loss" : ""))", problems)
            }
            result.notes.append(
                "through the delay: \(through.dispatches) dispatches acknowledged in \(seconds(through.time)), "
                    + "\(Int(Double(through.dispatches) / max(through.time / .seconds(1), 0.001))) a second; "
                    + "\(packets.held) packets held, \(packets.dropped) dropped; \(takeovers) takeovers"
            )
        }
    }

    /// PostgreSQL on host `db`, daemons `a` and `b` on hosts of their own serving todos on it, every socket tcp (a
    /// leads; `events_queue = 100`, so a replica cut off for long misses events and must repair them); two replicas
    /// on host `c`; the load, a ``ReadProbe`` and the suite's own questions on host `d` (this thread enters it,
    /// ``TestHosts/within(_:_:)``). `body` injects the faults; then, as in ``onDatabaseHosts``, every acknowledged
    /// action must be in the journal once at its seq, and no read stale.
    private func onClientHosts(
        _ label: String,
        timeout: Duration = .milliseconds(300),
        _ body: (TestHosts, [Daemon], Load, [ReplicaClient], inout FaultResult) throws -> Void
    ) throws -> FaultResult {
        let keys = try SuiteCurve(in: folder.appendingPathComponent("\(label)-keys"))
        return try onDatabase(["db", "a", "b", "c", "d"]) { hosts, remote, local in
            try hosts.within("d") {
                let daemons = try ["a", "b"].map { name in
                    let endpoints = (
                        command: "tcp://\(hosts[name].address):7400", events: "tcp://\(hosts[name].address):7401"
                    )
                    return try Daemon(
                        folder: folder.appendingPathComponent("\(label)-\(name)"),
                        configuration: "journal = \"postgres\"\npostgres = \"\(remote)\"\ndomains = [\"todos\"]\n"
                            + "command_endpoint = \"\(endpoints.command)\"\nevents_endpoint = \"\(endpoints.events)\"\n"
                            + "[lease]\nname = \"\(name)\"\n" + Self.keepHistory + "[limits]\nevents_queue = 100\n"
                            + keys.configuration,
                        host: (hosts, name),
                        endpoints: endpoints,
                        curve: keys.clientCurve
                    )
                }
                defer { for daemon in daemons { daemon.kill() } }
                try daemons[0].start()
                try daemons[1].start()
                let watchers = try (0..<2).map { _ in
                    try ReplicaClient(watching: daemons, stores: ["todos"], on: (hosts, "c"), curve: keys)
                }
                let load = Load(
                    endpoints: daemons.map(\.command),
                    label: label,
                    timeout: timeout,
                    retries: Int(.seconds(12) / timeout),
                    curve: keys.clientCurve
                )
                load.start()
                defer { load.stop() }
                let probe = ReadProbe(
                    [("a", daemons[0].command), ("b", daemons[1].command)],
                    load: load,
                    curve: keys.clientCurve
                )
                probe.start()
                defer { probe.stop() }
                var result = FaultResult(injected: 0, survived: 0, lost: 0)
                defer { try? hosts.heal() }
                try body(hosts, daemons, load, watchers, &result)
                try finish(daemons, load, watchers, probe, journal: local, into: &result)
                return result
            }
        }
    }

    /// A leader's own clock running slow or fast. The lease is timed by the database's clock; what a daemon times
    /// by its own is when to renew (every third of the lease) and how long it trusts its last renewal without
    /// asking again (two thirds). libfaketime runs daemon `a`'s clocks — the monotonic one, and its sleeps and
    /// waits, included — 10 % slow and `b`'s 50 % fast; whichever leads is, in turn, paused past its lease
    /// (SIGSTOP for 3.2 to 4.5 s) or cut off from the database both ways, then woken or healed once the other
    /// leads. The probe must see no stale read and never two leaders, the old leader must stand by under the new
    /// term, and every acknowledged action be in the journal once.
    func skewedClocks() throws -> FaultResult {
        try clockCycles("partition-clock", rates: ["0.9", "1.5"], cycles: long ? 100 : 2)
    }

    /// The control (`clock, half speed`): the leader's clock at half speed, so it trusts its last renewal for 4 s
    /// of the database's time where the lease lasts 3. Its load quiesced (so that nothing waits to be committed when
    /// it wakes), it is paused for 3.5 to 3.9 s; the other, whose clock is right, takes over, and a load of its own
    /// is acknowledged there. Woken, the old leader still trusts its lease and answers the read waiting for it from
    /// the state it had. The class passes only if the probe catches that: the proof that the bound
    /// docs/operations.md states — a leader's clock may run at most a third slow — is real, and that the probe sees
    /// its breach.
    func halfSpeedClock() throws -> FaultResult {
        let library = try Self.libfaketime()
        var result = try onDatabaseHosts(
            "partition-halfclock",
            environment: { name in name == "a" ? ["LD_PRELOAD": library, "FAKETIME": "+0 x0.2"] : [:] },
            replicas: 0
        ) { _, daemons, load, _, probe, result in
            guard let (leading, term) = leader(of: daemons), leading === daemons[0] else {
                result.failure = "a, whose clock runs at half speed, did not lead"
                return
            }
            let quiet = ContinuousClock.now
            guard load.pause(), leading.pause() else {
                leading.signal(SIGCONT)
                result.failure = "the load did not quiesce, or a's threads did not all stop within 2 s"
                return
            }
            result.injected += 1
            let wake = quiet + .milliseconds(Int.random(in: 4_500...4_900, using: &random))
            let other = Load(endpoints: [daemons[1].command], label: "halfclock-b", threads: 2)
            probe.observe(other)
            defer { other.stop() }
            if daemons[1].waitForStatus(
                within: .seconds(10),
                until: { ($0.leader?.term ?? 0) > term && $0.role == "leader" }
            )
                != nil
            {
                other.start()
                _ = progresses(other, beyond: 0, within: max(wake - .now, .zero))
            }
            if wake > .now { Thread.sleep(forTimeInterval: (wake - .now) / .seconds(1)) }
            leading.signal(SIGCONT)
            let woken = ContinuousClock.now
            while probe.counts.stale + probe.counts.twoLeaders == 0, ContinuousClock.now - woken < .seconds(3) {
                Thread.sleep(forTimeInterval: 0.05)
            }
            if probe.counts.stale + probe.counts.twoLeaders > 0 { result.survived += 1 }
            result.notes.append(
                "paused \(seconds(woken - quiet)); b acknowledged \(other.acks.count) meanwhile"
            )
            load.resume()
        }
        result.control = .splitBrain
        return result
    }

    private func clockCycles(_ label: String, rates: [String], cycles: Int) throws -> FaultResult {
        let library = try Self.libfaketime()
        return try onDatabaseHosts(
            label,
            environment: { name in ["LD_PRELOAD": library, "FAKETIME": "+0 x\(rates[name == "a" ? 0 : 1])"] },
        ) { hosts, daemons, load, watchers, _, result in
            var takeovers: [Duration] = []
            for cycle in 1...cycles {
                guard let (leading, name, term, successor) = leadsAndServes(daemons, load, cycle, &result)
                else { return }
                let paused = cycle % 2 == 1
                let started = ContinuousClock.now
                if paused {
                    guard leading.pause() else {
                        leading.signal(SIGCONT)
                        result.failure = "cycle \(cycle): the leader's threads did not all stop within 2 s"
                        return
                    }
                } else {
                    try hosts.cut(name, "db")
                }
                result.injected += 1
                let kind = paused ? "paused" : "cut off"
                var problems: [String] = []
                let wake = started + .milliseconds(Int.random(in: 3_200...4_500, using: &random))
                let led = successor.waitForStatus(within: .seconds(30)) {
                    $0.role == "leader" && ($0.leader?.term ?? 0) > term
                }
                takeovers.append(ContinuousClock.now - started)
                if paused {
                    // Woken at its moment, whether or not the other leads by then: the woken leader must find out.
                    if wake > .now { Thread.sleep(forTimeInterval: (wake - .now) / .seconds(1)) }
                    leading.signal(SIGCONT)
                } else {
                    try hosts.heal()
                }
                guard let led, let newLeader = led.leader else {
                    result.failure =
                        result.failure ?? "cycle \(cycle) (\(name) \(kind)): the standby did not lead within 30 s"
                    return
                }
                if leading.waitForStatus(
                    within: .seconds(60),
                    until: {
                        $0.role == "standby" && $0.leader?.name == newLeader.name && $0.leader?.term == newLeader.term
                    }
                ) == nil {
                    problems.append("the old leader did not stand by under term \(newLeader.term) within 60 s")
                }
                if !load.pause() { problems.append("a dispatch was still in flight after all its tries") }
                if let failure = try converge(watchers, on: successor) { problems.append(failure) }
                load.resume()
                result.record("cycle \(cycle) (\(name), clock x\(rates[name == "a" ? 0 : 1]), \(kind))", problems)
            }
            result.notes.append("takeover, from the fault to the other's STATUS saying leader: \(figures(takeovers))")
        }
    }

    /// The control (`partition, no fence`): the leader cut off from the database both ways, with the fence switched
    /// off (the failpoint `unfenced`, in test builds only). Healed, the old leader's commit or renewal goes through
    /// unchecked and it leads on beside its successor. The class passes only if the ``ReadProbe`` sees it — two
    /// daemons saying they lead, or a read older than an acknowledged action — which proves that the partition
    /// classes would catch a split brain.
    func unfencedLeaderCutOff() throws -> FaultResult {
        var result = try onDatabaseHosts(
            "partition-unfenced",
            environment: { _ in ["LOCKSTEP_FAILPOINT": "unfenced"] },
            replicas: 0
        ) { hosts, daemons, load, _, probe, result in
            for cycle in 1...3 {
                guard let (_, host, term, successor) = leadsAndServes(daemons, load, cycle, &result) else { return }
                try hosts.cut(host, "db")
                result.injected += 1
                let led = successor.waitForStatus(within: .seconds(30)) {
                    $0.role == "leader" && ($0.leader?.term ?? 0) > term
                }
                try hosts.heal()
                guard led != nil else {
                    result.failure = "cycle \(cycle): the standby did not lead within 30 s"
                    return
                }
                let healed = ContinuousClock.now
                let caught = {
                    let counts = probe.counts
                    return counts.stale + counts.twoLeaders > 0
                }
                while !caught(), ContinuousClock.now - healed < .seconds(20) { Thread.sleep(forTimeInterval: 0.05) }
                if caught() {
                    result.survived += 1
                    result.notes.append(
                        "cycle \(cycle): caught \(seconds(ContinuousClock.now - healed)) after the heal"
                    )
                    return
                }
            }
        }
        result.control = .splitBrain
        return result
    }

    /// PostgreSQL on host `db`, daemons `a` and `b` on hosts of their own serving todos on it over tcp (a leads),
    /// a load and `replicas` replicas reaching both over ipc, a ``ReadProbe`` reading both: `body` injects the faults, then
    /// every acknowledged action must be in the journal once at its seq (read through the database's Unix socket,
    /// which no cut touches), and no read stale.
    private func onDatabaseHosts(
        _ label: String,
        environment: (String) -> [String: String] = { _ in [:] },
        replicas: Int = 2,
        _ body: (TestHosts, [Daemon], Load, [ReplicaClient], ReadProbe, inout FaultResult) throws -> Void
    ) throws -> FaultResult {
        try onDatabase(["db", "a", "b"]) { hosts, remote, local in
            let daemons = try ["a", "b"].map { name in
                try Daemon(
                    folder: folder.appendingPathComponent("\(label)-\(name)"),
                    configuration: "journal = \"postgres\"\npostgres = \"\(remote)\"\ndomains = [\"todos\"]\n"
                        + "[lease]\nname = \"\(name)\"\n" + Self.keepHistory,
                    environment: environment(name),
                    host: (hosts, name)
                )
            }
            defer { for daemon in daemons { daemon.kill() } }
            try daemons[0].start()
            try daemons[1].start()
            let watchers = try (0..<replicas).map { _ in try ReplicaClient(watching: daemons, stores: ["todos"]) }
            let load = Load(endpoints: daemons.map(\.command), label: label)
            load.start()
            defer { load.stop() }
            let probe = ReadProbe([("a", daemons[0].command), ("b", daemons[1].command)], load: load)
            probe.start()
            defer { probe.stop() }
            var result = FaultResult(injected: 0, survived: 0, lost: 0)
            defer { try? hosts.heal() }
            try body(hosts, daemons, load, watchers, probe, &result)
            try finish(daemons, load, watchers, probe, journal: local, into: &result)
            return result
        }
    }

    /// Hosts `names`, the first (`db`) running PostgreSQL over tcp for the others (trust) with the database
    /// `partition` of role `lockstep`: `body` is given the hosts, the daemons' conninfo over tcp and the suite's own
    /// through the Unix socket, which no cut touches. Everything is stopped and removed after it.
    private func onDatabase(
        _ names: [String],
        _ body: (TestHosts, _ remote: String, _ local: String) throws -> FaultResult
    ) throws -> FaultResult {
        let hosts = try TestHosts(names)
        defer { hosts.tearDown() }
        let server = try PostgresServer.start(
            on: hosts,
            host: names[0],
            tcp: .init(address: hosts[names[0]].address, clients: hosts.subnet, authentication: .trust)
        )
        defer { server.stop() }
        try server.createRole("lockstep", password: "unused")
        let local = try server.createDatabase(named: "partition", owner: "lockstep")
        return try body(hosts, server.tcpConnection(database: "partition", user: "lockstep"), local)
    }

    /// How a pair's class ends: the probe's findings, the replicas' counts, and `settle` against the journal at
    /// `journal` (a conninfo).
    private func finish(
        _ daemons: [Daemon],
        _ load: Load,
        _ watchers: [ReplicaClient],
        _ probe: ReadProbe,
        journal: String,
        into result: inout FaultResult
    ) throws {
        probe.record(into: &result)
        let stores = watchers.compactMap { $0.store("todos") }
        result.notes.append(
            "replicas: \(stores.map(\.divergences).reduce(0, +)) divergences, \(stores.map(\.resyncs).reduce(0, +)) "
                + "resyncs, \(stores.map(\.repairs).reduce(0, +)) gaps repaired by range"
        )
        let leader = leader(of: daemons)?.daemon ?? daemons[0]
        try settle(load, leader: leader, standbys: daemons.filter { $0 !== leader }, watchers: watchers, into: &result)
        {
            try PostgresJournal(connection: journal, readOnly: true)
        }
    }

    /// Before cycle `cycle`: the daemon that leads, its host (`a` or `b`), its term and the other daemon, once a
    /// dispatch has been acknowledged; `nil`, with the failure in `result`, when no daemon leads within 10 s or
    /// nothing is acknowledged.
    func leadsAndServes(
        _ daemons: [Daemon],
        _ load: Load,
        _ cycle: Int,
        _ result: inout FaultResult
    ) -> (leading: Daemon, host: String, term: UInt64, other: Daemon)? {
        guard let (leading, term) = leader(of: daemons) else {
            result.failure = result.failure ?? "no daemon said it leads within 10 s before cycle \(cycle)"
            return nil
        }
        guard progresses(load, beyond: load.acks.count) else {
            result.failure = "no dispatch was acknowledged before cycle \(cycle)"
            return nil
        }
        return (leading, leading === daemons[0] ? "a" : "b", term, daemons.first { $0 !== leading }!)
    }

    func figures(_ durations: [Duration]) -> String {
        "median \(seconds(median(durations))), worst \(seconds(durations.max())) over \(durations.count)"
    }
}

extension FaultResult {
    /// One cycle's problems: none, and it survived; else the first is the class's failure, the others notes.
    mutating func record(_ cycle: String, _ problems: [String]) {
        guard !problems.isEmpty else {
            survived += 1
            return
        }
        let failure = "\(cycle): " + problems.joined(separator: "; ")
        if self.failure == nil { self.failure = failure } else { notes.append(failure) }
    }
}
