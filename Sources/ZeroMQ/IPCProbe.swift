#if canImport(Glibc)
import Glibc
#endif

/// Whether anything listens on an `ipc://` endpoint, asked of the file system and the kernel without libzmq:
/// a command can then say at once that no daemon is there, rather than wait out its retries.
public enum IPCProbe {
    /// What is at an `ipc://` endpoint's path.
    public enum Finding: Equatable, Sendable {
        /// Something accepts connections there (a daemon, or at least a socket someone listens on).
        case listening
        /// Nothing is at the path.
        case missing
        /// A socket file is there but nobody listens: left behind by a process that is gone.
        case stale
        /// This process may not connect (EACCES): no search permission on a directory of the path, or no write
        /// permission on the socket, e.g. a user outside the group that owns a daemon's runtime directory.
        case denied
        /// Not an `ipc://` endpoint, or a path that cannot be probed (too long, another error…).
        case unknown
    }

    /// Probes `endpoint` with one non-blocking connect of a Unix stream socket, closed at once.
    public static func probe(_ endpoint: String) -> Finding {
        guard endpoint.hasPrefix("ipc://") else { return .unknown }
        let path = Array(endpoint.utf8.dropFirst("ipc://".count))
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard !path.isEmpty, path.first != UInt8(ascii: "@"), path.count < capacity else { return .unknown }
        withUnsafeMutableBytes(of: &address.sun_path) { bytes in
            for (index, byte) in path.enumerated() { bytes[index] = byte }
        }
        let descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { return .unknown }
        defer { close(descriptor) }
        var result: Int32
        repeat {
            result = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
                }
            }
        } while result != 0 && errno == EINTR
        if result == 0 { return .listening }
        switch errno {
        case ENOENT: return .missing
        case ECONNREFUSED: return .stale
        case EACCES: return .denied
        case EAGAIN: return .listening  // a full backlog: someone listens
        default: return .unknown
        }
    }
}
