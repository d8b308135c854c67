import Foundation

/// A price of a product in one storefront.
public struct ProductPrice: Codable, Sendable, Equatable {
    /// ISO 3166-1 alpha-3 storefront, e.g. `USA`, `JPN`, `CHN`.
    public var storefront: String
    /// ISO 4217 currency code.
    public var currency: String
    /// Decimal amount as text (`"0.99"`, `"120"`).
    public var amount: String

    /// Creates a price.
    public init(storefront: String, currency: String, amount: String) {
        self.storefront = storefront
        self.currency = currency
        self.amount = amount
    }

    /// The amount in milliunits, as StoreKit 2 reports prices.
    public var milliunits: Int64 {
        let decimal = Decimal(string: amount) ?? 0
        return NSDecimalNumber(decimal: decimal * 1000).int64Value
    }
}

/// A display name and description in one locale.
public struct ProductLocalization: Codable, Sendable, Equatable {
    /// Locale identifier such as `en_US` or `zh_CN`.
    public var locale: String
    public var displayName: String
    public var description: String

    /// Creates a localization.
    public init(locale: String, displayName: String, description: String) {
        self.locale = locale
        self.displayName = displayName
        self.description = description
    }
}

/// An introductory offer of an auto-renewable subscription.
public struct IntroductoryOffer: Codable, Sendable, Equatable {
    /// How the customer pays during the offer.
    public enum PaymentMode: String, Codable, Sendable {
        case free = "free"
        case payAsYouGo = "payAsYouGo"
        case payUpFront = "payUpFront"

        /// StoreKit 2's `offerDiscountType` for it.
        public var discountType: String {
            switch self {
            case .free: "FREE_TRIAL"
            case .payAsYouGo: "PAY_AS_YOU_GO"
            case .payUpFront: "PAY_UP_FRONT"
            }
        }
    }
    public var paymentMode: PaymentMode
    /// The length of one offer period.
    public var period: SubscriptionPeriod
    /// How many periods the offer lasts (pay as you go), 1 otherwise.
    public var numberOfPeriods: Int
    /// The offer price, absent for free trials.
    public var amount: String?

    /// Creates an offer.
    public init(paymentMode: PaymentMode, period: SubscriptionPeriod, numberOfPeriods: Int = 1, amount: String? = nil) {
        self.paymentMode = paymentMode
        self.period = period
        self.numberOfPeriods = numberOfPeriods
        self.amount = amount
    }
}

/// A promotional offer of an auto-renewable subscription (App Store Connect's "subscription offers").
public struct PromotionalOffer: Codable, Sendable, Equatable {
    /// The identifier the app passes with the signed payment (`offerID` in a .storekit file).
    public var offerId: String
    public var paymentMode: IntroductoryOffer.PaymentMode
    public var period: SubscriptionPeriod
    public var numberOfPeriods: Int
    /// The offer price, absent when free.
    public var amount: String?

    /// Offer codes only: who may redeem it (`new` never subscribed to the group, `existing` subscribed now,
    /// `expired` subscribed before); nil or empty: anyone. Whether it may stack on another offer is kept as written.
    public var eligibility: [String]?
    public var isStackable: Bool?

    /// The eligibility values a `.storekit` file writes.
    public static let eligibilityValues: Set<String> = ["new", "existing", "expired"]

    public init(offerId: String, paymentMode: IntroductoryOffer.PaymentMode, period: SubscriptionPeriod, numberOfPeriods: Int = 1, amount: String? = nil) {
        self.offerId = offerId
        self.paymentMode = paymentMode
        self.period = period
        self.numberOfPeriods = numberOfPeriods
        self.amount = amount
    }
}

/// An offer code of a one-time purchase (a consumable, non-consumable or non-renewing subscription; 2025): the
/// customer redeems it in the App Store and gets the product for `amount` (free when nil), reported with
/// `offerType` 3 and `offerDiscountType` `ONE_TIME`.
public struct OneTimeOfferCode: Codable, Sendable, Equatable {
    /// The offer's reference name, reported as `offerIdentifier`.
    public var offerId: String
    public var amount: String?

    /// Creates an offer code.
    public init(offerId: String, amount: String? = nil) {
        self.offerId = offerId
        self.amount = amount
    }
}

/// An in-app purchase product as App Store Connect holds it.
public struct CatalogProduct: Codable, Sendable, Equatable {
    public var productId: String
    public var type: ProductType
    public var referenceName: String
    /// The price tier, when the price came from one.
    public var priceTier: Int?
    /// Prices per storefront.
    public var prices: [ProductPrice]
    public var localizations: [ProductLocalization]
    public var reviewState: ReviewState
    public var clearedForSale: Bool
    public var familyShareable: Bool
    /// Subscription group id (auto-renewables).
    public var subscriptionGroupId: String?
    /// Level inside the group, 1 = highest.
    public var groupLevel: Int?
    /// Renewal period (auto-renewables) or duration (non-renewing, informational).
    public var period: SubscriptionPeriod?
    public var introductoryOffer: IntroductoryOffer?
    /// Promotional offers (auto-renewables): the app offers them to current and lapsed subscribers with a signature.
    public var promotionalOffers: [PromotionalOffer] = []
    /// Win-back offers (`winbackOffers` in a .storekit file): read and kept; not yet offered to lapsed subscribers.
    public var winBackOffers: [PromotionalOffer] = []
    /// Offer codes (auto-renewables): one-time codes customers redeem in the App Store (`offerId` is the reference name).
    public var offerCodes: [PromotionalOffer] = []
    /// Offer codes of a one-time purchase (consumables, non-consumables, non-renewing subscriptions).
    public var oneTimeOfferCodes: [OneTimeOfferCode] = []
    /// Auto-renewables: how the customer may pay (`billingPlans` in a .storekit file, 2026); empty: up front only.
    public var billingPlans: [BillingPlan] = []

    /// Creates a product.
    public init(productId: String, type: ProductType, referenceName: String, priceTier: Int? = nil, prices: [ProductPrice],
                localizations: [ProductLocalization] = [], reviewState: ReviewState = .readyForSale, clearedForSale: Bool = true,
                familyShareable: Bool = false, subscriptionGroupId: String? = nil, groupLevel: Int? = nil,
                period: SubscriptionPeriod? = nil, introductoryOffer: IntroductoryOffer? = nil) {
        self.productId = productId
        self.type = type
        self.referenceName = referenceName
        self.priceTier = priceTier
        self.prices = prices
        self.localizations = localizations
        self.reviewState = reviewState
        self.clearedForSale = clearedForSale
        self.familyShareable = familyShareable
        self.subscriptionGroupId = subscriptionGroupId
        self.groupLevel = groupLevel
        self.period = period
        self.introductoryOffer = introductoryOffer
    }

    /// The enabled billing plan of `type`, if the product offers it (up front is always offered at the product's price).
    public func billingPlan(_ type: BillingPlan.Kind) -> BillingPlan? {
        billingPlans.first { $0.type == type && $0.isEnabled }
    }

    /// The price for a storefront, falling back to the first price.
    public func price(for storefront: String) -> ProductPrice? {
        prices.first { $0.storefront == storefront } ?? prices.first
    }

    /// The localization for a locale, falling back by language and then to the first one.
    public func localization(for locale: String) -> ProductLocalization? {
        let language = locale.split(whereSeparator: { $0 == "_" || $0 == "-" }).first.map(String.init)
        return localizations.first { $0.locale == locale }
            ?? localizations.first { $0.locale.hasPrefix((language ?? "") + "_") || $0.locale == language }
            ?? localizations.first
    }

    /// Apple's product identifier rule: letters, digits, periods and underscores, not empty.
    public static func isValidIdentifier(_ identifier: String) -> Bool {
        !identifier.isEmpty && identifier.count <= 100
            && identifier.unicodeScalars.allSatisfy { ($0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0))) || $0 == "." || $0 == "_" }
    }
}

/// An app as App Store Connect holds it.
public struct CatalogApp: Codable, Sendable, Equatable {
    public var bundleId: String
    /// The app's Apple id (`app_item_id` in production receipts).
    public var appAppleId: Int64
    /// How many periods an introductory, promotional or offer-code offer may run (App Store Connect's limit).
    public static let offerPeriods: ClosedRange<Int> = 1...12
    public var name: String
    /// The app-specific shared secret verifyReceipt checks.
    public var sharedSecret: String
    /// The app version written into receipts.
    public var version: String
    public var products: [CatalogProduct]
    /// Subscription group names by id.
    public var subscriptionGroups: [String: String]
    /// StoreKit Testing's switches from a `.storekit` file's `settings`, applied to this app's purchases and renewals.
    public var testSettings: StoreKitTestSettings?
    /// A `.storekit` file's `appPolicies` (the EULA and privacy policies), kept so an export writes them back.
    public var appPolicies: AppPolicies?

    /// Creates an app.
    public init(bundleId: String, appAppleId: Int64, name: String, sharedSecret: String, version: String = "1.0",
                products: [CatalogProduct] = [], subscriptionGroups: [String: String] = [:]) {
        self.bundleId = bundleId
        self.appAppleId = appAppleId
        self.name = name
        self.sharedSecret = sharedSecret
        self.version = version
        self.products = products
        self.subscriptionGroups = subscriptionGroups
    }
}

/// An app's license agreement and policies as a `.storekit` file (and App Store Connect) holds them.
public struct AppPolicies: Codable, Sendable, Equatable {
    /// One policy in one locale.
    public struct Policy: Codable, Sendable, Equatable {
        public var locale: String
        public var policyText: String
        public var policyURL: String
        public init(locale: String, policyText: String, policyURL: String) {
            self.locale = locale
            self.policyText = policyText
            self.policyURL = policyURL
        }
    }
    /// The custom license agreement's text (empty: Apple's standard EULA).
    public var eula: String
    public var policies: [Policy]
    public init(eula: String = "", policies: [Policy] = []) {
        self.eula = eula
        self.policies = policies
    }
}

/// Storekeeper's own catalog file: apps with every product attribute.
public struct CatalogFile: Codable, Sendable {
    public var apps: [CatalogApp]
    /// Creates a file.
    public init(apps: [CatalogApp]) { self.apps = apps }
}
