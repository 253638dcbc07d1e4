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

    /// `journal = "postgres"` with its connection string, from the file or the flags.
    @Test func aPostgresJournalTakesItsConnectionStringFromTheFileOrTheFlag() throws {
        let directory = try temporaryDirectory("flags-postgres")
        defer { try? FileManager.default.removeItem(at: directory) }
        let file = directory.appendingPathComponent("daemon.toml").path
        try #"""
        journal = "postgres"
        postgres = "host=/run/postgresql dbname=lockstep"
        """#.write(toFile: file, atomically: true, encoding: .utf8)
        let fromFile = try DaemonFlags.parse(["--config", file]).configuration(environment: [:], domains: domains)
        #expect(fromFile.journal == .postgres)
        #expect(fromFile.postgresConnection == "host=/run/postgresql dbname=lockstep")
        let fromFlags = try DaemonFlags.parse(["--journal", "postgres", "--postgres", "dbname=other"])
            .configuration(environment: [:], domains: domains)
        #expect(fromFlags.journal == .postgres)
        #expect(fromFlags.postgresConnection == "dbname=other")
    }

    /// Unset, the journal is the one the data directory holds; in a new one, the log journal — or SQLite under
    /// relaxed durability, which only it has. Set, it is what it says.
    @Test func anUnsetJournalIsTheOneTheDataDirectoryHoldsOrTheLogJournalInANewOne() throws {
        let directory = try temporaryDirectory("flags-journal")
        defer { try? FileManager.default.removeItem(at: directory) }
        func configuration(_ data: String, _ flags: [String] = []) throws -> DaemonConfiguration {
            let path = directory.appendingPathComponent(data).path
            return try DaemonFlags.parse(["--data-dir", path] + flags).configuration(environment: [:], domains: domains)
        }
        #expect(try configuration("new").journal == nil)
        #expect(try configuration("new").journalToOpen == .log)
        #expect(try configuration("new", ["--durability", "relaxed"]).journalToOpen == .sqlite)
        #expect(try configuration("new", ["--journal", "sqlite"]).journalToOpen == .sqlite)
        for (file, kind) in [("journal.sqlite", DaemonConfiguration.JournalKind.sqlite), ("journal.lslog", .log)] {
            let data = directory.appendingPathComponent(file + "-dir")
            try FileManager.default.createDirectory(at: data, withIntermediateDirectories: true)
            #expect(FileManager.default.createFile(atPath: data.appendingPathComponent(file).path, contents: Data()))
            #expect(try configuration(file + "-dir").journalToOpen == kind)
            #expect(try configuration(file + "-dir", ["--journal", "memory"]).journalToOpen == .memory)
        }
        // Relaxed durability on a directory holding a log journal: refused, saying why; on one holding SQLite, taken.
        let error = #expect(throws: ConfigurationError.self) {
            try configuration("journal.lslog-dir", ["--durability", "relaxed"])
        }
        #expect(error?.description.contains("holds a log journal") == true, "\(String(describing: error))")
        #expect(try configuration("journal.sqlite-dir", ["--durability", "relaxed"]).journalToOpen == .sqlite)
    }

    @Test(
        arguments: [
            (["--durability", "sometimes"], "--durability: must be fsync or relaxed, got 'sometimes'"),
            (["--journal", "paper"], "--journal: must be sqlite, memory, postgres or log, got 'paper'"),
            (["--journal", "postgres"], "postgres: journal is 'postgres' but no connection string is given"),
            (["--postgres", "dbname=x"], "a PostgreSQL connection string is given, but the journal is not set"),
            (
                ["--journal", "sqlite", "--postgres", "dbname=x"],
                "a PostgreSQL connection string is given, but the journal is 'sqlite'",
            ),
            (
                ["--journal", "postgres", "--postgres", "dbname=x", "--durability", "relaxed"],
                "'relaxed' is for the sqlite journal",
            ),
            (
                ["--journal", "log", "--durability", "relaxed"],
                "the log journal's commit is one append and one fdatasync, and it has no relaxed mode",
            ),
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
