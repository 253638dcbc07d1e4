/// Reads big-endian fields from one header frame.
///
/// Every read checks the remaining length first and throws instead of trapping, so a decoder built on it
/// cannot be crashed by its input even if a caller forgets to check a frame's length up front.
struct ByteReader {
    private let bytes: Frame
    /// Which frame this is, and of what message when known: they name the frame in error reasons, e.g. "header
    /// (frame 0) of DISPATCH". The reason's text is made only when it is thrown; made for every header read, it was a
    /// client's most costly string.
    private let frameIndex: Int
    private let type: MessageType?
    /// Always within `0...bytes.count`.
    private(set) var offset: Int

    init(_ bytes: Frame, from offset: Int, frameIndex: Int, type: MessageType?) {
        self.bytes = bytes
        self.frameIndex = frameIndex
        self.type = type
        self.offset = min(max(offset, 0), bytes.count)
    }

    /// Reads one unsigned integer in network byte order.
    mutating func read<Value: FixedWidthInteger & UnsignedInteger>(
        _: Value.Type,
        field: String
    ) throws(ProtocolError) -> Value {
        let size = Value.bitWidth / 8
        try requireRemaining(size, field: field)
        var value: Value = 0
        for index in offset..<(offset + size) {
            value = value << 8 | Value(bytes[index])
        }
        offset += size
        return value
    }

    /// Reads `count` raw bytes.
    mutating func readBytes(_ count: Int, field: String) throws(ProtocolError) -> [UInt8] {
        try requireRemaining(count, field: field)
        let slice = Array(bytes[offset..<(offset + count)])
        offset += count
        return slice
    }

    private func requireRemaining(_ count: Int, field: String) throws(ProtocolError) {
        // `bytes.count - offset` cannot overflow: offset never leaves 0...bytes.count.
        guard count >= 0, count <= bytes.count - offset else {
            let frame = "header (frame \(frameIndex))" + (type.map { " of \($0.fullName)" } ?? "")
            throw ProtocolError(
                code: .malformed,
                "\(frame) ends at byte \(bytes.count), inside \(field) (bytes \(offset)..<\(offset + count))"
            )
        }
    }
}

/// Builds one header frame: the common header, then big-endian fields.
struct ByteWriter {
    private(set) var bytes: Frame

    /// Starts a header frame of `type`, reserving its fixed size.
    init(_ type: MessageType) {
        bytes = []
        bytes.reserveCapacity(type.headerSize)
        bytes.append(contentsOf: WireFormat.magic)
        bytes.append(WireFormat.version)
        bytes.append(type.rawValue)
    }

    /// Starts a frame of fields only, no common header.
    init() {
        bytes = []
    }

    /// Appends one unsigned integer in network byte order.
    mutating func write<Value: FixedWidthInteger & UnsignedInteger>(_ value: Value) {
        for shift in stride(from: Value.bitWidth - 8, through: 0, by: -8) {
            bytes.append(UInt8(truncatingIfNeeded: value >> shift))
        }
    }

    /// Appends raw bytes.
    mutating func write(bytes more: [UInt8]) {
        bytes.append(contentsOf: more)
    }
}
