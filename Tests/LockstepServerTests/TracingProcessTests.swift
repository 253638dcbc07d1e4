import Foundation
import LockstepTesting
import TestSupport
import Testing

/// A dispatch's trace across three processes (docs/operations.md, "Traces"): the client's span, carried by the
/// DISPATCH's trace context, is continued by the daemon's span of validation, commit and publication, and that one,
/// carried by a TRACE, by a replica's span of applying the events. Each process is a `trace-fixture` with an in-memory
/// tracer that writes its finished spans to a file as it exits.
@Suite struct TracingProcessTests {
    struct SpanLine: Decodable {
        var name: String
        var trace: String
        var span: String
        var parent: String
        var kind: String
        var attributes: [String: String]
        var events: [String]
    }

    func spans(_ path: String) throws -> [SpanLine] {
        try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n").map {
            try JSONDecoder().decode(SpanLine.self, from: Data($0.utf8))
        }
    }

    @Test func aDispatchsSpanIsContinuedByTheDaemonsAndByAReplicasInOtherProcesses() async throws {
        let directory = try TestSupport.temporaryDirectory("tracing").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (daemonFile, clientFile) = ("\(directory)/daemon-spans.jsonl", "\(directory)/client-spans.jsonl")
        let replicaFile = "\(directory)/replica-spans.jsonl"
        let daemon = try DaemonProcess(
            directory: directory,
            environment: ["TRACE_FIXTURE_ROLE": "daemon", "TRACE_FIXTURE_SPANS": daemonFile],
            executable: "trace-fixture"
        )
        try await daemon.waitUntilServing()
        let endpoint = daemon.command
        // The replica first, live before anything is dispatched; it stops once it has applied seq 3.
        let replica = try ChildProcess(
            executable: productURL("trace-fixture"),
            [daemon.command, daemon.events, "3"],
            environment: ["TRACE_FIXTURE_ROLE": "replica", "TRACE_FIXTURE_SPANS": replicaFile]
        )
        var live = false
        for _ in 0..<300 where !live {
            await replica.read(for: .milliseconds(100))
            live = replica.takeLines().contains("live")
        }
        try #require(live, "the traced replica never went live: \(replica.errors())")
        let client = try await offPool("traced client") {
            try ChildProcess(
                executable: productURL("trace-fixture"),
                [endpoint],
                environment: ["TRACE_FIXTURE_ROLE": "dispatch", "TRACE_FIXTURE_SPANS": clientFile]
            ).finish(within: .seconds(60))
        }
        #expect(client.status == 0, "\(client.standardError)")
        // A client without a tracer sends no trace context, and the daemon makes no span of its dispatch.
        let untraced = try await runProduct(
            "lockstep",
            ["dispatch", "todos", #"{"add":{"text":"untraced"}}"#, "--command-endpoint", daemon.command]
        )
        #expect(untraced.status == 0, "\(untraced.standardError)")
        #expect(await replica.waitForExit(within: .seconds(60)) == 0, "\(replica.errors())")
        #expect(await daemon.stop() == 0)

        let clientSpans = try spans(clientFile)
        let daemonSpans = try spans(daemonFile)
        let root = try #require(clientSpans.first { $0.name == "test.request" }, "\(clientSpans)")
        #expect(root.parent.isEmpty && root.trace.count == 32)
        let dispatches = clientSpans.filter { $0.name == "lockstep.dispatch" }
        #expect(dispatches.count == 2 && dispatches.allSatisfy { $0.parent == root.span && $0.trace == root.trace })
        #expect(dispatches.allSatisfy { $0.kind == "client" && $0.attributes["lockstep.store"] == "todos" })
        let sequenced = daemonSpans.filter { $0.name == "lockstep.sequence" }
        #expect(sequenced.count == 2, "the daemon's spans: \(daemonSpans)")
        for span in sequenced {
            #expect(span.trace == root.trace, "\(span)")
            #expect(span.kind == "server")
            #expect(dispatches.contains { $0.span == span.parent }, "\(span.name) has parent \(span.parent)")
        }
        let batch = try #require(sequenced.first { $0.attributes["lockstep.actions"] == "2" })
        #expect(batch.attributes["lockstep.outcome"] == "accepted")
        #expect(batch.attributes["lockstep.seq.first"] == "1" && batch.attributes["lockstep.seq.last"] == "2")
        #expect(batch.events == ["sequenced", "committed", "published"])
        // The batch's daemon span is the child of the batch's client span, and the rejected toggle's of its own.
        #expect(dispatches.first { $0.span == batch.parent }?.attributes["lockstep.actions"] == "2")
        let toggle = try #require(sequenced.first { $0.attributes["lockstep.actions"] == "1" })
        #expect(toggle.attributes["lockstep.outcome"] == "rejected unknown_id")
        // The replica applied seqs 1 and 2 in a span continuing the daemon's; seq 3 came untraced, and has none.
        let applied = try spans(replicaFile).filter { $0.name == "lockstep.apply" }
        #expect(applied.count == 1, "the replica's spans: \(applied)")
        #expect(applied.first?.parent == batch.span && applied.first?.trace == root.trace)
        #expect(applied.first?.kind == "consumer")
        #expect(
            applied.first?.attributes["lockstep.seq.first"] == "1"
                && applied.first?.attributes["lockstep.seq.last"] == "2"
        )
    }
}
