import Clocks
import AppStoreCrypto
import AppStoreModels
import Foundation

/// A product as `SKProductsRequest` returns it.
public struct StoreProduct: Codable, Sendable, Equatable {
    public var productIdentifier: String
    public var type: ProductType
    public var localizedTitle: String
    public var localizedDescription: String
    public var price: String
    public var currencyCode: String
    public var storefront: String
    public var subscriptionPeriod: SubscriptionPeriod?
    public var subscriptionGroupIdentifier: String?
    public var introductoryOffer: IntroductoryOffer?
    public var isFamilyShareable: Bool
}

/// The answer of a products request: valid products and the identifiers that are not for sale.
public struct ProductsResponse: Codable, Sendable, Equatable {
    public var products: [StoreProduct]
    public var invalidProductIdentifiers: [String]
}

/// What a device asks for when adding a payment.
public struct PaymentRequest: Codable, Sendable {
    public var productId: String
    public var quantity: Int?
    public var applicationUsername: String?
    /// `cancel` (the customer taps Cancel) or `fail` (a payment error), for testing.
    public var simulate: String?
    /// StoreKit 2's purchase option: the app's UUID for the customer, carried in signed transactions.
    public var appAccountToken: String?
    /// A promotional offer signed by the developer's server (SKPaymentDiscount / `.promotionalOffer`).
    public var promotionalOffer: SignedOffer?
    /// StoreKit 2's `.winBackOffer(_:)`: the id of one of the product's win-back offers.
    public var winBackOfferId: String?
    /// `.promotionalOffer(_:compactJWS:)`: a promotional offer signed as a JWS (2025), instead of `promotionalOffer`.
    public var promotionalOfferJWS: String?
    /// `.introductoryOfferEligibility(compactJWS:)`: the developer's signed word on introductory-offer eligibility.
    public var introductoryOfferEligibilityJWS: String?
    /// How the customer pays a subscription with billing plans (`BILLED_UPFRONT`, `MONTHLY`); nil: up front.
    public var billingPlanType: String?

    /// The signed offer as the app passes it: offer id, key id, nonce (UUID), timestamp (ms), Base64 DER ECDSA signature.
    public struct SignedOffer: Codable, Sendable {
        public var offerId: String
        public var keyId: String
        public var nonce: String
        public var timestamp: Int64
        public var signature: String

        public init(offerId: String, keyId: String, nonce: String, timestamp: Int64, signature: String) {
            self.offerId = offerId
            self.keyId = keyId
            self.nonce = nonce
            self.timestamp = timestamp
            self.signature = signature
        }
    }

    public init(productId: String, quantity: Int? = nil, applicationUsername: String? = nil, simulate: String? = nil) {
        self.productId = productId
        self.quantity = quantity
        self.applicationUsername = applicationUsername
        self.simulate = simulate
    }
}

extension AppStoreEmulator {
    /// `SKProductsRequest`: the products of `ids` sellable in the device's environment, and the invalid ones.
    public func products(bundleId: String, deviceId: String, ids: [String]) async throws -> ProductsResponse {
        try await read { state, _ in
            let (_, signedIn) = try AppStoreEmulator.device(deviceId, in: state)
            let account = state.shopper(signedIn, bundleId: bundleId)  // the app's test storefront and locale, if it sets them
            guard let app = state.apps[bundleId] else { throw StoreError.notFound("App \(bundleId)") }
            // The app's .storekit file switched Xcode's "Load Products" error on: the request fails as StoreKit's would.
            if let error = app.testSettings?.simulatedError(for: .loadProducts) { throw StoreError.simulated(error, api: .loadProducts) }
            var products: [StoreProduct] = []
            var invalid: [String] = []
            var seen: Set<String> = []
            for id in ids where seen.insert(id).inserted {
                guard let product = app.products.first(where: { $0.productId == id }),
                      product.reviewState.isPurchasable(in: account.environment, clearedForSale: product.clearedForSale) else {
                    invalid.append(id)
                    continue
                }
                products.append(AppStoreEmulator.storeProduct(product, account: account))
            }
            return ProductsResponse(products: products, invalidProductIdentifiers: invalid)
        }
    }

    static func storeProduct(_ product: CatalogProduct, account: Account) -> StoreProduct {
        let price = product.price(for: account.storefront)
        let localization = product.localization(for: account.locale)
        return StoreProduct(productIdentifier: product.productId, type: product.type,
                            localizedTitle: localization?.displayName ?? product.referenceName,
                            localizedDescription: localization?.description ?? "", price: price?.amount ?? "0",
                            currencyCode: price?.currency ?? "USD", storefront: price?.storefront ?? account.storefront,
                            subscriptionPeriod: product.period, subscriptionGroupIdentifier: product.subscriptionGroupId,
                            introductoryOffer: product.introductoryOffer, isFamilyShareable: product.familyShareable)
    }

    /// `SKPaymentQueue.add(_:)`: runs the payment to its first settled state and records it.
    public func addPayment(bundleId: String, deviceId: String, request: PaymentRequest) async throws -> TransactionRecord {
        let quantity = request.quantity ?? 1
        guard (1...10).contains(quantity) else {
            throw StoreError.storeKit(.paymentInvalid, "Quantity must be between 1 and 10.", status: .badRequest)
        }
        if let name = request.applicationUsername, name.utf8.count > 256 {
            throw StoreError.storeKit(.paymentInvalid, "applicationUsername is longer than 256 bytes.", status: .badRequest)
        }
        return try await mutate { state, changes, now in
            let (device, signedIn) = try AppStoreEmulator.device(deviceId, in: state)
            let account = state.shopper(signedIn, bundleId: bundleId)  // the app's test storefront and locale, if it sets them
            guard device.canMakePayments else {
                throw StoreError.storeKit(.paymentNotAllowed, "In-app purchases are restricted on this device.", status: .forbidden)
            }
            guard let app = state.apps[bundleId] else { throw StoreError.notFound("App \(bundleId)") }
            guard let product = app.products.first(where: { $0.productId == request.productId }),
                  product.reviewState.isPurchasable(in: account.environment, clearedForSale: product.clearedForSale) else {
                throw StoreError.storeKit(.storeProductNotAvailable, "Product \(request.productId) is not available in this store.", status: .notFound)
            }
            if product.type != .consumable && quantity != 1 {
                throw StoreError.storeKit(.paymentInvalid, "Only consumables can be bought in quantities above 1.", status: .badRequest)
            }
            let environment = account.environment
            let existing = state.transactions(account: account.email, bundle: bundleId, environment: environment)
            let offer = try request.promotionalOffer.map { try AppStoreEmulator.checkPromotionalOffer($0, request: request, product: product, bundleId: bundleId,
                                                                                                    keys: state.apiKeys, history: existing) }
            if [request.promotionalOffer != nil, request.promotionalOfferJWS != nil, request.winBackOfferId != nil].filter({ $0 }).count > 1 {
                throw StoreError.storeKit(.paymentInvalid, "A purchase takes one offer: a promotional or a win-back offer.", status: .badRequest)
            }
            let signedOffer = try request.promotionalOfferJWS.map {
                try AppStoreEmulator.checkSignedPromotionalOffer($0, product: product, account: account, app: app, keys: state.apiKeys, history: existing)
            }
            let introEligibility = try request.introductoryOfferEligibilityJWS.map {
                try AppStoreEmulator.checkIntroductoryEligibility($0, product: product, account: account, app: app, keys: state.apiKeys, history: existing)
            }
            let winBack = try request.winBackOfferId.map { id in
                try AppStoreEmulator.checkWinBackOffer(id, product: product, history: AppStoreEmulator.groupHistory(
                    state, email: account.email, bundleId: bundleId, environment: environment, group: product.subscriptionGroupId), now: now)
            }
            let billingPlan = try AppStoreEmulator.billingPlan(request.billingPlanType, product: product)
            if billingPlan?.type == .monthly, offer != nil || signedOffer != nil || winBack != nil {
                throw StoreError.storeKit(.paymentInvalid, "A monthly billing plan is bought without an offer.", status: .badRequest)
            }
            if offer != nil || signedOffer != nil, AppStoreEmulator.inCommitment(state, email: account.email, bundleId: bundleId, group: product.subscriptionGroupId, now: now) {
                throw StoreError.storeKit(.ineligibleForOffer, "Offers do not apply to a subscription paid monthly over a commitment.", status: .forbidden)
            }
            var machine = PaymentStateMachine()

            // Already owned non-consumables and free subscriptions are delivered again without a charge.
            if product.type == .nonConsumable || product.type == .freeSubscription,
               let owned = existing.first(where: { $0.productId == product.productId && $0.state == .purchased && !$0.isRedelivery && $0.cancellationDate == nil }) {
                var redelivery = owned
                redelivery.id = state.nextTransactionId(environment)
                redelivery.purchaseDate = now
                redelivery.deviceId = device.id
                redelivery.finished = false
                redelivery.isRedelivery = true
                redelivery.price = nil
                redelivery.applicationUsername = request.applicationUsername
                state.insert(redelivery)
                changes.transactions.insert(redelivery.id)
                return redelivery
            }

            var record = TransactionRecord(
                id: state.nextTransactionId(environment), originalId: "", bundleId: bundleId, productId: product.productId,
                productType: product.type, accountEmail: account.email, deviceId: device.id, environment: environment,
                quantity: quantity, purchaseDate: now, originalPurchaseDate: now, expiresDate: nil, webOrderLineItemId: nil,
                isTrialPeriod: false, isInIntroOfferPeriod: false, cancellationDate: nil, cancellationReason: nil, isUpgraded: false,
                state: .purchasing, finished: false, error: nil, applicationUsername: request.applicationUsername,
                isRedelivery: false, isRenewal: false, price: product.price(for: account.storefront),
                subscriptionGroupId: product.subscriptionGroupId, appAccountToken: request.appAccountToken)
            record.originalId = record.id
            record.billingPlanType = billingPlan?.type  // kept while a parent decides (Ask to Buy)

            let event: PaymentStateMachine.Event
            // The app's StoreKit Testing switches (a .storekit file's settings): every purchase fails, or waits for approval.
            let settings = app.testSettings
            // A simulated verification error lets the purchase through; what the device is handed then fails to verify.
            let simulated = settings?.simulatedError(for: .purchase).flatMap { $0.isVerification ? nil : $0 }
            switch request.simulate?.lowercased() ?? "" {
            case "cancel": event = .cancelledByUser
            case "fail": event = .failed(.unknown)
            case "":
                if let simulated {
                    event = simulated == .userCancelled ? .cancelledByUser : .failed(simulated.skError)
                } else if settings?.failTransactionsEnabled == true {
                    event = .failed(.unknown)
                } else if settings?.interruptedPurchasesEnabled == true {
                    event = .needsApproval
                    record.interrupted = true
                } else {
                    event = account.askToBuy || settings?.askToBuyEnabled == true ? .needsApproval : .charged
                }
            case let other: throw StoreError.invalid("Unknown simulate value '\(other)'; use cancel or fail.")
            }
            let action = try machine.handle(event)
            record.state = machine.state
            if case .reportFailure(let code) = action { record.error = code }

            if record.state == .purchased, product.type == .autoRenewable {
                if let existing = try AppStoreEmulator.subscribe(&state, &changes, record: &record, product: product, account: account, now: now,
                                                                 introductoryOffer: introEligibility, billingPlan: billingPlan) {
                    // A promotional offer with a downgrade (or for the current product) starts at the next renewal.
                    if let offer = offer ?? signedOffer { AppStoreEmulator.deferOffer(offer, offerType: 2, &state, &changes, subscription: existing) }
                    return existing
                }
                if let offer = offer ?? signedOffer {
                    AppStoreEmulator.apply(offer, to: &record, changes: &changes, rate: state.renewalRate(account, bundleId: bundleId), now: now)
                } else if let winBack {
                    AppStoreEmulator.apply(winBack, to: &record, changes: &changes, rate: state.renewalRate(account, bundleId: bundleId), now: now,
                                           offerType: AppStoreEmulator.winBackOfferType)
                }
            }
            state.insert(record)
            changes.transactions.insert(record.id)
            if record.state == .purchased, product.type != .autoRenewable { changes.notify(.oneTimeCharge, nil, record) }
            if record.state == .purchased { AppStoreEmulator.shareWithFamily(&state, &changes, record, now: now) }
            return record
        }
    }

    /// The billing plan a purchase names, checked against the product's (nil: up front, the plan every product has).
    static func billingPlan(_ name: String?, product: CatalogProduct) throws -> BillingPlan? {
        guard let name else {
            return product.billingPlans.isEmpty ? nil : .upFront(product)
        }
        guard let kind = BillingPlan.Kind(loose: name) else {
            throw StoreError.storeKit(.paymentInvalid, "billingPlanType is BILLED_UPFRONT or MONTHLY.", status: .badRequest)
        }
        if kind == .billedUpfront { return .upFront(product) }
        guard product.type == .autoRenewable, let plan = product.billingPlan(kind) else {
            throw StoreError.storeKit(.paymentInvalid, "\(product.productId) has no \(kind.rawValue) billing plan.", status: .badRequest)
        }
        return plan
    }

    /// Checks a promotional offer as StoreKit does: a known offer of the product, signed by one of the app's
    /// keys over bundleId⁣keyId⁣productId⁣offerId⁣appAccountToken⁣nonce⁣timestamp (U+2063 between), at most
    /// 24 hours old, for a customer who has subscribed in the group before.
    static func checkPromotionalOffer(_ signed: PaymentRequest.SignedOffer, request: PaymentRequest, product: CatalogProduct, bundleId: String,
                                      keys: [String: ServerAPIKey], history: [TransactionRecord]) throws -> PromotionalOffer {
        guard product.type == .autoRenewable, let offer = product.promotionalOffers.first(where: { $0.offerId == signed.offerId }) else {
            throw StoreError.storeKit(.invalidOfferIdentifier, "Offer \(signed.offerId) is not an offer of \(product.productId).", status: .badRequest)
        }
        let username = (request.appAccountToken ?? request.applicationUsername ?? "").lowercased()
        let message = [bundleId, signed.keyId, product.productId, signed.offerId, username, signed.nonce.lowercased(), String(signed.timestamp)]
            .joined(separator: "\u{2063}")
        guard let key = keys[signed.keyId], key.bundleId == bundleId, let publicKey = try? PublicKey(pem: key.publicKey),
              let signature = Data(base64Encoded: signed.signature),
              publicKey.isValidSignature([UInt8](signature), for: Array(message.utf8), digest: .sha256) else {
            throw StoreError.storeKit(.invalidSignature, "The offer's signature does not verify with key \(signed.keyId).", status: .badRequest)
        }
        // The developer's server signs with its own wall clock, not the emulator's (which tests move by days),
        // so the 24-hour window is judged on the system clock, as Apple judges it on its own.
        let age = SystemClock().now().timeIntervalSince1970 * 1000 - Double(signed.timestamp)
        guard abs(age) <= 24 * 3_600_000 else {
            throw StoreError.storeKit(.invalidSignature, "The offer's signature is older than 24 hours.", status: .badRequest)
        }
        guard history.contains(where: { $0.productType == .autoRenewable && $0.subscriptionGroupId == product.subscriptionGroupId && $0.state == .purchased }) else {
            throw StoreError.storeKit(.ineligibleForOffer, "Promotional offers are for current and former subscribers of the group.", status: .forbidden)
        }
        return offer
    }

    /// The first period(s) of a subscription bought with a promotional offer (type 2) or an offer code (type 3).
    static func apply(_ offer: PromotionalOffer, to record: inout TransactionRecord, changes: inout Changes, rate: RenewalRate, now: Date,
                      offerType: Int = 2) {
        record.offerType = offerType
        record.offerIdentifier = offer.offerId
        record.offerPeriod = offer.period.times(offer.numberOfPeriods)
        record.offerDiscountType = offer.paymentMode.discountType
        record.isTrialPeriod = false
        record.isInIntroOfferPeriod = false
        record.expiresDate = periodEnd(from: now, period: offer.period, rate: rate, count: offer.paymentMode == .payAsYouGo ? 1 : max(1, offer.numberOfPeriods))
        if var price = record.price {
            price.amount = offer.amount ?? "0"
            record.price = price
        }
        // An offer redeemed on an active subscription is OFFER_REDEEMED (on a lapsed one Apple reports SUBSCRIBED).
        if let index = changes.notifications.lastIndex(where: { $0.transactionId == record.id && $0.type == .didChangeRenewalPref }) {
            changes.notifications[index].type = .offerRedeemed
        }
    }

    /// Whether the customer's subscription of `group` is now paid monthly over a commitment (its latest transaction an installment).
    static func inCommitment(_ state: EmulatorState, email: String, bundleId: String, group: String?, now: Date) -> Bool {
        state.chains.values.contains { chain in
            guard chain.accountEmail.lowercased() == email.lowercased(), chain.bundleId == bundleId, chain.subscriptionGroupId == group,
                  let latest = state.transactions[chain.latestTransactionId] else { return false }
            return latest.commitment != nil && (latest.expiresDate ?? .distantPast) > now && latest.cancellationDate == nil
        }
    }

    /// Keeps an offer for a subscription's next renewal: OFFER_REDEEMED, with DOWNGRADE when it comes with one
    /// (instead of DID_CHANGE_RENEWAL_PREF), without a subtype for the current product.
    static func deferOffer(_ offer: PromotionalOffer, offerType: Int, _ state: inout EmulatorState, _ changes: inout Changes,
                           subscription: TransactionRecord) {
        guard var chain = state.chains[subscription.originalId], subscription.productType == .autoRenewable else { return }
        chain.pendingOffer = PendingOffer(offer: offer, offerType: offerType, productId: chain.autoRenewProductId)
        state.chains[chain.originalTransactionId] = chain
        changes.chains.insert(chain.originalTransactionId)
        let latestId = chain.latestTransactionId
        if let index = changes.notifications.lastIndex(where: { $0.transactionId == latestId && $0.type == .didChangeRenewalPref && $0.subtype == .downgrade }) {
            changes.notifications[index].type = .offerRedeemed
        } else if let latest = state.transactions[latestId] {
            changes.notify(.offerRedeemed, nil, latest)
        }
    }

    /// Starts or changes an auto-renewable subscription. Returns an existing transaction instead of
    /// charging when the customer is already subscribed to this product (or scheduled a downgrade).
    /// `introductoryOffer` is the developer's signed word on eligibility, when given (else: only new subscribers).
    static func subscribe(_ state: inout EmulatorState, _ changes: inout Changes, record: inout TransactionRecord,
                          product: CatalogProduct, account: Account, now: Date, introductoryOffer: Bool? = nil,
                          billingPlan: BillingPlan? = nil) throws -> TransactionRecord? {
        guard let period = product.period, let group = product.subscriptionGroupId else { return nil }
        // Products with billing plans: every subscription says how it is paid; a monthly plan starts a 12-month commitment.
        let billingPlan = billingPlan ?? (product.billingPlans.isEmpty ? nil : .upFront(product))
        let rate = state.renewalRate(account, bundleId: record.bundleId)
        // Xcode's "billing issues" switch: the app's subscriptions fail to renew (they enter billing retry).
        let billingFails = state.apps[record.bundleId]?.testSettings?.billingIssuesEnabled == true
        let activeChain = state.chains.values.first { chain in
            chain.accountEmail.lowercased() == account.email.lowercased() && chain.bundleId == record.bundleId
                && chain.environment == record.environment && chain.subscriptionGroupId == group
        }
        record.subscriptionGroupId = group
        record.webOrderLineItemId = state.nextWebOrderLineItemId(record.environment)
        if var chain = activeChain, let latest = state.transactions[chain.latestTransactionId],
           let expires = latest.expiresDate, expires > now, latest.cancellationDate == nil {
            let current = state.product(chain.bundleId, chain.productId)
            let currentLevel = current?.groupLevel ?? 1
            let newLevel = product.groupLevel ?? 1
            // A crossgrade (same level) to another duration waits for the next renewal too, reported as a downgrade.
            let crossgradeLater = newLevel == currentLevel && current?.period != product.period
            if chain.productId == product.productId || newLevel > currentLevel || crossgradeLater {
                // Same product: already subscribed. Lower level: a downgrade that starts at the next renewal.
                let downgrade = chain.autoRenewProductId != product.productId && chain.productId != product.productId
                // Buying the current product again undoes a pending downgrade (DID_CHANGE_RENEWAL_PREF, no subtype)
                // and, with auto-renew off, turns it back on (DID_CHANGE_RENEWAL_STATUS / AUTO_RENEW_ENABLED).
                let reverted = chain.productId == product.productId && chain.autoRenewProductId != product.productId
                let resubscribed = chain.productId == product.productId && !chain.autoRenewEnabled
                chain.autoRenewProductId = product.productId
                chain.autoRenewEnabled = true
                chain.expirationIntent = nil
                chain.commitmentAutoRenew = nil  // buying again undoes turning auto-renew off during a commitment
                if chain.pendingOffer?.productId != product.productId { chain.pendingOffer = nil }
                state.chains[chain.originalTransactionId] = chain
                changes.chains.insert(chain.originalTransactionId)
                if downgrade { changes.notify(.didChangeRenewalPref, .downgrade, latest) }
                if reverted { changes.notify(.didChangeRenewalPref, nil, latest) }
                if resubscribed { changes.notify(.didChangeRenewalStatus, .autoRenewEnabled, latest) }
                var redelivery = latest
                redelivery.id = state.nextTransactionId(record.environment)
                redelivery.isRedelivery = true
                redelivery.finished = false
                redelivery.purchaseDate = now
                state.insert(redelivery)
                changes.transactions.insert(redelivery.id)
                return redelivery
            }
            // An upgrade (or crossgrade at the same level) takes effect now; the old period is refunded pro rata.
            var previous = latest
            previous.cancellationDate = now
            previous.isUpgraded = true
            state.update(previous)
            changes.transactions.insert(previous.id)
            record.originalId = chain.originalTransactionId
            record.originalPurchaseDate = state.transactions[chain.originalTransactionId]?.originalPurchaseDate ?? now
            record.expiresDate = periodEnd(from: now, period: period, rate: rate)
            startBilling(billingPlan, record: &record, chain: &chain, rate: rate, now: now)
            chain.pendingOffer = nil
            chain.productId = product.productId
            chain.autoRenewProductId = product.productId
            chain.autoRenewEnabled = true
            chain.expirationIntent = nil
            chain.latestTransactionId = record.id
            state.chains[chain.originalTransactionId] = chain
            changes.chains.insert(chain.originalTransactionId)
            changes.notify(.didChangeRenewalPref, .upgrade, record)
            return nil
        }
        // A new subscription, or a resubscription after lapse in the same group (same original id).
        var introRemaining = 0
        let hadSubscription = activeChain != nil
        // Introductory offers here are the up-front plan's; a monthly plan's commitment starts at once.
        if let offer = product.introductoryOffer, introductoryOffer ?? !hadSubscription, billingPlan?.type != .monthly {
            record.offerPeriod = offer.period.times(offer.numberOfPeriods)
            record.offerDiscountType = offer.paymentMode.discountType
            switch offer.paymentMode {
            case .free:
                record.isTrialPeriod = true
                record.expiresDate = periodEnd(from: now, period: offer.period, rate: rate, count: max(1, offer.numberOfPeriods))
            case .payUpFront:
                record.isInIntroOfferPeriod = true
                record.expiresDate = periodEnd(from: now, period: offer.period, rate: rate, count: max(1, offer.numberOfPeriods))
            case .payAsYouGo:
                record.isInIntroOfferPeriod = true
                record.expiresDate = periodEnd(from: now, period: offer.period, rate: rate)
                introRemaining = max(0, offer.numberOfPeriods - 1)
            }
        } else {
            record.expiresDate = periodEnd(from: now, period: period, rate: rate)
        }
        if var chain = activeChain {
            record.originalId = chain.originalTransactionId
            record.originalPurchaseDate = state.transactions[chain.originalTransactionId]?.originalPurchaseDate ?? now
            chain.productId = product.productId
            chain.autoRenewProductId = product.productId
            chain.autoRenewEnabled = true
            chain.expirationIntent = nil
            chain.renewals = 0
            chain.latestTransactionId = record.id
            chain.deviceId = record.deviceId
            chain.expiryNotified = nil
            chain.pendingOffer = nil
            startBilling(billingPlan, record: &record, chain: &chain, rate: rate, now: now)
            if billingFails { chain.billingIssue = true }
            state.chains[chain.originalTransactionId] = chain
            changes.chains.insert(chain.originalTransactionId)
            changes.notify(.subscribed, .resubscribe, record)
        } else {
            var chain = SubscriptionChain(originalTransactionId: record.id, bundleId: record.bundleId, accountEmail: account.email,
                                          deviceId: record.deviceId, environment: record.environment, productId: product.productId,
                                          subscriptionGroupId: group, autoRenewProductId: product.productId, autoRenewEnabled: true,
                                          renewals: 0, introPeriodsRemaining: introRemaining, expirationIntent: nil,
                                          latestTransactionId: record.id)
            startBilling(billingPlan, record: &record, chain: &chain, rate: rate, now: now)
            if billingFails { chain.billingIssue = true }
            state.chains[record.id] = chain
            changes.chains.insert(record.id)
            changes.notify(.subscribed, .initialBuy, record)
        }
        return nil
    }

    /// A subscription's first charge on its billing plan: a monthly plan's is one month of a new 12-month commitment,
    /// at the installment price; the chain renews on the same plan until the customer changes it.
    static func startBilling(_ plan: BillingPlan?, record: inout TransactionRecord, chain: inout SubscriptionChain, rate: RenewalRate, now: Date) {
        guard let plan else { return }
        record.billingPlanType = plan.type
        chain.renewalBillingPlanType = plan.type
        chain.commitmentAutoRenew = nil
        guard plan.type == .monthly else { return }
        record.isTrialPeriod = false
        record.isInIntroOfferPeriod = false
        record.offerPeriod = nil
        record.offerDiscountType = nil
        chain.introPeriodsRemaining = 0
        record.expiresDate = periodEnd(from: now, period: .oneMonth, rate: rate)
        record.commitment = Commitment.starting(at: now, plan: plan, rate: rate)
        if var price = record.price {
            price.amount = plan.amount
            record.price = price
        }
    }

    /// The transactions waiting in the device's payment queue: every unfinished one of its account and app.
    public func pendingTransactions(bundleId: String, deviceId: String) async throws -> [TransactionRecord] {
        try await read { state, _ in
            let (_, account) = try AppStoreEmulator.device(deviceId, in: state)
            return state.transactions(account: account.email, bundle: bundleId, environment: account.environment)
                .filter { !$0.finished && $0.state != .purchasing }
        }
    }

    /// `finishTransaction(_:)`: removes it from the queue; finished consumables leave the receipt.
    public func finish(transactionId: String, deviceId: String) async throws -> TransactionRecord {
        try await mutate { state, changes, _ in
            let (_, account) = try AppStoreEmulator.device(deviceId, in: state)
            guard var record = state.transactions[transactionId], record.accountEmail.lowercased() == account.email.lowercased() else {
                throw StoreError.notFound("Transaction \(transactionId)")
            }
            if record.finished { return record }
            guard record.state != .deferred else {
                throw StoreError(.conflict, "transaction_deferred", "A deferred transaction cannot be finished; it is waiting for approval.")
            }
            var machine = record.machine
            _ = try machine.handle(.finished)
            record.finished = machine.finished
            state.update(record)
            changes.transactions.insert(transactionId)
            return record
        }
    }

    /// `restoreCompletedTransactions()`: non-consumables and auto-renewables come back as restored transactions.
    public func restore(bundleId: String, deviceId: String) async throws -> [TransactionRecord] {
        try await mutate { state, changes, now in
            let (device, account) = try AppStoreEmulator.device(deviceId, in: state)
            let originals = state.transactions(account: account.email, bundle: bundleId, environment: account.environment)
                .filter { $0.state == .purchased && !$0.isRedelivery && $0.productType.isRestorable && $0.cancellationDate == nil }
            var restored: [TransactionRecord] = []
            for original in originals {
                var copy = original
                copy.id = state.nextTransactionId(account.environment)
                copy.state = .restored
                copy.finished = false
                copy.isRedelivery = true
                copy.deviceId = device.id
                copy.purchaseDate = now
                copy.price = nil
                state.insert(copy)
                changes.transactions.insert(copy.id)
                restored.append(copy)
            }
            return restored
        }
    }

    /// A parent answers an Ask to Buy request.
    public func answerAskToBuy(transactionId: String, approve: Bool) async throws -> TransactionRecord {
        try await mutate { state, changes, now in
            guard var record = state.transactions[transactionId] else { throw StoreError.notFound("Transaction \(transactionId)") }
            var machine = record.machine
            do {
                let action = try machine.handle(approve ? .approved : .declined)
                if case .reportFailure(let code) = action { record.error = code }
            } catch {
                throw StoreError(.conflict, "not_deferred", "Transaction \(transactionId) is not waiting for approval.")
            }
            record.state = machine.state
            record.purchaseDate = now
            record.originalPurchaseDate = now
            if record.state == .purchased, record.productType == .autoRenewable, let product = state.product(record.bundleId, record.productId),
               let account = state.accounts[record.accountEmail.lowercased()] {
                let plan = try? AppStoreEmulator.billingPlan(record.billingPlanType?.rawValue, product: product)
                if let existing = try AppStoreEmulator.subscribe(&state, &changes, record: &record, product: product, account: account, now: now,
                                                                 billingPlan: plan ?? nil) {
                    record.state = .failed
                    record.error = .paymentCancelled
                    state.update(record)
                    changes.transactions.insert(transactionId)
                    return existing
                }
            }
            state.update(record)
            changes.transactions.insert(transactionId)
            if record.state == .purchased, record.productType != .autoRenewable { changes.notify(.oneTimeCharge, nil, record) }
            if record.state == .purchased { AppStoreEmulator.shareWithFamily(&state, &changes, record, now: now) }
            return record
        }
    }

    /// Apple refunds a transaction (cancellation date and reason; 1 = issue in the app), in full or, with
    /// `percentage` (milliunits of the whole, 1…99,999), in part: `REFUND_PRORATED`. Either way the purchase is revoked.
    public func refund(transactionId: String, reason: Int = 0, percentage: Int? = nil) async throws -> TransactionRecord {
        if let percentage, !(1...100_000).contains(percentage) {
            throw StoreError.invalid("The refunded share is 1…100000 milliunits of the price (100000 is all of it).", code: "invalid_percentage")
        }
        return try await mutate { state, changes, now in
            guard var record = state.transactions[transactionId], record.state == .purchased else {
                throw StoreError.notFound("Purchased transaction \(transactionId)")
            }
            guard record.cancellationDate == nil else {
                throw StoreError(.conflict, "already_refunded", "Transaction \(transactionId) is already refunded.")
            }
            record.cancellationDate = now
            record.cancellationReason = reason
            record.refundPercentage = percentage.flatMap { $0 < 100_000 ? $0 : nil }
            state.update(record)
            changes.transactions.insert(transactionId)
            changes.notify(.refund, nil, record)
            AppStoreEmulator.revokeFamilyCopies(&state, &changes, of: record, now: now)
            if var chain = state.chains[record.originalId], chain.latestTransactionId == record.id {
                chain.autoRenewEnabled = false
                chain.expirationIntent = 1
                state.chains[chain.originalTransactionId] = chain
                changes.chains.insert(chain.originalTransactionId)
            }
            return record
        }
    }

    /// The customer asks Apple for a refund: Apple asks the developer for consumption data (CONSUMPTION_REQUEST);
    /// `refund` or `declineRefund` settles it.
    public func requestRefund(transactionId: String, reason: String) async throws -> TransactionRecord {
        let reasons = ["UNINTENDED_PURCHASE", "FULFILLMENT_ISSUE", "UNSATISFIED_WITH_PURCHASE", "LEGAL", "OTHER"]
        guard reasons.contains(reason) else { throw StoreError.invalid("The reason is one of \(reasons.joined(separator: ", ")).") }
        return try await mutate { state, changes, _ in
            guard let record = state.transactions[transactionId], record.state == .purchased, record.cancellationDate == nil else {
                throw StoreError.notFound("Purchased transaction \(transactionId)")
            }
            changes.notifications.append(NotificationEvent(type: .consumptionRequest, subtype: nil, transactionId: record.id, bundleId: record.bundleId,
                                                           environment: record.environment, consumptionRequestReason: reason))
            // Apple turns auto-renew off when a customer asks for a subscription's refund (DID_CHANGE_RENEWAL_STATUS / AUTO_RENEW_DISABLED).
            if record.productType == .autoRenewable, var chain = state.chains[record.originalId], chain.autoRenewEnabled,
               let latest = state.transactions[chain.latestTransactionId] {
                chain.autoRenewEnabled = false
                chain.expirationIntent = 1
                state.chains[chain.originalTransactionId] = chain
                changes.chains.insert(chain.originalTransactionId)
                changes.notify(.didChangeRenewalStatus, .autoRenewDisabled, latest)
            }
            return record
        }
    }

    /// Apple declines a refund request (REFUND_DECLINED).
    public func declineRefund(transactionId: String) async throws -> TransactionRecord {
        try await mutate { state, changes, _ in
            guard let record = state.transactions[transactionId], record.state == .purchased else {
                throw StoreError.notFound("Purchased transaction \(transactionId)")
            }
            changes.notify(.refundDeclined, nil, record)
            return record
        }
    }

    /// A customer redeems an offer code in the App Store (not in the app). For a subscription it starts, or changes,
    /// with the code's offer (offerType 3): SUBSCRIBED for a new or lapsed subscriber, OFFER_REDEEMED for an active
    /// one, each only for the customers the code is for (`eligibility`). For a one-time purchase (2025) the customer
    /// gets the product at the code's price: ONE_TIME_CHARGE, `offerDiscountType` ONE_TIME.
    public func redeemOfferCode(bundleId: String, email: String, productId: String, offerId: String) async throws -> TransactionRecord {
        try await mutate { state, changes, now in
            guard let account = state.accounts[email.lowercased()], !account.deleted else { throw StoreError.notFound("Account \(email)") }
            guard let product = state.product(bundleId, productId) else { throw StoreError.notFound("Product \(productId) of \(bundleId)") }
            if product.type != .autoRenewable {
                return try AppStoreEmulator.redeemOneTimeCode(&state, &changes, account: account, product: product, bundleId: bundleId, offerId: offerId, now: now)
            }
            guard let offer = product.offerCodes.first(where: { $0.offerId == offerId }) else {
                throw StoreError.storeKit(.invalidOfferIdentifier, "\(productId) has no offer code \(offerId).", status: .notFound)
            }
            let active = state.chains.values.contains { chain in
                chain.accountEmail.lowercased() == email.lowercased() && chain.bundleId == bundleId && chain.subscriptionGroupId == product.subscriptionGroupId
                    && (state.transactions[chain.latestTransactionId]?.expiresDate ?? .distantPast) > now
            }
            if AppStoreEmulator.inCommitment(state, email: account.email, bundleId: bundleId, group: product.subscriptionGroupId, now: now) {
                throw StoreError.storeKit(.ineligibleForOffer, "Offers do not apply to a subscription paid monthly over a commitment.", status: .forbidden)
            }
            if let eligibility = offer.eligibility, !eligibility.isEmpty {
                let subscribedBefore = !AppStoreEmulator.groupHistory(state, email: account.email, bundleId: bundleId, environment: account.environment,
                                                                      group: product.subscriptionGroupId).isEmpty
                let standing = active ? "existing" : subscribedBefore ? "expired" : "new"
                guard eligibility.contains(standing) else {
                    throw StoreError.storeKit(.ineligibleForOffer, "Offer code \(offerId) is for \(eligibility.joined(separator: ", ")) subscribers; this customer is \(standing).",
                                              status: .forbidden)
                }
            }
            var record = AppStoreEmulator.storeSubscription(&state, account: account, product: product, bundleId: bundleId, now: now)
            if let existing = try AppStoreEmulator.subscribe(&state, &changes, record: &record, product: product, account: account, now: now) {
                // Subscribed to this product, or a downgrade to it: the offer starts at the next renewal.
                AppStoreEmulator.deferOffer(offer, offerType: 3, &state, &changes, subscription: existing)
                return existing
            }
            AppStoreEmulator.apply(offer, to: &record, changes: &changes, rate: state.renewalRate(account, bundleId: bundleId), now: now, offerType: 3)
            if active, let index = changes.notifications.lastIndex(where: { $0.transactionId == record.id }) {
                changes.notifications[index].type = .offerRedeemed
            }
            state.insert(record)
            changes.transactions.insert(record.id)
            return record
        }
    }

    /// A one-time purchase's offer code redeemed in the App Store: bought at once, at the code's price.
    static func redeemOneTimeCode(_ state: inout EmulatorState, _ changes: inout Changes, account: Account, product: CatalogProduct,
                                  bundleId: String, offerId: String, now: Date) throws -> TransactionRecord {
        guard let code = product.oneTimeOfferCodes.first(where: { $0.offerId == offerId }) else {
            throw StoreError.storeKit(.invalidOfferIdentifier, "\(product.productId) has no offer code \(offerId).", status: .notFound)
        }
        let history = state.transactions(account: account.email, bundle: bundleId, environment: account.environment)
        if product.type == .nonConsumable || product.type == .freeSubscription,
           history.contains(where: { $0.productId == product.productId && $0.state == .purchased && !$0.isRedelivery && $0.cancellationDate == nil }) {
            throw StoreError(.conflict, "already_owned", "The customer already owns \(product.productId).")
        }
        var record = TransactionRecord(
            id: state.nextTransactionId(account.environment), originalId: "", bundleId: bundleId, productId: product.productId,
            productType: product.type, accountEmail: account.email, deviceId: "", environment: account.environment,
            quantity: 1, purchaseDate: now, originalPurchaseDate: now, expiresDate: nil, webOrderLineItemId: nil,
            isTrialPeriod: false, isInIntroOfferPeriod: false, cancellationDate: nil, cancellationReason: nil, isUpgraded: false,
            state: .purchased, finished: false, error: nil, applicationUsername: nil, isRedelivery: false, isRenewal: false,
            price: product.price(for: account.storefront), subscriptionGroupId: nil)
        record.originalId = record.id
        record.offerType = 3
        record.offerIdentifier = code.offerId
        record.offerDiscountType = "ONE_TIME"
        if var price = record.price {
            price.amount = code.amount ?? "0"
            record.price = price
        }
        state.insert(record)
        changes.transactions.insert(record.id)
        changes.notify(.oneTimeCharge, nil, record)
        AppStoreEmulator.shareWithFamily(&state, &changes, record, now: now)
        return record
    }

    /// One transaction.
    public func transaction(_ id: String) async throws -> TransactionRecord {
        try await read { state, _ in
            guard let record = state.transactions[id] else { throw StoreError.notFound("Transaction \(id)") }
            return record
        }
    }
}
