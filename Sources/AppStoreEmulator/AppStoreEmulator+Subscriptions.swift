import AppStoreModels
import Foundation

extension AppStoreEmulator {
    /// The end of a subscription period that starts at `start`, at the account's renewal rate.
    static func periodEnd(from start: Date, period: SubscriptionPeriod, rate: RenewalRate, count: Int = 1) -> Date {
        // Catalogs bound offers to 1…12 periods; clamping here keeps any other caller from overflowing.
        let count = min(max(count, 0), 1200)
        if let seconds = rate.acceleratedSeconds(for: period) {
            return start.addingTimeInterval(Double(seconds * count))
        }
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        let components = period == .oneWeek ? DateComponents(day: 7 * count) : DateComponents(month: period.months * count)
        return calendar.date(byAdding: components, to: start) ?? start
    }

    /// Creates the renewal transactions due by `now` for every subscription that still auto-renews.
    /// Every operation asks (reads too): the walk over every chain is skipped while nothing it could act on has changed
    /// and the soonest expiry it saw is still ahead.
    func renewSubscriptions(_ state: inout EmulatorState, _ changes: inout Changes, now: Date) {
        if let quiet = state.renewalsQuiet, quiet.version == state.renewalInputsVersion, now < quiet.until { return }
        // The soonest moment a chain can next be due (a lapse in billing retry or a spent budget: now, so the next call walks).
        var soonest = Date.distantFuture
        defer { state.renewalsQuiet = (state.renewalInputsVersion, soonest) }
        // Family members' subscriptions renew with the purchaser's (below), never on their own.
        for (originalId, var chain) in state.chains where chain.autoRenewEnabled && chain.sharedFromOriginalId == nil {
            guard var latest = state.transactions[chain.latestTransactionId], let account = state.accounts[chain.accountEmail.lowercased()] else { continue }
            defer { if chain.autoRenewEnabled, let expires = latest.expiresDate { soonest = min(soonest, expires) } }
            var changed = false
            // At most this many periods per chain per pass: a long jump of the clock catches up over later passes
            // instead of holding the state lock for millions of renewals.
            var budget = 10_000
            while chain.autoRenewEnabled, budget > 0, let expires = latest.expiresDate, expires <= now {
                budget -= 1
                let rate = state.renewalRate(account, bundleId: chain.bundleId)
                // TestFlight renews six times, then turns auto-renew off; the sandbox as many times as its quirk says.
                let limit = rate == .testFlight ? RenewalRate.testFlightRenewals : state.quirks.sandboxMaxRenewals
                // During a commitment the subscription renews as it is; a change of product waits for the commitment's end.
                let midCommitment = latest.commitment?.continues == true
                let facts = SubscriptionLifecycle.Facts(
                    latestExpires: expires, accountDeleted: account.deleted, renewalRate: rate,
                    renewalLimitReached: chain.environment == .sandbox && chain.renewals >= limit,
                    gracePeriodDays: state.gracePeriodDays[chain.bundleId],
                    renewalProduct: state.product(chain.bundleId, midCommitment ? chain.productId : chain.autoRenewProductId),
                    latestCommitment: latest.commitment, latestPriceAmount: latest.price?.amount)
                let (next, actions) = SubscriptionLifecycle.periodEnded(chain, facts, now: now)
                changed = changed || next != chain || !actions.isEmpty
                chain = next
                var renewed = false
                for action in actions {
                    switch action {
                    case .notify(let type, let subtype):
                        changes.notify(type, subtype, latest)
                    case .renew(let productId, let start, let end, let isIntro, let priceAmount, let billingPlan, let commitment, let offer):
                        guard let product = state.product(chain.bundleId, productId) else { continue }
                        let id = state.nextTransactionId(chain.environment)
                        var renewal = TransactionRecord(
                            id: id, originalId: originalId, bundleId: chain.bundleId, productId: productId, productType: .autoRenewable,
                            accountEmail: chain.accountEmail, deviceId: chain.deviceId, environment: chain.environment, quantity: 1,
                            purchaseDate: start, originalPurchaseDate: latest.originalPurchaseDate, expiresDate: end,
                            webOrderLineItemId: state.nextWebOrderLineItemId(chain.environment), isTrialPeriod: false,
                            isInIntroOfferPeriod: isIntro, cancellationDate: nil, cancellationReason: nil, isUpgraded: false,
                            state: .purchased, finished: false, error: nil, applicationUsername: latest.applicationUsername,
                            isRedelivery: false, isRenewal: true, price: product.price(for: account.storefront),
                            subscriptionGroupId: product.subscriptionGroupId)
                        if let priceAmount, var price = renewal.price {
                            price.amount = priceAmount  // the consented price from this renewal on, or a commitment's installment
                            renewal.price = price
                        }
                        renewal.billingPlanType = billingPlan
                        renewal.commitment = commitment
                        if let offer {
                            renewal.offerType = offer.offerType
                            renewal.offerIdentifier = offer.offer.offerId
                            renewal.offerPeriod = offer.offer.period.times(offer.offer.numberOfPeriods)
                            renewal.offerDiscountType = offer.offer.paymentMode.discountType
                        }
                        state.insert(renewal)
                        changes.transactions.insert(id)
                        changes.notify(.didRenew, nil, renewal)
                        AppStoreEmulator.renewFamilyCopies(&state, &changes, purchaserOriginalId: originalId, renewal: renewal)
                        chain.latestTransactionId = id
                        latest = renewal
                        renewed = true
                    }
                }
                if !renewed { break }
            }
            if changed {
                state.chains[originalId] = chain
                changes.chains.insert(originalId)
            }
        }
        // Subscriptions that lapsed without renewing: one EXPIRED notification each.
        for (memberId, var member) in state.chains where member.autoRenewEnabled {
            guard let purchaser = member.sharedFromOriginalId, state.chains[purchaser]?.autoRenewEnabled == false else { continue }
            member.autoRenewEnabled = false
            member.expirationIntent = state.chains[purchaser]?.expirationIntent
            state.chains[memberId] = member
            changes.chains.insert(memberId)
        }
        for (originalId, var chain) in state.chains where !chain.autoRenewEnabled && chain.expiryNotified != true {
            guard let latest = state.transactions[chain.latestTransactionId], latest.cancellationDate == nil,
                  let expires = latest.expiresDate else { continue }
            guard expires <= now else {
                soonest = min(soonest, expires)
                continue
            }
            chain.expiryNotified = true
            state.chains[originalId] = chain
            changes.chains.insert(originalId)
            changes.notify(.expired, SubscriptionLifecycle.expiredSubtype(intent: chain.expirationIntent), latest)
        }
    }

    /// Renews every family member's copy of a subscription along with the purchaser's renewal.
    static func renewFamilyCopies(_ state: inout EmulatorState, _ changes: inout Changes, purchaserOriginalId: String, renewal: TransactionRecord) {
        for (memberOriginalId, var chain) in state.chains where chain.sharedFromOriginalId == purchaserOriginalId && chain.autoRenewEnabled {
            var copy = renewal
            copy.id = state.nextTransactionId(renewal.environment)
            copy.originalId = memberOriginalId
            copy.accountEmail = chain.accountEmail
            copy.deviceId = ""
            copy.applicationUsername = nil
            copy.appAccountToken = nil
            copy.sharedFromTransactionId = renewal.id
            copy.originalPurchaseDate = state.transactions[memberOriginalId]?.originalPurchaseDate ?? renewal.originalPurchaseDate
            copy.webOrderLineItemId = state.nextWebOrderLineItemId(renewal.environment)
            state.insert(copy)
            changes.transactions.insert(copy.id)
            chain.latestTransactionId = copy.id
            chain.renewals += 1
            state.chains[memberOriginalId] = chain
            changes.chains.insert(memberOriginalId)
            changes.notify(.didRenew, nil, copy)
        }
    }


    /// Turns a subscription's billing problem on (renewals fail into billing retry) or off (SKTestSession's
    /// "resolve issue": a subscription in retry recovers at once with a new period, DID_RENEW / BILLING_RECOVERY).
    public func setBillingIssue(originalTransactionId: String, failing: Bool) async throws -> SubscriptionChain {
        try await mutate { state, changes, now in
            guard var chain = state.chains[originalTransactionId], let latest = state.transactions[chain.latestTransactionId],
                  let account = state.accounts[chain.accountEmail.lowercased()] else {
                throw StoreError.notFound("Subscription \(originalTransactionId)")
            }
            chain.billingIssue = failing ? true : nil
            if !failing, chain.billingRetryStart != nil, chain.autoRenewEnabled,
               let product = state.product(chain.bundleId, chain.autoRenewProductId), let period = product.period {
                let id = state.nextTransactionId(chain.environment)
                var recovered = latest
                recovered.id = id
                recovered.productId = product.productId
                recovered.purchaseDate = now
                recovered.expiresDate = AppStoreEmulator.periodEnd(from: now, period: period, rate: state.renewalRate(account, bundleId: chain.bundleId))
                recovered.webOrderLineItemId = state.nextWebOrderLineItemId(chain.environment)
                recovered.isRenewal = true
                recovered.isTrialPeriod = false
                recovered.isInIntroOfferPeriod = false
                recovered.cancellationDate = nil
                recovered.cancellationReason = nil
                recovered.finished = false
                recovered.price = product.price(for: account.storefront)
                state.insert(recovered)
                changes.transactions.insert(id)
                chain.latestTransactionId = id
                chain.renewals += 1
                chain.expirationIntent = nil
                changes.notify(.didRenew, .billingRecovery, recovered)
            }
            if !failing {
                chain.billingRetryStart = nil
                chain.gracePeriodEnd = nil
            }
            state.chains[originalTransactionId] = chain
            changes.chains.insert(originalTransactionId)
            return chain
        }
    }

    /// A price increase needing consent (PRICE_INCREASE / PENDING), or the customer's consent to it
    /// (PRICE_INCREASE / ACCEPTED). Without consent the subscription lapses at its next renewal. With
    /// `needsConsent` false the increase is one Apple only announces (within its limits, or where the law
    /// allows): PRICE_INCREASE / ACCEPTED at once, `priceIncreaseStatus` 1, and renewals charge the new price.
    public func priceIncrease(originalTransactionId: String, amount: String?, consent: Bool, needsConsent: Bool = true) async throws -> SubscriptionChain {
        try await mutate { state, changes, _ in
            guard var chain = state.chains[originalTransactionId], let latest = state.transactions[chain.latestTransactionId] else {
                throw StoreError.notFound("Subscription \(originalTransactionId)")
            }
            if consent {
                guard chain.priceIncreaseAmount != nil else {
                    throw StoreError(.conflict, "no_price_increase", "Subscription \(originalTransactionId) has no price increase to consent to.")
                }
                chain.priceIncreaseConsented = true
                changes.notify(.priceIncrease, .accepted, latest)
            } else {
                guard let amount, Decimal(string: amount) != nil else { throw StoreError.invalid("The new price is a decimal amount, e.g. 5.99.") }
                chain.priceIncreaseAmount = amount
                chain.priceIncreaseConsented = !needsConsent
                changes.notify(.priceIncrease, needsConsent ? .pending : .accepted, latest)
            }
            state.chains[originalTransactionId] = chain
            changes.chains.insert(originalTransactionId)
            return chain
        }
    }

    /// Billing grace period for an app's subscriptions (nil: none), as set in App Store Connect.
    public func setGracePeriod(bundleId: String, days: Int?) async throws {
        try await mutate { state, changes, _ in
            guard state.apps[bundleId] != nil else { throw StoreError.notFound("App \(bundleId)") }
            if let days, ![3, 16, 28].contains(days) { throw StoreError.invalid("The grace period is 3, 16 or 28 days.") }
            state.gracePeriodDays[bundleId] = days
            changes.settings = true
        }
    }

    /// SKTestSession-style controls: renew now (the current period ends now and renews) or expire now.
    public func forceSubscription(originalTransactionId: String, expire: Bool) async throws -> SubscriptionChain {
        try await mutate { state, changes, now in
            guard var chain = state.chains[originalTransactionId], var latest = state.transactions[chain.latestTransactionId] else {
                throw StoreError.notFound("Subscription \(originalTransactionId)")
            }
            if expire {
                chain.autoRenewEnabled = false
                chain.expirationIntent = 1
                state.chains[originalTransactionId] = chain
                changes.chains.insert(originalTransactionId)
            }
            latest.expiresDate = now
            state.update(latest)
            changes.transactions.insert(latest.id)
            renewSubscriptions(&state, &changes, now: now)
            return state.chains[originalTransactionId] ?? chain
        }
    }

    /// Apple reverses a refund: the transaction counts again (REFUND_REVERSED).
    public func reverseRefund(transactionId: String) async throws -> TransactionRecord {
        try await mutate { state, changes, _ in
            guard var record = state.transactions[transactionId], record.cancellationDate != nil else {
                throw StoreError(.conflict, "not_refunded", "Transaction \(transactionId) is not refunded.")
            }
            record.cancellationDate = nil
            record.cancellationReason = nil
            record.refundPercentage = nil
            state.update(record)
            changes.transactions.insert(transactionId)
            changes.notify(.refundReversed, nil, record)
            return record
        }
    }

    /// `pending_renewal_info` for one chain.
    static func pendingRenewalInfo(_ chain: SubscriptionChain) -> PendingRenewalInfo {
        let retrying = chain.billingRetryStart != nil
        return PendingRenewalInfo(autoRenewProductId: chain.autoRenewProductId, autoRenewStatus: chain.autoRenewEnabled ? "1" : "0",
                                  productId: chain.productId, originalTransactionId: chain.originalTransactionId,
                                  expirationIntent: chain.autoRenewEnabled && !retrying ? nil : chain.expirationIntent.map { String($0) },
                                  isInBillingRetryPeriod: retrying ? "1" : (chain.autoRenewEnabled ? nil : "0"),
                                  gracePeriodExpiresDate: chain.gracePeriodEnd.map(ReceiptDateTriple.init))
    }

    /// The customer changes how the subscription renews (`renewalBillingPlanType`): monthly over a new 12-month
    /// commitment, or up front. It applies at the next renewal, after the current commitment's last installment.
    public func setRenewalBillingPlan(originalTransactionId: String, plan: BillingPlan.Kind) async throws -> SubscriptionChain {
        try await mutate { state, changes, _ in
            guard var chain = state.chains[originalTransactionId] else { throw StoreError.notFound("Subscription \(originalTransactionId)") }
            guard let product = state.product(chain.bundleId, chain.autoRenewProductId), !product.billingPlans.isEmpty else {
                throw StoreError(.conflict, "no_billing_plans", "\(chain.autoRenewProductId) has no billing plans.")
            }
            guard plan == .billedUpfront || product.billingPlan(plan) != nil else {
                throw StoreError.invalid("\(product.productId) has no \(plan.rawValue) billing plan.", code: "invalid_billing_plan")
            }
            chain.renewalBillingPlanType = plan
            state.chains[originalTransactionId] = chain
            changes.chains.insert(originalTransactionId)
            return chain
        }
    }

    /// Turns auto-renew of a subscription on or off (what the customer does in Settings).
    public func setAutoRenew(originalTransactionId: String, enabled: Bool) async throws -> SubscriptionChain {
        try await mutate { state, changes, _ in
            guard var chain = state.chains[originalTransactionId] else { throw StoreError.notFound("Subscription \(originalTransactionId)") }
            // During a commitment the customer can only stop the next one: the installments left are still charged.
            if chain.autoRenewEnabled, let latest = state.transactions[chain.latestTransactionId], latest.commitment?.continues == true,
               latest.cancellationDate == nil {
                let changed = (chain.commitmentAutoRenew ?? true) != enabled
                chain.commitmentAutoRenew = enabled ? nil : false
                state.chains[originalTransactionId] = chain
                changes.chains.insert(originalTransactionId)
                if changed { changes.notify(.didChangeRenewalStatus, enabled ? .autoRenewEnabled : .autoRenewDisabled, latest) }
                return chain
            }
            let changed = chain.autoRenewEnabled != enabled
            chain.autoRenewEnabled = enabled
            chain.expirationIntent = enabled ? nil : 1
            if !enabled { chain.pendingOffer = nil }  // no next renewal for an offer to start with
            state.chains[originalTransactionId] = chain
            changes.chains.insert(originalTransactionId)
            if changed, let latest = state.transactions[chain.latestTransactionId] {
                changes.notify(.didChangeRenewalStatus, enabled ? .autoRenewEnabled : .autoRenewDisabled, latest)
            }
            return chain
        }
    }
}
