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
        // Only the costs `make` writes, give or take one step of N: a planted record cannot make a check cost gigabytes.
        guard parts.count == 6, parts[0] == "scrypt", let n = UInt64(parts[1]), let r = UInt64(parts[2]), let p = UInt64(parts[3]),
              n >= 1 << 14, n <= 1 << 16, n & (n - 1) == 0, r == 8, p == 1,
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

    /// Hex digits to bytes, over the UTF-8 bytes (never characters: `é` or `\r\n` is not two digits).
    static func bytes(hex: String) -> [UInt8]? {
        let digits = Array(hex.utf8)
        guard digits.count % 2 == 0, digits.count <= 128 else { return nil }
        func value(_ digit: UInt8) -> UInt8? {
            switch digit {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit - UInt8(ascii: "A") + 10
            default: nil
            }
        }
        var result: [UInt8] = []
        for index in stride(from: 0, to: digits.count, by: 2) {
            guard let high = value(digits[index]), let low = value(digits[index + 1]) else { return nil }
            result.append(high << 4 | low)
        }
        return result
    }
}
