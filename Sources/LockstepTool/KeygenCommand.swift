import ArgumentParser
import Foundation
import ZeroMQ

/// Makes a CURVE key pair for the daemon or a client.
struct KeygenCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keygen",
        abstract: "Make a CURVE key pair (Z85): for lockstepd's [curve] server_key_file, or a client's key.",
        discussion: """
            Without --out, prints both keys. With --out NAME, writes NAME.key (the secret key, mode 0600) and \
            NAME.pub (the public key: give it to clients, or add a client's to the daemon's allowed clients file).
            """
    )

    @Option(help: "Write NAME.key (mode 0600) and NAME.pub instead of printing.")
    var out: String?

    @Flag(help: "Print {\"public\":…,\"secret\":…}.")
    var json = false

    func run() throws {
        let pair = try CurveKeyPair.generate()
        let publicKey = Z85.encode(pair.publicKey)
        let secretKey = Z85.encode(pair.secretKey)
        guard let out else {
            print(
                json
                    ? #"{"public":"\#(publicKey)","secret":"\#(secretKey)"}"#
                    : "public  \(publicKey)\nsecret  \(secretKey)"
            )
            return
        }
        let secretPath = out + ".key"
        guard
            FileManager.default.createFile(
                atPath: secretPath,
                contents: Data((secretKey + "\n").utf8),
                attributes: [.posixPermissions: 0o600]
            )
        else {
            printError("\(Tool.commandName): cannot write \(secretPath)")
            throw ExitCode.failure
        }
        try Data((publicKey + "\n").utf8).write(to: URL(fileURLWithPath: out + ".pub"))
        print(
            json
                ? #"{"public":"\#(publicKey)","secretFile":"\#(secretPath)"}"#
                : "wrote \(secretPath) (0600) and \(out).pub\npublic  \(publicKey)"
        )
    }
}
