import AppStoreCrypto
@testable import AppStoreEmulator
import AppStoreModels
import Foundation
import StorekeeperTesting
import Testing

/// Win-back offers: who may redeem them, how they show in renewal info, and the two ways to redeem.
@Suite("Win-back offers")
struct WinBackOfferTests {
    static let app = "com.example.winback"

    static func world() async throws -> World {
        let world = try await World.make()
        // plus.monthly: $4.99 a month, win-back offer come_back ($0.99 up front for three months).
        try await world.emulator.register(storeKit: StoreKitConfiguration(data: StoreKitSettingsTests.file(settings: "")), bundleId: app)
        return world
    }

    func renewalInfo(_ world: World, _ original: String) async throws -> JSONValue {
        let chain = try #require(try await world.emulator.read { state, _ in state.chains[original] })
        let latest = try await world.emulator.transaction(chain.latestTransactionId)
        return try JWS(compact: try world.emulator.signedRenewalInfo(chain, latest: latest, signedAt: Date())).payloadJSON()
    }

    func payment(_ world: World, offer: String?) async throws -> (Int, [String: Any]) {
        var body: [String: Any] = ["app": Self.app, "device": world.device, "productId": "plus.monthly"]
        if let offer { body["winBackOfferId"] = offer }
        return try await world.client.json(.post, "/device/v1/payments", json: body)
    }

    @Test("Only a lapsed paying subscriber is eligible; the offer shows in renewal info, redeems as offerType 4, once")
    func eligibilityAndRedemption() async throws {
        let world = try await Self.world()
        // Never subscribed: not eligible.
        let (never, neverBody) = try await payment(world, offer: "come_back")
        #expect(never == 403 && (neverBody["error"] as? [String: Any])?["skError"] as? String == "ineligibleForOffer")
        let bought = try await world.buy(Self.app, "plus.monthly")
        #expect(try await renewalInfo(world, bought.originalId)["eligibleWinBackOfferIds"] == nil, "active subscribers are not offered a win-back")
        // Still active: not eligible either.
        #expect(try await payment(world, offer: "come_back").0 == 403)
        _ = try await world.emulator.setAutoRenew(originalTransactionId: bought.originalId, enabled: false)
        _ = try await world.emulator.advanceTime(by: 6 * 60)  // the tester's month is five minutes
        let lapsed = try await renewalInfo(world, bought.originalId)
        #expect(lapsed["eligibleWinBackOfferIds"]?.array?.compactMap(\.text) == ["come_back"])
        // An unknown offer id is StoreKit's invalidOfferIdentifier; the real one redeems.
        #expect(try await payment(world, offer: "no_such_offer").0 == 400)
        let (status, redeemed) = try await payment(world, offer: "come_back")
        #expect(status == 201 && redeemed["transactionState"] as? String == "purchased")
        let signed = try JWS(compact: try #require(redeemed["signedTransaction"] as? String)).payloadJSON()
        #expect(signed["offerType"]?.int64 == 4 && signed["offerIdentifier"]?.text == "come_back")
        #expect(signed["offerDiscountType"]?.text == "PAY_UP_FRONT" && signed["offerPeriod"]?.text == "P9M")
        #expect(signed["price"]?.int64 == 990)
        // Redeemed once: after it lapses again, the same offer is no longer offered.
        let original = try #require(signed["originalTransactionId"]?.text)
        _ = try await world.emulator.setAutoRenew(originalTransactionId: original, enabled: false)
        _ = try await world.emulator.advanceTime(by: 20 * 60)
        #expect(try await renewalInfo(world, original)["eligibleWinBackOfferIds"] == nil)
        #expect(try await payment(world, offer: "come_back").0 == 403)
    }

    @Test("A free trial alone does not earn a win-back; the App Store's streamlined purchase redeems for a lapsed payer")
    func streamlined() async throws {
        let world = try await Self.world()
        await #expect(throws: StoreError.self) {
            _ = try await world.emulator.redeemWinBackOffer(bundleId: Self.app, email: World.tester, productId: "plus.monthly", offerId: "come_back")
        }
        let bought = try await world.buy(Self.app, "plus.monthly")
        _ = try await world.emulator.setAutoRenew(originalTransactionId: bought.originalId, enabled: false)
        _ = try await world.emulator.advanceTime(by: 6 * 60)
        let record = try await world.emulator.redeemWinBackOffer(bundleId: Self.app, email: World.tester, productId: "plus.monthly", offerId: "come_back")
        #expect(record.offerType == 4 && record.originalId == bought.originalId, "the subscription starts again in its chain")
        #expect(try await world.emulator.read { state, _ in state.chains[bought.originalId]?.latestTransactionId } == record.id)
        #expect((record.expiresDate ?? .distantPast) > record.purchaseDate)
    }
}
