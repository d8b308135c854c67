import Foundation

/// Routes requests by method and path pattern; `:name` segments capture parameters.
public struct Router: Responder {
    private struct Route: Sendable {
        let method: HTTPMethod
        let segments: [Substring]
        /// Per segment: the parameter's name for a `:name` segment, nil for a literal one.
        let parameterNames: [String?]
        /// The pattern as metrics and logs name the route.
        let label: String
        let handler: Handler

        init(method: HTTPMethod, pattern: String, handler: @escaping Handler) {
            self.method = method
            segments = pattern.split(separator: "/")
            parameterNames = segments.map { $0.first == ":" ? String($0.dropFirst()) : nil }
            label = "/" + segments.joined(separator: "/")
            self.handler = handler
        }
    }

    private var routes: [Route] = []
    /// Called when no pattern matches the path; defaults to a 404 JSON error.
    public var fallback: Handler = { request in throw HTTPError.notFound("Route \(request.path)") }

    /// Creates an empty router.
    public init() {}

    /// Adds a route.
    public mutating func on(_ method: HTTPMethod, _ pattern: String, _ handler: @escaping Handler) {
        routes.append(Route(method: method, pattern: pattern, handler: handler))
    }

    /// Adds every route of another router.
    public mutating func merge(_ other: Router) { routes.append(contentsOf: other.routes) }

    public func respond(to request: Request) async -> Response {
        let (found, pathMatched) = match(request.method, request.path)
        if let (route, parameters) = found {
            var routed = request
            routed.parameters = parameters
            var response = await ClosureResponder(route.handler).respond(to: routed)
            response.route = route.label
            return response
        }
        if pathMatched {
            return HTTPError(.methodNotAllowed, code: "method_not_allowed", message: "\(request.method) is not allowed on \(request.path).").response
        }
        return await ClosureResponder(fallback).respond(to: request)
    }

    /// The pattern of the route that would answer `method` on `path` (as `Response.route` names it), without running
    /// it; nil when none would.
    public func label(for method: HTTPMethod, path: String) -> String? {
        match(method, path).found?.route.label
    }

    /// The first route for `method` on `path`, with the path's parameters; `pathMatched` when some route's pattern
    /// fits the path whatever its method (a 405 rather than a 404).
    private func match(_ method: HTTPMethod, _ path: String) -> (found: (route: Route, parameters: [String: String])?, pathMatched: Bool) {
        let segments = path.split(separator: "/")
        var pathMatched = false
        for route in routes where route.segments.count == segments.count {
            var parameters: [String: String] = [:]
            var matched = true
            for (index, segment) in segments.enumerated() {
                if let name = route.parameterNames[index] {
                    parameters[name] = HTTPText.percentDecoded(segment)
                } else if route.segments[index] != segment {
                    matched = false
                    break
                }
            }
            guard matched else { continue }
            pathMatched = true
            guard route.method == method || (method == .head && route.method == .get) else { continue }
            return ((route, parameters), true)
        }
        return (nil, pathMatched)
    }
}
