import AppStoreCrypto
import Foundation
import HTTP

extension AppStoreResponder {
    /// The admin API is for the developer's own tools, and a web page the developer has open can
    /// reach loopback too. Before a body is read: with an admin token, the token; without one, a
    /// loopback `Host` (no DNS rebinding); never a foreign `Origin`; and state-changing requests
    /// with a body only as `application/json` (which a page cannot send cross-site without asking).
    public func admit(_ head: RequestHead) -> Admission {
        guard head.path.hasPrefix("/admin/") else { return .accept(bodyLimit: .max) }
        if let refusal = Self.adminRefusal(head, token: adminToken) { return .refuse(refusal) }
        return .accept(bodyLimit: .max)
    }

    /// Reads anyone may make: the CA certificates (public by nature) and the clock.
    static let publicAdminReads: Set<String> = ["/admin/v1/ca", "/admin/v1/time", "/admin/v1/health"]

    static func adminRefusal(_ head: RequestHead, token: String?) -> Response? {
        let host = head.header("host").map(Self.hostName)
        if let origin = head.header("origin"), origin != "null" || head.method != .get {
            guard let originHost = URL(string: origin).flatMap({ url in url.host.map { ($0, url.port) } }),
                  let requestHost = head.header("host"),
                  Self.hostName(requestHost) == originHost.0.lowercased(), Self.port(requestHost) == originHost.1 else {
                return HTTPError(.forbidden, code: "foreign_origin", message: "The admin API refuses requests from other origins.").response
            }
        }
        let isRead = head.method == .get || head.method == .head
        if let token {
            if !(isRead && publicAdminReads.contains(head.path)) {
                guard let header = head.header("authorization"),
                      HMAC.constantTimeEqual(Array(header.utf8), Array(("Bearer " + token).utf8)) else {
                    return HTTPError(.unauthorized, code: "invalid_admin_token",
                                     message: "This emulator's admin API needs 'Authorization: Bearer TOKEN' (--admin-token).").response
                }
            }
        } else if let host, !loopbackNames.contains(host) {
            return HTTPError(.forbidden, code: "foreign_host",
                             message: "Without --admin-token the admin API answers only loopback host names, not \(host).").response
        }
        if !isRead, (head.contentLength ?? 0) > 0 || head.header("transfer-encoding") != nil {
            let type = head.header("content-type")?.split(separator: ";").first.map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
            guard type == "application/json" else {
                return HTTPError(HTTPStatus(415), code: "unsupported_media_type", message: "Admin requests with a body must be application/json.").response
            }
        }
        return nil
    }

    static let loopbackNames: Set<String> = ["127.0.0.1", "localhost", "::1", "[::1]"]

    /// The host of a `Host` header, lower-cased, without its port.
    static func hostName(_ header: String) -> String {
        let lowered = header.lowercased()
        if lowered.hasPrefix("["), let end = lowered.firstIndex(of: "]") { return String(lowered[...end]) }
        return lowered.split(separator: ":").first.map(String.init) ?? lowered
    }

    /// The port of a `Host` header, if it names one.
    static func port(_ header: String) -> Int? {
        let afterBracket = header.lastIndex(of: "]").map { header[header.index(after: $0)...] } ?? header[...]
        guard let colon = afterBracket.lastIndex(of: ":") else { return nil }
        return Int(afterBracket[afterBracket.index(after: colon)...])
    }
}
