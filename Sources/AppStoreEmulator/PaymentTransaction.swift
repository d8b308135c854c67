import AppStoreModels
import Foundation

/// `SKPaymentTransactionState`, spelled as our device API sends it.
public enum TransactionState: String, Codable, Sendable {
    case purchasing, purchased, failed, restored, deferred
}

/// The payment transaction lifecycle as a value: event in, next state and action out.
public struct PaymentStateMachine: Sendable, Equatable {
    /// What can happen to a transaction.
    public enum Event: Sendable, Equatable {
        case charged
        case cancelledByUser
        case failed(SKErrorCode)
        case needsApproval
        case approved
        case declined
        case finished
    }

    /// What the emulator must do after a transition.
    public enum Action: Sendable, Equatable {
        case deliver
        case waitForParent
        case reportFailure(SKErrorCode)
        case removeFromQueue
    }

    /// A transition that the state does not allow.
    public struct InvalidTransition: Error, Sendable, Equatable {
        public let state: TransactionState
        public let event: Event
    }

    public private(set) var state: TransactionState
    public private(set) var finished: Bool

    /// A new transaction in `purchasing`.
    public init(state: TransactionState = .purchasing, finished: Bool = false) {
        self.state = state
        self.finished = finished
    }

    /// Applies an event.
    public mutating func handle(_ event: Event) throws -> Action {
        switch (state, event) {
        case (.purchasing, .charged), (.deferred, .approved):
            state = .purchased
            return .deliver
        case (.purchasing, .cancelledByUser):
            state = .failed
            return .reportFailure(.paymentCancelled)
        case (.purchasing, .failed(let code)):
            state = .failed
            return .reportFailure(code)
        case (.purchasing, .needsApproval):
            state = .deferred
            return .waitForParent
        case (.deferred, .declined):
            state = .failed
            return .reportFailure(.paymentCancelled)
        case (.purchased, .finished), (.failed, .finished), (.restored, .finished):
            guard !finished else { throw InvalidTransition(state: state, event: event) }
            finished = true
            return .removeFromQueue
        default:
            throw InvalidTransition(state: state, event: event)
        }
    }
}

/// One transaction the emulator has recorded.
public struct TransactionRecord: Codable, Sendable, Equatable {
    public var id: String
    public var originalId: String
    public var bundleId: String
    public var productId: String
    public var productType: ProductType
    public var accountEmail: String
    public var deviceId: String
    public var environment: AppStoreEnvironment
    public var quantity: Int
    public var purchaseDate: Date
    public var originalPurchaseDate: Date
    public var expiresDate: Date?
    public var webOrderLineItemId: Int64?
    public var isTrialPeriod: Bool
    public var isInIntroOfferPeriod: Bool
    public var cancellationDate: Date?
    public var cancellationReason: Int?
    public var isUpgraded: Bool
    public var state: TransactionState
    public var finished: Bool
    public var error: SKErrorCode?
    public var applicationUsername: String?
    /// Re-deliveries and restores: new ids that point at an original and never enter receipts.
    public var isRedelivery: Bool
    /// Renewal transactions (`transactionReason` RENEWAL).
    public var isRenewal: Bool
    public var price: ProductPrice?
    public var subscriptionGroupId: String?
    /// StoreKit 2's `offerType` when an offer other than the introductory one applied (2 promotional) and its id.
    public var offerType: Int?
    public var offerIdentifier: String?
    /// A purchase interrupted for the customer to act (SKTestSession's interrupted purchases), waiting as deferred.
    public var interrupted: Bool?
    /// The applied offer's whole duration (ISO 8601) and `offerDiscountType`, for any offer type.
    public var offerPeriod: String?
    public var offerDiscountType: String?
    /// For a family member's copy of a purchase (FAMILY_SHARED): the purchaser's transaction id.
    public var sharedFromTransactionId: String?
    /// Set by the App Store Server API's Set App Account Token (else a UUID applicationUsername stands for it).
    public var appAccountToken: String?
    /// What the developer reported with Send Consumption Information (field → value as sent).
    public var consumptionInfo: [String: String]?
    /// The billing plan it was paid on, for subscriptions of products that have billing plans; a monthly
    /// plan's installments carry where they stand in their commitment.
    public var billingPlanType: BillingPlan.Kind?
    public var commitment: Commitment?
    /// A refund of part of the price (milliunits of the whole, 1…99,999): `REFUND_PRORATED`; nil when refunded in full.
    public var refundPercentage: Int?

    /// The machine for this record's state.
    public var machine: PaymentStateMachine { PaymentStateMachine(state: state, finished: finished) }

    /// Whether the transaction belongs in the app receipt (reference §1.5).
    public var belongsInReceipt: Bool {
        guard state == .purchased, !isRedelivery else { return false }
        return !(productType.leavesReceiptWhenFinished && finished)
    }

    /// As the receipt's in-app entry.
    public var inAppPurchase: InAppPurchase {
        InAppPurchase(quantity: quantity, productId: productId, transactionId: id, originalTransactionId: originalId,
                      purchaseDate: purchaseDate, originalPurchaseDate: originalPurchaseDate, expiresDate: expiresDate,
                      webOrderLineItemId: webOrderLineItemId, cancellationDate: cancellationDate,
                      cancellationReason: cancellationReason, isTrialPeriod: isTrialPeriod,
                      isInIntroOfferPeriod: productType == .autoRenewable ? isInIntroOfferPeriod : nil,
                      productTypeCode: productType.receiptProductTypeCode)
    }

    /// As a `latest_receipt_info` entry.
    public var latestReceiptInfo: ReceiptTransactionInfo {
        var info = ReceiptTransactionInfo(inAppPurchase)
        info.inAppOwnershipType = sharedFromTransactionId == nil ? "PURCHASED" : "FAMILY_SHARED"
        info.subscriptionGroupIdentifier = subscriptionGroupId
        info.isUpgraded = isUpgraded ? "true" : nil
        if let name = applicationUsername, UUIDText.parse(name) != nil { info.appAccountToken = name.lowercased() }
        if let token = appAccountToken { info.appAccountToken = token }
        if offerType == 2 { info.promotionalOfferId = offerIdentifier }
        return info
    }
}

/// The renewal state of one auto-renewable subscription (one original transaction).
public struct SubscriptionChain: Codable, Sendable, Equatable {
    public var originalTransactionId: String
    public var bundleId: String
    public var accountEmail: String
    public var deviceId: String
    public var environment: AppStoreEnvironment
    public var productId: String
    public var subscriptionGroupId: String
    public var autoRenewProductId: String
    public var autoRenewEnabled: Bool
    public var renewals: Int
    public var introPeriodsRemaining: Int
    public var expirationIntent: Int?
    public var latestTransactionId: String
    /// Whether the EXPIRED notification for the current lapse was sent.
    public var expiryNotified: Bool?
    /// When the renewal date was extended (at most twice in 365 days).
    public var extensions: [Date]?
    /// The customer's payment method fails: renewals go into billing retry instead of charging.
    public var billingIssue: Bool?
    /// When billing retry began (the expiry that could not be charged); nil when not in retry.
    public var billingRetryStart: Date?
    /// End of the billing grace period (access continues until then), when the app offers one.
    public var gracePeriodEnd: Date?
    /// Whether GRACE_PERIOD_EXPIRED was sent for the current retry.
    public var graceExpiryNotified: Bool?
    /// For a family member's subscription: the purchaser's original transaction id (renews with it).
    public var sharedFromOriginalId: String?
    /// A price increase that needs the customer's consent: the new amount, and whether they agreed.
    public var priceIncreaseAmount: String?
    public var priceIncreaseConsented: Bool?
    /// How the next commitment or period is billed (`renewalBillingPlanType`), for products with billing plans.
    public var renewalBillingPlanType: BillingPlan.Kind?
    /// False once the customer turned auto-renew off during a commitment: its installments go on, and the
    /// subscription ends with it. Nil means it renews.
    public var commitmentAutoRenew: Bool?
    /// An offer redeemed for the product the subscription renews into (an offer code for the current product, or
    /// an offer with a downgrade): it applies from the next renewal, and renewal info names it until then.
    public var pendingOffer: PendingOffer?
}

/// An offer waiting for a subscription's next renewal into `productId`, and its `offerType` (2 promotional, 3 offer code).
public struct PendingOffer: Codable, Sendable, Equatable {
    public var offer: PromotionalOffer
    public var offerType: Int
    /// The product it is an offer of: it applies only to a renewal into that product.
    public var productId: String
}
