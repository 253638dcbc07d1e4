import Foundation
import Lockstep
import LockstepJournal

#if canImport(Glibc)
import Glibc
#endif

/// A throwaway PostgreSQL server for tests: `initdb` into a fresh temporary folder, `postgres` started on a Unix
/// socket in that folder (no TCP port at all), and the folder removed when the server stops — the way the journal
/// tests run `PostgresJournal` against a real server.
///
/// ```swift
/// let server = try PostgresServer.start()
/// defer { server.stop() }
/// let journal = try PostgresJournal(connection: try server.createDatabase())
/// ```
///
/// The binaries come from Debian's `postgresql` package (`/usr/lib/postgresql/VERSION/bin`, the newest version
/// installed) or from `$PATH`. `initdb` and `postgres` refuse to run as root, so as root the server runs as the
/// `postgres` user (through `setpriv`) and the folder is made theirs. The server runs in the foreground as this
/// process's child: it is stopped (fast shutdown, then immediate, then SIGKILL, each wait bounded) by ``stop()``
/// or when the object is released. A test process killed with SIGKILL leaves it running, with its folder:
/// `lockstep-pg-*` in the temporary directory.
public final class PostgresServer: Sendable {
    /// The folder holding the cluster (`data`), the socket directory (`socket`) and the server's log (`log`).
    public let folder: URL
    /// The directory of the server's Unix socket: the `host` of a connection string.
    public let socketDirectory: String
    /// The port, which on a Unix socket only names the socket file (`.s.PGSQL.PORT`).
    public let port: Int
    /// The superuser the cluster was made with, who owns every database created here.
    public let user = "postgres"
    private let child: LockedValue<ChildProcess?>

    /// Makes a cluster in a new temporary folder and starts it; returns once it accepts connections.
    ///
    /// - Parameters:
    ///   - settings: Extra server settings (`-c name=value`), e.g. `["fsync": "off"]` for a test where durability
    ///     does not matter.
    ///   - timeout: The longest each of `initdb` and the start may take.
    /// - Throws: ``PostgresServerError`` naming what failed and the log, when PostgreSQL is not installed, `initdb`
    ///   fails, or the server does not answer in time.
    public static func start(
        settings: [String: String] = [:],
        timeout: Duration = .seconds(60)
    ) throws -> PostgresServer {
        try PostgresServer(settings: settings, timeout: timeout)
    }

    private init(settings: [String: String], timeout: Duration) throws {
        let bin = try Self.binaries()
        folder = FileManager.default.temporaryDirectory.appendingPathComponent(
            "lockstep-pg-\(UUID().uuidString.prefix(8))"
        )
        socketDirectory = folder.appendingPathComponent("socket").path
        port = 5432
        child = LockedValue(nil)
        let data = folder.appendingPathComponent("data").path
        let log = folder.appendingPathComponent("log")
        let asUser = try Self.unprivilegedUser()
        do {
            // Only this user (and root) may reach the server: it trusts every connection as its superuser.
            try FileManager.default.createDirectory(
                atPath: socketDirectory,
                withIntermediateDirectories: true,
                attributes: [.posixPermissions: 0o700]
            )
            try FileManager.default.setAttributes([.posixPermissions: 0o700], ofItemAtPath: folder.path)
            if let asUser { try Self.giveFolder(folder, to: asUser) }
            let initdb = try ChildProcess(
                executable: asUser == nil
                    ? bin.appendingPathComponent("initdb") : URL(fileURLWithPath: "/usr/bin/setpriv"),
                Self.command(asUser, bin.appendingPathComponent("initdb").path)
                    + ["-D", data, "-U", user, "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"],
                directory: folder
            )
            let made = try initdb.finish(within: timeout)
            guard made.status == 0 else {
                throw PostgresServerError("initdb failed (status \(made.status)): \(made.standardError)")
            }
            var options = [
                "listen_addresses": "", "unix_socket_directories": socketDirectory, "port": "\(port)",
                "max_connections": "200", "logging_collector": "off", "unix_socket_permissions": "0700",
            ]
            options.merge(settings) { $1 }
            let arguments =
                Self.command(asUser, bin.appendingPathComponent("postgres").path)
                + ["-D", data] + options.sorted { $0.key < $1.key }.flatMap { ["-c", "\($0.key)=\($0.value)"] }
            let executable = asUser == nil ? bin.appendingPathComponent("postgres") : Self.setpriv
            try child.withLockedValue { server in
                server = try ChildProcess(
                    executable: executable,
                    arguments,
                    directory: folder,
                    errorFile: log,
                    outputToErrorFile: true
                )
            }
            let deadline = ContinuousClock.now + timeout
            while !PostgresJournal.serverAnswers(connection(database: "postgres")) {
                guard child.withLockedValue({ $0?.process.isRunning == true }) else {
                    let output = (try? String(contentsOf: log, encoding: .utf8)) ?? ""
                    throw PostgresServerError("postgres exited at start; its log, \(log.path):\n\(output)")
                }
                guard ContinuousClock.now < deadline else {
                    throw PostgresServerError("postgres did not accept connections within \(timeout); see \(log.path)")
                }
                Thread.sleep(forTimeInterval: 0.02)
            }
        } catch {
            stop()
            throw error
        }
    }

    deinit { stop() }

    /// A libpq connection string for `database` on this server, as its superuser.
    public func connection(database: String) -> String {
        "host=\(socketDirectory) port=\(port) user=\(user) dbname=\(database)"
    }

    /// Creates a new, empty database (named `lockstep_` and random hex unless `name` is given) and returns its
    /// connection string.
    public func createDatabase(named name: String? = nil) throws -> String {
        let name = name ?? "lockstep_\(String(UInt64.random(in: 0...UInt64.max), radix: 16))"
        _ = try PostgresJournal.execute("CREATE DATABASE \(name)", connection: connection(database: "postgres"))
        return connection(database: name)
    }

    /// Drops `database`, ending any session still connected to it.
    public func dropDatabase(_ database: String) throws {
        _ = try PostgresJournal.execute(
            "DROP DATABASE IF EXISTS \(database) WITH (FORCE)",
            connection: connection(database: "postgres")
        )
    }

    /// Stops the server — fast shutdown (SIGINT: sessions ended, a clean checkpoint), after 10 s immediate
    /// (SIGQUIT), after 5 s more SIGKILL — and removes its folder. Harmless twice.
    public func stop() {
        child.withLockedValue { server in
            if let process = server {
                process.signal(SIGINT)
                if process.waitForExit(within: .seconds(10)) == nil {
                    process.signal(SIGQUIT)
                    _ = process.waitForExit(within: .seconds(5))
                }
                process.kill()
            }
            server = nil
        }
        try? FileManager.default.removeItem(at: folder)
    }

    /// The newest `/usr/lib/postgresql/VERSION/bin` that has `initdb`, else the directory of `initdb` on `$PATH`.
    private static func binaries() throws -> URL {
        let root = "/usr/lib/postgresql"
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []).compactMap(Int.init)
        for version in versions.sorted(by: >) {
            let bin = URL(fileURLWithPath: "\(root)/\(version)/bin")
            if FileManager.default.isExecutableFile(atPath: bin.appendingPathComponent("initdb").path) { return bin }
        }
        let path = ProcessInfo.processInfo.environment["PATH"] ?? ""
        for directory in path.split(separator: ":") {
            let bin = URL(fileURLWithPath: String(directory))
            if FileManager.default.isExecutableFile(atPath: bin.appendingPathComponent("initdb").path) { return bin }
        }
        throw PostgresServerError(
            "PostgreSQL is not installed: no initdb in \(root)/*/bin or on PATH; install Debian's postgresql "
                + "(make deps does)"
        )
    }

    /// As root: the `postgres` user's ids, which `initdb` and `postgres` run as. Otherwise `nil`: they run as this
    /// user.
    private static func unprivilegedUser() throws -> (uid: uid_t, gid: gid_t)? {
        guard getuid() == 0 else { return nil }
        guard let entry = getpwnam("postgres") else {
            throw PostgresServerError(
                "running as root, and there is no 'postgres' user to run PostgreSQL as (initdb refuses root); "
                    + "install Debian's postgresql, which makes it, or run the tests as another user"
            )
        }
        return (entry.pointee.pw_uid, entry.pointee.pw_gid)
    }

    /// util-linux's `setpriv`, which runs a program as another user in the same process (so a signal to the child
    /// reaches PostgreSQL itself, unlike `runuser`, which forks).
    private static let setpriv = URL(fileURLWithPath: "/usr/bin/setpriv")

    /// `setpriv` arguments that run `executable` as `user`, or none when the executable runs as it is.
    private static func command(_ user: (uid: uid_t, gid: gid_t)?, _ executable: String) -> [String] {
        guard let user else { return [] }
        return ["--reuid=\(user.uid)", "--regid=\(user.gid)", "--clear-groups", "--", executable]
    }

    private static func giveFolder(_ folder: URL, to user: (uid: uid_t, gid: gid_t)) throws {
        for path in [folder.path, folder.appendingPathComponent("socket").path] {
            guard chown(path, user.uid, user.gid) == 0 else {
                throw PostgresServerError(
                    "cannot give \(path) to the postgres user: \(String(cString: strerror(errno)))"
                )
            }
        }
    }
}

/// A ``PostgresServer`` could not be made or started: what failed, and where its log is.
public struct PostgresServerError: Error, CustomStringConvertible {
    /// What went wrong.
    public var description: String
    /// An error with this message.
    public init(_ description: String) { self.description = description }
}
