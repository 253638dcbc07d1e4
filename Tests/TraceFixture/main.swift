// A traced Lockstep process for the tracing test (Tests/LockstepServerTests/TracingProcessTests.swift): an in-memory
// tracer, with W3C-shaped random ids, whose finished spans are written as JSON lines to $TRACE_FIXTURE_SPANS when the
// process exits. $TRACE_FIXTURE_ROLE says what it is:
//
// - `daemon`: a Lockstep daemon hosting `todos`, taking lockstepd's flags;
// - `dispatch ENDPOINT`: inside a span `test.request`, dispatches two adds as one batch, then a toggle the domain
//   rejects, through a `Dispatcher` to the daemon at ENDPOINT; exits 0 when both were answered as expected;
// - `load ENDPOINT COUNT`: COUNT traced increments of `counter`, one at a time, each in a span of its own (what
//   docs/performance.md's cost of tracing is measured with; the daemon must host `counter`);
// - `replica COMMAND EVENTS SEQ`: a `Replica` of `todos` at the daemon of those endpoints; prints `live` once it is,
//   and exits 0 once it has applied SEQ.

import Foundation
import InMemoryTracing
import Lockstep
import LockstepClient
import LockstepExamples
import LockstepServer
import Tracing

/// `words` random 64-bit words in hex: 16 digits each.
func randomHex(words: Int) -> String {
    (0..<words).map { _ in
        let hex = String(UInt64.random(in: .min ... .max), radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex
    }.joined()
}

let tracer = InMemoryTracer(
    idGenerator: .init(nextTraceID: { randomHex(words: 2) }, nextSpanID: { randomHex(words: 1) })
)
// TRACE_FIXTURE_UNTRACED=1: no tracer (the `load` role's comparison without tracing).
if ProcessInfo.processInfo.environment["TRACE_FIXTURE_UNTRACED"] == nil { InstrumentationSystem.bootstrap(tracer) }

/// Every finished span, one JSON object a line: name, trace, span, parent, kind, and the `lockstep.*` attributes.
func writeSpans() {
    guard let path = ProcessInfo.processInfo.environment["TRACE_FIXTURE_SPANS"] else { return }
    let lines = tracer.finishedSpans.map { span -> String in
        var attributes: [String: String] = [:]
        span.attributes.forEach { key, value in
            switch value {
            case let .string(text): attributes[key] = text
            case let .int64(number): attributes[key] = "\(number)"
            case let .int32(number): attributes[key] = "\(number)"
            case let .bool(flag): attributes[key] = "\(flag)"
            default: attributes[key] = "\(value)"
            }
        }
        let object: [String: Any] = [
            "name": span.operationName, "trace": span.traceID, "span": span.spanID,
            "parent": span.parentSpanID ?? "", "kind": "\(span.kind)", "attributes": attributes,
            "events": span.events.map(\.name),
        ]
        let data = try! JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
        return String(decoding: data, as: UTF8.self)
    }
    try? (lines.joined(separator: "\n") + "\n").write(toFile: path, atomically: true, encoding: .utf8)
}

atexit { writeSpans() }

/// Runs `service` (a dispatcher or a replica) while `body` does, and stops it once `body` is done.
func running(_ service: @escaping @Sendable () async throws -> Void, _ body: () async throws -> Void) async throws {
    try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask { try await service() }
        try await body()
        group.cancelAll()
        while let _ = try? await group.next() {}
    }
}

switch ProcessInfo.processInfo.environment["TRACE_FIXTURE_ROLE"] {
case "daemon":
    await LockstepDaemonMain.run(domains: [Todos.self, Counter.self])
case "dispatch":
    let endpoint = CommandLine.arguments[1]
    var configuration = DispatcherConfiguration(commandEndpoints: [endpoint])
    configuration.requestTimeout = .seconds(2)
    configuration.retries = 10
    let dispatcher = try Dispatcher(Todos.self, configuration: configuration)
    try await running(dispatcher.run) {
        try await withSpan("test.request") { _ in
            try await dispatcher.dispatch(batch: [.add(text: "traced one"), .add(text: "traced two")])
            do {
                try await dispatcher.dispatch(.toggle(id: 999))
                FileHandle.standardError.write(Data("toggling todo 999 was accepted\n".utf8))
                exit(1)
            } catch is Rejection {}
        }
    }
    exit(0)
case "load":
    let arguments = CommandLine.arguments
    let dispatcher = try Dispatcher(
        Counter.self,
        configuration: DispatcherConfiguration(commandEndpoints: [arguments[1]])
    )
    try await running(dispatcher.run) {
        for _ in 0..<Int(arguments[2])! {
            try await withSpan("load.request") { _ in try await dispatcher.dispatch(.increment) }
            // Spans of the load are not kept: only the daemon's cost is measured.
            tracer.clearAll()
        }
    }
    exit(0)
case "replica":
    let arguments = CommandLine.arguments
    let replica = try Replica(
        Todos.self,
        configuration: ReplicaConfiguration(commandEndpoint: arguments[1], eventsEndpoint: arguments[2])
    )
    try await running(replica.run) {
        try await replica.waitUntilLive(timeout: .seconds(30))
        FileHandle.standardOutput.write(Data("live\n".utf8))
        _ = try await replica.wait(for: UInt64(arguments[3])!, timeout: .seconds(60))
    }
    exit(0)
default:
    FileHandle.standardError.write(Data("TRACE_FIXTURE_ROLE must be daemon, dispatch or replica\n".utf8))
    exit(64)
}
