/// CRC-32C (Castagnoli), table-driven: the checksum the journal stores with every event.
///
/// CRC-32C rather than CRC-32 because it detects more error patterns at the same cost; it is the checksum
/// of iSCSI, ext4 metadata and many logs. A checksum catches damage, not tampering: anyone who can write the
/// file can write a matching checksum.
public struct CRC32C: Hashable, Sendable {
    /// The checksum of everything fed so far.
    public private(set) var value: UInt32 = 0

    /// A checksum of nothing yet.
    public init() {}

    /// Feeds `bytes`.
    public mutating func update<Bytes: Sequence>(_ bytes: Bytes) where Bytes.Element == UInt8 {
        var crc = ~value
        let done: Void? = bytes.withContiguousStorageIfAvailable { buffer in
            crc = Self.update(crc, buffer)
        }
        if done == nil {
            for byte in bytes { crc = Self.table[Int((crc ^ UInt32(byte)) & 0xff)] ^ (crc >> 8) }
        }
        value = ~crc
    }

    /// Feeds `number` as 8 bytes, most significant first.
    public mutating func update(bigEndian number: UInt64) {
        withUnsafeBytes(of: number.bigEndian) { update($0) }
    }

    /// Feeds `number` as 4 bytes, most significant first.
    public mutating func update(bigEndian number: UInt32) {
        withUnsafeBytes(of: number.bigEndian) { update($0) }
    }

    /// The checksum of `bytes`.
    public static func checksum<Bytes: Sequence>(_ bytes: Bytes) -> UInt32 where Bytes.Element == UInt8 {
        var crc = CRC32C()
        crc.update(bytes)
        return crc.value
    }

    private static func update(_ start: UInt32, _ buffer: UnsafeBufferPointer<UInt8>) -> UInt32 {
        var crc = start
        table.withUnsafeBufferPointer { table in
            for byte in buffer { crc = table[Int((crc ^ UInt32(byte)) & 0xff)] ^ (crc >> 8) }
        }
        return crc
    }

    /// The reflected polynomial 0x1EDC6F41.
    private static let table: [UInt32] = (0..<256).map { index in
        var crc = UInt32(index)
        for _ in 0..<8 { crc = crc & 1 == 1 ? (crc >> 1) ^ 0x82F6_3B78 : crc >> 1 }
        return crc
    }
}
