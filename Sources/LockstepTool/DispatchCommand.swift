import ArgumentParser
import Foundation
import LockstepClient
import LockstepProtocol
import ZeroMQ

/// Sends actions to a running daemon and prints the seqs they got.
struct DispatchCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dispatch",
        abstract: "Send actions to the daemon's store and print the seq each got.",
        discussion: """
            The actions are the store's JSON, e.g. lockstep dispatch todos '{"add":{"text":"Eat food"}}'. Several \
            actions form one batch, applied all or none. The dispatch goes to the daemon that leads (give every \
            daemon of a failover group with --command-endpoint); a silent daemon is asked again with a fresh \
            socket and the same idempotency key, and a standby again after a pause, until one leads or the \
            (--retries + 1) tries of --timeout-ms are over, so an action is applied at most once and a takeover \
            within that time is waited out. A store of one of this tool's domains is sent with the tool's own \
            domain version (a daemon of another version refuses it); any other store with the leader's. Exit 3 \
            when the store's validator rejects it, 64 when the leader hosts no such store, 65 when it is not an \
            action of that store, 69 when no daemon leads within the tries.
            """
    )

    @Argument(help: "The store's name.")
    var store: String

    @Argument(help: "One or more actions as JSON; several are one all-or-none batch.")
    var actions: [String]

    @OptionGroup var daemon: DaemonOptions

    @Option(help: "Send the batch this many times, each a new dispatch with its own request number.")
    var `repeat` = 1

    @Flag(help: "Print one JSON object per dispatch: {\"store\":…,\"seq\":…}.")
    var json = false

    func validate() throws {
        guard !actions.isEmpty else { throw ValidationError("give at least one action") }
        guard (1...1_000_000).contains(`repeat`) else { throw ValidationError("--repeat must be 1...1000000") }
    }

    func run() throws {
        let name = try storeName(store)
        // What can be checked here is checked before anything is sent: the daemon would refuse it anyway.
        for (index, text) in actions.enumerated() {
            do {
                _ = try JSONSerialization.jsonObject(with: Data(text.utf8))
            } catch {
                printError(
                    "\(Tool.commandName): action \(index) is not JSON (\(error.localizedDescription)); it was "
                        + "\(text); write it as the store's JSON: {\"CASE\":{\"LABEL\":VALUE,…}}, one of its action cases "
                        + "with its labelled values"
                )
                throw ExitCodes.badInput
            }
        }
        let client = try daemon.client()
        let version = try domainVersion(of: name, client)
        let clientID = ClientID.random()
        let frames = actions.map { Array($0.utf8) }
        for number in 1...UInt64(`repeat`) {
            let request = Request.dispatch(
                DispatchRequest(
                    requestID: number,
                    domainVersion: version,
                    clientID: clientID,
                    store: name,
                    actions: frames
                )
            )
            switch try daemon.call(client, request) {
            case let .accepted(_, _, first, count):
                let last = first + UInt64(count) - 1
                if json {
                    let seqs = count > 1 ? #","seqs":[\#((first...last).map(String.init).joined(separator: ","))]"# : ""
                    print(#"{"store":"\#(name)","seq":\#(last)\#(seqs)}"#)
                } else {
                    print(count > 1 ? "\(name): seqs \(first)...\(last)" : "\(name): seq \(first)")
                }
            case let .rejected(_, index, rejection):
                printError(
                    "\(Tool.commandName): \(name) rejected action \(index): \(rejection.reason) [\(rejection.code)]"
                )
                throw ExitCodes.rejected
            case let other:
                throw unexpected(other, to: "DISPATCH")
            }
        }
    }

    /// The store's domain version: this tool's own when it has the store's domain, so a daemon of another version
    /// refuses the dispatch rather than take it; otherwise the leader's, from its status, so the tool needs no
    /// domain code.
    private func domainVersion(of name: StoreName, _ client: CommandClient) throws -> UInt32 {
        if let domain = Tool.domain(named: name.rawValue) { return domain.version }
        return try daemon.requireStore(name, client).domainVersion
    }
}
