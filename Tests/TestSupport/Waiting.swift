/// Polls `done` every `interval` until it holds, at most `timeout / interval` times; returns whether it held.
///
/// The bound counts polls rather than reading the clock. In a full parallel run on two cores an async test can
/// wait many seconds for a thread of the cooperative pool between two polls, and so can a task it waits on (a
/// replica, a daemon's service). A deadline read from the clock then expires before that task had its turn, and
/// the test fails for nothing; counted polls each sleep at least `interval`, so the wait still lasts at least
/// `timeout`, and never without end.
public func eventually(
    within timeout: Duration,
    every interval: Duration = .milliseconds(20),
    _ done: () async throws -> Bool
) async throws -> Bool {
    for _ in 0..<max(1, Int(timeout / interval)) {
        if try await done() { return true }
        try await Task.sleep(for: interval)
    }
    return try await done()
}
