/// A string enumeration Apple may extend: named values for the known spellings, any other kept as is.
/// Coded as the bare string (the standard library's `RawRepresentable` coding).
public protocol OpenStringValue: RawRepresentable, Hashable, Sendable, Codable, CustomStringConvertible where RawValue == String {
    init(rawValue: String)
}

extension OpenStringValue {
    public init(_ rawValue: String) { self.init(rawValue: rawValue) }
    public var description: String { rawValue }
}

/// An App Store Server Notification V2 `notificationType`. The raw value is kept, so a type Apple
/// adds tomorrow is representable (and the server records it) before anyone names it here.
public struct NotificationType: OpenStringValue {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    public static let subscribed = Self("SUBSCRIBED")
    public static let didChangeRenewalPref = Self("DID_CHANGE_RENEWAL_PREF")
    public static let didChangeRenewalStatus = Self("DID_CHANGE_RENEWAL_STATUS")
    public static let offerRedeemed = Self("OFFER_REDEEMED")
    public static let didRenew = Self("DID_RENEW")
    public static let expired = Self("EXPIRED")
    public static let didFailToRenew = Self("DID_FAIL_TO_RENEW")
    public static let gracePeriodExpired = Self("GRACE_PERIOD_EXPIRED")
    public static let priceIncrease = Self("PRICE_INCREASE")
    public static let refund = Self("REFUND")
    public static let refundDeclined = Self("REFUND_DECLINED")
    public static let refundReversed = Self("REFUND_REVERSED")
    public static let consumptionRequest = Self("CONSUMPTION_REQUEST")
    public static let renewalExtended = Self("RENEWAL_EXTENDED")
    public static let renewalExtension = Self("RENEWAL_EXTENSION")
    public static let revoke = Self("REVOKE")
    public static let test = Self("TEST")
    public static let oneTimeCharge = Self("ONE_TIME_CHARGE")
    public static let externalPurchaseToken = Self("EXTERNAL_PURCHASE_TOKEN")
    public static let rescindConsent = Self("RESCIND_CONSENT")
    public static let metadataUpdate = Self("METADATA_UPDATE")
    public static let migration = Self("MIGRATION")
    /// Apple's changelog spells the migration type this way; the libraries say `MIGRATION`.
    public static let migrate = Self("MIGRATE")
    public static let priceChange = Self("PRICE_CHANGE")

    /// Every type in Apple's documentation and libraries (2026).
    public static let documented: [NotificationType] = [
        .subscribed, .didChangeRenewalPref, .didChangeRenewalStatus, .offerRedeemed, .didRenew, .expired, .didFailToRenew,
        .gracePeriodExpired, .priceIncrease, .refund, .refundDeclined, .refundReversed, .consumptionRequest, .renewalExtended,
        .renewalExtension, .revoke, .test, .oneTimeCharge, .externalPurchaseToken, .rescindConsent, .metadataUpdate, .migration,
        .migrate, .priceChange,
    ]
}

/// A notification's `subtype`, raw value kept like `NotificationType`.
public struct NotificationSubtype: OpenStringValue {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    public static let initialBuy = Self("INITIAL_BUY")
    public static let resubscribe = Self("RESUBSCRIBE")
    public static let downgrade = Self("DOWNGRADE")
    public static let upgrade = Self("UPGRADE")
    public static let autoRenewEnabled = Self("AUTO_RENEW_ENABLED")
    public static let autoRenewDisabled = Self("AUTO_RENEW_DISABLED")
    public static let voluntary = Self("VOLUNTARY")
    public static let billingRetry = Self("BILLING_RETRY")
    public static let priceIncrease = Self("PRICE_INCREASE")
    public static let gracePeriod = Self("GRACE_PERIOD")
    public static let pending = Self("PENDING")
    public static let accepted = Self("ACCEPTED")
    public static let billingRecovery = Self("BILLING_RECOVERY")
    public static let productNotForSale = Self("PRODUCT_NOT_FOR_SALE")
    public static let summary = Self("SUMMARY")
    public static let failure = Self("FAILURE")
    public static let unreported = Self("UNREPORTED")
    public static let activeTokenReminder = Self("ACTIVE_TOKEN_REMINDER")
    public static let created = Self("CREATED")
}
