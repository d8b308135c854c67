import Foundation

/// Apple's `JWSTransactionDecodedPayload` (reference §3.4): one transaction as StoreKit 2, the App Store
/// Server API and notifications sign it. Dates are integer Unix milliseconds; absent values are omitted.
public struct JWSTransaction: Sendable, Equatable {
    public var transactionId: String
    public var originalTransactionId: String
    public var webOrderLineItemId: String?
    public var bundleId: String
    public var productId: String
    public var subscriptionGroupIdentifier: String?
    public var purchaseDate: Int64
    public var originalPurchaseDate: Int64
    public var expiresDate: Int64?
    public var quantity: Int
    /// `Auto-Renewable Subscription`, `Non-Consumable`, `Consumable`, `Non-Renewing Subscription`.
    public var type: String
    public var appAccountToken: String?
    /// `PURCHASED` or `FAMILY_SHARED`.
    public var inAppOwnershipType: String
    public var signedDate: Int64
    public var revocationReason: Int?
    public var revocationDate: Int64?
    public var isUpgraded: Bool?
    public var offerType: Int?
    public var offerIdentifier: String?
    /// `Sandbox` or `Production` (`Xcode`, `LocalTesting` in Apple's local tools).
    public var environment: String
    public var storefront: String?
    public var storefrontId: String?
    /// `PURCHASE` or `RENEWAL`.
    public var transactionReason: String?
    public var currency: String?
    /// Price in milliunits (¥230 → 230000).
    public var price: Int64?
    /// The app download's id, the same as the AppTransaction's (2025).
    public var appTransactionId: String?
    /// The offer's whole duration (ISO 8601, `P3M`) and how it is paid (`FREE_TRIAL`, `PAY_AS_YOU_GO`, `PAY_UP_FRONT`).
    public var offerPeriod: String?
    public var offerDiscountType: String?
    /// Why it was revoked (`REFUND_FULL`, `REFUND_PRORATED`, `FAMILY_REVOKE`) and, for refunds, how much in milliunits of a whole.
    public var revocationType: String?
    public var revocationPercentage: Int?
    /// `BILLED_UPFRONT` or `MONTHLY` (a yearly subscription paid monthly over a 12-month commitment, 2026), and
    /// for monthly plans which installment this is of which commitment.
    public var billingPlanType: String?
    public var commitmentInfo: TransactionCommitmentInfo?

    public init(transactionId: String, originalTransactionId: String, webOrderLineItemId: String? = nil, bundleId: String, productId: String,
                subscriptionGroupIdentifier: String? = nil, purchaseDate: Int64, originalPurchaseDate: Int64, expiresDate: Int64? = nil,
                quantity: Int, type: String, appAccountToken: String? = nil, inAppOwnershipType: String = "PURCHASED", signedDate: Int64,
                revocationReason: Int? = nil, revocationDate: Int64? = nil, isUpgraded: Bool? = nil, offerType: Int? = nil,
                offerIdentifier: String? = nil, environment: String, storefront: String? = nil, storefrontId: String? = nil,
                transactionReason: String? = nil, currency: String? = nil, price: Int64? = nil) {
        self.transactionId = transactionId
        self.originalTransactionId = originalTransactionId
        self.webOrderLineItemId = webOrderLineItemId
        self.bundleId = bundleId
        self.productId = productId
        self.subscriptionGroupIdentifier = subscriptionGroupIdentifier
        self.purchaseDate = purchaseDate
        self.originalPurchaseDate = originalPurchaseDate
        self.expiresDate = expiresDate
        self.quantity = quantity
        self.type = type
        self.appAccountToken = appAccountToken
        self.inAppOwnershipType = inAppOwnershipType
        self.signedDate = signedDate
        self.revocationReason = revocationReason
        self.revocationDate = revocationDate
        self.isUpgraded = isUpgraded
        self.offerType = offerType
        self.offerIdentifier = offerIdentifier
        self.environment = environment
        self.storefront = storefront
        self.storefrontId = storefrontId
        self.transactionReason = transactionReason
        self.currency = currency
        self.price = price
    }

    /// The payload's JSON, keys in Apple's documented order.
    public func jsonBytes() -> [UInt8] {
        var json = JSONBuffer(capacity: 768)
        json.object { json in
            json.field("transactionId", transactionId)
            json.field("originalTransactionId", originalTransactionId)
            json.field("webOrderLineItemId", webOrderLineItemId)
            json.field("bundleId", bundleId)
            json.field("productId", productId)
            json.field("subscriptionGroupIdentifier", subscriptionGroupIdentifier)
            json.field("purchaseDate", purchaseDate)
            json.field("originalPurchaseDate", originalPurchaseDate)
            if let expiresDate { json.field("expiresDate", expiresDate) }
            json.field("quantity", Int64(quantity))
            json.field("type", type)
            json.field("appAccountToken", appAccountToken)
            json.field("inAppOwnershipType", inAppOwnershipType)
            json.field("signedDate", signedDate)
            if let revocationReason { json.field("revocationReason", Int64(revocationReason)) }
            if let revocationDate { json.field("revocationDate", revocationDate) }
            if let isUpgraded { json.field("isUpgraded", isUpgraded) }
            if let offerType { json.field("offerType", Int64(offerType)) }
            json.field("offerIdentifier", offerIdentifier)
            json.field("environment", environment)
            json.field("storefront", storefront)
            json.field("storefrontId", storefrontId)
            json.field("transactionReason", transactionReason)
            json.field("currency", currency)
            if let price { json.field("price", price) }
            json.field("appTransactionId", appTransactionId)
            json.field("offerPeriod", offerPeriod)
            json.field("offerDiscountType", offerDiscountType)
            json.field("revocationType", revocationType)
            if let revocationPercentage { json.field("revocationPercentage", Int64(revocationPercentage)) }
            json.field("billingPlanType", billingPlanType)
            if let commitmentInfo {
                json.key("commitmentInfo")
                commitmentInfo.write(into: &json)
            }
        }
        return json.bytes
    }

    /// Reads a decoded payload; nil without the fields every transaction has.
    public init?(json: JSONValue) {
        guard let transactionId = json["transactionId"]?.text, let bundleId = json["bundleId"]?.text,
              let productId = json["productId"]?.text, let purchaseDate = json["purchaseDate"].flatMap(Self.milliseconds),
              let environment = json["environment"]?.text else { return nil }
        self.init(transactionId: transactionId, originalTransactionId: json["originalTransactionId"]?.text ?? transactionId,
                  webOrderLineItemId: json["webOrderLineItemId"]?.text, bundleId: bundleId, productId: productId,
                  subscriptionGroupIdentifier: json["subscriptionGroupIdentifier"]?.text, purchaseDate: purchaseDate,
                  originalPurchaseDate: json["originalPurchaseDate"].flatMap(Self.milliseconds) ?? purchaseDate,
                  expiresDate: json["expiresDate"].flatMap(Self.milliseconds), quantity: json["quantity"]?.int64.map(Int.init) ?? 1,
                  type: json["type"]?.text ?? "", appAccountToken: json["appAccountToken"]?.text,
                  inAppOwnershipType: json["inAppOwnershipType"]?.text ?? "PURCHASED",
                  signedDate: json["signedDate"].flatMap(Self.milliseconds) ?? purchaseDate,
                  revocationReason: json["revocationReason"]?.int64.map(Int.init), revocationDate: json["revocationDate"].flatMap(Self.milliseconds),
                  isUpgraded: json["isUpgraded"]?.bool, offerType: json["offerType"]?.int64.map(Int.init),
                  offerIdentifier: json["offerIdentifier"]?.text, environment: environment, storefront: json["storefront"]?.text,
                  storefrontId: json["storefrontId"]?.text, transactionReason: json["transactionReason"]?.text,
                  currency: json["currency"]?.text, price: json["price"]?.int64)
        appTransactionId = json["appTransactionId"]?.text
        offerPeriod = json["offerPeriod"]?.text
        offerDiscountType = json["offerDiscountType"]?.text
        revocationType = json["revocationType"]?.text
        revocationPercentage = json["revocationPercentage"]?.int64.flatMap { (0...100_000).contains($0) ? Int($0) : nil }
        billingPlanType = json["billingPlanType"]?.text
        commitmentInfo = TransactionCommitmentInfo(json: json["commitmentInfo"])
    }

    /// Milliseconds from an integer, or from Xcode's fractional milliseconds (`1697679936049.7297`);
    /// nil outside 1970…9999 (this runs before the signature is checked: no value may trap).
    static func milliseconds(_ value: JSONValue) -> Int64? {
        guard case .number(let text) = value else { return nil }
        guard let millis = Int64(text) ?? Double(text).flatMap({ Int64(exactly: $0.rounded(.down)) }) else { return nil }
        return acceptedMilliseconds.contains(millis) ? millis : nil
    }

    /// 1970-01-01 … 9999-12-31 in Unix milliseconds.
    static let acceptedMilliseconds: ClosedRange<Int64> = 0...253_402_300_799_999
}

extension ProductType {
    /// The `type` string of a JWS transaction.
    public var jwsTypeName: String {
        switch self {
        case .consumable: return "Consumable"
        case .nonConsumable, .freeSubscription: return "Non-Consumable"
        case .autoRenewable: return "Auto-Renewable Subscription"
        case .nonRenewing: return "Non-Renewing Subscription"
        }
    }

    /// The product type a JWS `type` string names.
    public init?(jwsTypeName: String) {
        switch jwsTypeName {
        case "Consumable": self = .consumable
        case "Non-Consumable": self = .nonConsumable
        case "Auto-Renewable Subscription": self = .autoRenewable
        case "Non-Renewing Subscription": self = .nonRenewing
        default: return nil
        }
    }
}

/// Apple storefront ids for the alpha-3 storefronts the emulator knows.
public enum StorefrontId {
    static let ids = ["USA": "143441", "JPN": "143462", "CHN": "143465", "GBR": "143444", "DEU": "143443", "FRA": "143442",
                      "CAN": "143455", "AUS": "143460", "KOR": "143466", "BRA": "143503", "IND": "143467", "ESP": "143454",
                      "ITA": "143450", "MEX": "143468", "NLD": "143452", "RUS": "143469", "CHE": "143459", "SWE": "143456"]

    public static func forStorefront(_ storefront: String) -> String? { ids[storefront.uppercased()] }
}

/// Prices in milliunits, as JWS transactions carry them.
public enum Milliunits {
    /// `"0.99"` → 990, `"120"` → 120000; nil if not a decimal amount.
    public static func from(_ amount: String) -> Int64? {
        guard let decimal = Decimal(string: amount, locale: Locale(identifier: "en_US_POSIX")) else { return nil }
        var scaled = decimal * 1000
        var rounded = Decimal()
        NSDecimalRound(&rounded, &scaled, 0, .plain)
        return Int64(exactly: NSDecimalNumber(decimal: rounded).int64Value)
    }
}

extension StringProtocol {
    /// Whether the text is one or more ASCII digits, as the App Store writes transaction ids. `Character.isNumber` also
    /// takes other scripts' digits, fractions and Roman numerals, and costs a Unicode property lookup per character.
    public var isASCIIDigits: Bool { !isEmpty && utf8.allSatisfy { $0 >= 0x30 && $0 <= 0x39 } }
}
