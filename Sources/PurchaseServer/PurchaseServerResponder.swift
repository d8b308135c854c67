import AppStoreModels
import Foundation
import HTTP

/// The purchase server's HTTP surface: the app API (`/v1`, per-app API keys) and the admin API
/// (`/admin/v1`, the admin key). Errors are `{"error": {"code", "message"}}`.
public struct PurchaseServerResponder: Responder {
    let server: PurchaseServer
    let router: Router

    public init(server: PurchaseServer) {
        self.server = server
        var router = Router()
        Self.addAppRoutes(&router, server)
        Self.addAdminRoutes(&router, server)
        router.on(.get, "/health") { _ in
            .json(["status": "ok", "inFlight": String(server.worker.inFlight)])
        }
        self.router = router
    }

    public func respond(to request: Request) async -> Response {
        await router.respond(to: request)
    }

    static func bearer(_ request: Request) -> String? {
        guard let header = request.header("authorization"), header.lowercased().hasPrefix("bearer ") else { return nil }
        return String(header.dropFirst(7)).trimmingCharacters(in: .whitespaces)
    }

    /// The app of the request's API key, or a 401.
    static func authenticate(_ request: Request, _ server: PurchaseServer) async throws -> String {
        guard let key = bearer(request), !key.isEmpty else {
            throw HTTPError(.unauthorized, code: "missing_api_key", message: "Send the app's API key as 'Authorization: Bearer KEY'.")
        }
        guard let appId = try await server.store.appId(forKey: key) else {
            throw HTTPError(.unauthorized, code: "invalid_api_key", message: "The API key is not valid.")
        }
        return appId
    }

    static func authenticateAdmin(_ request: Request, _ server: PurchaseServer) throws {
        guard let key = bearer(request), server.isAdmin(key) else {
            throw HTTPError(.unauthorized, code: "invalid_admin_key", message: "This endpoint needs the admin key as 'Authorization: Bearer KEY'.")
        }
    }

    /// The app user id of a request, normalised (`ClientIdentifier`), or a 400 `invalid_user_id`.
    static func userId(_ value: String?) throws -> String {
        try ClientIdentifier(value ?? "", .appUserId).value
    }

    static func waitSeconds(_ request: Request) throws -> Double {
        guard let text = request.query["wait"] else { return 0 }
        guard let seconds = Double(text), seconds >= 0 else { throw HTTPError.badRequest("wait must be a number of seconds (0–30).", code: "invalid_wait") }
        return min(seconds, 30)
    }

    /// `{"verificationId", "state", "reason"?, "environment"?, "result"?}`
    static func verificationResponse(_ job: VerificationJob) -> Response {
        // Written directly (keys sorted): this answers every upload, and JSONSerialization costs more than the rest of it.
        var json = JSONBuffer(capacity: 256 + (job.result?.utf8.count ?? 0))
        json.object { json in
            json.field("appUserId", job.appUserId)
            json.field("attempts", job.attempts)
            json.field("createdAt", job.createdAt.milliseconds)
            if let environment = job.environment { json.field("environment", environment.rawValue) }
            json.field("kind", job.kind.rawValue)
            if let reason = job.reason { json.field("reason", reason) }
            if let result = job.result, result.first == "{" { json.field("result", rawJSON: result) }
            if let settled = job.settledAt { json.field("settledAt", settled.milliseconds) }
            json.field("state", job.state.rawValue)
            json.field("verificationId", job.id)
        }
        return Response(status: job.state.isSettled ? .ok : HTTPStatus(202), headers: ["Content-Type": "application/json"], body: Data(json.bytes))
    }
}

/// Runs a handler, mapping server and storage errors to the JSON error shape.
func guarded(_ body: () async throws -> Response) async -> Response {
    do {
        return try await body()
    } catch let error as ServerError {
        return HTTPError(HTTPStatus(error.status), code: error.code, message: error.message).response
    } catch let error as HTTPError {
        return error.response
    } catch {
        return HTTPError(.serviceUnavailable, code: "storage_unavailable", message: "The server could not reach its database; retry.").response
    }
}
