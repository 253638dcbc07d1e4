import Foundation
import Lockstep
import LockstepProtocol
import ZeroMQ

#if canImport(Glibc)
import Glibc
#endif

/// Who may do what (docs/security.md): the identities the daemon's policy names — by CURVE public key over tcp, by
/// OS user or group over ipc — and, for each, the stores it may read and the actions it may dispatch.
///
/// A value: the loop asks it about a peer the ZAP handler identified (``Peer``) and carries out the answer. With a
/// policy everything not granted is denied; with none (``DaemonConfiguration/access`` is `nil`) the loop never asks.
public struct AccessPolicy: Hashable, Sendable {
    /// The policy as the TOML writes it: `[identities]`, `[read]` and `[dispatch]`, each identity name → strings.
    public struct Settings: Hashable, Sendable {
        /// Identity name → how it is recognized: `user:NAME`, `uid:N`, `group:NAME`, `gid:N`, `key:Z85`.
        public var identities: [String: [String]] = [:]
        /// Identity name → the stores it may read (`*` for every store).
        public var read: [String: [String]] = [:]
        /// Identity name → `STORE` (every action) or `STORE:CASE` (one action case), `*` for every store.
        public var dispatch: [String: [String]] = [:]

        /// Settings from the three tables.
        public init(
            identities: [String: [String]] = [:],
            read: [String: [String]] = [:],
            dispatch: [String: [String]] = [:]
        ) {
            self.identities = identities
            self.read = read
            self.dispatch = dispatch
        }
    }

    /// How a peer was recognized, as the ZAP handler saw it (never what the peer says of itself).
    public enum Peer: Hashable, Sendable, CustomStringConvertible {
        /// A CURVE client with this 32-byte public key (tcp).
        case key([UInt8])
        /// A local process running as `uid` with primary group `gid` (ipc; the kernel's SO_PEERCRED).
        case unix(uid: UInt32, gid: UInt32)

        /// The evidence as the ZAP handler hands it to libzmq as the connection's User-Id: `key:Z85` or
        /// `unix:UID:GID`. Every message of the connection carries it.
        public var userID: String {
            switch self {
            case let .key(key): "key:\(Z85.encode(key))"
            case let .unix(uid, gid): "unix:\(uid):\(gid)"
            }
        }

        /// The peer a User-Id names, or `nil` for anything else.
        public init?(userID: String) {
            if userID.hasPrefix("key:") {
                guard let key = try? Z85.decode(String(userID.dropFirst(4))), key.count == 32 else { return nil }
                self = .key(key)
            } else if userID.hasPrefix("unix:") {
                let parts = userID.dropFirst(5).split(separator: ":")
                guard parts.count == 2, let uid = UInt32(parts[0]), let gid = UInt32(parts[1]) else { return nil }
                self = .unix(uid: uid, gid: gid)
            } else {
                return nil
            }
        }

        /// The peer of an ipc connection from the ZAP request's address, to which libzmq 4.3 (built with
        /// SO_PEERCRED, as Linux's is) appends `:UID:GID:PID` from the kernel's credentials of the connecting process
        /// (`localhost:1001:1001:4242`).
        public init?(ipcAddress address: String) {
            let parts = address.split(separator: ":", omittingEmptySubsequences: false)
            guard parts.count >= 4, let uid = UInt32(parts[parts.count - 3]), let gid = UInt32(parts[parts.count - 2]),
                UInt32(parts[parts.count - 1]) != nil
            else {
                return nil
            }
            self = .unix(uid: uid, gid: gid)
        }

        /// `OS user 1001` or `CURVE key rq:…`, for logs and errors.
        public var description: String {
            switch self {
            case let .key(key): "CURVE key \(Z85.encode(key))"
            case let .unix(uid, gid): "OS user \(uid) (group \(gid))"
            }
        }
    }

    /// What an identity may dispatch to one store.
    public enum ActionGrant: Hashable, Sendable {
        /// Every action.
        case every
        /// The action cases named (the key of the action's JSON object, as Swift's `Codable` writes an enum).
        case only(Set<String>)

        /// The cases granted, or `nil` for every action.
        public var cases: Set<String>? {
            switch self {
            case .every: nil
            case let .only(cases): cases
            }
        }
    }

    /// A named identity and what it may do.
    public struct Identity: Hashable, Sendable {
        /// The name the policy gives it: the author of what it dispatches.
        public var name: String
        /// The stores it may read.
        public var read: Set<StoreName>
        /// The stores it may dispatch to, and which actions.
        public var dispatch: [StoreName: ActionGrant]

        /// Whether it may read `store` (SNAPSHOT, RANGE, events).
        public func mayRead(_ store: StoreName) -> Bool { read.contains(store) }
    }

    private enum Evidence: Hashable, Sendable {
        case key([UInt8])
        case user(UInt32)
        case group(UInt32)
    }

    /// Identities by name.
    public private(set) var identities: [String: Identity] = [:]
    /// Evidence → identity name; a key or a user names one identity, a group may name one too.
    private var byKey: [[UInt8]: String] = [:]
    private var byUser: [UInt32: String] = [:]
    private var byGroup: [UInt32: String] = [:]

    /// The policy `settings` describe over the daemon's `stores`, with user and group names looked up now (at start
    /// and at each SIGHUP). The error names the table, the identity and the value.
    public init(_ settings: Settings, stores: [StoreName], file: String?) throws(ConfigurationError) {
        func fail(_ key: String, _ reason: String) -> ConfigurationError {
            ConfigurationError(file: file, key: key, reason)
        }
        for table in [("read", settings.read), ("dispatch", settings.dispatch)] {
            for name in table.1.keys.sorted() where settings.identities[name] == nil {
                throw fail(
                    "\(table.0).\(name)",
                    "no identity named '\(name)' in [identities]; name it there (e.g. \(name) = [\"user:\(name)\"])"
                )
            }
        }
        func store(_ text: String, _ key: String) throws(ConfigurationError) -> [StoreName] {
            if text == "*" { return stores }
            guard let name = try? StoreName(text), stores.contains(name) else {
                throw fail(
                    key,
                    "no store named '\(text)'; this daemon hosts \(stores.map(\.rawValue).joined(separator: ", ")) "
                        + "('*' for every store)"
                )
            }
            return [name]
        }
        for (name, evidence) in settings.identities.sorted(by: { $0.key < $1.key }) {
            let key = "identities.\(name)"
            guard name != Author.daemonName else {
                throw fail(
                    key,
                    "'\(name)' is the name the daemon gives its own actions (timers, effects); pick another"
                )
            }
            guard !evidence.isEmpty else {
                throw fail(key, "no evidence; list how it is recognized: \"user:NAME\", \"group:NAME\", \"key:Z85\"")
            }
            var identity = Identity(name: name, read: [], dispatch: [:])
            for text in settings.read[name] ?? [] {
                identity.read.formUnion(try store(text, "read.\(name)"))
            }
            for text in settings.dispatch[name] ?? [] {
                let parts = text.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)
                let actionCase = parts.count == 2 ? String(parts[1]) : nil
                if let actionCase, actionCase.isEmpty || actionCase.contains(":") {
                    throw fail("dispatch.\(name)", "'\(text)' names no action case; write \"STORE\" or \"STORE:CASE\"")
                }
                for target in try store(String(parts[0]), "dispatch.\(name)") {
                    switch (identity.dispatch[target], actionCase) {
                    case (.every, _): break
                    case (_, nil): identity.dispatch[target] = .every
                    case let (.only(cases), actionCase?): identity.dispatch[target] = .only(cases.union([actionCase]))
                    case let (nil, actionCase?): identity.dispatch[target] = .only([actionCase])
                    }
                }
            }
            identities[name] = identity
            for text in evidence {
                let item = try Self.evidence(text, key: key, file: file)
                let owner: String?
                switch item {
                case let .key(bytes): owner = byKey.updateValue(name, forKey: bytes)
                case let .user(uid): owner = byUser.updateValue(name, forKey: uid)
                case let .group(gid): owner = byGroup.updateValue(name, forKey: gid)
                }
                if let owner, owner != name {
                    throw fail(key, "'\(text)' already names identity '\(owner)'; one peer is one identity")
                }
            }
        }
    }

    /// One piece of evidence, with OS names looked up.
    private static func evidence(_ text: String, key: String, file: String?) throws(ConfigurationError) -> Evidence {
        let parts = text.split(separator: ":", maxSplits: 1)
        let kind = parts.first.map(String.init) ?? ""
        let value = parts.count == 2 ? String(parts[1]) : ""
        switch kind {
        case "key":
            if let bytes = try? Z85.decode(value), bytes.count == 32 { return .key(bytes) }
        case "uid":
            if let uid = UInt32(value) { return .user(uid) }
        case "gid":
            if let gid = UInt32(value) { return .group(gid) }
        case "user":
            if let entry = getpwnam(value) { return .user(entry.pointee.pw_uid) }
            throw ConfigurationError(file: file, key: key, "no OS user named '\(value)' (getent passwd \(value))")
        case "group":
            if let entry = getgrnam(value) { return .group(entry.pointee.gr_gid) }
            throw ConfigurationError(file: file, key: key, "no OS group named '\(value)' (getent group \(value))")
        default:
            break
        }
        throw ConfigurationError(
            file: file,
            key: key,
            "'\(text)' is not evidence the daemon can check; use \"user:NAME\", \"uid:N\", \"group:NAME\", \"gid:N\" "
                + "(ipc) or \"key:Z85\" (a CURVE public key, tcp)"
        )
    }

    /// The identity `peer` is, or `nil` when the policy names none of its evidence: a CURVE key; else the OS user;
    /// else the primary group; else the first (by identity name) of the groups the user belongs to.
    public func identity(of peer: Peer) -> Identity? {
        switch peer {
        case let .key(key):
            return byKey[key].flatMap { identities[$0] }
        case let .unix(uid, gid):
            if let name = byUser[uid] ?? byGroup[gid] { return identities[name] }
            guard !byGroup.isEmpty else { return nil }
            let names = Self.groups(of: uid, primary: gid).compactMap { byGroup[$0] }
            return names.min().flatMap { identities[$0] }
        }
    }

    /// The groups OS user `uid` belongs to by the group database (none beyond `primary` for a user without one).
    static func groups(of uid: UInt32, primary: UInt32) -> [UInt32] {
        guard let entry = getpwuid(uid), let name = entry.pointee.pw_name else { return [primary] }
        var count: Int32 = 64
        var groups = [gid_t](repeating: 0, count: Int(count))
        if getgrouplist(name, primary, &groups, &count) < 0 {
            groups = [gid_t](repeating: 0, count: Int(count))
            _ = getgrouplist(name, primary, &groups, &count)
        }
        return Array(groups.prefix(Int(max(count, 0))))
    }
}

/// The policy as the loop consults it: identities found by User-Id once per policy, then from a table.
struct AccessCheck {
    var policy: AccessPolicy
    /// User-Id → the identity, or `nil` for a peer the policy names nowhere; emptied when the policy changes.
    private var known: [String: AccessPolicy.Identity?] = [:]

    init(_ policy: AccessPolicy) { self.policy = policy }

    /// The identity behind a message's User-Id (`nil`: the message came without one, or from nobody named).
    mutating func identity(_ userID: String?) -> AccessPolicy.Identity? {
        guard let userID else { return nil }
        if let found = known[userID] { return found }
        let identity = AccessPolicy.Peer(userID: userID).flatMap(policy.identity(of:))
        known[userID] = identity
        return identity
    }

    /// How to name the sender of `userID` in an error or a log line.
    static func who(_ identity: AccessPolicy.Identity?, _ userID: String?) -> String {
        if let identity { return "identity '\(identity.name)'" }
        guard let peer = userID.flatMap(AccessPolicy.Peer.init(userID:)) else { return "an unidentified peer" }
        return "\(peer), whom the daemon's policy names nowhere,"
    }
}
