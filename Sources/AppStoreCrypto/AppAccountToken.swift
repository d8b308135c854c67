import AppStoreModels
import Foundation

/// The `appAccountToken` that names an app user on a StoreKit purchase.
///
/// StoreKit carries a UUID; apps' user ids are often not UUIDs. The rule, the same on the device and
/// on the purchase server: a user id that is a UUID is its own token; any other user id maps to the
/// name-based UUID (RFC 9562 version 5, SHA-1) of its UTF-8 bytes in `namespace`. A purchase whose
/// token is not the uploading user's is refused (`app_account_token_mismatch`), whatever the id looks like.
public enum AppAccountToken {
    /// The namespace of version-5 tokens: `b7d0c3c4-6a8e-4f0e-9d3a-2c5e8f1a7b64`.
    public static let namespace = UUID(uuidString: "b7d0c3c4-6a8e-4f0e-9d3a-2c5e8f1a7b64")!

    /// The token StoreKit purchases for `appUserId` should carry.
    public static func token(for appUserId: String) -> UUID {
        UUIDText.parse(appUserId) ?? nameBased(appUserId, in: namespace)
    }

    /// RFC 9562's version-5 UUID of `name` in `namespace`.
    public static func nameBased(_ name: String, in namespace: UUID) -> UUID {
        let space = namespace.uuid
        var bytes = Digest.sha1.hash(withUnsafeBytes(of: space) { Array($0) } + Array(name.utf8))
        bytes[6] = (bytes[6] & 0x0F) | 0x50
        bytes[8] = (bytes[8] & 0x3F) | 0x80
        return UUID(uuid: (bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
                           bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]))
    }

    /// Whether a purchase carrying `token` may be delivered to `appUserId`.
    public static func matches(_ token: String, user appUserId: String) -> Bool {
        UUIDText.parse(token) == self.token(for: appUserId)
    }
}
