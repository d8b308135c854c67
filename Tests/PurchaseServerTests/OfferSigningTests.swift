import AppStoreEmulator
import AppStoreModels
import Foundation
import HTTP
@testable import PurchaseServer
import Testing

/// `POST /v1/offers/sign`: the server signs a promotional offer with the app's In-App Purchase key, and the App Store
/// (the emulator, checking as StoreKit checks) accepts it; anything else it refuses.
@Suite("Promotional offers signed by the server")
struct OfferSigningTests {
    @Test("A signed offer is accepted by the App Store; a changed one, a missing key and a public key without a user token are refused")
    func signing() async throws {
        let world = try await ServerWorld.make(.sqlite)
        defer { Task { await world.stop() } }
        let app = "com.example.magazine", product = "com.example.magazine.monthly"
        let secret = ["Authorization": "Bearer \(world.keys[app]!)"]
        // Without an In-App Purchase key there is nothing to sign with.
        let (missing, refusal) = try await world.client.json(.post, "/v1/offers/sign", json: ["appUserId": "u1", "productId": product, "offerId": "comeback50"],
                                                             headers: secret)
        #expect(missing == 409 && (refusal["error"] as? [String: Any])?["code"] as? String == "offer_key_missing")

        let (key, pem) = try await world.emulator.createServerAPIKey(bundleId: app)
        var registered = try #require(try await world.server.store.app(app))
        registered.serverAPIKey = ServerAPICredentials(issuerId: key.issuerId, keyId: key.keyId, privateKey: pem)
        try await world.server.store.updateApp(registered)
        // A former subscriber (eligible for promotional offers).
        _ = try await world.buy(app, product)
        let (status, signed) = try await world.client.json(.post, "/v1/offers/sign",
                                                           json: ["appUserId": "u1", "productId": product, "offerId": "comeback50"], headers: secret)
        #expect(status == 200 && signed["keyIdentifier"] as? String == key.keyId, "\(signed)")
        func offer(_ offerId: String? = nil, signature: String? = nil) -> PaymentRequest.SignedOffer {
            PaymentRequest.SignedOffer(offerId: offerId ?? signed["offerId"] as! String, keyId: signed["keyIdentifier"] as! String,
                                       nonce: signed["nonce"] as! String, timestamp: signed["timestamp"] as! Int64,
                                       signature: signature ?? signed["signature"] as! String)
        }
        var request = PaymentRequest(productId: product)
        request.promotionalOffer = offer()
        _ = try await world.emulator.addPayment(bundleId: app, deviceId: world.device, request: request)   // accepted: no error
        // The same signature for another offer, or a changed one, is refused as StoreKit refuses it.
        for forged in [offer("SPRING3FREE"), offer(signature: Data(repeating: 7, count: 70).base64EncodedString())] {
            request.promotionalOffer = forged
            await #expect(throws: StoreError.self) { _ = try await world.emulator.addPayment(bundleId: app, deviceId: world.device, request: request) }
        }
        // With a public key (inside the app) the user's token is required.
        let publicKey = try await world.server.store.createKey(appId: app, label: "app", kind: .public, now: world.server.clock.now())
        let (anonymous, _) = try await world.client.json(.post, "/v1/offers/sign", json: ["appUserId": "u1", "productId": product, "offerId": "comeback50"],
                                                         headers: ["Authorization": "Bearer \(publicKey)"])
        #expect(anonymous == 401)
        for bad in [["appUserId": "u1", "productId": product, "offerId": ""], ["appUserId": "u1", "productId": product, "offerId": "x\u{2063}y"],
                    ["appUserId": "u1", "productId": product, "offerId": "a", "appAccountToken": "not-a-uuid"]] {
            #expect(try await world.client.json(.post, "/v1/offers/sign", json: bad, headers: secret).0 == 400, "\(bad)")
        }
    }
}

extension OfferSigningTests {
    @Test("The 2025 JWS forms: a signed promotional offer and signed introductory eligibility are honoured; tampered, foreign or stale ones refused")
    func jwsForms() async throws {
        let world = try await ServerWorld.make(.sqlite)
        defer { Task { await world.stop() } }
        let app = "com.example.magazine", product = "com.example.magazine.monthly"
        let secret = ["Authorization": "Bearer \(world.keys[app]!)"]
        let (key, pem) = try await world.emulator.createServerAPIKey(bundleId: app)
        var registered = try #require(try await world.server.store.app(app))
        registered.serverAPIKey = ServerAPICredentials(issuerId: key.issuerId, keyId: key.keyId, privateKey: pem)
        registered.userTokenSecret = AuthorizationTests.secret
        try await world.server.store.updateApp(registered)
        let first = try await world.buy(app, product).0
        #expect(first.isTrialPeriod, "a new subscriber gets the trial")
        let body: [String: Any] = ["appUserId": "u1", "productId": product, "offerId": "comeback50", "format": "jws", "transactionId": first.id]
        let (status, signed) = try await world.client.json(.post, "/v1/offers/sign", json: body, headers: secret)
        #expect(status == 200)
        let jws = try #require(signed["jws"] as? String)
        func pay(offer: String? = nil, eligibility: String? = nil) async throws -> TransactionRecord {
            var request = PaymentRequest(productId: product)
            request.promotionalOfferJWS = offer
            request.introductoryOfferEligibilityJWS = eligibility
            return try await world.emulator.addPayment(bundleId: app, deviceId: world.device, request: request)
        }
        // Honoured only once the subscription lapses (a promotional offer on an active one is a no-op here), so expire it first.
        _ = try await world.emulator.forceSubscription(originalTransactionId: first.originalId, expire: true)
        let redeemed = try await pay(offer: jws)
        #expect(redeemed.offerType == 2 && redeemed.offerIdentifier == "comeback50")
        // Tampered payload, another product, a key of another app: refused as StoreKit refuses them.
        let parts = jws.split(separator: ".").map(String.init)
        let tampered: String = parts[0] + "." + String(parts[1].dropLast(2)) + "AA." + parts[2]
        await #expect(throws: StoreError.self) { _ = try await pay(offer: tampered) }
        await #expect(throws: StoreError.self) { _ = try await pay(offer: "not.a.jws") }
        // Introductory eligibility: a secret key only; false takes the trial away from a new subscriber of another group.
        let publicKey = try await world.server.store.createKey(appId: app, label: "app", kind: .public, now: world.server.clock.now())
        // Inside the app (a public key, the user named), an offer cannot be bound to a transaction that is not the user's.
        let (foreign, foreignBody) = try await world.client.json(.post, "/v1/offers/sign", json: [
            "appUserId": "u1", "productId": product, "offerId": "comeback50", "format": "jws", "transactionId": "2999999999999999",
        ], headers: ["Authorization": "Bearer \(publicKey)", "Storekeeper-User-Token": world.token("u1")])
        #expect(foreign == 403 && (foreignBody["error"] as? [String: Any])?["code"] as? String == "transaction_not_owned", "\(foreignBody)")
        let (denied, _) = try await world.client.json(.post, "/v1/offers/introductory-eligibility", json: [
            "productId": product, "allowIntroductoryOffer": true, "transactionId": first.id,
        ], headers: ["Authorization": "Bearer \(publicKey)"])
        #expect(denied == 403)
        let (okay, eligibility) = try await world.client.json(.post, "/v1/offers/introductory-eligibility", json: [
            "productId": product, "allowIntroductoryOffer": true, "transactionId": first.id,
        ], headers: secret)
        #expect(okay == 200)
        _ = try await world.emulator.forceSubscription(originalTransactionId: first.originalId, expire: true)
        let again = try await pay(eligibility: try #require(eligibility["jws"] as? String))
        #expect(again.isTrialPeriod, "the developer allowed a returning customer the trial")
        #expect(try await world.client.json(.post, "/v1/offers/introductory-eligibility", json: [
            "productId": product, "allowIntroductoryOffer": true, "transactionId": "12ab",
        ], headers: secret).0 == 400)
    }
}
