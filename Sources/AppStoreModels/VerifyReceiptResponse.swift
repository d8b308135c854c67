import Foundation

/// A date in verifyReceipt's three string forms.
public struct ReceiptDateTriple: Sendable, Equatable {
    public var gmt: String
    public var milliseconds: String
    public var pacific: String

    /// The three forms of one date.
    public init(_ date: Date) {
        gmt = ReceiptDate.gmtString(date)
        milliseconds = String(ReceiptDate.milliseconds(date))
        pacific = ReceiptDate.pacificString(date)
    }

    /// The date (from the milliseconds form).
    public var date: Date? { Int64(milliseconds).map(ReceiptDate.date(milliseconds:)) }
}

/// Keys of the verifyReceipt JSON that carry a date triple: `name`, `name_ms`, `name_pst`.
struct DynamicKey: CodingKey {
    var stringValue: String
    var intValue: Int? { nil }
    init(_ string: String) { stringValue = string }
    init?(stringValue: String) { self.stringValue = stringValue }
    init?(intValue: Int) { nil }
}

extension KeyedEncodingContainer where K == DynamicKey {
    mutating func encodeTriple(_ triple: ReceiptDateTriple?, _ name: String) throws {
        guard let triple else { return }
        try encode(triple.gmt, forKey: DynamicKey(name))
        try encode(triple.milliseconds, forKey: DynamicKey(name + "_ms"))
        try encode(triple.pacific, forKey: DynamicKey(name + "_pst"))
    }
    mutating func encodeOptional<T: Encodable>(_ value: T?, _ name: String) throws {
        if let value { try encode(value, forKey: DynamicKey(name)) }
    }
}

/// The fields of one verifyReceipt JSON object, read leniently as Apple writes them (ids as numbers
/// or strings, dates as `name`, `name_ms`, `name_pst`).
struct ReceiptFields {
    let value: JSONValue

    func string(_ name: String) -> String? { value[name]?.text }
    func int64(_ name: String) -> Int64? { value[name]?.int64 }

    func triple(_ name: String) -> ReceiptDateTriple? {
        guard let ms = string(name + "_ms"), let milliseconds = Int64(ms) else { return nil }
        var triple = ReceiptDateTriple(ReceiptDate.date(milliseconds: milliseconds))
        if let gmt = string(name) { triple.gmt = gmt }
        if let pacific = string(name + "_pst") { triple.pacific = pacific }
        triple.milliseconds = ms
        return triple
    }
}

/// One transaction as verifyReceipt renders it in `in_app` and `latest_receipt_info`.
public struct ReceiptTransactionInfo: Encodable, Sendable, Equatable {
    public var quantity: String
    public var productId: String
    public var transactionId: String
    public var originalTransactionId: String?
    public var purchaseDate: ReceiptDateTriple?
    public var originalPurchaseDate: ReceiptDateTriple?
    public var expiresDate: ReceiptDateTriple?
    public var webOrderLineItemId: String?
    public var isTrialPeriod: String?
    public var isInIntroOfferPeriod: String?
    public var cancellationDate: ReceiptDateTriple?
    public var cancellationReason: String?
    public var promotionalOfferId: String?
    public var inAppOwnershipType: String?
    public var subscriptionGroupIdentifier: String?
    public var isUpgraded: String?
    public var appAccountToken: String?

    /// Creates an entry.
    public init(quantity: String, productId: String, transactionId: String, originalTransactionId: String? = nil,
                purchaseDate: ReceiptDateTriple? = nil, originalPurchaseDate: ReceiptDateTriple? = nil,
                expiresDate: ReceiptDateTriple? = nil, webOrderLineItemId: String? = nil, isTrialPeriod: String? = nil,
                isInIntroOfferPeriod: String? = nil, cancellationDate: ReceiptDateTriple? = nil,
                cancellationReason: String? = nil, promotionalOfferId: String? = nil, inAppOwnershipType: String? = nil,
                subscriptionGroupIdentifier: String? = nil, isUpgraded: String? = nil, appAccountToken: String? = nil) {
        self.quantity = quantity
        self.productId = productId
        self.transactionId = transactionId
        self.originalTransactionId = originalTransactionId
        self.purchaseDate = purchaseDate
        self.originalPurchaseDate = originalPurchaseDate
        self.expiresDate = expiresDate
        self.webOrderLineItemId = webOrderLineItemId
        self.isTrialPeriod = isTrialPeriod
        self.isInIntroOfferPeriod = isInIntroOfferPeriod
        self.cancellationDate = cancellationDate
        self.cancellationReason = cancellationReason
        self.promotionalOfferId = promotionalOfferId
        self.inAppOwnershipType = inAppOwnershipType
        self.subscriptionGroupIdentifier = subscriptionGroupIdentifier
        self.isUpgraded = isUpgraded
        self.appAccountToken = appAccountToken
    }

    /// Renders a decoded receipt purchase the way verifyReceipt does in `receipt.in_app`.
    public init(_ purchase: InAppPurchase) {
        self.init(quantity: String(purchase.quantity), productId: purchase.productId, transactionId: purchase.transactionId,
                  originalTransactionId: purchase.originalTransactionId,
                  purchaseDate: purchase.purchaseDate.map(ReceiptDateTriple.init),
                  originalPurchaseDate: purchase.originalPurchaseDate.map(ReceiptDateTriple.init),
                  expiresDate: purchase.expiresDate.map(ReceiptDateTriple.init),
                  webOrderLineItemId: purchase.webOrderLineItemId.map { String($0) },
                  isTrialPeriod: purchase.isTrialPeriod ? "true" : "false",
                  isInIntroOfferPeriod: purchase.isInIntroOfferPeriod.map { $0 ? "true" : "false" },
                  cancellationDate: purchase.cancellationDate.map(ReceiptDateTriple.init),
                  cancellationReason: purchase.cancellationReason.map { String($0) },
                  promotionalOfferId: purchase.promotionalOfferId)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: DynamicKey.self)
        try c.encode(quantity, forKey: DynamicKey("quantity"))
        try c.encode(productId, forKey: DynamicKey("product_id"))
        try c.encode(transactionId, forKey: DynamicKey("transaction_id"))
        try c.encodeOptional(originalTransactionId, "original_transaction_id")
        try c.encodeTriple(purchaseDate, "purchase_date")
        try c.encodeTriple(originalPurchaseDate, "original_purchase_date")
        try c.encodeTriple(expiresDate, "expires_date")
        try c.encodeOptional(webOrderLineItemId, "web_order_line_item_id")
        try c.encodeOptional(isTrialPeriod, "is_trial_period")
        try c.encodeOptional(isInIntroOfferPeriod, "is_in_intro_offer_period")
        try c.encodeTriple(cancellationDate, "cancellation_date")
        try c.encodeOptional(cancellationReason, "cancellation_reason")
        try c.encodeOptional(promotionalOfferId, "promotional_offer_id")
        try c.encodeOptional(inAppOwnershipType, "in_app_ownership_type")
        try c.encodeOptional(subscriptionGroupIdentifier, "subscription_group_identifier")
        try c.encodeOptional(isUpgraded, "is_upgraded")
        try c.encodeOptional(appAccountToken, "app_account_token")
    }

    /// Reads one entry of `in_app` or `latest_receipt_info`; nil without a product id and a transaction id.
    public init?(json: JSONValue) {
        let c = ReceiptFields(value: json)
        guard let productId = c.string("product_id"), let transactionId = c.string("transaction_id") else { return nil }
        self.init(quantity: c.string("quantity") ?? "1", productId: productId, transactionId: transactionId,
                  originalTransactionId: c.string("original_transaction_id"),
                  purchaseDate: c.triple("purchase_date"), originalPurchaseDate: c.triple("original_purchase_date"),
                  expiresDate: c.triple("expires_date"), webOrderLineItemId: c.string("web_order_line_item_id"),
                  isTrialPeriod: c.string("is_trial_period"), isInIntroOfferPeriod: c.string("is_in_intro_offer_period"),
                  cancellationDate: c.triple("cancellation_date"), cancellationReason: c.string("cancellation_reason"),
                  promotionalOfferId: c.string("promotional_offer_id"), inAppOwnershipType: c.string("in_app_ownership_type"),
                  subscriptionGroupIdentifier: c.string("subscription_group_identifier"), isUpgraded: c.string("is_upgraded"),
                  appAccountToken: c.string("app_account_token"))
    }
}

/// The `receipt` object of a verifyReceipt response for an app receipt.
public struct ReceiptInfo: Encodable, Sendable, Equatable {
    public var receiptType: String
    public var adamId: Int64
    public var appItemId: Int64
    public var bundleId: String
    public var applicationVersion: String
    public var downloadId: Int64
    public var versionExternalIdentifier: Int64
    public var receiptCreationDate: ReceiptDateTriple?
    public var requestDate: ReceiptDateTriple?
    public var originalPurchaseDate: ReceiptDateTriple?
    public var originalApplicationVersion: String?
    public var expirationDate: ReceiptDateTriple?
    /// The purchases as `in_app` entries. For a decoded receipt they are rendered from its purchases on every read (read
    /// once into a local, not entry by entry); writing the answer renders them straight into the JSON instead.
    public var inApp: [ReceiptTransactionInfo] {
        get { entries.rendered }
        set { entries = InAppEntries(rendered: newValue) }
    }
    var entries: InAppEntries

    /// Renders a decoded receipt; `requestDate` is when verifyReceipt handled it (nil for offline decoding).
    public init(_ receipt: AppReceipt, requestDate: Date?) {
        receiptType = receipt.receiptType.rawValue
        adamId = receipt.appItemId
        appItemId = receipt.appItemId
        bundleId = receipt.bundleId
        applicationVersion = receipt.applicationVersion
        downloadId = receipt.downloadId
        versionExternalIdentifier = receipt.versionExternalIdentifier
        receiptCreationDate = receipt.creationDate.map(ReceiptDateTriple.init)
        self.requestDate = requestDate.map(ReceiptDateTriple.init)
        originalPurchaseDate = receipt.originalPurchaseDate.map(ReceiptDateTriple.init)
        originalApplicationVersion = receipt.originalApplicationVersion
        expirationDate = receipt.expirationDate.map(ReceiptDateTriple.init)
        entries = InAppEntries(purchases: receipt.inApp)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: DynamicKey.self)
        try c.encode(receiptType, forKey: DynamicKey("receipt_type"))
        try c.encode(adamId, forKey: DynamicKey("adam_id"))
        try c.encode(appItemId, forKey: DynamicKey("app_item_id"))
        try c.encode(bundleId, forKey: DynamicKey("bundle_id"))
        try c.encode(applicationVersion, forKey: DynamicKey("application_version"))
        try c.encode(downloadId, forKey: DynamicKey("download_id"))
        try c.encode(versionExternalIdentifier, forKey: DynamicKey("version_external_identifier"))
        try c.encodeTriple(receiptCreationDate, "receipt_creation_date")
        try c.encodeTriple(requestDate, "request_date")
        try c.encodeTriple(originalPurchaseDate, "original_purchase_date")
        try c.encodeOptional(originalApplicationVersion, "original_application_version")
        try c.encodeTriple(expirationDate, "expiration_date")
        try c.encode(inApp, forKey: DynamicKey("in_app"))
    }

    /// Reads the `receipt` object of an app receipt's answer.
    public init(json: JSONValue) {
        let c = ReceiptFields(value: json)
        receiptType = c.string("receipt_type") ?? ""
        adamId = c.int64("adam_id") ?? 0
        appItemId = c.int64("app_item_id") ?? 0
        bundleId = c.string("bundle_id") ?? ""
        applicationVersion = c.string("application_version") ?? ""
        downloadId = c.int64("download_id") ?? 0
        versionExternalIdentifier = c.int64("version_external_identifier") ?? 0
        receiptCreationDate = c.triple("receipt_creation_date")
        requestDate = c.triple("request_date")
        originalPurchaseDate = c.triple("original_purchase_date")
        originalApplicationVersion = c.string("original_application_version")
        expirationDate = c.triple("expiration_date")
        entries = InAppEntries(rendered: (json["in_app"]?.array ?? []).compactMap(ReceiptTransactionInfo.init(json:)))
    }
}

/// A receipt's `in_app` entries: given as entries, or a decoded receipt's purchases, which are rendered only when asked
/// for (equal when their entries are).
struct InAppEntries: Sendable, Equatable {
    private enum Source: Sendable {
        case rendered([ReceiptTransactionInfo])
        case purchases([InAppPurchase])
    }
    private let source: Source

    init(rendered: [ReceiptTransactionInfo]) { source = .rendered(rendered) }
    init(purchases: [InAppPurchase]) { source = .purchases(purchases) }

    var count: Int {
        switch source {
        case .rendered(let entries): entries.count
        case .purchases(let purchases): purchases.count
        }
    }

    var rendered: [ReceiptTransactionInfo] {
        switch source {
        case .rendered(let entries): entries
        case .purchases(let purchases): purchases.map(ReceiptTransactionInfo.init)
        }
    }

    /// Writes the `in_app` array.
    func write(to json: inout JSONBuffer) {
        switch source {
        case .rendered(let entries): json.array(entries) { json, entry in entry.write(to: &json) }
        case .purchases(let purchases): json.array(purchases) { json, purchase in purchase.writeReceiptEntry(to: &json) }
        }
    }

    static func == (lhs: InAppEntries, rhs: InAppEntries) -> Bool { lhs.rendered == rhs.rendered }
}

/// One `pending_renewal_info` element.
public struct PendingRenewalInfo: Encodable, Sendable, Equatable {
    public var autoRenewProductId: String
    public var autoRenewStatus: String
    public var productId: String
    public var originalTransactionId: String
    public var expirationIntent: String?
    public var isInBillingRetryPeriod: String?
    public var gracePeriodExpiresDate: ReceiptDateTriple?
    public var priceConsentStatus: String?

    /// Creates an element.
    public init(autoRenewProductId: String, autoRenewStatus: String, productId: String, originalTransactionId: String,
                expirationIntent: String? = nil, isInBillingRetryPeriod: String? = nil,
                gracePeriodExpiresDate: ReceiptDateTriple? = nil, priceConsentStatus: String? = nil) {
        self.autoRenewProductId = autoRenewProductId
        self.autoRenewStatus = autoRenewStatus
        self.productId = productId
        self.originalTransactionId = originalTransactionId
        self.expirationIntent = expirationIntent
        self.isInBillingRetryPeriod = isInBillingRetryPeriod
        self.gracePeriodExpiresDate = gracePeriodExpiresDate
        self.priceConsentStatus = priceConsentStatus
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: DynamicKey.self)
        try c.encode(autoRenewProductId, forKey: DynamicKey("auto_renew_product_id"))
        try c.encode(autoRenewStatus, forKey: DynamicKey("auto_renew_status"))
        try c.encode(productId, forKey: DynamicKey("product_id"))
        try c.encode(originalTransactionId, forKey: DynamicKey("original_transaction_id"))
        try c.encodeOptional(expirationIntent, "expiration_intent")
        try c.encodeOptional(isInBillingRetryPeriod, "is_in_billing_retry_period")
        try c.encodeTriple(gracePeriodExpiresDate, "grace_period_expires_date")
        try c.encodeOptional(priceConsentStatus, "price_consent_status")
    }

    /// Reads one `pending_renewal_info` element.
    public init(json: JSONValue) {
        let c = ReceiptFields(value: json)
        self.init(autoRenewProductId: c.string("auto_renew_product_id") ?? "", autoRenewStatus: c.string("auto_renew_status") ?? "0",
                  productId: c.string("product_id") ?? "", originalTransactionId: c.string("original_transaction_id") ?? "",
                  expirationIntent: c.string("expiration_intent"), isInBillingRetryPeriod: c.string("is_in_billing_retry_period"),
                  gracePeriodExpiresDate: c.triple("grace_period_expires_date"), priceConsentStatus: c.string("price_consent_status"))
    }
}

/// The verifyReceipt response for app receipts (and for every error status).
public struct VerifyReceiptResponse: Encodable, Sendable {
    public var status: Int
    public var environment: AppStoreEnvironment?
    public var receipt: ReceiptInfo?
    public var latestReceiptInfo: [ReceiptTransactionInfo]?
    public var latestReceipt: String?
    public var pendingRenewalInfo: [PendingRenewalInfo]?
    public var isRetryable: Bool?
    public var exception: String?

    enum CodingKeys: String, CodingKey {
        case status, environment, receipt, exception
        case latestReceiptInfo = "latest_receipt_info"
        case latestReceipt = "latest_receipt"
        case pendingRenewalInfo = "pending_renewal_info"
        case isRetryable = "is_retryable"
        case legacyIsRetryable = "is-retryable"
    }

    /// Creates a response.
    public init(status: Int, environment: AppStoreEnvironment? = nil, receipt: ReceiptInfo? = nil,
                latestReceiptInfo: [ReceiptTransactionInfo]? = nil, latestReceipt: String? = nil,
                pendingRenewalInfo: [PendingRenewalInfo]? = nil, isRetryable: Bool? = nil, exception: String? = nil) {
        self.status = status
        self.environment = environment
        self.receipt = receipt
        self.latestReceiptInfo = latestReceiptInfo
        self.latestReceipt = latestReceipt
        self.pendingRenewalInfo = pendingRenewalInfo
        self.isRetryable = isRetryable
        self.exception = exception
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(status, forKey: .status)
        try c.encodeIfPresent(environment, forKey: .environment)
        try c.encodeIfPresent(receipt, forKey: .receipt)
        try c.encodeIfPresent(latestReceiptInfo, forKey: .latestReceiptInfo)
        try c.encodeIfPresent(latestReceipt, forKey: .latestReceipt)
        try c.encodeIfPresent(pendingRenewalInfo, forKey: .pendingRenewalInfo)
        try c.encodeIfPresent(isRetryable, forKey: .isRetryable)
        try c.encodeIfPresent(exception, forKey: .exception)
    }

    /// Reads a verifyReceipt answer; throws unless it is a JSON object with a numeric `status`.
    public init(jsonBytes bytes: some Collection<UInt8>) throws(JSONParseError) {
        let json = try JSONValue.parse(bytes)
        guard json.isObject else { throw JSONParseError(offset: 0, message: "the answer is not a JSON object") }
        guard let status = json["status"].flatMap({ if case .number(let text) = $0 { Int(text) } else { nil } }) else {
            throw JSONParseError(offset: 0, message: "the answer has no numeric status")
        }
        self.status = status
        environment = json["environment"]?.text.flatMap(AppStoreEnvironment.init(rawValue:))
        receipt = json["receipt"].flatMap { $0.isObject ? ReceiptInfo(json: $0) : nil }
        latestReceiptInfo = json["latest_receipt_info"]?.array?.compactMap(ReceiptTransactionInfo.init(json:))
        latestReceipt = json["latest_receipt"]?.text
        pendingRenewalInfo = json["pending_renewal_info"]?.array?.filter(\.isObject).map(PendingRenewalInfo.init(json:))
        // Apple's docs say is-retryable, real responses say is_retryable; accept both, and 0/1.
        isRetryable = json["is_retryable"]?.bool ?? json["is-retryable"]?.bool
        exception = json["exception"]?.text
    }
}
