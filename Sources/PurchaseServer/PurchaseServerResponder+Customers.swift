import Foundation
import HTTP

extension PurchaseServerResponder {
    struct GrantBody: Decodable {
        /// How long, from now (1–36500 days); or `expiresDate`; neither: for ever.
        var durationDays: Int64?
        /// When it ends (Unix ms).
        var expiresDate: Int64?
        var reason: String
    }

    struct RevokeBody: Decodable {
        var reason: String?
    }

    struct AdjustBody: Decodable {
        /// Added to the balance; negative takes (never below zero).
        var amount: Int64
        var reason: String
        var idempotencyKey: String?
    }

    /// Support's tools: search, the timeline, promotional entitlements and balance adjustments.
    static func addCustomerRoutes(_ router: inout Router, _ server: PurchaseServer) {
        router.on(.get, "/admin/v1/apps/:app/metrics") { request in
            await guarded {
                try authenticateAdmin(request, server)
                let now = server.clock.now()
                guard let interval = SubscriptionMetrics.Interval(rawValue: request.query["interval"] ?? "day") else {
                    throw HTTPError.badRequest("interval is day, week or month.", code: "invalid_interval")
                }
                let environment = request.query["environment"]
                guard environment == nil || environment == "Sandbox" || environment == "Production" else {
                    throw HTTPError.badRequest("environment is Sandbox or Production.", code: "invalid_environment")
                }
                return .json(try await server.subscriptionMetrics(appId: request.parameters["app"] ?? "",
                                                                  from: try queryDate(request, "from", now.addingTimeInterval(-30 * 86400)),
                                                                  to: try queryDate(request, "to", now.addingTimeInterval(1)), interval: interval,
                                                                  environment: environment))
            }
        }
        router.on(.get, "/admin/v1/apps/:app/customers") { request in
            await guarded {
                try authenticateAdmin(request, server)
                return .json(try await server.customers(appId: request.parameters["app"] ?? "", query: request.query["query"] ?? ""))
            }
        }
        func admin(_ method: HTTPMethod, _ path: String, _ handler: @escaping @Sendable (Request, String, String) async throws -> Response) {
            router.on(method, path) { request in
                await guarded {
                    try authenticateAdmin(request, server)
                    // Two statements, not one call with a `try` inside its arguments: that form crashes the 6.3 optimiser
                    // (signal 11 while splitting the coroutine) in release builds.
                    let user = try userId(request.parameters["user"])
                    return try await handler(request, request.parameters["app"] ?? "", user)
                }
            }
        }
        admin(.post, "/admin/v1/apps/:app/users/:user/entitlements/:entitlement") { request, app, user in
            let body = try request.decode(GrantBody.self)
            let now = server.clock.now()
            var expires = body.expiresDate
            if let days = body.durationDays {
                guard body.expiresDate == nil, (1...PurchaseStore.maximumGrantDays).contains(days) else {
                    throw ServerError(.invalidDuration, "Give durationDays (1–\(PurchaseStore.maximumGrantDays)) or expiresDate, not both.")
                }
                expires = now.milliseconds + days * 86_400_000
            }
            return .json(try await server.store.grantPromotional(appId: app, appUserId: user, entitlement: request.parameters["entitlement"] ?? "",
                                                                 expiresDate: expires, reason: body.reason, now: now))
        }
        admin(.delete, "/admin/v1/apps/:app/users/:user/entitlements/:entitlement") { request, app, user in
            let body = request.body.isEmpty ? RevokeBody() : try request.decode(RevokeBody.self)
            return .json(try await server.store.revokePromotional(appId: app, appUserId: user, entitlement: request.parameters["entitlement"] ?? "",
                                                                  reason: body.reason ?? "revoked by support", now: server.clock.now()))
        }
        admin(.delete, "/admin/v1/apps/:app/users/:user") { _, app, user in
            .json(["deleted": user, "tombstone": try await server.store.deleteCustomer(appId: app, appUserId: user, now: server.clock.now())])
        }
        admin(.get, "/admin/v1/apps/:app/users/:user/timeline") { request, app, user in
            .json(try await server.timeline(appId: app, appUserId: user, limit: Int(request.query["limit"] ?? "") ?? 100, cursor: request.query["cursor"]))
        }
        admin(.post, "/admin/v1/apps/:app/users/:user/balances/:currency/adjust") { request, app, user in
            let body = try request.decode(AdjustBody.self)
            return .json(try await server.store.adjustBalance(appId: app, appUserId: user, currency: request.parameters["currency"] ?? "",
                                                              amount: body.amount, reason: body.reason,
                                                              idempotencyKey: request.header("idempotency-key") ?? body.idempotencyKey ?? "",
                                                              now: server.clock.now()))
        }
    }
}
