import Foundation

/// Anything that turns a request into a response; the server transport calls it.
public protocol Responder: Sendable {
    /// Answers one request. Errors are mapped to responses by the caller.
    func respond(to request: Request) async -> Response
}

/// A handler for one route.
public typealias Handler = @Sendable (Request) async throws -> Response

/// Adapts a closure to `Responder`, turning thrown errors into JSON error responses.
public struct ClosureResponder: Responder {
    let handler: Handler
    /// Wraps a handler.
    public init(_ handler: @escaping Handler) { self.handler = handler }

    public func respond(to request: Request) async -> Response {
        do {
            return try await handler(request)
        } catch let error as HTTPError {
            return error.response
        } catch {
            return HTTPError(.internalServerError, code: "internal_error", message: "The server failed to handle the request.").response
        }
    }
}
