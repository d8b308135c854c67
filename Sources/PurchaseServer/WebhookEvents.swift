import AppStoreModels
import Foundation

/// What a webhook event says happened to what a user owns. The names are RevenueCat's, so a team can
/// map its handlers one to one.
public enum WebhookEventType: String, Codable, Sendable, CaseIterable {
    /// A subscription's first period (or a free subscription).
    case initialPurchase = "INITIAL_PURCHASE"
    /// A later period of an auto-renewable subscription.
    case renewal = "RENEWAL"
    /// A non-consumable or a non-renewing subscription.
    case nonRenewingPurchase = "NON_RENEWING_PURCHASE"
    /// A consumable (its credit is in `balance`).
    case consumablePurchase = "CONSUMABLE_PURCHASE"
    /// Auto-renew turned off: access continues to the end of the period.
    case cancellation = "CANCELLATION"
    /// Auto-renew turned back on.
    case uncancellation = "UNCANCELLATION"
    /// A renewal charge failed; Apple retries billing.
    case billingIssue = "BILLING_ISSUE"
    /// A renewal failed and the app's billing grace period keeps access meanwhile.
    case gracePeriodStarted = "GRACE_PERIOD_STARTED"
    /// The subscription ended (voluntarily, after billing retry or grace, a price increase not agreed to).
    case expiration = "EXPIRATION"
    /// The customer chose another product of the group, from the next renewal or at once.
    case productChange = "PRODUCT_CHANGE"
    /// Apple refunded or revoked a transaction: its entitlement or credit is gone.
    case refund = "REFUND"
    /// A refund was reversed: the entitlement or credit is back.
    case refundReversed = "REFUND_REVERSED"
    /// A subscription's expiry moved later (a renewal-date extension).
    case subscriptionExtended = "SUBSCRIPTION_EXTENDED"
    /// Purchases moved from other users to this one (the replay policy `transfer`).
    case transfer = "TRANSFER"
    /// A promotional entitlement was granted.
    case entitlementGranted = "ENTITLEMENT_GRANTED"
    /// A promotional entitlement was revoked.
    case entitlementRevoked = "ENTITLEMENT_REVOKED"
    /// A balance changed: a spend, a credit, a claw-back, a credit restored, an adjustment.
    case balanceChanged = "BALANCE_CHANGED"
    /// Sent on request (`webhook test`), to check an endpoint.
    case test = "TEST"
    /// An App Store Server Notification, forwarded to endpoints of format `apple` as `{"signedPayload": …}`.
    case appleNotification = "APPLE_NOTIFICATION"
}

/// What an endpoint receives.
public enum WebhookFormat: String, Codable, Sendable {
    /// Storekeeper's events (the table in the README).
    case events
    /// Apple's notifications (`{"signedPayload": …}` holding the JWS that verified), for another backend.
    case apple
}

/// An event as the rules decide it, before it is numbered and stored (`WebhookRepository.record`).
public struct WebhookEventDraft: Sendable, Equatable {
    public var type: WebhookEventType
    public var appUserId: String
    public var environment: String?
    public var transactionId: String?
    public var originalTransactionId: String?
    public var productId: String?
    public var expiresDate: Int64?
    /// For `BALANCE_CHANGED`: which balance, and by how much (negative for a spend or a claw-back).
    public var currency: String?
    public var balanceChange: Int64?
    /// Other users concerned (a transfer's previous owners).
    public var fromUsers: [String]?
    /// For `ENTITLEMENT_GRANTED` / `ENTITLEMENT_REVOKED`: the entitlement, and why.
    public var entitlement: String?
    public var reason: String?

    public init(type: WebhookEventType, appUserId: String, environment: String? = nil, transactionId: String? = nil,
                originalTransactionId: String? = nil, productId: String? = nil, expiresDate: Int64? = nil, currency: String? = nil,
                balanceChange: Int64? = nil, fromUsers: [String]? = nil, entitlement: String? = nil, reason: String? = nil) {
        self.entitlement = entitlement
        self.reason = reason
        self.type = type
        self.appUserId = appUserId
        self.environment = environment
        self.transactionId = transactionId
        self.originalTransactionId = originalTransactionId
        self.productId = productId
        self.expiresDate = expiresDate
        self.currency = currency
        self.balanceChange = balanceChange
        self.fromUsers = fromUsers
    }
}

/// The rules that turn a change of what users own into webhook events: pure, table-tested
/// (`WebhookEventsTests`). One event per change; a settlement that changes nothing emits nothing, so
/// a receipt uploaded twice, or a notification delivered twice, emits its events once.
public enum WebhookEvents {
    /// The events of a settlement plan's actions for `user` (the uploader), given the ledger rows the
    /// plan read (to know a refunded row's owner and an expiry's old value).
    public static func of(_ actions: [SettlementPlan.Action], user: String, environment: String,
                          ledger: [String: LedgerEntry]) -> [WebhookEventDraft] {
        var events: [WebhookEventDraft] = []
        var recorded: [String: ConfirmedTransaction] = [:]
        let transferred = Set(actions.compactMap { action -> String? in
            if case .unbindAll(let original) = action { return original }
            return nil
        })
        let previousOwners = Dictionary(actions.compactMap { action -> (String, [String])? in
            if case .audit("ownership_transferred", _, let detail) = action, let original = detail["originalTransactionId"] {
                return (original, (detail["from"] ?? "").split(separator: ",").map(String.init))
            }
            return nil
        }, uniquingKeysWith: { $1 })
        func owner(of transactionId: String) -> String { ledger[transactionId]?.appUserId ?? user }
        func productId(of transactionId: String) -> String? { recorded[transactionId]?.productId ?? ledger[transactionId]?.productId }
        func draft(_ type: WebhookEventType, _ transactionId: String, user: String) -> WebhookEventDraft {
            let transaction = recorded[transactionId]
            return WebhookEventDraft(type: type, appUserId: user, environment: environment, transactionId: transactionId,
                                     originalTransactionId: transaction?.originalTransactionId, productId: productId(of: transactionId),
                                     expiresDate: transaction?.expiresDate.map(ReceiptDate.milliseconds) ?? ledger[transactionId]?.expiresDate)
        }
        for action in actions {
            switch action {
            case .record(let transaction, let mapping, _):
                recorded[transaction.transactionId] = transaction
                // Refunded before it was first seen: it never granted anything.
                guard transaction.cancellationDate == nil else { continue }
                let type: WebhookEventType = switch mapping.type {
                case .consumable: .consumablePurchase
                case .nonConsumable, .nonRenewing: .nonRenewingPurchase
                case .autoRenewable: transaction.transactionId == transaction.originalTransactionId ? .initialPurchase : .renewal
                case .freeSubscription: .initialPurchase
                }
                events.append(draft(type, transaction.transactionId, user: user))
            case .bind(let original, let productId):
                if transferred.contains(original) {
                    events.append(WebhookEventDraft(type: .transfer, appUserId: user, environment: environment, originalTransactionId: original,
                                                    productId: productId, fromUsers: previousOwners[original]))
                }
            case .credit(let transactionId, let currency, let amount):
                var event = draft(.balanceChanged, transactionId, user: user)
                event.currency = currency
                event.balanceChange = amount
                events.append(event)
            case .cancel(let transactionId, _, _, _, _):
                events.append(draft(.refund, transactionId, user: owner(of: transactionId)))
            case .reinstate(let transactionId, _):
                events.append(draft(.refundReversed, transactionId, user: owner(of: transactionId)))
            case .clawBack(let transactionId, let owner, let currency, let amount):
                var event = draft(.balanceChanged, transactionId, user: owner)
                event.currency = currency
                event.balanceChange = -amount
                events.append(event)
            case .restoreCredit(let transactionId, let owner, let currency, let amount):
                var event = draft(.balanceChanged, transactionId, user: owner)
                event.currency = currency
                event.balanceChange = amount
                events.append(event)
            case .updateExpiry(let transactionId, let expires, _):
                // Only a later expiry is an extension; a correction to an earlier one is not news to the developer.
                guard let expires, expires > (ledger[transactionId]?.expiresDate ?? .max) else { continue }
                var event = draft(.subscriptionExtended, transactionId, user: owner(of: transactionId))
                event.expiresDate = expires
                events.append(event)
            case .unbindAll, .withholdCredit, .observe, .audit, .updateRefundShare:
                continue
            }
        }
        return events
    }

    /// The events of a notification that changes a subscription's renewal state (the ledger's own changes
    /// come from the settlement of its transaction), for the subscription's owner.
    public static func of(notification type: NotificationType, subtype: NotificationSubtype?, owner: String, environment: String,
                          transaction: JWSTransaction?) -> [WebhookEventDraft] {
        let types: [WebhookEventType]
        switch (type, subtype) {
        case (.didChangeRenewalStatus, .autoRenewDisabled?): types = [.cancellation]
        case (.didChangeRenewalStatus, .autoRenewEnabled?): types = [.uncancellation]
        case (.didFailToRenew, .gracePeriod?): types = [.billingIssue, .gracePeriodStarted]
        case (.didFailToRenew, _): types = [.billingIssue]
        case (.expired, _), (.gracePeriodExpired, _): types = [.expiration]
        case (.didChangeRenewalPref, _): types = [.productChange]
        default: types = []
        }
        return types.map {
            WebhookEventDraft(type: $0, appUserId: owner, environment: environment, transactionId: transaction?.transactionId,
                              originalTransactionId: transaction?.originalTransactionId, productId: transaction?.productId,
                              expiresDate: transaction?.expiresDate)
        }
    }
}
