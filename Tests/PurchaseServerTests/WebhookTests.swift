@testable import AppStoreEmulator
import AppStoreCrypto
import AppStoreModels
import Foundation
import HTTP
import HTTPServer
import Locking
@testable import PurchaseServer
import StorekeeperTesting
import Testing

/// A developer's endpoint: records every delivery, and answers 500 to the first `failures` of them.
final class WebhookReceiver: Sendable {
    struct Delivery: Sendable {
        let signature: String
        let body: Data
        var json: [String: Any] { (try? JSONSerialization.jsonObject(with: body)) as? [String: Any] ?? [:] }
    }

    final class State: Sendable {
        let remainingFailures: Locked<Int>
        let deliveries = Locked<[Delivery]>([])
        init(failures: Int) { remainingFailures = Locked(failures) }
    }

    let state: State
    let server: HTTPServer
    let url: String
    var deliveries: [Delivery] { state.deliveries.withLock { $0 } }

    init(failures: Int = 0) throws {
        let state = State(failures: failures)
        var router = Router()
        router.on(.post, "/hook") { request in
            let fail = state.remainingFailures.withLock { count -> Bool in
                defer { count = max(0, count - 1) }
                return count > 0
            }
            if fail { return Response(status: .internalServerError, headers: [:], body: Data("down for maintenance".utf8)) }
            state.deliveries.withLock { $0.append(Delivery(signature: request.header(WebhookSignature.header) ?? "", body: request.body)) }
            return .json(["ok": true])
        }
        server = HTTPServer(configuration: .init(port: 0, accessLog: false), responder: router)
        url = "http://127.0.0.1:\(try server.start())/hook"
        self.state = state
    }

    /// Deliveries de-duplicated on the event id, as a receiver must: id → body.
    var events: [String: [String: Any]] {
        var unique: [String: [String: Any]] = [:]
        for delivery in deliveries {
            let json = delivery.json
            if let id = json["id"] as? String { unique[id] = json }
        }
        return unique
    }

    /// Waits until `count` distinct events have arrived (or the tests' deadline passes).
    func wait(for count: Int) async throws {
        try await TestSupport.eventually { events.count >= count }
    }
}

@Suite("Webhooks", .serialized)
struct WebhookTests {
    static let admin = ["Authorization": "Bearer \(ServerWorld.adminKey)"]

    static func addEndpoint(_ world: ServerWorld, _ app: String, url: String, types: [String]? = nil) async throws -> (id: String, secret: String) {
        var body: [String: Any] = ["url": url]
        if let types { body["eventTypes"] = types }
        let (status, answer) = try await world.client.json(.post, "/admin/v1/apps/\(app)/webhooks", json: body, headers: admin)
        #expect(status == 201, "\(answer)")
        return (try #require(answer["id"] as? String), try #require(answer["secret"] as? String))
    }

    @Test("Every change of what a user owns reaches the endpoint once by id, signed, in sequence, through an outage", arguments: Engine.available)
    func deliveredThroughOutage(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let receiver = try WebhookReceiver(failures: 3)
        defer { Task { await receiver.server.shutdown(grace: .zero) } }
        let coins = try await Self.addEndpoint(world, "com.example.coins", url: receiver.url)
        let magazine = try await Self.addEndpoint(world, "com.example.magazine", url: receiver.url)

        let (bought, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        _ = try await world.upload("com.example.coins", user: "alice", receipt: receipt)
        _ = try await world.upload("com.example.coins", user: "alice", receipt: receipt)  // the same receipt again: no new event
        let (status, _) = try await world.client.json(.post, "/v1/users/alice/balances/coins/spend", json: ["amount": 30],
                                                      headers: ["Authorization": "Bearer \(world.keys["com.example.coins"]!)", "Idempotency-Key": "spend-1"])
        #expect(status == 200)
        let (subscription, magazineReceipt) = try await world.buy("com.example.magazine", "com.example.magazine.monthly")
        _ = try await world.upload("com.example.magazine", user: "alice", receipt: magazineReceipt)
        _ = try await world.emulator.refund(transactionId: bought.id)
        let refunded = try await world.emulator.appReceipt(bundleId: "com.example.coins", deviceId: world.device, refresh: true)!.base64EncodedString()
        _ = try await world.upload("com.example.coins", user: "alice", receipt: refunded)

        try await receiver.wait(for: 6)
        let events = receiver.events.values.sorted { ($0["app"] as? String ?? "", $0["sequence"] as? Int ?? 0) < ($1["app"] as? String ?? "", $1["sequence"] as? Int ?? 0) }
        let summary = events.map { "\($0["app"]!) \($0["type"]!)" }
        #expect(summary == [
            "com.example.coins CONSUMABLE_PURCHASE", "com.example.coins BALANCE_CHANGED", "com.example.coins BALANCE_CHANGED",
            "com.example.coins REFUND", "com.example.coins BALANCE_CHANGED", "com.example.magazine INITIAL_PURCHASE",
        ])
        // Sequences number each user's events 1, 2, … per app; balances are as they stand after each change.
        #expect(events.filter { $0["app"] as? String == "com.example.coins" }.map { $0["sequence"] as? Int } == [1, 2, 3, 4, 5])
        let changes = events.compactMap { $0["balance"] as? [String: Any] }.map { ($0["change"] as? Int ?? 0, $0["amount"] as? Int ?? 0) }
        #expect(changes.map(\.0) == [100, -30, -100] && changes.map(\.1) == [100, 70, -30])
        let initial = try #require(events.last)
        #expect(initial["transactionId"] as? String == subscription.id && initial["appUserId"] as? String == "alice")
        #expect((initial["entitlements"] as? [[String: Any]])?.first?["id"] as? String == "magazine")

        // Every delivery verifies with its endpoint's secret, and with no other.
        let now = Int64(Date().timeIntervalSince1970)
        for delivery in receiver.deliveries {
            let secret = delivery.json["app"] as? String == "com.example.coins" ? coins.secret : magazine.secret
            #expect(WebhookSignature.verify(header: delivery.signature, body: Array(delivery.body), secret: secret, now: now))
            #expect(!WebhookSignature.verify(header: delivery.signature, body: Array(delivery.body), secret: secret + "x", now: now))
        }
        // The outage is in the delivery log: three 500s, then every delivery succeeded.
        // The receiver has every event; the server records each outcome just after its answer.
        var log: [WebhookDelivery] = []
        try await TestSupport.eventually {
            log = try await world.server.store.webhookDeliveries(appId: "com.example.coins", id: coins.id, state: nil, limit: 100)
                + (try await world.server.store.webhookDeliveries(appId: "com.example.magazine", id: magazine.id, state: nil, limit: 100))
            return log.allSatisfy { $0.state == "delivered" }
        }
        #expect(log.count == 6 && log.allSatisfy { $0.state == "delivered" })
        #expect(log.flatMap(\.log).filter { $0.status == 500 }.count == 3)
        #expect(log.flatMap(\.log).filter { $0.outcome == "http_status" }.allSatisfy { $0.responseExcerpt == "down for maintenance" })
    }

    @Test("The deliverer is woken by the settlements and notifications that wrote events, not by those of an app without an endpoint",
          arguments: Engine.available)
    func wokenForEventsOnly(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine, startWorker: false)
        defer { Task { await world.stop() } }
        // Verification only: no deliverer runs to take the wake-ups, so each one stays pending.
        let worker = Task { await world.server.worker.run() }
        defer { worker.cancel() }
        let signal = world.server.store.webhookSignal
        // Waited for up to the tests' deadline when expected (a loaded machine), 1 s when not.
        func woken(expected: Bool = true) async throws -> Bool {
            expected ? try await TestSupport.eventually { signal.isPending }
                     : try await TestSupport.eventually(within: .seconds(1)) { signal.isPending }
        }
        try await NotificationTests.prepare(world, ["com.example.coins"])

        let (first, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        _ = try await world.upload("com.example.coins", user: "alice", receipt: receipt)
        _ = try await world.emulator.refund(transactionId: first.id)
        let refund = try #require(try await NotificationTests.notifications(world, "com.example.coins", type: "REFUND").first)
        let (_, answer) = try await NotificationTests.post(world, refund.signedPayload)
        try await NotificationTests.settle(world, answer, bundle: "com.example.coins")
        #expect(try await world.user("com.example.coins", "alice").balances == ["coins": 0])
        #expect(try await !woken(expected: false), "nothing was written for an app without an endpoint")

        let receiver = try WebhookReceiver()
        defer { Task { await receiver.server.shutdown(grace: .zero) } }
        _ = try await Self.addEndpoint(world, "com.example.coins", url: receiver.url)
        let (_, second) = try await world.buy("com.example.coins", "Nada.JPYF01")
        _ = try await world.upload("com.example.coins", user: "alice", receipt: second)
        #expect(try await woken(), "the settlement wrote a purchase's events")
        await signal.wait(timeout: .milliseconds(10))
        // Spending (as the customer tools' grants and adjustments) records events in its own transaction.
        let (spent, _) = try await world.client.json(.post, "/v1/users/alice/balances/coins/spend", json: ["amount": 10],
                                                     headers: ["Authorization": "Bearer \(world.keys["com.example.coins"]!)", "Idempotency-Key": "spend-1"])
        #expect(spent == 200)
        #expect(try await woken(), "spending wrote a balance event")
        await signal.wait(timeout: .milliseconds(10))

        // Apple's notification, forwarded to an endpoint of format apple.
        let (status, _) = try await world.client.json(.post, "/admin/v1/apps/com.example.coins/webhooks",
                                                      json: ["url": receiver.url, "format": "apple"], headers: Self.admin)
        #expect(status == 201)
        // A refund of a purchase nobody uploaded: kept unmatched, no event of ours, only the forwarded copy.
        let (stranger, _) = try await world.buy("com.example.coins", "Nada.JPYF01")
        _ = try await world.emulator.refund(transactionId: stranger.id)
        let refunds = try await NotificationTests.notifications(world, "com.example.coins", type: "REFUND")
        let strangerRefund = try #require(try refunds.first {
            try JWS(compact: NotificationTests.nestedTransaction($0.signedPayload)).payloadJSON()["transactionId"]?.text == stranger.id
        })
        let (_, unmatched) = try await NotificationTests.post(world, strangerRefund.signedPayload)
        #expect(unmatched["outcome"] as? String == "unmatched")
        #expect(try await woken(), "the notification was forwarded")
    }

    @Test("An endpoint gets only the types it asked for; a test event and a redelivery go to it on request")
    func filteredTestAndRedeliver() async throws {
        let world = try await ServerWorld.make(.sqlite)
        defer { Task { await world.stop() } }
        let receiver = try WebhookReceiver()
        defer { Task { await receiver.server.shutdown(grace: .zero) } }
        let endpoint = try await Self.addEndpoint(world, "com.example.coins", url: receiver.url, types: ["BALANCE_CHANGED"])
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        _ = try await world.upload("com.example.coins", user: "bob", receipt: receipt)
        let (status, test) = try await world.client.json(.post, "/admin/v1/apps/com.example.coins/webhooks/\(endpoint.id)/test", headers: Self.admin)
        #expect(status == 202)
        try await receiver.wait(for: 2)
        #expect(Set(receiver.events.values.compactMap { $0["type"] as? String }) == ["BALANCE_CHANGED", "TEST"])
        let testId = try #require(test["eventId"] as? String)
        let (redelivered, _) = try await world.client.json(.post, "/admin/v1/apps/com.example.coins/webhooks/\(endpoint.id)/deliveries/\(testId)/redeliver",
                                                           headers: Self.admin)
        #expect(redelivered == 202)
        try await TestSupport.eventually { receiver.deliveries.count >= 3 }
        #expect(receiver.deliveries.count == 3 && receiver.events.count == 2)  // the same id twice: de-duplicated
        // The running total of deliveries made equals a count of them after the redelivery, and after the customer is erased.
        func delivered() async throws -> (total: Int64?, read: Int64?) {
            let read = try await world.server.store.database.transaction { db in
                try db.query("SELECT COUNT(*) AS n FROM webhook_deliveries WHERE state = 'delivered'", []).first?.int("n")
            }
            return (try await world.server.store.webhookDeliveryCounts()["delivered"], read)
        }
        try await TestSupport.eventually { try await delivered().read == 2 }
        let afterRedelivery = try await delivered()
        #expect(afterRedelivery.total == 2 && afterRedelivery.read == 2)
        let (erased, _) = try await world.client.json(.delete, "/admin/v1/apps/com.example.coins/users/bob", headers: Self.admin)
        #expect(erased == 200)
        let afterErasure = try await delivered()
        #expect(afterErasure.total == 1 && afterErasure.read == 1)

        for url in ["ftp://example.com/x", "http://user:secret@example.com/hook", "/relative", String(repeating: "a", count: 3000)] {
            let (bad, answer) = try await world.client.json(.post, "/admin/v1/apps/com.example.coins/webhooks", json: ["url": url], headers: Self.admin)
            #expect(bad == 400 && (answer["error"] as? [String: Any])?["code"] as? String == "invalid_webhook_url", "\(url.prefix(40))")
        }
        let (unknown, _) = try await world.client.json(.post, "/admin/v1/apps/com.example.coins/webhooks",
                                                       json: ["url": receiver.url, "eventTypes": ["NOPE"]], headers: Self.admin)
        #expect(unknown == 400)
        let (gone, _) = try await world.client.json(.delete, "/admin/v1/apps/com.example.coins/webhooks/\(endpoint.id)", headers: Self.admin)
        #expect(gone == 200)
        #expect(try await world.server.store.webhooks(appId: "com.example.coins").isEmpty)
    }

    @Test("An endpoint of format apple gets Apple's notifications as Apple's body holds them, once, with only the JWS that verified; event endpoints do not",
          arguments: Engine.available)
    func forwardsAppleNotifications(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let forward = try WebhookReceiver()
        let events = try WebhookReceiver()
        defer { Task { await forward.server.shutdown(grace: .zero); await events.server.shutdown(grace: .zero) } }
        let (status, _) = try await world.client.json(.post, "/admin/v1/apps/com.example.magazine/webhooks",
                                                      json: ["url": forward.url, "format": "apple"], headers: Self.admin)
        #expect(status == 201)
        _ = try await Self.addEndpoint(world, "com.example.magazine", url: events.url)
        try await world.emulator.setNotificationURLs(bundleId: "com.example.magazine", NotificationURLs(sandbox: "http://127.0.0.1:9/unused"))
        let (_, receipt) = try await world.buy("com.example.magazine", "com.example.magazine.monthly")
        _ = try await world.upload("com.example.magazine", user: "frank", receipt: receipt)
        let record = try #require(try await NotificationTests.notifications(world, "com.example.magazine", type: "SUBSCRIBED").first)
        // The key twice: the last is the one verified; a backend reading the first must not be handed a payload nobody checked.
        let smuggled = Data(#"{"signedPayload": "eyJmb3JnZWQiOnRydWV9.e30.AA", "signedPayload": "\#(record.signedPayload)", "extra": 1}"#.utf8)
        let plain = Data(#"{"signedPayload":"\#(record.signedPayload)"}"#.utf8)
        for body in [smuggled, plain] {
            let answer = try await world.client.send(.post, "/v1/notifications/apple", body: body)
            #expect(answer.status == .ok)
        }
        try await TestSupport.eventually { !forward.deliveries.isEmpty }
        try await Task.sleep(for: .milliseconds(300))
        #expect(forward.deliveries.map(\.body) == [plain])
        try await events.wait(for: 1)
        #expect(events.events.values.allSatisfy { $0["type"] as? String != "APPLE_NOTIFICATION" })
        #expect(events.deliveries.allSatisfy { $0.body != plain })
    }

    @Test("Signatures: the documented recipe, a rotation's two secrets, a stale timestamp refused")
    func signatures() {
        let body = Array(#"{"id":"e1"}"#.utf8)
        let header = WebhookSignature.header(body: body, timestamp: 1_800_000_000, secrets: ["new-secret-0123456789", "old-secret-0123456789"])
        #expect(header.hasPrefix("t=1800000000,v1="))
        #expect(header.split(separator: ",").count == 3)
        for secret in ["new-secret-0123456789", "old-secret-0123456789"] {
            #expect(WebhookSignature.verify(header: header, body: body, secret: secret, now: 1_800_000_100))
        }
        #expect(!WebhookSignature.verify(header: header, body: body, secret: "other-secret-0123456", now: 1_800_000_100))
        #expect(!WebhookSignature.verify(header: header, body: body + [0x20], secret: "new-secret-0123456789", now: 1_800_000_100))
        #expect(!WebhookSignature.verify(header: header, body: body, secret: "new-secret-0123456789", now: 1_800_000_301))
        // Timestamps at the ends of Int64 are refused, not an overflow.
        for extreme in ["t=-9223372036854775808,v1=00", "t=9223372036854775807,v1=00"] {
            #expect(!WebhookSignature.verify(header: extreme, body: body, secret: "k", now: 1_800_000_000))
            #expect(!WebhookSignature.verify(header: extreme, body: body, secret: "k", now: .min))
        }
        // The recipe by hand: HMAC-SHA256 over "t.BODY", hex.
        #expect(WebhookSignature.signature(body: body, timestamp: 1, secret: "k") == HMAC.sha256(key: Array("k".utf8), message: Array("1.".utf8) + body).hexString)
    }

    @Test("Retries back off exponentially with jitter, capped, and give up after the maximum age")
    func retryPolicy() {
        let policy = WebhookRetryPolicy(baseDelay: 5, maxDelay: 3600, maximumAge: 72 * 3600)
        #expect(policy.nextAttempt(after: 1, now: 0, createdAt: 0, jitter: 1) == 5_000)
        #expect(policy.nextAttempt(after: 3, now: 0, createdAt: 0, jitter: 1) == 20_000)
        #expect(policy.nextAttempt(after: 3, now: 0, createdAt: 0, jitter: 0) == 10_000)
        #expect(policy.nextAttempt(after: 30, now: 0, createdAt: 0, jitter: 1) == 3_600_000)
        #expect(policy.nextAttempt(after: 1_000_000, now: 0, createdAt: 0, jitter: 1) == 3_600_000)  // no overflow
        #expect(policy.nextAttempt(after: 40, now: 72 * 3_600_000 - 1000, createdAt: 0, jitter: 1) == nil)
    }
}

@Suite("Webhook events as rules")
struct WebhookEventsTests {
    static let coins = ProductMapping(productId: "coins100", type: .consumable, currency: "coins", amount: 100)
    static let monthly = ProductMapping(productId: "monthly", type: .autoRenewable, entitlement: "pro")

    static func transaction(_ id: String, original: String? = nil, product: String, expires: Int64? = nil, cancelled: Bool = false) -> ConfirmedTransaction {
        ConfirmedTransaction(transactionId: id, originalTransactionId: original ?? id, productId: product, purchaseDate: Date(timeIntervalSince1970: 1000),
                             expiresDate: expires.map { Date(timeIntervalSince1970: Double($0) / 1000) },
                             cancellationDate: cancelled ? Date(timeIntervalSince1970: 2000) : nil, source: "signed_transaction")
    }

    static func entry(_ id: String, user: String, expires: Int64? = nil) -> LedgerEntry {
        LedgerEntry(transactionId: id, appId: "a", appUserId: user, productId: "monthly", expiresDate: expires)
    }

    @Test("One event per action that changes what a user owns")
    func table() {
        let rows: [([SettlementPlan.Action], [String: LedgerEntry], [String])] = [
            ([.record(Self.transaction("1", product: "coins100"), mapping: Self.coins, stateDate: 0), .bind(originalTransactionId: "1", productId: "coins100"),
              .credit(transactionId: "1", currency: "coins", amount: 100)], [:], ["CONSUMABLE_PURCHASE u", "BALANCE_CHANGED u"]),
            ([.record(Self.transaction("2", product: "monthly", expires: 5000), mapping: Self.monthly, stateDate: 0)], [:], ["INITIAL_PURCHASE u"]),
            ([.record(Self.transaction("3", original: "2", product: "monthly", expires: 9000), mapping: Self.monthly, stateDate: 0)], [:], ["RENEWAL u"]),
            ([.record(Self.transaction("4", product: "monthly", cancelled: true), mapping: Self.monthly, stateDate: 0)], [:], []),
            ([.cancel(transactionId: "2", date: 2000, reason: nil, stateDate: 2000)], ["2": Self.entry("2", user: "owner")], ["REFUND owner"]),
            ([.reinstate(transactionId: "2", stateDate: 3000)], ["2": Self.entry("2", user: "owner")], ["REFUND_REVERSED owner"]),
            ([.clawBack(transactionId: "1", user: "owner", currency: "coins", amount: 100)], [:], ["BALANCE_CHANGED owner"]),
            ([.updateExpiry(transactionId: "2", expiresDate: 9000, stateDate: 1)], ["2": Self.entry("2", user: "owner", expires: 5000)], ["SUBSCRIPTION_EXTENDED owner"]),
            ([.updateExpiry(transactionId: "2", expiresDate: 4000, stateDate: 1)], ["2": Self.entry("2", user: "owner", expires: 5000)], []),
            ([.unbindAll(originalTransactionId: "2"), .bind(originalTransactionId: "2", productId: "monthly"),
              .audit(kind: "ownership_transferred", user: "u", detail: ["originalTransactionId": "2", "from": "old"])], [:], ["TRANSFER u"]),
            ([.observe(transactionId: "2", stateDate: 5), .audit(kind: "replay_refused", user: "u", detail: [:])], [:], []),
        ]
        for (actions, ledger, expected) in rows {
            let events = WebhookEvents.of(actions, user: "u", environment: "Sandbox", ledger: ledger)
            #expect(events.map { "\($0.type.rawValue) \($0.appUserId)" } == expected, "\(actions)")
        }
        let transfer = WebhookEvents.of([.unbindAll(originalTransactionId: "2"), .bind(originalTransactionId: "2", productId: "monthly"),
                                         .audit(kind: "ownership_transferred", user: "u", detail: ["originalTransactionId": "2", "from": "a,b"])],
                                        user: "u", environment: "Sandbox", ledger: [:])
        #expect(transfer.first?.fromUsers == ["a", "b"])
    }

    @Test("Renewal-state notifications", arguments: [
        ("DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_DISABLED", ["CANCELLATION"]),
        ("DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_ENABLED", ["UNCANCELLATION"]),
        ("DID_FAIL_TO_RENEW", "GRACE_PERIOD", ["BILLING_ISSUE", "GRACE_PERIOD_STARTED"]),
        ("DID_FAIL_TO_RENEW", nil, ["BILLING_ISSUE"]),
        ("EXPIRED", "VOLUNTARY", ["EXPIRATION"]),
        ("GRACE_PERIOD_EXPIRED", nil, ["EXPIRATION"]),
        ("DID_CHANGE_RENEWAL_PREF", "UPGRADE", ["PRODUCT_CHANGE"]),
        ("DID_RENEW", nil, []),
        ("REFUND", nil, []),
    ] as [(String, String?, [String])])
    func notifications(type: String, subtype: String?, expected: [String]) {
        let events = WebhookEvents.of(notification: NotificationType(type), subtype: subtype.map(NotificationSubtype.init), owner: "o",
                                      environment: "Sandbox", transaction: nil)
        #expect(events.map(\.type.rawValue) == expected)
    }
}
