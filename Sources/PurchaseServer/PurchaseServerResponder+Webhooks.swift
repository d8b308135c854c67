import Foundation
import HTTP

extension PurchaseServerResponder {
    struct WebhookBody: Decodable {
        var url: String
        /// Event types to send; all when absent or empty.
        var eventTypes: [String]?
        /// A signing secret of your own (16–512 bytes); generated when absent.
        var secret: String?
        /// `events` (default) or `apple`: Apple's signed notifications forwarded.
        var format: WebhookFormat?
    }

    struct RotateWebhookBody: Decodable {
        /// Seconds the old secret keeps signing beside the new one (default a day, at most a week).
        var graceSeconds: Double?
    }

    /// `/admin/v1/apps/{app}/webhooks…`: endpoints, their deliveries, tests and redeliveries.
    static func addWebhookRoutes(_ router: inout Router, _ server: PurchaseServer) {
        func admin(_ method: HTTPMethod, _ path: String, _ handler: @escaping @Sendable (Request, String) async throws -> Response) {
            router.on(method, path) { request in
                await guarded {
                    try authenticateAdmin(request, server)
                    return try await handler(request, request.parameters["app"] ?? "")
                }
            }
        }
        admin(.post, "/admin/v1/apps/:app/webhooks") { request, app in
            let body = try request.decode(WebhookBody.self)
            var types: [WebhookEventType] = []
            for name in body.eventTypes ?? [] {
                guard let type = WebhookEventType(rawValue: name), type != .test, type != .appleNotification else {
                    throw HTTPError.badRequest("Unknown event type \(name.prefix(64)); the types are \(WebhookEventType.allCases.filter { $0 != .test }.map(\.rawValue).joined(separator: ", ")).",
                                               code: "invalid_event_type")
                }
                if !types.contains(type) { types.append(type) }
            }
            let (endpoint, secret) = try await server.store.createWebhook(appId: app, url: body.url, eventTypes: types, secret: body.secret,
                                                                          format: body.format ?? .events, now: server.clock.now())
            return .json(WebhookCreated(endpoint: endpoint, secret: secret), status: .created)
        }
        admin(.get, "/admin/v1/apps/:app/webhooks") { _, app in .json(try await server.store.webhooks(appId: app)) }
        admin(.get, "/admin/v1/apps/:app/webhooks/:id") { request, app in
            guard let endpoint = try await server.store.webhooks(appId: app).first(where: { $0.id == request.parameters["id"] }) else {
                throw ServerError(.webhookNotFound, "App \(app) has no webhook \(request.parameters["id"] ?? "").")
            }
            return .json(endpoint)
        }
        admin(.delete, "/admin/v1/apps/:app/webhooks/:id") { request, app in
            try await server.store.deleteWebhook(appId: app, id: request.parameters["id"] ?? "", now: server.clock.now())
            return .json(["deleted": request.parameters["id"] ?? ""])
        }
        admin(.post, "/admin/v1/apps/:app/webhooks/:id/rotate") { request, app in
            let body = request.body.isEmpty ? RotateWebhookBody() : try request.decode(RotateWebhookBody.self)
            let grace = body.graceSeconds ?? 86400
            guard grace.isFinite, (0...(7 * 86400)).contains(grace) else {
                throw HTTPError.badRequest("graceSeconds is 0…604800 (a week).", code: "invalid_grace")
            }
            let secret = try await server.store.rotateWebhookSecret(appId: app, id: request.parameters["id"] ?? "", grace: grace, now: server.clock.now())
            return .json(["id": request.parameters["id"] ?? "", "secret": secret], status: .created)
        }
        admin(.post, "/admin/v1/apps/:app/webhooks/:id/test") { request, app in
            let eventId = try await server.store.testWebhook(appId: app, id: request.parameters["id"] ?? "", now: server.clock.now())
            return .json(["eventId": eventId], status: .accepted)
        }
        admin(.get, "/admin/v1/apps/:app/webhooks/:id/deliveries") { request, app in
            let state = request.query["state"]
            if let state, !["pending", "delivered", "failed"].contains(state) {
                throw HTTPError.badRequest("state is pending, delivered or failed.", code: "invalid_state")
            }
            return .json(try await server.store.webhookDeliveries(appId: app, id: request.parameters["id"] ?? "", state: state,
                                                                  limit: Int(request.query["limit"] ?? "") ?? 100))
        }
        admin(.post, "/admin/v1/apps/:app/webhooks/:id/deliveries/:event/redeliver") { request, app in
            try await server.store.redeliverWebhook(appId: app, id: request.parameters["id"] ?? "", eventId: request.parameters["event"] ?? "",
                                                    now: server.clock.now())
            return .json(["redelivering": request.parameters["event"] ?? ""], status: .accepted)
        }
    }

    /// The answer to adding an endpoint: the only time its secret is shown.
    struct WebhookCreated: Encodable {
        var endpoint: WebhookEndpoint
        var secret: String

        func encode(to encoder: any Encoder) throws {
            try endpoint.encode(to: encoder)
            var container = encoder.container(keyedBy: Key.self)
            try container.encode(secret, forKey: Key(stringValue: "secret"))
        }

        struct Key: CodingKey {
            var stringValue: String
            var intValue: Int? { nil }
            init(stringValue: String) { self.stringValue = stringValue }
            init?(intValue: Int) { nil }
        }
    }
}
