import Foundation
import LockstepBench
import LockstepClient
import LockstepProtocol
import LockstepTesting
import TestSupport
import Testing

/// A store whose todos are in a `DigestedDictionary` (`tree-todos`), served by a daemon process (`lockstep
/// bench-daemon`): the daemon's DIGESTs of its digest form agree with a faithful replica's, and a replica whose
/// reducer misapplies one add finds out at the next digest — with the digest taken on the daemon's loop and off it,
/// and again once the daemon has restarted from a snapshot (its dictionary decoded, the sum taken at its recovery
/// checkpoint) and the replicas have joined from the daemon's SNAPSHOT (theirs decoded too).
@Suite struct DigestFormProcessTests {
    @Test(arguments: [false, true])
    func aDigestFormsDigestsAgreeOverTheWireAndFindADivergence(offLoop: Bool) async throws {
        let directory = try temporaryDirectory("digest-form-\(offLoop)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let command = "ipc://\(directory.path)/command"
        let events = "ipc://\(directory.path)/events"
        let configuration = directory.appendingPathComponent("lockstepd.toml")
        try """
        data_dir = "\(directory.path)"
        command_endpoint = "\(command)"
        events_endpoint = "\(events)"
        domains = ["tree-todos"]

        [intervals]
        digest_every_events = 5
        checkpoint_off_loop_bytes = \(offLoop ? 0 : 1 << 20)

        [snapshots]
        every_events = 10
        """.write(to: configuration, atomically: true, encoding: .utf8)
        let daemon = try DaemonProcess(
            executable: productURL("lockstep"),
            folder: directory,
            arguments: ["bench-daemon", "--config", configuration.path, "--log-level", "warning"],
            command: command,
            events: events
        )
        try daemon.start()
        defer { daemon.stop() }
        try await offPool("daemon", lending: daemon) { try $0.waitUntilServing(within: .seconds(60)) }
        let replicaConfiguration = ReplicaConfiguration(commandEndpoint: command, eventsEndpoint: events)

        /// Adds todos through a faithful replica while a poisoned one follows; both must have joined afresh. The
        /// poisoned one's evidence, replayed through the faithful reducer, reaches the daemon's digest.
        func round(_ first: Int) async throws {
            let faithful = try Replica(TreeTodos.self, configuration: replicaConfiguration)
            var evidenceConfiguration = replicaConfiguration
            let evidence = directory.appendingPathComponent("evidence-\(first)")
            evidenceConfiguration.evidenceDirectory = evidence.path
            let poisoned = try Replica(Poisoned<TreeTodos>.self, configuration: evidenceConfiguration)
            let runs = [Task { try await faithful.run() }, Task { try await poisoned.run() }]
            defer { for run in runs { run.cancel() } }
            try await faithful.waitUntilLive(timeout: .seconds(30))
            try await poisoned.waitUntilLive(timeout: .seconds(30))
            for number in first..<first + 12 { _ = try await faithful.dispatch(.add(text: "todo \(number)")) }
            #expect(poisoned.status.divergences == 0, "the same actions, the same reducer so far")
            let poison = try await faithful.dispatch(.add(text: Poisoned<TreeTodos>.poison))
            // One digest at most `digest_every_events` later (and one off the loop when the pace allows).
            for number in 0..<20 { _ = try await faithful.dispatch(.add(text: "after \(first + number)")) }
            let found = try await eventually(within: .seconds(30)) { poisoned.status.divergences >= 1 }
            #expect(found, "the poisoned replica's digest at or after seq \(poison) differed from the daemon's")
            let synced = try await faithful.sync(timeout: .seconds(30))
            #expect(synced.seq >= poison + 20)
            #expect(faithful.status.divergences == 0 && faithful.status.resyncs == 0, "\(faithful.status)")
            for run in runs { run.cancel() }
            for run in runs { _ = try? await run.value }
            let files = try FileManager.default.contentsOfDirectory(atPath: evidence.path).filter {
                $0.hasSuffix(".json")
            }
            let file = try #require(files.sorted().first, "no evidence in \(evidence.path)")
            let written = try DivergenceEvidence(contentsOf: evidence.appendingPathComponent(file))
            #expect(written.daemonDigest != written.replicaDigest)
            let replayed = try written.replay(TreeTodos.self)
            #expect(
                !replayed.reproduced,
                "a replay through the faithful reducer reaches the daemon's digest: \(replayed)"
            )
        }

        try await round(0)
        // From a snapshot: the daemon's dictionary and the joining replicas' are decoded, their sums taken anew.
        #expect(await daemon.stop() == 0)
        try daemon.start()
        try await offPool("daemon", lending: daemon) { try $0.waitUntilServing(within: .seconds(60)) }
        try await round(100)
    }
}
