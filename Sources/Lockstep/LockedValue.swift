import Synchronization

/// A value shared between threads, reachable only through ``withLockedValue(_:)``.
///
/// The one lock type of the package: every piece of shared mutable state lives in one of these.
@usableFromInline
package final class LockedValue<Value: ~Copyable>: Sendable {
    @usableFromInline let mutex: Mutex<Value>

    @usableFromInline
    package init(_ value: consuming sending Value) {
        mutex = Mutex(value)
    }

    /// Runs `body` with exclusive access to the value. Never call back into code that takes the same lock.
    @inlinable
    package func withLockedValue<Result: ~Copyable, E: Error>(
        _ body: (inout sending Value) throws(E) -> sending Result
    ) throws(E) -> sending Result {
        try mutex.withLock(body)
    }
}
