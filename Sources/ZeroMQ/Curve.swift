import CZeroMQ

/// A CURVE key pair: 32-byte public and secret keys, shown in Z85 (40 characters) in files and flags.
public struct CurveKeyPair: Hashable, Sendable {
    /// The 32-byte public key: what the daemon lists among its allowed clients, or what clients pin as the server's.
    public let publicKey: [UInt8]
    /// The 32-byte secret key, which never goes on the wire; keep it in a file only its owner reads (mode 0600).
    public let secretKey: [UInt8]

    /// A fresh key pair from libzmq's CSPRNG.
    public static func generate() throws(ZeroMQError) -> CurveKeyPair {
        var publicText = [CChar](repeating: 0, count: 41)
        var secretText = [CChar](repeating: 0, count: 41)
        try zmqCheck("zmq_curve_keypair") { zmq_curve_keypair(&publicText, &secretText) }
        let publicKey = try Z85.decode(string(publicText))
        let secretKey = try Z85.decode(string(secretText))
        return CurveKeyPair(publicKey: publicKey, secretKey: secretKey)
    }

    /// The pair whose secret key is `secretKey`; the public key is derived from it.
    public init(secretKey: [UInt8]) throws(ZeroMQError) {
        guard secretKey.count == 32 else {
            throw ZeroMQError(
                errno: EINVAL,
                function: "zmq_curve_public",
                detail: "a \(secretKey.count)-byte secret key (need 32)"
            )
        }
        var publicText = [CChar](repeating: 0, count: 41)
        var secretText = Array(Z85.encode(secretKey).utf8CString)
        try zmqCheck("zmq_curve_public") { zmq_curve_public(&publicText, &secretText) }
        self.init(publicKey: try Z85.decode(string(publicText)), secretKey: secretKey)
    }

    private init(publicKey: [UInt8], secretKey: [UInt8]) {
        self.publicKey = publicKey
        self.secretKey = secretKey
    }
}

/// ZeroMQ's Z85 text encoding of binary keys (RFC 32/Z85): 5 characters for every 4 bytes.
public enum Z85 {
    /// Encodes bytes whose count is a multiple of 4.
    public static func encode(_ bytes: [UInt8]) -> String {
        precondition(bytes.count % 4 == 0, "Z85 encodes whole 4-byte groups; got \(bytes.count) bytes")
        var text = [CChar](repeating: 0, count: bytes.count * 5 / 4 + 1)
        _ = zmq_z85_encode(&text, bytes, bytes.count)
        return string(text)
    }

    /// Decodes Z85 text whose length is a multiple of 5; throws for anything else.
    public static func decode(_ text: String) throws(ZeroMQError) -> [UInt8] {
        guard text.utf8.count % 5 == 0, text.utf8.allSatisfy({ $0 > 32 && $0 < 127 }) else {
            throw ZeroMQError(
                errno: EINVAL,
                function: "zmq_z85_decode",
                detail: "\"\(text)\": Z85 text is printable ASCII in groups of 5 characters"
            )
        }
        var bytes = [UInt8](repeating: 0, count: text.utf8.count * 4 / 5)
        guard zmq_z85_decode(&bytes, text) != nil else {
            throw ZeroMQError(errno: EINVAL, function: "zmq_z85_decode", detail: "\"\(text)\" is not valid Z85")
        }
        return bytes
    }
}

/// The text before the first NUL of a C character buffer.
private func string(_ characters: [CChar]) -> String {
    String(decoding: characters.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
