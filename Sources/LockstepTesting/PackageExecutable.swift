import Foundation

/// The executable product `name` of the package under test: SwiftPM builds every product into the folder that holds
/// the test bundle (`.build/debug`), so a test finds its package's daemon, tool or client there. `swift build`
/// builds them; run it before `swift test --skip-build`.
public func packageExecutable(_ name: String) -> URL {
    let productsDirectory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    let executable = productsDirectory.appendingPathComponent(name)
    if FileManager.default.isExecutableFile(atPath: executable.path) { return executable }
    // swift-testing may run from inside the .xctest bundle.
    return productsDirectory.deletingLastPathComponent().appendingPathComponent(name)
}
