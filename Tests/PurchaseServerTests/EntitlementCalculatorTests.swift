import AppStoreModels
import Foundation
@testable import PurchaseServer
import Testing

/// What is active, as a table: each row one rule of the README's "Entitlements" list, on `EntitlementCalculator` alone.
@Suite("Entitlement calculator: what a user owns, as values")
struct EntitlementCalculatorTests {
    static let mappings: [String: ProductMapping] = [
        "pro_forever": ProductMapping(productId: "pro_forever", type: .nonConsumable, entitlement: "pro"),
        "pro_monthly": ProductMapping(productId: "pro_monthly", type: .autoRenewable, entitlement: "pro"),
        "week_pass": ProductMapping(productId: "week_pass", type: .nonRenewing, entitlement: "pass", durationDays: 7),
        "free": ProductMapping(productId: "free", type: .freeSubscription, entitlement: "news"),
        "coins": ProductMapping(productId: "coins", type: .consumable, currency: "coins", amount: 10),
    ]
    static let day: Int64 = 86_400_000

    static func tx(_ id: String, _ product: String, original: String? = nil, bought: Int64 = 0, expires: Int64? = nil, cancelled: Int64? = nil,
                   quantity: Int64 = 1) -> UserView.Transaction {
        UserView.Transaction(transactionId: id, originalTransactionId: original ?? id, productId: product, productType: mappings[product]?.type.rawValue ?? "",
                             quantity: quantity, purchaseDate: bought, expiresDate: expires, cancellationDate: cancelled, environment: "Sandbox",
                             verificationId: "job")
    }

    struct Case: Sendable, CustomTestStringConvertible {
        let rule: String
        let transactions: [UserView.Transaction]
        var subscriptions: [SubscriptionRecord] = []
        let now: Int64
        /// Entitlement id → (active, expiresDate).
        let expected: [String: (Bool, Int64?)]
        var testDescription: String { rule }
    }

    static let cases: [Case] = [
        Case(rule: "a non-consumable never expires", transactions: [tx("1", "pro_forever")], now: 1_000 * day, expected: ["pro": (true, nil)]),
        Case(rule: "a refunded purchase grants nothing", transactions: [tx("1", "pro_forever", cancelled: 5)], now: 10, expected: [:]),
        Case(rule: "a consumable grants no entitlement", transactions: [tx("1", "coins")], now: 10, expected: [:]),
        Case(rule: "a free subscription is active", transactions: [tx("1", "free")], now: 10, expected: ["news": (true, nil)]),
        Case(rule: "a subscription is active until its expiry, inclusive", transactions: [tx("1", "pro_monthly", expires: 30 * day)], now: 30 * day,
             expected: ["pro": (true, 30 * day)]),
        Case(rule: "a subscription past its expiry is inactive", transactions: [tx("1", "pro_monthly", expires: 30 * day)], now: 30 * day + 1,
             expected: ["pro": (false, 30 * day)]),
        Case(rule: "the latest renewal decides", transactions: [tx("1", "pro_monthly", expires: 30 * day), tx("2", "pro_monthly", original: "1", bought: 30 * day, expires: 60 * day)],
             now: 45 * day, expected: ["pro": (true, 60 * day)]),
        Case(rule: "a refunded latest period ends access, even while an earlier period's dates would cover now",
             transactions: [tx("1", "pro_monthly", expires: 30 * day), tx("2", "pro_monthly", original: "1", bought: 10 * day, expires: 40 * day, cancelled: 11 * day)],
             now: 20 * day, expected: [:]),
        Case(rule: "a refunded earlier period does not end the latest one",
             transactions: [tx("1", "pro_monthly", expires: 30 * day, cancelled: 5 * day), tx("2", "pro_monthly", original: "1", bought: 30 * day, expires: 60 * day)],
             now: 45 * day, expected: ["pro": (true, 60 * day)]),
        Case(rule: "a lifetime purchase beats a lapsed subscription to the same entitlement",
             transactions: [tx("1", "pro_monthly", expires: 30 * day), tx("2", "pro_forever", bought: day)], now: 90 * day, expected: ["pro": (true, nil)]),
        Case(rule: "non-renewing passes run back to back", transactions: [tx("1", "week_pass"), tx("2", "week_pass", bought: day)], now: 13 * day,
             expected: ["pass": (true, 14 * day)]),
        Case(rule: "a pass bought twice at once lasts twice as long", transactions: [tx("1", "week_pass", quantity: 2)], now: 13 * day,
             expected: ["pass": (true, 14 * day)]),
        Case(rule: "a pass ends at its end, exclusive", transactions: [tx("1", "week_pass")], now: 7 * day, expected: ["pass": (false, 7 * day)]),
        Case(rule: "the grace period keeps access until it ends",
             transactions: [tx("1", "pro_monthly", expires: 30 * day)],
             subscriptions: [SubscriptionRecord(originalTransactionId: "1", productId: "pro_monthly", environment: "Sandbox", expiresDate: 30 * day,
                                                gracePeriodExpiresDate: 46 * day, isInBillingRetry: true)],
             now: 40 * day, expected: ["pro": (true, 46 * day)]),
        Case(rule: "billing retry after the grace period loses access",
             transactions: [tx("1", "pro_monthly", expires: 30 * day)],
             subscriptions: [SubscriptionRecord(originalTransactionId: "1", productId: "pro_monthly", environment: "Sandbox", expiresDate: 30 * day,
                                                gracePeriodExpiresDate: 36 * day, isInBillingRetry: true)],
             now: 40 * day, expected: ["pro": (false, 30 * day)]),
        Case(rule: "a subscription the user does not own grants no grace",
             transactions: [],
             subscriptions: [SubscriptionRecord(originalTransactionId: "9", productId: "pro_monthly", environment: "Sandbox", expiresDate: 30 * day,
                                                gracePeriodExpiresDate: 46 * day)],
             now: 40 * day, expected: [:]),
    ]

    @Test("Entitlements", arguments: cases)
    func entitlements(_ rule: Case) {
        let (entitlements, _) = EntitlementCalculator.entitlements(transactions: rule.transactions, subscriptions: rule.subscriptions,
                                                                   mappings: Self.mappings, now: rule.now)
        #expect(entitlements.map(\.id) == rule.expected.keys.sorted())
        for entitlement in entitlements {
            #expect(entitlement.active == rule.expected[entitlement.id]?.0)
            #expect(entitlement.expiresDate == rule.expected[entitlement.id]?.1)
        }
    }

    @Test("Subscription states", arguments: [
        (SubscriptionRecord(originalTransactionId: "1", productId: "p", environment: "Sandbox", expiresDate: 10, revokedAt: 5), "revoked"),
        (SubscriptionRecord(originalTransactionId: "1", productId: "p", environment: "Sandbox", expiresDate: 10), "active"),
        (SubscriptionRecord(originalTransactionId: "1", productId: "p", environment: "Sandbox", expiresDate: 5, gracePeriodExpiresDate: 10, isInBillingRetry: true), "grace_period"),
        (SubscriptionRecord(originalTransactionId: "1", productId: "p", environment: "Sandbox", expiresDate: 5, isInBillingRetry: true), "billing_retry"),
        (SubscriptionRecord(originalTransactionId: "1", productId: "p", environment: "Sandbox", expiresDate: 5), "expired"),
        (SubscriptionRecord(originalTransactionId: "1", productId: "p", environment: "Sandbox"), "expired"),
    ])
    func states(subscription: SubscriptionRecord, expected: String) {
        #expect(EntitlementCalculator.state(subscription, now: 10) == expected)
    }

    @Test("Renewal intent and price-increase consent are shown with the subscription")
    func renewalIntent() {
        let record = SubscriptionRecord(originalTransactionId: "1", productId: "pro_monthly", environment: "Sandbox", expiresDate: 30 * Self.day,
                                        autoRenewStatus: false, autoRenewProductId: "pro_monthly", priceIncreaseStatus: 0)
        let (_, subscriptions) = EntitlementCalculator.entitlements(transactions: [Self.tx("1", "pro_monthly", expires: 30 * Self.day)],
                                                                    subscriptions: [record], mappings: Self.mappings, now: Self.day)
        #expect(subscriptions.map(\.autoRenewStatus) == [false])
        #expect(subscriptions.map(\.priceIncreaseStatus) == [0])
        #expect(subscriptions.map(\.state) == ["active"])
    }
}
