@testable import AppStoreEmulator
import AppStoreModels
import Foundation
import StorekeeperTesting
import Testing

/// A `.storekit` file as Xcode writes it: its `settings` are applied to the app's purchases and renewals, and
/// its offers are read from the keys Xcode uses.
@Suite("StoreKit Testing settings from .storekit files")
struct StoreKitSettingsTests {
    static func file(settings: String) -> Data {
        Data("""
        {
          "identifier" : "Settings", "nonRenewingSubscriptions" : [],
          "products" : [ { "displayPrice" : "0.99", "familyShareable" : false, "internalID" : "1", "localizations" : [],
                           "productID" : "coins", "referenceName" : "Coins", "type" : "Consumable" } ],
          "settings" : { \(settings) },
          "subscriptionGroups" : [ { "id" : "g1", "name" : "Plus", "localizations" : [], "subscriptions" : [ {
              "adHocOffers" : [ { "displayPrice" : "0", "internalID" : "a1", "numberOfPeriods" : 1, "offerID" : "welcome_back",
                                  "paymentMode" : "free", "referenceName" : "Welcome back", "subscriptionPeriod" : "P1M" } ],
              "codeOffers" : [ { "displayPrice" : "1.99", "eligibility" : ["new", "expired"], "internalID" : "c1", "isStackable" : true,
                                 "numberOfPeriods" : 2, "offerID" : "SPRING", "paymentMode" : "payAsYouGo", "referenceName" : "Spring",
                                 "subscriptionPeriod" : "P1M" } ],
              "winbackOffers" : [ { "displayPrice" : "0.99", "internalID" : "w1", "numberOfPeriods" : 3, "offerID" : "come_back",
                                    "paymentMode" : "payUpFront", "referenceName" : "Come back", "subscriptionPeriod" : "P3M" } ],
              "displayPrice" : "4.99", "familyShareable" : true, "groupNumber" : 1, "internalID" : "s1", "introductoryOffer" : null,
              "localizations" : [], "productID" : "plus.monthly", "recurringSubscriptionPeriod" : "P1M", "referenceName" : "Plus",
              "type" : "RecurringSubscription" } ] } ],
          "version" : { "major" : 4, "minor" : 0 }, "somethingNew" : { "ignored" : true }
        }
        """.utf8)
    }

    @Test("Every settings key is read (unknown ones ignored), and offers come from adHocOffers, codeOffers and winbackOffers")
    func parsing() throws {
        let configuration = try StoreKitConfiguration(data: Self.file(settings: """
            "_applicationInternalID" : "6444444444", "_askToBuyEnabled" : true, "_billingGracePeriodEnabled" : true,
            "_billingIssuesEnabled" : false, "_renewalBillingIssuesEnabled" : true, "_developerTeamID" : "ABCDE12345",
            "_disableDialogs" : true, "_failTransactionsEnabled" : false, "_locale" : "ja_JP", "_storefront" : "JPN",
            "_storeKitErrors" : [ { "current" : null, "enabled" : true, "name" : "Load Products" }, { "current" : null, "enabled" : false, "name" : "Purchase" } ],
            "_timeRate" : 13, "_notAKnownKey" : 7
            """))
        let settings = configuration.settings
        #expect(settings.timeRate == 13 && settings.renewalRate == .monthlyEveryFiveMinutes)
        #expect(settings.askToBuyEnabled && settings.billingGracePeriodEnabled && settings.billingIssuesEnabled && settings.disableDialogs)
        #expect(!settings.failTransactionsEnabled)
        #expect(settings.storefront == "JPN" && settings.locale == "ja_JP")
        #expect(settings.applicationInternalID == "6444444444" && settings.developerTeamID == "ABCDE12345")
        #expect(settings.simulatedError(for: .loadProducts) == .unknown && settings.simulatedError(for: .purchase) == nil)
        #expect(configuration.version == "4.0")
        let plus = try #require(configuration.products.first { $0.productId == "plus.monthly" })
        #expect(plus.promotionalOffers.map(\.offerId) == ["welcome_back"] && plus.promotionalOffers.first?.paymentMode == .free)
        #expect(plus.offerCodes.map(\.offerId) == ["SPRING"] && plus.offerCodes.first?.numberOfPeriods == 2)
        #expect(plus.winBackOffers.map(\.offerId) == ["come_back"] && plus.winBackOffers.first?.paymentMode == .payUpFront)
        #expect(plus.familyShareable)
        // Kept with the app through the catalog's JSON (what the emulator persists).
        var app = CatalogApp(bundleId: "b", appAppleId: 1, name: "b", sharedSecret: "s", products: configuration.products)
        app.testSettings = settings
        #expect(try JSONDecoder().decode(CatalogApp.self, from: JSONEncoder().encode(app)) == app)
    }

    @Test("_failTransactionsEnabled and the Purchase error fail every purchase; _askToBuyEnabled defers them")
    func purchases() async throws {
        let world = try await World.make()
        try await world.emulator.register(storeKit: StoreKitConfiguration(data: Self.file(settings: "\"_failTransactionsEnabled\" : true")), bundleId: "com.example.fails")
        #expect(try await world.buy("com.example.fails", "coins").state == .failed)
        try await world.emulator.register(storeKit: StoreKitConfiguration(data: Self.file(settings: """
            "_storeKitErrors" : [ { "current" : null, "enabled" : true, "name" : "Purchase" } ]
            """)), bundleId: "com.example.errors")
        let failed = try await world.buy("com.example.errors", "coins")
        #expect(failed.state == .failed && failed.error == .unknown)
        try await world.emulator.register(storeKit: StoreKitConfiguration(data: Self.file(settings: "\"_askToBuyEnabled\" : true")), bundleId: "com.example.asks")
        #expect(try await world.buy("com.example.asks", "coins").state == .deferred)
        // Xcode's "Load Products" error: the products request fails; without it the same file's products load.
        try await world.emulator.register(storeKit: StoreKitConfiguration(data: Self.file(settings: """
            "_storeKitErrors" : [ { "current" : null, "enabled" : true, "name" : "Load Products" } ]
            """)), bundleId: "com.example.noproducts")
        await #expect(throws: StoreError.self) {
            _ = try await world.emulator.products(bundleId: "com.example.noproducts", deviceId: world.device, ids: ["coins"])
        }
        #expect(try await world.emulator.products(bundleId: "com.example.fails", deviceId: world.device, ids: ["coins"]).products.count == 1)
        // Without the switches the same products sell.
        try await world.emulator.register(storeKit: StoreKitConfiguration(data: Self.file(settings: "")), bundleId: "com.example.plain")
        #expect(try await world.buy("com.example.plain", "coins").state == .purchased)
    }

    @Test("_timeRate sets the app's renewal rate; _billingIssuesEnabled sends renewals into billing retry, with Xcode's grace period")
    func renewals() async throws {
        let world = try await World.make()
        try await world.emulator.register(storeKit: StoreKitConfiguration(data: Self.file(settings: """
            "_timeRate" : 12, "_billingIssuesEnabled" : true, "_billingGracePeriodEnabled" : true
            """)), bundleId: "com.example.billing")
        let bought = try await world.buy("com.example.billing", "plus.monthly")
        // The tester's account renews a month in five minutes; this app's file says fifteen.
        let length = try #require(bought.expiresDate).timeIntervalSince(bought.purchaseDate)
        #expect(length == 15 * 60)
        _ = try await world.emulator.advanceTime(by: 16 * 60)
        let chain = try #require(try await world.emulator.read { state, _ in state.chains[bought.originalId] })
        #expect(chain.billingRetryStart != nil, "the renewal failed to bill")
        #expect(chain.gracePeriodEnd != nil, "Xcode's billing grace period applies")
        #expect(try await world.emulator.read { state, _ in state.gracePeriodDays["com.example.billing"] } == 16)
    }
}

extension StoreKitSettingsTests {
    @Test("Exported as a .storekit file and read back, every example catalog and its settings come back the same")
    func roundTrip() throws {
        let examples = TestSupport.repositoryRoot().appendingPathComponent("examples")
        var files = try FileManager.default.contentsOfDirectory(atPath: examples.path).filter { $0.hasSuffix(".storekit") }.map {
            try Data(contentsOf: examples.appendingPathComponent($0))
        }
        files.append(Self.file(settings: "\"_timeRate\" : 12, \"_failTransactionsEnabled\" : true, \"_developerTeamID\" : \"T1\""))
        #expect(files.count >= 5)
        for data in files {
            let imported = try StoreKitConfiguration(data: data)
            var app = CatalogApp(bundleId: "com.example.roundtrip", appAppleId: 1, name: "x", sharedSecret: "s", products: imported.products,
                                 subscriptionGroups: imported.subscriptionGroups)
            app.testSettings = imported.settings
            let again = try StoreKitConfiguration(data: StoreKitConfiguration.export(app))
            // The same products (the file groups them by kind, so the order may differ).
            let (mine, theirs) = (again.products.sorted { $0.productId < $1.productId }, imported.products.sorted { $0.productId < $1.productId })
            #expect(mine.map(\.productId) == theirs.map(\.productId))
            for (exported, original) in zip(mine, theirs) where exported != original { Issue.record("\(exported) != \(original)") }
            #expect(again.subscriptionGroups == imported.subscriptionGroups)
            #expect(again.settings == imported.settings)
        }
    }
}
