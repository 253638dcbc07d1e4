import Foundation
import Lockstep
import LockstepProtocol

/// What a replica saw when its digest differed from the daemon's, written before it repaired itself: enough to
/// replay the actions since the last digest both agreed on and find the bug (`lockstep replay --evidence FILE`).
public struct DivergenceEvidence: Codable, Sendable {
    /// The store's name.
    public var store: String
    /// The replica's domain version.
    public var domainVersion: UInt32
    /// The executable the replica ran in, and when it was built (its file's modification time).
    public var build: String
    /// The epoch of the daemon's journal.
    public var epoch: String
    /// When the file was written (ISO 8601).
    public var writtenAt: String
    /// The last seq whose digest the replica and the daemon agreed on (or the snapshot it installed).
    public var agreedSeq: UInt64
    /// The state at ``agreedSeq``, as canonical JSON.
    public var agreedState: String
    /// The actions since, in seq order (the first has seq ``agreedSeq`` + 1), as canonical JSON; `nil` when there
    /// were more than the replica keeps (``ReplicaConfiguration/maximumEvidenceBytes``).
    public var actions: [String]?
    /// Who dispatched each of ``actions``; `nil` when nobody was identified (and in files of replicas before authors).
    public var authors: [String]?
    /// The seq whose digest differed.
    public var divergentSeq: UInt64
    /// The daemon's digest at ``divergentSeq``, 64 hex digits.
    public var daemonDigest: String
    /// The replica's state at ``divergentSeq``, as canonical JSON, and its digest (over its digest form:
    /// `CanonicalEncoding.digestForm(of:reservingCapacity:)`).
    public var replicaState: String
    public var replicaDigest: String

    /// Reads a file written by a replica.
    public init(contentsOf file: URL) throws {
        self = try JSONDecoder().decode(Self.self, from: Data(contentsOf: file))
    }

    init(
        store: String,
        domainVersion: UInt32,
        epoch: Epoch,
        agreedSeq: UInt64,
        agreedState: [UInt8],
        actions: [[UInt8]]?,
        authors: [Author] = [],
        divergentSeq: UInt64,
        daemonDigest: StateDigest,
        replicaState: [UInt8],
        replicaDigest: StateDigest
    ) {
        self.store = store
        self.domainVersion = domainVersion
        let executable = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path
        let built =
            (try? FileManager.default.attributesOfItem(atPath: executable)[.modificationDate] as? Date)
            .map { ISO8601DateFormatter().string(from: $0) } ?? "unknown"
        build = "\(executable), built \(built)"
        self.epoch = "\(epoch)"
        writtenAt = ISO8601DateFormatter().string(from: Date())
        self.agreedSeq = agreedSeq
        self.agreedState = String(decoding: agreedState, as: UTF8.self)
        self.actions = actions?.map { String(decoding: $0, as: UTF8.self) }
        self.authors = actions != nil && authors.contains { !$0.isUnknown } ? authors.map(\.name) : nil
        self.divergentSeq = divergentSeq
        self.daemonDigest = daemonDigest.hex
        self.replicaState = String(decoding: replicaState, as: UTF8.self)
        self.replicaDigest = replicaDigest.hex
    }
}

/// The replica thread's memory for evidence: the state at the last agreement and the actions since.
struct EvidenceRecorder {
    let directory: String
    let maximumFiles: Int
    let maximumBytes: Int
    private var agreed: (epoch: Epoch, seq: SequenceNumber, state: [UInt8])?
    private var actions: [[UInt8]] = []
    private var authors: [Author] = []
    private var bytes = 0
    private var overflowed = false

    init(directory: String, maximumFiles: Int, maximumBytes: Int) {
        self.directory = directory
        self.maximumFiles = max(1, maximumFiles)
        self.maximumBytes = maximumBytes
    }

    /// The state at `seq` is known to be the daemon's (a digest matched, or a checked snapshot was installed). The
    /// actions applied after `seq` are kept: a digest taken off the daemon's loop is known after later events.
    mutating func agree(epoch: Epoch, seq: SequenceNumber, state: [UInt8]) {
        if let agreed, agreed.epoch == epoch, !overflowed, seq >= agreed.seq,
            seq - agreed.seq <= SequenceNumber(actions.count)
        {
            let passed = Int(seq - agreed.seq)
            bytes -= actions.prefix(passed).reduce(0) { $0 + $1.count }
            actions.removeFirst(passed)
            authors.removeFirst(min(passed, authors.count))
        } else {
            actions.removeAll(keepingCapacity: true)
            authors.removeAll(keepingCapacity: true)
            bytes = 0
            overflowed = false
        }
        agreed = (epoch, seq, state)
    }

    /// Actions applied after the agreement, in seq order.
    mutating func applied(_ events: [SequencedAction]) {
        guard let agreed, !overflowed else { return }
        for event in events where event.seq == agreed.seq + SequenceNumber(actions.count) + 1 {
            bytes += event.action.count
            if bytes > maximumBytes {
                overflowed = true
                actions.removeAll()
                authors.removeAll()
                return
            }
            actions.append(event.action)
            authors.append(event.author)
        }
    }

    /// Writes the evidence of a divergence at `seq` and returns the file, or `nil` when there is no agreement to
    /// start from yet or the file could not be written (the reason is logged by the caller).
    func write(
        store: String,
        domainVersion: UInt32,
        seq: SequenceNumber,
        daemonDigest: StateDigest,
        replicaState: [UInt8],
        replicaDigest: StateDigest
    ) throws -> URL? {
        guard let agreed else { return nil }
        let upTo = seq > agreed.seq ? Int(seq - agreed.seq) : 0
        let evidence = DivergenceEvidence(
            store: store,
            domainVersion: domainVersion,
            epoch: agreed.epoch,
            agreedSeq: agreed.seq,
            agreedState: agreed.state,
            // Up to the seq that diverged: the ones applied after it say nothing of it.
            actions: overflowed ? nil : Array(actions.prefix(upTo)),
            authors: Array(authors.prefix(upTo)),
            divergentSeq: seq,
            daemonDigest: daemonDigest,
            replicaState: replicaState,
            replicaDigest: replicaDigest
        )
        let folder = URL(fileURLWithPath: directory)
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        let prefix = "divergence-\(store)-"
        let stamp = Int64(Date().timeIntervalSince1970 * 1_000)
        let file = folder.appendingPathComponent("\(prefix)\(stamp)-seq\(seq)-pid\(getpid()).json")
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted, .withoutEscapingSlashes]
        try encoder.encode(evidence).write(to: file, options: .atomic)
        // Bounded: the oldest of this store's files go first.
        let mine = try FileManager.default.contentsOfDirectory(atPath: directory).filter {
            $0.hasPrefix(prefix) && $0.hasSuffix(".json")
        }
        for name in mine.sorted().dropLast(maximumFiles) {
            try? FileManager.default.removeItem(at: folder.appendingPathComponent(name))
        }
        return file
    }
}
