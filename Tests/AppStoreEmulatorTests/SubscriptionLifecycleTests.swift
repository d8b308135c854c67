@testable import AppStoreEmulator
import AppStoreModels
import Foundation
import Testing

/// The subscription lifecycle, one rule per row, without an emulator: a chain whose period ended, the
/// facts around it, and what must come out.
@Suite("Subscription lifecycle as a value")
struct SubscriptionLifecycleTests {
    static let start = Date(timeIntervalSince1970: 1_800_000_000)
    static let monthly = CatalogProduct(productId: "monthly", type: .autoRenewable, referenceName: "Monthly",
                                        prices: [ProductPrice(storefront: "USA", currency: "USD", amount: "4.99")],
                                        subscriptionGroupId: "g", period: .oneMonth)

    static func chain(_ change: (inout SubscriptionChain) -> Void = { _ in }) -> SubscriptionChain {
        var chain = SubscriptionChain(originalTransactionId: "1", bundleId: "b", accountEmail: "a@example.com", deviceId: "d", environment: .sandbox,
                                      productId: "monthly", subscriptionGroupId: "g", autoRenewProductId: "monthly", autoRenewEnabled: true,
                                      renewals: 0, introPeriodsRemaining: 0, expirationIntent: nil, latestTransactionId: "1")
        change(&chain)
        return chain
    }

    static func facts(_ change: (inout SubscriptionLifecycle.Facts) -> Void = { _ in }) -> SubscriptionLifecycle.Facts {
        var facts = SubscriptionLifecycle.Facts(latestExpires: start, accountDeleted: false, renewalRate: .realTime, renewalLimitReached: false,
                                                gracePeriodDays: nil, renewalProduct: monthly)
        change(&facts)
        return facts
    }

    @Test("A period end renews for one more period at the renewal product, from the old expiry")
    func renews() {
        let (chain, actions) = SubscriptionLifecycle.periodEnded(Self.chain(), Self.facts(), now: Self.start.addingTimeInterval(1))
        let end = AppStoreEmulator.periodEnd(from: Self.start, period: .oneMonth, rate: .realTime)
        #expect(actions == [.renew(productId: "monthly", start: Self.start, end: end, isIntro: false, priceAmount: nil)])
        #expect(chain.renewals == 1 && chain.autoRenewEnabled)
    }

    @Test("Stops renewing with Apple's expirationIntent", arguments: [
        ("the account was deleted", 5),
        ("the sandbox renewal limit", 1),
        ("a price increase never consented to", 3),
        ("the product is no longer for sale", 4),
    ])
    func stops(reason: String, intent: Int) {
        var chain = Self.chain()
        var facts = Self.facts()
        switch intent {
        case 5: facts.accountDeleted = true
        case 1: facts.renewalLimitReached = true
        case 3: chain.priceIncreaseAmount = "5.99"; chain.priceIncreaseConsented = false
        default: facts.renewalProduct = nil
        }
        let (next, actions) = SubscriptionLifecycle.periodEnded(chain, facts, now: Self.start)
        #expect(actions.isEmpty)
        #expect(!next.autoRenewEnabled && next.expirationIntent == intent)
        #expect(next.priceIncreaseAmount == nil)
        #expect(SubscriptionLifecycle.expiredSubtype(intent: intent) == [5: nil, 1: .voluntary, 3: .priceIncrease, 4: .productNotForSale][intent]!)
    }

    @Test("A consented price increase is charged from the next renewal and then forgotten")
    func consentedPrice() {
        let chain = Self.chain { $0.priceIncreaseAmount = "5.99"; $0.priceIncreaseConsented = true }
        let (next, actions) = SubscriptionLifecycle.periodEnded(chain, Self.facts(), now: Self.start)
        guard case .renew(_, _, _, _, let price, _, _, _) = actions.first else { Issue.record("no renewal: \(actions)"); return }
        #expect(price == "5.99")
        #expect(next.priceIncreaseAmount == nil && next.priceIncreaseConsented == nil)
    }

    @Test("A failing charge enters billing retry once, with grace when the app offers it, and says so once")
    func billingRetry() {
        let failing = Self.chain { $0.billingIssue = true }
        let withGrace = Self.facts { $0.gracePeriodDays = 16 }
        let (inRetry, first) = SubscriptionLifecycle.periodEnded(failing, withGrace, now: Self.start.addingTimeInterval(60))
        #expect(first == [.notify(.didFailToRenew, .gracePeriod)])
        #expect(inRetry.billingRetryStart == Self.start && inRetry.expirationIntent == 2 && inRetry.autoRenewEnabled)
        #expect(inRetry.gracePeriodEnd == Self.start.addingTimeInterval(16 * 86_400))
        let (_, again) = SubscriptionLifecycle.periodEnded(inRetry, withGrace, now: Self.start.addingTimeInterval(120))
        #expect(again.isEmpty)
        let (graceOver, expired) = SubscriptionLifecycle.periodEnded(inRetry, withGrace, now: Self.start.addingTimeInterval(17 * 86_400))
        #expect(expired == [.notify(.gracePeriodExpired, nil)] && graceOver.autoRenewEnabled)
        let (_, noGrace) = SubscriptionLifecycle.periodEnded(failing, Self.facts(), now: Self.start)
        #expect(noGrace == [.notify(.didFailToRenew, nil)])
    }

    @Test("Billing retry ends after 60 days: the chain stops renewing (the expiry pass sends EXPIRED / BILLING_RETRY)")
    func retryEnds() {
        let inRetry = Self.chain { $0.billingIssue = true; $0.billingRetryStart = Self.start; $0.expirationIntent = 2 }
        let (next, actions) = SubscriptionLifecycle.periodEnded(inRetry, Self.facts(), now: Self.start.addingTimeInterval(60 * 86_400))
        #expect(actions.isEmpty && !next.autoRenewEnabled && next.billingRetryStart == nil && next.expirationIntent == 2)
        #expect(SubscriptionLifecycle.expiredSubtype(intent: 2) == .billingRetry)
    }

    @Test("A pay-as-you-go introductory offer renews at the offer's period while periods remain")
    func introductoryOffer() {
        var product = Self.monthly
        product.introductoryOffer = IntroductoryOffer(paymentMode: .payAsYouGo, period: .oneWeek, numberOfPeriods: 3, amount: "0.99")
        let chain = Self.chain { $0.introPeriodsRemaining = 2 }
        let (next, actions) = SubscriptionLifecycle.periodEnded(chain, Self.facts { $0.renewalProduct = product }, now: Self.start)
        let end = AppStoreEmulator.periodEnd(from: Self.start, period: .oneWeek, rate: .realTime)
        #expect(actions == [.renew(productId: "monthly", start: Self.start, end: end, isIntro: true, priceAmount: nil)])
        #expect(next.introPeriodsRemaining == 1)
    }
}
