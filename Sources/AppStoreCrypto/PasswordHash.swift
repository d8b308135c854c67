import COpenSSL
import Foundation

/// Passwords stored as scrypt hashes (OpenSSL's `EVP_PBE_scrypt`): `scrypt$N$r$p$SALT_HEX$HASH_HEX`.
/// N = 2^15, r = 8, p = 1 cost about 32 MB and tens of milliseconds per check, which is what makes a stolen
/// table expensive to try; login attempts are rate-limited before any check runs.
public enum PasswordHash {
    /// The most bytes of a password accepted (longer ones are refused before hashing: no work for junk).
    public static let maximumLength = 1024

    /// A new hash of `password` with a random 16-byte salt.
    public static func make(_ password: String, cost: Int = 15) throws -> String {
        var salt = [UInt8](repeating: 0, count: 16)
        guard RAND_bytes(&salt, 16) == 1 else { throw CryptoError.openSSL("random_failed", "no random salt") }
        let n = UInt64(1) << UInt64(cost)
        let key = try derive(Array(password.utf8), salt: salt, n: n, r: 8, p: 1)
        return "scrypt$\(n)$8$1$\(hex(salt))$\(hex(key))"
    }

    /// Whether `password` matches `stored` (compared in constant time). A malformed or out-of-bounds record never matches.
    public static func verify(_ password: String, against stored: String) -> Bool {
        let parts = stored.split(separator: "$").map(String.init)
        guard parts.count == 6, parts[0] == "scrypt", let n = UInt64(parts[1]), let r = UInt64(parts[2]), let p = UInt64(parts[3]),
              n >= 2, n <= 1 << 20, n & (n - 1) == 0, (1...16).contains(r), (1...4).contains(p),
              let salt = bytes(hex: parts[4]), let expected = bytes(hex: parts[5]), expected.count == 32,
              password.utf8.count <= maximumLength,
              let key = try? derive(Array(password.utf8), salt: salt, n: n, r: r, p: p) else { return false }
        return HMAC.constantTimeEqual(key, expected)
    }

    private static func derive(_ password: [UInt8], salt: [UInt8], n: UInt64, r: UInt64, p: UInt64) throws -> [UInt8] {
        var key = [UInt8](repeating: 0, count: 32)
        let memory = 128 * r * n + 1_048_576 * 2
        // A zero byte keeps the pointer valid for an empty password.
        let status = (password.map { CChar(bitPattern: $0) } + [0]).withUnsafeBufferPointer { pass in
            EVP_PBE_scrypt(pass.baseAddress, password.count, salt, salt.count, n, r, p, memory, &key, key.count)
        }
        guard status == 1 else { throw CryptoError.openSSL("scrypt_failed", "scrypt refused its parameters") }
        return key
    }

    private static func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

    private static func bytes(hex: String) -> [UInt8]? {
        guard hex.utf8.count % 2 == 0, hex.utf8.count <= 128 else { return nil }
        var result: [UInt8] = []
        var index = hex.startIndex
        while index < hex.endIndex {
            let next = hex.index(index, offsetBy: 2)
            guard let byte = UInt8(hex[index..<next], radix: 16) else { return nil }
            result.append(byte)
            index = next
        }
        return result
    }
}
