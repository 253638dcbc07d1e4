import Foundation
import Lockstep
import LockstepExamples
import TestSupport
import Testing

@testable import LockstepJournal

/// What only the log journal has: its file of records, cut short or damaged, rewritten, and its snapshot files. (What
/// every journal does — commits, ranges, snapshots, idempotency, the outbox, upgrades — runs on it in
/// JournalBehaviourTests, DomainUpgradeTests, OutboxTests and CrashTests.)
@Suite struct LogJournalTests {
    let directory: URL
    let data: String
    let policy = JournalPolicy(snapshotEveryEvents: 20, snapshotsKept: 2, idempotencyEntriesKept: 50)

    init() throws {
        directory = try temporaryDirectory("log-journal")
        data = directory.appendingPathComponent("data").path
    }

    var logPath: String { data + "/" + LogJournal.fileName }

    /// `batches` commits of 5 increments each to the counter, a snapshot when due; returns the last seq.
    @discardableResult
    func commit(_ journal: LogJournal, batches: Int) throws -> UInt64 {
        let recovered = try journal.recover(Counter.self)
        var state = recovered.state
        return try commitIncrements(journal, after: recovered.lastSeq, state: &state, batches: batches)
    }

    func fileSize() throws -> Int {
        try #require(FileManager.default.attributesOfItem(atPath: logPath)[.size] as? Int)
    }

    func append(_ bytes: [UInt8]) throws {
        let handle = try #require(FileHandle(forWritingAtPath: logPath))
        try handle.seekToEnd()
        try handle.write(contentsOf: bytes)
        try handle.close()
    }

    /// Changes the byte at `offset` of the log file.
    func flip(at offset: Int) throws {
        var bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: logPath)))
        bytes[offset] ^= 0x5A
        try Data(bytes).write(to: URL(fileURLWithPath: logPath))
    }

    /// A crash in the middle of an append leaves a record cut short at the end (or zeros the file system gave it):
    /// never acknowledged, so it is cut off at opening, and everything before it recovered.
    @Test func aRecordCutShortAtTheEndIsCutOffAndTheRestRecovered() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let journal = try LogJournal(directory: data, policy: policy)
        let last = try commit(journal, batches: 6)
        try journal.close()
        let whole = try fileSize()

        // A frame whose length (and its checksum) is whole, and 10 of its 1,000 payload bytes.
        var frame = withUnsafeBytes(of: UInt32(1_000).bigEndian) { Array($0) }
        frame += withUnsafeBytes(of: CRC32C.checksum(frame).bigEndian) { Array($0) }
        try append(frame + [UInt8](repeating: 7, count: 10))
        let reopened = try LogJournal(directory: data, policy: policy)
        #expect(try reopened.recover(Counter.self).lastSeq == last)
        #expect(try fileSize() == whole)
        #expect(try commit(reopened, batches: 1) == last + 5)
        try reopened.close()

        let grown = try fileSize()
        try append([UInt8](repeating: 0, count: 4_096))
        let again = try LogJournal(directory: data, policy: policy)
        #expect(try again.recover(Counter.self).lastSeq == last + 5)
        #expect(try fileSize() == grown)
        #expect(try again.verify() == [])
        try again.close()
    }

    /// The file holds synced zeros ahead of its end while the journal is open, so a commit writes inside it, and
    /// closing cuts them off. An append a crash cut short there — its bytes up to any point, zeros after — is the end,
    /// never acknowledged: cut off at opening, at whatever byte it stopped (inside the length, the payload or the
    /// checksum). The last record with a byte flipped, its length or its checksum, followed by those zeros, is damage.
    @Test func anAppendCutShortInsideTheZerosAheadIsTheEnd() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let journal = try LogJournal(directory: data, policy: policy)
        let last = try commit(journal, batches: 6)
        let whileOpen = try fileSize()
        try journal.close()
        let records = try fileSize()
        #expect(
            whileOpen > records && whileOpen <= records + Int(LogStorage.preallocationBytes),
            "\(whileOpen) bytes open, \(records) closed"
        )
        try FileManager.default.removeItem(atPath: data + "/journal.lslog-closed")  // as a crash leaves it

        let whole = try [UInt8](Data(contentsOf: URL(fileURLWithPath: logPath)))
        var lastRecord = LogRecord.headerBytes
        while true {
            let length = Int(whole[lastRecord..<lastRecord + 4].reduce(0) { $0 << 8 | UInt32($1) })
            guard lastRecord + LogRecord.framingBytes + length < whole.count else { break }
            lastRecord += LogRecord.framingBytes + length
        }
        func scanned(_ bytes: [UInt8]) throws -> (end: Int, size: Int, damage: String?) {
            try Data(bytes).write(to: URL(fileURLWithPath: logPath))
            let fd = open(logPath, O_RDONLY | O_CLOEXEC)
            try #require(fd >= 0)
            defer { close(fd) }
            return try LogStorage.scan(fd, journal: logPath) { _ in }
        }
        let zeros = [UInt8](repeating: 0, count: 4_096)
        // Cut short in the last record: in its length, the length's checksum, the payload, before the checksum.
        for kept in [0, 1, 4, 7, 8, 9, 20, records - lastRecord - 5, records - lastRecord - 4] {
            let scan = try scanned(Array(whole[..<(lastRecord + kept)]) + [UInt8](repeating: 0, count: 4_096))
            #expect(scan.end == lastRecord && scan.damage == nil, "\(kept) bytes kept: \(scan)")
        }
        // Opening it cuts it off, with the zeros, and recovers what came before.
        _ = try scanned(Array(whole[..<(records - 4)]) + zeros)
        let reopened = try LogJournal(directory: data, policy: policy)
        #expect(try reopened.recover(Counter.self).lastSeq == last - 5)
        #expect(try fileSize() == lastRecord)
        try reopened.close()

        // Whole, with a byte flipped in its length, its payload or its checksum: damage, zeros after it or not.
        for flipped in [lastRecord + 1, lastRecord + 20, records - 1] {
            var damaged = whole
            damaged[flipped] ^= damaged[flipped] == 0x10 ? 0x20 : 0x10
            let scan = try scanned(damaged + zeros)
            #expect(scan.end == lastRecord && scan.damage?.contains("offset \(lastRecord)") == true, "\(scan)")
        }
        // Cut short, and something after the zeros: damage.
        let scan = try scanned(Array(whole[..<(records - 4)]) + zeros + [1])
        #expect(scan.end == lastRecord && scan.damage != nil, "\(scan)")

        // A checksum cut short keeps its bytes up to a sector's boundary, none after it; a byte that became zero is
        // no cut unless a boundary falls just before it.
        let checksum: UInt32 = 0x1234_ABCD
        #expect(LogStorage.isCutShort(0, of: checksum, at: 100))
        #expect(LogStorage.isCutShort(0x1200_0000, of: checksum, at: 511))
        #expect(LogStorage.isCutShort(0x1234_0000, of: checksum, at: 1_022))
        #expect(LogStorage.isCutShort(0x1234_AB00, of: checksum, at: 509))
        #expect(!LogStorage.isCutShort(0x1234_AB00, of: checksum, at: 510))
        #expect(!LogStorage.isCutShort(0x1234_0000, of: checksum, at: 100))
        #expect(!LogStorage.isCutShort(0x1235_0000, of: checksum, at: 510))
        #expect(!LogStorage.isCutShort(0x1234_00CD, of: checksum, at: 510))
        #expect(!LogStorage.isCutShort(0x1234_ABCE, of: checksum, at: 512))
    }

    /// A log cut short after its writer closed it — which a crash cannot do — is refused by the closed mark the writer
    /// left, even when the cut falls between two records; without the mark (a crash: the writer never closed it), a
    /// record cut short at the end is one never acknowledged, and is cut off.
    @Test func aLogCutShortAfterItWasClosedIsRefused() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let journal = try LogJournal(directory: data, policy: policy)
        let last = try commit(journal, batches: 6)
        try journal.close()
        #expect(FileManager.default.fileExists(atPath: data + "/journal.lslog-closed"))
        let whole = try fileSize()
        let handle = try #require(FileHandle(forWritingAtPath: logPath))
        try handle.truncate(atOffset: UInt64(whole - 3))
        try handle.close()

        // Refused every time: an opening that fails leaves the mark as it found it.
        for readOnly in [true, false, false] {
            let opening = journalError { _ = try LogJournal(directory: data, policy: policy, readOnly: readOnly) }
            #expect(opening?.code == .corrupt, "\(String(describing: opening))")
            #expect(opening?.message.contains("but it was closed at offset \(whole)") == true)
        }

        // A crash: no mark. The same cut is a record never acknowledged.
        try FileManager.default.removeItem(atPath: data + "/journal.lslog-closed")
        let reopened = try LogJournal(directory: data, policy: policy)
        #expect(try reopened.recover(Counter.self).lastSeq == last - 5)
        #expect(!FileManager.default.fileExists(atPath: data + "/journal.lslog-closed"))
        try reopened.close()
    }

    /// A crash while the journal was being made leaves its file shorter than its header (empty, or a part of it):
    /// that is a new journal, not a foreign file.
    @Test(arguments: [0, 3])
    func aFileCutInsideItsHeaderIsANewJournal(length: Int) throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
        try Data("LSJL".utf8.prefix(length)).write(to: URL(fileURLWithPath: logPath))
        let journal = try LogJournal(directory: data, policy: policy)
        #expect(try commit(journal, batches: 2) == 10)
        try journal.close()
        let reopened = try LogJournal(directory: data, policy: policy)
        #expect(try reopened.recover(Counter.self).lastSeq == 10)
        try reopened.close()
    }

    /// A flipped byte anywhere — in a record's payload, or in its length — is damage, never taken for a crash's cut:
    /// opening refuses the journal naming the offset (for reading too, rather than show what comes before it), the
    /// tool's verify says so and exits 5, and a journal open since the byte changed finds it in verify.
    @Test(arguments: ["payload", "length"])
    func aFlippedByteIsFoundByVerifyAndRefusedByOpening(place: String) async throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let journal = try LogJournal(directory: data, policy: policy)
        try commit(journal, batches: 6)
        try journal.close()
        // Offset 8 is the first record's length (after the 8-byte header); its payload starts at 16.
        let reader = try LogJournal(directory: data, readOnly: true)
        try flip(at: place == "length" ? 8 : 20)
        let problems = try reader.verify()
        #expect(problems.map(\.code) == [.corrupt], "\(problems)")
        #expect(problems.first?.message.contains("the record at offset 8") == true, "\(problems)")
        try reader.close()

        for readOnly in [false, true] {
            let opening = journalError { _ = try LogJournal(directory: data, policy: policy, readOnly: readOnly) }
            #expect(opening?.code == .corrupt, "\(String(describing: opening))")
            #expect(opening?.message.contains("the record at offset 8") == true)
        }

        let tool = try await runProduct("lockstep", ["journal", "verify", data])
        #expect(tool.status == 5, "\(tool.standardOutput) \(tool.standardError)")
        #expect((tool.standardOutput + tool.standardError).contains("offset 8"), "\(tool.standardOutput)")
    }

    /// Opening and verify read the log a window at a time, never whole: windows of any size — down to one byte, and
    /// smaller than every record — hand out the same records and find the same end, the same record cut short and the
    /// same damage as one window over the whole file, also past the first window and behind zeros longer than one.
    @Test func theLogIsReadAWindowAtATime() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let journal = try LogJournal(directory: data, policy: policy)
        try commit(journal, batches: 12)
        try journal.close()
        try FileManager.default.removeItem(atPath: data + "/journal.lslog-closed")
        let records = try fileSize()
        try append([UInt8](repeating: 0, count: 300))  // room a crash left after the last append

        struct Scan: Equatable {
            var records: [String] = []
            var end = 0
            var size = 0
            var damage: String?
        }
        /// Where the record after the first `count` begins, read from their framing.
        func offset(after count: Int) throws -> Int {
            let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: logPath)))
            var offset = LogRecord.headerBytes
            for _ in 0..<count {
                offset += LogRecord.framingBytes + Int(bytes[offset..<offset + 4].reduce(0) { $0 << 8 | UInt32($1) })
            }
            return offset
        }
        func scans() throws -> [Scan] {
            let fd = open(logPath, O_RDONLY | O_CLOEXEC)
            try #require(fd >= 0)
            defer { close(fd) }
            return try [Int.max, 1, 7, 64, 1_000].map { window in
                var found = Scan()
                let scan = try LogStorage.scan(fd, journal: logPath, window: window) { record in
                    switch record {
                    case let .register(store): found.records.append("register \(store.name)")
                    case let .commit(plan, _): found.records.append("commit of \(plan.batch.events.count)")
                    }
                }
                (found.end, found.size, found.damage) = scan
                return found
            }
        }
        let whole = try scans()
        #expect(whole.allSatisfy { $0 == whole[0] }, "\(whole)")
        #expect(whole[0].records.count == 13 && whole[0].records.last == "commit of 5", "\(whole[0].records)")
        #expect(whole[0].end == records && whole[0].size == records + 300 && whole[0].damage == nil, "\(whole[0])")

        // The last record cut short: the scan ends where it begins, in every window.
        let handle = try #require(FileHandle(forWritingAtPath: logPath))
        try handle.truncate(atOffset: UInt64(records - 3))
        try handle.close()
        let cut = try scans()
        #expect(cut.allSatisfy { $0 == cut[0] }, "\(cut)")
        let lastRecord = try offset(after: 12)
        #expect(cut[0].records.count == 12 && cut[0].end == lastRecord && cut[0].damage == nil, "\(cut[0])")

        // A byte of the record before it flipped (its payload's last bytes): damage, found at that record's offset.
        try flip(at: cut[0].end - 6)
        let damaged = try scans()
        #expect(damaged.allSatisfy { $0 == damaged[0] }, "\(damaged)")
        #expect(damaged[0].records.count == 11, "\(damaged[0].records)")
        let damage = try #require(damaged[0].damage)
        #expect(damage.contains("the record at offset \(damaged[0].end)") && damage.contains("checksum does not match"))

        // Zeros from the start of the third record on, longer than most windows, then records again: not a crash's
        // room at the end but damage there (a length of 0 whose checksum does not match), in every window.
        let third = try offset(after: 2)
        var bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: logPath)))
        bytes.replaceSubrange(third..<third + 200, with: [UInt8](repeating: 0, count: 200))
        try Data(bytes).write(to: URL(fileURLWithPath: logPath))
        let zeroed = try scans()
        #expect(zeroed.allSatisfy { $0 == zeroed[0] }, "\(zeroed)")
        #expect(zeroed[0].records.count == 2 && zeroed[0].end == third, "\(zeroed[0])")
        #expect(zeroed[0].damage?.contains("its length's checksum does not match") == true, "\(zeroed[0])")
    }

    /// Past its minimum and twice what it held after its last rewrite, the file is written afresh from what is live:
    /// it stays small, and the journal reads the same after it — events, snapshots (one file each, the dropped ones
    /// removed), idempotency entries — through a restart too.
    @Test func theFileIsRewrittenFromWhatIsLiveAndReadsTheSame() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let journal = try LogJournal(directory: data, policy: policy, rewriteMinimumBytes: 4_096)
        let last = try commit(journal, batches: 200)
        let stats = try journal.stats()
        let records = try journal.idempotencyRecords()
        let range = try journal.events(store: Counter.name, from: 1, to: last, limit: 10_000)
        try journal.close()

        // 1,000 events were committed; 2 snapshots, the events since the older one and 50 entries are live.
        let size = try fileSize()
        #expect(size < 16_384, "\(size) bytes")
        let snapshotFiles = try FileManager.default.contentsOfDirectory(atPath: data + "/snapshots")
        #expect(snapshotFiles.count == 2, "\(snapshotFiles)")

        let reopened = try LogJournal(directory: data, policy: policy, rewriteMinimumBytes: 4_096)
        let recovered = try reopened.recover(Counter.self)
        #expect(recovered.lastSeq == last)
        #expect(recovered.state.count == Int(last))
        #expect(try reopened.stats().stores == stats.stores)
        #expect(try reopened.idempotencyRecords() == records)
        #expect(records.count == 50)
        #expect(try reopened.events(store: Counter.name, from: 1, to: last, limit: 10_000) == range)
        #expect(try reopened.verify() == [])
        try reopened.close()
    }

    /// A snapshot staged off the committing thread is written there: the commit that carries it names that file and
    /// writes none; one staged and never committed is removed (at close, or — after a crash — at the next opening).
    @Test func aStagedSnapshotIsTheFileItsCommitNames() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let journal = try LogJournal(directory: data, policy: JournalPolicy(snapshotEveryEvents: 1_000_000))
        let recovered = try journal.recover(Counter.self)
        var state = recovered.state
        let batch = events(Counter.name, from: 1, count: 5) { _ in Counter.Action.increment }
        for _ in batch { Counter.reduce(into: &state, .increment) }
        let snapshot = try JournalSnapshot(store: Counter.name, seq: 5, encoding: state)
        let snapshots = data + "/snapshots"
        try journal.commit(JournalBatch(events: batch, idempotency: idempotency(for: batch)))

        journal.stage(snapshot)
        let staged = try FileManager.default.contentsOfDirectory(atPath: snapshots)
        #expect(staged.count == 1, "\(staged)")
        try journal.commit(JournalBatch(snapshots: [snapshot]))
        #expect(try FileManager.default.contentsOfDirectory(atPath: snapshots) == staged)
        #expect(try journal.snapshot(store: Counter.name, seq: 5) == snapshot)

        // Staged, never committed: gone at close.
        var later = snapshot
        later.seq = 6
        journal.stage(later)
        #expect(try FileManager.default.contentsOfDirectory(atPath: snapshots).count == 2)
        try journal.close()
        #expect(try FileManager.default.contentsOfDirectory(atPath: snapshots) == staged)

        // A file no record names (a crash between staging and committing): gone at the next opening.
        try Data([1, 2, 3]).write(to: URL(fileURLWithPath: snapshots + "/6-stray.snap"))
        let reopened = try LogJournal(directory: data, policy: policy)
        #expect(try FileManager.default.contentsOfDirectory(atPath: snapshots) == staged)
        #expect(try reopened.recover(Counter.self).snapshotSeq == 5)
        try reopened.close()
    }

    /// A snapshot staged as its state streams (`stageSnapshot`) is a file like any other: written a piece at a time,
    /// named by the commit that carries it (with no state in hand), recovered and verified from it. One the writer
    /// drops leaves no file; one whose file is gone is refused by the commit, which says so and keeps nothing.
    @Test func aSnapshotStagedAsItStreamsIsAFileLikeAnyOther() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let journal = try LogJournal(directory: data, policy: JournalPolicy(snapshotEveryEvents: 1_000_000))
        let recovered = try journal.recover(Todos.self)
        var state = recovered.state
        let batch = events(Todos.name, from: 1, count: 300) {
            Todos.Action.add(text: "todo \($0) " + String(repeating: "é", count: Int($0)))
        }
        for event in batch {
            Todos.reduce(into: &state, try CanonicalEncoding.decode(Todos.Action.self, from: Data(event.action)))
        }
        try journal.commit(JournalBatch(events: batch, idempotency: idempotency(for: batch)))
        let snapshots = data + "/snapshots"

        // Dropped by its writer: no file.
        var called = false
        #expect(
            journal.stageSnapshot(
                store: Todos.name,
                seq: 300,
                writing: { sink in
                    called = true
                    [UInt8]("{".utf8).withUnsafeBytes { sink($0) }
                    return nil
                }
            ) == nil
        )
        #expect(called)
        #expect(try FileManager.default.contentsOfDirectory(atPath: snapshots) == [])

        var pieces = 0
        let staged = try #require(
            journal.stageSnapshot(store: Todos.name, seq: 300) { sink in
                CanonicalEncoding.streamed(state, digestForm: false, chunkBytes: 1 << 10) {
                    pieces += 1
                    sink($0)
                }?.digest
            }
        )
        let whole = try CanonicalEncoding.bytes(of: state)
        #expect(pieces > 10, "the state went out in pieces: \(pieces)")
        #expect(staged.state == [] && staged.stagedBytes == whole.count)
        #expect(staged.digest == StateDigest(of: whole))
        try journal.commit(JournalBatch(snapshots: [staged]))
        #expect(try journal.snapshot(store: Todos.name, seq: 300)?.state == whole)

        // A staged snapshot whose file another staging replaced, then committed: refused, nothing kept.
        try journal.commit(
            JournalBatch(
                events: events(Todos.name, from: 301, count: 1) { _ in Todos.Action.setFilter(filter: .showAll) }
            )
        )
        let first = try #require(
            journal.stageSnapshot(store: Todos.name, seq: 301) { sink in
                CanonicalEncoding.streamed(state, digestForm: false, into: sink)?.digest
            }
        )
        var other = state
        other.filter = .showActive
        _ = try #require(
            journal.stageSnapshot(store: Todos.name, seq: 301) { sink in
                CanonicalEncoding.streamed(other, digestForm: false, into: sink)?.digest
            }
        )
        let error = journalError { try journal.commit(JournalBatch(snapshots: [first])) }
        #expect(error?.code == .invalidBatch && error?.message.contains("staged in a file that is gone") == true)
        #expect(try journal.snapshot(store: Todos.name, seq: 301) == nil)
        try journal.close()

        let reopened = try LogJournal(directory: data, policy: policy)
        let again = try reopened.recover(Todos.self)
        #expect(again.snapshotSeq == 300 && again.state == state && again.lastSeq == 301)
        #expect(try reopened.verify() == [])
        try reopened.close()
    }

    /// A snapshot file gone or damaged: verify names it, and recovery refuses the state it cannot prove.
    @Test func aMissingSnapshotFileIsNamedAndItsStateNotTrusted() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let journal = try LogJournal(directory: data, policy: policy)
        try commit(journal, batches: 6)
        try journal.close()
        let snapshots = data + "/snapshots"
        let files = try FileManager.default.contentsOfDirectory(atPath: snapshots)
        #expect(files.count == 1, "\(files)")
        for file in files { try FileManager.default.removeItem(atPath: snapshots + "/" + file) }

        let reader = try LogJournal(directory: data, readOnly: true)
        let codes = Set(try reader.verify().map(\.code))
        #expect(codes == [.corrupt, .digestMismatch], "\(codes)")
        try reader.close()
        let reopened = try LogJournal(directory: data, policy: policy)
        let error = journalError { _ = try reopened.recover(Counter.self) }
        #expect(error?.code == .digestMismatch, "\(String(describing: error))")
        try reopened.close()
    }

    /// One data directory, one journal: neither kind opens for writing beside the other (it would start every store
    /// afresh), and a second writer is refused.
    @Test func oneJournalPerDataDirectory() throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let journal = try LogJournal(directory: data, policy: policy)
        let second = journalError { _ = try LogJournal(directory: data, policy: policy) }
        #expect(second?.code == .inUse)
        try journal.close()
        let sqlite = journalError { _ = try SQLiteJournal(directory: data) }
        #expect(sqlite?.code == .inUse)
        #expect(sqlite?.message.contains("journal.lslog") == true, "\(String(describing: sqlite))")

        let other = directory.appendingPathComponent("other").path
        try SQLiteJournal(directory: other).close()
        let log = journalError { _ = try LogJournal(directory: other) }
        #expect(log?.code == .inUse)
        #expect(log?.message.contains("journal.sqlite") == true, "\(String(describing: log))")
    }
}
