import Foundation
import TestSupport
import Testing
import ZeroMQ

/// A fresh `ipc://` endpoint in a private temporary directory, removed by `cleanup`.
struct IPCDirectory: ~Copyable {
    let path: String
    init() throws {
        path = FileManager.default.temporaryDirectory.appendingPathComponent("zmq-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }
    func endpoint(_ name: String) -> String { "ipc://\(path)/\(name)" }
    deinit { try? FileManager.default.removeItem(atPath: path) }
}

@Suite struct SocketTests {
    let context: Context

    init() throws {
        context = try Context()
    }

    /// A connected REQ/REP pair over `endpoint`.
    func pair(_ endpoint: String) throws -> (request: Socket, reply: Socket) {
        let reply = try Socket(context, type: .reply)
        try reply.bind(endpoint)
        let request = try Socket(context, type: .request)
        try request.connect(endpoint)
        try reply.set(.receiveTimeout, 5_000)
        try request.set(.receiveTimeout, 5_000)
        return (request, reply)
    }

    @Test func runtimeIsRecentEnoughAndHasCurve() throws {
        try LibZMQ.checkRuntime()
        let version = LibZMQ.version
        #expect((version.major, version.minor, version.patch) >= (4, 3, 3))
        #expect(LibZMQ.hasCurve)
    }

    @Test(arguments: ["inproc", "ipc"])
    func emptyFramesLargeFramesAndManyParts(transport: String) throws {
        let directory = try IPCDirectory()
        let endpoint = transport == "inproc" ? "inproc://frames-\(UUID())" : directory.endpoint("frames")
        let (request, reply) = try pair(endpoint)

        let oneMiB = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        let manyParts = (0..<1_000).map { [UInt8(truncatingIfNeeded: $0), UInt8(truncatingIfNeeded: $0 >> 8)] }
        let messages: [[[UInt8]]] = [[[]], [[], [], []], [oneMiB], manyParts, [[1], [], oneMiB, []]]
        for message in messages {
            try request.send(message)
            let received = try #require(try reply.receive())
            #expect(received == message)
            try reply.send(received)
            #expect(try request.receive() == message)
        }
    }

    /// A large part is lent to libzmq, not copied, and let go once libzmq is done with it: one that cannot go yet
    /// (the socket has no peer) at once, one sent (first or later in its message) when its receiver has read it —
    /// over inproc, libzmq hands the receiver the lent bytes themselves.
    @Test func aLargePartIsLetGoOnceItIsSentOrCannotBe() throws {
        let endpoint = "inproc://lent-\(UUID())"
        let dealer = try Socket(context, type: .dealer)
        let large = (0..<(Socket.lentPartBytes + 7)).map { UInt8(truncatingIfNeeded: $0 &* 13) }
        #expect(try dealer.send([large], wait: false) == false)
        #expect(dealer.lentPartsOutstanding == 0)
        let router = try Socket(context, type: .router)
        try router.bind(endpoint)
        try router.set(.receiveTimeout, 5_000)
        try dealer.connect(endpoint)
        try dealer.send([large, [1], large])
        #expect(dealer.lentPartsOutstanding == 2)
        let received = try #require(try router.receive())
        #expect(received.count == 4 && received[1] == large && received[2] == [1] && received[3] == large)
        #expect(dealer.lentPartsOutstanding == 0)
    }

    @Test func receiveTimesOutWithNothing() throws {
        let socket = try Socket(context, type: .pair)
        try socket.bind("inproc://timeout-\(UUID())")
        try socket.set(.receiveTimeout, 50)
        // The timeout is the bound: without it this receive would wait for ever.
        #expect(try socket.receive() == nil)
        #expect(try socket.receive(wait: false) == nil)
    }

    @Test func aReceiveWithATimeoutWaitsThatLongAtMost() throws {
        let (request, reply) = try pair("inproc://receive-timeout-\(UUID())")
        // Nothing comes: it waits the timeout out and answers nothing. The wait is set rounded up to a whole
        // millisecond (the option says so); how long it lasts is libzmq's clock's, which may read up to 1 ms late, so
        // the bound checked is a millisecond under the wait set.
        let start = ContinuousClock.now
        #expect(try reply.receive(timeout: .microseconds(30_500)) == nil)
        #expect(try reply.get(.receiveTimeout) == 31)
        #expect(ContinuousClock.now - start >= .milliseconds(30))
        // A message that comes is taken, and the socket's option is left at the last wait.
        try request.send([[1], [2]])
        #expect(try reply.receive(timeout: .seconds(5)) == [[1], [2]])
        #expect(try reply.get(.receiveTimeout) == 5_000)
        try reply.send([[3]])
        #expect(try request.receive(timeout: .seconds(5)) == [[3]])
    }

    @Test func keepsOnlyTheFramesAskedFor() throws {
        let (request, reply) = try pair("inproc://limit-\(UUID())")
        try request.send((0..<10).map { [UInt8($0)] })
        let received = try #require(try reply.receive(maximumFrames: 3))
        #expect(received.frames == [[0], [1], [2]])
        #expect(received.droppedFrames == 7)
    }

    @Test func pollReportsWhichSocketIsReadable() throws {
        let first = try pair("inproc://poll-a-\(UUID())")
        let second = try pair("inproc://poll-b-\(UUID())")
        let poller = Poller([.socket(first.reply, .readable), .socket(second.reply, .readable)])
        #expect(try poller.poll(timeout: .milliseconds(20)) == [[], []])
        try second.request.send([[42]])
        #expect(try poller.poll(timeout: .seconds(5)) == [[], .readable])
        #expect(try second.reply.receive() == [[42]])
    }

    @Test func routerSeesTheEnvelopeOfDealersAndRequests() throws {
        let endpoint = "inproc://router-\(UUID())"
        let router = try Socket(context, type: .router)
        try router.bind(endpoint)
        try router.set(.receiveTimeout, 5_000)
        let dealer = try Socket(context, type: .dealer)
        try dealer.set(.routingID, Array("dealer-1".utf8))
        try dealer.connect(endpoint)
        try dealer.set(.receiveTimeout, 5_000)
        try dealer.send([[], Array("hello".utf8)])
        let received = try #require(try router.receive())
        #expect(received == [Array("dealer-1".utf8), [], Array("hello".utf8)])
        try router.send([received[0], [], Array("back".utf8)])
        #expect(try dealer.receive() == [[], Array("back".utf8)])
    }

    @Test func subscribersGetOnlyTheirPrefix() async throws {
        let endpoint = "inproc://pubsub-\(UUID())"
        let publisher = try Socket(context, type: .publisher)
        try publisher.bind(endpoint)
        let subscriber = try Socket(context, type: .subscriber)
        try subscriber.set(.receiveTimeout, 2_000)
        try subscriber.subscribe(Array("counter\0".utf8))
        try subscriber.connect(endpoint)
        // A subscription reaches the publisher asynchronously: publish until the first message arrives.
        var first: [[UInt8]]?
        _ = try await eventually(within: .seconds(5), every: .milliseconds(10)) {
            try publisher.send([Array("counter2\0".utf8), [9]])
            try publisher.send([Array("counter\0".utf8), [1]])
            first = try subscriber.receive(wait: false)
            return first != nil
        }
        #expect(first == [Array("counter\0".utf8), [1]])
        try subscriber.set(.receiveTimeout, 100)
        while let more = try subscriber.receive() {
            #expect(more[0] == Array("counter\0".utf8))
        }
    }

    @Test func errorsNameTheFunctionTheErrnoAndTheValue() throws {
        let socket = try Socket(context, type: .request)
        let error = #expect(throws: ZeroMQError.self) { try socket.connect("nope://where") }
        #expect(error?.function == "zmq_connect")
        #expect(error?.errno == EPROTONOSUPPORT)
        #expect(error?.description.contains("nope://where") == true)
        socket.close()
        socket.close()
        let closed = #expect(throws: ZeroMQError.self) { try socket.send([[1]]) }
        #expect(closed?.errno == ENOTSOCK)
    }

    @Test func optionsReadBackWhatWasSet() throws {
        let socket = try Socket(context, type: .dealer)
        try socket.set(.sendHighWaterMark, 123)
        try socket.set(.maximumMessageSize, 1 << 20)
        try socket.set(.heartbeatInterval, 1_000)
        try socket.set(.handshakeInterval, 2_000)
        try socket.set(.zapEnforceDomain, 1)
        try socket.set(.zapDomain, "lockstep")
        #expect(try socket.get(.sendHighWaterMark) == 123)
        #expect(try socket.get(.maximumMessageSize) == 1 << 20)
        #expect(try socket.get(.heartbeatInterval) == 1_000)
        #expect(try socket.get(.handshakeInterval) == 2_000)
        #expect(try socket.get(.zapEnforceDomain) == 1)
        #expect(try socket.get(.linger) == 0)
        try socket.bind("tcp://127.0.0.1:*")
        #expect(try socket.lastEndpoint.hasPrefix("tcp://127.0.0.1:"))
    }
}

@Suite struct ContextTests {
    @Test func shuttingDownWakesABlockedReceiverAndClosesCleanly() async throws {
        let context = try Context()
        let endpoint = "inproc://shutdown-\(UUID())"
        let ready = DispatchSemaphore(value: 0)
        let outcome = LockedResult()
        let thread = Thread {
            do {
                let socket = try Socket(context, type: .pair)
                try socket.bind(endpoint)
                ready.signal()
                _ = try socket.receive()
                outcome.set("received")
            } catch let error as ZeroMQError {
                outcome.set(error.isContextTerminated ? "terminated" : "error \(error)")
            } catch {
                outcome.set("other \(error)")
            }
        }
        thread.start()
        #expect(ready.wait(timeout: .now() + 5) == .success)
        // A second socket is still open on this thread when the context shuts down.
        let open = try Socket(context, type: .pair)
        try open.connect(endpoint)
        context.shutdown()
        _ = try await eventually(within: .seconds(5), every: .milliseconds(5)) { outcome.value != nil }
        #expect(outcome.value == "terminated")
        let error = #expect(throws: ZeroMQError.self) { try open.send([[1]]) }
        #expect(error?.isContextTerminated == true)
        open.close()
    }
}

final class LockedResult: Sendable {
    private let queue = DispatchQueue(label: "result")
    nonisolated(unsafe) private var stored: String?
    func set(_ value: String) { queue.sync { stored = value } }
    var value: String? { queue.sync { stored } }
}

@Suite struct CurveTests {
    @Test func z85RoundTripsAndRefusesGarbage() throws {
        // The test vector from ZeroMQ RFC 32.
        let bytes: [UInt8] = [0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B]
        #expect(Z85.encode(bytes) == "HelloWorld")
        #expect(try Z85.decode("HelloWorld") == bytes)
        #expect(throws: ZeroMQError.self) { try Z85.decode("abc") }
        #expect(throws: ZeroMQError.self) { try Z85.decode("Hello World") }
    }

    @Test func keyPairsAreFreshAndDeriveTheirPublicKey() throws {
        let first = try CurveKeyPair.generate()
        let second = try CurveKeyPair.generate()
        #expect(first != second)
        #expect(first.publicKey.count == 32 && first.secretKey.count == 32)
        #expect(try CurveKeyPair(secretKey: first.secretKey) == first)
    }

    @Test func encryptedPeersTalkAndAWrongServerKeyGetsNothing() throws {
        let context = try Context()
        let server = try CurveKeyPair.generate()
        let clientKeys = try CurveKeyPair.generate()
        let directory = try IPCDirectory()
        let endpoint = directory.endpoint("curve")

        let reply = try Socket(context, type: .reply)
        try reply.set(.curveServer, 1)
        try reply.set(.curveSecretKey, server.secretKey)
        try reply.set(.receiveTimeout, 5_000)
        try reply.bind(endpoint)

        func client(serverKey: [UInt8]) throws -> Socket {
            let socket = try Socket(context, type: .request)
            try socket.set(.curveServerKey, serverKey)
            try socket.set(.curvePublicKey, clientKeys.publicKey)
            try socket.set(.curveSecretKey, clientKeys.secretKey)
            try socket.set(.receiveTimeout, 5_000)
            try socket.connect(endpoint)
            return socket
        }

        let impostor = try client(serverKey: try CurveKeyPair.generate().publicKey)
        try impostor.send([Array("from the wrong key".utf8)])
        let good = try client(serverKey: server.publicKey)
        try good.send([Array("sealed".utf8)])
        // Only the message from the client that knows the server's key arrives.
        #expect(try reply.receive() == [Array("sealed".utf8)])
        try reply.send([Array("ok".utf8)])
        #expect(try good.receive() == [Array("ok".utf8)])
        try reply.set(.receiveTimeout, 300)
        #expect(try reply.receive() == nil)
    }
}
