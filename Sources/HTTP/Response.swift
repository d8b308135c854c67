import Foundation

/// An HTTP status code with its reason phrase.
public struct HTTPStatus: Hashable, Sendable {
    public let code: Int
    public init(_ code: Int) { self.code = code }

    public static let ok = HTTPStatus(200)
    public static let created = HTTPStatus(201)
    public static let accepted = HTTPStatus(202)
    public static let noContent = HTTPStatus(204)
    public static let badRequest = HTTPStatus(400)
    public static let unauthorized = HTTPStatus(401)
    public static let forbidden = HTTPStatus(403)
    public static let notFound = HTTPStatus(404)
    public static let methodNotAllowed = HTTPStatus(405)
    public static let conflict = HTTPStatus(409)
    public static let payloadTooLarge = HTTPStatus(413)
    public static let unprocessable = HTTPStatus(422)
    public static let internalServerError = HTTPStatus(500)
    public static let serviceUnavailable = HTTPStatus(503)
}

/// What a responder answers; `drop` asks the transport to close the connection without a reply.
public struct Response: Sendable {
    /// The status code.
    public var status: HTTPStatus
    /// Header fields to send.
    public var headers: [String: String]
    /// The body bytes.
    public var body: Data
    /// When true the transport closes the connection without answering (fault injection).
    public var dropConnection: Bool = false
    /// The route pattern that answered (`/v1/users/:user`), set by `Router`; not sent. Metrics and logs label by it.
    public var route: String?

    /// Creates a response.
    public init(status: HTTPStatus = .ok, headers: [String: String] = [:], body: Data = Data()) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// A JSON response from an encodable value.
    public static func json<T: Encodable>(_ value: T, status: HTTPStatus = .ok, encoder: JSONEncoder = Response.encoder) -> Response {
        do {
            let body = try encoder.encode(value)
            return Response(status: status, headers: ["Content-Type": "application/json"], body: body)
        } catch {
            return HTTPError(.internalServerError, code: "encoding_failed", message: "The response could not be encoded.").response
        }
    }

    /// A JSON response from raw serialized bytes.
    public static func rawJSON(_ data: Data, status: HTTPStatus = .ok) -> Response {
        Response(status: status, headers: ["Content-Type": "application/json"], body: data)
    }

    /// A plain text response.
    public static func text(_ text: String, status: HTTPStatus = .ok, contentType: String = "text/plain; charset=utf-8") -> Response {
        Response(status: status, headers: ["Content-Type": contentType], body: Data(text.utf8))
    }

    /// A connection drop, for fault injection.
    public static var drop: Response {
        var response = Response(status: .internalServerError)
        response.dropConnection = true
        return response
    }

    /// The shared encoder: sorted keys so output is stable.
    public static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }()
}
