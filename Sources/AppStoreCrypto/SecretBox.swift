import COpenSSL

/// Authenticated encryption of small secrets at rest (shared secrets, Server API private keys)
/// with AES-256-GCM under a 32-byte master key. A sealed value is `v1:` followed by the Base64 of
/// nonce (12 bytes) ‖ ciphertext ‖ tag (16 bytes); anything else is taken as a value written before
/// encryption existed and returned as is, so old databases keep working and are sealed on next write.
public struct SecretBox: Sendable {
    /// The master key's length in bytes.
    public static let keyLength = 32
    static let prefix = "v1:"
    let key: [UInt8]

    /// A box for `key` (exactly 32 bytes).
    public init(key: [UInt8]) throws {
        guard key.count == Self.keyLength else { throw CryptoError("invalid_master_key", "the master key must be \(Self.keyLength) bytes") }
        self.key = key
    }

    /// A fresh random master key.
    public static func generateKey() -> [UInt8] {
        // The system generator (getrandom) has no failure to ignore.
        var generator = SystemRandomNumberGenerator()
        return (0..<keyLength).map { _ in UInt8.random(in: 0...255, using: &generator) }
    }

    /// Whether `text` is a sealed value.
    public static func isSealed(_ text: String) -> Bool { text.hasPrefix(prefix) }

    /// Encrypts `plaintext`.
    public func seal(_ plaintext: String) throws -> String {
        var nonce = [UInt8](repeating: 0, count: 12)
        guard RAND_bytes(&nonce, 12) == 1 else { throw CryptoError.openSSL("encryption_failed", "no random nonce") }
        let (ciphertext, tag) = try crypt(Array(plaintext.utf8), nonce: nonce, tag: nil)
        return Self.prefix + Base64.encode(nonce + ciphertext + (tag ?? []))
    }

    /// Decrypts a sealed value (a value that is not sealed is returned unchanged).
    public func open(_ text: String) throws -> String {
        guard Self.isSealed(text) else { return text }
        guard let bytes = Base64.decode(String(text.dropFirst(Self.prefix.count))), bytes.count >= 28 else {
            throw CryptoError("invalid_sealed_value", "a sealed secret is not Base64 of nonce, ciphertext and tag")
        }
        let nonce = Array(bytes[..<12]), tag = Array(bytes[(bytes.count - 16)...]), ciphertext = Array(bytes[12..<(bytes.count - 16)])
        let (plaintext, _) = try crypt(ciphertext, nonce: nonce, tag: tag)
        return String(decoding: plaintext, as: UTF8.self)
    }

    /// Encrypts (tag nil: returns the tag) or decrypts and checks `tag`.
    private func crypt(_ input: [UInt8], nonce: [UInt8], tag: [UInt8]?) throws -> ([UInt8], [UInt8]?) {
        let encrypting = tag == nil
        guard let context = EVP_CIPHER_CTX_new() else { throw CryptoError.openSSL("encryption_failed", "no cipher context") }
        defer { EVP_CIPHER_CTX_free(context) }
        guard EVP_CipherInit_ex(context, EVP_aes_256_gcm(), nil, key, nonce, encrypting ? 1 : 0) == 1 else {
            throw CryptoError.openSSL("encryption_failed", "cannot start AES-256-GCM")
        }
        var output = [UInt8](repeating: 0, count: input.count + 16)
        var length: Int32 = 0
        guard EVP_CipherUpdate(context, &output, &length, input, Int32(input.count)) == 1 else {
            throw CryptoError.openSSL("encryption_failed", "AES-256-GCM failed")
        }
        var total = Int(length)
        if var tag {
            guard EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_SET_TAG, 16, &tag) == 1 else { throw CryptoError.openSSL("decryption_failed", "bad tag") }
        }
        let finished = output.withUnsafeMutableBufferPointer { buffer in
            EVP_CipherFinal_ex(context, buffer.baseAddress! + total, &length)
        }
        guard finished == 1 else {
            ERR_clear_error()
            throw CryptoError("decryption_failed", "a sealed secret does not open with this master key (wrong key, or the value was changed)")
        }
        total += Int(length)
        var outTag: [UInt8]?
        if encrypting {
            var produced = [UInt8](repeating: 0, count: 16)
            guard EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_GET_TAG, 16, &produced) == 1 else {
                throw CryptoError.openSSL("encryption_failed", "no GCM tag")
            }
            outTag = produced
        }
        return (Array(output.prefix(total)), outTag)
    }
}

/// Standard Base64 for the sealed form.
enum Base64 {
    static func encode(_ bytes: [UInt8]) -> String {
        var text = Base64URL.encode(bytes).replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while text.utf8.count % 4 != 0 { text += "=" }
        return text
    }

    static func decode(_ text: String) -> [UInt8]? {
        var trimmed = Substring(text)
        while trimmed.hasSuffix("=") { trimmed = trimmed.dropLast() }
        return Base64URL.decode(trimmed, alphabet: .standard)
    }
}
