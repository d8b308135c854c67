import Foundation

/// Anything that turns a request into a response; the server transport calls it.
public protocol Responder: Sendable {
    /// Answers one request. Errors are mapped to responses by the caller.
    func respond(to request: Request) async -> Response

    /// Decides, from the request line and headers alone, whether to read the body and how much
    /// of it: the transport asks before reading a byte of it, on its own thread, so this must be
    /// quick and must not block (no database, no await). Refusals are sent at once.
    func admit(_ head: RequestHead) -> Admission

    /// Answers a whole request on the transport's own thread when that can be done without waiting (no
    /// database, no peer, no sleep: pure computation over memory), saving the hand-off to a task and back;
    /// `.later` hands it to the cooperative pool as `respond(to:)` would. The transport asks once the body is read.
    func respondPromptly(to request: Request) -> PromptAnswer

    /// Told of each answer the transport gave without asking `respond(to:)`: a refusal from `admit`, or a body past
    /// its limit (413). On the transport's thread, as `admit` is: quick, no waiting. For counting what clients were refused.
    func refused(_ request: Request, with response: Response)
}

extension Responder {
    /// Admits everything up to the transport's own body limit.
    public func admit(_ head: RequestHead) -> Admission { .accept(bodyLimit: .max) }

    /// Counts nothing.
    public func refused(_ request: Request, with response: Response) {}

    /// Answers everything on the cooperative pool.
    public func respondPromptly(to request: Request) -> PromptAnswer {
        .later { await self.respond(to: request) }
    }
}

/// A responder's answer on the transport's thread.
public enum PromptAnswer: Sendable {
    /// The response, sent at once.
    case now(Response)
    /// Work that must wait for something; the transport runs it as a task and sends what it returns.
    case later(@Sendable () async -> Response)
    /// An answer due after a delay (an emulated latency), decided then by the closure: no task waits meanwhile. The
    /// transport calls the closure on its own thread, as it asks for answers `.now` (at once when it is shutting
    /// down), so the closure must be as quick; it may hand over `.later`, or hold again.
    case after(Duration, @Sendable () -> PromptAnswer)
}

/// What a transport knows of a request before its body: method, path and headers.
public struct RequestHead: Sendable {
    public var method: HTTPMethod
    /// The path without the query string.
    public var path: String
    /// Header fields with lower-cased names.
    public var headers: [String: String]
    /// The declared `Content-Length`, if any.
    public var contentLength: Int?

    public init(method: HTTPMethod, path: String, headers: [String: String], contentLength: Int?) {
        self.method = method
        self.path = path
        var lowered: [String: String] = [:]
        for (name, value) in headers { lowered[HTTPText.lowercasedName(name)] = value }
        self.headers = lowered
        self.contentLength = contentLength
    }

    /// The head of a request whose body is still to come (its header names are lower-cased already).
    public init(_ request: Request, contentLength: Int?) {
        method = request.method
        path = request.path
        headers = request.headers
        self.contentLength = contentLength
    }

    /// The header value for a case-insensitive name.
    public func header(_ name: String) -> String? { headers[HTTPText.lowercasedName(name)] }
}

/// A responder's answer to a request head.
public enum Admission: Sendable {
    /// Read the body, refusing it with 413 once it passes `bodyLimit` bytes.
    case accept(bodyLimit: Int)
    /// Answer with this response without reading the body (401, 413, 429…).
    case refuse(Response)
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
