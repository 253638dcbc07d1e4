import Foundation
import Lockstep
import LockstepJournal
import LockstepProtocol

/// Why a store's history could not be read for a replay; each says what to do.
public struct HistoryError: Error, Sendable, CustomStringConvertible {
    /// What kind of problem.
    public enum Kind: Sendable, Hashable {
        /// The journal's store was written by another domain version than the one replaying it.
        case anotherVersion(written: UInt32, here: UInt32)
        /// The journal keeps events from a seq but no snapshot right before it to start from.
        case noStartingSnapshot(seq: SequenceNumber)
        /// A journaled action the domain cannot decode.
        case undecodable(seq: SequenceNumber)
    }

    /// What kind of problem, for programs.
    public var kind: Kind
    /// What failed and what to do, for people.
    public var description: String
}

extension ReplayLog {
    /// A store's history as its journal keeps it, to check a build's reducers against what really happened: the
    /// actions from the oldest kept snapshot (or seq 0) on, starting from that snapshot's state, and every later
    /// snapshot's digest and state as what the replay must reproduce. ``ReplayHarness/replay(_:)`` then names the
    /// first snapshot whose digest the reducers no longer reach, with the action there and a diff of the journal's
    /// state against the replayed one; its report counts the snapshots reproduced.
    ///
    /// A store written by another domain version is refused (``HistoryError/Kind/anotherVersion(written:here:)``):
    /// its actions through this version's reducer would only show a false divergence. A deliberate change of
    /// behaviour is a new domain version.
    public init(history journal: any Journal) throws {
        guard let info = try journal.stats().stores.first(where: { $0.name == D.name }) else {
            try self.init([])
            return
        }
        guard info.domainVersion == D.version else {
            throw HistoryError(
                kind: .anotherVersion(written: info.domainVersion, here: D.version),
                description: "store '\(D.name)' in \(journal.location) was written by domain version "
                    + "\(info.domainVersion) and this build has version \(D.version); replay it with a build of "
                    + "version \(info.domainVersion)"
                    + (D.canTakeOver(version: info.domainVersion)
                        ? ", or upgrade a copy by starting the version \(D.version) daemon on it" : "")
            )
        }
        let startSeq = info.firstSeq.map { $0 - 1 } ?? info.snapshotSeqs.first ?? 0
        var startState = try CanonicalEncoding.bytes(of: D.initialState)
        if startSeq > 0 {
            guard let snapshot = try journal.snapshot(store: D.name, seq: startSeq) else {
                throw HistoryError(
                    kind: .noStartingSnapshot(seq: startSeq),
                    description: "store '\(D.name)' keeps events from seq \(startSeq + 1) but no snapshot at seq "
                        + "\(startSeq) to start from; check the journal with 'journal verify \(journal.location)'"
                )
            }
            startState = snapshot.state
        }
        var actions: [D.Action] = []
        var authors: [Author] = []
        var next = startSeq + 1
        let decoder = JSONDecoder()
        while next <= info.lastSeq {
            guard
                case let .events(events) = try journal.events(
                    store: D.name,
                    from: next,
                    to: info.lastSeq,
                    limit: 10_000
                ),
                let last = events.last
            else { break }
            for event in events {
                do {
                    actions.append(try decoder.decode(D.Action.self, from: Data(event.action)))
                    authors.append(Author(event.author))
                } catch {
                    throw HistoryError(
                        kind: .undecodable(seq: event.seq),
                        description: "store '\(D.name)' seq \(event.seq): not an action of '\(D.name)': "
                            + CanonicalEncoding.describe(error)
                    )
                }
            }
            next = last.seq + 1
        }
        var expected: [SequenceNumber: (digest: StateDigest, state: [UInt8]?)] = [:]
        for seq in info.snapshotSeqs where seq > startSeq {
            if let snapshot = try journal.snapshot(store: D.name, seq: seq) {
                expected[seq] = (snapshot.digest, snapshot.state)
            }
        }
        self.init(startSeq: startSeq, startState: startState, actions: actions, authors: authors, expected: expected)
    }
}
