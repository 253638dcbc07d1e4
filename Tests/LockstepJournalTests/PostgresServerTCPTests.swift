import Foundation
import Lockstep
import LockstepExamples
import LockstepJournal
import LockstepTesting
import Testing

/// `PostgresServer` with tcp access: the one subnet given gets in with a role's password, and nobody gets in as the
/// superuser over tcp; the journal opens there as a role that owns the database. Here the subnet is 127.0.0.1
/// alone, so it runs anywhere the PostgreSQL tests do.
@Suite struct PostgresServerTCPTests {
    @Test func aRoleLogsInOverTcpWithItsPasswordAndTheSuperuserDoesNot() async throws {
        let port = Int.random(in: 20_000..<60_000)
        let server = try await PostgresServer.start(
            tcp: PostgresServer.TCP(
                address: "127.0.0.1",
                port: port,
                clients: "127.0.0.1/32",
                authentication: .password
            )
        )
        // After a failure; otherwise the stop at the end, which waits off the cooperative pool, has done it.
        defer { server.stop() }
        try server.createRole("journalist", password: "s3cret_pw")
        _ = try server.createDatabase(named: "over_tcp", owner: "journalist")
        let tcp = server.tcpConnection(database: "over_tcp", user: "journalist")
        #expect(tcp == "host=127.0.0.1 port=\(port) user=journalist dbname=over_tcp")

        let who = try PostgresJournal.execute(
            "SELECT current_user || ' ' || host(inet_client_addr())",
            connection: tcp + " password=s3cret_pw"
        )
        #expect(who == ["journalist 127.0.0.1"])
        let journal = try PostgresJournal(connection: tcp + " password=s3cret_pw")
        let recovered = try journal.recover(Counter.self)
        #expect(recovered.lastSeq == 0)
        try journal.close()

        for (what, connection) in [
            ("a wrong password", tcp + " password=wrong"),
            ("no password", tcp),
            ("the superuser", "host=127.0.0.1 port=\(port) user=postgres dbname=over_tcp"),
        ] {
            #expect(throws: JournalError.self, "\(what) got in over tcp") {
                try PostgresJournal.execute("SELECT 1", connection: connection + " connect_timeout=5")
            }
        }
        await server.stop()
    }
}
