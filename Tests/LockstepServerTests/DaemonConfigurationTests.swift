import Foundation
import LockstepServer
import Testing

@Suite struct DaemonConfigurationTests {
    let examples = ["counter", "todos", "posts", "numbers"]

    @Test func defaultsFollowSystemdsDirectoriesOrTheCurrentFolder() {
        let local = DaemonConfiguration(environment: [:], domains: examples)
        #expect(local.dataDirectory == ".lockstep/data")
        #expect(local.commandEndpoint == "ipc://.lockstep/run/command")
        #expect(local.eventsEndpoint == "ipc://.lockstep/run/events")
        let systemd = DaemonConfiguration(
            environment: ["STATE_DIRECTORY": "/var/lib/lockstep", "RUNTIME_DIRECTORY": "/run/lockstep:/run/other"],
            domains: examples
        )
        #expect(systemd.dataDirectory == "/var/lib/lockstep")
        #expect(systemd.commandEndpoint == "ipc:///run/lockstep/command")
        #expect(systemd.durability == .fsync)
    }

    @Test func theSampleFileIsReadWhole() throws {
        let sample = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("deploy/lockstepd.toml")
        var configuration = DaemonConfiguration(environment: [:], domains: [])
        try configuration.apply(try TOMLDocument.parse(String(contentsOf: sample, encoding: .utf8)), file: sample.path)
        try configuration.validate(knownDomains: examples)
        #expect(configuration.dataDirectory == "/var/lib/lockstep")
        #expect(configuration.eventsEndpoint == "ipc:///run/lockstep/events")
        #expect(configuration.domains == examples)
        #expect(configuration.heartbeatInterval == .seconds(1))
        #expect(configuration.snapshots.snapshotEveryEvents == 10_000)
        #expect(configuration.maximumBatch == 1_000)
        #expect(configuration.curve == nil)
    }

    @Test(arguments: [
        ("dat_dir = \"x\"", "dat_dir: unknown setting; the settings at the top level are "),
        ("[intervals]\nheartbeat = 5", "intervals.heartbeat: unknown setting; the settings in [intervals] are "),
        ("durability = \"sometimes\"", "durability: expected one of \"fsync\", \"relaxed\", got \"sometimes\""),
        ("[intervals]\nheartbeat_ms = 0", "intervals.heartbeat_ms: expected a whole number in 10...3600000, got 0"),
        ("domains = [\"counter\", 3]", "domains: expected strings only, got 3"),
        ("[curve]\nserver_key_file = \"k\"", "curve: [curve] needs both"),
        ("[http]\nlisten = 9464", "http.listen: expected a string, got 9464"),
        ("[http]\ninspector = \"yes\"", "http.inspector: expected true or false, got \"yes\""),
    ])
    func badSettingsAreNamed(text: String, message: String) throws {
        var configuration = DaemonConfiguration(environment: [:], domains: examples)
        let error = #expect(throws: ConfigurationError.self) {
            try configuration.apply(try TOMLDocument.parse(text), file: "lockstepd.toml")
        }
        #expect(error?.description.hasPrefix("lockstepd.toml: \(message)") == true, "\(String(describing: error))")
    }

    @Test func theInspectorIsServedOnLoopbackUnlessConfigured() throws {
        var configuration = DaemonConfiguration(environment: [:], domains: examples)
        #expect(!configuration.servesInspector)
        for (listen, served) in [
            ("127.0.0.1:0", true), ("[::1]:9464", true), ("localhost:9464", true), ("0.0.0.0:9464", false),
            ("192.168.1.5:9464", false),
        ] {
            configuration.httpListen = listen
            #expect(configuration.servesInspector == served, "\(listen)")
        }
        try configuration.apply(try TOMLDocument.parse("[http]\ninspector = true"), file: "lockstepd.toml")
        #expect(configuration.servesInspector)
        configuration.httpListen = "127.0.0.1:0"
        configuration.inspector = false
        #expect(!configuration.servesInspector)
    }

    @Test func validationRefusesWhatCannotBeServed() {
        var configuration = DaemonConfiguration(environment: [:], domains: ["counter", "nope"])
        #expect(throws: ConfigurationError.self) { try configuration.validate(knownDomains: examples) }
        configuration.domains = ["counter"]
        configuration.commandEndpoint = "tcp://127.0.0.1:5555"
        let tcp = #expect(throws: ConfigurationError.self) { try configuration.validate(knownDomains: examples) }
        #expect(tcp?.reason.contains("CURVE") == true)
        configuration.commandEndpoint = configuration.eventsEndpoint
        #expect(throws: ConfigurationError.self) { try configuration.validate(knownDomains: examples) }
    }
}
