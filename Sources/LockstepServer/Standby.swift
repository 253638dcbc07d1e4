import Foundation
import Lockstep
import LockstepJournal
import LockstepProtocol
import Logging
import ZeroMQ

/// The loop of a daemon that does not hold its PostgreSQL journal's lease: it answers STATUS (role `standby`, the
/// leader's name, term and lease expiry), refuses DISPATCH, SNAPSHOT and RANGE with `not_leader`, answers CURVE
/// handshakes, pets the watchdog, and tries to take the lease on the journal writer's thread — every third of the
/// lease, or as soon as the holder's expires — so that a slow or unreachable database never holds the loop. Once
/// it has the lease (or still had it, after a failed commit), the writer's thread renews it — waiting, up to a
/// lease, for a commit of the previous leader in flight — and recovers every store, while the loop goes on as here;
/// a recovery that fails lets the lease go and stands by to try again.
struct Standby {
    let loop: CommandLoop
    let journal: PostgresJournal
    let writer: JournalWriter
    /// The leader as the last attempt read it; `nil` before one did, or when the last attempt failed.
    var leader: JournalLeader?
    /// Why the last attempt failed, when it did.
    var problem: String?
    var nextAttempt = ContinuousClock.now
    /// Whether the writer is trying to take the lease.
    var attempting = false
    /// The lease taken, while the writer renews it and recovers the stores.
    var recovering: CommandLoop.Takeover?
    var lastWatchdog = ContinuousClock.now
    /// What the writer's last attempt found, handed back through the writer's result.
    let outcome = LockedValue<LeaseOutcome?>(nil)
    /// What the writer's recovery made, or why it failed.
    let recovery = LockedValue<Result<(sequencer: Sequencer, fencedAt: ContinuousClock.Instant), RecoveryFailure>?>(nil)
    let limits: Limits

    /// Why a recovery on the writer's thread failed.
    struct RecoveryFailure: Error {
        var description: String
    }

    /// A standby that tries to take the lease when `leader`'s expires; with `recoveringTerm`, one that still holds
    /// the lease with that term and recovers at once (after a failed commit).
    init(
        loop: CommandLoop,
        journal: PostgresJournal,
        writer: JournalWriter,
        leader: JournalLeader?,
        recoveringTerm: UInt64? = nil
    ) {
        self.loop = loop
        self.journal = journal
        self.writer = writer
        self.leader = leader
        limits = Limits(
            maximumBatch: loop.configuration.maximumBatch,
            maximumActionBytes: loop.configuration.maximumMessageBytes
        )
        if let leader { nextAttempt = .now + Self.wait(for: leader, lease: journal.lease) }
        if let recoveringTerm {
            recovering = CommandLoop.Takeover(
                term: recoveringTerm,
                previousHolder: journal.lease.holder,
                since: .now,
                afterFailedCommit: true
            )
        }
    }

    /// The first attempt, before anything is bound: a daemon that leads at once recovers before it binds.
    static func acquireAtStart(_ journal: PostgresJournal, logger: Logger) throws -> LeaseOutcome {
        do {
            return try journal.acquireLease()
        } catch {
            throw ServerError(code: .journal, "cannot take or read the PostgreSQL journal's lease: \(error)")
        }
    }

    /// How long to wait before the next attempt: a third of the lease, or until the holder's lease expires.
    static func wait(for leader: JournalLeader, lease: PostgresLease) -> Duration {
        min(lease.duration / 3, max(leader.expiresIn, .milliseconds(10)))
    }

    var logger: Logger { loop.logger }

    /// Stands by until the lease is taken (its term and the previous holder) or the daemon is asked to stop (`nil`).
    mutating func wait(_ sockets: inout LoopSockets) throws -> CommandLoop.Takeover? {
        announce()
        if recovering != nil { recover() }
        while !loop.isStopping {
            if !attempting, recovering == nil, ContinuousClock.now >= nextAttempt {
                attempting = true
                let journal = journal
                let outcome = outcome
                writer.submit { () throws(JournalError) in
                    let found = try journal.acquireLease()
                    outcome.withLockedValue { $0 = found }
                }
            }
            var items: [Poller.Item] = [
                .fileDescriptor(loop.wakeup.descriptor, .readable), .socket(sockets.router, .readable),
            ]
            if let zap = sockets.zap { items.append(.socket(zap, .readable)) }
            var deadline = attempting || recovering != nil ? ContinuousClock.now + .seconds(1) : nextAttempt
            if let interval = loop.notifier.watchdogInterval { deadline = min(deadline, lastWatchdog + interval) }
            let ready = try Poller(items).poll(timeout: max(deadline - ContinuousClock.now, .zero))
            if ready[0].contains(.readable) { loop.wakeup.drain() }
            if let result = writer.takeResult() {
                if recovering != nil {
                    if let takeover = recovered(result) { return takeover }
                } else {
                    attempting = false
                    if let takeover = attempted(result) {
                        recovering = takeover
                        announce()
                        recover()
                    }
                }
            }
            for (envelope, reply) in loop.takeReplies().replies { sockets.send(reply, to: envelope) }
            try sockets.serveAuthentication()
            // Subscriptions made now are sent once: kept for the next leadership.
            _ = sockets.readSubscriptions()
            var received = 0
            while received < 1_024,
                let message = try sockets.router.receive(wait: false, maximumFrames: limits.maximumBatch + 4)
            {
                let frames = message.frames
                let split = frames.count >= 2 && frames[1].isEmpty ? 2 : 1
                let envelope = Array(frames.prefix(split))
                sockets.send(answer(Array(frames.dropFirst(split)), message.droppedFrames, sockets), to: envelope)
                received += 1
            }
            if let interval = loop.notifier.watchdogInterval, ContinuousClock.now - lastWatchdog >= interval {
                loop.notifier.notify("WATCHDOG=1")
                lastWatchdog = ContinuousClock.now
            }
        }
        // An attempt or a recovery in flight is waited for; a lease it took is let go when the journal closes.
        if attempting || recovering != nil { _ = writer.waitForResult() }
        return nil
    }

    /// Hands the writer the renewal and recovery of the lease just taken.
    func recover() {
        let journal = journal
        let loop = loop
        let recovery = recovery
        recovery.withLockedValue { $0 = nil }
        writer.submit { () throws(JournalError) in
            let sent = ContinuousClock.now
            do {
                // The fence first: it waits for a commit of the previous leader in flight, so recovery reads all
                // it made durable.
                try journal.renewLease()
                let sequencer = try loop.recoverStores(journal)
                recovery.withLockedValue { $0 = .success((sequencer, sent)) }
            } catch {
                // Another daemon may recover where this one cannot (a newer build, a reachable database).
                try? journal.releaseLease()
                recovery.withLockedValue { $0 = .failure(RecoveryFailure(description: "\(error)")) }
            }
        }
    }

    /// The takeover, once the writer has recovered the stores; otherwise logs why it could not and stands by.
    mutating func recovered(_ result: Result<Void, JournalError>) -> CommandLoop.Takeover? {
        guard var takeover = recovering else { return nil }
        recovering = nil
        switch recovery.withLockedValue({ $0 }) {
        case let .success(recovered)?:
            takeover.recovered = recovered
            return takeover
        case let .failure(failure)?:
            logger.error(
                "could not recover after taking the lease: let it go, standing by to try again",
                metadata: ["error": "\(failure.description)", "name": "\(journal.lease.holder)"]
            )
            problem = "could not recover: \(failure.description)"
        case nil:
            problem = "could not recover: \(result)"
        }
        leader = nil
        nextAttempt = .now + journal.lease.duration / 3
        announce()
        return nil
    }

    /// The takeover when the attempt took the lease; otherwise notes who leads (or why it failed) and when to try
    /// again.
    mutating func attempted(_ result: Result<Void, JournalError>) -> CommandLoop.Takeover? {
        let duration = journal.lease.duration
        switch (result, outcome.withLockedValue { $0 }) {
        case let (.success, .leading(term, previousHolder)?):
            return CommandLoop.Takeover(term: term, previousHolder: previousHolder, since: .now)
        case let (.success, .standingBy(found)?):
            let changed = found.holder != leader?.holder || found.term != leader?.term || problem != nil
            leader = found
            problem = nil
            nextAttempt = .now + Self.wait(for: found, lease: journal.lease)
            if changed { announce() }
        case let (.failure(error), _):
            if problem != "\(error)" {
                logger.warning("standing by: could not try to take the lease", metadata: ["error": "\(error)"])
            }
            problem = "\(error)"
            leader = nil
            nextAttempt = .now + duration / 3
        case (.success, nil):
            nextAttempt = .now + duration / 3
        }
        return nil
    }

    /// Tells systemd and the log who leads.
    func announce() {
        if let recovering {
            logger.notice(
                "recovering the stores before serving",
                metadata: ["name": "\(journal.lease.holder)", "term": "\(recovering.term)"]
            )
            loop.notifier.notify(
                "READY=1\nSTATUS=standby, recovering the stores to lead (term \(recovering.term))"
            )
            return
        }
        let who = leader.map { "leader \($0.holder) term \($0.term)" } ?? "leader unknown"
        logger.notice(
            "standing by: another daemon leads the journal",
            metadata: [
                "name": "\(journal.lease.holder)", "leader": "\(leader?.holder ?? "unknown")",
                "term": "\(leader?.term ?? 0)", "expiresAt": "\(leader?.expiresAt ?? "")",
            ]
        )
        loop.notifier.notify("READY=1\nSTATUS=standby, \(who)")
    }

    /// A standby's answer to one request: STATUS, or `not_leader`, or the error that reading it found.
    func answer(_ body: [Frame], _ droppedFrames: Int, _ sockets: LoopSockets) -> Reply {
        let request: Request
        switch readRequest(body, droppedFrames, limits, logger) {
        case let .success(read): request = read
        case let .failure(refusal): return refusal.reply
        }
        switch request {
        case let .status(requestID):
            return .status(requestID: requestID, json: Array(status(sockets).utf8))
        case let .dispatch(dispatch):
            return notLeader(dispatch.requestID)
        case let .snapshot(requestID, _), let .range(requestID, _, _, _):
            return notLeader(requestID)
        }
    }

    func notLeader(_ requestID: UInt64) -> Reply {
        let leading =
            recovering.map { "it holds the lease (term \($0.term)) and is recovering its stores to lead" }
            ?? leader.map {
                "\($0.holder) leads the journal (term \($0.term), its lease expires at \($0.expiresAt) unless renewed)"
            } ?? "no leader is known (\(problem ?? "not asked yet"))"
        return .error(
            requestID: requestID,
            ProtocolError(
                code: .notLeader,
                "this daemon (\(journal.lease.holder)) is a standby and applies nothing: \(leading); send the request "
                    + "to the leader, or again here after a takeover, with the same request number"
            )
        )
    }

    /// The standby's STATUS: its role and name, the leader as last read, no stores.
    func status(_ sockets: LoopSockets) -> String {
        let configuration = loop.configuration
        let uptime = ContinuousClock.now - loop.startedAt
        let leaderJSON =
            leader.map {
                #"{"name":\#(jsonString($0.holder)),"term":\#($0.term),"expiresAt":\#(jsonString($0.expiresAt))}"#
            } ?? "null"
        let refused = sockets.refusals.sorted { $0.key < $1.key }.map { #""\#($0.key)":\#($0.value)"# }
        return #"{"uptimeSeconds":\#(uptime.components.seconds),"role":"standby","#
            + #""name":\#(jsonString(journal.lease.holder)),"leader":\#(leaderJSON),"#
            + #""journal":\#(jsonString(journal.location)),"journalBytes":null,"stores":[],"#
            + #""refused":{\#(refused.joined(separator: ","))},"#
            + #""heartbeatMs":\#(Int(configuration.heartbeatInterval / .milliseconds(1))),"#
            + #""digestEveryEvents":\#(configuration.digestEveryEvents),"#
            + #""maximumBatch":\#(configuration.maximumBatch),"#
            + #""maximumActionBytes":\#(configuration.maximumMessageBytes)}"#
    }
}

/// `text` as a JSON string.
private func jsonString(_ text: String) -> String {
    (try? JSONEncoder().encode(text)).map { String(decoding: $0, as: UTF8.self) } ?? "null"
}
