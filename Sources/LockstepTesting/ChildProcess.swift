import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// What a child process left behind once it exited: its status and everything it wrote.
public struct ProcessOutput: Sendable {
    /// The exit status, as Foundation's `terminationStatus` gives it (the signal's number when a signal ended it).
    public var status: Int32
    /// Everything it wrote to standard output, decoded as UTF-8.
    public var standardOutput: String
    /// Everything it wrote to standard error, decoded as UTF-8.
    public var standardError: String
}

/// A child process did not finish within the time it was given, and was killed.
public struct ProcessTimeout: Error, CustomStringConvertible {
    /// The command line that was killed, as ``ChildProcess/command`` shows it.
    public var command: String
    /// `COMMAND did not finish in time and was killed`.
    public var description: String { "\(command) did not finish in time and was killed" }
}

/// A child process whose standard output is read with bounded waits; its standard error goes to a file.
///
/// Tests, the demo and the fault suite start this package's executables with it; it is killed (if still
/// running) and reaped when it is released. Each blocking wait has an async overload of the same name, for async
/// callers, which waits on a thread of its own (``offPool(_:lending:_:)``) instead of one of the cooperative pool.
public final class ChildProcess {
    /// The Foundation process, for its id, its status and whether it runs.
    public let process = Process()
    /// The command line, for messages.
    public let command: String
    private let stdout = Pipe()
    /// The child's standard input when it was started with `input: true`; else it reads /dev/null.
    private let stdin: Pipe?
    private let errorFile: URL
    /// The error file as the child's standard error, open for writing.
    private var errorHandle: FileHandle?
    private let keepsErrorFile: Bool
    /// Every byte of standard output read so far by `read(for:)`; ``takeLines()`` hands out its complete lines.
    public private(set) var output: [UInt8] = []
    /// Whether standard output has ended (the child closed it or exited); true from the start when it goes to the error
    /// file.
    public private(set) var reachedEndOfOutput = false
    private var consumed = 0

    /// Starts `executable` with `arguments`, in `directory` if given, with `environment` added to this
    /// process's; its standard error goes to `errorFile` (kept), or to a temporary file removed with this object.
    /// With `input`, ``send(_:)`` writes to its standard input. With `outputToErrorFile`, its standard output goes
    /// to the same file (a daemon's log), and this object reads none of it.
    public init(
        executable: URL,
        _ arguments: [String],
        directory: URL? = nil,
        errorFile: URL? = nil,
        environment: [String: String] = [:],
        input: Bool = false,
        outputToErrorFile: Bool = false
    ) throws {
        stdin = input ? Pipe() : nil
        command = ([executable.lastPathComponent] + arguments).joined(separator: " ")
        keepsErrorFile = errorFile != nil
        self.errorFile =
            errorFile
            ?? FileManager.default.temporaryDirectory.appendingPathComponent("lockstep-child-\(UUID().uuidString)")
        guard FileManager.default.createFile(atPath: self.errorFile.path, contents: nil) else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: self.errorFile.path])
        }
        process.executableURL = executable
        process.arguments = arguments
        process.currentDirectoryURL = directory
        if !environment.isEmpty {
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        }
        let errorHandle = try FileHandle(forWritingTo: self.errorFile)
        self.errorHandle = errorHandle
        process.standardOutput = outputToErrorFile ? errorHandle : stdout
        process.standardError = errorHandle
        reachedEndOfOutput = outputToErrorFile
        process.standardInput = stdin ?? FileHandle.nullDevice
        try process.run()
    }

    // Closes this side's ends of its pipes and its error file: Foundation's `Process` keeps its standard streams for
    // as long as it lives, which was past this object (2.5 descriptors a child: the fault suite's long mode ran out).
    deinit {
        kill()
        try? stdout.fileHandleForReading.close()
        try? stdin?.fileHandleForWriting.close()
        try? errorHandle?.close()
        if !keepsErrorFile { try? FileManager.default.removeItem(at: errorFile) }
    }

    /// Writes `line` and a newline to the child's standard input (started with `input: true`); false if the
    /// child no longer reads it.
    @discardableResult
    public func send(_ line: String) -> Bool {
        guard let stdin else { return false }
        do {
            try stdin.fileHandleForWriting.write(contentsOf: Data((line + "\n").utf8))
            return true
        } catch {
            return false
        }
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

    /// The same, for async callers: it waits on a thread of its own (``offPool(_:lending:_:)``), not on one of the
    /// cooperative pool.
    public func read(for timeout: Duration) async {
        await offPool("child read", lending: self) { $0.read(for: timeout) }
    }

    /// The complete lines that arrived since the last call.
    public func takeLines() -> [String] {
        guard let end = output.lastIndex(of: UInt8(ascii: "\n")), end >= consumed else { return [] }
        let text = String(decoding: output[consumed..<end], as: UTF8.self)
        consumed = end + 1
        return text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
    }

    /// The exit status, or `nil` if the process is still running after `timeout` (or never started).
    public func waitForExit(within timeout: Duration) -> Int32? {
        // A process that failed to start has no status to read (Foundation traps on it).
        guard process.processIdentifier != 0 else { return nil }
        let deadline = ContinuousClock.now + timeout
        while process.isRunning {
            guard ContinuousClock.now < deadline else { return nil }
            Thread.sleep(forTimeInterval: 0.002)
        }
        return process.terminationStatus
    }

    /// The same, for async callers: it waits on a thread of its own (``offPool(_:lending:_:)``), not on one of the
    /// cooperative pool.
    public func waitForExit(within timeout: Duration) async -> Int32? {
        await offPool("child wait", lending: self) { $0.waitForExit(within: timeout) }
    }

    /// What this side's descriptors for the child (its output pipe's and input pipe's ends, its error file) are
    /// open on, as `/proc/self/fd` names them (`pipe:[N]`, a path): gone once this object is.
    package var descriptorTargets: [String] {
        [stdout.fileHandleForReading, stdin?.fileHandleForWriting, errorHandle].compactMap { handle in
            handle.flatMap {
                try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\($0.fileDescriptor)")
            }
        }
    }

    /// Sends SIGKILL (if it still runs) and reaps it, waiting at most 10 s. What it wrote before it died can still
    /// be read.
    public func kill() {
        signal(SIGKILL)
        _ = waitForExit(within: .seconds(10))
    }

    /// Sends `signal` if the process still runs.
    public func signal(_ signal: Int32) {
        if process.isRunning { _ = Glibc.kill(process.processIdentifier, signal) }
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

    /// The same, for async callers: it waits on a thread of its own (``offPool(_:lending:_:)``), not on one of the
    /// cooperative pool.
    public func finish(within timeout: Duration) async throws -> ProcessOutput {
        try await offPool("child finish", lending: self) { try $0.finish(within: timeout) }
    }
}
