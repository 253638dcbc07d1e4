import ArgumentParser
import Foundation
import Lockstep

/// Applies actions to one of the tool's domains in a store in this process and prints the resulting state.
struct RunCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run",
        abstract: "Apply actions to a fresh in-process store and print its state and digest.",
        discussion: """
            Actions are the domain's JSON, e.g. '{"add":{"text":"Eat food"}}' for todos. Give them as \
            arguments, or one per line with --input (use - for standard input). A rejected action changes \
            nothing; it is reported, the rest go on, and the exit code is 3.
            """
    )

    @Argument(help: ArgumentHelp("The store: \(Tool.domainList)."))
    var store: String

    @Argument(help: "Actions as JSON, applied in order.")
    var actions: [String] = []

    @Option(name: .long, help: "A file of actions, one JSON object per line; - reads standard input.")
    var input: String?

    @Flag(name: .long, help: "Print one JSON object: store, seq, digest, state.")
    var json = false

    func run() async throws {
        let domain = try Tool.requireDomain(store)
        var lines = actions.enumerated().map { (label: "argument \($0.offset + 1)", text: $0.element) }
        if let input {
            let text: String
            do {
                text = input == "-" ? readStandardInput() : try String(contentsOfFile: input, encoding: .utf8)
            } catch {
                printError("\(Tool.commandName): cannot read \(input): \(error.localizedDescription)")
                throw ExitCodes.badInput
            }
            for (number, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated()
            where !line.allSatisfy(\.isWhitespace) {
                lines.append((label: "\(input) line \(number + 1)", text: String(line)))
            }
        }
        try await apply(domain, lines)
    }

    private func apply<D: Domain>(_ domain: D.Type, _ lines: [(label: String, text: String)]) async throws {
        // Decode everything first: a typo on line 900 should not leave 899 actions half-reported.
        var decoded: [(label: String, action: D.Action)] = []
        for line in lines {
            do {
                decoded.append((line.label, try CanonicalEncoding.decode(D.Action.self, from: Data(line.text.utf8))))
            } catch {
                printError(
                    "\(Tool.commandName): \(line.label): not an action of '\(D.name)': \(CanonicalEncoding.describe(error)); "
                        + "input was \(line.text)"
                )
                throw ExitCodes.badInput
            }
        }
        let store = Store(domain)
        var rejected = 0
        for (label, action) in decoded {
            do {
                try await store.dispatch(action)
            } catch {
                rejected += 1
                printError("\(Tool.commandName): \(label): rejected: \(error)")
            }
        }
        let state = store.state
        let stateBytes = try CanonicalEncoding.encode(state)
        let digest = StateDigest(of: stateBytes)
        let stateText = String(decoding: stateBytes, as: UTF8.self)
        if json {
            print(#"{"store":"\#(D.name)","seq":\#(store.appliedCount),"digest":"\#(digest)","state":\#(stateText)}"#)
        } else {
            print("store   \(D.name)")
            print("seq     \(store.appliedCount) applied, \(rejected) rejected")
            print("digest  \(digest)")
            print("state   \(stateText)")
        }
        if rejected > 0 { throw ExitCodes.rejected }
    }
}
