import AppStoreModels
import Foundation
import Testing

@Suite("Catalog and .storekit files")
struct CatalogTests {
    static let examples = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("examples")

    @Test("Product identifiers follow Apple's rules",
          arguments: [("Nada.JPYF01", true), ("com.example.magazine_monthly", true), ("", false), ("coins-100", false), ("coins 100", false), ("金币", false)])
    func identifiers(identifier: String, valid: Bool) {
        #expect(CatalogProduct.isValidIdentifier(identifier) == valid)
    }

    @Test("Production sells only Ready for Sale and cleared products; the sandbox sells all but rejected and removed")
    func reviewStates() {
        for state in ReviewState.allCases {
            #expect(state.isPurchasable(in: .production, clearedForSale: true) == (state == .readyForSale))
            #expect(!state.isPurchasable(in: .production, clearedForSale: false))
            #expect(state.isPurchasable(in: .sandbox, clearedForSale: false) == !(state == .rejected || state == .developerRemovedFromSale))
        }
        #expect(ReviewState(loose: "ready_for_sale") == .readyForSale)
        #expect(ReviewState(loose: "Developer Removed from Sale") == .developerRemovedFromSale)
        #expect(ReviewState(loose: "sold out") == nil)
    }

    @Test("The example coin store loads with five consumables priced per storefront")
    func coins() throws {
        let configuration = try StoreKitConfiguration(data: Data(contentsOf: Self.examples.appendingPathComponent("coins.storekit")))
        #expect(configuration.products.map(\.productId) == ["Nada.JPYF01", "Nada.JPYF02", "Nada.JPYF03", "Nada.JPYF04", "Nada.JPYF05"])
        #expect(configuration.products.allSatisfy { $0.type == .consumable && $0.reviewState == .readyForSale && $0.clearedForSale })
        #expect(configuration.products[0].prices == [ProductPrice(storefront: "USA", currency: "USD", amount: "0.99")])
        #expect(configuration.renewalRate == .monthlyEveryFiveMinutes)
        #expect(configuration.products[0].localization(for: "zh_CN")?.displayName == "20 金币")
    }

    @Test("The magazine store has a subscription group, a non-renewing pass and a free subscription")
    func magazine() throws {
        let configuration = try StoreKitConfiguration(data: Data(contentsOf: Self.examples.appendingPathComponent("magazine.storekit")))
        let byId = Dictionary(uniqueKeysWithValues: configuration.products.map { ($0.productId, $0) })
        #expect(byId["com.example.magazine.monthly"]?.type == .autoRenewable)
        #expect(byId["com.example.magazine.monthly"]?.period == .oneMonth)
        #expect(byId["com.example.magazine.monthly"]?.introductoryOffer == IntroductoryOffer(paymentMode: .free, period: .oneWeek))
        #expect(byId["com.example.magazine.yearly"]?.groupLevel == 1)
        #expect(byId["com.example.magazine.weekpass"]?.type == .nonRenewing)
        #expect(byId["com.example.magazine.free"]?.type == .freeSubscription)
        #expect(configuration.subscriptionGroups == ["21000001": "Magazine"])
    }

    @Test("Version 5 files with introductoryOffers lists, billing plans and unknown keys still load")
    func version5() throws {
        let text = """
        {"identifier":"X","futureKey":{"a":1},"products":[],"nonRenewingSubscriptions":[],
         "subscriptionGroups":[{"id":"G","name":"Pro","localizations":[],"subscriptions":[
           {"productID":"pro.monthly","type":"RecurringSubscription","referenceName":"Pro","subscriptionGroupID":"G","groupNumber":1,
            "recurringSubscriptionPeriod":"P1M","displayPrice":4.99,"familyShareable":true,"internalID":"1",
            "introductoryOffers":[{"internalID":"2","paymentMode":"payAsYouGo","subscriptionPeriod":"P1M","numberOfPeriods":3,"displayPrice":"0.99","billingPlanType":"MONTHLY"}],
            "billingPlans":[{"billingPlanType":"MONTHLY","displayPrice":"4.99","isEnabled":true}],"winbackOffers":[],"localizations":[]}]}],
         "settings":{"_timeRate":0,"_storefront":"JPN","_lastSynchronizedDate":793882906.67},"version":{"major":5,"minor":0}}
        """
        let configuration = try StoreKitConfiguration(data: Data(text.utf8))
        #expect(configuration.version == "5.0")
        #expect(configuration.renewalRate == .realTime)
        let product = try #require(configuration.products.first)
        #expect(product.prices == [ProductPrice(storefront: "JPN", currency: "JPY", amount: "4.99")])
        #expect(product.introductoryOffer == IntroductoryOffer(paymentMode: .payAsYouGo, period: .oneMonth, numberOfPeriods: 3, amount: "0.99"))
    }

    @Test("A file that is not JSON is rejected with a clear error")
    func notJSON() {
        #expect(throws: StoreKitConfiguration.ParseError.self) { try StoreKitConfiguration(data: Data("<xml/>".utf8)) }
    }

    @Test("Storekeeper's own catalog format needs only ids and types; tiers and shorthand prices expand")
    func catalogFile() throws {
        let file = try JSONDecoder().decode(CatalogFile.self, from: Data(contentsOf: Self.examples.appendingPathComponent("magazine.catalog.json")))
        let app = try #require(file.apps.first)
        #expect(app.sharedSecret == "0123456789abcdef0123456789abcdef")
        let yearly = try #require(app.products.first { $0.productId == "com.example.magazine.yearly" })
        #expect(yearly.priceTier == 50)
        #expect(yearly.price(for: "USA")?.amount == "49.99")
        #expect(app.products.first { $0.productId == "com.example.magazine.archive" }?.reviewState == .waitingForReview)
        #expect(throws: DecodingError.self) {
            try JSONDecoder().decode(CatalogProduct.self, from: Data(#"{"productId":"x","type":"gift card"}"#.utf8))
        }
    }

    @Test("Sandbox renewal rates match Apple's table")
    func renewalRates() {
        #expect(RenewalRate.sandboxDefault.acceleratedSeconds(for: .oneMonth) == 300)
        #expect(RenewalRate.sandboxDefault.acceleratedSeconds(for: .oneYear) == 3600)
        #expect(RenewalRate.sandboxDefault.acceleratedSeconds(for: .oneWeek) == 180)
        #expect(RenewalRate.monthlyEveryThreeMinutes.acceleratedSeconds(for: .oneYear) == 36 * 60)
        #expect(RenewalRate.realTime.acceleratedSeconds(for: .oneMonth) == nil)
    }
}
