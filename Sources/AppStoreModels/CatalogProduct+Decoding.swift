import Foundation

extension CatalogProduct {
    enum Keys: String, CodingKey {
        case productId, type, referenceName, priceTier, prices, price, currency, storefront, localizations, reviewState
        case clearedForSale, familyShareable, subscriptionGroupId, groupLevel, period, introductoryOffer, promotionalOffers, offerCodes, winBackOffers
        case oneTimeOfferCodes, billingPlans
    }

    /// Decodes leniently: only `productId` and `type` are required; `price` + `currency` is a shorthand for one USA price.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        let productId = try c.decode(String.self, forKey: .productId)
        let typeName = try c.decode(String.self, forKey: .type)
        guard let type = ProductType(loose: typeName) else {
            throw DecodingError.dataCorruptedError(forKey: .type, in: c, debugDescription: "unknown product type '\(typeName)'")
        }
        var prices = try c.decodeIfPresent([ProductPrice].self, forKey: .prices) ?? []
        if prices.isEmpty, let amount = try c.decodeIfPresent(String.self, forKey: .price) {
            let storefront = try c.decodeIfPresent(String.self, forKey: .storefront) ?? "USA"
            let currency = try c.decodeIfPresent(String.self, forKey: .currency) ?? Storefront.currency(for: storefront)
            prices = [ProductPrice(storefront: storefront, currency: currency, amount: amount)]
        }
        let tier = try c.decodeIfPresent(Int.self, forKey: .priceTier)
        if let tier, !PriceTier.tiers.contains(tier) {
            throw DecodingError.dataCorruptedError(forKey: .priceTier, in: c, debugDescription: "price tiers run 0…87")
        }
        if prices.isEmpty, let tier { prices = PriceTier.prices(tier: tier) }
        var reviewState = ReviewState.readyForSale
        if let text = try c.decodeIfPresent(String.self, forKey: .reviewState) {
            guard let state = ReviewState(loose: text) else {
                throw DecodingError.dataCorruptedError(forKey: .reviewState, in: c, debugDescription: "unknown review state '\(text)'")
            }
            reviewState = state
        }
        var period: SubscriptionPeriod?
        if let text = try c.decodeIfPresent(String.self, forKey: .period) {
            guard let parsed = SubscriptionPeriod(loose: text) else {
                throw DecodingError.dataCorruptedError(forKey: .period, in: c, debugDescription: "unknown period '\(text)'")
            }
            period = parsed
        }
        self.init(productId: productId, type: type,
                  referenceName: try c.decodeIfPresent(String.self, forKey: .referenceName) ?? productId,
                  priceTier: tier, prices: prices,
                  localizations: try c.decodeIfPresent([ProductLocalization].self, forKey: .localizations) ?? [],
                  reviewState: reviewState,
                  clearedForSale: try c.decodeIfPresent(Bool.self, forKey: .clearedForSale) ?? true,
                  familyShareable: try c.decodeIfPresent(Bool.self, forKey: .familyShareable) ?? false,
                  subscriptionGroupId: try c.decodeIfPresent(String.self, forKey: .subscriptionGroupId),
                  groupLevel: try c.decodeIfPresent(Int.self, forKey: .groupLevel),
                  period: period,
                  introductoryOffer: try c.decodeIfPresent(IntroductoryOffer.self, forKey: .introductoryOffer))
        promotionalOffers = try c.decodeIfPresent([PromotionalOffer].self, forKey: .promotionalOffers) ?? []
        offerCodes = try c.decodeIfPresent([PromotionalOffer].self, forKey: .offerCodes) ?? []
        winBackOffers = try c.decodeIfPresent([PromotionalOffer].self, forKey: .winBackOffers) ?? []
        oneTimeOfferCodes = try c.decodeIfPresent([OneTimeOfferCode].self, forKey: .oneTimeOfferCodes) ?? []
        billingPlans = try c.decodeIfPresent([BillingPlan].self, forKey: .billingPlans) ?? []
    }
}

extension CatalogApp {
    enum Keys: String, CodingKey {
        case bundleId, appAppleId, name, sharedSecret, version, products, subscriptionGroups, testSettings, appPolicies
    }

    /// Decodes leniently: only `bundleId` is required.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        let bundleId = try c.decode(String.self, forKey: .bundleId)
        self.init(bundleId: bundleId,
                  appAppleId: try c.decodeIfPresent(Int64.self, forKey: .appAppleId) ?? CatalogApp.derivedAppleId(bundleId),
                  name: try c.decodeIfPresent(String.self, forKey: .name) ?? bundleId,
                  sharedSecret: try c.decodeIfPresent(String.self, forKey: .sharedSecret) ?? CatalogApp.derivedSharedSecret(bundleId),
                  version: try c.decodeIfPresent(String.self, forKey: .version) ?? "1.0",
                  products: try c.decodeIfPresent([CatalogProduct].self, forKey: .products) ?? [],
                  subscriptionGroups: try c.decodeIfPresent([String: String].self, forKey: .subscriptionGroups) ?? [:])
        testSettings = try c.decodeIfPresent(StoreKitTestSettings.self, forKey: .testSettings)
        appPolicies = try c.decodeIfPresent(AppPolicies.self, forKey: .appPolicies)
    }

    /// A stable 10-digit Apple id derived from the bundle id (FNV-1a), for apps that do not name one.
    public static func derivedAppleId(_ bundleId: String) -> Int64 {
        var hash: UInt64 = 0xcbf29ce484222325
        for byte in bundleId.utf8 { hash = (hash ^ UInt64(byte)) &* 0x100000001b3 }
        return 1_000_000_000 + Int64(hash % 8_999_999_999)
    }

    /// A stable 32-hex-digit shared secret derived from the bundle id, for apps that do not name one.
    public static func derivedSharedSecret(_ bundleId: String) -> String {
        var hash: UInt64 = 0x84222325cbf29ce4
        var text = ""
        for round in 0..<2 {
            for byte in (bundleId + String(round)).utf8 { hash = (hash ^ UInt64(byte)) &* 0x100000001b3 }
            text += String(hash, radix: 16).leftPadded(to: 16)
        }
        return text
    }
}

extension String {
    func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}
