import Foundation
import Lockstep

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A journal of Lockstep's own in the data directory: one append-only file of checksummed records
/// (`journal.lslog`), written with one `pwrite` and one `fdatasync` per commit, and each snapshot in a file of its own
/// (`snapshots/`). The same rules as ``SQLiteJournal`` — the engine is the same — over a storage whose every commit is
/// one record.
///
/// What it holds lives in memory too (the events since each store's oldest snapshot kept, the idempotency entries,
/// the outbox: what the daemon holds anyway); snapshots are read from their files when asked for. Opening reads the
/// file from the start: a record cut short at its end (a crash in the middle of an append that was never
/// acknowledged) is cut off; a damaged record anywhere is refused, naming its offset, never skipped. When the file
/// has grown past both `rewriteMinimumBytes` and twice what it held after its last rewrite, it is written afresh
/// from what is live (a new file, synced, renamed over the old one).
///
/// docs/operations.md, "The journal", says how it is laid out and when to choose it.
public final class LogJournal: EngineJournal {
    /// The log's name in the data directory.
    public static let fileName = LogStorage.fileName

    let engine: JournalEngine<LogStorage>

    /// Opens the journal in `directory`, creating the directory and an empty journal when there is none.
    ///
    /// - Parameters:
    ///   - directory: The data directory: `journal.lslog`, `snapshots/` and the writer's `journal.lock` are in it.
    ///   - policy: When snapshots are due, how many are kept, how many idempotency entries are kept.
    ///   - readOnly: Open for reading only (the CLI's `verify`, `dump`, `stats` and `state`), beside a daemon that
    ///     writes it: nothing is created, cut or locked; what was written after the file was read is not seen, and a
    ///     record the daemon was in the middle of appending is left out. A damaged record is refused as it is when
    ///     opening for writing (``JournalError/Code/corrupt``, naming its offset).
    ///   - rewriteMinimumBytes: The size the file must pass before it is rewritten (64 MiB; tests use less).
    public init(
        directory: String,
        policy: JournalPolicy = JournalPolicy(),
        readOnly: Bool = false,
        rewriteMinimumBytes: Int64 = 64 << 20
    ) throws(JournalError) {
        engine = JournalEngine(
            storage: try LogStorage(
                directory: directory,
                readOnly: readOnly,
                syncs: true,
                rewriteMinimumBytes: rewriteMinimumBytes
            ),
            policy: policy
        )
    }

    /// A journal that never fsyncs: only for the fault suite's proof that its power cuts catch a journal that
    /// acknowledges what is not durable.
    package init(unsyncedForTestingIn directory: String, policy: JournalPolicy) throws(JournalError) {
        engine = JournalEngine(
            storage: try LogStorage(directory: directory, readOnly: false, syncs: false, rewriteMinimumBytes: 64 << 20),
            policy: policy
        )
    }

    /// Copies the log journal in `directory` — which its daemon may be writing — into `destination`, a new or
    /// empty directory: the records whole when it was read, and the snapshot files they keep. A copy during which a
    /// commit removed a snapshot file (compacting) starts again, `attempts` times at most. The copy opens as the
    /// journal stood then; check it with `lockstep journal verify`.
    public static func backup(_ directory: String, to destination: String, attempts: Int = 5) throws(JournalError) {
        try JournalFiles.requireEmpty(destination)
        let tries = max(1, attempts)
        for attempt in 1...tries {
            let journal = try LogJournal(directory: directory, readOnly: true)
            defer { try? journal.close() }
            do throws(JournalError) {
                try journal.engine.storage.copy(to: destination)
                return
            } catch {
                LogStorage.removeCopy(in: destination)
                if error.code != .notFound || attempt == tries { throw error }
            }
        }
    }

    /// Writes the SQLite journal in `directory` as a log journal in `destination`, a new or empty directory: every
    /// store with its epoch and domain versions, its snapshots and the events after the oldest, the idempotency
    /// entries in their order, the outbox. The SQLite journal's writer's lock is held, so no daemon changes it
    /// meanwhile (a running one makes this fail `in_use`), and it is read read-only: nothing of it changes. An event,
    /// effect or timer whose checksum does not match, or a snapshot whose state does not match its digest, is refused,
    /// and nothing is left in `destination`. Point the daemon's `data_dir` at
    /// `destination` (or move it into place) to go on with the log journal.
    public static func convert(sqliteIn directory: String, to destination: String) throws(JournalError) {
        try JournalFiles.requireEmpty(destination)
        let sqlite = URL(fileURLWithPath: directory).appendingPathComponent(SQLiteJournal.fileName).path
        guard SQLiteJournal.exists(in: directory) else {
            throw JournalError(
                code: .notFound,
                file: directory,
                operation: "convert",
                message: "\(directory) holds no SQLite journal (\(SQLiteJournal.fileName)) to convert"
            )
        }
        // Its writer's lock, so that no daemon changes it meanwhile; read-only, so that nothing of it changes (an
        // older format is read as it is, not migrated). The lock goes first: the reader's close then removes the
        // `-wal` and `-shm` its reading made.
        let lock = try WriterLock(directory: directory, journal: sqlite)
        let source: SQLiteJournal
        do throws(JournalError) {
            source = try SQLiteJournal(directory: directory, readOnly: true)
        } catch {
            lock.release()
            throw error
        }
        defer {
            lock.release()
            try? source.close()
        }
        try LogStorage.write(source.engine.storage, asLogJournalIn: destination)
    }

    /// Whether `directory` holds a log journal.
    public static func exists(in directory: String) -> Bool {
        JournalFiles.exists(fileName, in: directory)
    }

    /// The log's size and its snapshot files', in bytes.
    public var fileBytes: Int64 { engine.storage.fileBytes() ?? 0 }

    /// Writes `snapshot`'s file now, off the committing thread: the commit that carries it then only names it.
    public func stage(_ snapshot: JournalSnapshot) {
        engine.storage.stage(snapshot)
    }

    /// Writes a snapshot's file as its state is encoded, off the committing thread: the commit that carries the
    /// snapshot returned then only names it.
    public func stageSnapshot(
        store: String,
        seq: UInt64,
        writing write: (_ sink: (UnsafeRawBufferPointer) -> Void) -> StateDigest?
    ) -> JournalSnapshot? {
        engine.storage.stageSnapshot(store: store, seq: seq, writing: write)
    }

    /// A part of a snapshot's state, read from its file.
    public func snapshotPart(
        store: String,
        seq: UInt64,
        offset: UInt64,
        maximumBytes: Int
    ) throws(JournalError) -> JournalSnapshotPart? {
        try engine.storage.snapshotPart(store: store, seq: seq, offset: offset, maximumBytes: maximumBytes)
    }

    /// Every commit is synced before it returns: nothing to do.
    public func sync() throws(JournalError) {}

    /// Releases the file and the writer's lock. Later calls fail.
    public func close() throws(JournalError) {
        try engine.storage.close()
    }
}

/// The journal in data directory `directory`, whichever of the two local ones it holds: a ``LogJournal`` when
/// `journal.lslog` is there (or `log` asks for a new one), else an ``SQLiteJournal``. What the tools open.
public func openLocalJournal(
    directory: String,
    policy: JournalPolicy = JournalPolicy(),
    readOnly: Bool,
    log: Bool = false
) throws(JournalError) -> any Journal {
    if log || LogJournal.exists(in: directory) {
        return try LogJournal(directory: directory, policy: policy, readOnly: readOnly)
    }
    return try SQLiteJournal(directory: directory, policy: policy, readOnly: readOnly)
}

/// Copies the journal in data directory `directory`, whichever of the two local ones it holds, into `destination` (a
/// new or empty directory) while its daemon may be writing it: ``LogJournal/backup(_:to:attempts:)`` or
/// ``SQLiteJournal/backup(_:to:)``. What `lockstep journal backup` does.
public func backupLocalJournal(directory: String, to destination: String) throws(JournalError) {
    if LogJournal.exists(in: directory) {
        try LogJournal.backup(directory, to: destination)
    } else {
        try SQLiteJournal.backup(directory, to: destination)
    }
}

/// The log file and the snapshot files, with the journal's contents in a ``MemoryStorage`` beside them: every read
/// is answered from memory (snapshots from their files), every write goes to the file first and to memory once it is
/// durable.
final class LogStorage: JournalStorage {
    static let fileName = "journal.lslog"
    static let snapshotFolder = "snapshots"
    /// Events, or idempotency entries, in one record of a rewrite.
    private static let rewriteChunk = 10_000
    private static let snapshotMagic: [UInt8] = Array("LSJS".utf8)
    private static let snapshotHeaderBytes = 16

    let location: String
    let formatVersion = Int(LogRecord.formatVersion)
    let isReadOnly: Bool
    private let directory: String
    private let snapshots: String
    private let syncs: Bool
    private let rewriteMinimumBytes: Int64
    /// What the journal holds; snapshots in it carry no state (it is in their files).
    private let image = MemoryStorage(capacityBytes: nil)
    private let file: LockedValue<FileState>
    private let writerLock: WriterLock?

    private struct SnapshotKey: Hashable {
        var store: String
        var seq: UInt64
    }

    private struct FileState {
        var descriptor: Int32 = -1
        /// Where the next record goes: the end of the last whole record.
        var end: Int64 = 0
        /// The file's size after its last rewrite (or its opening).
        var sizeAfterRewrite: Int64 = 0
        /// The file's size: past ``end``, zeros written and synced ahead of the appends
        /// (``preallocate(_:_:operation:)``).
        var allocated: Int64 = 0
        /// Each snapshot's file, by store and seq.
        var snapshotFiles: [SnapshotKey: String] = [:]
        /// Snapshot files written ahead of their commit (``stage(_:)``), with the digest they hold.
        var staged: [SnapshotKey: (file: String, digest: StateDigest)] = [:]
        /// Why nothing more may be written: a write or an fsync failed, so what the file holds is not known.
        var broken: String?
        /// Closed until the opening is done: an opening that fails leaves no closed mark behind (its `deinit` closes).
        var closed = true
    }

    init(directory: String, readOnly: Bool, syncs: Bool, rewriteMinimumBytes: Int64) throws(JournalError) {
        let path = URL(fileURLWithPath: directory).appendingPathComponent(Self.fileName).path
        location = path
        isReadOnly = readOnly
        self.directory = directory
        snapshots = URL(fileURLWithPath: directory).appendingPathComponent(Self.snapshotFolder).path
        self.syncs = syncs
        self.rewriteMinimumBytes = rewriteMinimumBytes
        file = LockedValue(FileState())
        let fail = { (code: JournalError.Code, message: String) in
            JournalError(code: code, file: path, operation: "open", message: message)
        }
        var state = FileState()
        if readOnly {
            writerLock = nil
            state.descriptor = interruptible { open(path, O_RDONLY | O_CLOEXEC) }
            guard state.descriptor >= 0 else {
                guard errno != ENOENT else {
                    throw fail(.notFound, "there is no journal file; check the data directory (\(directory))")
                }
                throw JournalFiles.ioError(path, "open", "cannot open the journal")
            }
        } else {
            try JournalFiles.makeDirectory(directory, path: path)
            writerLock = try WriterLock(directory: directory, journal: path)
            let sqlite = URL(fileURLWithPath: directory).appendingPathComponent(SQLiteJournal.fileName).path
            guard !FileManager.default.fileExists(atPath: sqlite) else {
                throw fail(
                    .inUse,
                    "the data directory holds an SQLite journal (\(SQLiteJournal.fileName)): a log journal beside it "
                        + "would start every store afresh; set journal = \"sqlite\", or move the directory aside"
                )
            }
            let created = try JournalFiles.createFile(path)
            try JournalFiles.restrictMode(path, journal: path)
            state.descriptor = interruptible { open(path, O_RDWR | O_CLOEXEC) }
            guard state.descriptor >= 0 else { throw JournalFiles.ioError(path, "open", "cannot open the journal") }
            // New — or left shorter than its header by a crash while it was being made: the header (again).
            let found = try Self.readAll(state.descriptor, journal: path, upTo: LogRecord.headerBytes)
            if found.count < LogRecord.headerBytes, LogRecord.header.starts(with: found) {
                try Self.writeAll(state.descriptor, LogRecord.header, at: 0, journal: path)
                guard interruptible({ fdatasync(state.descriptor) }) == 0 else {
                    throw JournalFiles.ioError(path, "open", "cannot sync the new journal")
                }
                if created || found.isEmpty { try JournalFiles.fsyncDirectory(directory, journal: path) }
            }
            unlink(path + ".new")  // a rewrite a crash stopped before its rename
            if !FileManager.default.fileExists(atPath: snapshots) {
                try JournalFiles.makeDirectory(snapshots, path: path)
            }
        }
        do throws(JournalError) {
            try read(into: &state)
        } catch {
            closeDescriptor(state.descriptor)
            throw error
        }
        state.sizeAfterRewrite = state.end
        state.allocated = state.end
        if !readOnly {
            removeUnreferencedSnapshots(state)
            do throws(JournalError) {
                try removeClosedMark()
                try rewriteIfDueAtOpening(&state)
            } catch {
                closeDescriptor(state.descriptor)
                throw error
            }
        }
        state.closed = false
        file.withLockedValue { $0 = state }
    }

    // MARK: Reading the file

    /// Reads every record into the image; a record cut short at the end is cut off (read-write) or left out.
    private func read(into state: inout FileState) throws(JournalError) {
        // The mark first: a daemon that closes the log after it was read here leaves a mark past what was read.
        let closedAt = readClosedMark()
        let bytes = try Self.readAll(state.descriptor, journal: location, upTo: LogRecord.headerBytes)
        let header = LogRecord.header
        guard bytes.count >= header.count, bytes[..<4].elementsEqual(LogRecord.magic) else {
            throw JournalError(
                code: .notAJournal,
                file: location,
                operation: "open",
                message: "the file is not a Lockstep log journal (it does not start with LSJL); move it aside or "
                    + "point the daemon at another data directory"
            )
        }
        guard bytes[..<header.count].elementsEqual(header) else {
            throw JournalError(
                code: .formatVersionMismatch,
                file: location,
                operation: "open",
                message: "the log journal has format version \(bigEndianU32(bytes, at: 4)), but this build "
                    + "reads format version \(LogRecord.formatVersion); run the Lockstep release that wrote it"
            )
        }
        let scan = try Self.scan(state.descriptor, journal: location) { (record) throws(JournalError) in
            try apply(record, state: &state, deleting: false)
        }
        state.end = Int64(scan.end)
        if let closedAt, scan.damage == nil, scan.end < closedAt {
            throw JournalError(
                code: .corrupt,
                file: location,
                operation: "open",
                message:
                    "the log holds whole records up to offset \(scan.end), but it was closed at offset \(closedAt) "
                    + "(\(Self.closedMarkName)): it was cut short since; restore the data directory from a backup"
            )
        }
        if let damage = scan.damage {
            throw JournalError(
                code: .corrupt,
                file: location,
                operation: "open",
                message: "\(damage): what follows cannot be proved; restore the data directory from a backup"
            )
        } else if scan.end < scan.size, !isReadOnly {
            // Zeros filled ahead of the appends, and what of the last append a crash cut short before its fsync
            // returned: never acknowledged.
            guard interruptible({ ftruncate(state.descriptor, off_t(scan.end)) }) == 0,
                !syncs || interruptible({ fdatasync(state.descriptor) }) == 0
            else {
                throw JournalFiles.ioError(location, "open", "cannot cut the unfinished record at offset \(scan.end)")
            }
        }
    }

    /// A record's effect on the image and on the snapshot files' table. `deleting`: remove the files of snapshots
    /// the record made obsolete (a commit just made durable; at opening they are found unreferenced and removed).
    private func apply(_ record: LogRecord, state: inout FileState, deleting: Bool) throws(JournalError) {
        switch record {
        case let .register(record):
            try image.register(record)
        case let .commit(plan, files):
            var obsolete: [String] = []
            for (snapshot, name) in zip(plan.batch.snapshots, files) {
                let key = SnapshotKey(store: snapshot.store, seq: snapshot.seq)
                if let old = state.snapshotFiles[key], old != name { obsolete.append(old) }
                state.snapshotFiles[key] = name
            }
            var stateless = plan
            stateless.batch.snapshots = plan.batch.snapshots.map {
                JournalSnapshot(store: $0.store, seq: $0.seq, state: [], digest: $0.digest)
            }
            try image.write(stateless)
            let touched = Set(plan.compactions.map(\.store))
            if !touched.isEmpty {
                for (key, name) in state.snapshotFiles where touched.contains(key.store) {
                    guard try !image.snapshotSeqs(store: key.store).contains(key.seq) else { continue }
                    state.snapshotFiles[key] = nil
                    obsolete.append(name)
                }
            }
            if deleting {
                for name in obsolete { unlink(snapshotPath(name)) }
            }
        }
    }

    private func removeUnreferencedSnapshots(_ state: FileState) {
        let referenced = Set(state.snapshotFiles.values)
        let found = (try? FileManager.default.contentsOfDirectory(atPath: snapshots)) ?? []
        for name in found where !referenced.contains(name) { unlink(snapshotPath(name)) }
    }

    private func snapshotPath(_ name: String) -> String { snapshots + "/" + name }

    // MARK: Writing

    func register(_ record: StoreRecord) throws(JournalError) {
        try file.withLockedValue { (state: inout FileState) throws(JournalError) in
            try append(LogRecord.register(record).framed(), state: &state, operation: "register")
            try image.register(record)
        }
    }

    /// Writes a snapshot's file ahead of the commit that will carry it, without holding the log: commits go on
    /// meanwhile. A failure is left for that commit, which then writes the file itself.
    func stage(_ snapshot: JournalSnapshot) {
        guard !isReadOnly, let name = try? writeSnapshot(snapshot) else { return }
        staged(name, store: snapshot.store, seq: snapshot.seq, digest: snapshot.digest)
    }

    /// Writes a snapshot's file as `write` hands its state over, a piece at a time; the same for the commit that will
    /// carry it as ``stage(_:)``. `nil` when `write` drops the file or it cannot be written: the commit would then have
    /// no state to write, so the caller makes the snapshot another way.
    func stageSnapshot(
        store: String,
        seq: UInt64,
        writing write: (_ sink: (UnsafeRawBufferPointer) -> Void) -> StateDigest?
    ) -> JournalSnapshot? {
        guard !isReadOnly else { return nil }
        let name = Self.snapshotName(seq: seq)
        var written: (bytes: Int, digest: StateDigest)?
        do {
            _ = try replaceFile(snapshotPath(name), operation: "snapshot") { (fd: Int32) throws(JournalError) in
                var offset = Int64(Self.snapshotHeaderBytes)
                var failure: JournalError?
                let digest = write { piece in
                    guard failure == nil else { return }
                    do throws(JournalError) {
                        try Self.writeAll(fd, piece, at: offset, journal: location)
                        offset += Int64(piece.count)
                    } catch {
                        failure = error
                    }
                }
                if let failure { throw failure }
                guard let digest else { throw JournalFiles.ioError(location, "snapshot", "the state did not stream") }
                let bytes = Int(offset) - Self.snapshotHeaderBytes
                try Self.writeAll(fd, Self.snapshotHeader(stateBytes: bytes), at: 0, journal: location)
                written = (bytes, digest)
            }
            if syncs { try JournalFiles.fsyncDirectory(snapshots, journal: location) }
        } catch {
            return nil
        }
        guard let written else { return nil }
        staged(name, store: store, seq: seq, digest: written.digest)
        return JournalSnapshot(store: store, seq: seq, stagedBytes: written.bytes, digest: written.digest)
    }

    /// File `name` holds the snapshot of `store` at `seq`, with `digest`, for a commit to name.
    private func staged(_ name: String, store: String, seq: UInt64, digest: StateDigest) {
        let replaced = file.withLockedValue { state -> String? in
            guard !state.closed else { return name }
            let key = SnapshotKey(store: store, seq: seq)
            defer { state.staged[key] = (name, digest) }
            return state.staged[key]?.file
        }
        if let replaced { unlink(snapshotPath(replaced)) }
    }

    func write(_ plan: CommitPlan) throws(JournalError) {
        try file.withLockedValue { (state: inout FileState) throws(JournalError) in
            try checkWritable(state, "commit")
            var files: [String] = []
            do throws(JournalError) {
                for snapshot in plan.batch.snapshots {
                    let key = SnapshotKey(store: snapshot.store, seq: snapshot.seq)
                    if let staged = state.staged.removeValue(forKey: key) {
                        if staged.digest == snapshot.digest {
                            files.append(staged.file)
                            continue
                        }
                        unlink(snapshotPath(staged.file))
                    }
                    guard snapshot.stagedBytes == nil else {
                        throw JournalError(
                            code: .invalidBatch,
                            file: location,
                            operation: "commit",
                            message: "the snapshot of store '\(snapshot.store)' at seq \(snapshot.seq) was staged in a "
                                + "file that is gone (another was staged for it, or the journal was reopened): commit "
                                + "it with its state instead"
                        )
                    }
                    files.append(try writeSnapshot(snapshot))
                }
                try append(LogRecord.commit(plan, snapshotFiles: files).framed(), state: &state, operation: "commit")
            } catch {
                // Unless the journal is broken: then the record may be on the disk, naming these files.
                if state.broken == nil {
                    for name in files { unlink(snapshotPath(name)) }
                }
                throw error
            }
            // Staged snapshots of these stores at or below what was just committed will never be.
            for snapshot in plan.batch.snapshots {
                for (key, staged) in state.staged where key.store == snapshot.store && key.seq <= snapshot.seq {
                    state.staged[key] = nil
                    unlink(snapshotPath(staged.file))
                }
            }
            try apply(.commit(plan, snapshotFiles: files), state: &state, deleting: true)
            // The commit is durable: a rewrite that fails now leaves the journal broken for the next one, not this.
            if state.end > max(rewriteMinimumBytes, 2 * state.sizeAfterRewrite) { try? rewrite(&state) }
        }
    }

    private func checkWritable(_ state: FileState, _ operation: String) throws(JournalError) {
        if state.closed || isReadOnly {
            throw JournalError(
                code: .readOnly,
                file: location,
                operation: operation,
                message: state.closed ? "the journal is closed" : "the journal was opened read-only"
            )
        }
        if let broken = state.broken {
            throw JournalError(
                code: .ioError,
                file: location,
                operation: operation,
                message: "\(broken); what the file holds is not known until the journal is opened again"
            )
        }
    }

    /// Appends `record` at the end and syncs it. A write that fails is cut off again (the disk full: the journal
    /// goes on, without the batch); an fsync that fails leaves the journal broken — the page cache no longer says
    /// what the disk holds.
    private func append(_ record: [UInt8], state: inout FileState, operation: String) throws(JournalError) {
        try checkWritable(state, operation)
        try preallocate(Int64(record.count), &state, operation: operation)
        do {
            try Self.writeAll(state.descriptor, record, at: state.end, journal: location)
        } catch {
            // The zeros ahead go too: the next append writes them again.
            let cutBack = interruptible { ftruncate(state.descriptor, off_t(state.end)) } == 0
            state.allocated = state.end
            if error.code != .storageFull || !cutBack {
                state.broken = "a write to the journal failed (\(error.message))"
            }
            throw error
        }
        if syncs, interruptible({ fdatasync(state.descriptor) }) != 0 {
            let error = JournalFiles.ioError(location, operation, "the journal's fsync failed")
            state.broken = "an fsync of the journal failed (\(error.message))"
            throw JournalError(code: .ioError, file: location, operation: operation, message: error.message)
        }
        state.end += Int64(record.count)
        state.allocated = max(state.allocated, state.end)
    }

    /// How far past the end the file holds zeros, written and synced, for the appends to come.
    static let preallocationBytes: Int64 = 4 << 20

    /// Makes room for `count` more bytes inside the file: when the zeros past the end are fewer, zeros up to
    /// ``preallocationBytes`` past what is needed, synced. An append inside the file leaves its size alone, so its
    /// `fdatasync` writes the record and no inode: one write to the disk fewer than an append past the end.
    /// On a disk too full for them the zeros are cut off again and the append grows the file, as it would without.
    private func preallocate(_ count: Int64, _ state: inout FileState, operation: String) throws(JournalError) {
        guard syncs, state.end + count > state.allocated else { return }
        let size = state.end + count + Self.preallocationBytes
        let zeros = [UInt8](repeating: 0, count: Int(size - state.allocated))
        do {
            try Self.writeAll(state.descriptor, zeros, at: state.allocated, journal: location)
        } catch {
            _ = interruptible { ftruncate(state.descriptor, off_t(state.allocated)) }
            return
        }
        guard interruptible({ fdatasync(state.descriptor) }) == 0 else {
            let error = JournalFiles.ioError(
                location,
                operation,
                "the fsync of the zeros ahead of the journal's end failed"
            )
            state.broken = "an fsync of the journal failed (\(error.message))"
            throw JournalError(code: .ioError, file: location, operation: operation, message: error.message)
        }
        state.allocated = size
    }

    /// A new name for `snapshot`'s file, and what the file holds: its header, then the state.
    private static func snapshotFile(_ snapshot: JournalSnapshot) -> (name: String, parts: [[UInt8]]) {
        (snapshotName(seq: snapshot.seq), [snapshotHeader(stateBytes: snapshot.state.count), snapshot.state])
    }

    /// A new name for the file of a snapshot at `seq`.
    private static func snapshotName(seq: UInt64) -> String {
        "\(seq)-\(String(UInt64.random(in: 0...UInt64.max), radix: 16)).snap"
    }

    /// A snapshot file's header, before a state of `stateBytes` bytes.
    private static func snapshotHeader(stateBytes: Int) -> [UInt8] {
        var header = LogWriter()
        header.bytes.append(contentsOf: snapshotMagic)
        header.u32(LogRecord.formatVersion)
        header.u64(UInt64(stateBytes))
        return header.bytes
    }

    /// Writes `snapshot`'s state to a new file of its own, synced, and returns its name.
    private func writeSnapshot(_ snapshot: JournalSnapshot) throws(JournalError) -> String {
        let (name, parts) = Self.snapshotFile(snapshot)
        _ = try replaceFile(snapshotPath(name), with: parts, operation: "snapshot")
        if syncs { try JournalFiles.fsyncDirectory(snapshots, journal: location) }
        return name
    }

    /// Writes `parts` to a new file beside `path` (`.new` after its name), syncs it when the journal syncs, and renames
    /// it over `path`: after a crash, the whole file or none (once the caller has synced the directory). On a failure
    /// the new file is removed. With `keepOpen`, returns its descriptor, open for reading and writing.
    private func replaceFile(
        _ path: String,
        with parts: [[UInt8]],
        operation: String,
        keepOpen: Bool = false
    ) throws(JournalError) -> Int32? {
        try Self.replaceFile(
            path,
            with: parts,
            syncs: syncs,
            journal: location,
            operation: operation,
            keepOpen: keepOpen
        )
    }

    /// The same, the new file written by `write` (given its descriptor) rather than from parts in hand.
    private func replaceFile(
        _ path: String,
        operation: String,
        writing write: (Int32) throws(JournalError) -> Void
    ) throws(JournalError) -> Int32? {
        try Self.replaceFile(
            path,
            syncs: syncs,
            journal: location,
            operation: operation,
            keepOpen: false,
            writing: write
        )
    }

    /// The same for any journal's files (`journal` names it in errors): what a rewrite, a snapshot, the closed mark, a
    /// backup and a conversion write.
    private static func replaceFile(
        _ path: String,
        with parts: [[UInt8]],
        syncs: Bool = true,
        journal: String,
        operation: String,
        keepOpen: Bool = false
    ) throws(JournalError) -> Int32? {
        try replaceFile(path, syncs: syncs, journal: journal, operation: operation, keepOpen: keepOpen) {
            (fd: Int32) throws(JournalError) in
            var offset: Int64 = 0
            for part in parts {
                try writeAll(fd, part, at: offset, journal: journal)
                offset += Int64(part.count)
            }
        }
    }

    private static func replaceFile(
        _ path: String,
        syncs: Bool,
        journal: String,
        operation: String,
        keepOpen: Bool,
        writing write: (Int32) throws(JournalError) -> Void
    ) throws(JournalError) -> Int32? {
        let temporary = path + ".new"
        let fd = interruptible { open(temporary, O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0o600) }
        guard fd >= 0 else { throw JournalFiles.ioError(journal, operation, "cannot create \(temporary)") }
        do throws(JournalError) {
            try write(fd)
            if syncs, interruptible({ fdatasync(fd) }) != 0 {
                let error = JournalFiles.ioError(journal, operation, "cannot sync \(temporary)")
                throw JournalError(code: .ioError, file: journal, operation: operation, message: error.message)
            }
            guard interruptible({ rename(temporary, path) }) == 0 else {
                throw JournalFiles.ioError(journal, operation, "cannot rename \(temporary) to \(path)")
            }
        } catch {
            closeDescriptor(fd)
            unlink(temporary)
            throw error
        }
        guard keepOpen else {
            closeDescriptor(fd)
            return nil
        }
        return fd
    }

    /// Writes the file afresh from what is live, synced, renamed over the old one. A failure before the rename keeps
    /// the old file (tried again once it has grown as much again); one after it leaves the journal broken.
    private func rewrite(_ state: inout FileState) throws(JournalError) {
        try install(try liveRecords(state), &state)
    }

    /// At opening: rewritten at once when the file is more than twice what is live in it (a daemon restarted often
    /// never lives long enough to double what it found); otherwise the live size is where the next rewrite counts from.
    private func rewriteIfDueAtOpening(_ state: inout FileState) throws(JournalError) {
        let live = try liveRecords(state)
        if state.end > max(rewriteMinimumBytes, 2 * Int64(live.count)) {
            try install(live, &state)
        } else {
            state.sizeAfterRewrite = Int64(live.count)
        }
    }

    /// The header and the records that make what the journal holds now: each store's registration, versions, events
    /// and snapshots, then the idempotency entries in their order and the outbox.
    private func liveRecords(_ state: FileState) throws(JournalError) -> [UInt8] {
        try Self.records(of: image) { state.snapshotFiles[SnapshotKey(store: $0.store, seq: $0.seq)] ?? "" }
    }

    /// The header and the records that make what `image` holds, each snapshot in the file `file` names for it: each
    /// store's registration, versions, events and snapshots, then the idempotency entries in their order and the
    /// outbox. An event, effect or timer whose stored checksum does not match is refused
    /// (``JournalError/Code/checksumMismatch``): it is never written again under a checksum of its own.
    private static func records(
        of image: some JournalStorage,
        file: (JournalSnapshot) throws(JournalError) -> String
    ) throws(JournalError) -> [UInt8] {
        var bytes = LogRecord.header
        for record in try image.storeRecords() {
            let versions = try image.versionHistory(store: record.name)
            var first = record
            first.domainVersion = versions.first?.version ?? record.domainVersion
            bytes += LogRecord.register(first).framed()
            var plan = CommitPlan(batch: JournalBatch(), compactions: [], idempotencyKept: .max)
            plan.upgrades = Array(versions.dropFirst())
            for seq in try image.snapshotSeqs(store: record.name) {
                if let snapshot = try image.snapshot(store: record.name, seq: seq) {
                    plan.batch.snapshots.append(snapshot)
                }
            }
            var files: [String] = []
            for snapshot in plan.batch.snapshots { files.append(try file(snapshot)) }
            for index in plan.batch.snapshots.indices { plan.batch.snapshots[index].state = [] }
            bytes += LogRecord.commit(plan, snapshotFiles: files).framed()
            // The events in records of at most `rewriteChunk` each, or 64 MiB of actions: no record near the u32
            // length's limit.
            var events = CommitPlan(batch: JournalBatch(), compactions: [], idempotencyKept: .max)
            var actionBytes = 0
            try image.forEachEvent(store: record.name, from: 0, through: .max) { (stored) throws(JournalError) in
                guard stored.checksumMatches else {
                    throw JournalError(
                        code: .checksumMismatch,
                        file: image.location,
                        operation: "convert",
                        store: record.name,
                        seq: stored.event.seq,
                        message: "the event's stored checksum does not match its bytes: the event is damaged"
                    )
                }
                events.batch.events.append(stored.event)
                actionBytes += stored.event.action.count
                if events.batch.events.count == Self.rewriteChunk || actionBytes >= 64 << 20 {
                    bytes += LogRecord.commit(events, snapshotFiles: []).framed()
                    events.batch.events.removeAll(keepingCapacity: true)
                    actionBytes = 0
                }
            }
            if !events.batch.events.isEmpty { bytes += LogRecord.commit(events, snapshotFiles: []).framed() }
        }
        var rest = CommitPlan(batch: JournalBatch(), compactions: [], idempotencyKept: .max)
        try image.forEachIdempotencyRecord {
            rest.batch.idempotency.append($0)
            if rest.batch.idempotency.count == Self.rewriteChunk {
                bytes += LogRecord.commit(rest, snapshotFiles: []).framed()
                rest.batch.idempotency.removeAll(keepingCapacity: true)
            }
        }
        let outbox = try image.storedOutbox()
        let damaged =
            outbox.effects.first { Int64($0.0.checksum) != $0.1 }.map { ($0.0.store, $0.0.seq, "effect") }
            ?? outbox.timers.first { Int64($0.0.checksum) != $0.1 }.map { ($0.0.store, $0.0.seq, "timer") }
        if let (store, seq, what) = damaged {
            throw JournalError(
                code: .checksumMismatch,
                file: image.location,
                operation: "convert",
                store: store,
                seq: seq,
                message: "the \(what)'s stored checksum does not match its fields: it is damaged"
            )
        }
        rest.batch.effects = outbox.effects.map(\.0)
        rest.batch.timerChanges = outbox.timers.map { .set($0.0) }
        bytes += LogRecord.commit(rest, snapshotFiles: []).framed()
        return bytes
    }

    /// Writes what `source` holds — a journal whose writer's lock the caller holds, so no daemon changes it meanwhile —
    /// as the journal of `destination`, a new or empty directory: its snapshots in files of their own, then the log,
    /// synced, with its closed mark.
    static func write(_ source: some JournalStorage, asLogJournalIn destination: String) throws(JournalError) {
        let log = URL(fileURLWithPath: destination).appendingPathComponent(fileName).path
        let folder = URL(fileURLWithPath: destination).appendingPathComponent(snapshotFolder).path
        try JournalFiles.makeDirectory(destination, path: log)
        // Taken before anything is written, and what is written is removed only under it: another writer's files are
        // never touched.
        let lock = try WriterLock(directory: destination, journal: log)
        defer { lock.release() }
        do throws(JournalError) {
            try JournalFiles.makeDirectory(folder, path: log)
            let bytes = try records(of: source) { (snapshot) throws(JournalError) in
                guard StateDigest(of: snapshot.state) == snapshot.digest else {
                    throw JournalError(
                        code: .digestMismatch,
                        file: source.location,
                        operation: "convert",
                        store: snapshot.store,
                        seq: snapshot.seq,
                        message: "the snapshot's state does not match its digest: the snapshot is damaged"
                    )
                }
                let (name, parts) = snapshotFile(snapshot)
                _ = try replaceFile(folder + "/" + name, with: parts, journal: log, operation: "convert")
                return name
            }
            try JournalFiles.fsyncDirectory(folder, journal: log)
            // The log last, beside its name and renamed: a conversion cut short leaves no journal a daemon would open.
            _ = try replaceFile(log, with: [bytes], journal: log, operation: "convert")
            let mark = [closedMark(Int64(bytes.count))]
            _ = try replaceFile(destination + "/" + closedMarkName, with: mark, journal: log, operation: "convert")
            try JournalFiles.fsyncDirectory(destination, journal: log)
        } catch {
            removeCopy(in: destination)
            // Ours, and held: a retry finds the directory empty again.
            unlink(destination + "/" + WriterLock.fileName)
            throw error
        }
    }

    /// `bytes` as the journal's file: written beside it, synced, renamed over it, its directory synced.
    private func install(_ bytes: [UInt8], _ state: inout FileState) throws(JournalError) {
        guard let fd = try? replaceFile(location, with: [bytes], operation: "rewrite", keepOpen: true) else {
            state.sizeAfterRewrite = state.end
            return
        }
        closeDescriptor(state.descriptor)
        state.descriptor = fd
        state.end = Int64(bytes.count)
        state.sizeAfterRewrite = state.end
        state.allocated = state.end
        if syncs {
            do throws(JournalError) {
                try JournalFiles.fsyncDirectory(directory, journal: location)
            } catch {
                state.broken = "the directory's fsync after the journal's rewrite failed (\(error.message))"
                throw JournalError(code: .ioError, file: location, operation: "rewrite", message: error.message)
            }
        }
    }

    // MARK: Reads: from memory, snapshots from their files

    func storeRecord(named name: String) throws(JournalError) -> StoreRecord? { try image.storeRecord(named: name) }
    func storeRecords() throws(JournalError) -> [StoreRecord] { try image.storeRecords() }
    func versionHistory(store: String) throws(JournalError) -> [JournalDomainVersion] {
        try image.versionHistory(store: store)
    }
    func snapshotSeqs(store: String) throws(JournalError) -> [UInt64] { try image.snapshotSeqs(store: store) }

    /// The snapshot with its state read from its file — opened under the log's lock, so a commit's compaction cannot
    /// remove it between finding its name and opening it. A file missing or damaged gives the bytes found (none, when
    /// missing): the digest check every reader makes then refuses it, naming the store and the seq.
    func snapshot(store: String, seq: UInt64) throws(JournalError) -> JournalSnapshot? {
        let key = SnapshotKey(store: store, seq: seq)
        let (found, opened, failure) = try file.withLockedValue {
            (state: inout FileState) throws(JournalError) -> (JournalSnapshot?, Int32, Int32) in
            guard let snapshot = try image.snapshot(store: store, seq: seq) else { return (nil, -1, 0) }
            guard let name = state.snapshotFiles[key] else { return (snapshot, -1, ENOENT) }
            let fd = interruptible { open(snapshotPath(name), O_RDONLY | O_CLOEXEC) }
            return (snapshot, fd, fd < 0 ? errno : 0)
        }
        guard var snapshot = found else { return nil }
        guard opened >= 0 else {
            guard failure == ENOENT else {
                errno = failure
                throw JournalFiles.ioError(location, "snapshot", "cannot open the snapshot file of seq \(seq)")
            }
            return snapshot
        }
        defer { closeDescriptor(opened) }
        if let bytes = try? Self.snapshotState(opened, journal: location) { snapshot.state = bytes }
        return snapshot
    }

    /// The state bytes of an open snapshot file; throws when its header or length is wrong.
    private static func snapshotState(_ fd: Int32, journal: String) throws(JournalError) -> [UInt8] {
        // The state is read into its own array (a large one is not held twice, as cutting a header off would), and
        // only after a header that is one.
        let count = try snapshotStateBytes(fd, journal: journal)
        let state = try readAll(fd, journal: journal, from: snapshotHeaderBytes)
        guard state.count == count else { throw damagedSnapshot(journal) }
        return state
    }

    /// The size of the state in an open snapshot file, as its header says and its length agrees; throws when either
    /// is wrong.
    private static func snapshotStateBytes(_ fd: Int32, journal: String) throws(JournalError) -> Int {
        var reader = LogReader(try readAll(fd, journal: journal, upTo: snapshotHeaderBytes)[...])
        let magic = [reader.u8(), reader.u8(), reader.u8(), reader.u8()]
        let version = reader.u32()
        let count = reader.u64()
        var info = stat()
        guard !reader.failed, magic == snapshotMagic, version == LogRecord.formatVersion,
            count <= UInt64(Int64.max) - UInt64(snapshotHeaderBytes),
            interruptible({ fstat(fd, &info) }) == 0, Int64(info.st_size) == Int64(snapshotHeaderBytes) + Int64(count)
        else { throw damagedSnapshot(journal) }
        return Int(count)
    }

    private static func damagedSnapshot(_ journal: String) -> JournalError {
        JournalError(
            code: .corrupt,
            file: journal,
            operation: "snapshot",
            message: "the snapshot file is damaged: its header or its length is wrong"
        )
    }

    /// Up to `maximumBytes` of the state of `store`'s snapshot at `seq` (its newest when `seq` is 0) from `offset`,
    /// read from its file — opened under the log's lock, as ``snapshot(store:seq:)`` opens it. `nil` when no snapshot
    /// is kept there or its file is gone (compacted since), or `offset` is at or past its end.
    func snapshotPart(
        store: String,
        seq wanted: UInt64,
        offset: UInt64,
        maximumBytes: Int
    ) throws(JournalError) -> JournalSnapshotPart? {
        let (found, opened) = try file.withLockedValue {
            (state: inout FileState) throws(JournalError) -> (JournalSnapshot?, Int32) in
            let seq = wanted > 0 ? wanted : try image.snapshotSeqs(store: store).last ?? 0
            guard let snapshot = try image.snapshot(store: store, seq: seq),
                let name = state.snapshotFiles[SnapshotKey(store: store, seq: seq)]
            else { return (nil, -1) }
            return (snapshot, interruptible { open(snapshotPath(name), O_RDONLY | O_CLOEXEC) })
        }
        guard let snapshot = found, opened >= 0 else { return nil }
        defer { closeDescriptor(opened) }
        let total = try Self.snapshotStateBytes(opened, journal: location)
        guard offset < UInt64(total) else { return nil }
        let count = min(maximumBytes, total - Int(offset))
        let bytes = try Self.readAll(
            opened,
            journal: location,
            from: Self.snapshotHeaderBytes + Int(offset),
            upTo: count
        )
        guard bytes.count == count else { throw Self.damagedSnapshot(location) }
        return JournalSnapshotPart(seq: snapshot.seq, total: total, digest: snapshot.digest, bytes: bytes)
    }

    /// The state bytes of the snapshot file `name`; throws when it is missing or damaged.
    private func readSnapshotFile(_ name: String) throws(JournalError) -> [UInt8] {
        let path = snapshotPath(name)
        let fd = interruptible { open(path, O_RDONLY | O_CLOEXEC) }
        guard fd >= 0 else { throw JournalFiles.ioError(location, "snapshot", "cannot open \(path)") }
        defer { closeDescriptor(fd) }
        do throws(JournalError) {
            return try Self.snapshotState(fd, journal: location)
        } catch {
            throw JournalError(
                code: error.code,
                file: location,
                operation: "snapshot",
                message: "\(path): \(error.message)"
            )
        }
    }

    func forEachEvent(
        store: String,
        from: UInt64,
        through: UInt64,
        _ body: (StoredEvent) throws(JournalError) -> Void
    ) throws(JournalError) {
        try image.forEachEvent(store: store, from: from, through: through, body)
    }

    func eventSummary(store: String) throws(JournalError) -> (first: UInt64, last: UInt64, count: Int)? {
        try image.eventSummary(store: store)
    }

    func readRange(
        store: String,
        from: UInt64,
        to: UInt64,
        limit: Int,
        maximumBytes: Int
    ) throws(JournalError) -> StoredRange {
        try image.readRange(store: store, from: from, to: to, limit: limit, maximumBytes: maximumBytes)
    }

    func idempotencyRecord(for key: IdempotencyKey) throws(JournalError) -> IdempotencyRecord? {
        try image.idempotencyRecord(for: key)
    }

    func forEachIdempotencyRecord(_ body: (IdempotencyRecord) throws(JournalError) -> Void) throws(JournalError) {
        try image.forEachIdempotencyRecord(body)
    }

    func idempotencyCount() throws(JournalError) -> Int { try image.idempotencyCount() }

    func storedOutbox() throws(JournalError) -> (effects: [(JournalEffect, Int64)], timers: [(JournalTimer, Int64)]) {
        try image.storedOutbox()
    }

    /// The log's size and every snapshot file's.
    func fileBytes() -> Int64? {
        let (end, names) = file.withLockedValue { ($0.end, Array($0.snapshotFiles.values)) }
        return names.reduce(end) { total, name in
            var info = stat()
            return total + (interruptible({ stat(snapshotPath(name), &info) }) == 0 ? Int64(info.st_size) : 0)
        }
    }

    /// A damaged record in the log, and every snapshot file missing or damaged. (Opening refuses a log with a damaged
    /// record; it is read again from the disk here, so a byte changed since the journal was opened is found too.)
    func integrityProblems() throws(JournalError) -> [String] {
        let files = file.withLockedValue { $0.snapshotFiles }
        var problems: [String] = []
        let descriptor = interruptible { open(location, O_RDONLY | O_CLOEXEC) }
        guard descriptor >= 0 else { throw JournalFiles.ioError(location, "verify", "cannot open the journal") }
        defer { closeDescriptor(descriptor) }
        let closedAt = isReadOnly ? readClosedMark() : nil
        let scan = try Self.scan(descriptor, journal: location, { _ in })
        if let found = scan.damage { problems.append(found) }
        if scan.damage == nil, let closedAt, scan.end < closedAt {
            problems.append("the log holds whole records up to offset \(scan.end), but it was closed at \(closedAt)")
        }
        for (key, name) in files.sorted(by: { ($0.key.store, $0.key.seq) < ($1.key.store, $1.key.seq) }) {
            do throws(JournalError) {
                _ = try readSnapshotFile(name)
            } catch {
                problems.append("store \(key.store), snapshot at seq \(key.seq): \(error.message)")
            }
        }
        return problems
    }

    /// Closes the log; a writer that closes it whole leaves the closed mark (its end offset) beside it.
    func close() throws(JournalError) {
        let (fd, end, whole, staged) = file.withLockedValue { state -> (Int32, Int64, Bool, [String]) in
            defer {
                state.closed = true
                state.descriptor = -1
                state.staged = [:]
            }
            return (state.descriptor, state.end, !state.closed && state.broken == nil, state.staged.values.map(\.file))
        }
        // A log closed whole ends with its last record: the zeros ahead of it go (a crash leaves them, and the next
        // opening cuts them off).
        if fd >= 0, whole, !isReadOnly { _ = interruptible { ftruncate(fd, off_t(end)) } }
        if fd >= 0 { closeDescriptor(fd) }
        for name in staged { unlink(snapshotPath(name)) }
        defer { writerLock?.release() }
        if whole, !isReadOnly, syncs { try writeClosedMark(end) }
    }

    // MARK: The closed mark

    /// Beside the log while no daemon writes it: where the log ended when its writer closed it. A log that ends
    /// earlier was cut short after it closed — which a crash's cut cannot do — and is refused; a crash leaves no mark,
    /// and then a record cut short at the end is one that was never acknowledged.
    static let closedMarkName = "journal.lslog-closed"
    private static let closedMagic: [UInt8] = Array("LSJC".utf8)

    private var closedMarkPath: String { directory + "/" + Self.closedMarkName }

    /// The offset the mark gives, when there is a whole one.
    private func readClosedMark() -> Int64? {
        guard let data = FileManager.default.contents(atPath: closedMarkPath), data.count == 16 else { return nil }
        let bytes = [UInt8](data)
        var reader = LogReader(bytes[...])
        let magic = [reader.u8(), reader.u8(), reader.u8(), reader.u8()]
        let offset = reader.u64()
        guard magic == Self.closedMagic, reader.u32() == CRC32C.checksum(bytes[..<12]) else { return nil }
        return Int64(bitPattern: offset)
    }

    /// Writes the mark, synced, renamed into place, the directory synced.
    private func writeClosedMark(_ end: Int64) throws(JournalError) {
        _ = try replaceFile(closedMarkPath, with: [Self.closedMark(end)], operation: "close")
        try JournalFiles.fsyncDirectory(directory, journal: location)
    }

    /// The mark's 16 bytes for a log that ends at `end`.
    private static func closedMark(_ end: Int64) -> [UInt8] {
        var writer = LogWriter()
        writer.bytes.append(contentsOf: closedMagic)
        writer.u64(UInt64(end))
        writer.u32(CRC32C.checksum(writer.bytes))
        return writer.bytes
    }

    /// Removes the mark before the first append: from now on the log may grow, and a crash may cut it.
    private func removeClosedMark() throws(JournalError) {
        guard unlink(closedMarkPath) == 0 || errno == ENOENT else {
            throw JournalFiles.ioError(location, "open", "cannot remove \(closedMarkPath)")
        }
        if syncs { try JournalFiles.fsyncDirectory(directory, journal: location) }
    }

    deinit {
        try? close()
    }

    // MARK: A copy while the daemon writes

    /// Copies what this storage read — the log's whole records up to where they ended, read again from the same open
    /// file (a rewrite renames a new file over the name, never writes into this one, and appends only go past the
    /// end), and the snapshot files they keep — into `destination`, a new or empty directory, with a closed mark at
    /// the copy's end (so a copy cut short later is refused, as the log is). The snapshot files are all opened first:
    /// one a commit's compaction removes after that is still read whole. Throws ``JournalError/Code/notFound`` when
    /// one was removed before (a copy read again after it finds the newer ones).
    func copy(to destination: String) throws(JournalError) {
        let (descriptor, end, names) = file.withLockedValue { ($0.descriptor, $0.end, Set($0.snapshotFiles.values)) }
        let log = URL(fileURLWithPath: destination).appendingPathComponent(Self.fileName).path
        let folder = URL(fileURLWithPath: destination).appendingPathComponent(Self.snapshotFolder).path
        var sources: [(name: String, descriptor: Int32)] = []
        defer { for source in sources { closeDescriptor(source.descriptor) } }
        for name in names.sorted() {
            let source = interruptible { open(snapshotPath(name), O_RDONLY | O_CLOEXEC) }
            guard source >= 0 else {
                guard errno == ENOENT else {
                    throw JournalFiles.ioError(location, "backup", "cannot open the snapshot file \(name)")
                }
                throw JournalError(
                    code: .notFound,
                    file: location,
                    operation: "backup",
                    message: "the snapshot file \(name) was removed between reading the log and copying it"
                )
            }
            sources.append((name, source))
        }
        try JournalFiles.makeDirectory(destination, path: log)
        try JournalFiles.makeDirectory(folder, path: log)
        for source in sources {
            let bytes = try Self.readAll(source.descriptor, journal: location)
            _ = try Self.replaceFile(folder + "/" + source.name, with: [bytes], journal: log, operation: "backup")
        }
        try JournalFiles.fsyncDirectory(folder, journal: log)
        let bytes = try Self.readAll(descriptor, journal: location, upTo: Int(end))
        guard bytes.count == Int(end) else {
            throw JournalError(
                code: .ioError,
                file: location,
                operation: "backup",
                message: "the log held \(bytes.count) bytes where it had \(end) when it was read"
            )
        }
        _ = try Self.replaceFile(log, with: [bytes], journal: log, operation: "backup")
        let mark = [Self.closedMark(end)]
        _ = try Self.replaceFile(destination + "/" + Self.closedMarkName, with: mark, journal: log, operation: "backup")
        try JournalFiles.fsyncDirectory(destination, journal: log)
    }

    /// Removes what ``copy(to:)`` or a conversion writes in `destination` — and nothing else there, nor `destination`
    /// itself (a conversion's lock file stays: another writer may hold it).
    static func removeCopy(in destination: String) {
        for name in [fileName, fileName + ".new", closedMarkName] { unlink(destination + "/" + name) }
        let folder = destination + "/" + snapshotFolder
        for name in (try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? [] where name.hasSuffix(".snap") {
            unlink(folder + "/" + name)
        }
        rmdir(folder)
    }

    // MARK: Whole reads and writes

    /// Reads the log's records after its header through `fd`, a window of ``scanWindowBytes`` at a time (or one record
    /// when it is longer), handing each whole one to `each`: where the whole ones end (what follows is a record cut
    /// short, or nothing), the file's size when the scan began, and the first damaged record, described, when there is
    /// one — the scan stops there. Memory: one window, however long the log.
    ///
    /// An append a crash cut short before its fsync returned is the end, not damage: a record that goes past the end
    /// of the file, or — inside the zeros written ahead of the appends — a record whose bytes are the append's up to
    /// some point and zeros from there to the end of the file: its checksum, or the part of it after a sector's
    /// boundary, never written; or its length in part, nothing after it. A flipped byte leaves the record's checksum
    /// and what follows it in place (``isCutShort(_:of:at:)``), so it is damage, as is a record followed by anything
    /// but zeros.
    static func scan(
        _ fd: Int32,
        journal: String,
        window: Int = scanWindowBytes,
        _ each: (LogRecord) throws(JournalError) -> Void
    ) throws(JournalError) -> (end: Int, size: Int, damage: String?) {
        var file = LogWindow(fd: fd, journal: journal, size: try fileSize(fd, journal: journal), window: window)
        var offset = LogRecord.headerBytes
        while try file.holds(offset, 8) {
            // Zeros to the end: room the file system gave an append that a crash cut short, or zeros written ahead.
            // (Looking may have moved the window past the record.)
            if try file.zerosToTheEnd(from: offset) { break }
            guard try file.holds(offset, 8) else { break }
            let length = Int(file.u32(at: offset))
            guard CRC32C.checksum(file[offset..<offset + 4]) == file.u32(at: offset + 4) else {
                // Its length written in part: an append cut short, when nothing but zeros follows.
                if try file.zerosToTheEnd(from: offset + 8) { break }
                return (
                    offset, file.size, "the record at offset \(offset) is damaged: its length's checksum does not match"
                )
            }
            guard try file.holds(offset, length + LogRecord.framingBytes) else { break }
            let payload = file[offset + 8..<offset + 8 + length]
            let checksum = CRC32C.checksum(payload)
            let stored = file.u32(at: offset + 8 + length)
            guard checksum == stored else {
                // Cut short: the checksum's bytes are the payload's own up to where zeros begin, and zeros follow.
                let end = offset + length + LogRecord.framingBytes
                if Self.isCutShort(stored, of: checksum, at: end - 4), try file.zerosToTheEnd(from: end) { break }
                return (
                    offset, file.size,
                    "the record at offset \(offset) (\(length) bytes) is damaged: its checksum does not match"
                )
            }
            guard let record = LogRecord.decode(payload) else {
                return (
                    offset, file.size,
                    "the record at offset \(offset) (\(length) bytes) has a matching checksum but does not decode: "
                        + "it was written by another build"
                )
            }
            try each(record)
            offset += length + LogRecord.framingBytes
        }
        return (offset, file.size, nil)
    }

    /// Whether `stored`, the big-endian checksum at `offset`, is `checksum` cut short by a crash: zeros, or its bytes
    /// up to a sector's boundary (where a write cut short stops) and zeros after it. A flipped byte that leaves zeros
    /// there is taken for a cut only when a boundary falls just before them.
    static func isCutShort(_ stored: UInt32, of checksum: UInt32, at offset: Int) -> Bool {
        guard stored != 0 else { return true }
        let kept = sectorBytes - offset % sectorBytes
        guard kept < 4 else { return false }
        let zeros = UInt32(32 - 8 * kept)
        return stored & (UInt32.max >> (32 - zeros)) == 0 && stored >> zeros == checksum >> zeros
    }

    /// The smallest unit a disk writes whole: a write a crash cuts short keeps a whole number of them.
    static let sectorBytes = 512

    /// How much of the log a scan reads at a time.
    static let scanWindowBytes = 4 << 20

    /// A part of the log file in memory, read again from where a scan needs it when it does not hold that.
    private struct LogWindow {
        let fd: Int32
        let journal: String
        /// The file's size when the scan began: a live log read by a tool may grow meanwhile, past what is scanned.
        let size: Int
        let window: Int
        private var base = 0
        private var bytes: [UInt8] = []

        init(fd: Int32, journal: String, size: Int, window: Int) {
            self.fd = fd
            self.journal = journal
            self.size = size
            self.window = window
        }

        /// Whether the file has bytes `offset..<offset + count`, reading them (and what follows, to a window) when
        /// they are not in memory.
        mutating func holds(_ offset: Int, _ count: Int) throws(JournalError) -> Bool {
            if offset >= base, offset + count <= base + bytes.count { return true }
            guard offset + count <= size else { return false }
            bytes = try LogStorage.readAll(
                fd,
                journal: journal,
                from: offset,
                upTo: min(size - offset, max(count, window))
            )
            base = offset
            return bytes.count >= count  // shorter than it was a moment ago
        }

        /// Whether every byte from `offset` to the end of the file is zero.
        mutating func zerosToTheEnd(from offset: Int) throws(JournalError) -> Bool {
            var at = offset
            while at < size, try holds(at, 1) {
                guard bytes[(at - base)...].allSatisfy({ $0 == 0 }) else { return false }
                at = base + bytes.count
            }
            return true
        }

        subscript(range: Range<Int>) -> ArraySlice<UInt8> { bytes[range.lowerBound - base..<range.upperBound - base] }

        /// The big-endian `u32` at `offset`, which ``holds(_:_:)`` said is in memory.
        func u32(at offset: Int) -> UInt32 { bigEndianU32(bytes, at: offset - base) }
    }

    private static func fileSize(_ fd: Int32, journal: String) throws(JournalError) -> Int {
        var info = stat()
        guard interruptible({ fstat(fd, &info) }) == 0 else {
            throw JournalFiles.ioError(journal, "read", "cannot stat the file")
        }
        return Int(info.st_size)
    }

    /// The file from byte `start` to its end, or the first `limit` bytes from there.
    private static func readAll(
        _ fd: Int32,
        journal: String,
        from start: Int = 0,
        upTo limit: Int = .max
    ) throws(JournalError) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: max(0, min(try fileSize(fd, journal: journal) - start, limit)))
        var done = 0
        while done < bytes.count {
            let count = bytes.withUnsafeMutableBytes { buffer in
                pread(fd, buffer.baseAddress! + done, buffer.count - done, off_t(start + done))
            }
            if count < 0, errno == EINTR { continue }
            guard count > 0 else {
                if count == 0 { break }  // shorter than it was a moment ago: read what is there
                throw JournalFiles.ioError(journal, "read", "cannot read the file at offset \(start + done)")
            }
            done += count
        }
        if done < bytes.count { bytes.removeLast(bytes.count - done) }
        return bytes
    }

    /// `bytes` at `offset`, all of them or an error.
    private static func writeAll(_ fd: Int32, _ bytes: [UInt8], at offset: Int64, journal: String) throws(JournalError)
    {
        var failure: JournalError?
        bytes.withUnsafeBytes { buffer in
            do throws(JournalError) {
                try writeAll(fd, buffer, at: offset, journal: journal)
            } catch {
                failure = error
            }
        }
        if let failure { throw failure }
    }

    private static func writeAll(
        _ fd: Int32,
        _ buffer: UnsafeRawBufferPointer,
        at offset: Int64,
        journal: String
    ) throws(JournalError) {
        var done = 0
        while done < buffer.count {
            let count = pwrite(fd, buffer.baseAddress! + done, buffer.count - done, off_t(offset) + off_t(done))
            if count < 0, errno == EINTR { continue }
            guard count > 0 else {
                throw JournalFiles.ioError(journal, "write", "cannot write \(buffer.count) bytes at offset \(offset)")
            }
            done += count
        }
    }
}

/// The big-endian `u32` at `offset` of `bytes`, which the caller checked are there.
private func bigEndianU32(_ bytes: [UInt8], at offset: Int) -> UInt32 {
    bytes[offset..<offset + 4].reduce(0) { $0 << 8 | UInt32($1) }
}
