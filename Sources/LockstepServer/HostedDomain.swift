import Lockstep
import LockstepJournal
import LockstepProtocol

/// A domain the daemon can host: its name, and how to rebuild its store from a journal.
public struct HostedDomain: Sendable {
    public let name: String
    /// The store the journal proves, and the domain version it was upgraded from, if it was.
    let recover: @Sendable (any Journal) throws -> (store: any SequencedStore, upgradedFrom: UInt32?)
    /// Throws what `recover` would for the store's domain version, writing nothing.
    let checkTakeOver: @Sendable (any Journal) throws -> Void

    /// Hosts domain `D`.
    public init<D: Domain>(_ domain: D.Type) {
        name = D.name
        checkTakeOver = { journal in try journal.checkTakeOver(domain) }
        recover = { journal in
            let recovered = try journal.recover(domain)
            let store = try DomainStore(
                domain,
                epoch: Epoch(rawValue: recovered.epoch),
                lastSeq: recovered.lastSeq,
                state: recovered.state
            )
            return (store, recovered.upgradedFrom)
        }
    }
}

/// How a reply is kept in the journal's idempotency table: the reply's frames, each behind its length.
enum ReplyRecord {
    static func encode(_ reply: Reply) -> [UInt8] {
        var bytes: [UInt8] = []
        for frame in reply.encode() {
            withUnsafeBytes(of: UInt32(frame.count).bigEndian) { bytes.append(contentsOf: $0) }
            bytes.append(contentsOf: frame)
        }
        return bytes
    }

    static func decode(_ bytes: [UInt8]) -> Reply? {
        var frames: [Frame] = []
        var index = 0
        while index < bytes.count {
            guard index + 4 <= bytes.count else { return nil }
            let length = bytes[index..<index + 4].reduce(0) { $0 << 8 | Int($1) }
            index += 4
            guard index + length <= bytes.count else { return nil }
            frames.append(Array(bytes[index..<index + length]))
            index += length
        }
        return try? Reply.decode(frames)
    }
}
