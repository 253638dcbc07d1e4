import Lockstep

/// What one record of a ``LogJournal``'s file says: a store registered, or one commit.
///
/// The file is a header and then records, each framed as
/// `[u32 length][u32 CRC-32C of those 4 bytes][payload: length bytes][u32 CRC-32C of the payload]`, integers
/// big-endian. The length has a checksum of its own so that a damaged length is found as damage, never taken for a
/// record cut short by a crash (only the last record can be that, and only when the file ends inside it).
enum LogRecord {
    case register(StoreRecord)
    case commit(CommitPlan, snapshotFiles: [String])

    /// "LSJL", then the format version.
    static let magic: [UInt8] = Array("LSJL".utf8)
    static let formatVersion: UInt32 = 1
    static let headerBytes = 8
    /// Length and its checksum before the payload, the payload's checksum after it.
    static let framingBytes = 12

    static var header: [UInt8] {
        var writer = LogWriter()
        writer.bytes.append(contentsOf: magic)
        writer.u32(formatVersion)
        return writer.bytes
    }

    private enum Kind: UInt8 {
        case register = 1
        case commit = 2
    }

    /// The record framed for the file.
    func framed() -> [UInt8] {
        var payload = LogWriter()
        encode(into: &payload)
        var framed = LogWriter()
        framed.bytes.reserveCapacity(payload.bytes.count + Self.framingBytes)
        // A commit holds at most 1,000 actions of at most 1 MiB each, and a rewrite's records are cut in chunks.
        precondition(payload.bytes.count < Int(UInt32.max), "a log record of \(payload.bytes.count) bytes")
        framed.u32(UInt32(payload.bytes.count))
        framed.u32(CRC32C.checksum(framed.bytes))
        framed.bytes.append(contentsOf: payload.bytes)
        framed.u32(CRC32C.checksum(payload.bytes))
        return framed.bytes
    }

    private func encode(into writer: inout LogWriter) {
        switch self {
        case let .register(record):
            writer.u8(Kind.register.rawValue)
            writer.string(record.name)
            writer.u32(record.domainVersion)
            writer.u64(record.epoch)
        case let .commit(plan, files):
            writer.u8(Kind.commit.rawValue)
            let batch = plan.batch
            writer.count(batch.events.count)
            for event in batch.events {
                writer.string(event.store)
                writer.u64(event.seq)
                writer.data(event.action)
                writer.data(event.clientID)
                writer.u64(event.requestNumber)
                writer.string(event.author)
                writer.u32(event.checksum)
            }
            writer.count(batch.snapshots.count)
            for (snapshot, file) in zip(batch.snapshots, files) {
                writer.string(snapshot.store)
                writer.u64(snapshot.seq)
                writer.data(snapshot.digest.bytes)
                writer.string(file)
            }
            writer.count(plan.upgrades.count)
            for upgrade in plan.upgrades {
                writer.string(upgrade.store)
                writer.u32(upgrade.version)
                writer.u64(upgrade.sinceSeq)
            }
            writer.count(plan.compactions.count)
            for compaction in plan.compactions {
                writer.string(compaction.store)
                writer.u64(compaction.throughSeq)
            }
            writer.u64(UInt64(clamping: plan.idempotencyKept))
            writer.count(batch.idempotency.count)
            for record in batch.idempotency {
                writer.data(record.key.clientID)
                writer.u64(record.key.requestNumber)
                writer.data(record.fingerprint)
                writer.data(record.reply)
            }
            writer.count(batch.effects.count)
            for effect in batch.effects {
                writer.effectID(effect.id)
                writer.data(effect.body)
                writer.u64(UInt64(clamping: effect.attempts))
                writer.optionalString(effect.lastError)
                writer.u8(effect.dead ? 1 : 0)
            }
            writer.count(batch.effectUpdates.count)
            for update in batch.effectUpdates {
                writer.effectID(update.id)
                switch update.change {
                case .done: writer.u8(1)
                case let .failed(attempts, error, dead):
                    writer.u8(2)
                    writer.u64(UInt64(clamping: attempts))
                    writer.string(error)
                    writer.u8(dead ? 1 : 0)
                case .retry: writer.u8(3)
                case .drop: writer.u8(4)
                }
            }
            writer.count(batch.timerChanges.count)
            for change in batch.timerChanges {
                switch change {
                case let .set(timer):
                    writer.u8(1)
                    writer.string(timer.store)
                    writer.string(timer.key)
                    writer.u64(UInt64(bitPattern: timer.dueMilliseconds))
                    writer.data(timer.action)
                    writer.u64(timer.seq)
                    writer.u64(UInt64(clamping: timer.index))
                case let .remove(store, key):
                    writer.u8(2)
                    writer.string(store)
                    writer.string(key)
                }
            }
        }
    }

    /// The record in `payload` (checksum already checked); `nil` when its bytes do not make one.
    static func decode(_ payload: ArraySlice<UInt8>) -> LogRecord? {
        var reader = LogReader(payload)
        let record = decode(&reader)
        return reader.failed || !reader.isAtEnd ? nil : record
    }

    private static func decode(_ reader: inout LogReader) -> LogRecord? {
        switch Kind(rawValue: reader.u8()) {
        case .register:
            return .register(StoreRecord(name: reader.string(), domainVersion: reader.u32(), epoch: reader.u64()))
        case .commit:
            var batch = JournalBatch()
            for _ in 0..<reader.count() {
                let store = reader.string()
                let seq = reader.u64()
                let action = reader.data()
                let clientID = reader.data()
                let requestNumber = reader.u64()
                let event = JournalEvent(
                    store: store,
                    seq: seq,
                    action: action,
                    clientID: clientID,
                    requestNumber: requestNumber,
                    author: reader.string()
                )
                // Written from the event as it was committed: the same check a stored event gets in SQLite.
                guard reader.u32() == event.checksum else { return nil }
                batch.events.append(event)
            }
            var files: [String] = []
            for _ in 0..<reader.count() {
                let store = reader.string()
                let seq = reader.u64()
                guard let digest = StateDigest(bytes: reader.data()) else { return nil }
                batch.snapshots.append(JournalSnapshot(store: store, seq: seq, state: [], digest: digest))
                files.append(reader.string())
            }
            var plan = CommitPlan(batch: batch, compactions: [], idempotencyKept: 0)
            for _ in 0..<reader.count() {
                plan.upgrades.append(
                    JournalDomainVersion(store: reader.string(), version: reader.u32(), sinceSeq: reader.u64())
                )
            }
            for _ in 0..<reader.count() {
                plan.compactions.append(Compaction(store: reader.string(), throughSeq: reader.u64()))
            }
            plan.idempotencyKept = Int(clamping: reader.u64())
            for _ in 0..<reader.count() {
                let key = IdempotencyKey(clientID: reader.data(), requestNumber: reader.u64())
                plan.batch.idempotency.append(
                    IdempotencyRecord(key: key, fingerprint: reader.data(), reply: reader.data())
                )
            }
            for _ in 0..<reader.count() {
                let id = reader.effectID()
                plan.batch.effects.append(
                    JournalEffect(
                        store: id.store,
                        seq: id.seq,
                        index: id.index,
                        body: reader.data(),
                        attempts: Int(clamping: reader.u64()),
                        lastError: reader.optionalString(),
                        dead: reader.u8() == 1
                    )
                )
            }
            for _ in 0..<reader.count() {
                let id = reader.effectID()
                let change: JournalEffectUpdate.Change
                switch reader.u8() {
                case 1: change = .done
                case 2:
                    change = .failed(
                        attempts: Int(clamping: reader.u64()),
                        error: reader.string(),
                        dead: reader.u8() == 1
                    )
                case 3: change = .retry
                case 4: change = .drop
                default: return nil
                }
                plan.batch.effectUpdates.append(JournalEffectUpdate(id, change))
            }
            for _ in 0..<reader.count() {
                switch reader.u8() {
                case 1:
                    let store = reader.string()
                    let key = reader.string()
                    let due = Int64(bitPattern: reader.u64())
                    let action = reader.data()
                    let seq = reader.u64()
                    plan.batch.timerChanges.append(
                        .set(
                            JournalTimer(
                                store: store,
                                key: key,
                                dueMilliseconds: due,
                                action: action,
                                seq: seq,
                                index: Int(clamping: reader.u64())
                            )
                        )
                    )
                case 2: plan.batch.timerChanges.append(.remove(store: reader.string(), key: reader.string()))
                default: return nil
                }
            }
            return .commit(plan, snapshotFiles: files)
        case nil:
            return nil
        }
    }
}

/// Appends big-endian integers and length-prefixed bytes.
struct LogWriter {
    var bytes: [UInt8] = []

    mutating func u8(_ value: UInt8) { bytes.append(value) }

    mutating func u32(_ value: UInt32) {
        withUnsafeBytes(of: value.bigEndian) { bytes.append(contentsOf: $0) }
    }

    mutating func u64(_ value: UInt64) {
        withUnsafeBytes(of: value.bigEndian) { bytes.append(contentsOf: $0) }
    }

    mutating func count(_ value: Int) { u32(UInt32(value)) }

    mutating func data(_ value: [UInt8]) {
        count(value.count)
        bytes.append(contentsOf: value)
    }

    mutating func string(_ value: String) { data(Array(value.utf8)) }

    mutating func optionalString(_ value: String?) {
        u8(value == nil ? 0 : 1)
        if let value { string(value) }
    }

    mutating func effectID(_ id: JournalEffectID) {
        string(id.store)
        u64(id.seq)
        u64(UInt64(clamping: id.index))
    }
}

/// Reads what ``LogWriter`` wrote. Reading past the end sets ``failed`` and yields zeros and empty values, so a
/// decoder reads on without a check at every field and looks at ``failed`` once at the end.
struct LogReader {
    private let bytes: ArraySlice<UInt8>
    private var position: Int
    private(set) var failed = false

    init(_ bytes: ArraySlice<UInt8>) {
        self.bytes = bytes
        position = bytes.startIndex
    }

    var isAtEnd: Bool { position == bytes.endIndex }

    private mutating func take(_ count: Int) -> ArraySlice<UInt8>? {
        guard !failed, count >= 0, bytes.endIndex - position >= count else {
            failed = true
            return nil
        }
        defer { position += count }
        return bytes[position..<position + count]
    }

    mutating func u8() -> UInt8 { take(1)?.first ?? 0 }

    mutating func u32() -> UInt32 {
        take(4)?.reduce(0) { $0 << 8 | UInt32($1) } ?? 0
    }

    mutating func u64() -> UInt64 {
        take(8)?.reduce(0) { $0 << 8 | UInt64($1) } ?? 0
    }

    /// A count of items that follow: each takes at least a byte, so a count larger than what is left is damage.
    mutating func count() -> Int {
        let value = Int(u32())
        guard value <= bytes.endIndex - position else {
            failed = true
            return 0
        }
        return value
    }

    mutating func data() -> [UInt8] { take(count()).map(Array.init) ?? [] }

    mutating func string() -> String {
        let data = data()
        guard let string = String(validating: data, as: UTF8.self) else {
            failed = true
            return ""
        }
        return string
    }

    mutating func optionalString() -> String? { u8() == 1 ? string() : nil }

    mutating func effectID() -> JournalEffectID {
        JournalEffectID(store: string(), seq: u64(), index: Int(clamping: u64()))
    }
}
