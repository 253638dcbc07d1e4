import CZeroMQ

/// The libzmq this process linked, and whether it is one Lockstep can use.
public enum LibZMQ {
    /// The oldest libzmq Lockstep accepts: 4.3.3 fixed the ZAP and CURVE handling the daemon relies on.
    public static let minimumVersion = (major: 4, minor: 3, patch: 3)

    /// The linked library's version.
    public static var version: (major: Int, minor: Int, patch: Int) {
        var major: Int32 = 0
        var minor: Int32 = 0
        var patch: Int32 = 0
        zmq_version(&major, &minor, &patch)
        return (Int(major), Int(minor), Int(patch))
    }

    /// Whether the library was built with CURVE security (libsodium or tweetnacl).
    public static var hasCurve: Bool { zmq_has("curve") != 0 }

    /// Throws a clear error unless the library is at least ``minimumVersion`` and has CURVE.
    public static func checkRuntime() throws(ZeroMQError) {
        let version = self.version
        let minimum = minimumVersion
        if (version.major, version.minor, version.patch) < (minimum.major, minimum.minor, minimum.patch) {
            throw ZeroMQError(
                errno: EPROTO,
                function: "zmq_version",
                detail: "libzmq \(version.major).\(version.minor).\(version.patch) is too old; Lockstep needs "
                    + "\(minimum.major).\(minimum.minor).\(minimum.patch) or newer "
                    + "(Debian: apt-get install libzmq3-dev)"
            )
        }
        if !hasCurve {
            throw ZeroMQError(
                errno: EPROTO,
                function: "zmq_has",
                detail: "libzmq \(version.major).\(version.minor).\(version.patch) was built without CURVE; "
                    + "install a build with libsodium (Debian's libzmq5 has it)"
            )
        }
    }
}

/// A libzmq context: the I/O threads behind a process's sockets.
///
/// Sockets keep their context alive. ``shutdown()`` makes every blocking call on its sockets fail with
/// `ETERM` so their owners can close them; the context itself is terminated when the last reference goes.
public final class Context: Sendable {
    // Only an address: the pointer is never dereferenced in Swift, and libzmq documents contexts as
    // thread-safe, so sharing it between threads is what it is for.
    nonisolated(unsafe) let handle: UnsafeMutableRawPointer

    /// A context with `ioThreads` I/O threads; fails if libzmq is too old or lacks CURVE.
    public init(ioThreads: Int32 = 1) throws(ZeroMQError) {
        try LibZMQ.checkRuntime()
        guard let handle = zmq_ctx_new() else {
            throw ZeroMQError(errno: zmq_errno(), function: "zmq_ctx_new")
        }
        self.handle = handle
        try zmqCheck("zmq_ctx_set", detail: "ZMQ_IO_THREADS = \(ioThreads)") {
            zmq_ctx_set(handle, ZMQ_IO_THREADS, ioThreads)
        }
    }

    /// Wakes every blocked call on this context's sockets with `ETERM`; new sockets can no longer be made.
    public func shutdown() {
        // zmq_ctx_shutdown fails only for an invalid context, which `handle` never is.
        _ = try? zmqCheck("zmq_ctx_shutdown") { zmq_ctx_shutdown(handle) }
    }

    deinit {
        // Every socket holds a reference to its context, so all of them are closed by now and this does
        // not wait for anything but libzmq's own threads.
        _ = try? zmqCheck("zmq_ctx_term") { zmq_ctx_term(handle) }
    }
}
