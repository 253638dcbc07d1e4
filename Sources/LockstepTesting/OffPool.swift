import Foundation
import ZeroMQ

/// Runs `body` on a thread of its own and returns what it returns, or throws what it throws, while the calling
/// task suspends instead of holding a thread of Swift's cooperative pool.
///
/// The pool has as many threads as the machine has cores, and every task waits for one of them: a test that
/// blocks one for seconds — waiting for a child process, a daemon's reply, `initdb`, a polling loop timed by the
/// clock — keeps every task queued behind it waiting, a replica's or a daemon's service included, whose own
/// deadlines then expire for nothing. The waits of ``ChildProcess``, ``ReplicaClient``, ``DaemonProcess``,
/// ``PostgresServer`` and ``TestHosts`` have async overloads of the same name (``TestHosts/make(_:)`` makes hosts)
/// that call them through this function.
///
/// ```swift
/// let output = try await offPool { try ChildProcess(executable: tool, ["stats"]).finish(within: .seconds(20)) }
/// #expect(output.status == 0)
/// ```
///
/// Swift Testing finds the running test through task-local values, which the thread does not have: `body` returns
/// what a test checks, and `#expect`, `#require`, `Issue.record` and `Test.cancel` stay in the test's task.
/// Cancelling the calling task does not interrupt `body` — the task resumes only once `body` has returned — so
/// every wait in `body` must be bounded.
///
/// - Parameters:
///   - name: The thread's name, as `ps` and a debugger show it, cut to the 15 bytes Linux keeps.
///   - body: The blocking work. It may capture only `Sendable` values; ``offPool(_:lending:_:)`` lends it one that
///     is not.
/// - Returns: What `body` returned.
/// - Throws: What `body` threw.
public func offPool<T, E: Error>(
    _ name: String = "offPool",
    _ body: @escaping @Sendable () throws(E) -> sending T
) async throws(E) -> sending T {
    let result: Result<T, E> = await withCheckedContinuation { continuation in
        let thread = Thread {
            nameCurrentThread(name)
            do throws(E) {
                let value = try body()
                continuation.resume(returning: .success(value))
            } catch {
                continuation.resume(returning: .failure(error))
            }
        }
        thread.start()
    }
    return try result.get()
}

/// Runs `body` on a thread of its own with `value`, which need not be `Sendable` — a ``ChildProcess``, a
/// ``DaemonProcess``, a socket — and which the calling task lends the thread until `body` returns; otherwise as
/// ``offPool(_:_:)``.
///
/// ```swift
/// let report = await offPool(lending: client) { $0.wait(within: .seconds(30)) { $0.done } }
/// ```
///
/// - Parameters:
///   - name: The thread's name, as `ps` and a debugger show it, cut to the 15 bytes Linux keeps.
///   - value: What `body` works on; the caller, suspended meanwhile, has it back once `body` has returned.
///   - body: The blocking work, given `value`. It may capture only `Sendable` values.
/// - Returns: What `body` returned.
/// - Throws: What `body` threw.
@concurrent
public func offPool<Value, T, E: Error>(
    _ name: String = "offPool",
    lending value: Value,
    _ body: @escaping @Sendable (Value) throws(E) -> sending T
) async throws(E) -> sending T {
    let lent = Lent(value: value)
    return try await offPool(name) { () throws(E) -> sending T in try body(lent.value) }
}

/// A value of ``offPool(_:lending:_:)``'s caller, carried to its thread.
///
/// `@unchecked Sendable` is safe because only one thread at a time uses `value`. `offPool(_:lending:_:)` is
/// `@concurrent` and takes `value` as a plain parameter, so region-based isolation lets a caller pass only a value
/// in its own task's region, which no other task or thread can reach (an actor may pass only a value it sends
/// away for good). That caller stays suspended from the call until `body` has returned — cancellation does not
/// resume it earlier — and the continuation's resumption orders the thread's last use of `value` before the
/// caller's next one. `body` is `@Sendable` and its result `sending`, so it can neither keep `value` nor hand it
/// on, and this type stays private to this file.
private struct Lent<Value>: @unchecked Sendable {
    let value: Value
}
