import AppStoreModels
import Foundation
import HTTP
import Storage

extension PurchaseServerResponder {
    struct OperatorBody: Decodable {
        var email: String
        var role: String?
        var password: String?
    }

    struct OperatorAdded: Encodable {
        var email: String
        var role: OperatorRole
        var hasPassword: Bool
        /// Append to the server's URL: signs the operator in once, within 24 hours.
        var loginPath: String
    }

    struct AppBody: Decodable {
        var id: String?
        var bundleId: String?
        var name: String?
        var sharedSecret: String?
        var bundleIds: [String]?
        var replayPolicy: ReplayPolicy?
        var sandboxPolicy: SandboxPolicy?
        var sandboxAllowList: [String]?
        var quirk21002Policy: Quirk21002Policy?
        var appAppleId: Int64?
        /// `{issuerId, keyId, privateKey}` (PEM) of an App Store Server API key.
        var serverAPIKey: ServerAPICredentials?
        var consumptionPolicy: ConsumptionPolicy?
        /// `required` (the default for new apps) or `optional`.
        var userAuth: UserAuthPolicy?
        /// The HS256 secret for user tokens; generated for a new app when neither it nor a public key is given.
        var userTokenSecret: String?
        /// An ES256 public key (PEM) for user tokens.
        var userTokenPublicKey: String?
    }

    /// A product mapping from what an admin sent (the admin API's JSON or the console's form), its type, price and
    /// currency checked; the store checks the rest (amounts, durations, identifiers).
    static func productMapping(_ productId: String, _ body: ProductBody) throws -> ProductMapping {
        guard let type = ProductType(loose: body.type) else {
            throw HTTPError.badRequest("type is consumable, non-consumable, auto-renewable, non-renewing or free-subscription.", code: "invalid_type")
        }
        if let currency = body.priceCurrency, currency.count != 3 || !currency.allSatisfy({ $0.isASCII && $0.isUppercase }) {
            throw HTTPError.badRequest("priceCurrency is an ISO 4217 code: three capital letters.", code: "invalid_currency")
        }
        if let price = body.price, !ProductMapping.isValidPrice(price) {
            throw HTTPError.badRequest("price is a decimal from 0 to 1000000000 with at most 6 decimals, e.g. \"9.99\".", code: "invalid_price")
        }
        return ProductMapping(productId: productId, type: type, entitlement: body.entitlement, currency: body.currency, amount: body.amount,
                              durationDays: body.durationDays, price: body.price, priceCurrency: body.priceCurrency)
    }

    struct KeyBody: Decodable {
        var kind: APIKeyKind?
        var label: String?
        /// Seconds the old key keeps working after a rotation (default 0: revoked at once).
        var graceSeconds: Double?
    }

    struct ProductBody: Decodable {
        var type: String
        var entitlement: String?
        var currency: String?
        var amount: Int64?
        var durationDays: Int64?
        var price: String?
        var priceCurrency: String?
    }

    /// A list's `limit`: 100 unless given, within 1 … 10,000 (SQLite reads a negative `LIMIT` as none at all).
    static func listLimit(_ request: Request) -> Int {
        max(1, min(Int(request.query["limit"] ?? "") ?? 100, 10_000))
    }

    static func addAdminRoutes(_ router: inout Router, _ server: PurchaseServer) {
        func admin(_ method: HTTPMethod, _ path: String, _ handler: @escaping @Sendable (Request) async throws -> Response) {
            router.on(method, path) { request in
                await guarded {
                    try authenticateAdmin(request, server)
                    return try await handler(request)
                }
            }
        }
        admin(.get, "/admin/v1/apps") { _ in .json(try await server.store.apps()) }
        // Console operators: add (or change the role of) one and get a one-time login link; list; remove.
        admin(.post, "/admin/v1/operators") { request in
            let body = try request.decode(OperatorBody.self)
            guard let role = body.role.flatMap(OperatorRole.init(rawValue:)) else {
                throw HTTPError.badRequest("role is admin, support, finance or developer.", code: "invalid_role")
            }
            // Real time: a login link's 24 hours are the operator's, not an emulated clock's.
            let (person, token) = try await server.store.addOperator(email: body.email, role: role, password: body.password, now: Date())
            return .json(OperatorAdded(email: person.email, role: person.role, hasPassword: person.hasPassword,
                                       loginPath: "/console/login/link?token=\(token)"), status: .created)
        }
        admin(.get, "/admin/v1/operators") { _ in .json(try await server.store.operators()) }
        admin(.post, "/admin/v1/metrics/rebuild") { _ in
            try await server.store.markMetricsForRebuild()
            return .json(["pendingChains": try await server.store.refreshMetrics(limit: 0)], status: .accepted)
        }
        admin(.delete, "/admin/v1/operators/:email") { request in
            try await server.store.removeOperator(email: request.parameters["email"] ?? "", by: "admin key", now: server.clock.now())
            return Response(status: .noContent)
        }
        admin(.post, "/admin/v1/reconcile") { _ in .json(await server.reconcile()) }
        admin(.get, "/admin/v1/notifications") { request in
            let limit = Int(request.query["limit"] ?? "") ?? 100
            let query = request.query
            return .json(try await server.store.database.longRead { db in
                try NotificationRepository(db: db).list(appId: query["app"], type: query["type"], state: query["state"], limit: limit)
            })
        }
        admin(.get, "/admin/v1/notifications/:uuid") { request in
            let uuid = request.parameters["uuid"] ?? ""
            return .json(try await server.store.recordedNotification(uuid))
        }
        admin(.post, "/admin/v1/apps") { request in
            let body = try request.decode(AppBody.self)
            guard let id = body.id ?? body.bundleId else { throw HTTPError.badRequest("id (the bundle id) is required.", code: "missing_id") }
            let app = ServerApp(id: id, name: body.name, sharedSecret: body.sharedSecret, bundleIds: body.bundleIds,
                                replayPolicy: body.replayPolicy ?? .reject, sandboxPolicy: body.sandboxPolicy ?? .allow,
                                sandboxAllowList: try (body.sandboxAllowList ?? []).map { try userId($0) }, quirk21002Policy: body.quirk21002Policy ?? .retrySandbox,
                                appAppleId: body.appAppleId, serverAPIKey: body.serverAPIKey, consumptionPolicy: body.consumptionPolicy ?? .ignore,
                                userAuth: body.userAuth ?? .required,
                                userTokenSecret: body.userTokenSecret ?? (body.userTokenPublicKey == nil ? UserToken.generateSecret() : nil),
                                userTokenPublicKey: body.userTokenPublicKey)
            try await server.store.createApp(app, now: server.clock.now())
            return .json(app, status: .created)
        }
        admin(.get, "/admin/v1/apps/:app") { request in
            guard let app = try await server.store.app(request.parameters["app"] ?? "") else { throw HTTPError.notFound("App") }
            return .json(app)
        }
        admin(.put, "/admin/v1/apps/:app") { request in
            guard var app = try await server.store.app(request.parameters["app"] ?? "") else { throw HTTPError.notFound("App") }
            let body = try request.decode(AppBody.self)
            if let name = body.name { app.name = name }
            if let secret = body.sharedSecret { app.sharedSecret = secret }
            if let bundleIds = body.bundleIds { app.bundleIds = bundleIds }
            if let policy = body.replayPolicy { app.replayPolicy = policy }
            if let policy = body.sandboxPolicy { app.sandboxPolicy = policy }
            if let list = body.sandboxAllowList { app.sandboxAllowList = try list.map { try userId($0) } }
            if let policy = body.quirk21002Policy { app.quirk21002Policy = policy }
            if let id = body.appAppleId { app.appAppleId = id }
            if let key = body.serverAPIKey { app.serverAPIKey = key }
            if let policy = body.consumptionPolicy { app.consumptionPolicy = policy }
            if let policy = body.userAuth { app.userAuth = policy }
            if let secret = body.userTokenSecret { app.userTokenSecret = secret.isEmpty ? nil : secret }
            if let pem = body.userTokenPublicKey { app.userTokenPublicKey = pem.isEmpty ? nil : pem }
            try await server.store.updateApp(app)
            return .json(app)
        }
        admin(.post, "/admin/v1/apps/:app/keys") { request in
            // Body optional: {"kind": "public"|"secret", "label"}; ?label= kept for older callers.
            let body = request.body.isEmpty ? KeyBody() : try request.decode(KeyBody.self)
            let kind = body.kind ?? (request.query["kind"].flatMap(APIKeyKind.init(rawValue:)) ?? .secret)
            let appId = request.parameters["app"] ?? ""
            let key = try await server.store.createKey(appId: appId, label: body.label ?? request.query["label"], kind: kind, now: server.clock.now())
            let record = server.store.liveKey(key, now: server.clock.now())
            return .json(["appId": appId, "apiKey": key, "id": record?.id ?? "", "kind": kind.rawValue], status: .created)
        }
        admin(.get, "/admin/v1/apps/:app/keys") { request in
            .json(try await server.store.keys(appId: request.parameters["app"] ?? ""))
        }
        admin(.delete, "/admin/v1/apps/:app/keys/:id") { request in
            .json(try await server.store.revokeKey(appId: request.parameters["app"] ?? "", id: request.parameters["id"] ?? "",
                                                    effective: server.clock.now(), now: server.clock.now()))
        }
        admin(.post, "/admin/v1/apps/:app/keys/:id/rotate") { request in
            let body = request.body.isEmpty ? KeyBody() : try request.decode(KeyBody.self)
            let grace = body.graceSeconds ?? 0
            guard grace.isFinite, (0...(7 * 86400)).contains(grace) else {
                throw HTTPError.badRequest("graceSeconds is 0…604800 (a week).", code: "invalid_grace")
            }
            let appId = request.parameters["app"] ?? ""
            let (key, record) = try await server.store.rotateKey(appId: appId, id: request.parameters["id"] ?? "", grace: grace, now: server.clock.now())
            return .json(["appId": appId, "apiKey": key, "id": record.id, "kind": record.kind.rawValue, "replaces": request.parameters["id"] ?? ""],
                         status: .created)
        }
        admin(.get, "/admin/v1/apps/:app/products") { request in
            .json(try await server.store.products(appId: request.parameters["app"] ?? ""))
        }
        admin(.put, "/admin/v1/apps/:app/products/:product") { request in
            let body = try request.decode(ProductBody.self)
            let mapping = try productMapping(request.parameters["product"] ?? "", body)
            try await server.store.setProduct(appId: request.parameters["app"] ?? "", mapping)
            return .json(mapping)
        }
        admin(.get, "/admin/v1/apps/:app/users/:user") { request in
            let appId = request.parameters["app"] ?? ""
            let user = try userId(request.parameters["user"])
            let view = try await server.store.user(appId: appId, appUserId: user, now: server.clock.now())
            var body = try JSONSerialization.jsonObject(with: Response.encoder.encode(view)) as? [String: Any] ?? [:]
            body["audit"] = try await server.store.auditEvents(appId: appId, appUserId: user)
            return .rawJSON(try JSONSerialization.data(withJSONObject: body, options: [.sortedKeys]))
        }
        admin(.get, "/admin/v1/transactions") { request in
            let limit = Self.listLimit(request)
            // Several statements (one per app without an app): one snapshot, so a page holds no row newer than one it lacks.
            let rows = try await server.store.database.snapshotRead { db in
                try LedgerReader(db: db).rows(appId: request.query["app"], appUserId: request.query["user"], limit: limit)
            }
            return .json(rows)
        }
        admin(.get, "/admin/v1/jobs") { request in
            var state: JobState?
            if let text = request.query["state"] {
                guard let parsed = JobState(rawValue: text) else {
                    throw HTTPError.badRequest("state is one of \(JobState.allCases.map(\.rawValue).joined(separator: ", ")).", code: "invalid_state")
                }
                state = parsed
            }
            let jobs = try await server.store.jobs(appId: request.query["app"], state: state, limit: Self.listLimit(request))
            let list: [[String: Any]] = jobs.map { job in
                var item: [String: Any] = ["verificationId": job.id, "appId": job.appId, "appUserId": job.appUserId, "state": job.state.rawValue,
                                           "attempts": job.attempts, "kind": job.kind.rawValue,
                                           "createdAt": job.createdAt.milliseconds]
                if let reason = job.reason { item["reason"] = reason }
                return item
            }
            return .rawJSON(try JSONSerialization.data(withJSONObject: ["jobs": list, "counts": try await server.store.jobCounts()], options: [.sortedKeys]))
        }
        admin(.post, "/admin/v1/jobs/recount") { _ in
            let (jobs, deliveries) = try await server.store.recountTotals()
            return .json(["verificationJobs": jobs, "webhookDeliveries": deliveries])
        }
        admin(.post, "/admin/v1/jobs/replay") { request in
            struct ReplayBody: Decodable { var ids: [String]? }
            let body = request.body.isEmpty ? ReplayBody(ids: nil) : try request.decode(ReplayBody.self)
            let count = try await server.store.replay(ids: body.ids, now: server.clock.now())
            server.worker.wake()
            return .json(["replayed": count])
        }
        admin(.get, "/admin/v1/reports/revenue") { request in
            .json(try await revenue(request, server, appId: request.query["app"]))
        }
    }
}
