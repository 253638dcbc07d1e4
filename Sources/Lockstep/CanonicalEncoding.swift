import Crypto
import Foundation

/// The one byte form of a state that every process agrees on: JSON with sorted keys, no escaped slashes.
///
/// Two processes holding equal states produce equal bytes, and so equal digests — provided the state's
/// `Encodable` conformance is itself deterministic. `Set`, and `Dictionary` with keys other than `String`
/// or `Int`, encode in hash order, which Swift seeds per process; the replay harness catches that.
///
/// The bytes are those of Foundation's `JSONEncoder` with `[.sortedKeys, .withoutEscapingSlashes]`, and a value
/// decoded is the one Foundation's `JSONDecoder` makes of them. A faster coder of the package's own does the work
/// where it is certain to do exactly that (well-behaved senders' bytes, every example domain's values); for
/// anything else, and for every error, the call is redone with Foundation's, whose result or error stands.
public enum CanonicalEncoding {
    /// The canonical bytes of `value`.
    public static func encode<Value: Encodable>(_ value: Value) throws -> Data {
        if let bytes = CanonicalWriting.encode(value) { return Data(bytes) }
        Fallbacks.current?.recordEncoding()
        return try foundationEncoder().encode(value)
    }

    /// The canonical bytes of `value`, as an array: without the copy into `Data` (a whole state's size) that
    /// `Array(encode(value))` makes. With `capacity`, written into an array made with room for that many bytes.
    public static func bytes<Value: Encodable>(of value: Value, reservingCapacity capacity: Int = 0) throws -> [UInt8] {
        if let bytes = CanonicalWriting.encode(value, reservingCapacity: capacity) { return bytes }
        Fallbacks.current?.recordEncoding()
        return Array(try foundationEncoder().encode(value))
    }

    /// The room to reserve for a value whose canonical form took `lastSize` bytes last time: that and an eighth,
    /// so a state that grew a little since is still written into one buffer, with no regrowing on the way.
    public static func capacity(forLastSize lastSize: Int) -> Int {
        lastSize + lastSize / 8
    }

    /// Foundation's encoder set up for the canonical form: what the fast path falls back to, and what it matches.
    static func foundationEncoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }

    /// Decodes bytes written by ``encode(_:)`` (or any JSON of the same shape).
    public static func decode<Value: Decodable>(_ type: Value.Type, from data: Data) throws -> Value {
        if let value = CanonicalDecoding.decode(type, from: Array(data)) { return value }
        Fallbacks.current?.recordDecoding()
        return try JSONDecoder().decode(type, from: data)
    }

    /// A decoding error as one line a person can act on: what was wrong, and where in the JSON.
    public static func describe(_ error: any Error) -> String {
        func path(_ context: DecodingError.Context) -> String {
            context.codingPath.isEmpty
                ? "the top level" : context.codingPath.map(\.stringValue).joined(separator: ".")
        }
        switch error {
        case let DecodingError.dataCorrupted(context):
            return context.codingPath.isEmpty
                ? "not valid JSON (\(context.debugDescription))" : "\(context.debugDescription) at \(path(context))"
        case let DecodingError.keyNotFound(key, context):
            return "missing key '\(key.stringValue)' at \(path(context))"
        case let DecodingError.typeMismatch(type, context), let DecodingError.valueNotFound(type, context):
            return "expected \(type) at \(path(context))"
                + (context.debugDescription.isEmpty ? "" : " (\(context.debugDescription))")
        default:
            return "\(error)"
        }
    }

    /// Decodes `bytes` as a `Value` and returns it with its canonical bytes — `bytes` themselves when they
    /// are canonical already, as a well-behaved sender's are.
    ///
    /// Bytes that differ from the canonical form only in how they are written (whitespace, member order,
    /// escapes, the spelling of a number such as `1.0` for `1`, a member that is `null`) are taken in their
    /// canonical form. Bytes the value does not carry back are refused: a member the type does not read (it
    /// would be dropped silently), a value it reads as another (`9007199254740993` into a `Double`), a member
    /// name twice in one object. The daemon treats every action this way before it fingerprints, journals and
    /// publishes it, so two requests that mean the same action are the same bytes.
    public static func normalize<Value: Codable>(
        _ type: Value.Type,
        _ bytes: [UInt8],
        with coder: Coder
    ) throws(NormalizationError) -> (value: Value, canonical: [UInt8]) {
        let value: Value
        do {
            value = try coder.decode(Value.self, from: bytes)
        } catch let decodingError {
            // JSONDecoder's own words for bad syntax are vague; the strict parser names the byte.
            do {
                _ = try JSONValue(parsing: bytes)
            } catch {
                throw NormalizationError(reason: "not valid JSON: \(error)")
            }
            if case let DecodingError.dataCorrupted(context) = decodingError, context.codingPath.isEmpty {
                // Foundation's one word for a number that does not fit its member (5.5 or 1e30 for an Int),
                // with no path; the bytes are valid JSON, so say what it means.
                throw NormalizationError(
                    reason: "valid JSON, but a number in it does not fit the member it is read into (a fraction, "
                        + "or out of range, for an integer member)"
                )
            }
            throw unknownCase(decodingError, in: bytes) ?? NormalizationError(reason: describe(decodingError))
        }
        let canonical: [UInt8]
        do {
            canonical = try coder.encode(value)
        } catch {
            throw NormalizationError(reason: "it decodes, but does not encode again: \(error)")
        }
        if canonical == bytes { return (value, bytes) }
        let sent: JSONValue
        do {
            sent = try JSONValue(parsing: bytes)
        } catch {
            throw NormalizationError(reason: "not valid JSON: \(error)")
        }
        // The canonical bytes came from JSONEncoder: they parse.
        guard let read = try? JSONValue(parsing: canonical) else { return (value, canonical) }
        if let loss = firstLoss(sent: sent, read: read, path: "") {
            let shown =
                canonical.count <= 200 ? String(decoding: canonical, as: UTF8.self) : "(\(canonical.count) bytes)"
            throw NormalizationError(reason: "\(loss), so it would not be kept as sent; its canonical form is \(shown)")
        }
        return (value, canonical)
    }

    /// The first thing `sent` says that `read` (what the type made of it) does not, or `nil`. A member that is
    /// `null` in `sent` is the same as no member; a member only `read` has is the type's default.
    private static func firstLoss(sent: JSONValue, read: JSONValue, path: String) -> String? {
        let place = path.isEmpty ? "the top level" : path
        switch (sent, read) {
        case let (.object(sentMembers), .object(readMembers)):
            for name in sentMembers.keys.sorted() where sentMembers[name] != .null {
                let memberPath = path.isEmpty ? name : "\(path).\(name)"
                guard let readValue = readMembers[name] else {
                    return "member '\(memberPath)' is not part of the type, which does not read it"
                }
                if let loss = firstLoss(sent: sentMembers[name]!, read: readValue, path: memberPath) { return loss }
            }
            return nil
        case let (.array(sentValues), .array(readValues)):
            guard sentValues.count == readValues.count else {
                return "the array at \(place) has \(sentValues.count) elements, read as \(readValues.count)"
            }
            for index in sentValues.indices {
                if let loss = firstLoss(sent: sentValues[index], read: readValues[index], path: "\(path)[\(index)]") {
                    return loss
                }
            }
            return nil
        case let (.integer(integer), .number(number)), let (.number(number), .integer(integer)):
            return Double(exactly: integer) == number ? nil : "\(sent) at \(place) is read as \(read)"
        default:
            return sent == read ? nil : "\(sent) at \(place) is read as \(read)"
        }
    }

    /// A JSON encoder and decoder set up for the canonical form, made once and kept: making them costs more than
    /// using them for one small value.
    public struct Coder: Sendable {
        let encoder: JSONEncoder
        let decoder: JSONDecoder

        /// A coder for the canonical form: it encodes with sorted keys and unescaped slashes, as
        /// ``CanonicalEncoding/encode(_:)`` does.
        public init() {
            encoder = CanonicalEncoding.foundationEncoder()
            decoder = JSONDecoder()
        }

        /// The canonical bytes of `value`.
        public func encode<Value: Encodable>(_ value: Value) throws -> [UInt8] {
            try encode(value, reservingCapacity: 0)
        }

        /// The canonical bytes of `value`, written into an array made with room for `capacity` bytes: for a large
        /// value whose size is about known (a state's last size), one buffer instead of one regrown and copied
        /// as it fills.
        public func encode<Value: Encodable>(_ value: Value, reservingCapacity capacity: Int) throws -> [UInt8] {
            if let bytes = CanonicalWriting.encode(value, reservingCapacity: capacity) { return bytes }
            Fallbacks.current?.recordEncoding()
            return Array(try encoder.encode(value))
        }

        /// Decodes JSON bytes.
        public func decode<Value: Decodable>(_ type: Value.Type, from bytes: [UInt8]) throws -> Value {
            if let value = CanonicalDecoding.decode(type, from: bytes) { return value }
            Fallbacks.current?.recordDecoding()
            return try decoder.decode(type, from: Data(bytes))
        }
    }

    /// Counts, for the task that binds one, the calls the fast coders left to Foundation's: a test's proof that the
    /// fast path is taken. Read only when a call falls back.
    package final class Fallbacks: Sendable {
        @TaskLocal package static var current: Fallbacks?

        private let counts = LockedValue((encodes: 0, decodes: 0, treeEncodes: 0))

        package init() {}

        /// Encodings and decodings redone with Foundation's coders.
        package var encodes: Int { counts.withLockedValue { $0.encodes } }
        package var decodes: Int { counts.withLockedValue { $0.decodes } }
        /// Encodings the one-pass writer (`CanonicalStream`) left to the tree.
        package var treeEncodes: Int { counts.withLockedValue { $0.treeEncodes } }

        func recordEncoding() { counts.withLockedValue { $0.encodes += 1 } }
        func recordDecoding() { counts.withLockedValue { $0.decodes += 1 } }
        func recordTreeEncoding() { counts.withLockedValue { $0.treeEncodes += 1 } }
    }

    /// Why bytes were refused by ``normalize(_:_:with:)``: a sentence a person can act on.
    public struct NormalizationError: Error, Hashable, Sendable, CustomStringConvertible {
        /// What was wrong with the bytes and where, e.g. "member 'x' is not part of the type, which does not read it".
        public var reason: String
        /// The case the bytes named when the type is an enum that has no such case (`{"restock":{…}}`).
        public var unknownCase: String? = nil
        /// The reason itself.
        public var description: String { reason }
    }

    /// Foundation's words for an enum's JSON whose one member names none of its cases ("Invalid number of keys
    /// found, expected one."), in a person's: the member it found. `nil` for any other error.
    static func unknownCase(_ error: any Error, in bytes: [UInt8]) -> NormalizationError? {
        guard case let DecodingError.typeMismatch(_, context) = error, context.codingPath.isEmpty,
            context.debugDescription.contains("number of keys"),
            case let .object(members)? = try? JSONValue(parsing: bytes)
        else { return nil }
        guard members.count == 1, let name = members.keys.first else {
            let names = members.keys.sorted().map { "'\($0)'" }.joined(separator: ", ")
            return NormalizationError(
                reason: "an action is an object with one member, named after its case; this one has \(members.count)"
                    + (members.isEmpty ? "" : ": \(names)")
            )
        }
        return NormalizationError(reason: "it has no case named '\(name)'", unknownCase: name)
    }

    /// The SHA-256 digest of the canonical bytes of `value`: what `lockstep state` and a SNAPSHOT show. The digest
    /// a DIGEST carries is that of the state's digest form (``digestForm(of:reservingCapacity:)``), the same unless
    /// the state holds a ``DigestedDictionary``.
    public static func digest<Value: Encodable>(of value: Value) throws -> StateDigest {
        StateDigest(of: try encode(value))
    }

    /// The bytes a state's digest is taken over (docs/protocol.md, "Digest forms"): its canonical form, with each
    /// ``DigestedDictionary`` in it written as the count and sum of its members' digests, so a large state's digest
    /// costs what its other members cost; written into room for `capacity` bytes.
    public static func digestForm<Value: Encodable>(
        of value: Value,
        reservingCapacity capacity: Int = 0
    ) throws -> DigestForm {
        let use = DigestFormUse()
        let bytes = try $writingDigestForm.withValue(use) { try Self.bytes(of: value, reservingCapacity: capacity) }
        return DigestForm(bytes: bytes, isCanonicalForm: !use.wasCondensed)
    }

    /// Writes the canonical bytes of `value` to `sink` a chunk of about `chunkBytes` at a time, each once it is final,
    /// so that the whole is never held (`CanonicalDirected`): a large state's snapshot file and digest. `false` when
    /// the value is not written this way (what the sink got is void): ``bytes(of:reservingCapacity:)`` writes it, or
    /// says why it cannot.
    package static func stream<Value: Encodable>(
        _ value: Value,
        chunkBytes: Int = 1 << 20,
        into sink: (UnsafeRawBufferPointer) -> Void
    ) -> Bool {
        guard !CanonicalDecoding.isSpecialCased(Value.self) else { return false }
        return withoutActuallyEscaping(sink) { sink in
            let stream = CanonicalStream()
            stream.streamOut(to: sink, chunkBytes: chunkBytes)
            return CanonicalDirected.write(value, to: stream)
        }
    }

    /// A state's canonical form, or its digest form, streamed a chunk at a time: what was written, hashed
    /// on the way.
    public struct Streamed: Sendable {
        /// The SHA-256 of the bytes written: with ``isCanonicalForm``, the state's digest for DIGEST and SNAPSHOT alike.
        public var digest: StateDigest
        /// How many bytes were written.
        public var bytes: Int
        /// Whether the bytes are the state's canonical form: it holds no ``DigestedDictionary``, or they were not
        /// its digest form.
        public var isCanonicalForm: Bool
    }

    /// Streams `value`'s digest form (``digestForm(of:reservingCapacity:)``), or with `canonical` its canonical form,
    /// to `sink` while hashing it; `nil` when it is not written this way (the sink's bytes are void).
    public static func streamed<Value: Encodable>(
        _ value: Value,
        digestForm: Bool,
        chunkBytes: Int = 1 << 20,
        into sink: (UnsafeRawBufferPointer) -> Void = { _ in }
    ) -> Streamed? {
        withoutActuallyEscaping(sink) { sink in
            var hasher = SHA256()
            var count = 0
            let write = { (bytes: UnsafeRawBufferPointer) in
                hasher.update(bufferPointer: bytes)
                count += bytes.count
                sink(bytes)
            }
            guard digestForm else {
                guard stream(value, chunkBytes: chunkBytes, into: write) else { return nil }
                return Streamed(digest: StateDigest(hasher.finalize()), bytes: count, isCanonicalForm: true)
            }
            let use = DigestFormUse()
            guard $writingDigestForm.withValue(use, operation: { stream(value, chunkBytes: chunkBytes, into: write) })
            else { return nil }
            return Streamed(digest: StateDigest(hasher.finalize()), bytes: count, isCanonicalForm: !use.wasCondensed)
        }
    }

    /// What a state's digest is taken over.
    public struct DigestForm: Sendable {
        /// The digest form's bytes.
        public var bytes: [UInt8]
        /// Whether they are the state's canonical bytes too (it holds no ``DigestedDictionary``): a snapshot can
        /// then keep them as they are.
        public var isCanonicalForm: Bool
        /// The state's digest: their SHA-256.
        public var digest: StateDigest { StateDigest(of: bytes) }
    }

    /// Set while ``digestForm(of:reservingCapacity:)`` writes a value: a ``DigestedDictionary`` then writes its count
    /// and sum, and says so.
    @TaskLocal static var writingDigestForm: DigestFormUse?

    /// The digests of many small values' digest forms, one after another, written by one stream and under one
    /// digest-form scope (``run(_:)``): a `DigestedDictionary`'s sum of its members, where a new writer and a scope
    /// for each member cost more than writing it. Each digest is the one ``digestForm(of:reservingCapacity:)``
    /// gives.
    final class DigestFormDigester {
        private let stream = CanonicalStream()
        private let use = DigestFormUse()

        /// `body`, its values written as digest forms.
        func run<T>(_ body: () throws -> T) rethrows -> T { try $writingDigestForm.withValue(use, operation: body) }

        /// The SHA-256 of `value`'s digest form; called inside ``run(_:)``.
        func digest<Value: Encodable>(of value: Value) throws -> StateDigest {
            if stream.write(value) { return StateDigest(of: stream.out) }
            return try digestForm(of: value).digest
        }
    }

    /// Whether a digest form being written condensed anything.
    final class DigestFormUse: Sendable {
        private let used = LockedValue(false)

        var wasCondensed: Bool { used.withLockedValue { $0 } }
        func condensed() { used.withLockedValue { $0 = true } }
    }
}

/// A SHA-256 digest of a state's canonical encoding, shown as 64 lowercase hex digits.
public struct StateDigest: Hashable, Sendable, Codable, CustomStringConvertible {
    /// The 32 bytes, held inline as four big-endian words: the daemon keeps one per idempotency entry, and an
    /// array each would cost a heap allocation.
    let words: (UInt64, UInt64, UInt64, UInt64)

    /// The digest whose bytes are the four words, big-endian.
    init(words: (UInt64, UInt64, UInt64, UInt64)) {
        self.words = words
    }

    /// The 32 bytes of the digest.
    public var bytes: [UInt8] {
        withUnsafeBytes(of: (words.0.bigEndian, words.1.bigEndian, words.2.bigEndian, words.3.bigEndian)) { Array($0) }
    }

    /// The digest of `data`.
    public init<Bytes: DataProtocol>(of data: Bytes) {
        self.init(SHA256.hash(data: data))
    }

    /// A SHA-256 digest made elsewhere.
    init(_ digest: SHA256.Digest) {
        words = digest.withUnsafeBytes { Self.words(of: $0) }
    }

    /// A digest received from elsewhere; `nil` unless it is exactly 32 bytes.
    public init?(bytes: [UInt8]) {
        guard bytes.count == 32 else { return nil }
        words = bytes.withUnsafeBytes { Self.words(of: $0) }
    }

    private static func words(of raw: UnsafeRawBufferPointer) -> (UInt64, UInt64, UInt64, UInt64) {
        func word(_ index: Int) -> UInt64 { raw[index * 8..<index * 8 + 8].reduce(0) { $0 << 8 | UInt64($1) } }
        return (word(0), word(1), word(2), word(3))
    }

    /// Whether the two digests are the same 32 bytes.
    public static func == (left: StateDigest, right: StateDigest) -> Bool {
        left.words == right.words
    }

    /// Feeds the 32 bytes to `hasher`.
    public func hash(into hasher: inout Hasher) {
        hasher.combine(words.0)
        hasher.combine(words.1)
        hasher.combine(words.2)
        hasher.combine(words.3)
    }

    /// Parses 64 hex digits; `nil` for anything else.
    public init?(hex: String) {
        let utf8 = Array(hex.utf8)
        guard utf8.count == 64 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(32)
        for index in stride(from: 0, to: 64, by: 2) {
            guard let high = Self.nibble(utf8[index]), let low = Self.nibble(utf8[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
        }
        self.init(bytes: bytes)
    }

    /// The 64 lowercase hex digits.
    public var hex: String {
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(64)
        for byte in bytes {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The 64 lowercase hex digits, as ``hex``.
    public var description: String { hex }

    /// Decodes the digest from its 64 hex digits, the form it has in JSON (a replay child's report, for one).
    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let digest = StateDigest(hex: text) else {
            throw DecodingError.dataCorrupted(
                .init(codingPath: decoder.codingPath, debugDescription: "expected 64 hex digits, got \"\(text)\"")
            )
        }
        self = digest
    }

    /// Encodes the digest as its 64 lowercase hex digits.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(hex)
    }

    private static func nibble(_ char: UInt8) -> UInt8? {
        switch char {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): char - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): char - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): char - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}
