import AppStoreCrypto
import Foundation

/// How deliveries are signed, as Stripe signs: `Storekeeper-Signature: t=UNIX_SECONDS,v1=HEX(HMAC-SHA256(secret, "t.BODY"))`,
/// with one `v1` per valid secret during a rotation. A receiver recomputes the HMAC with its secret over the
/// timestamp, a period and the raw body, compares in constant time with any `v1`, and refuses a `t` too far
/// from its clock (five minutes is usual) so a captured delivery cannot be replayed later.
public enum WebhookSignature {
    /// The header's name.
    public static let header = "Storekeeper-Signature"

    /// The header's value for `body` sent at `timestamp` (Unix seconds), signed with each secret.
    public static func header(body: [UInt8], timestamp: Int64, secrets: [String]) -> String {
        (["t=\(timestamp)"] + secrets.map { "v1=" + signature(body: body, timestamp: timestamp, secret: $0) }).joined(separator: ",")
    }

    /// Hex HMAC-SHA256 of `"t.BODY"`.
    public static func signature(body: [UInt8], timestamp: Int64, secret: String) -> String {
        HMAC.sha256(key: Array(secret.utf8), message: Array("\(timestamp).".utf8) + body).hexString
    }

    /// Whether `header` carries a valid signature of `body` with `secret`, made within `tolerance` seconds of `now`.
    public static func verify(header: String, body: [UInt8], secret: String, now: Int64, tolerance: Int64 = 300) -> Bool {
        var timestamp: Int64?
        var signatures: [String] = []
        for part in header.split(separator: ",") {
            let pair = part.split(separator: "=", maxSplits: 1).map(String.init)
            guard pair.count == 2 else { continue }
            if pair[0] == "t" { timestamp = Int64(pair[1]) } else if pair[0] == "v1" { signatures.append(pair[1]) }
        }
        // Compared without subtracting: an attacker's t=-9223372036854775808 must not overflow.
        guard let timestamp, timestamp >= now.subtractingReportingOverflow(tolerance).partialValue,
              timestamp <= now.addingReportingOverflow(tolerance).partialValue else { return false }
        let expected = Array(signature(body: body, timestamp: timestamp, secret: secret).utf8)
        return signatures.contains { HMAC.constantTimeEqual(Array($0.utf8), expected) }
    }
}
