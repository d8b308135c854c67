import AppStoreModels
import Foundation
import HTTP
import Storage

/// The purchase server's HTTP surface: the app API (`/v1`, per-app API keys) and the admin API
/// (`/admin/v1`, the admin key). Errors are `{"error": {"code", "message"}}`.
public struct PurchaseServerResponder: Responder {
    let server: PurchaseServer
    let router: Router

    /// - Parameter emulator: the App Store emulator beside this server (`storekeeper up`), for the console's Emulator page.
    public init(server: PurchaseServer, emulator: (any ConsoleEmulatorControl)? = nil) {
        self.server = server
        var router = Router()
        Self.addAppRoutes(&router, server)
        Self.addAdminRoutes(&router, server)
        Self.addWebhookRoutes(&router, server)
        Self.addCustomerRoutes(&router, server)
        Self.addConsoleRoutes(&router, server, throttle: LoginThrottle(), emulator: emulator)
        router.on(.get, "/health") { _ in
            .json(["status": "ok", "inFlight": String(server.worker.inFlight)])
        }
        Self.addOperationsRoutes(&router, server)
        self.router = router
    }

    /// Answers through the router, then labels the answer: its latency and status counted under the route
    /// template, and `X-Request-Id` echoed (or made up) so a client's log line meets the server's.
    public func respond(to request: Request) async -> Response {
        let started = ContinuousClock.now
        var response = await router.respond(to: request)
        server.metrics.request(route: response.route ?? "unmatched", method: Self.methodLabel(request.method), status: response.status.code,
                               seconds: (ContinuousClock.now - started).seconds)
        response.headers["X-Request-Id"] = Self.requestId(request.header("x-request-id")) ?? server.store.ids.nextString()
        return response
    }

    /// Refusals at the HTTP edge (a missing or unknown key, an upload rate past its limit, a body too large) counted
    /// with the answered requests, under the route that would have answered; not in its latency.
    public func refused(_ request: Request, with response: Response) {
        server.metrics.refusal(route: router.label(for: request.method, path: request.path) ?? "unmatched",
                               method: Self.methodLabel(request.method), status: response.status.code)
    }

    /// A method as a label value, from a fixed set: any method a client invents is OTHER.
    static func methodLabel(_ method: HTTPMethod) -> String {
        ["GET", "POST", "PUT", "DELETE", "HEAD", "PATCH", "OPTIONS"].contains(method.rawValue) ? method.rawValue : "OTHER"
    }

    /// A client's request id, if it is 1–128 characters of letters, digits and `-_.:`.
    static func requestId(_ header: String?) -> String? {
        guard let header, (1...128).contains(header.utf8.count),
              header.utf8.allSatisfy({ $0 < 128 && (isalnum(Int32($0)) != 0 || "-_.:".utf8.contains($0)) }) else { return nil }
        return header
    }

    /// Only `/healthz`, `/readyz` and `/metrics`, without authentication: for a port that only the
    /// monitoring network reaches (`server serve --metrics-port`).
    public static func operations(_ server: PurchaseServer) -> Router {
        var router = Router()
        addOperationsRoutes(&router, server)
        return router
    }

    /// `/healthz` (the process answers), `/readyz` (it can do its job), `/metrics` (Prometheus text; the admin key,
    /// unless served on `--metrics-port`).
    static func addOperationsRoutes(_ router: inout Router, _ server: PurchaseServer) {
        router.on(.get, "/healthz") { _ in .json(["status": "ok"]) }
        router.on(.get, "/readyz") { _ in
            let readiness = await server.readiness()
            return .json(readiness, status: readiness.ready ? .ok : .serviceUnavailable)
        }
        router.on(.get, "/metrics") { _ in
            Response(status: .ok, headers: ["Content-Type": "text/plain; version=0.0.4; charset=utf-8"], body: Data(await server.metricsText().utf8))
        }
    }

    static func bearer(_ request: Request) -> String? { bearer(request.header("authorization")) }

    /// The token of `Authorization: Bearer TOKEN` (the scheme in any case, spaces and tabs around the token
    /// dropped), or nil. Read on the header's bytes: it runs twice on every request.
    static func bearer(_ header: String?) -> String? {
        guard let header, header.utf8.count <= 512 else { return nil }
        var rest = header.utf8[...]
        for expected in "bearer ".utf8 {
            guard let byte = rest.popFirst(), byte == expected || (expected != UInt8(ascii: " ") && byte | 0x20 == expected) else { return nil }
        }
        func blank(_ byte: UInt8) -> Bool { byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") }
        while let first = rest.first, blank(first) { rest.removeFirst() }
        while let last = rest.last, blank(last) { rest.removeLast() }
        return rest.isEmpty ? nil : String(Substring(rest))
    }

    /// The key of the request, or a 401: from the key ring in memory (the HTTP edge asked the
    /// same before reading the body).
    static func authenticate(_ request: Request, _ server: PurchaseServer) throws -> APIKeyRecord {
        guard let key = bearer(request), !key.isEmpty else {
            throw HTTPError(.unauthorized, code: "missing_api_key", message: "Send the app's API key as 'Authorization: Bearer KEY'.")
        }
        guard let record = server.store.liveKey(key, now: server.clock.now()) else {
            throw HTTPError(.unauthorized, code: "invalid_api_key", message: "The API key is not valid (unknown or revoked).")
        }
        return record
    }

    /// Who a request may act for: the user it names, checked against its key and user token.
    /// - A secret key acts for any user of its app (`authenticated`: the backend vouches).
    /// - A public key acts only for the user of a valid `Storekeeper-User-Token`; without one, only
    ///   when the app's `userAuth` is `optional` (migration), and then the user is not `authenticated`.
    static func authorize(_ request: Request, _ server: PurchaseServer, key: APIKeyRecord, naming named: String?) async throws -> (user: String, authenticated: Bool) {
        if key.kind == .secret { return (try userId(named), true) }
        guard let app = try await server.store.cachedApp(key.appId) else { throw HTTPError.notFound("App \(key.appId)") }
        if let token = request.header(UserToken.header) {
            let subject = try UserToken(token, app: app, now: server.clock.now()).subject
            if let named, try userId(named) != subject {
                throw ServerError(.userMismatch, "The user token is for another user than the one this request names.")
            }
            return (subject, true)
        }
        guard app.userAuth == .optional else {
            throw ServerError(.missingUserToken,
                              "With a public key, send the user's token as 'Storekeeper-User-Token' (minted by your backend with the app's user-token secret).")
        }
        return (try userId(named), false)
    }

    /// Refuses public keys: the endpoint needs the app's secret key.
    static func requireSecret(_ key: APIKeyRecord) throws {
        guard key.kind == .secret else {
            throw ServerError(.secretKeyRequired, "This endpoint needs the app's secret key (sk_…), which stays on your backend.")
        }
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

    /// `{"notificationType", "notificationUUID", "outcome", "reason"?, "verificationId"?}`, written directly (keys sorted).
    static func notificationResponse(_ receipt: NotificationReceipt) -> Response {
        var json = JSONBuffer(capacity: 256 + (receipt.reason?.utf8.count ?? 0))
        json.object { json in
            json.field("notificationType", receipt.notificationType)
            json.field("notificationUUID", receipt.notificationUUID)
            json.field("outcome", receipt.outcome.rawValue)
            json.field("reason", receipt.reason)
            json.field("verificationId", receipt.verificationId)
        }
        return .rawJSON(Data(json.bytes))
    }
}

/// Runs a handler, mapping server and storage errors to the JSON error shape.
func guarded(_ body: () async throws -> Response) async -> Response {
    do {
        return try await body()
    } catch let error as ServerError {
        return HTTPError(HTTPStatus(error.kind.httpStatus), code: error.code.rawValue, message: error.message).response
    } catch let error as HTTPError {
        return error.response
    } catch let error as ReceiptRejection {
        return HTTPError(.badRequest, code: error.code, message: error.reason).response
    } catch is StorageError {
        return HTTPError(.serviceUnavailable, code: "storage_unavailable", message: "The server could not reach its database; retry.").response
    } catch {
        // Not a database failure, so not "retry": a bug, named by its type (never its text, which may hold input).
        FileHandle.standardError.write(Data("storekeeper: internal error answering a request: \(type(of: error))\n".utf8))
        return HTTPError(.internalServerError, code: "internal_error", message: "The server failed to answer this request.").response
    }
}

extension ServerError.Kind {
    /// The HTTP status of a refusal of this kind: chosen here, at the HTTP edge, and nowhere else.
    var httpStatus: Int {
        switch self {
        case .invalidRequest: 400
        case .unauthenticated: 401
        case .forbidden: 403
        case .notFound: 404
        case .conflict: 409
        case .unavailable: 503
        case .internalFailure: 500
        }
    }
}
