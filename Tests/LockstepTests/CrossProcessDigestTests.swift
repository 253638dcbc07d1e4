import Foundation
import Lockstep
import LockstepExamples
import LockstepTesting
import TestSupport
import Testing

/// Equal states must give equal digests in separate processes, whose hash seeds differ.
@Suite struct CrossProcessDigestTests {
    @Test(arguments: Examples.domains.map { $0.name })
    func childProcessReachesTheSameDigest(store: String) async throws {
        let domain = try #require(Examples.domain(named: store))
        let (lines, digest, state) = try await applyGenerated(domain, count: 500, seed: 7)

        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("lockstep-digest-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let input = directory.appendingPathComponent("actions.jsonl")
        try lines.joined(separator: "\n").write(to: input, atomically: true, encoding: .utf8)

        let output = try await runProduct("lockstep", ["run", store, "--json", "--input", input.path])
        #expect(output.status == 0, "lockstep run failed: \(output.standardError)")
        let reply = try JSONSerialization.jsonObject(with: Data(output.standardOutput.utf8)) as? [String: Any]
        #expect(reply?["store"] as? String == store)
        #expect(reply?["seq"] as? Int == lines.count)
        #expect(reply?["digest"] as? String == digest.hex)
        let childState = try JSONSerialization.data(withJSONObject: reply?["state"] ?? [:], options: [.sortedKeys])
        #expect(
            try JSONSerialization.jsonObject(with: childState) as? NSDictionary
                == JSONSerialization.jsonObject(with: state) as? NSDictionary
        )
    }

    /// Applies generated actions in this process and returns the accepted ones as JSON lines.
    func applyGenerated<D: ActionGenerating>(
        _: D.Type,
        count: Int,
        seed: UInt64
    ) async throws
        -> (lines: [String], digest: StateDigest, state: Data)
    {
        let store = Store(D.self, observers: ActionObservers())
        var random = SplitMix64(seed: seed)
        var lines: [String] = []
        var attempts = 0
        while lines.count < count {
            attempts += 1
            try #require(
                attempts <= count * 100,
                "the generator made \(lines.count) valid actions in \(attempts) tries"
            )
            let action = D.randomAction(for: store.state, using: &random)
            do {
                try await store.dispatch(action)
                lines.append(String(decoding: try CanonicalEncoding.encode(action), as: UTF8.self))
            } catch {
                continue
            }
        }
        let state = try CanonicalEncoding.encode(store.state)
        return (lines, StateDigest(of: state), state)
    }
}
