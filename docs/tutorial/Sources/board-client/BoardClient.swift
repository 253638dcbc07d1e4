import Foundation
import Kanban
import Lockstep
import LockstepClient

/// `board-client`: keeps a replica of the daemon's `board` store, dispatches generated actions through it,
/// catches up with everything the daemon acknowledged (`sync()`), and prints `seq=<seq> digest=<hex>`.
///
/// A replica that prints a seq prints the digest of the daemon's state at that seq: that is the whole promise of
/// Lockstep, and what `smoke.sh` checks against the journal with two of these running at once.
@main
struct BoardClient {
    static let usage = """
        usage: board-client [--actions N] [--seed S] [--timeout SECONDS]
                            [--command-endpoint ENDPOINT] [--events-endpoint ENDPOINT]
        """

    static func main() async {
        // Plain `--name value` pairs: five options do not need a parser. The endpoints default to the daemon's
        // own defaults, relative to the folder both are started in.
        var flags = [
            "--command-endpoint": "ipc://.lockstep/run/command",
            "--events-endpoint": "ipc://.lockstep/run/events",
            "--actions": "100",
            "--seed": String(UInt64.random(in: 0...UInt64.max)),
            "--timeout": "30",
        ]
        var arguments = CommandLine.arguments.dropFirst()
        while let flag = arguments.popFirst() {
            if flag == "--help" {
                print(usage)
                exit(0)
            }
            guard flags[flag] != nil, let value = arguments.popFirst() else {
                fail(flags[flag] == nil ? "unknown option '\(flag)'\n\(usage)" : "\(flag) needs a value", code: 64)
            }
            flags[flag] = value
        }
        guard let actions = Int(flags["--actions"]!), actions >= 0, let seed = UInt64(flags["--seed"]!),
            let timeout = Int(flags["--timeout"]!), timeout > 0
        else { fail("--actions, --seed and --timeout take whole numbers\n\(usage)", code: 64) }

        let replica: Replica<Board>
        do {
            replica = try Replica(
                Board.self,
                configuration: ReplicaConfiguration(
                    commandEndpoint: flags["--command-endpoint"]!,
                    eventsEndpoint: flags["--events-endpoint"]!
                )
            )
        } catch {
            fail("cannot set up the replica: \(error)")
        }
        // `run()` is the replica's life: it follows the daemon (and reconnects when it restarts) until its task is
        // cancelled. In a server, put the replica in your ServiceGroup instead.
        let running = Task { try await replica.run() }

        do {
            try await replica.waitUntilLive(timeout: .seconds(timeout))
        } catch {
            fail("\(error)")
        }

        var random = SplitMix64(seed: seed)
        var accepted = 0
        var refused = 0
        var skipped = 0
        for _ in 0..<actions {
            let state = replica.state
            let action = Board.randomAction(for: state, using: &random)
            // Checking here first saves a round trip for what is certainly refused. It is not the last word: the
            // daemon checks again against the state it holds when the action's turn comes.
            guard (try? Board.validate(action, in: state)) != nil else {
                skipped += 1
                continue
            }
            do {
                // Returns once this replica has applied the action: the next `replica.state` includes it.
                try await replica.dispatch(action)
                accepted += 1
            } catch is Rejection {
                // Another client got there first (it filled the column, removed the card): expected, not fatal.
                refused += 1
            } catch {
                fail("dispatch failed: \(error)")
            }
        }
        log("sent \(accepted + refused): \(accepted) accepted, \(refused) refused by the daemon, \(skipped) not sent")

        // Everything the daemon acknowledged before now — this client's actions and any other's — is in this
        // replica once `sync()` returns: it asks the daemon for the store's seq and waits until it holds it. (A
        // process told a seq by another, say the one a dispatch returned there, waits with `wait(for: seq)`.)
        let final: Replicated<Board.State>
        do {
            final = try await replica.sync(timeout: .seconds(timeout))
        } catch {
            let status = replica.status
            fail(
                "could not catch up with the daemon in \(timeout) s: \(error) (this replica is \(status.phase) at seq "
                    + "\(status.lastSeq)\(status.problem.map { ", \($0)" } ?? ""))"
            )
        }
        do {
            print("seq=\(final.seq) digest=\(try CanonicalEncoding.digest(of: final.state).hex)")
        } catch {
            fail("cannot encode the state: \(error)")
        }
        running.cancel()
        _ = try? await running.value  // returns once the replica's thread has closed its sockets
    }

    static func log(_ message: String) {
        FileHandle.standardError.write(Data("board-client: \(message)\n".utf8))
    }

    static func fail(_ message: String, code: Int32 = 1) -> Never {
        log(message)
        exit(code)
    }
}
