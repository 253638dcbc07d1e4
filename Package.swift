// swift-tools-version:6.0
import PackageDescription

// The fault suite's crash points and its journal that never fsyncs (`LOCKSTEP_FAILPOINT`) exist only in test
// (debug) builds: a release daemon has no switch that turns durability off.
let testBuildFailpoints: [SwiftSetting] = [.define("LOCKSTEP_FAILPOINTS", .when(configuration: .debug))]

let package = Package(
    name: "Lockstep",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "Lockstep", targets: ["Lockstep"]),
        .library(name: "LockstepProtocol", targets: ["LockstepProtocol"]),
        .library(name: "LockstepJournal", targets: ["LockstepJournal"]),
        .library(name: "LockstepServer", targets: ["LockstepServer"]),
        .library(name: "LockstepClient", targets: ["LockstepClient"]),
        .library(name: "LockstepTesting", targets: ["LockstepTesting"]),
        .library(name: "LockstepExamples", targets: ["LockstepExamples"]),
        .library(name: "LockstepTool", targets: ["LockstepTool"]),
        .library(name: "ZeroMQ", targets: ["ZeroMQ"]),
        .executable(name: "lockstepd", targets: ["lockstepd"]),
        .executable(name: "lockstep", targets: ["LockstepCLI"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-crypto.git", "3.12.3"..<"5.0.0"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        // TreeDictionary: the persistent dictionary docs/domains.md recommends for large states (the bench measures it,
        // a test holds its canonical form); already in the graph through swift-async-algorithms.
        .package(url: "https://github.com/apple/swift-collections.git", from: "1.6.0"),
        .package(url: "https://github.com/groue/GRDB.swift.git", from: "7.10.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        // Metrics (docs/operations.md, "Metrics"): the libraries record through swift-metrics, so a user's own
        // MetricsSystem receives them; a daemon with an HTTP listener serves them as Prometheus text.
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        // Traces (docs/operations.md, "Traces"): a dispatch's span at the client, continued by the daemon's through the
        // trace context the DISPATCH carries; users plug in their tracer (swift-otel or another).
        .package(url: "https://github.com/apple/swift-distributed-tracing.git", from: "1.7.3"),
        // `swift package generate-documentation` (`make docs`); the plugin adds nothing to the products.
        .package(url: "https://github.com/swiftlang/swift-docc-plugin", from: "1.5.0"),
    ],
    targets: [
        // libzmq (zmq.h in the system's include path, linked by the module map); imported only by ZeroMQ. Not through
        // pkg-config: Debian's libzmq.pc adds `-isystem /usr/include/mit-krb5`, which SwiftPM refuses with a warning
        // in every build of every package that depends on Lockstep, and zmq.h needs none of its flags.
        .systemLibrary(
            name: "CZeroMQ",
            providers: [.apt(["libzmq3-dev"])]
        ),
        .target(name: "ZeroMQ", dependencies: ["CZeroMQ"]),
        // libpq, opened with dlopen when a PostgreSQL journal is; imported only by LockstepJournal.
        .target(name: "CLibPQ"),
        // HashTreeCollections: `DigestedDictionary`, the tree a large state keeps its members in.
        .target(
            name: "Lockstep",
            dependencies: [
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "HashTreeCollections", package: "swift-collections"),
            ]
        ),
        .target(
            name: "LockstepProtocol",
            dependencies: [
                "Lockstep", .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Instrumentation", package: "swift-distributed-tracing"),
            ]
        ),
        // GRDBSQLite: the commit path binds and steps its statements through SQLite's C API.
        .target(
            name: "LockstepJournal",
            dependencies: [
                "Lockstep", "CLibPQ", .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
            ],
            swiftSettings: testBuildFailpoints
        ),
        .target(
            name: "LockstepServer",
            dependencies: [
                "Lockstep", "LockstepProtocol", "LockstepJournal", "ZeroMQ",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ],
            // The inspector's page (docs/operations.md, "The inspector"), built into the binary as bytes.
            resources: [.embedInCode("Inspector/inspector.html")],
            swiftSettings: testBuildFailpoints
        ),
        .target(
            name: "LockstepClient",
            dependencies: [
                "Lockstep", "LockstepProtocol", "ZeroMQ",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ]
        ),
        .target(
            name: "LockstepTesting",
            dependencies: ["Lockstep", "LockstepProtocol", "LockstepClient", "LockstepJournal", "ZeroMQ"]
        ),
        .target(name: "LockstepExamples", dependencies: ["Lockstep"]),
        .executableTarget(
            name: "lockstepd",
            dependencies: ["LockstepServer", "LockstepExamples"]
        ),
        // The domain-aware tool for any domains: `LockstepToolMain.run(domains:)`.
        .target(
            name: "LockstepTool",
            dependencies: [
                "Lockstep", "LockstepProtocol", "LockstepClient", "LockstepTesting", "ZeroMQ", "LockstepJournal",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        // lockstepd measured from outside: C clients of its wire protocol and a raw C echo (`lockstep bench`'s
        // `outside` part), so that neither side of that comparison pays for Swift.
        .executableTarget(name: "lockstep-cload", linkerSettings: [.linkedLibrary("zmq")]),
        // The examples' bench (`lockstep bench`) and journal fixtures, and their demo (`lockstep demo`).
        .target(
            name: "LockstepBench",
            dependencies: [
                "Lockstep", "LockstepProtocol", "LockstepClient", "LockstepExamples", "LockstepJournal",
                "LockstepServer", "LockstepTesting", "LockstepTool", "ZeroMQ", "CZeroMQ",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "HashTreeCollections", package: "swift-collections"),
            ]
        ),
        .target(
            name: "LockstepDemo",
            dependencies: [
                "Lockstep", "LockstepProtocol", "LockstepClient", "LockstepExamples", "LockstepTesting", "LockstepTool",
                "ZeroMQ", .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        // The target is not called `lockstep`: its module would clash with `Lockstep` on a case-blind disk.
        .executableTarget(
            name: "LockstepCLI",
            dependencies: [
                "Lockstep", "LockstepProtocol", "LockstepClient", "LockstepExamples", "LockstepTesting", "ZeroMQ",
                "LockstepJournal", "LockstepServer", "LockstepTool", "LockstepBench", "LockstepDemo",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Sources/lockstep"
        ),
        .testTarget(
            name: "LockstepTests",
            dependencies: [
                "Lockstep", "LockstepExamples", "LockstepTesting", "TestSupport",
                .product(name: "HashTreeCollections", package: "swift-collections"),
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        .testTarget(name: "ZeroMQTests", dependencies: ["ZeroMQ", "TestSupport"]),
        .testTarget(
            name: "LockstepBenchTests",
            dependencies: [
                "LockstepBench", "LockstepClient", "LockstepDemo", "LockstepExamples", "LockstepJournal",
                "LockstepProtocol", "LockstepTesting", "TestSupport", "lockstepd", "LockstepCLI",
            ]
        ),
        .testTarget(
            name: "LockstepProtocolTests",
            dependencies: ["LockstepProtocol", "LockstepExamples", "TestSupport"]
        ),
        // The replica's sans-I/O values (the optimistic ledger), without sockets.
        .testTarget(
            name: "LockstepClientTests",
            dependencies: ["LockstepClient", "LockstepProtocol", "LockstepExamples", "Lockstep"]
        ),
        // Runs this package's executables from tests, with bounded waits.
        .target(name: "TestSupport", dependencies: ["LockstepTesting", "ZeroMQ"], path: "Tests/TestSupport"),
        // Deliberately nondeterministic domains, and a child-replica executable that hosts them.
        .target(name: "ReplayFixtures", dependencies: ["Lockstep"], path: "Tests/ReplayFixtures"),
        .executableTarget(
            name: "replay-fixtures",
            dependencies: ["LockstepTesting", "LockstepExamples", "ReplayFixtures"],
            path: "Tests/ReplayFixturesChild"
        ),
        .testTarget(
            name: "LockstepTestingTests",
            dependencies: ["LockstepTesting", "LockstepExamples", "ReplayFixtures", "replay-fixtures", "TestSupport"]
        ),
        // The fault and bad-input suite: `lockstep-faults` (quick, in `make test`) or `--long` (`make faults`).
        .executableTarget(
            name: "lockstep-faults",
            dependencies: [
                "Lockstep", "LockstepClient", "LockstepJournal", "LockstepProtocol", "LockstepTesting", "ZeroMQ",
                "LockstepExamples", "LockstepBench", .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Tests/Faults"
        ),
        // A traced daemon or dispatching client (an in-memory tracer whose finished spans go to a file), for the
        // tracing test.
        .executableTarget(
            name: "trace-fixture",
            dependencies: [
                "Lockstep", "LockstepServer", "LockstepClient", "LockstepExamples",
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "InMemoryTracing", package: "swift-distributed-tracing"),
            ],
            path: "Tests/TraceFixture"
        ),
        // A daemon of one version of the fixtures' `shelf` domain, for the upgrade tests.
        .executableTarget(
            name: "shelf-daemon",
            dependencies: ["LockstepServer", "ReplayFixtures"],
            path: "Tests/UpgradeFixtureDaemon"
        ),
        .testTarget(
            name: "LockstepServerTests",
            dependencies: [
                "LockstepServer", "LockstepProtocol", "LockstepJournal", "LockstepExamples", "ZeroMQ", "lockstepd",
                "LockstepCLI", "LockstepClient", "LockstepTesting", "TestSupport", "ReplayFixtures", "shelf-daemon",
                "trace-fixture",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "LockstepJournalTests",
            dependencies: [
                "LockstepJournal", "LockstepExamples", "LockstepTesting", "TestSupport", "ReplayFixtures",
                .product(name: "GRDB", package: "GRDB.swift"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
