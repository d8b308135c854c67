import COpenSSL

/// HMAC over OpenSSL's one-shot `HMAC()`: user tokens (HS256) and webhook-style signatures.
public enum HMAC {
    /// HMAC-SHA256 of `message` under `key`: 32 bytes, or none when OpenSSL could not compute it (callers comparing MACs
    /// must refuse an empty one).
    public static func sha256(key: some Collection<UInt8>, message: some Collection<UInt8>) -> [UInt8] {
        let key = Array(key), message = Array(message)
        var output = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        // A zero-length key still needs a non-null pointer: the empty key is passed as one zero byte, length 0.
        let keyBytes = key.isEmpty ? [0] : key
        keyBytes.withUnsafeBytes { keyBuffer in
            message.withUnsafeBufferPointer { messageBuffer in
                _ = COpenSSL.HMAC(Digest.sha256.md, keyBuffer.baseAddress, Int32(key.count), messageBuffer.baseAddress, messageBuffer.count,
                                  &output, &length)
            }
        }
        return Array(output.prefix(Int(length)))
    }

    /// Compares two MACs in time that depends only on their length.
    public static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        var difference: UInt8 = 0
        for index in a.indices { difference |= a[index] ^ b[index] }
        return difference == 0
    }
}
