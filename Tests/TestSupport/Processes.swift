import Foundation

#if canImport(Glibc)
import Glibc
#endif

// Helpers every test target uses to run this package's executables as real processes, with every wait
// bounded and every process killed and reaped when it is done with.

/// A new empty directory under the system's temporary directory; the caller removes it.
public func temporaryDirectory(_ label: String) throws -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("lockstep-\(label)-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}

/// One of this package's executables, built next to the test bundle.
public func productURL(_ name: String) -> URL {
    let productsDirectory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    let executable = productsDirectory.appendingPathComponent(name)
    if FileManager.default.isExecutableFile(atPath: executable.path) { return executable }
    // swift-testing may run from inside the .xctest bundle.
    return productsDirectory.deletingLastPathComponent().appendingPathComponent(name)
}

public struct ProcessOutput: Sendable {
    public var status: Int32
    public var standardOutput: String
    public var standardError: String
}

public struct ProcessTimeout: Error, CustomStringConvertible {
    public var command: String
    public var description: String { "\(command) did not finish in time and was killed" }
}

/// Runs one of this package's executables to its end, waiting at most `timeout`.
public func runProduct(_ name: String, _ arguments: [String], timeout: Duration = .seconds(60)) throws -> ProcessOutput
{
    try ChildProcess(name, arguments).finish(within: timeout)
}

/// A child process whose standard output is read with bounded waits; its standard error goes to a file.
public final class ChildProcess {
    public let process = Process()
    /// The command line, for messages.
    public let command: String
    private let stdout = Pipe()
    private let errorFile: URL
    public private(set) var output: [UInt8] = []
    public private(set) var reachedEndOfOutput = false
    private var consumed = 0

    public init(_ name: String, _ arguments: [String]) throws {
        command = ([name] + arguments).joined(separator: " ")
        errorFile = FileManager.default.temporaryDirectory.appendingPathComponent("lockstep-child-\(UUID().uuidString)")
        guard FileManager.default.createFile(atPath: errorFile.path, contents: nil) else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: errorFile.path])
        }
        process.executableURL = productURL(name)
        process.arguments = arguments
        process.standardOutput = stdout
        process.standardError = try FileHandle(forWritingTo: errorFile)
        process.standardInput = FileHandle.nullDevice
        try process.run()
    }

    deinit {
        kill()
        try? FileManager.default.removeItem(at: errorFile)
    }

    /// Waits up to `timeout` for output and takes what has arrived.
    public func read(for timeout: Duration) {
        guard !reachedEndOfOutput else { return }
        let fd = stdout.fileHandleForReading.fileDescriptor
        var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let milliseconds = Int32(max(0, min(timeout / .milliseconds(1), 60_000)))
        guard poll(&descriptor, 1, milliseconds) > 0 else { return }
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        let count = Glibc.read(fd, &buffer, buffer.count)
        if count > 0 {
            output += buffer[..<count]
        } else if count == 0 {
            reachedEndOfOutput = true
        }
    }

    /// The complete lines that arrived since the last call.
    public func takeLines() -> [String] {
        guard let end = output.lastIndex(of: UInt8(ascii: "\n")), end >= consumed else { return [] }
        let text = String(decoding: output[consumed..<end], as: UTF8.self)
        consumed = end + 1
        return text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
    }

    /// The exit status, or `nil` if the process is still running after `timeout`.
    public func waitForExit(within timeout: Duration) -> Int32? {
        let deadline = ContinuousClock.now + timeout
        while process.isRunning {
            guard ContinuousClock.now < deadline else { return nil }
            Thread.sleep(forTimeInterval: 0.002)
        }
        return process.terminationStatus
    }

    /// Sends SIGKILL (if it still runs) and reaps it, waiting at most 10 s.
    public func kill() {
        if process.isRunning { _ = Glibc.kill(process.processIdentifier, SIGKILL) }
        _ = waitForExit(within: .seconds(10))
    }

    /// What the process wrote to standard error.
    public func errors() -> String {
        (try? String(contentsOf: errorFile, encoding: .utf8)) ?? ""
    }

    /// Reads to the end of its output and waits for it to exit, at most `timeout` in all; kills it and throws
    /// ``ProcessTimeout`` otherwise.
    public func finish(within timeout: Duration) throws -> ProcessOutput {
        defer { kill() }
        let deadline = ContinuousClock.now + timeout
        while !reachedEndOfOutput {
            guard ContinuousClock.now < deadline else { throw ProcessTimeout(command: command) }
            read(for: min(.milliseconds(100), deadline - ContinuousClock.now))
        }
        guard let status = waitForExit(within: deadline - ContinuousClock.now) else {
            throw ProcessTimeout(command: command)
        }
        return ProcessOutput(
            status: status,
            standardOutput: String(decoding: output, as: UTF8.self),
            standardError: errors()
        )
    }
}
