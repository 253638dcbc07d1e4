import Lockstep
import LockstepProtocol

/// A replica's digest checks as a value: the seqs it keeps its own digest at (each taken off its thread), the daemon's
/// DIGESTs of them, and the verdict once both are known. A DIGEST may come before the replica's own digest is done, or
/// — for a state the daemon checkpoints off its loop — long after the replica has moved on.
struct DigestChecks {
    /// What a check came to: the states agree at `seq`, or differ.
    enum Verdict: Equatable {
        case agree(seq: SequenceNumber, state: Frame?)
        case differ(seq: SequenceNumber, daemon: StateDigest, mine: StateDigest, state: Frame?)

        /// The verdict on the daemon's and the replica's digests at `seq`.
        static func compare(daemon: StateDigest, mine: StateDigest, at seq: SequenceNumber, state: Frame?) -> Self {
            daemon == mine
                ? .agree(seq: seq, state: state) : .differ(seq: seq, daemon: daemon, mine: mine, state: state)
        }
    }

    /// One more at every resync: a digest taken before it is void.
    private(set) var generation: UInt64 = 0
    /// The replica's digests by seq: `nil` while being taken.
    private var mine: [SequenceNumber: (digest: StateDigest, state: Frame?)?] = [:]
    private var daemon: [SequenceNumber: StateDigest] = [:]

    /// The most seqs kept at once: the daemon's DIGESTs come in seq order, and a checkpoint off its loop waits
    /// for the one before it.
    static var maximumKept: Int { 4 }

    /// Starts keeping the replica's digest at `seq`: `false` when it is kept already.
    mutating func keep(_ seq: SequenceNumber) -> Bool {
        guard mine.index(forKey: seq) == nil else { return false }
        mine[seq] = .some(nil)
        for old in mine.keys.sorted().dropLast(Self.maximumKept) {
            mine.removeValue(forKey: old)
            daemon.removeValue(forKey: old)
        }
        return true
    }

    /// The daemon's digest at `seq`; ignored unless the replica keeps its own there. Seqs before it will get none.
    mutating func daemonSaid(_ digest: StateDigest, at seq: SequenceNumber) -> Verdict? {
        for old in mine.keys where old < seq {
            mine.removeValue(forKey: old)
            daemon.removeValue(forKey: old)
        }
        guard mine.index(forKey: seq) != nil else { return nil }
        daemon[seq] = digest
        return verdict(seq)
    }

    /// The replica's own digest at `seq`, taken in `generation`, with the state when evidence wants it.
    mutating func computed(
        _ digest: StateDigest,
        state: Frame?,
        at seq: SequenceNumber,
        generation: UInt64
    ) -> Verdict? {
        guard generation == self.generation, mine.index(forKey: seq) != nil else { return nil }
        mine[seq] = (digest, state)
        return verdict(seq)
    }

    /// The replica starts over: nothing kept counts.
    mutating func reset() {
        generation += 1
        mine.removeAll()
        daemon.removeAll()
    }

    private mutating func verdict(_ seq: SequenceNumber) -> Verdict? {
        guard let theirs = daemon[seq], let kept = mine[seq], let ours = kept else { return nil }
        mine.removeValue(forKey: seq)
        daemon.removeValue(forKey: seq)
        return .compare(daemon: theirs, mine: ours.digest, at: seq, state: ours.state)
    }
}

/// The size of a replica's digest form as a value: what the digest thread wrote last, or the large snapshot installed
/// since. It says where the next digest is taken (a large one on the digest thread, even when the daemon took its own
/// on its loop) and how much room it is written into.
package struct DigestFormSize: Sendable {
    /// A digest form this large is taken on the digest thread; a snapshot this large has its sums taken at install.
    package static var large: Int { 1 << 20 }

    package private(set) var bytes = 0

    package init() {}
    /// Snapshots installed: a digest form of a state from before the last one says nothing of its size.
    private var installs: UInt64 = 0

    /// Whether the digest form was small when last written: it may be taken on the replica's thread.
    package var isSmall: Bool { bytes < Self.large }

    /// A snapshot of `bytes` bytes was installed: large until a digest form of it says otherwise. Returns the
    /// install's number, for what the digest thread writes of it (``written(_:of:)``).
    package mutating func installed(bytes: Int) -> UInt64 {
        installs += 1
        if bytes >= Self.large { self.bytes = bytes }
        return installs
    }

    /// The number of the latest install: a digest taken now is of its state.
    package var latestInstall: UInt64 { installs }

    /// A digest form of `bytes` bytes was written of the state of install `install`; one of an earlier install's
    /// state is ignored.
    package mutating func written(_ bytes: Int?, of install: UInt64) {
        guard let bytes, install == installs else { return }
        self.bytes = bytes
    }
}
