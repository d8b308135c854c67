import Foundation
import HTTP

extension PurchaseServerResponder {
    /// The body limits, per route group: receipt uploads as large as the biggest real receipts
    /// (an app receipt with years of renewals is a few hundred KiB of Base64), notifications as
    /// large as Apple's signed payloads can be, everything else small.
    public enum BodyLimit {
        public static let receiptUpload = 2 << 20
        /// Apple's notifications nest a signed transaction and renewal info with their chains: about 16 KiB.
        public static let notification = 64 << 10
        public static let admin = 1 << 20
        public static let other = 64 << 10
    }

    /// Decided on the HTTP server's thread before the body is read: the admin key or an app key
    /// from the in-memory key ring (401 at once otherwise), the route's body limit (413 at once
    /// for a larger `Content-Length`), and the app's upload rate (429 with `Retry-After`).
    public func admit(_ head: RequestHead) -> Admission {
        let path = head.path
        if path == "/v1/notifications/apple" { return .accept(bodyLimit: BodyLimit.notification) }
        if path.hasPrefix("/admin/") || path == "/metrics" {
            guard let key = Self.bearer(head.header("authorization")), server.isAdmin(key) else {
                return .refuse(HTTPError(.unauthorized, code: "invalid_admin_key",
                                         message: "This endpoint needs the admin key as 'Authorization: Bearer KEY'.").response)
            }
            return .accept(bodyLimit: BodyLimit.admin)
        }
        guard path.hasPrefix("/v1/") else { return .accept(bodyLimit: BodyLimit.other) }
        guard let key = Self.bearer(head.header("authorization")), !key.isEmpty else {
            return .refuse(HTTPError(.unauthorized, code: "missing_api_key", message: "Send the app's API key as 'Authorization: Bearer KEY'.").response)
        }
        guard let record = server.store.liveKey(key, now: server.clock.now()) else {
            return .refuse(HTTPError(.unauthorized, code: "invalid_api_key", message: "The API key is not valid (unknown or revoked).").response)
        }
        let isUpload = head.method == .post && (path == "/v1/receipts" || path == "/v1/transactions" || (path.hasPrefix("/v1/users/") && path.hasSuffix("/restore")))
        guard isUpload else { return .accept(bodyLimit: BodyLimit.other) }
        if let wait = server.uploadLimiter.take(record.appId) {
            let seconds = max(1, Int(wait.rounded(.up)))
            var response = HTTPError(HTTPStatus(429), code: "rate_limited", message: "Too many uploads for this app; retry after \(seconds) s.").response
            response.headers["Retry-After"] = String(seconds)
            return .refuse(response)
        }
        return .accept(bodyLimit: BodyLimit.receiptUpload)
    }
}
