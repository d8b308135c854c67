import AppStoreCrypto
@testable import AppStoreEmulator
import AppStoreModels
import Foundation
import StorekeeperTesting
import Testing

/// The 2024–2026 catalog keys of a `.storekit` file and what they do: billing plans (a yearly subscription paid
/// monthly over a 12-month commitment), offer-code eligibility, one-time purchase offer codes, app policies,
/// the App Store Connect ids; prorated refunds; offers that wait for the next renewal.
@Suite("Billing plans, offer codes and prorated refunds")
struct BillingPlanTests {
    static let app = "com.example.plans"

    /// A version 5 file: pro.yearly ($59.99 up front, or $5.99 a month over a $71.88 commitment), lite.yearly
    /// (a lower level), a consumable and a non-consumable with one-time offer codes.
    static let file = Data("""
    {
      "identifier" : "Plans", "nonRenewingSubscriptions" : [],
      "appPolicies" : { "eula" : "Be nice.", "policies" : [ { "locale" : "en_US", "policyText" : "We keep nothing.", "policyURL" : "https://example.com/p" } ] },
      "products" : [
        { "codeOffers" : [ { "displayPrice" : "0.49", "internalID" : "o1", "offerID" : "HALF_GEMS", "referenceName" : "HALF_GEMS" } ],
          "displayPrice" : "0.99", "familyShareable" : false, "internalID" : "p1", "localizations" : [], "productID" : "gems",
          "referenceName" : "Gems", "type" : "Consumable" },
        { "codeOffers" : [ { "internalID" : "o2", "referenceName" : "FREE_THEME" } ],
          "displayPrice" : "2.99", "familyShareable" : false, "internalID" : "p2", "localizations" : [], "productID" : "theme",
          "referenceName" : "Theme", "type" : "NonConsumable" } ],
      "settings" : { "_applicationInternalID" : "6450000001", "_developerTeamID" : "TEAM123456", "_timeRate" : 0 },
      "subscriptionGroups" : [ { "id" : "g1", "name" : "Pro", "localizations" : [], "subscriptions" : [
        { "billingPlans" : [ { "billingPlanType" : "BILLED_UPFRONT", "displayPrice" : "59.99", "internalID" : "b1", "isEnabled" : true },
                             { "billingPlanType" : "MONTHLY", "commitmentDisplayPrice" : "71.88", "displayPrice" : "5.99", "internalID" : "b2", "isEnabled" : true } ],
          "introductoryOffers" : [ { "billingPlanType" : "MONTHLY", "internalID" : "i2", "numberOfPeriods" : 1, "paymentMode" : "free", "subscriptionPeriod" : "P1M" },
                                   { "billingPlanType" : "BILLED_UPFRONT", "internalID" : "i1", "numberOfPeriods" : 1, "paymentMode" : "free", "subscriptionPeriod" : "P1W" } ],
          "codeOffers" : [ { "displayPrice" : "0", "eligibility" : [ "existing" ], "internalID" : "c1", "isStackable" : false, "numberOfPeriods" : 1,
                             "offerID" : "LOYAL", "paymentMode" : "free", "referenceName" : "LOYAL", "subscriptionPeriod" : "P1M" },
                           { "displayPrice" : "0", "eligibility" : [ "new" ], "internalID" : "c2", "numberOfPeriods" : 1,
                             "offerID" : "NEWBIE", "paymentMode" : "free", "referenceName" : "NEWBIE", "subscriptionPeriod" : "P1M" } ],
          "adHocOffers" : [], "winbackOffers" : [],
          "displayPrice" : "59.99", "familyShareable" : false, "groupNumber" : 1, "internalID" : "s1", "localizations" : [],
          "productID" : "pro.yearly", "recurringSubscriptionPeriod" : "P1Y", "referenceName" : "Pro", "type" : "RecurringSubscription" },
        { "displayPrice" : "29.99", "familyShareable" : false, "groupNumber" : 2, "internalID" : "s2", "localizations" : [],
          "productID" : "lite.yearly", "recurringSubscriptionPeriod" : "P1Y", "referenceName" : "Lite", "type" : "RecurringSubscription" } ] } ],
      "version" : { "major" : 5, "minor" : 0 }
    }
    """.utf8)

    static func world(environment: AppStoreEnvironment = .sandbox) async throws -> (World, String) {
        let world = try await World.make()
        try await world.emulator.register(storeKit: StoreKitConfiguration(data: file), bundleId: app)
        try await world.emulator.setNotificationURLs(bundleId: app, NotificationURLs(production: "http://127.0.0.1:9/none", sandbox: "http://127.0.0.1:9/none"))
        var quirks = try await world.emulator.quirks()
        quirks.sandboxMaxRenewals = 100
        try await world.emulator.setQuirks(quirks)
        guard environment == .production else { return (world, world.device) }
        try await world.emulator.addAccount(email: "buyer@example.com", environment: .production)
        return (world, try await world.emulator.signIn(deviceId: nil, email: "buyer@example.com").id)
    }

    func signed(_ world: World, _ id: String) async throws -> JSONValue {
        try JWS(compact: try await world.emulator.signedTransaction(transactionId: id)).payloadJSON()
    }

    func renewalInfo(_ world: World, _ original: String) async throws -> JSONValue {
        let chain = try #require(try await world.emulator.read { state, _ in state.chains[original] })
        let latest = try await world.emulator.transaction(chain.latestTransactionId)
        return try JWS(compact: try world.emulator.signedRenewalInfo(chain, latest: latest, signedAt: Date())).payloadJSON()
    }

    func sent(_ world: World, chain original: String) async throws -> [String] {
        try await world.emulator.read { state, _ in
            state.notifications.values.filter { $0.originalTransactionId == original }.sorted { $0.createdAt < $1.createdAt || ($0.createdAt == $1.createdAt && $0.signedPayload < $1.signedPayload) }
                .map { [$0.notificationType.rawValue, $0.subtype?.rawValue].compactMap { $0 }.joined(separator: "/") }
        }
    }

    func buy(_ world: World, _ product: String, device: String, plan: String? = nil) async throws -> TransactionRecord {
        var request = PaymentRequest(productId: product)
        request.billingPlanType = plan
        return try await world.emulator.addPayment(bundleId: Self.app, deviceId: device, request: request)
    }

    @Test("Version 5 keys are read and written back: billing plans, per-plan introductory offers, code eligibility, one-time codes, policies, ids")
    func catalogKeys() async throws {
        let configuration = try StoreKitConfiguration(data: Self.file)
        let pro = try #require(configuration.products.first { $0.productId == "pro.yearly" })
        #expect(pro.billingPlans == [BillingPlan(type: .billedUpfront, amount: "59.99"),
                                     BillingPlan(type: .monthly, amount: "5.99", commitmentAmount: "71.88")])
        #expect(pro.introductoryOffer?.period == .oneWeek, "the up-front plan's introductory offer is the product's")
        #expect(pro.offerCodes.map(\.eligibility) == [["existing"], ["new"]] && pro.offerCodes.first?.isStackable == false)
        #expect(configuration.products.first { $0.productId == "gems" }?.oneTimeOfferCodes == [OneTimeOfferCode(offerId: "HALF_GEMS", amount: "0.49")])
        #expect(configuration.products.first { $0.productId == "theme" }?.oneTimeOfferCodes == [OneTimeOfferCode(offerId: "FREE_THEME")])
        #expect(configuration.appPolicies?.policies.first?.policyURL == "https://example.com/p" && configuration.appPolicies?.eula == "Be nice.")

        let (world, _) = try await Self.world()
        let app = try await world.emulator.app(Self.app)
        #expect(app.appAppleId == 6_450_000_001, "a file synced from App Store Connect names the app's Apple id")
        #expect(app.testSettings?.developerTeamID == "TEAM123456")
        // The export is a version 5 file that reads back as the same catalog.
        let exported = try StoreKitConfiguration.export(app)
        let again = try StoreKitConfiguration(data: exported)
        #expect(again.version == "5.0")
        #expect(again.products.map(\.billingPlans) == app.products.map(\.billingPlans))
        #expect(again.products.map(\.offerCodes) == app.products.map(\.offerCodes))
        #expect(again.products.map(\.oneTimeOfferCodes) == app.products.map(\.oneTimeOfferCodes))
        #expect(again.appPolicies == app.appPolicies && again.settings == app.testSettings)
        // A version 1 file (no settings, no groups) still reads.
        let old = try StoreKitConfiguration(data: Data(#"{"identifier":"Old","products":[{"productID":"a","type":"Consumable","displayPrice":"1"}],"version":{"major":1,"minor":0}}"#.utf8))
        #expect(old.version == "1.0" && old.products.map(\.productId) == ["a"])
        // A monthly plan on anything but a yearly subscription is refused.
        var broken = app
        broken.products[broken.products.firstIndex { $0.productId == "lite.yearly" }!].period = .oneMonth
        broken.products[broken.products.firstIndex { $0.productId == "lite.yearly" }!].billingPlans = [BillingPlan(type: .monthly, amount: "1", commitmentAmount: "12")]
        await #expect(throws: StoreError.self) { try await world.emulator.register(app: broken) }
    }

    @Test("A monthly plan charges twelve installments of one commitment, then starts the next; auto-renew off mid-commitment ends it with the twelfth")
    func monthlyCommitment() async throws {
        let (world, device) = try await Self.world(environment: .production)
        let first = try await buy(world, "pro.yearly", device: device, plan: "MONTHLY")
        let payload = try await signed(world, first.id)
        #expect(payload["billingPlanType"]?.text == "MONTHLY" && payload["price"]?.int64 == 5_990)
        #expect(payload["commitmentInfo"]?["billingPeriodNumber"]?.int64 == 1 && payload["commitmentInfo"]?["totalBillingPeriods"]?.int64 == 12)
        #expect(payload["commitmentInfo"]?["commitmentPrice"]?.int64 == 71_880)
        #expect(payload["offerType"] == nil, "no introductory offer with a monthly plan")
        let month = try #require(first.expiresDate).timeIntervalSince(first.purchaseDate)
        #expect((28...31).contains(month / 86_400), "each installment buys one month")
        let commitmentEnd = try #require(payload["commitmentInfo"]?["commitmentExpiresDate"]?.int64)
        var info = try await renewalInfo(world, first.originalId)
        #expect(info["renewalBillingPlanType"]?.text == "MONTHLY" && info["commitmentInfo"]?["commitmentRenewalDate"]?.int64 == commitmentEnd)
        #expect(info["commitmentInfo"]?["commitmentAutoRenewStatus"]?.int64 == 1 && info["commitmentInfo"]?["commitmentRenewalPrice"]?.int64 == 71_880)

        // Five months in, the customer turns auto-renew off: the installments go on, the commitment does not renew.
        _ = try await world.emulator.advanceTime(by: 5 * 31 * 86_400)
        _ = try await world.emulator.setAutoRenew(originalTransactionId: first.originalId, enabled: false)
        info = try await renewalInfo(world, first.originalId)
        #expect(info["autoRenewStatus"]?.int64 == 1 && info["commitmentInfo"]?["commitmentAutoRenewStatus"]?.int64 == 0)
        #expect(try await sent(world, chain: first.originalId).contains("DID_CHANGE_RENEWAL_STATUS/AUTO_RENEW_DISABLED"))
        _ = try await world.emulator.advanceTime(by: 9 * 31 * 86_400)
        let chain = try #require(try await world.emulator.read { state, _ in state.chains[first.originalId] })
        let installments = try await world.emulator.read { state, _ in
            state.transactions.values.filter { $0.originalId == first.originalId }.sorted { $0.purchaseDate < $1.purchaseDate }
        }
        #expect(installments.map { $0.commitment?.billingPeriodNumber } == Array(1...12).map(Optional.some), "twelve installments, no thirteenth")
        #expect(installments.allSatisfy { $0.price?.amount == "5.99" && $0.billingPlanType == .monthly })
        #expect(!chain.autoRenewEnabled && chain.expirationIntent == 1)
        #expect(try await sent(world, chain: first.originalId).last == "EXPIRED/VOLUNTARY")
    }

    @Test("At a commitment's end the subscription renews on the plan the customer chose: a new commitment, or up front")
    func nextCommitment() async throws {
        let (world, device) = try await Self.world(environment: .production)
        let first = try await buy(world, "pro.yearly", device: device, plan: "MONTHLY")
        _ = try await world.emulator.advanceTime(by: 370 * 86_400)
        var latest = try await world.emulator.transaction(try #require(try await world.emulator.read { state, _ in state.chains[first.originalId]?.latestTransactionId }))
        #expect(latest.commitment?.billingPeriodNumber == 1 && latest.commitment!.expiresDate > first.commitment!.expiresDate, "a second commitment began")
        // The customer switches to paying up front: the rest of this commitment is monthly, then a whole year at once.
        _ = try await world.emulator.setRenewalBillingPlan(originalTransactionId: first.originalId, plan: .billedUpfront)
        #expect(try await renewalInfo(world, first.originalId)["commitmentInfo"]?["commitmentRenewalBillingPlanType"]?.text == "BILLED_UPFRONT")
        _ = try await world.emulator.advanceTime(by: 365 * 86_400)
        latest = try await world.emulator.transaction(try #require(try await world.emulator.read { state, _ in state.chains[first.originalId]?.latestTransactionId }))
        #expect(latest.billingPlanType == .billedUpfront && latest.commitment == nil && latest.price?.amount == "59.99")
        #expect(try await signed(world, latest.id)["billingPlanType"]?.text == "BILLED_UPFRONT")
        // A plan the product does not have is refused, at purchase and as a renewal preference.
        await #expect(throws: StoreError.self) { _ = try await buy(world, "lite.yearly", device: device, plan: "MONTHLY") }
        await #expect(throws: StoreError.self) { _ = try await buy(world, "pro.yearly", device: device, plan: "WEEKLY") }
    }

    @Test("A commitment's installments end on its month boundaries; Ask to Buy keeps the plan; offers wait for no commitment")
    func commitmentEdges() async throws {
        let (world, device) = try await Self.world(environment: .production)
        let first = try await buy(world, "pro.yearly", device: device, plan: "MONTHLY")
        _ = try await world.emulator.advanceTime(by: 360 * 86_400)
        let twelfth = try await world.emulator.read { state, _ in
            state.transactions.values.first { $0.originalId == first.originalId && $0.commitment?.billingPeriodNumber == 12 }
        }
        #expect(twelfth?.expiresDate == first.commitment?.expiresDate, "the last installment ends when the commitment does")
        // Offer codes and promotional offers are refused while a commitment runs (no state changes).
        await #expect(throws: StoreError.self) {
            _ = try await world.emulator.redeemOfferCode(bundleId: Self.app, email: "buyer@example.com", productId: "pro.yearly", offerId: "LOYAL")
        }
        // A child's purchase on the monthly plan waits for a parent and starts the commitment when approved.
        try await world.emulator.addAccount(email: "kid@example.com", environment: .production, askToBuy: true)
        let kid = try await world.emulator.signIn(deviceId: nil, email: "kid@example.com")
        let asked = try await buy(world, "pro.yearly", device: kid.id, plan: "MONTHLY")
        #expect(asked.state == .deferred)
        let approved = try await world.emulator.answerAskToBuy(transactionId: asked.id, approve: true)
        #expect(approved.billingPlanType == .monthly && approved.commitment?.billingPeriodNumber == 1 && approved.price?.amount == "5.99")
    }

    @Test("During a commitment a price increase waits for its end, promotional offers are refused; the admin route changes the plan")
    func commitmentRules() async throws {
        let (world, device) = try await Self.world(environment: .production)
        let first = try await buy(world, "pro.yearly", device: device, plan: "MONTHLY")
        // A price increase the customer never consents to does not stop the installments.
        _ = try await world.emulator.priceIncrease(originalTransactionId: first.originalId, amount: "69.99", consent: false)
        _ = try await world.emulator.advanceTime(by: 100 * 86_400)
        var chain = try #require(try await world.emulator.read { state, _ in state.chains[first.originalId] })
        #expect(chain.autoRenewEnabled && chain.priceIncreaseAmount == "69.99", "kept for the commitment's end")
        let latest = try await world.emulator.transaction(chain.latestTransactionId)
        #expect(latest.commitment?.billingPeriodNumber == 4 && latest.price?.amount == "5.99")
        // A promotional offer is refused while the commitment runs, with StoreKit's error.
        var request = PaymentRequest(productId: "pro.yearly")
        request.promotionalOffer = PaymentRequest.SignedOffer(offerId: "any", keyId: "k", nonce: UUID().uuidString, timestamp: 0, signature: "")
        await #expect(throws: StoreError.self) { _ = try await world.emulator.addPayment(bundleId: Self.app, deviceId: device, request: request) }
        // The admin route (what `appstore subscription billing-plan` calls) changes the renewal plan; a bad plan is a 400.
        let (bad, _) = try await world.client.json(.post, "/admin/v1/subscriptions/\(first.originalId)/billing-plan?plan=WEEKLY")
        #expect(bad == 400)
        let (ok, body) = try await world.client.json(.post, "/admin/v1/subscriptions/\(first.originalId)/billing-plan?plan=BILLED_UPFRONT")
        #expect(ok == 200 && body["renewalBillingPlanType"] as? String == "BILLED_UPFRONT")
        // Unconsented at the commitment's end: the subscription lapses (EXPIRED / PRICE_INCREASE) instead of renewing.
        _ = try await world.emulator.advanceTime(by: 300 * 86_400)
        chain = try #require(try await world.emulator.read { state, _ in state.chains[first.originalId] })
        #expect(!chain.autoRenewEnabled && chain.expirationIntent == 3)
        // A billing plan without a price in a .storekit file is not read as a free one.
        let text = String(decoding: Self.file, as: UTF8.self).replacingOccurrences(of: #""displayPrice" : "5.99", "#, with: "")
        let unpriced = try StoreKitConfiguration(data: Data(text.utf8))
        #expect(unpriced.products.first { $0.productId == "pro.yearly" }?.billingPlans.map(\.type) == [.billedUpfront])
    }

    @Test("An offer waiting for a downgrade goes when the customer changes course")
    func pendingOfferCleared() async throws {
        let (world, device) = try await Self.world()
        var app = try await world.emulator.app(Self.app)
        let index = try #require(app.products.firstIndex { $0.productId == "lite.yearly" })
        app.products[index].offerCodes = [PromotionalOffer(offerId: "LITE", paymentMode: .free, period: .oneMonth)]
        try await world.emulator.register(app: app)
        let pro = try await buy(world, "pro.yearly", device: device)
        _ = try await world.emulator.redeemOfferCode(bundleId: Self.app, email: World.tester, productId: "lite.yearly", offerId: "LITE")
        #expect(try await renewalInfo(world, pro.originalId)["offerIdentifier"]?.text == "LITE")
        _ = try await buy(world, "pro.yearly", device: device)  // back to Pro before the renewal
        #expect(try await renewalInfo(world, pro.originalId)["offerIdentifier"] == nil, "Pro renews at Pro's price, not free")
        _ = try await world.emulator.forceSubscription(originalTransactionId: pro.originalId, expire: false)
        let renewal = try await world.emulator.transaction(try #require(try await world.emulator.read { state, _ in state.chains[pro.originalId]?.latestTransactionId }))
        #expect(renewal.productId == "pro.yearly" && renewal.offerType == nil && renewal.price?.amount == "59.99")
    }

    @Test("A partial refund is REFUND_PRORATED with its share; a whole one REFUND_FULL; both revoke, once")
    func proratedRefund() async throws {
        let (world, device) = try await Self.world()
        let pro = try await buy(world, "pro.yearly", device: device)
        let theme = try await buy(world, "theme", device: device)
        _ = try await world.emulator.refund(transactionId: pro.id, percentage: 25_000)
        _ = try await world.emulator.refund(transactionId: theme.id)
        let partial = try await signed(world, pro.id)
        #expect(partial["revocationType"]?.text == "REFUND_PRORATED" && partial["revocationPercentage"]?.int64 == 25_000 && partial["revocationDate"] != nil)
        let whole = try await signed(world, theme.id)
        #expect(whole["revocationType"]?.text == "REFUND_FULL" && whole["revocationPercentage"]?.int64 == 100_000)
        await #expect(throws: StoreError.self) { _ = try await world.emulator.refund(transactionId: theme.id) }
        let gems = try await buy(world, "gems", device: device)
        for bad in [0, -1, 100_001, Int.max] {
            await #expect(throws: StoreError.self) { _ = try await world.emulator.refund(transactionId: gems.id, percentage: bad) }
        }
        // Through the admin API too, where a bad share is a 400.
        let (status, _) = try await world.client.json(.post, "/admin/v1/transactions/\(gems.id)/refund?percentage=abc")
        #expect(status == 400)
        let (ok, _) = try await world.client.json(.post, "/admin/v1/transactions/\(gems.id)/refund?percentage=50000")
        #expect(ok == 200)
        #expect(try await signed(world, gems.id)["revocationPercentage"]?.int64 == 50_000)
    }

    @Test("One-time purchase offer codes sell at the code's price as offerType 3, ONE_TIME; an owned non-consumable cannot be redeemed again")
    func oneTimeCodes() async throws {
        let (world, _) = try await Self.world()
        let gems = try await world.emulator.redeemOfferCode(bundleId: Self.app, email: World.tester, productId: "gems", offerId: "HALF_GEMS")
        let payload = try await signed(world, gems.id)
        #expect(payload["offerType"]?.int64 == 3 && payload["offerIdentifier"]?.text == "HALF_GEMS" && payload["offerDiscountType"]?.text == "ONE_TIME")
        #expect(payload["price"]?.int64 == 490 && payload["type"]?.text == "Consumable")
        #expect(try await sent(world, chain: gems.id) == ["ONE_TIME_CHARGE"])
        let theme = try await world.emulator.redeemOfferCode(bundleId: Self.app, email: World.tester, productId: "theme", offerId: "FREE_THEME")
        #expect(theme.price?.amount == "0")
        await #expect(throws: StoreError.self) {
            _ = try await world.emulator.redeemOfferCode(bundleId: Self.app, email: World.tester, productId: "theme", offerId: "FREE_THEME")
        }
        await #expect(throws: StoreError.self) {
            _ = try await world.emulator.redeemOfferCode(bundleId: Self.app, email: World.tester, productId: "gems", offerId: "NO_SUCH")
        }
    }

    @Test("Offer codes only for the customers they name; one for the current product waits for the next renewal (OFFER_REDEEMED, renewal info names it)")
    func codeEligibilityAndPendingOffers() async throws {
        let (world, _) = try await Self.world()
        // LOYAL is for existing subscribers: refused to a newcomer. NEWBIE is for new ones.
        await #expect(throws: StoreError.self) {
            _ = try await world.emulator.redeemOfferCode(bundleId: Self.app, email: World.tester, productId: "pro.yearly", offerId: "LOYAL")
        }
        let first = try await world.emulator.redeemOfferCode(bundleId: Self.app, email: World.tester, productId: "pro.yearly", offerId: "NEWBIE")
        #expect(first.offerType == 3 && first.offerIdentifier == "NEWBIE")
        await #expect(throws: StoreError.self) {
            _ = try await world.emulator.redeemOfferCode(bundleId: Self.app, email: World.tester, productId: "pro.yearly", offerId: "NEWBIE")
        }
        // An existing subscriber redeems LOYAL for the product they have: nothing changes now, the next renewal is free.
        let kept = try await world.emulator.redeemOfferCode(bundleId: Self.app, email: World.tester, productId: "pro.yearly", offerId: "LOYAL")
        #expect(kept.originalId == first.originalId)
        let afterLoyal = try await sent(world, chain: first.originalId)
        #expect(afterLoyal.filter { $0 == "OFFER_REDEEMED" }.count == 1, "\(afterLoyal)")
        let info = try await renewalInfo(world, first.originalId)
        #expect(info["offerType"]?.int64 == 3 && info["offerIdentifier"]?.text == "LOYAL" && info["offerDiscountType"]?.text == "FREE_TRIAL")
        _ = try await world.emulator.forceSubscription(originalTransactionId: first.originalId, expire: false)
        let renewal = try await world.emulator.transaction(try #require(try await world.emulator.read { state, _ in state.chains[first.originalId]?.latestTransactionId }))
        #expect(renewal.isRenewal && renewal.offerType == 3 && renewal.offerIdentifier == "LOYAL" && renewal.price?.amount == "0")
        #expect(try await renewalInfo(world, first.originalId)["offerIdentifier"] == nil, "used by the renewal")
        // A code with a downgrade: OFFER_REDEEMED / DOWNGRADE, not DID_CHANGE_RENEWAL_PREF.
        var lite = try await world.emulator.app(Self.app)
        let index = try #require(lite.products.firstIndex { $0.productId == "lite.yearly" })
        lite.products[index].offerCodes = [PromotionalOffer(offerId: "LITE", paymentMode: .free, period: .oneMonth)]
        try await world.emulator.register(app: lite)
        _ = try await world.emulator.redeemOfferCode(bundleId: Self.app, email: World.tester, productId: "lite.yearly", offerId: "LITE")
        let forms = try await sent(world, chain: first.originalId)
        #expect(forms.contains("OFFER_REDEEMED/DOWNGRADE") && !forms.contains("DID_CHANGE_RENEWAL_PREF/DOWNGRADE"), "\(forms)")
    }
}
