import Foundation

/// An HTTP method, as the request line spells it.
public struct HTTPMethod: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue.uppercased() }
    public var description: String { rawValue }

    public static let get = HTTPMethod(rawValue: "GET")
    public static let post = HTTPMethod(rawValue: "POST")
    public static let put = HTTPMethod(rawValue: "PUT")
    public static let patch = HTTPMethod(rawValue: "PATCH")
    public static let delete = HTTPMethod(rawValue: "DELETE")
    public static let head = HTTPMethod(rawValue: "HEAD")
}

/// A complete HTTP request, independent of the transport that received it.
public struct Request: Sendable {
    /// The request method.
    public var method: HTTPMethod
    /// The path without the query string, e.g. `/sandbox/verifyReceipt`.
    public var path: String
    /// Decoded query parameters; the last value wins for repeated keys.
    public var query: [String: String]
    /// Every query parameter in order, repeated keys included (`?status=1&status=4`).
    public var queryItems: [(name: String, value: String)] = []
    /// Header fields with lower-cased names.
    public var headers: [String: String]
    /// The request body.
    public var body: Data
    /// Path parameters captured by the router (`:id` segments).
    public var parameters: [String: String] = [:]
    /// When the request came through a TLS connection the server terminated (a `CONNECT` tunnel or TLS
    /// straight to an intercepting port): the host name the client asked for (empty when it named none).
    /// Set by the server, never from a header.
    public var tunnel: String?

    /// Creates a request; `target` may carry a query string.
    public init(method: HTTPMethod, target: String, headers: [String: String] = [:], body: Data = Data()) {
        self.method = method
        var lowered: [String: String] = [:]
        for (name, value) in headers { lowered[HTTPText.lowercasedName(name)] = value }
        self.headers = lowered
        self.body = body
        if let mark = target.firstIndex(of: "?") {
            self.path = Request.canonical(String(target[..<mark]))
            queryItems = Request.parseQueryItems(String(target[target.index(after: mark)...]))
            self.query = Dictionary(queryItems.map { ($0.name, $0.value) }, uniquingKeysWith: { $1 })
        } else {
            self.path = Request.canonical(target)
            self.query = [:]
        }
    }

    /// The header value for a case-insensitive name.
    public func header(_ name: String) -> String? { headers[HTTPText.lowercasedName(name)] }

    /// The one spelling of a path that admission and routing both see: empty segments dropped
    /// (`//admin/v1/x/` is `/admin/v1/x`), so no check keyed on a prefix can be sidestepped by slashes.
    public static func canonical(_ path: String) -> String {
        guard !HTTPText.isCanonicalPath(path) else { return path }
        return "/" + path.split(separator: "/").joined(separator: "/")
    }

    /// The `Host` header without its port.
    public var host: String? {
        guard let host = headers["host"] else { return nil }
        // Most are a lower-case name and a port, or a name alone: cut at the first colon, lower-case only when needed.
        if let colon = host.utf8.firstIndex(of: UInt8(ascii: ":")), colon != host.utf8.startIndex {
            return HTTPText.lowercasedName(String(host[..<colon]))
        }
        return host.split(separator: ":").first.map { HTTPText.lowercasedName(String($0)) }
    }

    /// Decodes the JSON body, mapping failures to a 400 `invalid_json` error.
    public func decode<T: Decodable>(_ type: T.Type) throws -> T {
        do {
            return try JSONDecoder().decode(type, from: body)
        } catch {
            throw HTTPError(.badRequest, code: "invalid_json", message: "The request body is not valid JSON for this endpoint: \(Request.describe(error))")
        }
    }

    static func describe(_ error: any Error) -> String {
        switch error {
        case DecodingError.keyNotFound(let key, _): return "missing field '\(key.stringValue)'"
        case DecodingError.typeMismatch(_, let context): return "wrong type at '\(context.codingPath.map(\.stringValue).joined(separator: "."))'"
        case DecodingError.valueNotFound(_, let context): return "null at '\(context.codingPath.map(\.stringValue).joined(separator: "."))'"
        case DecodingError.dataCorrupted(let context):
            return context.codingPath.isEmpty ? "malformed JSON" : "invalid value at '\(context.codingPath.map(\.stringValue).joined(separator: "."))'"
        default: return "unreadable body"
        }
    }

    public static func parseQueryItems(_ query: String) -> [(name: String, value: String)] {
        query.split(separator: "&").map { pair in
            // Split at the first "=" by hand: "=" alone, "=x" and "x=" are all pairs (an empty name or value).
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            let name = parts.first.map { HTTPText.percentDecoded($0, plusIsSpace: true) } ?? ""
            let value = parts.count > 1 ? HTTPText.percentDecoded(parts[1], plusIsSpace: true) : ""
            return (name, value)
        }
    }

    /// Every value of query parameter `name`, in order.
    public func queryValues(_ name: String) -> [String] {
        queryItems.filter { $0.name == name }.map(\.value)
    }
}
