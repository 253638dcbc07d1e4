import Foundation
import Lockstep
import LockstepClient
import LockstepTesting
import ReplayFixtures
import TestSupport
import Testing

/// Daemons of successive versions of the fixtures' `shelf` domain, each made with `LockstepDaemonMain`, started in
/// turn on one data directory: the next version upgrades the journal the one before wrote, or refuses to start
/// and changes nothing; replicas of the old version are refused.
@Suite struct DomainUpgradeProcessTests {
    func shelfDaemon(_ version: String, tally: String = "1", in directory: String) throws -> DaemonProcess {
        try DaemonProcess(
            directory: directory,
            environment: ["SHELF_VERSION": version, "TALLY_VERSION": tally],
            executable: "shelf-daemon"
        )
    }

    /// Waits (at most 30 s) for a daemon that must refuse to start, and returns its exit status.
    func refusal(_ daemon: DaemonProcess) async throws -> Int32? {
        #expect(try await eventually(within: .seconds(30)) { !daemon.isRunning })
        return await daemon.stop()
    }

    /// `lockstep ARGUMENTS` against `daemon`, which must succeed; its standard output.
    func lockstep(_ arguments: [String], _ daemon: DaemonProcess) async throws -> String {
        let result = try await runProduct("lockstep", arguments + ["--command-endpoint", daemon.command])
        #expect(result.status == 0, "lockstep \(arguments): \(result.standardError)")
        return result.standardOutput
    }

    @Test func theNextVersionUpgradesTheJournalAndOldReplicasAreRefused() async throws {
        let directory = try TestSupport.temporaryDirectory("upgrade").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let data = URL(fileURLWithPath: directory).appendingPathComponent(".lockstep/data").path

        let first = try shelfDaemon("1", in: directory)
        try await first.waitUntilServing()
        for name in ["pens", "ink", "paper"] {
            _ = try await lockstep(["dispatch", "shelf", #"{"add":{"name":"\#(name)"}}"#], first)
        }
        #expect(await first.stop() == 0)
        let journalBefore = try await runProduct("lockstep", ["journal", "stats", data, "--json"]).standardOutput

        // Version 2 without an upgrade: refuses to start, names the store and both versions, changes nothing.
        let refused = try shelfDaemon("2-without-upgrade", in: directory)
        #expect(try await refusal(refused) == 1)
        #expect(refused.output.contains("written by shelf domain version 1"), "\(refused.output)")
        #expect(refused.output.contains("this build has version 2"), "\(refused.output)")
        #expect(try await runProduct("lockstep", ["journal", "stats", data, "--json"]).standardOutput == journalBefore)

        // Shelf version 2 could upgrade, but the tally beside it cannot: the start is refused before shelf is
        // upgraded, so the version 1 daemon could still run on the journal.
        let half = try shelfDaemon("2", tally: "2-without-upgrade", in: directory)
        #expect(try await refusal(half) == 1)
        #expect(half.output.contains("cannot recover store 'tally'"), "\(half.output)")
        #expect(try await runProduct("lockstep", ["journal", "stats", data, "--json"]).standardOutput == journalBefore)

        // Version 2: upgrades by its rule, logs it, serves the migrated state and goes on from seq 3.
        let second = try shelfDaemon("2", in: directory)
        try await second.waitUntilServing()
        #expect(second.output.contains("upgraded store to a new domain version"), "\(second.output)")
        let state = try await lockstep(["state", "shelf", "--json"], second)
        #expect(
            state.contains(#""items":[{"count":1,"name":"pens"},{"count":1,"name":"ink"},{"count":1,"name":"paper"}]"#),
            "\(state)"
        )
        #expect(
            try await lockstep(["dispatch", "shelf", #"{"setCount":{"name":"ink","count":4}}"#], second)
                == "shelf: seq 4\n"
        )

        // A replica built with version 1 never takes version 2's state: it cannot decode the snapshot, says so
        // (a divergence, logged and counted), and its dispatches get the daemon's version refusal.
        var configuration = ReplicaConfiguration(commandEndpoint: second.command, eventsEndpoint: second.events)
        configuration.requestTimeout = .seconds(1)
        let old = try Replica(ShelfV1.self, configuration: configuration)
        let refusal = try await withThrowingTaskGroup(of: String?.self) { group in
            group.addTask {
                try await old.run()
                return nil
            }
            group.addTask {
                _ = try await eventually(within: .seconds(30)) { old.status.divergences > 0 }
                do {
                    _ = try await old.dispatch(.add(name: "quills"))
                    return "accepted"
                } catch {
                    return "\(error)"
                }
            }
            let refusal = try await group.next() ?? nil
            group.cancelAll()
            while try await group.next() != nil {}
            return refusal
        }
        #expect(old.status.divergences > 0)
        #expect(old.status.lastSeq == 0)
        #expect(refusal?.contains("runs domain version 2, the client sent version 1") == true, "\(refusal ?? "-")")
        #expect(await second.stop() == 0)

        // The journal says which version wrote what, and the state at the upgrade seq reads back.
        let stats = try await runProduct("lockstep", ["journal", "stats", data]).standardOutput
        #expect(stats.contains("shelf: upgraded; version 1 from seq 0, version 2 from seq 3"), "\(stats)")
    }
}
