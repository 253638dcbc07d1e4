import Lockstep

/// How a reply is kept in the journal's idempotency table (docs/operations.md): the reply's frames, each behind
/// its length as 4 bytes big-endian. The daemon writes it and reads it back at recovery.
public enum ReplyRecord {
    /// The record of `reply`.
    public static func encode(_ reply: Reply) -> [UInt8] {
        var bytes: [UInt8] = []
        for frame in reply.encode() {
            withUnsafeBytes(of: UInt32(frame.count).bigEndian) { bytes.append(contentsOf: $0) }
            bytes.append(contentsOf: frame)
        }
        return bytes
    }

    /// The reply a record holds, or `nil` when it is not a whole record of a readable reply.
    public static func decode(_ bytes: [UInt8]) -> Reply? {
        var frames: [Frame] = []
        var index = 0
        while index < bytes.count {
            guard index + 4 <= bytes.count else { return nil }
            let length = bytes[index..<index + 4].reduce(0) { $0 << 8 | Int($1) }
            index += 4
            guard index + length <= bytes.count else { return nil }
            frames.append(Array(bytes[index..<index + length]))
            index += length
        }
        return try? Reply.decode(frames)
    }
}
