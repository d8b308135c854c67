import AppStoreModels
import Foundation

/// Win-back offers (2024): a discount for customers who subscribed, let the subscription lapse, and may
/// come back. Offered in the app (`Product.PurchaseOption.winBackOffer`), and by the App Store itself as a
/// streamlined purchase; redeemed ones are `offerType` 4.
extension AppStoreEmulator {
    /// `offerType` of a redeemed win-back offer.
    static let winBackOfferType = 4

    /// Which of `offers` the account may redeem now, best first (the catalog's order), as Apple decides by
    /// default: the customer paid for a subscription of the group (a free trial alone does not count, nor a
    /// refunded period), none of the group is active now, and the offer was never redeemed. `history` is the
    /// account's transactions of the group.
    static func eligible(_ offers: [PromotionalOffer], history: [TransactionRecord], now: Date) -> [PromotionalOffer] {
        let paid = history.contains { !$0.isTrialPeriod && $0.cancellationDate == nil && ($0.price.map { $0.amount != "0" } ?? true) }
        let active = history.contains { $0.cancellationDate == nil && ($0.expiresDate ?? .distantPast) > now }
        guard paid, !active else { return [] }
        let redeemed = Set(history.filter { $0.offerType == winBackOfferType }.compactMap(\.offerIdentifier))
        return offers.filter { !redeemed.contains($0.offerId) }
    }

    /// The account's transactions of `product`'s group in the app.
    static func groupHistory(_ state: EmulatorState, email: String, bundleId: String, environment: AppStoreEnvironment, group: String?) -> [TransactionRecord] {
        state.transactions(account: email, bundle: bundleId, environment: environment)
            .filter { group != nil && $0.subscriptionGroupId == group && !$0.isRedelivery && $0.state == .purchased }
    }

    /// The win-back offer `offerId` of `product` if the account may redeem it, else StoreKit's error.
    static func checkWinBackOffer(_ offerId: String, product: CatalogProduct, history: [TransactionRecord], now: Date) throws -> PromotionalOffer {
        guard let offer = product.winBackOffers.first(where: { $0.offerId == offerId }) else {
            throw StoreError.storeKit(.invalidOfferIdentifier, "\(product.productId) has no win-back offer \(offerId).", status: .badRequest)
        }
        guard eligible([offer], history: history, now: now).isEmpty == false else {
            throw StoreError.storeKit(.ineligibleForOffer, "The customer is not eligible for the win-back offer \(offerId): it needs a paid subscription of the group that has lapsed, and each offer is redeemed once.",
                                      status: .forbidden)
        }
        return offer
    }

    /// The App Store's streamlined purchase: the customer accepts a win-back offer outside the app; the
    /// subscription starts again with it (SUBSCRIBED, RESUBSCRIBE).
    public func redeemWinBackOffer(bundleId: String, email: String, productId: String, offerId: String) async throws -> TransactionRecord {
        try await mutate { state, changes, now in
            guard let account = state.accounts[email.lowercased()], !account.deleted else { throw StoreError.notFound("Account \(email)") }
            guard let product = state.product(bundleId, productId), product.type == .autoRenewable else {
                throw StoreError.notFound("Subscription \(productId) of \(bundleId)")
            }
            let history = Self.groupHistory(state, email: account.email, bundleId: bundleId, environment: account.environment, group: product.subscriptionGroupId)
            let offer = try Self.checkWinBackOffer(offerId, product: product, history: history, now: now)
            var record = AppStoreEmulator.storeSubscription(&state, account: account, product: product, bundleId: bundleId, now: now)
            if let existing = try AppStoreEmulator.subscribe(&state, &changes, record: &record, product: product, account: account, now: now) {
                return existing
            }
            AppStoreEmulator.apply(offer, to: &record, changes: &changes, rate: state.renewalRate(account, bundleId: bundleId), now: now,
                                   offerType: Self.winBackOfferType)
            state.insert(record)
            changes.transactions.insert(record.id)
            return record
        }
    }

    /// A subscription bought in the App Store itself (an offer code, a win-back offer): no device, purchased at once.
    static func storeSubscription(_ state: inout EmulatorState, account: Account, product: CatalogProduct, bundleId: String, now: Date) -> TransactionRecord {
        var record = TransactionRecord(
            id: state.nextTransactionId(account.environment), originalId: "", bundleId: bundleId, productId: product.productId,
            productType: .autoRenewable, accountEmail: account.email, deviceId: "", environment: account.environment,
            quantity: 1, purchaseDate: now, originalPurchaseDate: now, expiresDate: nil, webOrderLineItemId: nil,
            isTrialPeriod: false, isInIntroOfferPeriod: false, cancellationDate: nil, cancellationReason: nil, isUpgraded: false,
            state: .purchased, finished: false, error: nil, applicationUsername: nil, isRedelivery: false, isRenewal: false,
            price: product.price(for: account.storefront), subscriptionGroupId: product.subscriptionGroupId)
        record.originalId = record.id
        return record
    }

    /// `eligibleWinBackOfferIds` of a chain's renewal info: what its product offers the customer now, best first.
    func eligibleWinBackOfferIds(_ chain: SubscriptionChain, now: Date) -> [String] {
        state.withLock { state in
            guard let product = state.product(chain.bundleId, chain.autoRenewProductId), !product.winBackOffers.isEmpty else { return [] }
            let history = Self.groupHistory(state, email: chain.accountEmail, bundleId: chain.bundleId, environment: chain.environment,
                                            group: product.subscriptionGroupId)
            return Self.eligible(product.winBackOffers, history: history, now: now).map(\.offerId)
        }
    }
}
