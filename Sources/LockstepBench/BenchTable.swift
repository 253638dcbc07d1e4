import Foundation
import LockstepTool

/// `lockstep bench`'s table: each figure, its baseline ratio and its target.
package struct BenchTable {
    let results: BenchResults

    package init(_ results: BenchResults) { self.results = results }

    package var text: String {
        let r = results
        let b = r.baselines
        var lines = [
            "",
            "lockstep bench: \(r.build) build, \(r.transport), \(r.journal) journal, \(r.cores) cores, "
                + "\(r.secondsPerMeasurement) s per measurement, \(r.totalSeconds) s in all",
            "",
            "baselines (raw libzmq over \(r.transport); the disk under the bench's folder)",
            row(
                "REQ/REP round trip",
                "p50 \(b.reqRepP50Us)  p99 \(b.reqRepP99Us)",
                "\(count(b.reqRepRoundTripsPerS))/s"
            ),
            row(
                "ROUTER ← 8 REQ processes",
                "\(count(b.router8ReqRoundTripsPerS)) round trips/s"
                    + cpu(
                        per: "round trip",
                        ("echo", b.router8EchoCpuPerRoundTripUs),
                        ("clients", b.router8ReqClientCpuPerRoundTripUs)
                    )
            ),
        ]
        if let late = b.lateEcho {
            lines.append(
                row(
                    "… answered \(late.delayUs) late",
                    "\(count(late.roundTripsPerS)) round trips/s  p50 \(late.p50Us) (P2's wait at 8)"
                        + cpu(
                            per: "round trip",
                            ("echo", late.echoCpuPerRoundTripUs),
                            ("clients", late.clientCpuPerRoundTripUs)
                        )
                )
            )
        }
        lines += [
            row("PUB → 4 SUB processes", "\(count(b.pub4SubMsgsPerS)) msgs/s to each (200 bytes)"),
            row("write + fsync, 200 bytes", "p50 \(b.fsyncP50Us)  p99 \(b.fsyncP99Us)"),
            row("… in place + fdatasync", "p50 \(b.fsyncInPlaceP50Us)  p99 \(b.fsyncInPlaceP99Us)"),
            "",
            "P1 dispatch round trip, durable "
                + (r.p1.baselineUs.value > 0
                    ? "(vs raw REQ/REP p50 + in-place fsync p50 = \(r.p1.baselineUs))" : "(no baselines in this run)"),
            row(
                "p50 / p99",
                "\(r.p1.p50Us) / \(r.p1.p99Us)",
                "\(times(r.p1.ratioP50)) / \(times(r.p1.ratioP99))",
                "target ≤ 1.2× / ≤ 2.5×"
            ),
            "",
            "P2 committed actions/s (vs raw ROUTER ← 8 REQ\(r.redis == nil ? "" : "; vs Redis Streams XADD"))",
        ]
        for p2 in r.p2 {
            let redis = r.redis == nil ? "" : ", \(times(p2.ratioToRedis)) Redis"
            let lost = p2.committed == p2.acknowledged ? "" : "  (committed \(p2.committed) ≠ acknowledged)"
            lines.append(
                row(
                    clientsLabel(p2.clients, inFlight: p2.inFlight),
                    "\(count(p2.actionsPerS))/s  p50 \(p2.p50Us)  p99 \(p2.p99Us)",
                    "\(times(p2.ratioToRouter8Req))\(redis)",
                    (p2.inFlight == 1 ? "target ≥ 0.6×" : "") + lost
                        + cpu(
                            ("loop", p2.loopCpuPerActionUs),
                            // With SQLite the loop makes the commits and the journal thread stays idle.
                            ("journal", p2.journalCpuPerActionUs.flatMap { $0 >= 0.5 ? $0 : nil }),
                            ("daemon", p2.daemonCpuPerActionUs),
                            ("clients", p2.clientCpuPerActionUs)
                        )
                )
            )
        }
        let o = r.optimistic
        // Parts left out of the run (`--only`) are left out of the table.
        if o.dispatches + o.failures > 0 {
            lines += [
                "",
                "Optimistic dispatch through a Replica<Counter>, one at a time (\(o.dispatches) dispatches)"
                    + (o.failures + o.resyncs == 0 ? "" : ": \(o.failures) failed, \(o.resyncs) resyncs"),
                row("optimistic state shows it", "p50 \(o.optimisticP50Us)  p99 \(o.optimisticP99Us)"),
                row(
                    "confirmed (handle resolved)",
                    "p50 \(o.confirmedP50Us)  p99 \(o.confirmedP99Us)",
                    "\(times(ratio(o.confirmedP50Us.value, r.p1.p50Us.value))) P1 p50"
                ),
            ]
        }
        if let e = r.effects {
            lines += [
                "",
                "Effects, no-op handler (\(e.effectsRun) run\(e.everyEffectRanOnce ? ", each once" : "; NOT each once"))",
                row(
                    "dispatch → handler start",
                    "p50 \(e.dispatchToStartP50Us)  p99 \(e.dispatchToStartP99Us)",
                    "\(times(ratio(e.dispatchToStartP50Us.value, r.p1.p50Us.value))) P1 p50"
                ),
                row("ACCEPTED → handler start", "p50 \(e.ackToStartP50Us)  p99 \(e.ackToStartP99Us)"),
                row(
                    "8 clients, batches of 100",
                    "\(count(e.effectsPerS)) effects/s",
                    "",
                    "\(count(e.batchedActionsPerS)) actions/s committed"
                ),
            ]
        }
        if let postgres = r.postgres {
            lines += ["", "P1, P2 with the PostgreSQL journal (PostgreSQL \(postgres.version), synchronous_commit on)"]
            lines.append(
                row(
                    "P1 p50 / p99",
                    "p50 \(postgres.p1.p50Us)  p99 \(postgres.p1.p99Us)",
                    "\(times(postgres.p1.ratioP50)) / \(times(postgres.p1.ratioP99)) of raw + fsync"
                )
            )
            for p2 in postgres.p2 {
                lines.append(
                    row(
                        "\(p2.clients) client\(p2.clients == 1 ? "" : "s")",
                        "\(count(p2.actionsPerS))/s  p50 \(p2.p50Us)  p99 \(p2.p99Us)",
                        "\(times(p2.ratioToRouter8Req))",
                        p2.committed == p2.acknowledged ? "" : "(committed \(p2.committed) ≠ acknowledged)"
                    )
                )
            }
        }
        if let redis = r.redis {
            lines += ["", "Redis Streams \(redis.version): XADD, appendonly yes, appendfsync always, unix socket"]
            for row in redis.rows {
                lines.append(
                    self.row(
                        clientsLabel(row.clients, inFlight: row.inFlight),
                        "\(count(row.xaddsPerS))/s  p50 \(row.p50Us)  p99 \(row.p99Us)"
                    )
                )
            }
        }
        if !r.outside.isEmpty {
            lines += [
                "", "From outside: C clients (lockstep-cload), REQ, one in flight each: lockstepd vs a raw C echo",
            ]
        }
        for o in r.outside {
            lines.append(
                row(
                    clientsLabel(o.clients, inFlight: o.inFlight),
                    "\(count(o.actionsPerS))/s  p50 \(o.p50Us)  p99 \(o.p99Us)",
                    "\(times(o.ratioToRaw)) raw (\(count(o.rawRoundTripsPerS))/s)",
                    (o.daemonCpuPerActionUs.map { String(format: "lockstepd CPU %.1f µs/action", $0) } ?? "")
                        + (o.rawServerCpuPerRoundTripUs.map { String(format: "  raw echo %.1f µs", $0) } ?? "")
                        + (o.committed == o.acknowledged ? "" : "  (committed \(o.committed) ≠ acknowledged)")
                )
            )
        }
        if !r.p3.isEmpty {
            lines += [
                "", "P3 replicas while 8 processes dispatch: dispatch → last replica applied (target p99 ≤ 5 ms)",
            ]
        }
        for p3 in r.p3 {
            lines.append(
                row(
                    "\(p3.replicas) replicas",
                    "\(count(p3.actionsPerS))/s (\(times(p3.ratioToP2)) P2)  p50 \(p3.p50Us)  p99 \(p3.p99Us)",
                    p3.keptUp ? "kept up" : "fell behind",
                    String(format: "last replica %.1f ms after the last ack", p3.catchUpMs)
                        + (p3.replicaCpuPerEventUs.map { String(format: "  replica CPU %.1f µs/event", $0) } ?? "")
                        + (p3.rawSubCpuPerEventUs.map { String(format: "  raw SUB CPU %.1f µs/event", $0) } ?? "")
                )
            )
        }
        if !r.p4.isEmpty {
            lines += ["", "P4 late join: a new replica process to the last seq (target < 0.5 s at 10⁶ events)"]
        }
        for p4 in r.p4 {
            lines.append(
                row(
                    "\(count(Double(p4.events))) \(p4.store) events",
                    String(format: "%.3f s", p4.joinSeconds),
                    "state \(bytes(p4.stateBytes))",
                    String(format: "lockstepd up in %.2f s (recovery)", p4.daemonStartSeconds)
                )
            )
        }
        if !r.p5.isEmpty { lines += ["", "P5 in-process Store, one dispatching thread (Store<Counter> unless said)"] }
        for p5 in r.p5 {
            lines.append(
                row(
                    "\(p5.subscribers) subscribers",
                    "\(count(p5.dispatchesPerS)) dispatches/s",
                    "",
                    p5.state ?? ""
                )
            )
        }
        let p6 = r.p6
        func judged(_ peak: Int) -> String {
            guard p6.notJudged == nil, peak > 0 else { return "not judged" }
            return peak <= p6.budgetBytes ? "within" : "over"
        }
        lines += [
            "",
            "P6 peak resident memory (budget 64 MiB + 3 × \(bytes(p6.stateBytes)) = \(mebibytes(p6.budgetBytes)))",
            row("lockstepd", mebibytes(p6.daemonPeakBytes), judged(p6.daemonPeakBytes)),
            row("replica process", mebibytes(p6.replicaPeakBytes), judged(p6.replicaPeakBytes)),
        ]
        if let reason = p6.notJudged { lines.append("  not judged: \(reason)") }
        if !r.p7.isEmpty {
            lines += [
                "",
                "P7 cost against the size of the state (todos: an array; tree-todos: a DigestedDictionary; ratios "
                    + "to the empty store of the same shape)",
            ]
        }
        for p7 in r.p7 {
            let size = "\(p7.store) \(p7.megabytes) MB (\(bytes(p7.stateBytes)))"
            lines += [
                row(
                    size,
                    "P1 p50 \(p7.p1P50Us)  p99 \(p7.p1P99Us)",
                    "\(times(p7.p1RatioP50)) / \(times(p7.p1RatioP99))"
                ),
                row("", "P2 8 clients \(count(p7.p2ActionsPerS))/s", times(p7.p2Ratio)),
                row(
                    "",
                    String(
                        format: "join %.2f s, after load %.2f s (encode %.2f, hash %.2f, decode %.2f, stream %.2f)",
                        p7.joinSeconds,
                        p7.joinAfterLoadSeconds,
                        p7.encodeSeconds,
                        p7.hashSeconds,
                        p7.decodeSeconds,
                        p7.streamSeconds
                    )
                ),
                row(
                    "",
                    p7.divergenceFoundSeconds.map {
                        String(format: "a planted divergence found in %.1f s, ", $0)
                            + "\(p7.divergenceEvents ?? 0) events after it"
                    } ?? ""
                ),
                row(
                    "",
                    "replica \(p7.replicaCpuPerEventUs.map { String(format: "%.1f", $0) } ?? "–") µs/event",
                    "",
                    "peak lockstepd \(mebibytes(p7.daemonPeakBytes)), replica \(mebibytes(p7.replicaPeakBytes)) "
                        + "(\(p7.withinBudget ? "within" : "over") \(mebibytes(p7.budgetBytes)))"
                ),
            ]
        }
        return lines.joined(separator: "\n")
    }

    private func row(_ name: String, _ value: String, _ ratio: String = "", _ note: String = "") -> String {
        let line =
            "  " + name.padding(toLength: 28, withPad: " ", startingAt: 0)
            + value.padding(toLength: max(value.count, 44), withPad: " ", startingAt: 0)
            + "  " + ratio.padding(toLength: max(ratio.count, 16), withPad: " ", startingAt: 0) + "  " + note
        return line.trimmingCharacters(in: .whitespaces).isEmpty
            ? "" : String(line.reversed().drop { $0 == " " }.reversed())
    }

    /// "  CPU µs/action: loop 35.6, journal 37.2, …" for the figures that were read; empty when none was.
    private func cpu(per unit: String = "action", _ figures: (String, Double?)...) -> String {
        let read = figures.compactMap { name, value in value.map { String(format: "\(name) %.1f", $0) } }
        return read.isEmpty ? "" : "  CPU µs/\(unit): " + read.joined(separator: ", ")
    }

    /// "8 clients", or "1 client × 32 in flight".
    private func clientsLabel(_ clients: Int, inFlight: Int) -> String {
        "\(clients) client\(clients == 1 ? "" : "s")" + (inFlight > 1 ? " × \(inFlight) in flight" : "")
    }

    private func times(_ ratio: Double?) -> String {
        ratio.map { String(format: "%.2f×", $0) } ?? "–"
    }

    private func count(_ value: Double) -> String {
        let formatter = NumberFormatter()
        formatter.numberStyle = .decimal
        formatter.maximumFractionDigits = 0
        return formatter.string(from: NSNumber(value: value)) ?? "\(Int(value))"
    }

    private func bytes(_ value: Int) -> String {
        value >= 1_048_576 ? mebibytes(value) : String(format: "%.1f KiB", Double(value) / 1_024)
    }
}
