import Foundation
import Lockstep
import LockstepProtocol

/// What two replicas compare at a checkpoint: the digest of the state, and the digest of every effect set going so
/// far. Effects are a pure function of the action and the state it left, like the state itself, so two replicas must
/// agree on both at every seq; the daemon journals what its own replica computes, and a domain whose effects read
/// the clock or a counter would journal one thing and replay another.
struct CheckpointDigest: Hashable, Sendable, Codable {
    /// The SHA-256 of the state's canonical JSON.
    var state: StateDigest
    /// The chain of effects up to this seq (``EffectChain``): one digest stands for every effect so far, so a
    /// difference at any seq shows at every later checkpoint, and narrowing finds the first seq that differs.
    var effects: StateDigest
}

/// The running digest of every effect a replica's actions set going: SHA-256 of the previous digest, the seq as 8
/// big-endian bytes and that seq's ``EffectList`` bytes, for each seq whose action set something going. A seq
/// that sets nothing going leaves it as it was, so a domain without effects keeps ``start`` throughout and pays
/// nothing per action.
enum EffectChain {
    /// The digest before any effect: that of no bytes.
    static let start = StateDigest(of: [UInt8]())

    /// The digest after `previous` once the action at `seq` set `effects` going.
    static func extend(_ previous: StateDigest, seq: SequenceNumber, with effects: EffectList) -> StateDigest {
        guard !effects.lines.isEmpty else { return previous }
        var bytes = previous.bytes
        bytes.reserveCapacity(40 + effects.bytes.count)
        withUnsafeBytes(of: seq.bigEndian) { bytes.append(contentsOf: $0) }
        bytes.append(contentsOf: effects.bytes)
        return StateDigest(of: bytes)
    }
}

/// The effects one action set going, in a canonical form two replicas can compare byte for byte and diff path by
/// path, and as the lines a person reads (`EffectRecord.description`).
struct EffectList: Hashable, Sendable {
    /// A JSON array, one object per effect in the action's order, with sorted members: `kind` (`run`, `schedule`,
    /// `cancel`), `body` (the effect's or the timer action's JSON, absent for a cancel), `key` and `due` (milliseconds
    /// since 1970) when the effect has them, `failure` when it could not be encoded. `[]` when the action set nothing going.
    var bytes: [UInt8]
    /// One line per effect: `run {"notify":{"id":1,"text":"Call Ann"}}`, `cancel "due-1"`.
    var lines: [String]

    /// No effects.
    static let none = EffectList(bytes: Array("[]".utf8), lines: [])

    init(bytes: [UInt8], lines: [String]) {
        self.bytes = bytes
        self.lines = lines
    }

    /// The list of `records`, all of one action. Their bodies are canonical JSON already, so they are copied in
    /// as they are rather than parsed and written again.
    init(_ records: [EffectRecord], coder: CanonicalEncoding.Coder) throws {
        guard !records.isEmpty else {
            self = .none
            return
        }
        var bytes: [UInt8] = [UInt8(ascii: "[")]
        for (index, record) in records.enumerated() {
            if index > 0 { bytes.append(UInt8(ascii: ",")) }
            // Members in sorted order — body, due, failure, key, kind — so the bytes are canonical JSON.
            var members: [[UInt8]] = []
            if !record.body.isEmpty { members.append(Array(#""body":"#.utf8) + record.body) }
            if let due = record.dueMilliseconds { members.append(Array(#""due":\#(due)"#.utf8)) }
            if let failure = record.failure { members.append(Array(#""failure":"#.utf8) + (try coder.encode(failure))) }
            if let key = record.key { members.append(Array(#""key":"#.utf8) + (try coder.encode(key))) }
            members.append(Array(#""kind":"\#(Self.name(of: record.kind))""#.utf8))
            bytes.append(UInt8(ascii: "{"))
            bytes.append(contentsOf: members.joined(separator: [UInt8(ascii: ",")]))
            bytes.append(UInt8(ascii: "}"))
        }
        bytes.append(UInt8(ascii: "]"))
        self.init(bytes: bytes, lines: records.map(\.description))
    }

    private static func name(of kind: EffectRecord.Kind) -> String {
        switch kind {
        case .run: "run"
        case .schedule: "schedule"
        case .cancel: "cancel"
        }
    }
}

/// What a replica left at one seq, as a divergence shows it: its state, the effects the action at that seq set
/// going, and the chain of effects up to there.
struct Capture: Sendable {
    /// The state's canonical JSON.
    var state: [UInt8]
    /// The effects of the action at this seq.
    var effects: EffectList
    /// ``EffectChain``'s digest after this seq.
    var effectsDigest: StateDigest

    /// Nothing captured: the fallback when a side kept no state.
    static let empty = Capture(state: [], effects: .none, effectsDigest: EffectChain.start)

    /// The digests a checkpoint compares.
    var digest: CheckpointDigest { CheckpointDigest(state: StateDigest(of: state), effects: effectsDigest) }
}
