import AppStoreModels
import Foundation

/// The lifecycle of an auto-renewable subscription as a value, like the payment state machine: a chain,
/// the facts around it and the time in; the chain as it becomes and what the emulator must do out
/// (notify, charge a renewal). No state, no clock, no I/O: `renewSubscriptions` gathers the facts and
/// applies the actions, and `SubscriptionLifecycleTests` checks each rule as a table row.
enum SubscriptionLifecycle {
    /// What a period end depends on besides the chain.
    struct Facts: Sendable, Equatable {
        /// When the chain's latest period ends (or ended).
        var latestExpires: Date
        var accountDeleted: Bool
        var renewalRate: RenewalRate
        /// Sandbox only: the chain has renewed as often as the sandbox allows.
        var renewalLimitReached: Bool
        /// The app's billing grace period, when it offers one.
        var gracePeriodDays: Int?
        /// The product the chain renews into (its auto-renew preference; the current one during a commitment), when the catalog still sells it.
        var renewalProduct: CatalogProduct?
        /// Where the latest transaction stands in its 12-month commitment, when it was paid on a monthly plan.
        var latestCommitment: Commitment? = nil
        /// The latest transaction's price (a commitment's installments keep it).
        var latestPriceAmount: String? = nil
    }

    /// What the emulator must do.
    enum Action: Sendable, Equatable {
        /// A notification about the chain's latest transaction.
        case notify(NotificationType, NotificationSubtype?)
        /// Charge the next period: a renewal transaction of `productId` for [start, end); `priceAmount`
        /// is a consented price increase that applies from this renewal on.
        case renew(productId: String, start: Date, end: Date, isIntro: Bool, priceAmount: String?,
                   billingPlan: BillingPlan.Kind? = nil, commitment: Commitment? = nil, offer: PendingOffer? = nil)
    }

    /// The chain's latest period has ended (`facts.latestExpires <= now`) while it auto-renews: it renews,
    /// fails into billing retry (with grace when the app offers it), or stops renewing with the reason
    /// Apple gives (`expirationIntent`: 1 the customer or the sandbox limit, 2 billing, 3 a price increase
    /// not consented to, 4 not for sale, 5 the account is gone). At most one renewal per call.
    static func periodEnded(_ chain: SubscriptionChain, _ facts: Facts, now: Date) -> (chain: SubscriptionChain, actions: [Action]) {
        var chain = chain
        let expires = facts.latestExpires
        func stop(_ intent: Int) -> (chain: SubscriptionChain, actions: [Action]) {
            chain.autoRenewEnabled = false
            chain.expirationIntent = intent
            return (chain, [])
        }
        if facts.accountDeleted { return stop(5) }
        if facts.renewalLimitReached { return stop(1) }
        if chain.billingIssue == true {
            // The charge fails: billing retry for up to 60 days (scaled like every period), with grace if the app offers it.
            var actions: [Action] = []
            if chain.billingRetryStart == nil {
                chain.billingRetryStart = expires
                chain.expirationIntent = 2
                chain.graceExpiryNotified = nil
                if let days = facts.gracePeriodDays { chain.gracePeriodEnd = expires.addingTimeInterval(scaledDays(days, rate: facts.renewalRate)) }
                actions.append(.notify(.didFailToRenew, chain.gracePeriodEnd == nil ? nil : .gracePeriod))
            }
            if let end = chain.gracePeriodEnd, end <= now, chain.graceExpiryNotified != true {
                chain.graceExpiryNotified = true
                actions.append(.notify(.gracePeriodExpired, nil))
            }
            if let start = chain.billingRetryStart, now >= start.addingTimeInterval(scaledDays(60, rate: facts.renewalRate)) {
                // Retry ends: the expiry pass sends EXPIRED / BILLING_RETRY.
                chain.autoRenewEnabled = false
                chain.billingRetryStart = nil
                chain.gracePeriodEnd = nil
            }
            return (chain, actions)
        }
        // A commitment's installments are agreed: a price increase waits for the commitment's end.
        let midCommitment = facts.latestCommitment?.continues == true
        if !midCommitment, chain.priceIncreaseAmount != nil, chain.priceIncreaseConsented != true {
            // The customer never agreed to the higher price: the subscription lapses (EXPIRED / PRICE_INCREASE).
            chain.priceIncreaseAmount = nil
            return stop(3)
        }
        guard let product = facts.renewalProduct, product.type == .autoRenewable, let period = product.period else { return stop(4) }
        var isIntro = false
        var renewalPeriod = period
        // Billing plans: a commitment's installments go on to the last one (the customer agreed to all twelve); at its
        // end the subscription renews on the plan the customer chose, or stops if they turned auto-renew off meanwhile.
        var billingPlan = chain.renewalBillingPlanType
        var commitment: Commitment?
        var installmentAmount: String?
        if let current = facts.latestCommitment, current.continues {
            billingPlan = .monthly
            commitment = current.next
            renewalPeriod = .oneMonth
            installmentAmount = facts.latestPriceAmount
        } else {
            if facts.latestCommitment != nil, chain.commitmentAutoRenew == false {
                chain.commitmentAutoRenew = nil
                return stop(1)
            }
            chain.commitmentAutoRenew = nil
            if billingPlan == .monthly {
                if let plan = product.billingPlan(.monthly) {
                    commitment = Commitment.starting(at: expires, plan: plan, rate: facts.renewalRate)
                    renewalPeriod = .oneMonth
                    installmentAmount = plan.amount
                } else {
                    billingPlan = .billedUpfront  // the plan was withdrawn: the subscription renews up front
                    chain.renewalBillingPlanType = .billedUpfront
                }
            }
        }
        if commitment == nil, chain.introPeriodsRemaining > 0, let offer = product.introductoryOffer, offer.paymentMode == .payAsYouGo {
            isIntro = true
            renewalPeriod = offer.period
            chain.introPeriodsRemaining -= 1
        }
        // An offer redeemed for this product while subscribed (an offer code, a downgrade with an offer) starts now.
        var offer: PendingOffer?
        var periods = 1
        if commitment == nil, let pending = chain.pendingOffer, pending.productId == product.productId {
            offer = pending
            isIntro = false
            renewalPeriod = pending.offer.period
            periods = pending.offer.paymentMode == .payAsYouGo ? 1 : max(1, pending.offer.numberOfPeriods)
        }
        // Used, or about another product than the one renewed into: gone either way.
        chain.pendingOffer = nil
        var consentedPrice: String?
        if !midCommitment {
            consentedPrice = chain.priceIncreaseAmount
            chain.priceIncreaseAmount = nil
            chain.priceIncreaseConsented = nil
        }
        chain.renewals += 1
        chain.productId = product.productId
        let end = midCommitment ? commitment!.installmentEnd(after: expires, rate: facts.renewalRate)
            : AppStoreEmulator.periodEnd(from: expires, period: renewalPeriod, rate: facts.renewalRate, count: periods)
        let price = offer.map { $0.offer.amount ?? "0" } ?? installmentAmount ?? consentedPrice
        return (chain, [.renew(productId: product.productId, start: expires, end: end, isIntro: isIntro, priceAmount: price,
                               billingPlan: billingPlan, commitment: commitment, offer: offer)])
    }

    /// The EXPIRED subtype for a chain that stopped renewing, from its `expirationIntent`.
    static func expiredSubtype(intent: Int?) -> NotificationSubtype? {
        switch intent {
        case 1: .voluntary
        case 2: .billingRetry
        case 3: .priceIncrease
        case 4: .productNotForSale
        default: nil
        }
    }

    /// `days` of real time at the account's renewal rate (a 30-day month lasts what a monthly period lasts).
    static func scaledDays(_ days: Int, rate: RenewalRate) -> TimeInterval {
        rate.acceleratedSeconds(for: .oneMonth).map { Double($0) * Double(days) / 30 } ?? Double(days) * 86_400
    }
}
