import Foundation

/// An error that maps to one JSON shape: `{"error": {"code", "message"}}` with an HTTP status.
public struct HTTPError: Error, Sendable, CustomStringConvertible {
    /// The HTTP status to answer with.
    public let status: HTTPStatus
    /// A stable machine-readable code.
    public let code: String
    /// A message safe to log and show.
    public let message: String

    /// Creates an error.
    public init(_ status: HTTPStatus, code: String, message: String) {
        self.status = status
        self.code = code
        self.message = message
    }

    public var description: String { "\(code): \(message)" }

    private struct Body: Encodable {
        struct Detail: Encodable { let code: String; let message: String }
        let error: Detail
    }

    /// The error as an HTTP response.
    public var response: Response {
        let body = (try? Response.encoder.encode(Body(error: .init(code: code, message: message)))) ?? Data()
        return Response(status: status, headers: ["Content-Type": "application/json"], body: body)
    }

    /// A 404 for an unknown route or resource.
    public static func notFound(_ what: String) -> HTTPError {
        HTTPError(.notFound, code: "not_found", message: "\(what) was not found.")
    }

    /// A 400 for invalid input.
    public static func badRequest(_ message: String, code: String = "bad_request") -> HTTPError {
        HTTPError(.badRequest, code: code, message: message)
    }
}
