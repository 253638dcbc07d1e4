import ArgumentParser
import Foundation
import LockstepClient
import ZeroMQ

#if canImport(Glibc)
import Glibc
#endif

/// CURVE for a client of a daemon on `tcp://`: the daemon's public key and this client's secret key file, both
/// from `lockstep keygen`. Every command that reaches a daemon takes them, and so does `lockstep demo-client`.
package struct CurveClientOptions: ParsableArguments {
    // Z85 keys may begin with '-' (one in 85 does): `.unconditional` takes the next argument as the value whatever it
    // looks like, where the default would read such a key as an unknown option and refuse the command.
    @Option(
        parsing: .unconditional,
        help: "CURVE on tcp: the daemon's public key, Z85 (the server.pub of 'lockstep keygen --out server')."
    )
    package var curveServerKey: String?

    @Option(
        parsing: .unconditional,
        help: ArgumentHelp(
            "CURVE on tcp: a file holding this client's secret key, Z85, mode 0600 (NAME.key of 'lockstep keygen "
                + "--out NAME'); its public key must be in the daemon's allowed clients file."
        )
    )
    package var curveKeyFile: String?

    package init() {}

    package func validate() throws {
        guard (curveServerKey == nil) == (curveKeyFile == nil) else {
            let missing = curveServerKey == nil ? "--curve-server-key" : "--curve-key-file"
            throw ValidationError(
                "CURVE needs both --curve-server-key (the daemon's public key) and --curve-key-file (this client's "
                    + "secret key file); \(missing) is missing"
            )
        }
    }

    /// The keys, or `nil` when neither option is given.
    ///
    /// - Throws: `ValidationError` naming the option and the value when the server key is not a Z85 public key, or
    ///   the file cannot be read, is readable by others, or holds no Z85 secret key.
    package func clientCurve() throws -> ClientCurve? {
        guard let curveServerKey, let curveKeyFile else { return nil }
        let serverKey = curveServerKey.trimmingCharacters(in: .whitespacesAndNewlines)
        guard let server = try? Z85.decode(serverKey), server.count == 32 else {
            throw ValidationError(
                "--curve-server-key '\(curveServerKey)' is not a Z85 CURVE public key (40 characters); give the "
                    + "daemon's, the first line of its server.pub"
            )
        }
        var info = stat()
        guard stat(curveKeyFile, &info) == 0 else {
            throw ValidationError(
                "--curve-key-file \(curveKeyFile): cannot read it (\(String(cString: strerror(errno)))); make one "
                    + "with 'lockstep keygen --out NAME' and give NAME.key"
            )
        }
        guard info.st_mode & 0o077 == 0 else {
            throw ValidationError(
                "--curve-key-file \(curveKeyFile) has mode \(String(info.st_mode & 0o777, radix: 8)); it holds a "
                    + "secret key, so it must be 0600 (chmod 600 \(curveKeyFile))"
            )
        }
        let text = (try? String(contentsOfFile: curveKeyFile, encoding: .utf8)) ?? ""
        let line = text.split(whereSeparator: \.isNewline).first.map { $0.trimmingCharacters(in: .whitespaces) } ?? ""
        guard let secret = try? Z85.decode(line), secret.count == 32, let keys = try? CurveKeyPair(secretKey: secret)
        else {
            throw ValidationError(
                "--curve-key-file \(curveKeyFile) does not hold a Z85 CURVE secret key (40 characters on its first "
                    + "line); give the NAME.key that 'lockstep keygen --out NAME' wrote"
            )
        }
        return ClientCurve(keys: keys, serverPublicKey: server)
    }
}
