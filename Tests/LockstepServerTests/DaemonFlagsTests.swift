import Foundation
import LockstepServer
import TestSupport
import Testing

/// The flags every daemon made with `LockstepDaemonMain` takes: defaults, then `--config`, then flags.
@Suite struct DaemonFlagsTests {
    let domains = ["board", "settings"]

    @Test func flagsWinOverTheFileWhichWinsOverTheDefaults() throws {
        let directory = try temporaryDirectory("flags")
        defer { try? FileManager.default.removeItem(at: directory) }
        let file = directory.appendingPathComponent("daemon.toml").path
        try #"""
        data_dir = "/srv/data"
        durability = "relaxed"
        domains = ["board"]
        """#.write(toFile: file, atomically: true, encoding: .utf8)
        let flags = try DaemonFlags.parse([
            "--config", file, "--durability", "fsync", "--command-endpoint", "ipc:///x/c",
        ])
        let settings = try flags.configuration(environment: ["RUNTIME_DIRECTORY": "/run/board"], domains: domains)
        #expect(settings.dataDirectory == "/srv/data")
        #expect(settings.durability == .fsync)
        #expect(settings.domains == ["board"])
        #expect(settings.commandEndpoint == "ipc:///x/c")
        #expect(settings.eventsEndpoint == "ipc:///run/board/events")
        #expect(try DaemonFlags.parse([]).configuration(environment: [:], domains: domains).domains == domains)
    }

    @Test(
        arguments: [
            (["--durability", "sometimes"], "--durability: must be fsync or relaxed, got 'sometimes'"),
            (["--journal", "paper"], "--journal: must be sqlite or memory, got 'paper'"),
            (["--domain", "cart"], "no domain named 'cart' is linked into this daemon; it has board, settings"),
            (["--config", "/nonexistent/daemon.toml"], "/nonexistent/daemon.toml: --config: cannot read the file"),
        ]
    )
    func badValuesAreNamed(arguments: [String], message: String) throws {
        let flags = try DaemonFlags.parse(arguments)
        do {
            _ = try flags.configuration(environment: [:], domains: domains)
            Issue.record("\(arguments) was accepted")
        } catch {
            #expect("\(error)".contains(message), "\(error)")
        }
    }

    @Test func aLogLevelIsOneOfSwiftLogs() throws {
        #expect(try DaemonFlags.parse(["--log-level", "debug"]).level() == .debug)
        #expect(throws: ConfigurationError.self) { try DaemonFlags.parse(["--log-level", "loud"]).level() }
    }
}
