import Foundation
import ZeroMQ

/// What an HTTP GET came back with.
public struct HTTPAnswer: Sendable {
    public var status: Int
    public var head: String
    public var body: String
}

/// `GET path` from `address` (`HOST:PORT`) over a ZeroMQ STREAM socket (raw TCP), read until the server closes the
/// connection; throws when it does not within `timeout`. The tests' HTTP client: no HTTP library to install.
public func httpGet(_ address: String, _ path: String, timeout: Duration = .seconds(10)) throws -> HTTPAnswer {
    let context = try Context()
    defer { context.shutdown() }
    let socket = try Socket(context, type: .stream)
    defer { socket.close() }
    try socket.set(.linger, 0)
    try socket.set(.receiveTimeout, Int32(timeout / .milliseconds(1)))
    try socket.connect("tcp://\(address)")
    // The connection's arrival: its routing id, and no bytes.
    guard let connected = try socket.receive(), connected.count == 2 else {
        throw HTTPTestError("no connection to \(address) within \(timeout)")
    }
    let id = connected[0]
    try socket.send([id, Array("GET \(path) HTTP/1.1\r\nHost: \(address)\r\nAccept: */*\r\n\r\n".utf8)])
    var bytes: [UInt8] = []
    while true {
        guard let frames = try socket.receive(), frames.count == 2 else {
            throw HTTPTestError("\(address) did not answer GET \(path) within \(timeout) (\(bytes.count) bytes read)")
        }
        if frames[1].isEmpty { break }  // closed: the answer is whole
        bytes += frames[1]
    }
    let text = String(decoding: bytes, as: UTF8.self)
    guard let split = text.range(of: "\r\n\r\n") else { throw HTTPTestError("no end of head in '\(text.prefix(200))'") }
    let head = String(text[..<split.lowerBound])
    let status = head.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
    return HTTPAnswer(status: status, head: head, body: String(text[split.upperBound...]))
}

/// The value of the sample `name{labels}` in Prometheus text, if it is there: every label given must match, and no
/// other may be present.
public func prometheusSample(_ text: String, _ name: String, _ labels: [String: String] = [:]) -> Double? {
    for line in text.split(separator: "\n") where !line.hasPrefix("#") {
        guard let space = line.lastIndex(of: " ") else { continue }
        let series = line[..<space]
        let metric = series.prefix { $0 != "{" }
        guard metric == name else { continue }
        var found: [String: String] = [:]
        if let open = series.firstIndex(of: "{"), series.hasSuffix("}") {
            let inner = series[series.index(after: open)..<series.index(before: series.endIndex)]
            for pair in inner.split(separator: ",") {
                let parts = pair.split(separator: "=", maxSplits: 1)
                guard parts.count == 2 else { continue }
                found[String(parts[0])] = String(parts[1].dropFirst().dropLast())
            }
        }
        if found == labels { return Double(line[line.index(after: space)...]) }
    }
    return nil
}

public struct HTTPTestError: Error, CustomStringConvertible {
    public var description: String
    init(_ description: String) { self.description = description }
}
