import Foundation
import LockstepTesting
import Testing

/// Test hosts (network namespaces) for a test, or the test cancelled — Swift Testing reports it as cancelled, with
/// the reason, never as passed — when they cannot be made here (not root, no `ip`, no veth or bridge); a line
/// starting `SKIP:` says so in the output too. With `LOCKSTEP_HOSTS_REQUIRED=1` in the environment that is an issue
/// instead, and the result `nil`: for a machine where the test must run.
public func testHostsOrSkip(
    _ names: [String],
    sourceLocation: SourceLocation = #_sourceLocation
) throws -> TestHosts? {
    do {
        return try TestHosts(names)
    } catch let unavailable as TestHostsUnavailable {
        try skip(unavailable, sourceLocation: sourceLocation)
        return nil
    }
}

/// The same, for async tests: the hosts are made on a thread of their own (`TestHosts.make`), not on one of the
/// cooperative pool; the issue or the cancellation is recorded in the test's own task.
public func testHostsOrSkip(
    _ names: [String],
    sourceLocation: SourceLocation = #_sourceLocation
) async throws -> TestHosts? {
    do {
        return try await TestHosts.make(names)
    } catch let unavailable as TestHostsUnavailable {
        try skip(unavailable, sourceLocation: sourceLocation)
        return nil
    }
}

/// Records the issue (`LOCKSTEP_HOSTS_REQUIRED=1`) or prints `SKIP:` and cancels the test.
private func skip(_ unavailable: TestHostsUnavailable, sourceLocation: SourceLocation) throws {
    if ProcessInfo.processInfo.environment["LOCKSTEP_HOSTS_REQUIRED"] == "1" {
        Issue.record("LOCKSTEP_HOSTS_REQUIRED=1, and \(unavailable)", sourceLocation: sourceLocation)
        return
    }
    print("SKIP: \(unavailable) -- the test at \(sourceLocation) was NOT run")
    try Test.cancel("SKIP: \(unavailable)", sourceLocation: sourceLocation)
}
