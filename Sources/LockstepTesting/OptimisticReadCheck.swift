import Lockstep
import LockstepClient
import LockstepProtocol

/// Checks an `OptimisticRead` from outside the replica, by the domain's own rules: the optimistic state must be
/// the base with every pending dispatch that passes the domain's validator (on the state before it) applied by its
/// reducer, in order; the dispatches it leaves out must be exactly those that do not pass; and no dispatch the base
/// already holds (accepted in its epoch at seqs up to its seq) may still be pending.
///
/// A UI that shows pending badges beside the state relies on exactly this. Call it in a subscriber of
/// `Replica.subscribe(optimistic:onChange:)` or on each element of `Replica.reads(bufferingPolicy:)`.
public enum OptimisticReadCheck {
    /// What is wrong with `read`, one line each; empty when it agrees with itself.
    public static func problems<D: Domain>(_ read: OptimisticRead<D>) -> [String] {
        var problems: [String] = []
        var state = read.base.state
        for entry in read.pending {
            var scratch = state
            var passes = true
            for action in entry.actions {
                do throws(Rejection) {
                    try D.validate(action, in: scratch, by: .unknown)
                } catch {
                    passes = false
                    break
                }
                D.reduce(into: &scratch, action, by: .unknown)
            }
            if passes { state = scratch }
            if passes == entry.isLeftOut {
                problems.append(
                    "pending #\(entry.requestNumber) is \(entry.isLeftOut ? "" : "not ")left out, but it "
                        + "\(passes ? "passes" : "does not pass") the validator on the state before it"
                )
            }
            if case let .accepted(epoch, seqs) = entry.status, epoch == read.base.epoch,
                seqs.upperBound <= read.base.seq
            {
                problems.append(
                    "pending #\(entry.requestNumber) was accepted at seqs \(seqs), which the base (seq "
                        + "\(read.base.seq)) holds"
                )
            }
        }
        if state != read.state {
            problems.append(
                "read \(read.version): the optimistic state is not the base (seq \(read.base.seq)) with its "
                    + "\(read.pending.count) pending dispatches applied"
            )
        }
        return problems
    }
}
