import AppStoreModels
import Foundation

/// A subscription's renewal state as stored (one row of `subscriptions`).
public struct SubscriptionRecord: Sendable, Equatable {
    public var originalTransactionId: String
    public var productId: String
    public var environment: String
    public var expiresDate: Int64?
    public var gracePeriodExpiresDate: Int64?
    public var isInBillingRetry: Bool
    public var revokedAt: Int64?
    public var autoRenewStatus: Bool?
    public var autoRenewProductId: String?
    public var priceIncreaseStatus: Int64?

    public init(originalTransactionId: String, productId: String, environment: String, expiresDate: Int64? = nil, gracePeriodExpiresDate: Int64? = nil,
                isInBillingRetry: Bool = false, revokedAt: Int64? = nil, autoRenewStatus: Bool? = nil, autoRenewProductId: String? = nil,
                priceIncreaseStatus: Int64? = nil) {
        self.originalTransactionId = originalTransactionId
        self.productId = productId
        self.environment = environment
        self.expiresDate = expiresDate
        self.gracePeriodExpiresDate = gracePeriodExpiresDate
        self.isInBillingRetry = isInBillingRetry
        self.revokedAt = revokedAt
        self.autoRenewStatus = autoRenewStatus
        self.autoRenewProductId = autoRenewProductId
        self.priceIncreaseStatus = priceIncreaseStatus
    }
}

/// An entitlement given by support or a campaign, not bought (`source: "promotional"`).
public struct PromotionalGrant: Sendable, Equatable, Codable {
    public var entitlement: String
    /// When it ends (ms); nil never.
    public var expiresDate: Int64?
    public var reason: String
    public var grantedAt: Int64

    public init(entitlement: String, expiresDate: Int64?, reason: String, grantedAt: Int64) {
        self.entitlement = entitlement
        self.expiresDate = expiresDate
        self.reason = reason
        self.grantedAt = grantedAt
    }
}

/// What a user owns at a moment, from their ledger rows and subscription states alone: no database,
/// no clock of its own. `PurchaseStore.user` reads the rows; every rule of "what is active" is here.
public enum EntitlementCalculator {
    /// The subscription's state at `now`: revoked, active (until its expiry, inclusive), in its grace
    /// period (access kept), in billing retry (access lost) or expired.
    public static func state(_ subscription: SubscriptionRecord, now: Int64) -> String {
        if subscription.revokedAt != nil { return "revoked" }
        if let expires = subscription.expiresDate, now <= expires { return "active" }
        if let grace = subscription.gracePeriodExpiresDate, now <= grace { return "grace_period" }
        if subscription.isInBillingRetry { return "billing_retry" }
        return "expired"
    }

    /// Entitlements and subscriptions of `transactions` (sorted by purchase date) and `subscriptions` (the user's) at `now`.
    /// Promotional grants count like purchases: active until they end, and a purchase with a later (or no) end wins.
    public static func entitlements(transactions: [UserView.Transaction], subscriptions: [SubscriptionRecord], mappings: [String: ProductMapping],
                                    promotional: [PromotionalGrant] = [], now: Int64)
        -> (entitlements: [UserView.Entitlement], subscriptions: [UserView.Subscription]) {
        var entitlements: [String: UserView.Entitlement] = [:]
        // One entitlement from many purchases: an active one beats an inactive one; then the later expiry (never expiring beats all).
        func offer(_ candidate: UserView.Entitlement) {
            guard let existing = entitlements[candidate.id] else {
                entitlements[candidate.id] = candidate
                return
            }
            if candidate.active != existing.active {
                if candidate.active { entitlements[candidate.id] = candidate }
            } else if let candidateExpiry = candidate.expiresDate {
                if let existingExpiry = existing.expiresDate, candidateExpiry > existingExpiry { entitlements[candidate.id] = candidate }
            } else {
                entitlements[candidate.id] = candidate
            }
        }
        // An auto-renewable subscription is what its latest transaction says, as Apple's status is: a
        // refunded latest period ends access even if an earlier period's dates would still cover now.
        var latest: [String: UserView.Transaction] = [:]
        for transaction in transactions where mappings[transaction.productId]?.type == .autoRenewable {
            let chain = transaction.environment + "|" + transaction.originalTransactionId
            if let known = latest[chain], (known.purchaseDate, known.transactionId) >= (transaction.purchaseDate, transaction.transactionId) { continue }
            latest[chain] = transaction
        }
        // Non-renewing passes run back to back: each starts when the previous one of its entitlement ends.
        var passEnd: [String: Int64] = [:]
        for transaction in transactions where transaction.cancellationDate == nil {
            guard let mapping = mappings[transaction.productId], let entitlement = mapping.entitlement else { continue }
            let source = mapping.type.rawValue
            switch mapping.type {
            case .nonConsumable, .freeSubscription:
                offer(.init(id: entitlement, active: true, expiresDate: nil, source: source, productId: transaction.productId, environment: transaction.environment))
            case .nonRenewing:
                let key = entitlement + "|" + transaction.environment
                let start = max(transaction.purchaseDate, passEnd[key] ?? 0)
                let end = mapping.passEnd(from: start, quantity: transaction.quantity)
                passEnd[key] = end
                offer(.init(id: entitlement, active: now < end, expiresDate: end, source: source, productId: transaction.productId,
                            environment: transaction.environment))
            case .autoRenewable:
                guard latest[transaction.environment + "|" + transaction.originalTransactionId]?.transactionId == transaction.transactionId else { continue }
                let expires = transaction.expiresDate ?? transaction.purchaseDate
                // Inclusive, and no check of the purchase date: Apple's clock and ours may disagree a little.
                offer(.init(id: entitlement, active: now <= expires, expiresDate: expires, source: source, productId: transaction.productId,
                            environment: transaction.environment))
            case .consumable:
                continue
            }
        }
        for grant in promotional {
            offer(.init(id: grant.entitlement, active: grant.expiresDate.map { now < $0 } ?? true, expiresDate: grant.expiresDate,
                        source: "promotional", productId: "", environment: ""))
        }
        let owned = Set(transactions.map { $0.environment + "|" + $0.originalTransactionId })
        var views: [UserView.Subscription] = []
        for subscription in subscriptions where owned.contains(subscription.environment + "|" + subscription.originalTransactionId) {
            let state = state(subscription, now: now)
            views.append(.init(originalTransactionId: subscription.originalTransactionId, productId: subscription.productId, state: state,
                               expiresDate: subscription.expiresDate, autoRenewStatus: subscription.autoRenewStatus,
                               autoRenewProductId: subscription.autoRenewProductId, environment: subscription.environment,
                               priceIncreaseStatus: subscription.priceIncreaseStatus))
            // Grace keeps access; billing retry and expiry do not.
            if state == "grace_period", let grace = subscription.gracePeriodExpiresDate, let entitlement = mappings[subscription.productId]?.entitlement {
                offer(.init(id: entitlement, active: true, expiresDate: grace, source: ProductType.autoRenewable.rawValue,
                            productId: subscription.productId, environment: subscription.environment))
            }
        }
        return (entitlements.values.sorted { $0.id < $1.id }, views.sorted { $0.originalTransactionId < $1.originalTransactionId })
    }
}
