import Lockstep
import LockstepProtocol

/// A determinism check for unit tests: seeded action sequences from the domain's own generator, each
/// replayed through the harness. On failure it reports the seed and the shortest failing log it could find.
///
/// ```swift
/// @Test func todosAreDeterministic() throws {
///     try DeterminismCheck(Todos.self).run()
/// }
/// ```
public struct DeterminismCheck<D: ActionGenerating>: Sendable {
    /// How many seeded sequences to try.
    public var sequences = 20
    /// Actions generated per sequence (only those the validator accepts are kept).
    public var length = 200
    /// The first seed; sequence `i` uses `seed + i`.
    public var seed: UInt64 = 1
    /// Replays tried while shrinking a failing log.
    public var shrinkBudget = 200
    /// The harness each sequence is replayed through: its replicas in this process, and its child processes.
    public var harness: ReplayHarness<D>

    /// A check of `domain` with the default counts and seed, replaying with `settings` in this process and in
    /// `children` (each a process with its own hash seed, where `Set` and `Dictionary` order differ).
    public init(
        _ domain: D.Type,
        settings: ReplaySettings = ReplaySettings(),
        children: [ReplayChildCommand] = []
    ) {
        harness = ReplayHarness(settings: settings, children: children)
    }

    /// Throws a ``DeterminismFailure`` for the first sequence whose replicas diverge.
    public func run() throws {
        for index in 0..<sequences {
            let sequenceSeed = seed &+ UInt64(index)
            let actions = Self.generate(length: length, seed: sequenceSeed)
            do {
                _ = try harness.replay(try ReplayLog<D>(actions))
            } catch let divergence as Divergence {
                let (shortest, last) = try shrink(actions, divergence)
                throw DeterminismFailure(seed: sequenceSeed, actions: shortest, divergence: last)
            }
        }
    }

    /// `length` actions from the domain's generator, keeping only those the validator accepts.
    public static func generate(length: Int, seed: UInt64) -> [D.Action] {
        var random = SplitMix64(seed: seed)
        var state = D.initialState
        var actions: [D.Action] = []
        actions.reserveCapacity(length)
        for _ in 0..<length {
            let action = D.randomAction(for: state, using: &random)
            guard (try? D.validate(action, in: state, by: .unknown)) != nil else { continue }
            D.reduce(into: &state, action, by: .unknown)
            actions.append(action)
        }
        return actions
    }

    /// Cuts the log at the divergence, then drops actions one at a time while it still diverges and every
    /// action still passes validation.
    func shrink(_ actions: [D.Action], _ divergence: Divergence) throws -> ([D.Action], Divergence) {
        var best = Array(actions.prefix(Int(divergence.seq)))
        var bestDivergence = divergence
        var budget = shrinkBudget
        var index = 0
        while index < best.count, budget > 0, best.count > 1 {
            budget -= 1
            var candidate = best
            candidate.remove(at: index)
            if Self.isValid(candidate), let failure = try failure(of: candidate) {
                best = Array(candidate.prefix(Int(failure.seq)))
                bestDivergence = failure
            } else {
                index += 1
            }
        }
        return (best, bestDivergence)
    }

    func failure(of actions: [D.Action]) throws -> Divergence? {
        do {
            _ = try harness.replay(try ReplayLog<D>(actions))
            return nil
        } catch let divergence as Divergence {
            return divergence
        }
    }

    static func isValid(_ actions: [D.Action]) -> Bool {
        var state = D.initialState
        for action in actions {
            guard (try? D.validate(action, in: state, by: .unknown)) != nil else { return false }
            D.reduce(into: &state, action, by: .unknown)
        }
        return true
    }
}

/// A domain failed the determinism check: the seed that found it, the shortest log that still fails, and
/// where its replicas part ways.
public struct DeterminismFailure: Error, CustomStringConvertible {
    /// The seed of the sequence that failed: with the check's ``DeterminismCheck/length`` it generates the same actions
    /// again.
    public var seed: UInt64
    /// Actions as JSON, in order.
    public var actions: [String]
    /// Where the replicas part ways in the shortest failing log.
    public var divergence: Divergence

    init<Action: Encodable>(seed: UInt64, actions: [Action], divergence: Divergence) {
        self.seed = seed
        self.actions = actions.map {
            (try? CanonicalEncoding.encode($0)).map { String(decoding: $0, as: UTF8.self) } ?? "?"
        }
        self.divergence = divergence
    }

    /// The seed, the shortest failing log one action per line, and the divergence.
    public var description: String {
        "not deterministic (seed \(seed)); shortest failing log has \(actions.count) actions:\n"
            + actions.enumerated().map { "  \($0.offset + 1): \($0.element)" }.joined(separator: "\n")
            + "\n\(divergence)"
    }
}
