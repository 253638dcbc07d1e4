// swift-tools-version:6.0
// A template for hosting your own Lockstep domain: copy this folder, rename `Board`, and change the path
// dependency below into a versioned one (README.md, "Copy it").
import PackageDescription

let package = Package(
    name: "Kanban",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "Kanban", targets: ["Kanban"]),
        .executable(name: "boardd", targets: ["boardd"]),
        .executable(name: "board", targets: ["board"]),
        .executable(name: "board-client", targets: ["board-client"]),
    ],
    dependencies: [
        // Inside the Lockstep repository; in your copy:
        // .package(url: "https://github.com/<owner>/lockstep.git", from: "<version>"), and `package: "lockstep"` below.
        .package(name: "Lockstep", path: "../..")
    ],
    targets: [
        // The domain: state, actions, validator, reducer and generator. Depends on the pure core only, so any
        // process (daemon, tool, client, tests) links the very same reducer.
        .target(name: "Kanban", dependencies: [.product(name: "Lockstep", package: "Lockstep")]),
        .executableTarget(
            name: "boardd",
            dependencies: ["Kanban", .product(name: "LockstepServer", package: "Lockstep")]
        ),
        .executableTarget(
            name: "board",
            dependencies: ["Kanban", .product(name: "LockstepTool", package: "Lockstep")]
        ),
        .executableTarget(
            name: "board-client",
            dependencies: [
                "Kanban",
                .product(name: "Lockstep", package: "Lockstep"),
                .product(name: "LockstepClient", package: "Lockstep"),
            ]
        ),
        .testTarget(
            name: "KanbanTests",
            dependencies: [
                "Kanban",
                .product(name: "Lockstep", package: "Lockstep"),
                .product(name: "LockstepTesting", package: "Lockstep"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
