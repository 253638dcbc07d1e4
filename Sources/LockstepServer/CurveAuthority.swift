import Foundation
import ZeroMQ

#if canImport(Glibc)
import Glibc
#endif

/// The daemon's CURVE identity and the clients it lets in, read from the files the configuration names.
struct CurveAuthority {
    let serverKeys: CurveKeyPair
    private(set) var allowedClients: Set<[UInt8]>
    let settings: DaemonConfiguration.CurveSettings

    init(_ settings: DaemonConfiguration.CurveSettings) throws(ServerError) {
        self.settings = settings
        serverKeys = try Self.serverKeys(settings.serverKeyFile)
        allowedClients = try Self.clients(settings.allowedClientsFile)
    }

    /// Reads the client list again (SIGHUP); on error the old list stays and the error is returned.
    mutating func reload() -> ServerError? {
        do {
            allowedClients = try Self.clients(settings.allowedClientsFile)
            return nil
        } catch {
            return error
        }
    }

    /// A secret key file must be private: anything readable by others is refused.
    static func serverKeys(_ path: String) throws(ServerError) -> CurveKeyPair {
        var info = stat()
        guard stat(path, &info) == 0 else {
            throw ServerError(code: .configuration, "cannot read the CURVE key file \(path): errno \(errno)")
        }
        guard info.st_mode & 0o077 == 0 else {
            throw ServerError(
                code: .configuration,
                "the CURVE key file \(path) has mode \(String(info.st_mode & 0o777, radix: 8)); it holds a secret "
                    + "key, so it must be 0600 (chmod 600 \(path))"
            )
        }
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw ServerError(code: .configuration, "cannot read the CURVE key file \(path): \(error)")
        }
        let key = text.split(whereSeparator: \.isNewline).first.map { $0.trimmingCharacters(in: .whitespaces) } ?? ""
        do {
            let secret = try Z85.decode(key)
            guard secret.count == 32 else { throw ZeroMQError(errno: EINVAL, function: "zmq_z85_decode") }
            return try CurveKeyPair(secretKey: secret)
        } catch {
            throw ServerError(
                code: .configuration,
                "\(path) does not hold a Z85 CURVE secret key (40 characters on its first line); make one with "
                    + "'lockstep keygen --out NAME'"
            )
        }
    }

    /// One Z85 public key per line; blank lines and lines starting with `#` are skipped (a `#` elsewhere can
    /// be part of a Z85 key); anything else is an error.
    static func clients(_ path: String) throws(ServerError) -> Set<[UInt8]> {
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw ServerError(code: .configuration, "cannot read the allowed clients file \(path): \(error)")
        }
        var keys: Set<[UInt8]> = []
        for (number, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let entry = line.trimmingCharacters(in: .whitespaces)
            if entry.isEmpty || entry.hasPrefix("#") { continue }
            guard let key = try? Z85.decode(entry), key.count == 32 else {
                throw ServerError(
                    code: .configuration,
                    "\(path) line \(number + 1): '\(entry)' is not a Z85 CURVE public key (40 characters)"
                )
            }
            keys.insert(key)
        }
        return keys
    }
}
