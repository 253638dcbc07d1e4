import Foundation
import LockstepProtocol
import Testing
import ZeroMQ

@testable import LockstepServer

/// The policy as a value: what the TOML may say and what it is told when wrong, who a peer is, what an action's case
/// is. The processes that try it for real are in AccessPolicyProcessTests.
@Suite struct AccessPolicyTests {
    let stores = ["counter", "todos"].map { try! StoreName($0) }

    func policy(_ text: String) throws -> AccessPolicy? {
        var configuration = DaemonConfiguration(environment: [:], domains: ["counter", "todos"])
        try configuration.apply(try TOMLDocument.parse(text), file: "p.toml")
        try configuration.validate(knownDomains: ["counter", "todos"])
        return try configuration.access.map { try AccessPolicy($0, stores: stores, file: "p.toml") }
    }

    @Test func grantsAreReadFromTheThreeTables() throws {
        let key = try CurveKeyPair.generate().publicKey
        let policy = try #require(
            try policy(
                """
                [identities]
                member = ["uid:1001", "key:\(Z85.encode(key))"]
                watcher = ["gid:2000"]
                [read]
                member = ["*"]
                watcher = ["counter"]
                [dispatch]
                member = ["counter", "todos:add", "todos:toggle"]
                """
            )
        )
        let member = try #require(policy.identity(of: .unix(uid: 1001, gid: 1001)))
        #expect(member.name == "member")
        #expect(policy.identity(of: .key(key))?.name == "member")
        #expect(member.read == Set(stores))
        #expect(member.dispatch[stores[0]] == .every)
        #expect(member.dispatch[stores[1]] == .only(["add", "toggle"]))
        let watcher = try #require(policy.identity(of: .unix(uid: 3000, gid: 2000)))
        #expect(watcher.name == "watcher" && watcher.read == [stores[0]] && watcher.dispatch.isEmpty)
        #expect(policy.identity(of: .unix(uid: 3000, gid: 3000)) == nil)
        #expect(policy.identity(of: .key(try CurveKeyPair.generate().publicKey)) == nil)
    }

    @Test func noTablesNoPolicy() throws {
        #expect(try policy("durability = \"fsync\"") == nil)
    }

    @Test(arguments: [
        (
            "[read]\nx = [\"counter\"]",
            "identities: [read] or [dispatch] grants to identities, but [identities] names none"
        ),
        ("[identities]\na = [\"uid:1\"]\n[read]\nb = [\"counter\"]", "read.b: no identity named 'b' in [identities]"),
        (
            "[identities]\na = [\"uid:1\"]\n[read]\na = [\"count\"]",
            "read.a: no store named 'count'; this daemon hosts counter, todos"
        ),
        ("[identities]\na = [\"uid:1\"]\n[dispatch]\na = [\"todos:\"]", "dispatch.a: 'todos:' names no action case"),
        ("[identities]\na = [\"root\"]", "identities.a: 'root' is not evidence the daemon can check"),
        ("[identities]\na = [\"user:no-such-user-here\"]", "identities.a: no OS user named 'no-such-user-here'"),
        ("[identities]\na = [\"key:short\"]", "identities.a: 'key:short' is not evidence"),
        ("[identities]\na = [\"uid:1\"]\nb = [\"uid:1\"]", "identities.b: 'uid:1' already names identity 'a'"),
        (
            "[identities]\nlockstepd = [\"uid:1\"]",
            "identities.lockstepd: 'lockstepd' is the name the daemon gives its own"
        ),
        (
            "command_endpoint = \"inproc://x\"\n[identities]\na = [\"uid:1\"]",
            "command_endpoint: 'inproc://x' is an inproc endpoint"
        ),
    ])
    func mistakesAreNamed(text: String, message: String) throws {
        do {
            _ = try policy(text)
            Issue.record("accepted: \(text)")
        } catch {
            #expect("\(error)".contains(message), "\(error)")
        }
    }

    @Test func peersComeFromWhatTheKernelAndCurveSay() throws {
        #expect(AccessPolicy.Peer(ipcAddress: "localhost:1001:1002:4242") == .unix(uid: 1001, gid: 1002))
        #expect(AccessPolicy.Peer(ipcAddress: ":0:0:1") == .unix(uid: 0, gid: 0))
        #expect(AccessPolicy.Peer(ipcAddress: "127.0.0.1") == nil)
        let key = try CurveKeyPair.generate().publicKey
        for peer in [AccessPolicy.Peer.unix(uid: 7, gid: 8), .key(key)] {
            #expect(AccessPolicy.Peer(userID: peer.userID) == peer)
        }
        #expect(AccessPolicy.Peer(userID: "unix:7") == nil)
        #expect(AccessPolicy.Peer(userID: "someone") == nil)
    }

    @Test func theZAPHandlerIdentifiesLocalPeersOnlyUnderAPolicy() {
        let request: [[UInt8]] = ["1.0", "7", "lockstep", "localhost:1001:1001:42", "", "NULL"].map { Array($0.utf8) }
        let identified = LoopSockets.answer(request, curve: nil, identifiesLocalPeers: true)
        #expect(identified.allowed)
        #expect(identified.reply[2] == Array("200".utf8) && identified.reply[4] == Array("unix:1001:1001".utf8))
        #expect(!LoopSockets.answer(request, curve: nil, identifiesLocalPeers: false).allowed)
        let curve = request.prefix(5) + [Array("CURVE".utf8), [UInt8](repeating: 1, count: 32)]
        #expect(!LoopSockets.answer(Array(curve), curve: nil, identifiesLocalPeers: true).allowed)
    }

    @Test(
        arguments: [
            ("{\"add\":{\"text\":\"a,b\"}}", "add"),
            ("{\"increment\":{}}", "increment"),
            ("{\"toggle\":{\"id\":1}}", "toggle"),
            ("{\"a\":1,\"b\":2}", nil),
            ("{\"a\":{\"x\":[1,{\"y\":\"}\"}]},\"b\":2}", nil),
            ("[1,2]", nil),
            ("5", nil),
            ("{\"q\\\"uote\":{}}", nil),
        ] as [(String, String?)]
    )
    func anActionsCaseIsItsOneKey(json: String, actionCase: String?) {
        #expect(Sequencer.actionCase(of: Array(json.utf8)) == actionCase)
    }
}
