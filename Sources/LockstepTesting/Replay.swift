import Foundation
import Lockstep
import LockstepProtocol

/// What to replay: actions after a starting point (the initial state at seq 0, or a journal's snapshot).
public struct ReplayLog<D: Domain>: Sendable {
    /// The seq the log starts after.
    public var startSeq: SequenceNumber
    /// The state at `startSeq`, as canonical JSON.
    public var startState: [UInt8]
    /// The actions, the first of which has seq `startSeq + 1`.
    public var actions: [D.Action]
    /// Who dispatched each action (the journal's record, docs/security.md); empty when nobody was identified.
    public var authors: [Author] = []
    /// Digests the state must have at some seqs (a journal's snapshots), with the state bytes when known.
    public var expected: [SequenceNumber: (digest: StateDigest, state: [UInt8]?)]
    /// Where ``expected`` comes from, as a divergence names that side.
    public var expectedSource = "the journal's snapshot"

    /// A log from the domain's initial state.
    public init(_ actions: [D.Action]) throws {
        self.init(startSeq: 0, startState: try CanonicalEncoding.bytes(of: D.initialState), actions: actions)
    }

    /// A log that starts after `startSeq` from `startState` (canonical JSON, a journal snapshot's bytes), with the
    /// digests the state must have at some seqs.
    public init(
        startSeq: SequenceNumber,
        startState: [UInt8],
        actions: [D.Action],
        authors: [Author] = [],
        expected: [SequenceNumber: (digest: StateDigest, state: [UInt8]?)] = [:]
    ) {
        self.startSeq = startSeq
        self.startState = startState
        self.actions = actions
        self.authors = authors.contains { !$0.isUnknown } ? authors : []
        self.expected = expected
    }

    /// The author of the `offset`-th action.
    func author(at offset: Int) -> Author { offset < authors.count ? authors[offset] : .unknown }

    /// The seq of the last action.
    public var lastSeq: SequenceNumber { startSeq + SequenceNumber(actions.count) }
}

/// How to replay.
public struct ReplaySettings: Sendable, Codable, Hashable {
    /// Replicas in this process. Replica 0 is the reference and never round-trips its state.
    public var replicas = 3
    /// Compare digests every this many events; `nil`: about 128 times in a log (every event for logs under 256), so
    /// that a long log of a growing state costs what its events cost, not its length times its state. A divergence
    /// between two checkpoints is narrowed to its first seq all the same.
    public var checkpointInterval: Int?
    /// Seeds where each replica encodes and decodes its state, as a snapshot would.
    public var roundTripSeed: UInt64 = 0x5EED
    /// The chance, per event, that a replica other than 0 round-trips its state after applying it.
    public var roundTripRate = 0.02
    /// Seqs after which every replica but 0 round-trips, whatever the seed says.
    public var roundTripAt: Set<SequenceNumber> = []
    /// About the most round trips each replica draws in a log (`roundTripAt` aside): a long log's rate is lowered to
    /// it, since each encodes and decodes the whole state.
    public var maximumRoundTrips = 32

    /// The defaults: three replicas in this process, checkpoints by the log's length, and each replica but the first
    /// round-tripping its state after about 2 % of events.
    public init() {}

    /// About how many checkpoints a log gets when ``checkpointInterval`` is `nil`.
    static var defaultCheckpoints: Int { 128 }

    func interval(for count: Int) -> Int {
        max(1, checkpointInterval ?? count / Self.defaultCheckpoints)
    }
}

/// Where two replicas part ways: the first seq, the action there, and what differs in their states or in the
/// effects the action set going.
public struct Divergence: Error, Sendable, Codable, CustomStringConvertible {
    /// The first seq after which the two states or effects differ: for effects, the first seq whose action set
    /// different effects going on the two sides.
    public var seq: SequenceNumber
    /// The action at that seq, as JSON.
    public var action: String
    /// The side whose state is taken as the reference, e.g. "replica 0 (in process)" or "the journal's snapshot".
    public var left: String
    /// The other side, e.g. "replica 3 (child process)".
    public var right: String
    /// The digest of the left side's state after ``seq``.
    public var leftDigest: StateDigest
    /// The digest of the right side's state after ``seq``.
    public var rightDigest: StateDigest
    /// Path → value on each side, at most 50.
    public var differences: [StateDifference]
    /// The left side's digest of every effect set going up to ``seq`` (a SHA-256 chain, seq by seq); `nil` for a
    /// domain without effects, and for a divergence in the state alone that no replay computed effects for (a live
    /// replica's evidence).
    public var leftEffectsDigest: StateDigest?
    /// The right side's digest of every effect set going up to ``seq``, as ``leftEffectsDigest``.
    public var rightEffectsDigest: StateDigest?
    /// The effects the action at ``seq`` set going on the left side, one `EffectRecord.description` line each
    /// (`run {"notify":{"id":1,"text":"Call Ann"}}`, `cancel "due-1"`; empty: none); `nil` when both sides' agree.
    public var leftEffects: [String]?
    /// The effects the action at ``seq`` set going on the right side, as ``leftEffects``.
    public var rightEffects: [String]?
    /// Path → value between the two sides' effects at ``seq``, at most 50; empty when they agree. The effects are
    /// compared as a JSON array of one object per effect — `kind` (`run`, `schedule`, `cancel`), `body` (the effect's
    /// or the timer action's JSON), `key` and `due` (milliseconds since 1970) — so a path reads `[0].body.stamp` or
    /// `[1].key`.
    public var effectDifferences: [StateDifference] = []
    /// Whether replaying both sides again (from the last seq where they agreed) parted them again. When it did
    /// not, everything above is the first run's, and the divergence depends on process history or global
    /// state — a static or global cache, a counter in a singleton, something keyed by the process's hash seed —
    /// not on the action at ``seq`` alone.
    public var reproduced: Bool = true
    /// Where the re-run started: the last seq at which the two sides agreed (`nil`: the start of the log).
    public var rerunAfter: SequenceNumber?
    /// What else a person should know, e.g. that the reference's own re-run did not match its first run.
    public var note: String?
    /// Why the divergence did not reproduce, in place of the harness's own words (a replica's evidence says it
    /// otherwise).
    public var explanation: String?

    /// Several lines: the seq, both sides and the action, the two digests, then each difference in the states, then
    /// the effects when they differ: both sides' digests, each side's effects at ``seq`` and each difference.
    public var description: String {
        var lines = [
            "divergence at seq \(seq): \(left) and \(right) differ after action \(action)",
            "  \(left): \(leftDigest.hex.prefix(16))…  \(right): \(rightDigest.hex.prefix(16))…",
        ]
        if let explanation {
            lines.append("  \(explanation)")
        } else if !reproduced {
            lines.append(
                "  replayed again from seq \(rerunAfter ?? 0), the two sides did not part at or before seq \(seq): "
                    + "the states here are the first run's, and the divergence depends on process history or global "
                    + "state (a static or global cache, a counter in a singleton, something keyed by the process's "
                    + "hash seed), not on the action at this seq alone"
            )
        }
        if differences.isEmpty, leftDigest != rightDigest {
            lines.append("  the decoded states are equal, but their encodings differ (order of a Set or Dictionary?)")
        }
        if let note { lines.append("  \(note)") }
        lines += differences.map { "  \($0)" }
        lines += effectLines
        return lines.joined(separator: "\n")
    }

    /// The lines about effects: none when both sides' agree (or no effects were computed).
    private var effectLines: [String] {
        guard let leftEffectsDigest, let rightEffectsDigest, leftEffectsDigest != rightEffectsDigest else { return [] }
        let states = leftDigest == rightDigest ? " (the states are equal)" : ""
        var lines = [
            "  effects differ\(states): \(left): \(leftEffectsDigest.hex.prefix(16))…  \(right): "
                + "\(rightEffectsDigest.hex.prefix(16))…"
        ]
        guard let leftEffects, let rightEffects else {
            lines.append(
                "  the effects of the action at seq \(seq) agree: those of an earlier action differ, at or after "
                    + "seq \((rerunAfter ?? 0) + 1)"
            )
            return lines
        }
        for (side, effects) in [(left, leftEffects), (right, rightEffects)] {
            lines.append("  \(side) set going at seq \(seq):")
            lines += effects.isEmpty ? ["    (nothing)"] : effects.map { "    \($0)" }
        }
        lines += effectDifferences.map { "  effects\($0)" }
        return lines
    }

    /// The divergence as one JSON object.
    public var json: String {
        (try? CanonicalEncoding.encode(self)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
    }
}

extension Divergence {
    /// Decodes a divergence's JSON, also one written before the harness compared effects (without their fields)
    /// or before it told whether a divergence reproduced.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        seq = try container.decode(SequenceNumber.self, forKey: .seq)
        action = try container.decode(String.self, forKey: .action)
        left = try container.decode(String.self, forKey: .left)
        right = try container.decode(String.self, forKey: .right)
        leftDigest = try container.decode(StateDigest.self, forKey: .leftDigest)
        rightDigest = try container.decode(StateDigest.self, forKey: .rightDigest)
        differences = try container.decode([StateDifference].self, forKey: .differences)
        leftEffectsDigest = try container.decodeIfPresent(StateDigest.self, forKey: .leftEffectsDigest)
        rightEffectsDigest = try container.decodeIfPresent(StateDigest.self, forKey: .rightEffectsDigest)
        leftEffects = try container.decodeIfPresent([String].self, forKey: .leftEffects)
        rightEffects = try container.decodeIfPresent([String].self, forKey: .rightEffects)
        effectDifferences = try container.decodeIfPresent([StateDifference].self, forKey: .effectDifferences) ?? []
        reproduced = try container.decodeIfPresent(Bool.self, forKey: .reproduced) ?? true
        rerunAfter = try container.decodeIfPresent(SequenceNumber.self, forKey: .rerunAfter)
        note = try container.decodeIfPresent(String.self, forKey: .note)
        explanation = try container.decodeIfPresent(String.self, forKey: .explanation)
    }
}

/// One replica's run: digests at checkpoints, and what it left at the seqs asked for.
struct ReplicaTrace: Sendable {
    var digests: [(seq: SequenceNumber, digest: CheckpointDigest)] = []
    /// The state and effects at the seqs in ``TracePlan/statesAt``, and at ``firstMismatch``.
    var captures: [SequenceNumber: Capture] = [:]
    /// With ``TracePlan/keepsEffects``: the effects of every checkpoint whose action set something going.
    var effects: [SequenceNumber: EffectList] = [:]
    /// With ``TracePlan/captureAgainst``: the first checkpoint whose digest differed (captured in `captures`).
    var firstMismatch: SequenceNumber?
    /// How many actions set effects going.
    var actionsWithEffects = 0
}

/// What a replica run must record.
struct TracePlan: Sendable, Codable, Hashable {
    /// The replica's number: 0 is the reference; the others round-trip at seeded points.
    var replica: Int
    var interval: Int
    /// Extra seqs to record a digest at.
    var checkpoints: Set<SequenceNumber> = []
    /// Seqs to record the encoded state and the effects at.
    var statesAt: Set<SequenceNumber> = []
    /// Another replica's digests at checkpoints: the state and effects at the first checkpoint whose digests differ
    /// from them are recorded, so a divergence is shown with this very run's, not a re-run's.
    var captureAgainst: [SequenceNumber: CheckpointDigest] = [:]
    /// Whether to keep the effects of every checkpoint (the reference does): when a child parts from it, the
    /// reference's effects at that seq are those of the run the child was compared with, even when a re-run's are
    /// not (effects that read the clock).
    var keepsEffects = false
    var settings: ReplaySettings
}

/// Reducing a copy of the state changed the original: they share a mutable reference.
struct SharedReferenceDetected: Error {
    var seq: SequenceNumber
    var before: [UInt8]
    var after: [UInt8]
}

/// One replica part-way through a log: its state, its round-trip draws and what it recorded so far. The harness
/// steps several in lockstep, so that when two part ways both states are at hand from that very run.
struct ReplicaCursor<D: Domain> {
    private(set) var state: D.State
    private var random: SplitMix64
    private let threshold: UInt64
    /// ``EffectChain``'s digest after the last action applied.
    private(set) var effectsDigest = EffectChain.start
    private let coder = CanonicalEncoding.Coder()
    let plan: TracePlan
    private(set) var trace = ReplicaTrace()

    /// A replica at the start of a log of `events` actions.
    init(startState: [UInt8], plan: TracePlan, events: Int) throws {
        state = try CanonicalEncoding.decode(D.State.self, from: Data(startState))
        random = SplitMix64(seed: plan.settings.roundTripSeed &+ UInt64(plan.replica) &* 0x9E37_79B9_7F4A_7C15)
        let rate = min(plan.settings.roundTripRate, Double(plan.settings.maximumRoundTrips) / Double(max(1, events)))
        threshold = UInt64(max(0, min(1, rate)) * Double(UInt64.max))
        self.plan = plan
    }

    /// Applies `action`, the one at `seq` (the `offset`-th of the log), and works out the effects it sets going; at
    /// a checkpoint returns the digests and what the replica left (state and effects), which the trace records too.
    mutating func step(
        _ action: D.Action,
        by author: Author,
        seq: SequenceNumber,
        offset: Int,
        isLast: Bool
    ) throws -> (digest: CheckpointDigest, capture: Capture)? {
        let isCheckpoint = (offset + 1) % plan.interval == 0 || plan.checkpoints.contains(seq)
        if plan.replica == 1, plan.interval == 1 || isCheckpoint {
            // A reducer must not change the state it was handed a copy of. If it does, some reference
            // type is shared between the two values, and replicas that copy at other points part ways.
            let original = state
            let before = try CanonicalEncoding.bytes(of: original)
            D.reduce(into: &state, action, by: author)
            let after = try CanonicalEncoding.bytes(of: original)
            if after != before { throw SharedReferenceDetected(seq: seq, before: before, after: after) }
        } else {
            D.reduce(into: &state, action, by: author)
        }
        var effects = EffectList.none
        let domainEffects = D.effects(of: action, in: state)
        if !domainEffects.isEmpty {
            // From the state the action left, before any round trip: what the daemon journals with the action.
            let records = EffectRecord.records(of: domainEffects, seq: seq, coder: coder)
            effects = try EffectList(records, coder: coder)
            if !records.isEmpty {
                effectsDigest = EffectChain.extend(effectsDigest, seq: seq, with: effects)
                trace.actionsWithEffects += 1
            }
        }
        if plan.replica != 0, plan.settings.roundTripAt.contains(seq) || random.next() < threshold {
            state = try CanonicalEncoding.decode(D.State.self, from: try CanonicalEncoding.encode(state))
        }
        let wantsState = plan.statesAt.contains(seq)
        guard wantsState || isLast || isCheckpoint else { return nil }
        let capture = Capture(
            state: try CanonicalEncoding.bytes(of: state),
            effects: effects,
            effectsDigest: effectsDigest
        )
        let digest = capture.digest
        trace.digests.append((seq, digest))
        if wantsState { trace.captures[seq] = capture }
        if plan.keepsEffects, !effects.lines.isEmpty { trace.effects[seq] = effects }
        if trace.firstMismatch == nil, let other = plan.captureAgainst[seq], other != digest {
            trace.firstMismatch = seq
            trace.captures[seq] = capture
        }
        return (digest, capture)
    }
}

/// Runs one replica over a log; the same code runs in this process and in a child.
enum ReplicaRunner {
    static func run<D: Domain>(
        _: D.Type,
        startSeq: SequenceNumber,
        startState: [UInt8],
        actions: [D.Action],
        authors: [Author] = [],
        plan: TracePlan
    ) throws -> ReplicaTrace {
        var cursor = try ReplicaCursor<D>(startState: startState, plan: plan, events: actions.count)
        for (offset, action) in actions.enumerated() {
            _ = try cursor.step(
                action,
                by: offset < authors.count ? authors[offset] : .unknown,
                seq: startSeq + SequenceNumber(offset + 1),
                offset: offset,
                isLast: offset == actions.count - 1
            )
        }
        return cursor.trace
    }

    /// Runs several replicas in this process in lockstep, action by action, and keeps, for each replica after
    /// the first, what both left (states and effects) at the first checkpoint where its digests differ from the
    /// first's.
    static func runTogether<D: Domain>(
        _: D.Type,
        startSeq: SequenceNumber,
        startState: [UInt8],
        actions: [D.Action],
        authors: [Author] = [],
        plans: [TracePlan],
        progress: ReplayHarness<D>.Progress? = nil
    ) throws -> (traces: [ReplicaTrace], evidence: [Int: FirstRunEvidence]) {
        var cursors = try plans.map { try ReplicaCursor<D>(startState: startState, plan: $0, events: actions.count) }
        var evidence: [Int: FirstRunEvidence] = [:]
        for (offset, action) in actions.enumerated() {
            if let progress, offset % 256 == 0 { progress(.inProcess(replayed: offset, of: actions.count)) }
            let seq = startSeq + SequenceNumber(offset + 1)
            var reference: (digest: CheckpointDigest, capture: Capture)?
            for index in cursors.indices {
                let checkpoint = try cursors[index].step(
                    action,
                    by: offset < authors.count ? authors[offset] : .unknown,
                    seq: seq,
                    offset: offset,
                    isLast: offset == actions.count - 1
                )
                if index == 0 {
                    reference = checkpoint
                } else if let checkpoint, let reference, checkpoint.digest != reference.digest,
                    evidence[index] == nil
                {
                    evidence[index] = FirstRunEvidence(seq: seq, left: reference.capture, right: checkpoint.capture)
                }
            }
        }
        return (cursors.map(\.trace), evidence)
    }
}

/// What both sides left (states and effects) at the first checkpoint where two replicas differed, as that run left
/// them.
struct FirstRunEvidence: Sendable {
    var seq: SequenceNumber
    var left: Capture
    var right: Capture
}

/// Replays a log through several replicas, in this process and in child processes, and reports the first
/// divergence.
public struct ReplayHarness<D: Domain>: Sendable {
    /// How many replicas replay in this process, how often they compare, and where they round-trip their state.
    public var settings: ReplaySettings
    /// Child processes that replay too, each with its own hash seed.
    public var children: [ReplayChildCommand]
    /// Told how far a replay got, now and then, from the thread that replays: for a command line that shows long work.
    public var progress: Progress?

    /// Where a replay is: its replicas in this process, `replayed` actions of `of` in, or child process `index` (from
    /// 0) of `of` started.
    public enum ProgressStep: Sendable {
        case inProcess(replayed: Int, of: Int)
        case child(index: Int, of: Int)
    }

    /// See ``progress``.
    public typealias Progress = @Sendable (ProgressStep) -> Void

    /// A harness with these settings that also replays in `children`.
    public init(settings: ReplaySettings = ReplaySettings(), children: [ReplayChildCommand] = []) {
        self.settings = settings
        self.children = children
    }

    /// A summary of a clean replay.
    public struct Report: Sendable {
        /// How many actions were replayed.
        public var events: Int
        /// How many replicas replayed them, in this process and in children.
        public var replicas: Int
        /// How many digests the reference replica recorded and the others were compared at.
        public var checkpoints: Int
        /// The seq of the last action.
        public var finalSeq: SequenceNumber
        /// The digest of the state after the last action; `nil` for a log with no actions.
        public var finalDigest: StateDigest?
        /// The digest of every effect set going up to the last action, which every replica reached too; `nil` for a
        /// domain without effects or a log with no actions.
        public var finalEffectsDigest: StateDigest?
        /// How many of the actions set effects going (their effects were compared as the states were).
        public var actionsWithEffects = 0
        /// How many of the digests the log says the state must have (a journal's snapshots) the replay reached.
        public var recordedDigestsMatched = 0
    }

    /// Replays `log`; throws the first ``Divergence`` found, or returns a summary.
    public func replay(_ log: ReplayLog<D>) throws -> Report {
        let interval = settings.interval(for: log.actions.count)
        let expectedSeqs = Set(log.expected.keys)
        var sides = (0..<max(1, settings.replicas)).map { Side.inProcess(replica: $0) }
        sides += children.enumerated().map { Side.child($0.element, replica: settings.replicas + $0.offset) }
        let traces: [ReplicaTrace]
        let evidence: [Int: FirstRunEvidence]
        do {
            // The replicas of this process step together, so that where two part ways both states are kept from
            // this very run; each child is told the reference's digests and keeps its own state where it differs.
            let local = sides.filter { if case .inProcess = $0 { true } else { false } }
            let together = try ReplicaRunner.runTogether(
                D.self,
                startSeq: log.startSeq,
                startState: log.startState,
                actions: log.actions,
                authors: log.authors,
                plans: local.map { plan(for: $0, interval: interval, checkpoints: expectedSeqs) },
                progress: progress
            )
            let referenceDigests = Dictionary(together.traces[0].digests.map { ($0.seq, $0.digest) }) { a, _ in a }
            let children = try sides.dropFirst(local.count).enumerated().map { index, side in
                progress?(.child(index: index, of: sides.count - local.count))
                var childPlan = plan(for: side, interval: interval, checkpoints: expectedSeqs)
                childPlan.captureAgainst = referenceDigests
                return try trace(side, log, childPlan)
            }
            traces = together.traces + children
            evidence = together.evidence
        } catch let shared as SharedReferenceDetected {
            throw divergence(
                at: shared.seq,
                log: log,
                left: "the state before seq \(shared.seq)",
                right: "the same state after a copy of it was reduced (a shared reference type?)",
                leftDigest: StateDigest(of: shared.before),
                rightDigest: StateDigest(of: shared.after),
                leftState: shared.before,
                rightState: shared.after
            )
        }

        if let reference = traces.first {
            // The journal's own snapshots first: they are what the daemon served.
            let referenceDigests = Dictionary(reference.digests.map { ($0.seq, $0.digest) }) { first, _ in first }
            for seq in expectedSeqs.sorted() {
                // A journal records the state's digest: effects are compared between replicas only.
                guard let expected = log.expected[seq], let digest = referenceDigests[seq]?.state,
                    digest != expected.digest
                else { continue }
                let replayed = try trace(sides[0], log, plan(for: sides[0], interval: interval, statesAt: [seq]))
                throw divergence(
                    at: seq,
                    log: log,
                    left: log.expectedSource,
                    right: sides[0].name,
                    leftDigest: expected.digest,
                    rightDigest: digest,
                    leftState: expected.state ?? [],
                    rightState: replayed.captures[seq]?.state ?? []
                )
            }
        }
        for (index, trace) in traces.enumerated().dropFirst() {
            guard let mismatch = firstMismatch(traces[0], trace) else { continue }
            var firstRun = evidence[index]
            var note: String?
            if firstRun == nil, let right = trace.captures[mismatch.seq] {
                // A child kept its own state; the reference's comes from replaying it again in this process, and its
                // effects there from its first run, which kept them.
                let again = try self.trace(
                    sides[0],
                    log,
                    plan(for: sides[0], interval: interval, statesAt: [mismatch.seq])
                )
                let left = again.captures[mismatch.seq]?.state ?? []
                let firstDigest = traces[0].digests.first { $0.seq == mismatch.seq }?.digest
                if StateDigest(of: left) != firstDigest?.state {
                    note =
                        "the reference's state is from a re-run that did not match its own first run at seq "
                        + "\(mismatch.seq): this process's history changed what the reducer does"
                }
                let reference = Capture(
                    state: left,
                    effects: traces[0].effects[mismatch.seq] ?? .none,
                    effectsDigest: firstDigest?.effects ?? EffectChain.start
                )
                firstRun = FirstRunEvidence(seq: mismatch.seq, left: reference, right: right)
            }
            try narrow(
                log,
                sides[0],
                sides[index],
                after: mismatch.previous,
                upTo: mismatch.seq,
                interval: interval,
                firstRun: firstRun,
                note: note
            )
        }
        return Report(
            events: log.actions.count,
            replicas: sides.count,
            checkpoints: traces.first?.digests.count ?? 0,
            finalSeq: log.lastSeq,
            finalDigest: traces.first?.digests.last?.digest.state,
            // A domain that declares no Effect type may still set timers.
            finalEffectsDigest: D.hasEffects || (traces.first?.actionsWithEffects ?? 0) > 0
                ? traces.first?.digests.last?.digest.effects : nil,
            actionsWithEffects: traces.first?.actionsWithEffects ?? 0,
            recordedDigestsMatched: expectedSeqs.count
        )
    }

    enum Side: Sendable {
        case inProcess(replica: Int)
        case child(ReplayChildCommand, replica: Int)

        var replica: Int {
            switch self {
            case let .inProcess(replica), let .child(_, replica): replica
            }
        }

        var name: String {
            switch self {
            case let .inProcess(replica): "replica \(replica) (in process)"
            case let .child(_, replica): "replica \(replica) (child process)"
            }
        }
    }

    func plan(
        for side: Side,
        interval: Int,
        checkpoints: Set<SequenceNumber> = [],
        statesAt: Set<SequenceNumber> = []
    ) -> TracePlan {
        var plan = TracePlan(
            replica: side.replica,
            interval: interval,
            checkpoints: checkpoints,
            statesAt: statesAt,
            settings: settings
        )
        if case .inProcess(replica: 0) = side { plan.keepsEffects = true }
        return plan
    }

    func trace(_ side: Side, _ log: ReplayLog<D>, _ plan: TracePlan) throws -> ReplicaTrace {
        switch side {
        case .inProcess:
            try ReplicaRunner.run(
                D.self,
                startSeq: log.startSeq,
                startState: log.startState,
                actions: log.actions,
                authors: log.authors,
                plan: plan
            )
        case let .child(command, _):
            try command.run(D.self, log: log, plan: plan)
        }
    }

    /// The first checkpoint where two traces differ, and the last one before it where they agreed.
    func firstMismatch(
        _ left: ReplicaTrace,
        _ right: ReplicaTrace
    )
        -> (previous: SequenceNumber?, seq: SequenceNumber)?
    {
        let rightDigests = Dictionary(right.digests.map { ($0.seq, $0.digest) }) { first, _ in first }
        var previous: SequenceNumber?
        for (seq, digest) in left.digests {
            guard let other = rightDigests[seq] else { continue }
            if other != digest { return (previous, seq) }
            previous = seq
        }
        return nil
    }

    /// Replays both sides again with a checkpoint at every seq in the window and throws the divergence at the first
    /// seq where they part — in their states, or in the effects of the action there, since the effects digest chains
    /// every seq's effects — with what both left from that re-run. When the re-run does not part them, it throws the
    /// first run's evidence at `seq` and says the divergence did not reproduce.
    func narrow(
        _ log: ReplayLog<D>,
        _ left: Side,
        _ right: Side,
        after previous: SequenceNumber?,
        upTo seq: SequenceNumber,
        interval: Int,
        firstRun: FirstRunEvidence?,
        note: String?
    ) throws -> Never {
        let window = Set(((previous ?? log.startSeq) + 1)...seq)
        var again: FirstRunEvidence?
        if case .inProcess = right {
            let together = try ReplicaRunner.runTogether(
                D.self,
                startSeq: log.startSeq,
                startState: log.startState,
                actions: log.actions,
                authors: log.authors,
                plans: [left, right].map { plan(for: $0, interval: interval, checkpoints: window) }
            )
            again = together.evidence[1]
        } else {
            let leftTrace = try trace(left, log, plan(for: left, interval: interval, checkpoints: window))
            var rightPlan = plan(for: right, interval: interval, checkpoints: window)
            rightPlan.captureAgainst = Dictionary(leftTrace.digests.map { ($0.seq, $0.digest) }) { a, _ in a }
            let rightTrace = try trace(right, log, rightPlan)
            if let first = rightTrace.firstMismatch, let rightCapture = rightTrace.captures[first],
                let leftDigest = leftTrace.digests.first(where: { $0.seq == first })?.digest
            {
                // The left side's state comes from one more run, which must reach the same state; its effects are
                // those of the run the right side was compared with (kept by `keepsEffects`), as another run's may
                // differ when the effects read the clock.
                let leftAgain = try trace(left, log, plan(for: left, interval: interval, statesAt: [first]))
                if let leftBytes = leftAgain.captures[first]?.state, StateDigest(of: leftBytes) == leftDigest.state {
                    let leftCapture = Capture(
                        state: leftBytes,
                        effects: leftTrace.effects[first] ?? .none,
                        effectsDigest: leftDigest.effects
                    )
                    again = FirstRunEvidence(seq: first, left: leftCapture, right: rightCapture)
                }
            }
        }
        if let again, again.seq <= seq {
            throw divergence(log: log, left: left.name, right: right.name, again)
        }
        let evidence = firstRun ?? FirstRunEvidence(seq: seq, left: .empty, right: .empty)
        var divergence = divergence(log: log, left: left.name, right: right.name, evidence)
        divergence.reproduced = false
        divergence.rerunAfter = previous ?? log.startSeq
        divergence.note = note
        throw divergence
    }

    /// The divergence between what two replicas left at `evidence.seq`: their states, and the effects of the action
    /// there when the domain has effects.
    func divergence(log: ReplayLog<D>, left: String, right: String, _ evidence: FirstRunEvidence) -> Divergence {
        var divergence = divergence(
            at: evidence.seq,
            log: log,
            left: left,
            right: right,
            leftDigest: StateDigest(of: evidence.left.state),
            rightDigest: StateDigest(of: evidence.right.state),
            leftState: evidence.left.state,
            rightState: evidence.right.state
        )
        let effectsDiffer =
            evidence.left.effectsDigest != evidence.right.effectsDigest
            || evidence.left.effects != evidence.right.effects
        guard D.hasEffects || effectsDiffer else { return divergence }
        divergence.leftEffectsDigest = evidence.left.effectsDigest
        divergence.rightEffectsDigest = evidence.right.effectsDigest
        if evidence.left.effects != evidence.right.effects {
            divergence.leftEffects = evidence.left.effects.lines
            divergence.rightEffects = evidence.right.effects.lines
            divergence.effectDifferences = StateDiff.compare(evidence.left.effects.bytes, evidence.right.effects.bytes)
        }
        return divergence
    }

    /// The divergence between two states at `seq`.
    func divergence(
        at seq: SequenceNumber,
        log: ReplayLog<D>,
        left: String,
        right: String,
        leftDigest: StateDigest,
        rightDigest: StateDigest,
        leftState: [UInt8],
        rightState: [UInt8]
    ) -> Divergence {
        let index = Int(seq - log.startSeq) - 1
        let action =
            log.actions.indices.contains(index)
            ? (try? CanonicalEncoding.encode(log.actions[index])).map { String(decoding: $0, as: UTF8.self) } ?? "?"
            : "(none)"
        return Divergence(
            seq: seq,
            action: action,
            left: left,
            right: right,
            leftDigest: leftDigest,
            rightDigest: rightDigest,
            differences: StateDiff.compare(leftState, rightState)
        )
    }
}
