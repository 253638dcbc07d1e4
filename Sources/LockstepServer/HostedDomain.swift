import Lockstep
import LockstepJournal
import LockstepProtocol

/// A domain the daemon can host: its name, and how to rebuild its store from a journal.
public struct HostedDomain: Sendable {
    /// The domain's name, which is its store's name: what `--domain` and the `domains` setting choose by.
    public let name: String
    /// Whether the domain declares effects (docs/effects.md).
    public let hasEffects: Bool
    /// The store the journal proves, and the domain version it was upgraded from, if it was.
    let recover: @Sendable (any Journal) throws -> (store: any SequencedStore, upgradedFrom: UInt32?)
    /// Throws what `recover` would for the store's domain version, writing nothing.
    let checkTakeOver: @Sendable (any Journal) throws -> Void
    /// The canonical JSON of the store's state after its events `1...seq`, as `journal` proves it (the inspector's
    /// time travel).
    let state: @Sendable (any Journal, UInt64) throws -> [UInt8]

    /// Hosts domain `D`.
    public init<D: Domain>(_ domain: D.Type) {
        name = D.name
        hasEffects = D.hasEffects
        checkTakeOver = { journal in try journal.checkTakeOver(domain) }
        state = { journal, seq in try CanonicalEncoding.bytes(of: try journal.state(of: domain, at: seq)) }
        recover = { journal in
            let recovered = try journal.recover(domain)
            let store = try DomainStore(
                domain,
                epoch: Epoch(rawValue: recovered.epoch),
                lastSeq: recovered.lastSeq,
                state: recovered.state,
                stateBytesHint: recovered.stateBytesHint
            )
            return (store, recovered.upgradedFrom)
        }
    }
}
