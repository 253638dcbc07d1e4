import Foundation
import Lockstep
import LockstepJournal

#if canImport(Glibc)
import Glibc
#endif

/// A throwaway PostgreSQL server for tests: `initdb` into a fresh temporary folder, `postgres` started on a Unix
/// socket in that folder (no TCP port at all, unless ``TCP`` access is asked for), and the folder removed when the
/// server stops — the way the journal tests run `PostgresJournal` against a real server.
///
/// ```swift
/// let server = try PostgresServer.start()
/// defer { server.stop() }
/// let journal = try PostgresJournal(connection: try server.createDatabase())
/// ```
///
/// An async test calls the async overloads, `try await PostgresServer.start()` and `await server.stop()`, which
/// wait for `initdb`, the start and the stop without holding a thread of the cooperative pool.
///
/// On a ``TestHosts`` host, listening on its address for the other hosts' clients (the Unix socket stays, for the
/// test's own administration: `createDatabase`, `createRole`):
///
/// ```swift
/// let tcp = PostgresServer.TCP(address: hosts["db"].address, clients: hosts.subnet, authentication: .password)
/// let server = try PostgresServer.start(on: hosts, host: "db", tcp: tcp)
/// try server.createRole("lockstep", password: secret)
/// try server.createDatabase(named: "journal", owner: "lockstep")
/// let daemonsConnection = server.tcpConnection(database: "journal", user: "lockstep")   // the password: PGPASSFILE
/// ```
///
/// The binaries come from Debian's `postgresql` package (`/usr/lib/postgresql/VERSION/bin`, the newest version
/// installed) or from `$PATH`. `initdb` and `postgres` refuse to run as root, so as root the server runs as the
/// `postgres` user (through `setpriv`) and the folder is made theirs. The server runs in the foreground as this
/// process's child: it is stopped (fast shutdown, then immediate, then SIGKILL, each wait bounded) by `stop()`
/// or when the object is released. A test process killed with SIGKILL leaves it running, with its folder:
/// `lockstep-pg-*` in the temporary directory.
public final class PostgresServer: Sendable {
    /// The folder holding the cluster (`data`), the socket directory (`socket`) and the server's log (`log`).
    public let folder: URL
    /// The directory of the server's Unix socket: the `host` of a connection string.
    public let socketDirectory: String
    /// The port, which on a Unix socket only names the socket file (`.s.PGSQL.PORT`).
    public let port: Int
    /// The superuser the cluster was made with, who owns every database created here unless told otherwise.
    public let user = "postgres"
    /// Where the server also listens on tcp, and for whom; `nil` for the Unix socket alone.
    public let tcp: TCP?
    private let child: LockedValue<ChildProcess?>

    /// Access over tcp: the address the server listens on, and the one subnet whose clients `pg_hba.conf` lets in.
    /// The superuser may log in only through the Unix socket.
    public struct TCP: Sendable {
        /// How a client on ``clients`` proves who it is.
        public enum Authentication: Sendable {
            /// Anyone on the subnet, as any role: only for a subnet nothing else can reach, such as test hosts'.
            case trust
            /// `scram-sha-256`: a role's password (``PostgresServer/createRole(_:password:)``), which libpq reads
            /// from `PGPASSFILE`, `~/.pgpass` or `PGPASSWORD`.
            case password
        }

        /// The address to listen on (`listen_addresses`), e.g. a test host's.
        public var address: String
        /// The port; 5432 unless given.
        public var port: Int
        /// The only clients let in over tcp, in CIDR form (`10.231.7.0/24`).
        public var clients: String
        /// How they log in.
        public var authentication: Authentication

        /// Listening on `address`:`port` for the clients of subnet `clients`, who log in by `authentication`.
        public init(address: String, port: Int = 5432, clients: String, authentication: Authentication) {
            self.address = address
            self.port = port
            self.clients = clients
            self.authentication = authentication
        }
    }

    /// Makes a cluster in a new temporary folder and starts it; returns once it accepts connections.
    ///
    /// - Parameters:
    ///   - settings: Extra server settings (`-c name=value`), e.g. `["fsync": "off"]` for a test where durability
    ///     does not matter.
    ///   - timeout: The longest each of `initdb` and the start may take.
    ///   - hosts: The test hosts to run the server on, with `host` the one it runs on; `nil` (the default) runs it
    ///     in this process's network namespace.
    ///   - host: The name of the host among `hosts`.
    ///   - tcp: Where to listen on tcp and whom to let in; `nil` (the default): the Unix socket alone.
    /// - Throws: ``PostgresServerError`` naming what failed and the log, when PostgreSQL is not installed, `initdb`
    ///   fails, or the server does not answer in time.
    public static func start(
        settings: [String: String] = [:],
        timeout: Duration = .seconds(60),
        on hosts: TestHosts? = nil,
        host: String? = nil,
        tcp: TCP? = nil
    ) throws -> PostgresServer {
        precondition((hosts == nil) == (host == nil), "give the hosts and the host's name together")
        return try PostgresServer(
            settings: settings,
            timeout: timeout,
            launch: { executable, arguments in
                guard let hosts, let host else { return (executable, arguments) }
                return hosts.command(on: host, executable, arguments)
            },
            tcp: tcp
        )
    }

    /// The same, for async callers: `initdb` and the start run on a thread of their own
    /// (``offPool(_:lending:_:)``), and the calling task waits for them without holding a thread of the
    /// cooperative pool.
    public static func start(
        settings: [String: String] = [:],
        timeout: Duration = .seconds(60),
        on hosts: TestHosts? = nil,
        host: String? = nil,
        tcp: TCP? = nil
    ) async throws -> PostgresServer {
        try await offPool("postgres start", lending: hosts) { hosts in
            try PostgresServer.start(settings: settings, timeout: timeout, on: hosts, host: host, tcp: tcp)
        }
    }

    private init(
        settings: [String: String],
        timeout: Duration,
        launch: (URL, [String]) -> (executable: URL, arguments: [String]),
        tcp: TCP?
    ) throws {
        let bin = try Self.binaries()
        folder = FileManager.default.temporaryDirectory.appendingPathComponent(
            "lockstep-pg-\(UUID().uuidString.prefix(8))"
        )
        socketDirectory = folder.appendingPathComponent("socket").path
        port = tcp?.port ?? 5432
        self.tcp = tcp
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
                "listen_addresses": tcp?.address ?? "", "unix_socket_directories": socketDirectory,
                "port": "\(port)", "max_connections": "200", "logging_collector": "off",
                "unix_socket_permissions": "0700",
            ]
            options.merge(settings) { $1 }
            if let tcp { try Self.allowOnly(tcp, in: data) }
            let (executable, arguments) = launch(
                asUser == nil ? bin.appendingPathComponent("postgres") : Self.setpriv,
                Self.command(asUser, bin.appendingPathComponent("postgres").path)
                    + ["-D", data] + options.sorted { $0.key < $1.key }.flatMap { ["-c", "\($0.key)=\($0.value)"] }
            )
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

    /// A libpq connection string for `database` over tcp (the server must have been started with ``TCP`` access),
    /// as `user`, without a password: libpq finds it in `PGPASSFILE`, `~/.pgpass` or `PGPASSWORD`.
    public func tcpConnection(database: String, user: String) -> String {
        precondition(tcp != nil, "the server was started without tcp access")
        return "host=\(tcp?.address ?? "") port=\(port) user=\(user) dbname=\(database)"
    }

    /// Creates a new, empty database (named `lockstep_` and random hex unless `name` is given), owned by `owner`
    /// (by default the superuser), and returns its connection string through the Unix socket, as the superuser.
    public func createDatabase(named name: String? = nil, owner: String? = nil) throws -> String {
        let name = name ?? "lockstep_\(String(UInt64.random(in: 0...UInt64.max), radix: 16))"
        _ = try PostgresJournal.execute(
            "CREATE DATABASE \(name)\(owner.map { " OWNER \($0)" } ?? "")",
            connection: connection(database: "postgres")
        )
        return connection(database: name)
    }

    /// Creates a role that may log in with `password` (stored as a SCRAM-SHA-256 verifier, PostgreSQL's default),
    /// for clients over tcp. `name` and `password` are letters, digits and `_` only: they go into the SQL as they
    /// are.
    public func createRole(_ name: String, password: String) throws {
        for (what, text) in [("role name", name), ("password", password)] {
            let allowed = text.unicodeScalars.allSatisfy {
                $0.isASCII && ($0 == "_" || $0.properties.isAlphabetic || $0.properties.numericType != nil)
            }
            precondition(!text.isEmpty && allowed, "a \(what) here is ASCII letters, digits and _ only")
        }
        _ = try PostgresJournal.execute(
            "CREATE ROLE \(name) LOGIN PASSWORD '\(password)'",
            connection: connection(database: "postgres")
        )
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

    /// The same, for async callers: it waits on a thread of its own (``offPool(_:_:)``), not on one of the
    /// cooperative pool.
    public func stop() async {
        await offPool("postgres stop") { self.stop() }
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

    /// Replaces initdb's `pg_hba.conf` (trust for the socket and for 127.0.0.1 and ::1) with the socket's line and
    /// one `host` line for `tcp.clients`: over tcp, that subnet alone gets in, and never as the superuser.
    private static func allowOnly(_ tcp: TCP, in data: String) throws {
        let method = tcp.authentication == .trust ? "trust" : "scram-sha-256"
        let rules = """
            # Written by LockstepTesting.PostgresServer: the Unix socket (this folder's, 0700) for the test's own
            # administration, and tcp for the one subnet of its clients.
            local all all trust
            host all postgres \(tcp.clients) reject
            host all all \(tcp.clients) \(method)

            """
        let path = URL(fileURLWithPath: data).appendingPathComponent("pg_hba.conf").path
        do {
            try rules.write(toFile: path, atomically: false, encoding: .utf8)
        } catch {
            throw PostgresServerError("cannot write \(path), the server's client rules: \(error)")
        }
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
