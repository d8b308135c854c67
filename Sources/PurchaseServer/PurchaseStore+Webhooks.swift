import AppStoreModels
import Foundation
import Storage

extension PurchaseStore {
    func webhooks(_ db: any SQLConnection) -> WebhookRepository {
        WebhookRepository(db: db, dialect: database.dialect, secrets: SecretColumns(secrets: secrets))
    }

    /// The longest endpoint URL accepted.
    static let maximumWebhookURLLength = 2048
    /// Endpoints per app at most.
    static let maximumWebhooks = 16

    /// Adds an endpoint and returns it with its signing secret (shown once; `whsec_` and 32 random bytes unless given).
    public func createWebhook(appId: String, url: String, eventTypes: [WebhookEventType], secret: String?, format: WebhookFormat = .events,
                              now: Date) async throws
        -> (endpoint: WebhookEndpoint, secret: String) {
        guard url.utf8.count <= Self.maximumWebhookURLLength, let parsed = URL(string: url), ["http", "https"].contains(parsed.scheme?.lowercased() ?? ""),
              !(parsed.host ?? "").isEmpty, parsed.user == nil, parsed.password == nil else {
            throw ServerError(.invalidWebhookUrl,
                              "The webhook URL must be an absolute http(s) URL of at most \(Self.maximumWebhookURLLength) bytes, without credentials (the signature authenticates).")
        }
        if let secret, !(16...512).contains(secret.utf8.count) {
            throw ServerError(.invalidWebhookSecret, "A webhook secret is 16–512 bytes.")
        }
        let secret = secret ?? "whsec_" + APIKey.random()
        let endpoint = WebhookEndpoint(id: "wh_" + ids.nextString().replacingOccurrences(of: "-", with: "").prefix(20), appId: appId, url: url,
                                       eventTypes: format == .apple ? [] : eventTypes, createdAt: now.milliseconds, secretHint: String(secret.suffix(4)),
                                       format: format)
        try await database.transaction { db in
            guard try self.apps(db).exists(appId) else { throw ServerError(.appNotFound, "App \(appId) is not registered.") }
            let repository = self.webhooks(db)
            guard try repository.endpoints(appId: appId).count < Self.maximumWebhooks else {
                throw ServerError(.tooManyWebhooks, "An app has at most \(Self.maximumWebhooks) webhook endpoints.")
            }
            try repository.insert(endpoint, secret: secret)
            try self.audit(db).append(appId: appId, userId: nil, kind: "webhook_added", detail: ["webhookId": endpoint.id, "url": url], now: now)
        }
        return (endpoint, secret)
    }

    /// An app's endpoints (never their secrets).
    public func webhooks(appId: String) async throws -> [WebhookEndpoint] {
        try await database.transaction { db in try self.webhooks(db).endpoints(appId: appId).map(\.endpoint) }
    }

    /// Removes an endpoint; deliveries still owed to it are dropped.
    public func deleteWebhook(appId: String, id: String, now: Date) async throws {
        try await database.transaction { db in
            guard try self.webhooks(db).delete(appId: appId, id: id) else { throw ServerError(.webhookNotFound, "App \(appId) has no webhook \(id).") }
            try self.audit(db).append(appId: appId, userId: nil, kind: "webhook_removed", detail: ["webhookId": id], now: now)
        }
    }

    /// A new signing secret for an endpoint; the old one keeps signing (a second `v1`) for `grace` seconds.
    public func rotateWebhookSecret(appId: String, id: String, grace: TimeInterval, now: Date) async throws -> String {
        let secret = "whsec_" + APIKey.random()
        try await database.transaction { db in
            guard try self.webhooks(db).rotate(appId: appId, id: id, secret: secret, previousUntil: now.addingTimeInterval(max(0, grace)).milliseconds) else {
                throw ServerError(.webhookNotFound, "App \(appId) has no webhook \(id).")
            }
            try self.audit(db).append(appId: appId, userId: nil, kind: "webhook_secret_rotated", detail: ["webhookId": id], now: now)
        }
        webhookSignal.wake()
        return secret
    }

    /// Queues a `TEST` event to one endpoint; returns its id.
    public func testWebhook(appId: String, id: String, now: Date) async throws -> String {
        let eventId = try await database.transaction { db -> String in
            guard let target = try self.webhooks(db).endpoints(appId: appId).first(where: { $0.endpoint.id == id }) else {
                throw ServerError(.webhookNotFound, "App \(appId) has no webhook \(id).")
            }
            let draft = WebhookEventDraft(type: .test, appUserId: "")
            return try self.store(draft, appId: appId, endpoints: [target.endpoint.id], view: nil, sequence: 0, db, now: now)
        }
        webhookSignal.wake()
        return eventId
    }

    /// An endpoint's deliveries, newest first.
    public func webhookDeliveries(appId: String, id: String, state: String?, limit: Int) async throws -> [WebhookDelivery] {
        try await database.transaction { db in
            let repository = self.webhooks(db)
            guard try repository.endpoints(appId: appId).contains(where: { $0.endpoint.id == id }) else {
                throw ServerError(.webhookNotFound, "App \(appId) has no webhook \(id).")
            }
            return try repository.deliveries(endpointId: id, state: state, limit: max(1, min(limit, 1000)))
        }
    }

    /// Sends a delivery again now (delivered, failed or pending alike).
    public func redeliverWebhook(appId: String, id: String, eventId: String, now: Date) async throws {
        try await database.transaction { db in
            let repository = self.webhooks(db)
            guard try repository.endpoints(appId: appId).contains(where: { $0.endpoint.id == id }),
                  try repository.redeliver(eventId: eventId, endpointId: id, now: now.milliseconds) else {
                throw ServerError(.webhookDeliveryNotFound, "Webhook \(id) has no delivery of event \(eventId).")
            }
            try self.audit(db).append(appId: appId, userId: nil, kind: "webhook_redelivered", detail: ["webhookId": id, "eventId": eventId], now: now)
        }
        webhookSignal.wake()
    }

    /// Deliveries per state, for health and metrics.
    public func webhookDeliveryCounts() async throws -> [String: Int64] {
        try await database.read { db in try self.webhooks(db).counts() }
    }

    /// Writes events in the caller's transaction (the one that made the change): each is numbered in its
    /// user's sequence and owed to every endpoint of the app that takes its type, carrying the user's
    /// entitlements and balances as they stand after the change. Apps without endpoints record nothing.
    func recordEvents(_ drafts: [WebhookEventDraft], appId: String, endpoints: [WebhookEndpoint], _ db: any SQLConnection, now: Date,
                      mappings: [String: ProductMapping]? = nil) throws {
        guard !drafts.isEmpty, !endpoints.isEmpty else { return }
        let repository = webhooks(db)
        let routed = drafts.map { draft in (draft, endpoints.filter { $0.accepts(draft.type) }.map(\.id)) }.filter { !$0.1.isEmpty }
        var users: [String] = []
        for (draft, _) in routed where !users.contains(draft.appUserId) { users.append(draft.appUserId) }
        let mappings = try mappings ?? Dictionary(try apps(db).products(appId: appId).map { ($0.productId, $0) }, uniquingKeysWith: { $1 })
        var stored: [(event: StoredWebhookEvent, endpointIds: [String])] = []
        for user in users {
            let mine = routed.filter { $0.0.appUserId == user }
            let view = try userView(appId: appId, appUserId: user, db, now: now, mappings: mappings)
            // One round trip numbers all of this user's events.
            let last = try repository.reserveSequence(appId: appId, appUserId: user, count: Int64(mine.count))
            for (offset, (draft, targets)) in mine.enumerated() {
                stored.append((event(draft, appId: appId, view: view, sequence: last - Int64(mine.count - 1 - offset), now: now), targets))
            }
        }
        try insertCounted(stored, db)
    }

    /// Inserts events in the caller's transaction and counts the write, so that `wakingWebhooks` wakes the deliverer after it.
    private func insertCounted(_ events: [(event: StoredWebhookEvent, endpointIds: [String])], _ db: any SQLConnection) throws {
        guard !events.isEmpty else { return }
        try webhooks(db).insert(events: events)
        webhookEventsWritten.wrappingAdd(1, ordering: .relaxed)
    }

    /// One transaction that may record webhook events, the deliverer woken after it if it did (`wakingWebhooks`).
    func transactionWakingWebhooks<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T {
        try await wakingWebhooks { try await database.transaction(body) }
    }

    /// Runs a write that may record webhook events and wakes the deliverer after it, if events were written while it
    /// ran: its own, committed now, or another write's, which wakes the deliverer after its own commit too (a wake-up
    /// too many costs one claim). Also when the write throws: a commit whose answer was lost may have committed.
    /// Nothing is woken for writes that wrote no event.
    func wakingWebhooks<T>(_ write: () async throws -> T) async rethrows -> T {
        let before = webhookEventsWritten.load(ordering: .relaxed)
        defer { if webhookEventsWritten.load(ordering: .relaxed) != before { webhookSignal.wake() } }
        return try await write()
    }

    private func event(_ draft: WebhookEventDraft, appId: String, view: UserView?, sequence: Int64, now: Date) -> StoredWebhookEvent {
        let id = ids.nextOrderedString()
        return StoredWebhookEvent(id: id, appId: appId, appUserId: draft.appUserId, type: draft.type, sequence: sequence, occurredAt: now.milliseconds,
                                  body: WebhookEventBody.json(id: id, draft: draft, appId: appId, sequence: sequence, occurredAt: now.milliseconds, view: view))
    }

    /// Forwards an App Store Server Notification to the app's endpoints of format `apple`, in the caller's transaction
    /// (the one that recorded the notification), as Apple's body holds it: `{"signedPayload":…}` with exactly the JWS
    /// that verified. Not the body as it came: one naming `signedPayload` twice is verified on its last, and a backend
    /// reading the first would take an unverified payload under our webhook signature.
    func forwardNotification(signed: String, appId: String, _ db: any SQLConnection, now: Date) throws {
        let targets = try webhooks(db).endpoints(appId: appId).map(\.endpoint).filter { $0.accepts(.appleNotification) }.map(\.id)
        guard !targets.isEmpty else { return }
        var json = JSONBuffer(capacity: signed.utf8.count + 20)  // made only when an endpoint takes it
        json.object { $0.field("signedPayload", signed) }
        let body = String(decoding: json.bytes, as: UTF8.self)
        try insertCounted([(StoredWebhookEvent(id: ids.nextOrderedString(), appId: appId, appUserId: "", type: .appleNotification, sequence: 0,
                                               occurredAt: now.milliseconds, body: body), targets)], db)
    }

    private func store(_ draft: WebhookEventDraft, appId: String, endpoints: [String], view: UserView?, sequence: Int64,
                       _ db: any SQLConnection, now: Date) throws -> String {
        let stored = event(draft, appId: appId, view: view, sequence: sequence, now: now)
        try webhooks(db).insert(event: stored, endpointIds: endpoints)
        return stored.id
    }
}

/// The JSON an endpoint receives.
enum WebhookEventBody {
    static func json(id: String, draft: WebhookEventDraft, appId: String, sequence: Int64, occurredAt: Int64, view: UserView?) -> String {
        var json = JSONBuffer(capacity: 512)
        json.object { json in
            json.field("id", id)
            json.field("type", draft.type.rawValue)
            json.field("app", appId)
            json.field("appUserId", draft.appUserId)
            json.field("environment", draft.environment)
            json.field("occurredAt", occurredAt)
            json.field("sequence", sequence)
            json.field("transactionId", draft.transactionId)
            json.field("originalTransactionId", draft.originalTransactionId)
            json.field("productId", draft.productId)
            if let expires = draft.expiresDate { json.field("expiresDate", expires) }
            if let currency = draft.currency, let change = draft.balanceChange {
                json.key("balance")
                json.object { json in
                    json.field("currency", currency)
                    json.field("change", change)
                    json.field("amount", view?.balances[currency] ?? 0)
                }
            }
            json.field("entitlement", draft.entitlement)
            json.field("reason", draft.reason)
            if let from = draft.fromUsers {
                json.key("fromUsers")
                json.array(from) { json, user in json.string(user) }
            }
            if let view {
                json.key("entitlements")
                json.array(view.entitlements) { json, entitlement in
                    json.object { json in
                        json.field("id", entitlement.id)
                        json.field("active", entitlement.active)
                        if let expires = entitlement.expiresDate { json.field("expiresDate", expires) }
                        json.field("source", entitlement.source)
                        json.field("productId", entitlement.productId)
                    }
                }
                json.key("balances")
                json.object { json in
                    for (currency, amount) in view.balances.sorted(by: { $0.key < $1.key }) { json.field(currency, amount) }
                }
            }
        }
        return String(decoding: json.bytes, as: UTF8.self)
    }
}
