// A traced Lockstep process for the tracing test (Tests/LockstepServerTests/TracingProcessTests.swift): an in-memory
// tracer, with W3C-shaped random ids, whose finished spans are written as JSON lines to $TRACE_FIXTURE_SPANS when the
// process exits. $TRACE_FIXTURE_ROLE says what it is:
//
// - `daemon`: a Lockstep daemon hosting `todos`, taking lockstepd's flags;
// - `dispatch ENDPOINT`: inside a span `test.request`, dispatches two adds as one batch, then a toggle the domain
//   rejects, through a `Dispatcher` to the daemon at ENDPOINT; exits 0 when both were answered as expected;
// - `replica COMMAND EVENTS SEQ`: a `Replica` of `todos` at the daemon of those endpoints; prints `live` once it is,
//   and exits 0 once it has applied SEQ.

import Foundation
import InMemoryTracing
import Lockstep
import LockstepClient
import LockstepExamples
import LockstepServer
import Tracing

func randomHex(_ bytes: Int) -> String {
    (0..<bytes).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()
}

let tracer = InMemoryTracer(idGenerator: .init(nextTraceID: { randomHex(16) }, nextSpanID: { randomHex(8) }))
InstrumentationSystem.bootstrap(tracer)

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

switch ProcessInfo.processInfo.environment["TRACE_FIXTURE_ROLE"] {
case "daemon":
    await LockstepDaemonMain.run(domains: [Todos.self])
case "dispatch":
    let endpoint = CommandLine.arguments[1]
    var configuration = DispatcherConfiguration(commandEndpoints: [endpoint])
    configuration.requestTimeout = .seconds(2)
    configuration.retries = 10
    let dispatcher = try Dispatcher(Todos.self, configuration: configuration)
    try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask { try await dispatcher.run() }
        try await withSpan("test.request") { _ in
            try await dispatcher.dispatch(batch: [.add(text: "traced one"), .add(text: "traced two")])
            do {
                try await dispatcher.dispatch(.toggle(id: 999))
                FileHandle.standardError.write(Data("toggling todo 999 was accepted\n".utf8))
                exit(1)
            } catch is Rejection {}
        }
        group.cancelAll()
        while let _ = try? await group.next() {}
    }
    exit(0)
case "replica":
    let arguments = CommandLine.arguments
    let replica = try Replica(
        Todos.self,
        configuration: ReplicaConfiguration(commandEndpoint: arguments[1], eventsEndpoint: arguments[2])
    )
    try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask { try await replica.run() }
        try await replica.waitUntilLive(timeout: .seconds(30))
        FileHandle.standardOutput.write(Data("live\n".utf8))
        _ = try await replica.wait(for: UInt64(arguments[3])!, timeout: .seconds(60))
        group.cancelAll()
        while let _ = try? await group.next() {}
    }
    exit(0)
default:
    FileHandle.standardError.write(Data("TRACE_FIXTURE_ROLE must be daemon, dispatch or replica\n".utf8))
    exit(64)
}
