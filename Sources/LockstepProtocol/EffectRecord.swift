import Foundation
import Lockstep

/// One thing an action set going (`DomainEffect`), as the daemon journals it with the action, in the same
/// transaction: its place — the action's seq and its index in the action's list, the effect's stable id — what kind
/// it is, and its canonical JSON.
public struct EffectRecord: Hashable, Sendable, CustomStringConvertible {
    /// What the effect asks for.
    public enum Kind: UInt8, Hashable, Sendable {
        /// Run the domain's effect (`DomainEffect.run`): ``EffectRecord/body`` is the effect's JSON.
        case run = 0
        /// Set a timer (`DomainEffect.schedule(_:atMilliseconds:key:)`): ``EffectRecord/body`` is the action's JSON.
        case schedule = 1
        /// Cancel a timer (`DomainEffect.cancel`): no body.
        case cancel = 2
    }

    /// The seq of the action that set it going.
    public var seq: SequenceNumber
    /// Its index in that action's list, from 0.
    public var index: Int
    /// What it asks for.
    public var kind: Kind
    /// The effect's JSON (run), the timer's action's JSON (schedule), nothing (cancel): canonical.
    public var body: Frame
    /// The timer's key (schedule, cancel).
    public var key: String?
    /// When the timer is due, in milliseconds since 1970 (schedule).
    public var dueMilliseconds: Int64?
    /// Why the effect, or the timer's action, could not be encoded as JSON (its body is then empty): the daemon keeps
    /// it as a dead letter with this error, since the action stands (docs/effects.md, "Failures").
    public var failure: String?

    /// An effect record, field by field.
    public init(
        seq: SequenceNumber,
        index: Int,
        kind: Kind,
        body: Frame,
        key: String? = nil,
        dueMilliseconds: Int64? = nil,
        failure: String? = nil
    ) {
        self.seq = seq
        self.index = index
        self.kind = kind
        self.body = body
        self.key = key
        self.dueMilliseconds = dueMilliseconds
        self.failure = failure
    }

    /// The records of `effects`, set going by the action at `seq`, in their canonical form. One that cannot be
    /// encoded is a record with an empty body and its ``failure``.
    public static func records<D: Domain>(
        of effects: [DomainEffect<D>],
        seq: SequenceNumber,
        coder: CanonicalEncoding.Coder
    ) -> [EffectRecord] {
        effects.enumerated().map { index, effect in
            switch effect {
            case let .run(value):
                var record = EffectRecord(seq: seq, index: index, kind: .run, body: [])
                encode(value, into: &record, coder)
                return record
            case let .schedule(action, due, key):
                var record = EffectRecord(
                    seq: seq,
                    index: index,
                    kind: .schedule,
                    body: [],
                    key: key,
                    dueMilliseconds: due
                )
                encode(action, into: &record, coder)
                return record
            case let .cancel(key):
                return EffectRecord(seq: seq, index: index, kind: .cancel, body: [], key: key)
            }
        }
    }

    private static func encode(
        _ value: some Encodable,
        into record: inout EffectRecord,
        _ coder: CanonicalEncoding.Coder
    ) {
        do {
            record.body = try coder.encode(value)
        } catch {
            record.failure = "cannot be encoded as JSON: \(CanonicalEncoding.describe(error))"
        }
    }

    /// One line: `run {"notify":{"card":3}}`, `schedule {"flag":{"card":3}} at 1764234000000 as "due-3"`,
    /// `cancel "due-3"`.
    public var description: String {
        let json = failure.map { "(\($0))" } ?? String(decoding: body, as: UTF8.self)
        switch kind {
        case .run: return "run \(json)"
        case .schedule: return "schedule \(json) at \(dueMilliseconds ?? 0) as \"\(key ?? "")\""
        case .cancel: return "cancel \"\(key ?? "")\""
        }
    }
}
