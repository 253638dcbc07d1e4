import ZeroMQ

/// Runs `body` in the calling task, but on a thread of its own rather than on one of Swift's cooperative pool: for
/// long synchronous work — a check that encodes thousands of values, a fuzzer — in a test that checks as it goes.
///
/// `offPool` (LockstepTesting) runs a closure on another thread, outside the task, so `#expect` there would find
/// no test. Here the task is the same — it only prefers an executor of its own for the while
/// (`withTaskExecutorPreference`) — so `#expect`, `#require` and `Issue.record` in `body` find the test as
/// anywhere else in it, while the pool's threads (as many as the cores) stay free for every other test's tasks:
/// a replica's `run()`, a daemon's service, a continuation resumed from a wait.
///
/// Work `body` hands to an actor still runs on that actor; only the task's own nonisolated code moves.
public func onOwnThread<T, E: Error>(
    _ name: String = "test thread",
    _ body: () async throws(E) -> T
) async throws(E) -> T {
    let executor = ThreadsExecutor(limit: 1, name: name)
    defer { executor.stop() }
    return try await withTaskExecutorPreference(executor) { () async throws(E) -> T in try await body() }
}
