import Foundation
import Lockstep
import Synchronization
import ZeroMQ

/// An open inspector page, as the daemon sees one (`lockstep bench --inspector`): a thread that GETs `/api/live` and
/// reads the stream until stopped, counting the actions it was sent — so P1 and P2 run with a page open.
final class InspectorWatcher: Sendable {
    private let actions = Atomic<Int>(0)
    private let stopping = Atomic<Bool>(false)
    private let finished = DispatchSemaphore(value: 0)

    /// Opens the stream at `address` (`HOST:PORT`); throws when the daemon does not take it within 10 s.
    init(address: String) throws {
        let opened = Mutex<Result<Void, BenchFailure>?>(nil)
        let ready = DispatchSemaphore(value: 0)
        Thread { [self] in
            defer { finished.signal() }
            do {
                let context = try Context()
                defer { context.shutdown() }
                let socket = try Socket(context, type: .stream)
                defer { socket.close() }
                try socket.set(.linger, 0)
                try socket.set(.receiveTimeout, 100)
                try socket.connect("tcp://\(address)")
                let deadline = ContinuousClock.now + .seconds(10)
                var connected: [[UInt8]]?
                while connected == nil, ContinuousClock.now < deadline { connected = try socket.receive() }
                guard let id = connected?.first else {
                    throw BenchFailure("the inspector at \(address) did not take a connection within 10 s")
                }
                try socket.send([id, Array("GET /api/live HTTP/1.1\r\nHost: \(address)\r\n\r\n".utf8)])
                opened.withLock { $0 = .success(()) }
                ready.signal()
                read(socket)
            } catch {
                opened.withLock { $0 = .failure(BenchFailure("cannot open the inspector's stream: \(error)")) }
                ready.signal()
            }
        }.start()
        ready.wait()
        try opened.withLock { $0 }!.get()
    }

    /// Reads the stream until stopped or closed, counting its actions (across frame boundaries).
    private func read(_ socket: Socket) {
        let marker = Array("event: action\n".utf8)
        var tail: [UInt8] = []
        while !stopping.load(ordering: .relaxed) {
            guard let frames = try? socket.receive(), frames.count == 2 else { continue }
            if frames[1].isEmpty { return }  // the daemon closed it
            let bytes = tail + frames[1]
            var count = 0
            var index = 0
            while index + marker.count <= bytes.count {
                if bytes[index] == marker[0], bytes[index..<index + marker.count].elementsEqual(marker) {
                    count += 1
                    index += marker.count
                } else {
                    index += 1
                }
            }
            actions.add(count, ordering: .relaxed)
            tail = Array(bytes.suffix(marker.count - 1))
        }
    }

    /// Closes the page; returns how many actions it was sent.
    func stop() -> Int {
        stopping.store(true, ordering: .relaxed)
        finished.wait()
        return actions.load(ordering: .relaxed)
    }
}
