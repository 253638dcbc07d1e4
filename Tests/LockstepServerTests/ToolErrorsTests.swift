import Foundation
import LockstepExamples
import LockstepJournal
import LockstepTesting
import TestSupport
import Testing

/// The tool and the daemon made with the one-call entries keep their clear errors for bad input: an unknown
/// domain, a journal store the binary does not host, a seq past the end, a domain the daemon does not link.
@Suite struct ToolErrorsTests {
    /// A data directory holding a `counter` store with 3 events.
    func journalWithCounter() throws -> URL {
        let directory = try temporaryDirectory("tool-errors")
        let journal = try SQLiteJournal(directory: directory.path)
        _ = try journal.recover(Counter.self)
        let action = Array(#"{"increment":{}}"#.utf8)
        try journal.commit(
            JournalBatch(
                events: (1...3).map {
                    JournalEvent(
                        store: "counter",
                        seq: $0,
                        action: action,
                        clientID: [UInt8](repeating: 1, count: 16),
                        requestNumber: $0
                    )
                }
            )
        )
        try journal.close()
        return directory
    }

    /// `lockstep journal convert`: a stopped daemon's SQLite journal written as a log journal, checked and compared;
    /// into a directory that is not empty, refused naming it.
    @Test func convertWritesAnSQLiteJournalAsALogJournalAndChecksIt() async throws {
        let directory = try journalWithCounter()
        defer { try? FileManager.default.removeItem(at: directory) }
        let destination = directory.appendingPathComponent("log").path
        let converted = try await runProduct("lockstep", ["journal", "convert", directory.path, destination])
        #expect(converted.status == 0, "\(converted.standardError)")
        #expect(converted.standardOutput.contains("intact (counter at seq 3)"), "\(converted.standardOutput)")
        #expect(LogJournal.exists(in: destination))
        let again = try await runProduct("lockstep", ["journal", "convert", directory.path, destination])
        #expect(again.status == 1)
        #expect(again.standardError.contains("is not empty"), "\(again.standardError)")
    }

    @Test func anUnknownStoreIsAUsageErrorThatListsTheDomains() async throws {
        let result = try await runProduct("lockstep", ["run", "cart", #"{"add":{}}"#])
        #expect(result.status == 64)
        #expect(
            result.standardError.contains(
                "unknown store 'cart'; this tool has the domains counter, todos, posts, numbers, reminders"
            )
        )
    }

    @Test func journalStateNamesWhatIsWrong() async throws {
        let directory = try journalWithCounter()
        defer { try? FileManager.default.removeItem(at: directory) }
        let good = try await runProduct(
            "lockstep",
            ["journal", "state", directory.path, "counter", "--seq", "2", "--json"]
        )
        #expect(good.status == 0, "\(good.standardError)")
        #expect(good.standardOutput.contains(#""seq":2,"#) && good.standardOutput.contains(#""state":{"count":2}"#))

        let past = try await runProduct("lockstep", ["journal", "state", directory.path, "counter", "--seq", "4"])
        #expect(past.status == 1)
        #expect(
            past.standardError.contains("seq 4 is past the end of 'counter': its last seq is 3"),
            "\(past.standardError)"
        )

        // A store the journal does not hold (todos is a domain of the tool, but not in this journal).
        let absent = try await runProduct("lockstep", ["journal", "state", directory.path, "todos"])
        #expect(absent.status == 1)
        #expect(absent.standardError.contains("the journal has no store 'todos'"), "\(absent.standardError)")

        // A journal store whose domain this binary does not host.
        let foreign = try await runProduct("lockstep", ["journal", "state", directory.path, "board"])
        #expect(foreign.status == 64)
        #expect(foreign.standardError.contains("unknown store 'board'"), "\(foreign.standardError)")
    }

    @Test func aDaemonRefusesADomainItDoesNotLinkAndABadValue() async throws {
        let unknown = try await runProduct("lockstepd", ["--domain", "cart"])
        #expect(unknown.status == 78)
        #expect(
            unknown.standardError.contains("no domain named 'cart' is linked into this daemon; it has counter, todos")
        )
        let bad = try await runProduct("lockstepd", ["--journal", "paper"])
        #expect(bad.status == 78)
        #expect(bad.standardError.contains("--journal: must be sqlite, memory, postgres or log, got 'paper'"))
    }

    @Test func whatCanBeCheckedHereIsCheckedBeforeAnythingIsSent() async throws {
        let directory = try temporaryDirectory("fail-fast")
        defer { try? FileManager.default.removeItem(at: directory) }
        let endpoint = "ipc://\(directory.path)/command"
        let absent = try await runProduct("lockstep", ["stats", "--command-endpoint", endpoint])
        #expect(absent.status == 69)
        #expect(absent.standardError.contains("no daemon at \(endpoint): \(directory.path)/command does not exist"))

        let notJSON = try await runProduct(
            "lockstep",
            ["dispatch", "todos", #"{"add":"#, "--command-endpoint", endpoint]
        )
        #expect(notJSON.status == 65)
        #expect(notJSON.standardError.contains(#"action 0 is not JSON"#), "\(notJSON.standardError)")
    }
}

/// The commands that ask a daemon exit as documented: 64 for a store the leader does not host, whether the tool
/// knows the store's domain or not; a store of the tool's own domains is dispatched with the tool's own version.
@Suite struct ToolDaemonExitTests {
    @Test func aStoreTheLeaderDoesNotHostIsAUsageErrorForEveryCommand() async throws {
        let directory = try temporaryDirectory("tool-exits")
        defer { try? FileManager.default.removeItem(at: directory) }
        let daemon = try DaemonProcess(
            directory: directory.path,
            arguments: ["--journal", "memory", "--domain", "counter"]
        )
        try await daemon.waitUntilServing()
        let endpoint = ["--command-endpoint", daemon.command]
        let hosted = try await runProduct("lockstep", ["dispatch", "counter", #"{"increment":{}}"#] + endpoint)
        #expect(hosted.status == 0 && hosted.standardOutput.contains("counter: seq 1"), "\(hosted.standardError)")
        // todos is a domain of the tool, sent with the tool's version: the daemon refuses the store.
        for arguments in [["dispatch", "todos", #"{"add":{"text":"milk"}}"#], ["state", "todos"], ["tail", "todos"]] {
            let refused = try await runProduct("lockstep", arguments + endpoint)
            #expect(refused.status == 64, "\(arguments): \(refused.status) \(refused.standardError)")
            #expect(refused.standardError.contains("todos"), "\(refused.standardError)")
        }
        // cart is not: its version comes from the leader's status, which has no such store.
        let unknown = try await runProduct("lockstep", ["dispatch", "cart", #"{"add":{}}"#] + endpoint)
        #expect(unknown.status == 64)
        #expect(
            unknown.standardError.contains("hosts no store 'cart'; it hosts counter"),
            "\(unknown.standardError)"
        )
        let stats = try await runProduct("lockstep", ["stats", "--json"] + endpoint)
        #expect(stats.status == 0, "\(stats.standardError)")
        #expect(stats.standardOutput.hasPrefix(#"{"endpoint":"\#(daemon.command)","#), "\(stats.standardOutput)")
        #expect(await daemon.stop() == 0)
    }
}

/// Recovery refuses what it cannot read rather than skip it.
@Suite struct IdempotencyRecoveryTests {
    @Test func anUnreadableIdempotencyEntryStopsTheDaemonWithTheEntryNamed() async throws {
        let directory = try temporaryDirectory("idempotency-damaged")
        defer { try? FileManager.default.removeItem(at: directory) }
        let data = directory.appendingPathComponent(".lockstep/data").path
        let journal = try SQLiteJournal(directory: data)
        _ = try journal.recover(Counter.self)
        let client = [UInt8](repeating: 0xAB, count: 16)
        // A reply whose first frame claims 255 bytes and holds 2: no reply can be read back from it.
        let damaged = IdempotencyRecord(
            key: IdempotencyKey(clientID: client, requestNumber: 7),
            fingerprint: [UInt8](repeating: 1, count: 32),
            reply: [0, 0, 0, 255, 1, 2]
        )
        try journal.commit(JournalBatch(idempotency: [damaged]))
        try journal.close()

        let daemon = try DaemonProcess(directory: directory.path)
        _ = try await eventually(within: .seconds(30)) { !daemon.isRunning }
        #expect(await daemon.stop() == 1)
        let output = daemon.output
        #expect(output.contains("the idempotency entry of client \(String(repeating: "ab", count: 16)) request 7"))
        #expect(output.contains("could be applied twice"), "\(output)")
        #expect(output.contains("DELETE FROM idempotency"), "\(output)")
    }
}
