import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The file work both local journals do themselves, beside what SQLite does for its own files: the data directory,
/// new files with mode 0600, directory syncs, and errno turned into a ``JournalError`` naming the journal.
enum JournalFiles {
    /// Refuses a backup's destination unless it is missing or an empty directory that can be read.
    static func requireEmpty(_ destination: String) throws(JournalError) {
        guard FileManager.default.fileExists(atPath: destination) else { return }
        let found: [String]
        do {
            found = try FileManager.default.contentsOfDirectory(atPath: destination)
        } catch {
            throw JournalError(
                code: .invalidArgument,
                file: destination,
                operation: "backup",
                message: "cannot read \(destination) as a directory (\(error.localizedDescription)); give a new or "
                    + "empty directory"
            )
        }
        guard !found.isEmpty else { return }
        throw JournalError(
            code: .invalidArgument,
            file: destination,
            operation: "backup",
            message: "\(destination) is not empty (it holds \(found.sorted().prefix(3).joined(separator: ", "))"
                + "\(found.count > 3 ? ", …" : "")); give a new or empty directory"
        )
    }

    /// Whether `directory` holds a file named `name`: which journal a data directory holds.
    static func exists(_ name: String, in directory: String) -> Bool {
        FileManager.default.fileExists(atPath: URL(fileURLWithPath: directory).appendingPathComponent(name).path)
    }

    static func ioError(_ journal: String, _ operation: String, _ message: String) -> JournalError {
        let code: JournalError.Code =
            errno == EROFS || errno == EACCES || errno == EPERM
            ? .readOnly
            : errno == ENOSPC || errno == EDQUOT ? .storageFull : .ioError
        return JournalError(
            code: code,
            file: journal,
            operation: operation,
            message: "\(message): \(String(cString: strerror(errno))) (errno \(errno))"
        )
    }

    static func makeDirectory(_ directory: String, path: String) throws(JournalError) {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory) {
            guard isDirectory.boolValue else {
                throw JournalError(
                    code: .ioError,
                    file: path,
                    operation: "open",
                    message: "the data directory \(directory) is a file; give a directory"
                )
            }
            return
        }
        // One level at a time, each new directory's entry synced in its parent: a new directory is durable only
        // once its parent is fsynced, so a power cut must not take away a whole new path and the journal in it
        // (the power-cut filesystem of the fault suite showed that creating the path in one call does not).
        let url = URL(fileURLWithPath: directory).standardizedFileURL
        var missing: [URL] = []
        var level = url
        while !FileManager.default.fileExists(atPath: level.path), level.path != "/" {
            missing.insert(level, at: 0)
            level = level.deletingLastPathComponent()
        }
        for created in missing {
            do {
                try FileManager.default.createDirectory(
                    atPath: created.path,
                    withIntermediateDirectories: false,
                    attributes: [.posixPermissions: 0o700]
                )
            } catch {
                throw JournalError(
                    code: .ioError,
                    file: path,
                    operation: "open",
                    message: "cannot create the data directory \(directory): \(error.localizedDescription)"
                )
            }
            try fsyncDirectory(created.deletingLastPathComponent().path, journal: path)
        }
    }

    /// Creates an empty file with mode 0600 (SQLite gives its -wal and -shm files the same mode); false when
    /// the file already exists.
    static func createFile(_ path: String) throws(JournalError) -> Bool {
        var fd: Int32
        fd = interruptible { open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0o600) }
        if fd < 0 {
            if errno == EEXIST { return false }
            throw ioError(path, "open", "cannot create the journal file")
        }
        defer { closeDescriptor(fd) }
        guard interruptible({ fchmod(fd, 0o600) }) == 0, interruptible({ fsync(fd) }) == 0 else {
            throw ioError(path, "open", "cannot set up the new journal file")
        }
        return true
    }

    static func restrictMode(_ file: String, journal: String) throws(JournalError) {
        var info = stat()
        guard interruptible({ stat(file, &info) }) == 0 else { return }
        if info.st_mode & 0o777 != 0o600, interruptible({ chmod(file, 0o600) }) != 0 {
            throw ioError(journal, "open", "cannot set mode 0600 on \(file)")
        }
    }

    static func fsyncDirectory(_ directory: String, journal: String) throws(JournalError) {
        var fd: Int32
        fd = interruptible { open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC) }
        guard fd >= 0 else { throw ioError(journal, "open", "cannot open directory \(directory) to sync it") }
        defer { closeDescriptor(fd) }
        guard interruptible({ fsync(fd) }) == 0 else {
            throw ioError(journal, "open", "cannot sync directory \(directory)")
        }
    }
}

/// `close(2)`, out of reach of the storages' own `close()`. Not retried on EINTR: Linux has closed the
/// descriptor even then, and a second close could close another thread's new one.
func closeDescriptor(_ fd: Int32) {
    _ = close(fd)
}

/// Runs a system call again while it fails with EINTR (a signal arrived meanwhile): the one way every call the
/// journal makes itself goes (SQLite retries its own). Returns the call's result; on failure `errno` says why,
/// and ``JournalFiles/ioError(_:_:_:)`` turns it into a ``JournalError`` naming the file.
func interruptible(_ call: () -> Int32) -> Int32 {
    var result: Int32
    repeat { result = call() } while result < 0 && errno == EINTR
    return result
}
