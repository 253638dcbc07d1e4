import Foundation
import Lockstep
import LockstepJournal
import LockstepProtocol

/// The replies the daemon makes in more than one place, with the words that tell a client what to do.
enum Replies {
    /// `not_leader` from a leader whose leadership ends (`reason` says why): nothing it holds can be trusted, and
    /// no dispatch it held was applied.
    static func notLeader(_ requestID: UInt64, _ reason: String) -> Reply {
        .error(
            requestID: requestID,
            ProtocolError(
                code: .notLeader,
                "this daemon no longer leads the journal (\(reason)), so nothing of this request was applied or "
                    + "read; send it to the leader, or again here later, with the same request number"
            )
        )
    }

    /// `not_leader` from a standby: `refusal` (``Leadership/refusal(holder:)``) says who leads.
    static func standingBy(_ requestID: UInt64, _ refusal: String) -> Reply {
        .error(requestID: requestID, ProtocolError(code: .notLeader, refusal))
    }

    static func unavailable(_ requestID: UInt64) -> Reply {
        .error(
            requestID: requestID,
            ProtocolError(
                code: .unavailable,
                "the journal could not make this dispatch durable, so nothing was applied; retry with the same "
                    + "request number later, and see the daemon's log"
            )
        )
    }

    static func busy(_ requestID: UInt64) -> Reply {
        .error(
            requestID: requestID,
            ProtocolError(
                code: .unavailable,
                "\(CommandLoop.maximumOffloaded) snapshot and range requests are already being answered; ask again"
            )
        )
    }

    /// A SNAPSHOT of `store` as it stood when the request was read: encoded on a reader thread.
    /// With `journal` (a large state, which the checkpoint thread snapshots now and then): the store's newest
    /// snapshot in the journal when it is at the store's seq — already encoded and hashed — or else the state encoded
    /// now. (A SNAPSHOT is the state now: `lockstep state` and the tests read it so; an older snapshot would do for a
    /// replica, which repairs the rest by RANGE, but the request does not say who asks.)
    ///
    /// With `part` (a replica joining), a large state goes in parts read from the journal's newest snapshot, whatever
    /// its seq (the replica repairs the events since by RANGE): the daemon holds a part of it at a time, never the whole,
    /// however many replicas join at once. A part of a snapshot no longer kept is refused (`invalid_range`): the
    /// replica starts again from the first.
    static func snapshot(
        requestID: UInt64,
        store: any SequencedStore,
        journal: (any Journal)? = nil,
        part: SnapshotPartRequest? = nil
    ) -> Reply {
        let name = store.name
        if let part, let journal {
            let read = Result { () throws(JournalError) in
                try journal.snapshotPart(
                    store: name.rawValue,
                    seq: part.seq,
                    offset: part.offset,
                    maximumBytes: Int(part.maximumBytes)
                )
            }
            switch read {
            case let .success(found?):
                return .snapshot(
                    requestID: requestID,
                    SnapshotReply(
                        store: name,
                        epoch: store.epoch,
                        seq: found.seq,
                        digest: found.digest,
                        state: found.bytes,
                        part: SnapshotReply.Part(
                            total: UInt64(found.total),
                            offset: part.offset,
                            storeSeq: store.lastSeq
                        )
                    )
                )
            case .success(nil) where part.seq > 0, .failure where part.seq > 0:
                return .error(
                    requestID: requestID,
                    ProtocolError(
                        code: .invalidRange,
                        "the snapshot of '\(name)' at seq \(part.seq) is not kept any more, or has no byte "
                            + "\(part.offset): ask for its first part again (seq 0, offset 0)"
                    )
                )
            case .success(nil), .failure:
                break  // no snapshot yet, or one that cannot be read: the state now, whole
            }
        }
        if let journal, let kept = try? journal.newestSnapshot(store: name.rawValue), kept.seq == store.lastSeq {
            return .snapshot(
                requestID: requestID,
                SnapshotReply(store: name, epoch: store.epoch, seq: kept.seq, digest: kept.digest, state: kept.state)
            )
        }
        do {
            let state = try store.encodedState(
                expectedBytes: CanonicalEncoding.capacity(forLastSize: store.stateBytesHint)
            )
            return .snapshot(
                requestID: requestID,
                SnapshotReply(
                    store: name,
                    epoch: store.epoch,
                    seq: store.lastSeq,
                    digest: StateDigest(of: state),
                    state: state
                )
            )
        } catch {
            return .error(
                requestID: requestID,
                ProtocolError(code: .internal, "cannot encode store '\(name)': \(error)")
            )
        }
    }

    /// A RANGE of `store` from `from` up to `to` and at most `lastSeq`, read from the journal on a reader thread.
    static func range(
        requestID: UInt64,
        store name: StoreName,
        epoch: Epoch,
        lastSeq: SequenceNumber,
        from: SequenceNumber,
        to: SequenceNumber,
        journal: any Journal
    ) -> Reply {
        guard from <= lastSeq else {
            return .error(
                requestID: requestID,
                ProtocolError(
                    code: .invalidRange,
                    "store '\(name)' is at seq \(lastSeq); a range from seq \(from) is empty"
                )
            )
        }
        do {
            // At most 10,000 events and 16 MiB of actions (at least one event): a RANGE of large actions must
            // not make a reader thread hold gigabytes.
            switch try journal.events(
                store: name.rawValue,
                from: from,
                to: min(to, lastSeq),
                limit: 10_000,
                maximumBytes: 16 << 20
            ) {
            case let .events(events):
                return .range(
                    requestID: requestID,
                    store: name,
                    epoch: epoch,
                    firstSeq: from,
                    actions: events.map(\.action),
                    authors: events.contains { !$0.author.isEmpty } ? events.map { Author($0.author) } : []
                )
            case let .compacted(firstAvailable):
                return .compacted(requestID: requestID, store: name, epoch: epoch, firstAvailable: firstAvailable)
            }
        } catch {
            return .error(requestID: requestID, ProtocolError(code: .internal, "cannot read store '\(name)': \(error)"))
        }
    }
}
