import Foundation
import Lockstep
import LockstepExamples
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

        let output = try runProduct("lockstep", ["run", store, "--json", "--input", input.path])
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
        while lines.count < count {
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

struct ProcessOutput {
    var status: Int32
    var standardOutput: String
    var standardError: String
}

/// Runs one of this package's executables, built next to the test bundle, and waits at most `timeout`.
func runProduct(_ name: String, _ arguments: [String], timeout: Duration = .seconds(60)) throws -> ProcessOutput {
    let productsDirectory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    var executable = productsDirectory.appendingPathComponent(name)
    if !FileManager.default.isExecutableFile(atPath: executable.path) {
        // swift-testing may run from inside the .xctest bundle.
        executable = productsDirectory.deletingLastPathComponent().appendingPathComponent(name)
    }
    let process = Process()
    process.executableURL = executable
    process.arguments = arguments
    let stdout = Pipe()
    let stderr = Pipe()
    process.standardOutput = stdout
    process.standardError = stderr
    try process.run()
    let deadline = ContinuousClock.now + timeout
    // Read before waiting so a chatty child cannot fill the pipe and stall.
    let out = stdout.fileHandleForReading.readDataToEndOfFile()
    let err = stderr.fileHandleForReading.readDataToEndOfFile()
    while process.isRunning {
        if ContinuousClock.now > deadline {
            process.terminate()
            process.waitUntilExit()
            throw ProcessTimeout(command: "\(name) \(arguments.joined(separator: " "))")
        }
        Thread.sleep(forTimeInterval: 0.01)
    }
    return ProcessOutput(
        status: process.terminationStatus,
        standardOutput: String(decoding: out, as: UTF8.self),
        standardError: String(decoding: err, as: UTF8.self)
    )
}

struct ProcessTimeout: Error, CustomStringConvertible {
    var command: String
    var description: String { "\(command) did not finish in time and was terminated" }
}
