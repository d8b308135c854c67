@testable import AppStoreEmulator
import AppStoreModels
import Foundation
import StorekeeperTesting
import Testing

/// SKTestSession's switches and actions at run time: interrupted purchases resolved by the customer,
/// deleted transactions, every time rate (the Xcode-only ones too), and the admin API that drives them.
@Suite("StoreKit Testing session controls")
struct TestSessionTests {
    func patch(_ world: World, _ app: String, _ body: [String: Any]) async throws -> (Int, [String: Any]) {
        try await world.client.json(.patch, "/admin/v1/apps/\(app)/test-session", json: body, headers: ["Content-Type": "application/json"])
    }

    @Test("An interrupted purchase waits as pending, completes when resolved, and reaches the device's updates")
    func interruptedPurchases() async throws {
        let world = try await World.make()
        let (status, settings) = try await patch(world, "com.example.football", ["interruptedPurchasesEnabled": true])
        #expect(status == 200 && settings["interruptedPurchasesEnabled"] as? Bool == true)
        let interrupted = try await world.buy("com.example.football", "GoldenGlobe")
        #expect(interrupted.state == .deferred && interrupted.interrupted == true)
        let (before, _) = try await world.emulator.transactionUpdates(bundleId: "com.example.football", deviceId: world.device, since: .distantPast)
        #expect(!before.contains { $0.id == interrupted.id })
        // Ask to Buy's parent cannot approve it, and a normal purchase cannot be "resolved".
        let plain = try await world.buy("com.example.coins", "Nada.JPYF01")
        await #expect(throws: StoreError.self) { _ = try await world.emulator.resolveInterruptedPurchase(transactionId: plain.id) }
        let (resolvedStatus, resolved) = try await world.client.json(.post, "/admin/v1/transactions/\(interrupted.id)/resolve")
        #expect(resolvedStatus == 200 && resolved["transactionState"] as? String == "purchased")
        let (after, _) = try await world.emulator.transactionUpdates(bundleId: "com.example.football", deviceId: world.device, since: .distantPast)
        #expect(after.contains { $0.id == interrupted.id })
        _ = try await patch(world, "com.example.football", ["interruptedPurchasesEnabled": false])
        #expect(try await world.buy("com.example.football", "ProtectiveGloves").state == .purchased)
    }

    @Test("Deleting a transaction forgets it (receipt and entitlements); clearing forgets the app's every transaction")
    func deleteAndClear() async throws {
        let world = try await World.make()
        let gloves = try await world.buy("com.example.football", "ProtectiveGloves")
        let globe = try await world.buy("com.example.football", "GoldenGlobe")
        let coins = try await world.buy("com.example.coins", "Nada.JPYF01")
        let (status, deleted) = try await world.client.json(.delete, "/admin/v1/apps/com.example.football/transactions?transaction=\(gloves.id)")
        #expect(status == 200 && deleted["deleted"] as? Int == 1)
        let owned = try await world.emulator.currentEntitlements(bundleId: "com.example.football", deviceId: world.device).map(\.id)
        #expect(owned == [globe.id])
        #expect(try await world.verify(try await world.receipt("com.example.football")).inApp.map { $0["product_id"] as? String } == ["GoldenGlobe"])
        #expect(try await world.client.json(.delete, "/admin/v1/apps/com.example.football/transactions?transaction=1").0 == 404)
        _ = try await world.client.json(.delete, "/admin/v1/apps/com.example.football/transactions")
        #expect(try await world.emulator.currentEntitlements(bundleId: "com.example.football", deviceId: world.device).isEmpty)
        #expect(try await world.emulator.transaction(coins.id).id == coins.id, "other apps keep theirs")
        // A renewal's id deletes that renewal only: the chain falls back to the period before.
        let renewing = try await world.buy("com.example.magazine", "com.example.magazine.yearly")
        _ = try await world.emulator.advanceTime(by: 61 * 60)  // a yearly period is an hour at the tester's rate
        let renewed = try #require(try await world.emulator.read { state, _ in state.chains[renewing.originalId] })
        #expect(renewed.latestTransactionId != renewing.id)
        _ = try await world.emulator.deleteTransactions(bundleId: "com.example.magazine", transactionId: renewed.latestTransactionId)
        let fallen = try #require(try await world.emulator.read { state, _ in state.chains[renewing.originalId] })
        #expect(fallen.latestTransactionId != renewed.latestTransactionId)
        _ = try await world.emulator.deleteTransactions(bundleId: "com.example.magazine", transactionId: renewing.originalId)
        // Production accounts cannot take accelerated rates (they would renew without the sandbox's limit).
        await #expect(throws: StoreError.self) {
            _ = try await world.emulator.addAccount(email: "fast@example.com", environment: .production, renewalRate: .oneRenewalEveryTwoSeconds)
        }
        // A subscription's original id deletes its chain: buying again starts a new one with the trial.
        let monthly = try await world.buy("com.example.magazine", "com.example.magazine.monthly")
        _ = try await world.emulator.deleteTransactions(bundleId: "com.example.magazine", transactionId: monthly.originalId)
        #expect(try await world.emulator.read { state, _ in state.chains[monthly.originalId] } == nil)
        #expect(try await world.buy("com.example.magazine", "com.example.magazine.monthly").isTrialPeriod)
    }

    @Test("Every SKTestSession.TimeRate value sets the app's renewal pace; anything else is refused")
    func timeRates() async throws {
        let world = try await World.make()
        let expected: [Int: Int] = [1: 30 * 3600, 2: 30 * 1800, 3: 30 * 300, 4: 30 * 60, 5: 30 * 30, 6: 30, 10: 3600, 11: 1800, 12: 900,
                                    13: 300, 15: 30, 1000: 900, 1001: 300, 1002: 60, 1003: 30, 1004: 10, 1005: 2]
        for (rate, seconds) in expected.sorted(by: { $0.key < $1.key }) {
            #expect(RenewalRate(storeKitTimeRate: rate)?.storeKitTimeRate == rate)
            #expect(RenewalRate(storeKitTimeRate: rate)?.acceleratedSeconds(for: .oneMonth) == seconds, "rate \(rate)")
        }
        // Every period of any length renews after the same span at 1000–1005.
        #expect(RenewalRate.oneRenewalEveryTenSeconds.acceleratedSeconds(for: .oneYear) == 10)
        let (refused, body) = try await patch(world, "com.example.magazine", ["timeRate": 7])
        #expect(refused == 400 && (body["error"] as? [String: Any])?["code"] as? String == "invalid_time_rate")
        _ = try await patch(world, "com.example.magazine", ["timeRate": 1005])
        let bought = try await world.buy("com.example.magazine", "com.example.magazine.yearly")
        #expect(try #require(bought.expiresDate).timeIntervalSince(bought.purchaseDate) == 2)
        // Real time (0) gives the calendar back.
        _ = try await patch(world, "com.example.magazine", ["timeRate": 0])
        let (_, shown) = try await world.client.json(.get, "/admin/v1/apps/com.example.magazine/test-session")
        #expect(shown["timeRate"] as? Int == 0)
    }

    @Test("A file's _storefront and _locale are where the app's sandbox testers shop: titles in the file's locale, prices in its storefront")
    func storefrontAndLocale() async throws {
        let world = try await World.make()
        let file = Data("""
            { "identifier" : "L", "nonRenewingSubscriptions" : [], "subscriptionGroups" : [], "version" : { "major" : 4, "minor" : 0 },
              "settings" : { "_storefront" : "JPN", "_locale" : "ja_JP" },
              "products" : [ { "displayPrice" : "230", "familyShareable" : false, "internalID" : "1", "productID" : "gems", "referenceName" : "Gems",
                               "type" : "Consumable", "localizations" : [ { "description" : "Gems", "displayName" : "Gems", "locale" : "en_US" },
                                                                          { "description" : "宝石", "displayName" : "宝石パック", "locale" : "ja_JP" } ] } ] }
            """.utf8)
        try await world.emulator.register(storeKit: StoreKitConfiguration(data: file), bundleId: "com.example.locale")
        let listed = try await world.emulator.products(bundleId: "com.example.locale", deviceId: world.device, ids: ["gems"])
        #expect(listed.products.first?.localizedTitle == "宝石パック", "the tester is en_US; the file says ja_JP")
        #expect(listed.products.first?.currencyCode == "JPY" && listed.products.first?.storefront == "JPN")
        let bought = try await world.buy("com.example.locale", "gems")
        #expect(bought.price?.storefront == "JPN" && bought.price?.currency == "JPY")
        // Without the file's locale the same catalog shows the tester's own (en_US).
        try await world.emulator.register(storeKit: StoreKitConfiguration(data: Data(String(decoding: file, as: UTF8.self)
            .replacingOccurrences(of: "\"_locale\" : \"ja_JP\"", with: "\"_disableDialogs\" : false").utf8)), bundleId: "com.example.locale2")
        let plain = try await world.emulator.products(bundleId: "com.example.locale2", deviceId: world.device, ids: ["gems"])
        #expect(plain.products.first?.localizedTitle == "Gems")
    }

    @Test("TestFlight: every subscription renews daily whatever its duration, six times, then auto-renew is off")
    func testFlightCadence() async throws {
        let world = try await World.make()
        try await world.emulator.addAccount(email: "beta@example.com", environment: .sandbox, renewalRate: .testFlight)
        let device = try await world.emulator.signIn(deviceId: nil, email: "beta@example.com")
        let yearly = try await world.buy("com.example.magazine", "com.example.magazine.yearly", device: device.id)
        #expect(try #require(yearly.expiresDate).timeIntervalSince(yearly.purchaseDate) == 86_400)
        _ = try await world.emulator.advanceTime(by: 10 * 86_400)
        let chain = try #require(try await world.emulator.read { state, _ in state.chains[yearly.originalId] })
        #expect(chain.renewals == RenewalRate.testFlightRenewals && !chain.autoRenewEnabled)
    }
}
