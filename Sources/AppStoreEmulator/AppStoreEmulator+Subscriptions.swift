import AppStoreModels
import Foundation

extension AppStoreEmulator {
    /// The end of a subscription period that starts at `start`, at the account's renewal rate.
    static func periodEnd(from start: Date, period: SubscriptionPeriod, rate: RenewalRate, count: Int = 1) -> Date {
        if let seconds = rate.acceleratedSeconds(for: period) {
            return start.addingTimeInterval(Double(seconds * count))
        }
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        let components = period == .oneWeek ? DateComponents(day: 7 * count) : DateComponents(month: period.months * count)
        return calendar.date(byAdding: components, to: start) ?? start
    }

    /// Creates the renewal transactions due by `now` for every subscription that still auto-renews.
    func renewSubscriptions(_ state: inout EmulatorState, _ changes: inout Changes, now: Date) {
        for (originalId, var chain) in state.chains where chain.autoRenewEnabled {
            guard var latest = state.transactions[chain.latestTransactionId], let account = state.accounts[chain.accountEmail.lowercased()] else { continue }
            var changed = false
            while chain.autoRenewEnabled, let expires = latest.expiresDate, expires <= now {
                if account.deleted {
                    chain.autoRenewEnabled = false
                    chain.expirationIntent = 5
                    changed = true
                    break
                }
                if chain.environment == .sandbox && chain.renewals >= state.quirks.sandboxMaxRenewals {
                    chain.autoRenewEnabled = false
                    chain.expirationIntent = 1
                    changed = true
                    break
                }
                guard let product = state.product(chain.bundleId, chain.autoRenewProductId), product.type == .autoRenewable,
                      let period = product.period else {
                    chain.autoRenewEnabled = false
                    chain.expirationIntent = 4
                    changed = true
                    break
                }
                var isIntro = false
                var renewalPeriod = period
                if chain.introPeriodsRemaining > 0, let offer = product.introductoryOffer, offer.paymentMode == .payAsYouGo {
                    isIntro = true
                    renewalPeriod = offer.period
                    chain.introPeriodsRemaining -= 1
                }
                let id = state.nextTransactionId(chain.environment)
                let renewal = TransactionRecord(
                    id: id, originalId: originalId, bundleId: chain.bundleId, productId: product.productId, productType: .autoRenewable,
                    accountEmail: chain.accountEmail, deviceId: chain.deviceId, environment: chain.environment, quantity: 1,
                    purchaseDate: expires, originalPurchaseDate: latest.originalPurchaseDate,
                    expiresDate: AppStoreEmulator.periodEnd(from: expires, period: renewalPeriod, rate: account.renewalRate),
                    webOrderLineItemId: state.nextWebOrderLineItemId(chain.environment), isTrialPeriod: false,
                    isInIntroOfferPeriod: isIntro, cancellationDate: nil, cancellationReason: nil, isUpgraded: false,
                    state: .purchased, finished: false, error: nil, applicationUsername: latest.applicationUsername,
                    isRedelivery: false, isRenewal: true, price: product.price(for: account.storefront),
                    subscriptionGroupId: product.subscriptionGroupId)
                state.insert(renewal)
                changes.transactions.insert(id)
                changes.notify("DID_RENEW", nil, renewal)
                chain.renewals += 1
                chain.productId = product.productId
                chain.latestTransactionId = id
                latest = renewal
                changed = true
            }
            if changed {
                state.chains[originalId] = chain
                changes.chains.insert(originalId)
            }
        }
        // Subscriptions that lapsed without renewing: one EXPIRED notification each.
        for (originalId, var chain) in state.chains where !chain.autoRenewEnabled && chain.expiryNotified != true {
            guard let latest = state.transactions[chain.latestTransactionId], latest.cancellationDate == nil,
                  let expires = latest.expiresDate, expires <= now else { continue }
            chain.expiryNotified = true
            state.chains[originalId] = chain
            changes.chains.insert(originalId)
            let subtype: String? = switch chain.expirationIntent {
            case 1: "VOLUNTARY"
            case 2: "BILLING_RETRY"
            case 3: "PRICE_INCREASE"
            case 4: "PRODUCT_NOT_FOR_SALE"
            default: nil
            }
            changes.notify("EXPIRED", subtype, latest)
        }
    }

    /// `pending_renewal_info` for one chain.
    static func pendingRenewalInfo(_ chain: SubscriptionChain) -> PendingRenewalInfo {
        PendingRenewalInfo(autoRenewProductId: chain.autoRenewProductId, autoRenewStatus: chain.autoRenewEnabled ? "1" : "0",
                           productId: chain.productId, originalTransactionId: chain.originalTransactionId,
                           expirationIntent: chain.autoRenewEnabled ? nil : chain.expirationIntent.map { String($0) },
                           isInBillingRetryPeriod: chain.autoRenewEnabled ? nil : "0")
    }

    /// Turns auto-renew of a subscription on or off (what the customer does in Settings).
    public func setAutoRenew(originalTransactionId: String, enabled: Bool) async throws -> SubscriptionChain {
        try await mutate { state, changes, _ in
            guard var chain = state.chains[originalTransactionId] else { throw StoreError.notFound("Subscription \(originalTransactionId)") }
            let changed = chain.autoRenewEnabled != enabled
            chain.autoRenewEnabled = enabled
            chain.expirationIntent = enabled ? nil : 1
            state.chains[originalTransactionId] = chain
            changes.chains.insert(originalTransactionId)
            if changed, let latest = state.transactions[chain.latestTransactionId] {
                changes.notify("DID_CHANGE_RENEWAL_STATUS", enabled ? "AUTO_RENEW_ENABLED" : "AUTO_RENEW_DISABLED", latest)
            }
            return chain
        }
    }
}
