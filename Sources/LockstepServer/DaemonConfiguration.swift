import LockstepJournal
import LockstepProtocol

/// Everything `lockstepd` needs to know to run: where it keeps data, where it listens, which domains it
/// hosts, how durable a commit is, how often it speaks, and its limits.
///
/// Defaults make `lockstepd` with no flags just work in the current folder: data in `$STATE_DIRECTORY` or
/// `./.lockstep/data`, `ipc://` sockets in `$RUNTIME_DIRECTORY` or `./.lockstep/run`.
public struct DaemonConfiguration: Hashable, Sendable {
    /// When an action counts as durable.
    public enum Durability: String, Hashable, Sendable, CaseIterable {
        /// Every commit is fsynced before any reply: an acknowledged action survives a power cut.
        case fsync
        /// Commits are written before replies and fsynced within 10 ms: a power cut (not a crash of the
        /// daemon) can lose the last 10 ms of acknowledged actions.
        case relaxed
    }

    /// Which journal keeps the history.
    public enum JournalKind: String, Hashable, Sendable, CaseIterable {
        /// One SQLite file in the data directory.
        case sqlite
        /// Nothing on disk: a restart starts every store afresh with a new epoch. For tests and demos.
        case memory
        /// A PostgreSQL database, reached with ``DaemonConfiguration/postgresConnection``.
        case postgres
        /// Lockstep's own log in the data directory (`journal.lslog` and `snapshots/`): one append and one
        /// `fdatasync` per commit (docs/operations.md, "The journal").
        case log
    }

    /// Where the journal lives (`journal.sqlite`, or `journal.lslog` and `snapshots/`, and its lock): `$STATE_DIRECTORY`, else `.lockstep/data`; set by
    /// `data_dir` in the file or `--data-dir`.
    public var dataDirectory: String
    /// Where the default `ipc://` endpoints are: `$RUNTIME_DIRECTORY`, else `.lockstep/run`; set by `runtime_dir`
    /// in the file, which moves the endpoints still at their defaults.
    public var runtimeDirectory: String
    /// The ROUTER's endpoint, where dispatches and SNAPSHOT, RANGE and STATUS requests arrive; by default
    /// `ipc://RUNTIME/command`.
    public var commandEndpoint: String
    /// The PUB's endpoint, where events, heartbeats and digests go out; by default `ipc://RUNTIME/events`.
    public var eventsEndpoint: String
    /// Names of the domains to host, in order; every name must be one the executable links.
    public var domains: [String]
    /// When a commit counts as durable; `fsync` unless set.
    public var durability = Durability.fsync
    /// Which journal keeps the history. Unset (`nil`): the one the data directory holds, or in a new data directory
    /// the log journal (an SQLite one under `durability = "relaxed"`, which only SQLite has) — ``journalToOpen``.
    public var journal: JournalKind?
    /// The journal the daemon opens: ``journal`` when set; else the one ``dataDirectory`` holds (`journal.sqlite` or
    /// `journal.lslog`); else, in a new data directory, `log` (`sqlite` under relaxed durability).
    public var journalToOpen: JournalKind {
        if let journal { return journal }
        if SQLiteJournal.exists(in: dataDirectory) { return .sqlite }
        if LogJournal.exists(in: dataDirectory) { return .log }
        return durability == .relaxed ? .sqlite : .log
    }
    /// The libpq connection string of the `postgres` journal's database (`postgres` in the file, `--postgres`);
    /// required for that journal and refused with any other. Keep a password out of it: libpq reads `~/.pgpass`.
    public var postgresConnection: String?
    /// How long the `postgres` journal's lease lasts unless renewed (`[lease] duration_ms`, `--lease-ms`): a
    /// standby takes over within about this long (and a third more) after the leader stops renewing it.
    public var leaseDuration = PostgresLease.defaultDuration
    /// This daemon's name in the `postgres` journal's lease (`[lease] name`, `--name`), which a standby's STATUS
    /// shows; `HOSTNAME:PID` when `nil`.
    public var leaseHolder: String?
    /// A heartbeat per idle store this often.
    public var heartbeatInterval = Duration.seconds(1)
    /// A digest per store every this many events (and on every snapshot).
    public var digestEveryEvents = 1_000
    /// A state of at least this many bytes of canonical JSON is checkpointed — encoded and hashed for its digest and
    /// snapshot — off the loop, on a thread of its own, paced to a tenth of a core; a smaller one on the loop, with
    /// its DIGEST right after the events (`[intervals] checkpoint_off_loop_bytes`, docs/architecture.md).
    public var checkpointOffLoopBytes = 1 << 20
    /// When snapshots are due and how much history (snapshots, idempotency entries) the journal keeps.
    public var snapshots = JournalPolicy()
    /// The largest message part accepted, in bytes.
    public var maximumMessageBytes = 1 << 20
    /// The most actions one dispatch may carry.
    public var maximumBatch = 1_000
    /// Events queued for one subscriber before the daemon drops that subscriber's newest ones (the ZeroMQ
    /// high-water mark); a replica that fell that far behind repairs the gap by range.
    public var eventsQueue = 100_000
    /// CURVE on the tcp endpoints; `nil` for none (ipc endpoints in a private directory need none).
    public var curve: CurveSettings?
    /// How the leader runs the hosted domains' effects (`[effects]` in the file; docs/effects.md).
    public var effects = Effects()
    /// Who may do what (`[identities]`, `[read]`, `[dispatch]` in the file; docs/security.md): `nil` for no policy,
    /// where every peer that reaches a socket may read every store and dispatch every action. Reloaded on SIGHUP.
    public var access: AccessPolicy.Settings?
    /// The file these settings came from (`--config`), read again on SIGHUP for the policy.
    public var file: String?
    /// Where the daemon serves HTTP — `/metrics` in Prometheus text — as `HOST:PORT` (`[http] listen`,
    /// `--http-listen`; port 0 takes a free one, which STATUS shows); `nil`, the default, for no listener.
    public var httpListen: String?
    /// Whether the HTTP listener serves the inspector's page and its reads (`[http] inspector`; docs/operations.md,
    /// "The inspector"). `nil`, the default, serves it only on a loopback address (`127.0.0.0/8`, `::1`,
    /// `localhost`): the page is read-only but shows every action, to anyone who can reach the port.
    public var inspector: Bool?

    /// Whether the inspector is served: with a listener, on loopback unless ``inspector`` says otherwise.
    public var servesInspector: Bool {
        guard let httpListen, let host = try? HTTPListener.split(httpListen).host else { return false }
        return inspector ?? (host == "localhost" || host == "::1" || host.hasPrefix("127."))
    }

    /// How effects are run: how many at once, how many tries, how long a run may take, how long to wait between
    /// tries.
    public struct Effects: Hashable, Sendable {
        /// The most effects running at once (`concurrency`, default 8).
        public var concurrency = 8
        /// Runs in all before an effect is given up as a dead letter (`tries`, default 5).
        public var tries = 5
        /// How long a run may take before it counts as failed (`timeout_ms`, default 30,000).
        public var timeout = Duration.seconds(30)
        /// The wait before the second run, doubled after each failure up to 30 s (`backoff_ms`, default 200).
        public var backoff = Duration.milliseconds(200)

        /// The defaults.
        public init() {}

        var policy: EffectLedger.Policy {
            EffectLedger.Policy(maximumRunning: concurrency, maximumAttempts: tries, timeout: timeout, backoff: backoff)
        }
    }

    /// CURVE on tcp endpoints: the daemon's key file, and the file listing the clients allowed in.
    public struct CurveSettings: Hashable, Sendable {
        /// A file of mode 0600 holding the daemon's secret key in Z85 (40 characters; `lockstep keygen`).
        public var serverKeyFile: String
        /// A file with one Z85 client public key per line (`#` starts a comment); reloaded on SIGHUP.
        /// Clients whose key is not listed are refused.
        public var allowedClientsFile: String

        /// CURVE settings from the two files' paths; the files are read when the daemon starts.
        public init(serverKeyFile: String, allowedClientsFile: String) {
            self.serverKeyFile = serverKeyFile
            self.allowedClientsFile = allowedClientsFile
        }
    }

    /// The defaults for `environment` (only `STATE_DIRECTORY` and `RUNTIME_DIRECTORY` are read), hosting
    /// `domains`.
    public init(environment: [String: String], domains: [String]) {
        // systemd may pass several colon-separated directories; the first is ours.
        let state = environment["STATE_DIRECTORY"].flatMap { $0.split(separator: ":").first.map(String.init) }
        let runtime = environment["RUNTIME_DIRECTORY"].flatMap { $0.split(separator: ":").first.map(String.init) }
        dataDirectory = state ?? ".lockstep/data"
        runtimeDirectory = runtime ?? ".lockstep/run"
        commandEndpoint = "ipc://\(runtimeDirectory)/command"
        eventsEndpoint = "ipc://\(runtimeDirectory)/events"
        self.domains = domains
    }

    /// The settings of configuration file `file` over these ones: read, parsed and applied, or an error naming the
    /// file and what is wrong.
    package mutating func apply(file: String) throws(ConfigurationError) {
        let text: String
        do {
            text = try String(contentsOfFile: file, encoding: .utf8)
        } catch {
            throw ConfigurationError(file: file, key: "--config", "cannot read the file: \(error.localizedDescription)")
        }
        let document: TOMLDocument
        do {
            document = try TOMLDocument.parse(text)
        } catch {
            throw ConfigurationError(file: file, key: "syntax", error.description)
        }
        try apply(document, file: file)
    }

    /// The access policy `file` holds now, over the stores `domains` names (SIGHUP): `nil` for none.
    func reloadedAccess() throws(ConfigurationError) -> AccessPolicy? {
        var settings = access
        if let file {
            var fresh = DaemonConfiguration(environment: [:], domains: domains)
            try fresh.apply(file: file)
            settings = fresh.access
        }
        guard let settings else { return nil }
        return try AccessPolicy(settings, stores: stores, file: file)
    }

    /// The hosted stores' names.
    var stores: [StoreName] { domains.compactMap { try? StoreName($0) } }

    /// Settings from a configuration file (docs/operations.md, deploy/lockstepd.toml) over these ones.
    ///
    /// Unknown keys and tables are errors, so a typo never passes silently; each error names the key.
    package mutating func apply(_ document: TOMLDocument, file: String) throws(ConfigurationError) {
        var reader = Reader(document: document, file: file)
        try reader.string("", "data_dir") { dataDirectory = $0 }
        try reader.string("", "runtime_dir") { runtime in
            if commandEndpoint == "ipc://\(runtimeDirectory)/command" { commandEndpoint = "ipc://\(runtime)/command" }
            if eventsEndpoint == "ipc://\(runtimeDirectory)/events" { eventsEndpoint = "ipc://\(runtime)/events" }
            runtimeDirectory = runtime
        }
        try reader.string("", "command_endpoint") { commandEndpoint = $0 }
        try reader.string("", "events_endpoint") { eventsEndpoint = $0 }
        try reader.strings("", "domains") { domains = $0 }
        try reader.choice("", "durability") { durability = $0 }
        try reader.choice("", "journal") { journal = $0 }
        try reader.string("", "postgres") { postgresConnection = $0 }
        try reader.integer("lease", "duration_ms", 100...600_000) { leaseDuration = .milliseconds($0) }
        try reader.string("lease", "name") { leaseHolder = $0 }
        try reader.integer("intervals", "heartbeat_ms", 10...3_600_000) { heartbeatInterval = .milliseconds($0) }
        try reader.integer("intervals", "digest_every_events", 1...Int64(Int32.max)) { digestEveryEvents = Int($0) }
        try reader.integer("intervals", "checkpoint_off_loop_bytes", 0...Int64.max) {
            checkpointOffLoopBytes = Int($0)
        }
        try reader.integer("snapshots", "every_events", 1...Int64(Int32.max)) {
            snapshots.snapshotEveryEvents = Int($0)
        }
        try reader.integer("snapshots", "every_bytes", 1...Int64.max) { snapshots.snapshotEveryBytes = Int($0) }
        try reader.integer("snapshots", "keep", 1...1_000) { snapshots.snapshotsKept = Int($0) }
        try reader.integer("limits", "idempotency_entries", 1...100_000_000) {
            snapshots.idempotencyEntriesKept = Int($0)
        }
        try reader.integer("limits", "max_message_bytes", 1_024...Int64(Int32.max)) { maximumMessageBytes = Int($0) }
        try reader.integer("limits", "max_batch", 1...100_000) { maximumBatch = Int($0) }
        try reader.integer("limits", "events_queue", 1...Int64(Int32.max)) { eventsQueue = Int($0) }
        try reader.integer("effects", "concurrency", 1...10_000) { effects.concurrency = Int($0) }
        try reader.integer("effects", "tries", 1...1_000) { effects.tries = Int($0) }
        try reader.integer("effects", "timeout_ms", 1...86_400_000) { effects.timeout = .milliseconds($0) }
        try reader.integer("effects", "backoff_ms", 1...3_600_000) { effects.backoff = .milliseconds($0) }
        try reader.string("http", "listen") { httpListen = $0 }
        try reader.boolean("http", "inspector") { inspector = $0 }
        var secret: String?
        var clients: String?
        try reader.string("curve", "server_key_file") { secret = $0 }
        try reader.string("curve", "allowed_clients_file") { clients = $0 }
        if secret != nil || clients != nil {
            guard let secret, let clients else {
                throw ConfigurationError(
                    file: file,
                    key: "curve",
                    "[curve] needs both server_key_file and allowed_clients_file (make keys with 'lockstep keygen')"
                )
            }
            curve = CurveSettings(serverKeyFile: secret, allowedClientsFile: clients)
        }
        var access = AccessPolicy.Settings()
        let named = try reader.lists("identities") { access.identities = $0 }
        let reads = try reader.lists("read") { access.read = $0 }
        let dispatches = try reader.lists("dispatch") { access.dispatch = $0 }
        if named || reads || dispatches {
            guard named else {
                throw ConfigurationError(
                    file: file,
                    key: "identities",
                    "[read] or [dispatch] grants to identities, but [identities] names none (docs/security.md)"
                )
            }
            self.access = access
        }
        self.file = file
        try reader.finish()
    }

    /// The journal as an error names it: `'log'`, or `not set`.
    private var journalNamed: String { journal.map { "'\($0.rawValue)'" } ?? "not set" }

    /// Checks what a flag or file could have got wrong; the error names the setting and the value.
    public func validate(knownDomains: [String]) throws(ConfigurationError) {
        if durability == .relaxed, journalToOpen != .sqlite {
            let why: String =
                switch journalToOpen {
                case .memory: "'relaxed' means nothing for a memory journal; use the sqlite journal"
                case .log:
                    "'relaxed' is for the sqlite journal; the log journal's commit is one append and one fdatasync, "
                        + "and it has no relaxed mode"
                        + (journal == nil ? " (the data directory \(dataDirectory) holds a log journal)" : "")
                default:
                    "'relaxed' is for the sqlite journal; a postgres journal's commit is durable when PostgreSQL "
                        + "acknowledges it (synchronous_commit = on)"
                }
            throw ConfigurationError(file: nil, key: "durability", why)
        }
        if journal == .postgres, postgresConnection?.isEmpty != false {
            throw ConfigurationError(
                file: nil,
                key: "postgres",
                "journal is 'postgres' but no connection string is given; set postgres = \"host=... dbname=...\" in "
                    + "the file or --postgres CONNINFO"
            )
        }
        if journal != .postgres, postgresConnection != nil {
            throw ConfigurationError(
                file: nil,
                key: "postgres",
                "a PostgreSQL connection string is given, but the journal is \(journalNamed); set journal = "
                    + "\"postgres\" (--journal postgres) to use it, or remove it"
            )
        }
        if journal != .postgres, leaseDuration != PostgresLease.defaultDuration || leaseHolder != nil {
            throw ConfigurationError(
                file: nil,
                key: "lease",
                "a lease is set, but the journal is \(journalNamed): only the postgres journal is shared by "
                    + "several daemons; remove [lease] (--lease-ms, --name) or set journal = \"postgres\""
            )
        }
        if leaseHolder?.isEmpty == true {
            throw ConfigurationError(file: nil, key: "lease.name", "the daemon's name in the lease is empty")
        }
        guard !domains.isEmpty else {
            throw ConfigurationError(file: nil, key: "domains", "no domain to host; name at least one")
        }
        for name in domains where !knownDomains.contains(name) {
            throw ConfigurationError(
                file: nil,
                key: "domains",
                "no domain named '\(name)' is linked into this daemon; it has \(knownDomains.joined(separator: ", "))"
            )
        }
        if let duplicate = domains.first(where: { name in domains.filter { $0 == name }.count > 1 }) {
            throw ConfigurationError(file: nil, key: "domains", "domain '\(duplicate)' is named twice")
        }
        for (key, endpoint) in [("command_endpoint", commandEndpoint), ("events_endpoint", eventsEndpoint)] {
            let transport = endpoint.prefix { $0 != ":" }
            guard ["ipc", "tcp", "inproc"].contains(transport), endpoint.contains("://") else {
                throw ConfigurationError(
                    file: nil,
                    key: key,
                    "'\(endpoint)' is not an endpoint the daemon serves; use ipc://PATH or tcp://HOST:PORT"
                )
            }
            if transport == "tcp", curve == nil {
                throw ConfigurationError(
                    file: nil,
                    key: key,
                    "'\(endpoint)' is a tcp endpoint and [curve] is not configured; tcp is served only with CURVE"
                )
            }
        }
        if let access {
            for (key, endpoint) in [("command_endpoint", commandEndpoint), ("events_endpoint", eventsEndpoint)]
            where endpoint.hasPrefix("inproc://") {
                throw ConfigurationError(
                    file: file,
                    key: key,
                    "'\(endpoint)' is an inproc endpoint, whose peers carry no identity a policy could check; use "
                        + "ipc:// or tcp:// with [identities]"
                )
            }
            _ = try AccessPolicy(access, stores: stores, file: file)
        }
        if let httpListen {
            do {
                _ = try HTTPListener.split(httpListen)
            } catch {
                throw ConfigurationError(file: nil, key: "http.listen", error.reason)
            }
        }
        guard commandEndpoint != eventsEndpoint else {
            throw ConfigurationError(
                file: nil,
                key: "events_endpoint",
                "the command and events endpoints are both '\(commandEndpoint)'"
            )
        }
    }

    /// Reads typed values out of a document and remembers which keys it used.
    private struct Reader {
        let document: TOMLDocument
        let file: String
        var used: Set<String> = []

        mutating func value(_ table: String, _ key: String) -> TOMLValue? {
            used.insert(table.isEmpty ? key : "\(table).\(key)")
            return document.tables[table]?[key]
        }

        func name(_ table: String, _ key: String) -> String { table.isEmpty ? key : "\(table).\(key)" }

        mutating func string(_ table: String, _ key: String, _ set: (String) -> Void) throws(ConfigurationError) {
            guard let value = value(table, key) else { return }
            guard case let .string(text) = value else {
                throw ConfigurationError(file: file, key: name(table, key), "expected a string, got \(value)")
            }
            set(text)
        }

        mutating func boolean(_ table: String, _ key: String, _ set: (Bool) -> Void) throws(ConfigurationError) {
            guard let value = value(table, key) else { return }
            guard case let .boolean(flag) = value else {
                throw ConfigurationError(file: file, key: name(table, key), "expected true or false, got \(value)")
            }
            set(flag)
        }

        mutating func strings(_ table: String, _ key: String, _ set: ([String]) -> Void) throws(ConfigurationError) {
            guard let value = value(table, key) else { return }
            guard case let .array(values) = value else {
                throw ConfigurationError(
                    file: file,
                    key: name(table, key),
                    "expected an array of strings, got \(value)"
                )
            }
            var texts: [String] = []
            for element in values {
                guard case let .string(text) = element else {
                    throw ConfigurationError(file: file, key: name(table, key), "expected strings only, got \(element)")
                }
                texts.append(text)
            }
            set(texts)
        }

        mutating func integer(
            _ table: String,
            _ key: String,
            _ range: ClosedRange<Int64>,
            _ set: (Int64) -> Void
        ) throws(ConfigurationError) {
            guard let value = value(table, key) else { return }
            guard case let .integer(number) = value, range.contains(number) else {
                throw ConfigurationError(
                    file: file,
                    key: name(table, key),
                    "expected a whole number in \(range.lowerBound)...\(range.upperBound), got \(value)"
                )
            }
            set(number)
        }

        mutating func choice<Choice: RawRepresentable & CaseIterable>(
            _ table: String,
            _ key: String,
            _ set: (Choice) -> Void
        ) throws(ConfigurationError) where Choice.RawValue == String {
            guard let value = value(table, key) else { return }
            guard case let .string(text) = value, let choice = Choice(rawValue: text) else {
                let choices = Choice.allCases.map { "\"\($0.rawValue)\"" }.joined(separator: ", ")
                throw ConfigurationError(file: file, key: name(table, key), "expected one of \(choices), got \(value)")
            }
            set(choice)
        }

        /// Every key of `table` as an array of strings; whether the table is there.
        mutating func lists(_ table: String, _ set: ([String: [String]]) -> Void) throws(ConfigurationError) -> Bool {
            guard let keys = document.tables[table] else { return false }
            var lists: [String: [String]] = [:]
            for key in keys.keys.sorted() {
                try strings(table, key) { lists[key] = $0 }
            }
            set(lists)
            return true
        }

        func finish() throws(ConfigurationError) {
            for (table, keys) in document.tables.sorted(by: { $0.key < $1.key }) {
                for key in keys.keys.sorted() where !used.contains(name(table, key)) {
                    let known = used.filter { table.isEmpty ? !$0.contains(".") : $0.hasPrefix(table + ".") }
                        .map { String($0.split(separator: ".").last ?? "") }.sorted()
                    let place = table.isEmpty ? "at the top level" : "in [\(table)]"
                    throw ConfigurationError(
                        file: file,
                        key: name(table, key),
                        known.isEmpty
                            ? "unknown setting \(place)"
                            : "unknown setting; the settings \(place) are \(known.joined(separator: ", "))"
                    )
                }
                if !table.isEmpty, keys.isEmpty {
                    throw ConfigurationError(file: file, key: table, "empty or unknown table [\(table)]")
                }
            }
        }
    }
}

/// A setting is wrong: which file, which key, and why.
public struct ConfigurationError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The configuration file the setting came from, or `nil` for a flag or for settings that do not go together.
    public var file: String?
    /// The setting: a key as the file spells it (`limits.max_batch`), a table (`curve`), or a flag (`--journal`).
    public var key: String
    /// What is wrong with it, with the value, and what to do.
    public var reason: String

    /// An error about `key` (in `file`, when it came from one).
    public init(file: String?, key: String, _ reason: String) {
        self.file = file
        self.key = key
        self.reason = reason
    }

    /// `file: key: reason`, the line `lockstepd` prints before it exits 78.
    public var description: String {
        (file.map { "\($0): " } ?? "") + "\(key): \(reason)"
    }
}
