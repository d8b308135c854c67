import AppStoreCrypto
@testable import AppStoreEmulator
import AppStoreModels
import Foundation
@testable import PurchaseServer
import Storage
import StorekeeperTesting
import Testing

@Suite("App Store Server Notifications V2 on the purchase server", .serialized)
struct NotificationTests {
    /// The emulator's notifications of `type` for `bundle` (recorded because the app has a URL; not delivered here).
    static func notifications(_ world: ServerWorld, _ bundle: String, type: String) async throws -> [NotificationRecord] {
        try await world.emulator.notificationHistory(bundleId: bundle, environment: .sandbox, from: .distantPast, to: .distantFuture)
            .filter { $0.notificationType.rawValue == type }
    }

    /// The `signedTransactionInfo` inside a notification.
    static func nestedTransaction(_ signedPayload: String) throws -> String {
        try #require(try JWS(compact: signedPayload).payloadJSON()["data"]?["signedTransactionInfo"]?.text)
    }

    static func post(_ world: ServerWorld, _ signedPayload: String) async throws -> (Int, [String: Any]) {
        try await world.client.json(.post, "/v1/notifications/apple", json: ["signedPayload": signedPayload])
    }

    static func settle(_ world: ServerWorld, _ answer: [String: Any], bundle: String) async throws {
        guard let id = answer["verificationId"] as? String else { return }
        _ = try await world.client.json(.get, "/v1/verifications/\(id)?wait=10", headers: ["Authorization": "Bearer \(world.keys[bundle]!)"])
    }

    static func prepare(_ world: ServerWorld, _ bundles: [String]) async throws {
        for bundle in bundles {
            try await world.emulator.setNotificationURLs(bundleId: bundle, NotificationURLs(sandbox: "http://127.0.0.1:9/unused"))
        }
    }

    @Test("DID_RENEW extends the owner's subscription; a duplicate changes nothing", arguments: Engine.available)
    func renewal(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        try await Self.prepare(world, ["com.example.magazine"])
        let (_, receipt) = try await world.buy("com.example.magazine", "com.example.magazine.monthly")
        _ = try await world.upload("com.example.magazine", user: "reader", receipt: receipt)
        let before = try #require((try await world.user("com.example.magazine", "reader")["entitlements"] as? [[String: Any]])?.first?["expiresDate"] as? Int64)
        try await world.emulator.advanceTime(by: 200)  // past the 3-minute sandbox month: one renewal
        _ = try await world.emulator.accounts()
        let renewals = try await Self.notifications(world, "com.example.magazine", type: "DID_RENEW")
        let renewal = try #require(renewals.first)
        let (status, answer) = try await Self.post(world, renewal.signedPayload)
        #expect(status == 200)
        #expect(answer["outcome"] as? String == "queued")
        try await Self.settle(world, answer, bundle: "com.example.magazine")
        let reader = try await world.user("com.example.magazine", "reader")
        let after = try #require((reader["entitlements"] as? [[String: Any]])?.first?["expiresDate"] as? Int64)
        #expect(after > before)
        #expect(reader.entitlementIds == ["magazine"])
        let (_, again) = try await Self.post(world, renewal.signedPayload)
        #expect(again["outcome"] as? String == "duplicate")
    }

    @Test("REFUND revokes and claws back; a transaction nobody owns is kept unmatched", arguments: Engine.available)
    func refund(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        try await Self.prepare(world, ["com.example.coins"])
        let (coin, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        _ = try await world.upload("com.example.coins", user: "alice", receipt: receipt)
        #expect(try await world.user("com.example.coins", "alice").balances == ["coins": 100])
        _ = try await world.emulator.refund(transactionId: coin.id)
        let refund = try #require(try await Self.notifications(world, "com.example.coins", type: "REFUND").first)
        let (_, answer) = try await Self.post(world, refund.signedPayload)
        try await Self.settle(world, answer, bundle: "com.example.coins")
        #expect(try await world.user("com.example.coins", "alice").balances == ["coins": 0])

        let (stranger, _) = try await world.buy("com.example.coins", "Nada.JPYF01")
        let charge = try #require(try await Self.notifications(world, "com.example.coins", type: "ONE_TIME_CHARGE").first { $0.transactionId == stranger.id })
        let (_, unmatched) = try await Self.post(world, charge.signedPayload)
        #expect(unmatched["outcome"] as? String == "unmatched")
    }

    @Test("A purchase nobody owns goes to the user whose id is its appAccountToken in another case; a token two users' ids share names neither",
          arguments: Engine.available)
    func appAccountTokenNamesItsUser(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        try await Self.prepare(world, ["com.example.coins"])
        let bundle = "com.example.coins"
        // A customer named by an iOS UUID (upper case) exists once something is granted to them.
        let token = UUID()
        let (_, first) = try await world.buy(bundle, "Nada.JPYF01")
        _ = try await world.upload(bundle, user: token.uuidString, receipt: first)
        let balance = try #require(try await world.user(bundle, token.uuidString).balances["coins"])
        // The app buys for them with the token in lower case; the notification arrives before any upload.
        func chargeFor(_ token: String) async throws -> [String: Any] {
            var request = PaymentRequest(productId: "Nada.JPYF02")
            request.appAccountToken = token
            let bought = try await world.emulator.addPayment(bundleId: bundle, deviceId: world.device, request: request)
            let charge = try #require(try await Self.notifications(world, bundle, type: "ONE_TIME_CHARGE").first { $0.transactionId == bought.id })
            let (status, answer) = try await Self.post(world, charge.signedPayload)
            #expect(status == 200)
            try await Self.settle(world, answer, bundle: bundle)
            return answer
        }
        let matched = try await chargeFor(token.uuidString.lowercased())
        #expect(matched["outcome"] as? String != "unmatched", "\(matched)")
        #expect(try await world.user(bundle, token.uuidString).balances["coins"] == balance + 100)
        // A second user whose id is the same UUID in lower case: the token no longer says whose purchase it is.
        let (_, other) = try await world.buy(bundle, "Nada.JPYF01")
        _ = try await world.upload(bundle, user: token.uuidString.lowercased(), receipt: other)
        let ambiguous = try await chargeFor(token.uuidString)
        #expect(ambiguous["outcome"] as? String == "unmatched", "\(ambiguous)")
        #expect(try await world.user(bundle, token.uuidString).balances["coins"] == balance + 100)
        #expect(try await world.user(bundle, token.uuidString.lowercased()).balances["coins"] == balance)
    }

    @Test("A prorated REFUND revokes; the revenue report and the metrics give back only its share", arguments: Engine.available)
    func proratedRefund(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        try await Self.prepare(world, ["com.example.football"])
        let (gloves, receipt) = try await world.buy("com.example.football", "ProtectiveGloves")
        _ = try await world.upload("com.example.football", user: "pat", receipt: receipt)
        _ = try await world.emulator.refund(transactionId: gloves.id, percentage: 40_000)
        let refund = try #require(try await Self.notifications(world, "com.example.football", type: "REFUND").first)
        try await Self.settle(world, try await Self.post(world, refund.signedPayload).1, bundle: "com.example.football")
        let view = try await world.user("com.example.football", "pat")
        #expect((view["entitlements"] as? [[String: Any]] ?? []).isEmpty, "a partial refund revokes the purchase too")
        let report = try await world.server.store.revenue(appId: "com.example.football", from: TestSupport.referenceDate.addingTimeInterval(-86400),
                                                          to: TestSupport.referenceDate.addingTimeInterval(86400 * 2), group: [.currency])
        let row = try #require(report.rows.first)
        #expect(row.gross == "1.99" && row.refunds == 1)
        #expect(row.refunded == "0.80" && row.net == "1.19", "40% of 1.99 is 0.796")
        // The metrics agree, from the rollup and from the ledger: net revenue keeps 60% of the price.
        let from = TestSupport.referenceDate.addingTimeInterval(-86400), to = TestSupport.referenceDate.addingTimeInterval(86400 * 2)
        let rollup = try await world.server.subscriptionMetrics(appId: "com.example.football", ranges: [(from, to, .month)], environment: nil)
        let ledger = try await world.server.subscriptionMetricsFromLedger(appId: "com.example.football", from: from, to: to, interval: .month, environment: nil)
        #expect(rollup.first == ledger)
        #expect(ledger.reduce(Decimal(0)) { $0 + ($1.netRevenue["USD"].flatMap { Decimal(string: $0) } ?? 0) } == Decimal(string: "1.19"), "1.99 − 0.796, to the cent")
    }

    @Test("A transaction first seen already refunded in part keeps its share; newer signed data corrects a share a receipt could not know",
          arguments: Engine.available)
    func refundShareFirstSeenAndCorrected(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let (globe, _) = try await world.buy("com.example.football", "GoldenGlobe")
        _ = try await world.emulator.refund(transactionId: globe.id, percentage: 25_000)
        // Uploaded only after the refund, as a signed transaction: recorded refunded, with its share.
        let (status, _) = try await world.postTransaction("com.example.football", user: "quinn", signed: try await world.emulator.signedTransaction(transactionId: globe.id))
        #expect(status == 200)
        // Uploaded first as a receipt (verifyReceipt knows no share: all of it), then signed data says 50%.
        let (gloves, receipt) = try await world.buy("com.example.football", "ProtectiveGloves")
        _ = try await world.emulator.refund(transactionId: gloves.id, percentage: 50_000)
        _ = try await world.upload("com.example.football", user: "quinn", receipt: try await world.emulator.appReceipt(bundleId: "com.example.football", deviceId: world.device, refresh: true)!.base64EncodedString())
        _ = receipt
        try await world.emulator.advanceTime(by: 1)
        _ = try await world.postTransaction("com.example.football", user: "quinn", signed: try await world.emulator.signedTransaction(transactionId: gloves.id))
        let report = try await world.server.store.revenue(appId: "com.example.football", from: TestSupport.referenceDate.addingTimeInterval(-86400),
                                                          to: TestSupport.referenceDate.addingTimeInterval(86400 * 2), group: [.product])
        let byProduct = Dictionary(uniqueKeysWithValues: report.rows.map { ($0.productId ?? "", $0) })
        #expect(byProduct["GoldenGlobe"]?.refunded == "0.75", "25% of 2.99 is 0.7475")
        #expect(byProduct["ProtectiveGloves"]?.refunded == "1.00", "50% of 1.99, once signed data said so")
    }

    @Test("A signed transaction is booked at what Apple charged; a receipt at the product mapping's price", arguments: Engine.available)
    func chargedPrice(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        // The mapping says 0.99 for every coin pack; the App Store sells Nada.JPYF03 for 4.99.
        let (signedPack, _) = try await world.buy("com.example.coins", "Nada.JPYF03")
        _ = try await world.postTransaction("com.example.coins", user: "rita", signed: try await world.emulator.signedTransaction(transactionId: signedPack.id))
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF03")
        _ = try await world.upload("com.example.coins", user: "rita", receipt: receipt)
        let report = try await world.server.store.revenue(appId: "com.example.coins", from: TestSupport.referenceDate.addingTimeInterval(-86400),
                                                          to: TestSupport.referenceDate.addingTimeInterval(86400 * 2), group: [.currency])
        #expect(report.rows.first?.transactions == 2)
        #expect(report.rows.first?.gross == "5.98", "4.99 charged, as signed, and 0.99 from the mapping for the receipt")
    }

    @Test("REFUND_REVERSED reinstates the entitlement and gives the clawed-back credit back; old receipts and old JWS undo nothing",
          arguments: Engine.available)
    func refundReversed(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        try await Self.prepare(world, ["com.example.coins", "com.example.football"])
        let (coin, coinReceipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        _ = try await world.upload("com.example.coins", user: "alice", receipt: coinReceipt)
        let signedBeforeRefund = try await world.emulator.signedTransaction(transactionId: coin.id)
        _ = try await world.emulator.refund(transactionId: coin.id)
        let refund = try #require(try await Self.notifications(world, "com.example.coins", type: "REFUND").first)
        try await Self.settle(world, try await Self.post(world, refund.signedPayload).1, bundle: "com.example.coins")
        #expect(try await world.user("com.example.coins", "alice").balances == ["coins": 0])

        // History cannot undo the refund: the receipt uploaded again, the transaction signed before it.
        _ = try await world.upload("com.example.coins", user: "alice", receipt: coinReceipt)
        _ = try await world.postTransaction("com.example.coins", user: "alice", signed: signedBeforeRefund)
        #expect(try await world.user("com.example.coins", "alice").balances == ["coins": 0])

        try await world.emulator.advanceTime(by: 1)
        _ = try await world.emulator.reverseRefund(transactionId: coin.id)
        let reversed = try #require(try await Self.notifications(world, "com.example.coins", type: "REFUND_REVERSED").first)
        try await Self.settle(world, try await Self.post(world, reversed.signedPayload).1, bundle: "com.example.coins")
        let alice = try await world.user("com.example.coins", "alice")
        #expect(alice.balances == ["coins": 100])
        #expect((alice["transactions"] as? [[String: Any]])?.first?["cancellationDate"] == nil)
        // The refund again, late (a retry of the older notification under a new delivery): older than the reversal, it changes nothing.
        _ = try await world.postTransaction("com.example.coins", user: "alice",
                                            signed: try Self.nestedTransaction(refund.signedPayload))
        #expect(try await world.user("com.example.coins", "alice").balances == ["coins": 100])

        // A non-consumable: the entitlement comes back.
        let (gloves, glovesReceipt) = try await world.buy("com.example.football", "ProtectiveGloves")
        _ = try await world.upload("com.example.football", user: "bob", receipt: glovesReceipt)
        _ = try await world.emulator.refund(transactionId: gloves.id)
        let glovesRefund = try #require(try await Self.notifications(world, "com.example.football", type: "REFUND").first)
        try await Self.settle(world, try await Self.post(world, glovesRefund.signedPayload).1, bundle: "com.example.football")
        #expect(try await world.user("com.example.football", "bob").entitlementIds == [])
        try await world.emulator.advanceTime(by: 1)
        _ = try await world.emulator.reverseRefund(transactionId: gloves.id)
        let glovesBack = try #require(try await Self.notifications(world, "com.example.football", type: "REFUND_REVERSED").first)
        try await Self.settle(world, try await Self.post(world, glovesBack.signedPayload).1, bundle: "com.example.football")
        #expect(try await world.user("com.example.football", "bob").entitlementIds == ["protective_gloves"])
    }

    @Test("RENEWAL_EXTENDED moves the expiry the user sees to the extended date", arguments: Engine.available)
    func renewalExtended(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        try await Self.prepare(world, ["com.example.magazine"])
        let (bought, receipt) = try await world.buy("com.example.magazine", "com.example.magazine.monthly")
        _ = try await world.upload("com.example.magazine", user: "reader", receipt: receipt)
        // The first month is a free trial, which Apple does not extend: renew once into a paid month.
        try await world.emulator.advanceTime(by: 200)
        _ = try await world.emulator.accounts()
        let renewal = try #require(try await Self.notifications(world, "com.example.magazine", type: "DID_RENEW").first)
        try await Self.settle(world, try await Self.post(world, renewal.signedPayload).1, bundle: "com.example.magazine")
        let before = try #require((try await world.user("com.example.magazine", "reader")["entitlements"] as? [[String: Any]])?.first?["expiresDate"] as? Int64)
        try await world.emulator.advanceTime(by: 1)
        let (_, effective) = try await world.emulator.serverAPIExtend(
            bundleId: "com.example.magazine", environment: .sandbox, originalTransactionId: bought.originalId,
            body: try JSONValue.parse(Data(#"{"extendByDays": 30, "extendReasonCode": 1, "requestIdentifier": "goodwill-1"}"#.utf8)))
        let extended = try #require(try await Self.notifications(world, "com.example.magazine", type: "RENEWAL_EXTENDED").first)
        try await Self.settle(world, try await Self.post(world, extended.signedPayload).1, bundle: "com.example.magazine")
        let reader = try await world.user("com.example.magazine", "reader")
        let after = try #require((reader["entitlements"] as? [[String: Any]])?.first?["expiresDate"] as? Int64)
        #expect(after == effective.milliseconds)
        #expect(after > before)
        #expect((reader["subscriptions"] as? [[String: Any]])?.first?["expiresDate"] as? Int64 == effective.milliseconds)
    }

    @Test("Renewal state follows the newest signedDate, whatever order notifications arrive in", arguments: Engine.available)
    func outOfOrder(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        try await Self.prepare(world, ["com.example.magazine"])
        let (bought, receipt) = try await world.buy("com.example.magazine", "com.example.magazine.monthly")
        _ = try await world.upload("com.example.magazine", user: "reader", receipt: receipt)
        try await world.emulator.advanceTime(by: 2)
        _ = try await world.emulator.setAutoRenew(originalTransactionId: bought.originalId, enabled: false)
        let subscribed = try #require(try await Self.notifications(world, "com.example.magazine", type: "SUBSCRIBED").first)
        let disabled = try #require(try await Self.notifications(world, "com.example.magazine", type: "DID_CHANGE_RENEWAL_STATUS").first)
        _ = try await Self.post(world, disabled.signedPayload)
        _ = try await Self.post(world, subscribed.signedPayload)  // older, arrives late
        let reader = try await world.user("com.example.magazine", "reader")
        let subscription = try #require((reader["subscriptions"] as? [[String: Any]])?.first)
        #expect(subscription["autoRenewStatus"] as? Bool == false)
    }

    @Test("Forged, tampered and malformed notifications are refused with 400; a signed one for a bundle not here is ignored with 200")
    func refusals() async throws {
        let (world, genuine) = try await Self.coinsBoughtByStranger()
        defer { Task { await world.stop() } }
        let payload = try JWS(compact: genuine).payload
        let stranger = try CertificateAuthority.generate(algorithm: .ecP256)
        let forged = try JWS.sign(payload: payload, key: stranger.leafKey, chain: stranger.chain)
        #expect(try await Self.post(world, forged).0 == 400)
        let parts = genuine.split(separator: ".").map(String.init)
        let tampered = parts[0] + "." + Base64URL.encode(Array(String(decoding: payload, as: UTF8.self).replacingOccurrences(of: "ONE_TIME_CHARGE", with: "REFUND").utf8)) + "." + parts[2]
        #expect(try await Self.post(world, tampered).0 == 400)
        // Signed by Apple but for a bundle no app here accepts: not ours to act on, and not a reason for Apple to retry for days.
        let foreign = String(decoding: payload, as: UTF8.self).replacingOccurrences(of: "com.example.coins", with: "com.example.unknown")
        let (foreignStatus, foreignAnswer) = try await Self.post(world, try JWS.sign(payload: Array(foreign.utf8), key: TestSupport.jwsAuthority.leafKey,
                                                                                    chain: TestSupport.jwsAuthority.chain))
        #expect(foreignStatus == 200 && foreignAnswer["outcome"] as? String == "ignored")
        #expect(foreignAnswer["reason"] as? String == "no app here accepts bundle id com.example.unknown")
        let (status, body) = try await world.client.json(.post, "/v1/notifications/apple", json: ["hello": "world"])
        #expect(status == 400)
        #expect((body["error"] as? [String: Any])?["code"] as? String == "invalid_notification")
    }

    @Test("Past the backlog of notifications waiting for their check, a delivery is answered 503 busy and nothing is recorded; once the backlog drains, the same notification is taken")
    func backlogFull() async throws {
        let (world, genuine) = try await Self.coinsBoughtByStranger()
        defer { Task { await world.stop() } }
        let checks = world.server.notificationChecks
        let backlog = PurchaseServer.notificationBacklog
        try #require(backlog == checks.maximumPending && backlog >= 1024, "a burst of a thousand deliveries at once fits")
        // The backlog filled: one check held on its queue, the rest waiting behind it (each filler's own outcome is not the
        // point: one that waited past the bound is refused when its turn comes).
        let gate = DispatchSemaphore(value: 0)
        try await withThrowingTaskGroup(of: Void.self) { group in
            defer { for _ in 0..<backlog { gate.signal() } }
            for _ in 0..<backlog { group.addTask { _ = try? await checks.run { gate.wait() } } }
            try await BoundedWorkTests.holding(checks, backlog)
            let (status, body) = try await Self.post(world, genuine)
            #expect(status == 503)
            #expect((body["error"] as? [String: Any])?["code"] as? String == "busy")
        }
        #expect(checks.waiting == 0)
        let admin = ["Authorization": "Bearer \(ServerWorld.adminKey)"]
        #expect(try await world.client.send(.get, "/admin/v1/notifications", headers: admin).jsonArray().1.isEmpty, "the refused delivery left nothing behind")
        let (status, answer) = try await Self.post(world, genuine)
        // New to the server (not a duplicate of anything the refused delivery left); its purchase has no owner here yet.
        #expect(status == 200 && answer["outcome"] as? String == "unmatched", "\(answer)")
        #expect(try await world.client.send(.get, "/admin/v1/notifications", headers: admin).jsonArray().1.count == 1)
    }

    @Test("A nested transaction signed by someone else or for another bundle is answered 503 (Apple sends it again); the genuine one is queued, and once settled the purchase is still listed once",
          arguments: Engine.available)
    func nestedJudgedAlike(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let (bought, genuine) = try await Self.coinsBoughtByAlice(world)
        let transaction = try Self.nestedTransaction(genuine)
        // The emulator signs as Apple does (the real DID_RENEW fixture shows it): the transaction under the notification's
        // own header, so the envelope's signature covers it.
        #expect(genuine.prefix { $0 != "." } == transaction.prefix { $0 != "." })
        let stranger = try CertificateAuthority.generate(algorithm: .ecP256)
        let forged = try JWS.sign(payload: try JWS(compact: transaction).payload, key: stranger.leafKey, chain: stranger.chain)
        let otherBundle = try JWS.sign(payload: Array(String(decoding: try JWS(compact: transaction).payload, as: UTF8.self)
                                                          .replacingOccurrences(of: "com.example.coins", with: "com.example.comics").utf8),
                                       key: TestSupport.jwsAuthority.leafKey, chain: TestSupport.jwsAuthority.chain)
        // Twice each: the server's verdicts are remembered (chains, headers, transactions); the second round meets them.
        for _ in 0..<2 {
            for nested in [forged, otherBundle] {
                let (status, body) = try await Self.post(world, try Self.oneTimeCharge(carrying: nested))
                #expect(status == 503)
                #expect((body["error"] as? [String: Any])?["code"] as? String == "nested_unverifiable")
            }
            let (status, answer) = try await Self.post(world, try Self.oneTimeCharge(carrying: transaction))
            #expect(status == 200 && answer["outcome"] as? String == "queued")
            try await Self.settle(world, answer, bundle: "com.example.coins")
        }
        let listed = try await world.user("com.example.coins", "alice")["transactions"] as? [[String: Any]] ?? []
        #expect(listed.compactMap { $0["transactionId"] as? String } == [bought.id])
    }

    @Test("A nested transaction under the envelope's own header is covered by its signature: queued and settled with its own signature broken",
          arguments: Engine.available)
    func nestedCovered(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let (bought, genuine) = try await Self.coinsBoughtByAlice(world)
        // Only the holder of the envelope's key could sign an envelope carrying these bytes; that signature is the proof.
        let broken = CarriedJWSTests.brokenSignature(try Self.nestedTransaction(genuine))
        let (status, answer) = try await Self.post(world, try Self.oneTimeCharge(carrying: broken))
        #expect(status == 200 && answer["outcome"] as? String == "queued")
        let id = try #require(answer["verificationId"] as? String)
        let (_, job) = try await world.client.json(.get, "/v1/verifications/\(id)?wait=10",
                                                   headers: ["Authorization": "Bearer \(world.keys["com.example.coins"]!)"])
        #expect(job["state"] as? String == "verified")
        let listed = try await world.user("com.example.coins", "alice")["transactions"] as? [[String: Any]] ?? []
        #expect(listed.compactMap { $0["transactionId"] as? String } == [bought.id])
    }

    /// An SQLite world where coins were bought by someone the server does not know, and the purchase's ONE_TIME_CHARGE
    /// notification.
    static func coinsBoughtByStranger() async throws -> (world: ServerWorld, notification: String) {
        let world = try await ServerWorld.make(.sqlite)
        do {
            try await Self.prepare(world, ["com.example.coins"])
            _ = try await world.buy("com.example.coins", "Nada.JPYF01")
            return (world, try #require(try await Self.notifications(world, "com.example.coins", type: "ONE_TIME_CHARGE").first).signedPayload)
        } catch {
            await world.stop()
            throw error
        }
    }

    /// Alice buys coins and uploads the receipt (verified); the purchase and the emulator's ONE_TIME_CHARGE for it.
    static func coinsBoughtByAlice(_ world: ServerWorld) async throws -> (bought: TransactionRecord, notification: String) {
        try await Self.prepare(world, ["com.example.coins"])
        let (bought, receipt) = try await world.buy("com.example.coins", "Nada.JPYF01")
        #expect(try await world.upload("com.example.coins", user: "alice", receipt: receipt).state == "verified")
        let genuine = try #require(try await Self.notifications(world, "com.example.coins", type: "ONE_TIME_CHARGE").first).signedPayload
        return (bought, genuine)
    }

    /// A sandbox ONE_TIME_CHARGE for com.example.coins signed like Apple's, carrying `nested` as its transaction.
    static func oneTimeCharge(carrying nested: String) throws -> String {
        try Self.signed(["notificationType": "ONE_TIME_CHARGE", "notificationUUID": UUID().uuidString, "version": "2.0",
                         "signedDate": Int64(Date().timeIntervalSince1970 * 1000),
                         "data": ["bundleId": "com.example.coins", "environment": "Sandbox", "signedTransactionInfo": nested]])
    }

    /// A notification signed like Apple's, with `payload` as its decoded body.
    static func signed(_ payload: [String: Any]) throws -> String {
        try JWS.sign(payload: Array(try JSONSerialization.data(withJSONObject: payload, options: [.sortedKeys])),
                     key: TestSupport.jwsAuthority.leafKey, chain: TestSupport.jwsAuthority.chain)
    }

    @Test("A notification's settlement goes to the running worker's free place as it is answered; duplicates, unmatched ones and failed writes give their places back",
          arguments: Engine.available)
    func handedToWorker(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let server = world.server
        try await Self.prepare(world, ["com.example.coins"])
        let (bought, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        #expect(try await world.upload("com.example.coins", user: "alice", receipt: receipt).state == "verified")
        let charge = try #require(try await Self.notifications(world, "com.example.coins", type: "ONE_TIME_CHARGE").first { $0.transactionId == bought.id })
        func job(_ id: String) async throws -> SQLRow? {
            try await server.store.database.read { db in
                try db.query("SELECT state, attempts, open_claims FROM verification_jobs WHERE id = ?", [id]).first
            }
        }
        // Once a claim has found the queue empty, a settlement is written claimed by the worker and holds its place
        // from the answer on: in flight, or already settled, never waiting for a claim.
        try await TestSupport.eventually { server.worker.places.takesUploads }
        let queued = try await server.receiveNotification(Data(#"{"signedPayload":"\#(charge.signedPayload)"}"#.utf8))
        let id = try #require(queued.verificationId)
        #expect(queued.outcome == .queued)
        let inFlight = server.worker.inFlight
        let settledAtOnce = try await job(id)?.string("state") == "verified"
        #expect(inFlight == 1 || settledAtOnce, "the settlement waited for a claim")
        try await TestSupport.eventually { try await job(id)?.string("state") == "verified" && server.worker.inFlight == 0 }
        let settled = try #require(try await job(id))
        #expect(settled.int("attempts") == 1 && settled.int("open_claims") == 0)
        #expect(try await world.user("com.example.coins", "alice").balances == ["coins": 100], "the purchase was granted once")

        // The same notification again, and one whose transaction nobody owns: nothing to settle, no place kept.
        #expect(try await server.receiveNotification(Data(#"{"signedPayload":"\#(charge.signedPayload)"}"#.utf8)).outcome == .duplicate)
        #expect(server.worker.inFlight == 0)
        let (stranger, _) = try await world.buy("com.example.coins", "Nada.JPYF01")
        let strangers = try #require(try await Self.notifications(world, "com.example.coins", type: "ONE_TIME_CHARGE").first { $0.transactionId == stranger.id })
        #expect(try await server.receiveNotification(Data(#"{"signedPayload":"\#(strangers.signedPayload)"}"#.utf8)).outcome == .unmatched)
        #expect(server.worker.inFlight == 0)

        // A write that fails gives its place back, and Apple's retry is settled once the database is whole again.
        let bobs = try Self.oneTimeCharge(carrying: try await world.emulator.signedTransaction(transactionId: bought.id))
        try await server.store.database.transaction { db in try db.run("ALTER TABLE verification_receipts RENAME TO verification_receipts_away", []) }
        await #expect(throws: (any Error).self) { try await server.receiveNotification(Data(#"{"signedPayload":"\#(bobs)"}"#.utf8)) }
        #expect(server.worker.inFlight == 0, "the failed write's place was given back")
        try await server.store.database.transaction { db in try db.run("ALTER TABLE verification_receipts_away RENAME TO verification_receipts", []) }
        let retried = try await server.receiveNotification(Data(#"{"signedPayload":"\#(bobs)"}"#.utf8))
        #expect(retried.outcome == .queued)
        try await TestSupport.eventually { try await job(try #require(retried.verificationId))?.string("state") == "verified" && server.worker.inFlight == 0 }
        #expect(try await world.user("com.example.coins", "alice").balances == ["coins": 100])
    }

    @Test("A notification's transaction waits for a claim stored with its certificate chain named by digest; the claim gets Apple's bytes back and settles it once",
          arguments: Engine.available)
    func queuedTransactionStoredCompact(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let (bought, genuine) = try await Self.coinsBoughtByAlice(world)
        let granted = try await world.user("com.example.coins", "alice").balances
        #expect(!granted.isEmpty)
        // With the worker stopped, the settlement is written pending: its receipt is read back by a claim.
        world.worker.cancel()
        await world.worker.value
        let nested = try Self.nestedTransaction(genuine)
        let queued = try await world.server.receiveNotification(Data(#"{"signedPayload":"\#(genuine)"}"#.utf8))
        let id = try #require(queued.verificationId)
        #expect(queued.outcome == .queued)
        let stored = try #require(try await world.server.store.database.read { db in
            try db.query("SELECT receipt_data FROM verification_receipts WHERE job_id = ?", [id]).first?.string("receipt_data")
        })
        #expect(stored.hasPrefix("~") && stored.utf8.count * 3 < nested.utf8.count, "the chain is named, not stored again")
        #expect(try await world.server.store.receipt(of: id) == nested, "read back as Apple signed it, byte for byte")
        let row = try await world.server.store.database.read { db in
            try db.query("SELECT receipt_size, receipt_sha256 FROM verification_jobs WHERE id = ?", [id]).first
        }
        #expect(row?.int("receipt_size") == Int64(nested.utf8.count), "the job counts the bytes Apple sent")
        // A queued text in that form naming a header this database does not hold (uploads cannot be in it; an earlier
        // version stored uploads as they came): claimed with the others, rejected alone.
        let orphan = try await world.server.store.enqueue(appId: "com.example.coins", appUserId: "mallory", kind: .signedTransaction,
                                                          receiptData: "~" + String(repeating: "ab", count: 32) + ".eyJ9.c2ln",
                                                          now: world.server.clock.now())
        let names = (0..<100).map { #""k\#($0)":"~\#(String(format: "%064x", $0)).x""# }.joined(separator: ",")
        let crowded = try await world.server.store.enqueue(appId: "com.example.coins", appUserId: "mallory", kind: .signedTransaction,
                                                           receiptData: "~" + String(repeating: "cd", count: 32) + ".~{" + names + "}.c2ln",
                                                           now: world.server.clock.now())

        let worker = world.server.runWorker()
        defer { worker.cancel() }
        let (_, job) = try await world.client.json(.get, "/v1/verifications/\(id)?wait=10",
                                                   headers: ["Authorization": "Bearer \(world.keys["com.example.coins"]!)"])
        #expect(job["state"] as? String == "verified")
        // Settled in either order (on PostgreSQL two batches commit at once).
        try await TestSupport.eventually {
            let orphanState = try await world.server.store.job(orphan.id)?.state
            let crowdedState = try await world.server.store.job(crowded.id)?.state
            return orphanState == .rejected && crowdedState == .rejected
        }
        #expect(try await world.server.store.job(orphan.id)?.state == .rejected)
        #expect(try await world.server.store.job(crowded.id)?.state == .rejected, "a text naming a hundred headers is rejected alone")
        let settled = try await world.server.store.database.read { db in
            try db.query("SELECT receipt_sha256 FROM verification_jobs WHERE id = ?", [id]).first?.string("receipt_sha256")
        }
        #expect(settled == Digest.sha256.hash(Array(nested.utf8)).hexString, "the digest of the bytes Apple sent")
        #expect(try await world.user("com.example.coins", "alice").balances == granted, "the purchase was granted once")
        let listed = try await world.user("com.example.coins", "alice")["transactions"] as? [[String: Any]] ?? []
        #expect(listed.compactMap { $0["transactionId"] as? String } == [bought.id])
    }

    @Test("Notifications arriving together, each twice, are recorded once each and queue one settlement each; the purchase is granted once",
          arguments: Engine.available)
    func arrivingTogether(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let (bought, _) = try await world.buy("com.example.coins", "Nada.JPYF02")
        let transaction = try await world.emulator.signedTransaction(transactionId: bought.id)
        _ = try await world.postTransaction("com.example.coins", user: "alice", signed: transaction)
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let uuids = (0..<40).map { _ in UUID().uuidString }
        let bodies = try uuids.map { uuid in
            let signed = try Self.signed(["notificationType": "ONE_TIME_CHARGE", "notificationUUID": uuid, "version": "2.0", "signedDate": now,
                                          "data": ["bundleId": "com.example.coins", "environment": "Sandbox", "signedTransactionInfo": transaction]])
            return Data(#"{"signedPayload":"\#(signed)"}"#.utf8)
        }
        let server = world.server
        let receipts = try await withThrowingTaskGroup(of: NotificationReceipt.self) { group in
            for body in bodies + bodies { group.addTask { try await server.receiveNotification(body) } }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        for uuid in uuids {
            let answers = receipts.filter { $0.notificationUUID == uuid }
            #expect(answers.map(\.outcome.rawValue).sorted() == ["duplicate", "queued"])
        }
        let jobs = receipts.compactMap(\.verificationId)
        #expect(Set(jobs).count == uuids.count)
        for id in jobs { try await Self.settle(world, ["verificationId": id], bundle: "com.example.coins") }
        let (_, list) = try await world.client.send(.get, "/admin/v1/notifications?app=com.example.coins&type=ONE_TIME_CHARGE",
                                                    headers: ["Authorization": "Bearer \(ServerWorld.adminKey)"]).jsonArray()
        #expect(list.count == uuids.count)
        #expect(Set(list.compactMap { $0["verificationId"] as? String }) == Set(jobs))
        #expect(list.allSatisfy { $0["state"] as? String == "queued" })
        #expect(try await world.user("com.example.coins", "alice").balances == ["coins": 100])
    }

    @Test("Every validly signed notification is answered 200: types without a bundle in data, types not known yet, and they stay visible")
    func neverFourHundred() async throws {
        let world = try await ServerWorld.make(.sqlite)
        defer { Task { await world.stop() } }
        try await Self.prepare(world, ["com.example.coins"])
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let external = try Self.signed(["notificationType": "EXTERNAL_PURCHASE_TOKEN", "subtype": "UNREPORTED", "notificationUUID": UUID().uuidString,
                                        "version": "2.0", "signedDate": now,
                                        "externalPurchaseToken": ["externalPurchaseId": "SANDBOX_b0a1", "tokenCreationDate": now, "bundleId": "com.example.coins"]])
        let (status, answer) = try await Self.post(world, external)
        #expect(status == 200 && answer["outcome"] as? String == "recorded")

        let (bought, _) = try await world.buy("com.example.coins", "Nada.JPYF02")
        let transaction = try await world.emulator.signedTransaction(transactionId: bought.id)
        _ = try await world.postTransaction("com.example.coins", user: "alice", signed: transaction)
        let future = try Self.signed(["notificationType": "SOMETHING_APPLE_ADDS_IN_2027", "notificationUUID": UUID().uuidString, "version": "2.0",
                                      "signedDate": now, "data": ["bundleId": "com.example.coins", "environment": "Sandbox",
                                                                  "signedTransactionInfo": transaction]])
        let (futureStatus, futureAnswer) = try await Self.post(world, future)
        #expect(futureStatus == 200 && futureAnswer["outcome"] as? String == "queued")
        let bare = try Self.signed(["notificationType": "METADATA_UPDATE", "notificationUUID": UUID().uuidString, "version": "2.0", "signedDate": now,
                                    "data": ["bundleId": "com.example.coins", "environment": "Xcode"]])
        let (bareStatus, bareAnswer) = try await Self.post(world, bare)
        #expect(bareStatus == 200 && bareAnswer["outcome"] as? String == "ignored")

        let (listed, list) = try await world.client.send(.get, "/admin/v1/notifications?app=com.example.coins",
                                                         headers: ["Authorization": "Bearer \(ServerWorld.adminKey)"]).jsonArray()
        #expect(listed == 200)
        let types = Set(list.compactMap { $0["notificationType"] as? String })
        #expect(types.isSuperset(of: ["EXTERNAL_PURCHASE_TOKEN", "SOMETHING_APPLE_ADDS_IN_2027"]))
        #expect(list.first { $0["notificationType"] as? String == "SOMETHING_APPLE_ADDS_IN_2027" }?["state"] as? String == "queued")
        #expect(try await world.user("com.example.coins", "alice").balances == ["coins": 100])
    }
}
