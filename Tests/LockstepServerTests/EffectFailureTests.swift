import Foundation
import Lockstep
import LockstepClient
import LockstepProtocol
import LockstepServer
import LockstepTesting
import Logging
import TestSupport
import Testing
import ZeroMQ

/// Jobs whose effects go wrong in every way a handler or a domain can make them: each has a defined outcome, and the
/// daemon stays up (docs/effects.md, "Failures").
enum Jobs: Domain {
    enum Mode: String, Codable, Sendable { case ok, hang, reject, unencodable }
    struct State: Codable, Equatable, Sendable {
        var started: [String] = []
        var results: [String: String] = [:]
    }
    enum Action: Codable, Equatable, Sendable {
        case start(name: String, mode: Mode)
        case finished(name: String, result: String)
        /// Never valid: what the `reject` handler returns.
        case impossible(name: String)
    }
    enum Effect: Codable, Equatable, Sendable {
        case work(name: String, mode: Mode)
        case measure(Double)
    }
    static let name = "jobs"
    static let version: UInt32 = 1
    static var initialState: State { State() }

    static func validate(_ action: Action, in state: State) throws(Rejection) {
        if case let .impossible(name) = action { throw Rejection(code: "impossible", "jobs: \(name) cannot be") }
    }
    static func reduce(into state: inout State, _ action: Action) {
        switch action {
        case let .start(name, _): state.started.append(name)
        case let .finished(name, result): state.results[name] = result
        case .impossible: break
        }
    }
    static func effects(of action: Action, in state: State) -> [DomainEffect<Jobs>] {
        guard case let .start(name, mode) = action else { return [] }
        // JSON has no NaN: this effect cannot be encoded.
        return mode == .unencodable ? [.run(.measure(.nan))] : [.run(.work(name: name, mode: mode))]
    }

    /// The handler: `ok` finishes, `hang` never answers, `reject` answers with an action the validator refuses.
    static let handler = EffectHandler(Jobs.self) { effect, context in
        guard case let .work(name, mode) = effect else { return [] }
        switch mode {
        case .ok, .unencodable: return [.finished(name: name, result: "done by \(context.id)")]
        case .hang:
            try await Task.sleep(for: .seconds(3_600))
            return []
        case .reject: return [.impossible(name: name)]
        }
    }
}

/// A domain that sets timers and declares no Effect type: its timers fire all the same, whatever their due time.
enum Alarms: Domain {
    struct State: Codable, Equatable, Sendable { var rung: [String] = [] }
    enum Action: Codable, Equatable, Sendable {
        case set(name: String, atMilliseconds: Int64)
        case ring(name: String)
    }
    static let name = "alarms"
    static let version: UInt32 = 1
    static var initialState: State { State() }
    static func reduce(into state: inout State, _ action: Action) {
        if case let .ring(name) = action { state.rung.append(name) }
    }
    static func effects(of action: Action, in state: State) -> [DomainEffect<Alarms>] {
        guard case let .set(name, at) = action else { return [] }
        return [.schedule(.ring(name: name), atMilliseconds: at, key: name)]
    }
}

/// A domain whose effects a later build reads differently: its handler is given for `LegacyReader`, a domain of the
/// same name whose Effect type cannot decode what `Legacy` journaled.
enum Legacy: Domain {
    struct State: Codable, Equatable, Sendable { var count = 0 }
    enum Action: Codable, Equatable, Sendable { case bump }
    enum Effect: Codable, Equatable, Sendable { case old(Int) }
    static let name = "legacy"
    static let version: UInt32 = 1
    static var initialState: State { State() }
    static func reduce(into state: inout State, _ action: Action) { state.count += 1 }
    static func effects(of action: Action, in state: State) -> [DomainEffect<Legacy>] { [.run(.old(state.count))] }
}

enum LegacyReader: Domain {
    typealias State = Legacy.State
    typealias Action = Legacy.Action
    enum Effect: Codable, Equatable, Sendable { case new(String) }
    static let name = "legacy"
    static let version: UInt32 = 1
    static var initialState: State { State() }
    static func reduce(into state: inout State, _ action: Action) { state.count += 1 }
}

@Suite(.timeLimit(.minutes(2))) struct EffectFailureTests {
    /// A client of an in-process daemon, on a thread of its own for each call.
    struct Caller: Sendable {
        let endpoint: String

        func call(_ request: Request) async throws -> Reply {
            let endpoint = self.endpoint
            return try await offPool("effects call") {
                try CommandClient(context: try Context(), endpoint: endpoint, timeout: .seconds(5)).call(request)
            }
        }

        func dispatch<D: Domain>(_ domain: D.Type, _ action: D.Action, number: UInt64) async throws -> Reply {
            let frame = try CanonicalEncoding.Coder().encode(action)
            let request = DispatchRequest(
                requestID: number,
                domainVersion: D.version,
                clientID: ClientID(bytes: Array(repeating: 7, count: 16))!,
                store: try StoreName(D.name),
                actions: [frame]
            )
            return try await call(.dispatch(request))
        }

        func state<D: Domain>(_ domain: D.Type) async throws -> D.State {
            guard
                case let .snapshot(_, snapshot) = try await call(.snapshot(requestID: 1, store: try StoreName(D.name)))
            else { throw DaemonProcessError("no snapshot of \(D.name)") }
            return try JSONDecoder().decode(D.State.self, from: Data(snapshot.state))
        }

        func effects() async throws -> EffectsListing {
            let reply = try await call(.effects(requestID: 1, .list))
            guard let listing = EffectsListing(reply) else { throw DaemonProcessError("EFFECTS answered \(reply)") }
            return listing
        }
    }

    @Test func everyWayAnEffectGoesWrongHasItsOutcomeAndTheDaemonStaysUp() async throws {
        let directory = try temporaryDirectory("effect-failures")
        defer { try? FileManager.default.removeItem(at: directory) }
        var configuration = DaemonConfiguration(environment: [:], domains: ["jobs", "alarms", "legacy"])
        configuration.dataDirectory = directory.appendingPathComponent("data").path
        configuration.commandEndpoint = "ipc://\(directory.path)/command"
        configuration.eventsEndpoint = "ipc://\(directory.path)/events"
        configuration.effects.tries = 2
        configuration.effects.timeout = .seconds(1)
        configuration.effects.backoff = .milliseconds(50)
        let daemon = try LockstepDaemon(
            configuration: configuration,
            domains: [HostedDomain(Jobs.self), HostedDomain(Alarms.self), HostedDomain(Legacy.self)],
            effects: [Jobs.handler, EffectHandler(LegacyReader.self) { _, _ in [] }],
            environment: [:],
            logger: Logger(label: "effect-failures")
        )
        let running = Task { try await daemon.run() }
        defer { running.cancel() }
        let caller = Caller(endpoint: configuration.commandEndpoint)

        var number: UInt64 = 0
        for mode in [Jobs.Mode.ok, .hang, .reject, .unencodable] {
            number += 1
            let reply = try await caller.dispatch(Jobs.self, .start(name: mode.rawValue, mode: mode), number: number)
            guard case .accepted = reply else {
                Issue.record("start \(mode) was answered \(reply)")
                return
            }
        }
        let past = Int64(Date().timeIntervalSince1970 * 1_000) - 1_000
        // Due times at the ends of Int64: the first is due at once, the last never.
        for (name, at) in [("wake", past), ("ancient", Int64.min), ("never", Int64.max)] {
            number += 1
            _ = try await caller.dispatch(Alarms.self, .set(name: name, atMilliseconds: at), number: number)
        }
        number += 1
        _ = try await caller.dispatch(Legacy.self, .bump, number: number)

        var listing = try await caller.effects()
        // Each poll is a call on a thread of its own: polled less often than the default, so that in a busy full run
        // the wait still ends near its bound.
        let settled = try await eventually(within: .seconds(30), every: .milliseconds(200)) {
            listing = try await caller.effects()
            return listing.effects.count == 3 && listing.effects.allSatisfy { $0.phase == "dead" }
        }
        try #require(settled, "\(listing)")
        // Results sequenced by the daemon take seqs between the starts: effects are found by what they are.
        func effect(_ match: String) -> EffectsListing.Effect? {
            listing.effects.first { $0.effect.contains(match) || ($0.effect.isEmpty && match.isEmpty) }
        }
        // A handler that hangs: each run timed out, then given up.
        let hang = try #require(effect(#""mode":"hang""#))
        #expect(hang.attempts == 2 && hang.lastError?.contains("no answer within 1.0 seconds") == true, "\(hang)")
        // An effect that cannot be encoded: the action stands, the effect is a dead letter at once, never run.
        let unencodable = try #require(effect(""))
        #expect(
            unencodable.attempts == 0 && unencodable.lastError?.contains("cannot be encoded") == true,
            "\(unencodable)"
        )
        // An effect this build cannot decode: given up at its first run.
        let legacy = try #require(effect(#"{"old":"#))
        #expect(legacy.id == "legacy/1/0")
        #expect(legacy.attempts == 1 && legacy.lastError?.contains("not an effect of legacy v1") == true, "\(legacy)")

        let jobs = try await caller.state(Jobs.self)
        #expect(jobs.started == ["ok", "hang", "reject", "unencodable"])
        // The handler's result applied once; the rejected result applied nothing, and its effect is done.
        #expect(jobs.results == ["ok": "done by jobs/1/0"], "\(jobs.results)")
        #expect(effect(#""mode":"reject""#) == nil)
        // A timer of a domain with no Effect type, due before it was set: fired once.
        var alarms = try await caller.state(Alarms.self)
        let rung = try await eventually(within: .seconds(10), every: .milliseconds(200)) {
            alarms = try await caller.state(Alarms.self)
            return alarms.rung.sorted() == ["ancient", "wake"]
        }
        #expect(rung, "the alarms due did not ring once each: \(alarms)")

        // Still up: a dispatch is accepted, and STATUS counts the dead letters.
        number += 1
        let again = try await caller.dispatch(Jobs.self, .start(name: "again", mode: .ok), number: number)
        guard case .accepted = again else {
            Issue.record("after the failures: \(again)")
            return
        }
        guard case let .status(_, body) = try await caller.call(.status(requestID: 9)),
            let status = try? JSONDecoder().decode(DaemonStatus.self, from: Data(body))
        else {
            Issue.record("no STATUS")
            return
        }
        let counts = Dictionary(uniqueKeysWithValues: status.stores.map { ($0.name, $0.effects) })
        #expect(counts["jobs"]??.dead == 2 && counts["legacy"]??.dead == 1, "\(counts)")
        #expect(counts["alarms"]??.timers == 1, "no Effect type, yet its timer set is counted: \(counts)")
        #expect(try await caller.state(Alarms.self).rung.sorted() == ["ancient", "wake"], "each rang once")
    }

    @Test func aDaemonRefusesToStartWithoutAHandlerForADomainThatDeclaresEffects() throws {
        var configuration = DaemonConfiguration(environment: [:], domains: ["jobs"])
        configuration.dataDirectory = "/nonexistent"
        #expect {
            _ = try LockstepDaemon(
                configuration: configuration,
                domains: [HostedDomain(Jobs.self)],
                environment: [:],
                logger: Logger(label: "no-handler")
            )
        } throws: { error in
            "\(error)".contains("domain 'jobs' declares effects but no handler runs them")
        }
        #expect {
            _ = try LockstepDaemon(
                configuration: configuration,
                domains: [HostedDomain(Jobs.self)],
                effects: [Jobs.handler, EffectHandler(Legacy.self) { _, _ in [] }],
                environment: [:],
                logger: Logger(label: "extra-handler")
            )
        } throws: { error in
            "\(error)".contains("'legacy', which is not a linked domain that declares effects")
        }
    }
}
