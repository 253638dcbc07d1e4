import Foundation
import Lockstep
import LockstepClient
import LockstepProtocol

extension DivergenceEvidence {
    /// Why evidence cannot be replayed by this build.
    public struct Unreplayable: Error, Sendable, CustomStringConvertible {
        /// What is missing or does not fit, and what to do.
        public var description: String
    }

    /// Replays the evidence's actions from the state both sides agreed on through this build's `D`, the way
    /// ``ReplayHarness`` replays any log, and returns the divergence to report:
    ///
    /// - the harness's own, when replicas here part ways or miss the daemon's digest at `divergentSeq`
    ///   (the reducer is nondeterministic here too, or this build's reducer is not the daemon's);
    /// - otherwise the replica's state against a replay here that reaches the daemon's digest, marked not
    ///   reproduced: the same actions from the same state give the daemon's state here, so the replica's process
    ///   reached another through its own history or global state (or it ran another build: see `build`).
    public func replay<D: Domain>(
        _: D.Type,
        settings: ReplaySettings = ReplaySettings(),
        children: [ReplayChildCommand] = []
    ) throws -> Divergence {
        guard store == D.name, domainVersion == D.version else {
            throw Unreplayable(
                description: "the evidence is of store '\(store)' version \(domainVersion); this build's domain is "
                    + "'\(D.name)' version \(D.version)"
            )
        }
        guard let actions else {
            throw Unreplayable(
                description: "the replica kept no actions: more than its maximumEvidenceBytes came between seq "
                    + "\(agreedSeq) and seq \(divergentSeq); raise it, or compare the two states in the file by hand"
            )
        }
        guard let daemon = StateDigest(hex: daemonDigest) else {
            throw Unreplayable(description: "the evidence's daemonDigest is not 64 hex digits: \(daemonDigest)")
        }
        let decoder = JSONDecoder()
        let decoded = try actions.enumerated().map { offset, text in
            do {
                return try decoder.decode(D.Action.self, from: Data(text.utf8))
            } catch {
                throw Unreplayable(
                    description: "the action at seq \(agreedSeq + UInt64(offset) + 1) is not an action of '\(D.name)': "
                        + CanonicalEncoding.describe(error)
                )
            }
        }
        var log = ReplayLog<D>(
            startSeq: agreedSeq,
            startState: Array(agreedState.utf8),
            actions: decoded,
            authors: (authors ?? []).map { Author($0) },
            expected: [:]
        )
        let harness = ReplayHarness<D>(settings: settings, children: children)
        var plan = harness.plan(for: .inProcess(replica: 0), interval: settings.interval(for: decoded.count))
        plan.statesAt = [divergentSeq]
        let replayed =
            try ReplicaRunner.run(
                D.self,
                startSeq: log.startSeq,
                startState: log.startState,
                actions: log.actions,
                authors: log.authors,
                plan: plan
            ).captures[divergentSeq]?.state ?? []
        // The daemon's digest is of the state's digest form; the harness compares canonical states. A replay here
        // whose digest form has the daemon's digest stands for it with its canonical bytes (the same, unless the
        // state holds a `DigestedDictionary`); one that has another keeps the daemon's, which it then misses.
        let replayedForm = (try? CanonicalEncoding.decode(D.State.self, from: Data(replayed)))
            .flatMap { try? CanonicalEncoding.digestForm(of: $0) }
        log.expected = [divergentSeq: (replayedForm?.digest == daemon ? StateDigest(of: replayed) : daemon, nil)]
        log.expectedSource = "the daemon's digest"
        do {
            _ = try harness.replay(log)
        } catch let divergence as Divergence {
            return divergence
        }
        let replica = Array(replicaState.utf8)
        var divergence = harness.divergence(
            at: divergentSeq,
            log: log,
            left: "a replay here (it reaches the daemon's digest)",
            right: "the replica that wrote the evidence",
            leftDigest: StateDigest(of: replayed),
            rightDigest: StateDigest(of: replica),
            leftState: replayed,
            rightState: replica
        )
        divergence.reproduced = false
        divergence.rerunAfter = agreedSeq
        divergence.explanation =
            "the same actions from the state at seq \(agreedSeq) reach the daemon's digest here, but the replica "
            + "(\(build)) reached another state: its reducer depends on its process's history or global state (a "
            + "static or global cache, a singleton, the hash seed), or it ran a build whose reducer is not this one"
        return divergence
    }
}
