import ZeroMQ

/// Runs `body` in the calling task, but on the test run's one thread for long synchronous checks — a check that
/// encodes thousands of values, a fuzzer, a determinism check and its replays — rather than on one of Swift's
/// cooperative pool, and one such check at a time.
///
/// One at a time because the machine that runs the suite may have two cores: eleven of these checks started at
/// once with the run (each on a thread of its own) kept both cores busy for a minute and a half, and the process
/// tests beside them — daemons, replicas and `lockstep` runs, whose waits are bounded — got a sixth of a core: a
/// single `lockstep dispatch` passed 30 s. Queued here, they leave a core to the rest, and the run takes as long.
///
/// `offPool` (LockstepTesting) runs a closure on another thread, outside the task, so `#expect` there would find
/// no test. Here the task is the same — it only prefers the check thread's executor for the while
/// (`withTaskExecutorPreference`) — so `#expect`, `#require` and `Issue.record` in `body` find the test as
/// anywhere else in it, while the pool's threads stay free for every other test's tasks: a replica's `run()`, a
/// daemon's service, a continuation resumed from a wait.
///
/// Work `body` hands to an actor still runs on that actor; only the task's own nonisolated code moves. A check
/// waits its turn: give its test a time limit that counts the checks queued before it.
public func onCheckThread<T, E: Error>(_ body: () async throws(E) -> T) async throws(E) -> T {
    try await withTaskExecutorPreference(checkThread) { () async throws(E) -> T in try await body() }
}

/// The run's check thread, started at the first check and kept until the process ends.
private let checkThread = ThreadsExecutor(limit: 1, name: "test checks")
