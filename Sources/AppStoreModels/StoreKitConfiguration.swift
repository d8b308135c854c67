import Foundation

/// An Xcode `.storekit` configuration file (versions 2.0–5.0), read leniently: unknown keys are ignored.
public struct StoreKitConfiguration: Sendable {
    /// A file that cannot be read as a StoreKit configuration.
    public struct ParseError: Error, CustomStringConvertible {
        public let description: String
    }

    /// The products of every section, as catalog products (Ready for Sale, cleared).
    public var products: [CatalogProduct]
    /// Subscription group names by id.
    public var subscriptionGroups: [String: String]
    /// `settings._timeRate` mapped to a renewal rate, when set.
    public var renewalRate: RenewalRate?
    /// `settings._storefront`, default USA.
    public var storefront: String
    /// `settings._locale`, default en_US.
    public var locale: String
    /// `settings._askToBuyEnabled`.
    public var askToBuyEnabled: Bool
    /// The whole `settings` block, applied to the app by the emulator.
    public var settings: StoreKitTestSettings
    /// `version.major`.`minor`, when present.
    public var version: String?
    /// `appPolicies`: the license agreement and policies, when the file has them.
    public var appPolicies: AppPolicies?

    /// Parses the JSON of a `.storekit` file.
    public init(data: Data) throws {
        guard let root = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            throw ParseError(description: "not a JSON object")
        }
        let settings = root["settings"] as? [String: Any] ?? [:]
        let storefrontCode = settings["_storefront"] as? String ?? "USA"
        storefront = storefrontCode
        locale = settings["_locale"] as? String ?? "en_US"
        askToBuyEnabled = settings["_askToBuyEnabled"] as? Bool ?? false
        renewalRate = (settings["_timeRate"] as? Int).flatMap(RenewalRate.init(storeKitTimeRate:))
        self.settings = StoreKitTestSettings(storeKit: settings)
        if let version = root["version"] as? [String: Any], let major = version["major"] as? Int {
            self.version = "\(major).\(version["minor"] as? Int ?? 0)"
        }
        if let policies = root["appPolicies"] as? [String: Any] {
            appPolicies = AppPolicies(eula: policies["eula"] as? String ?? "", policies: (policies["policies"] as? [[String: Any]] ?? []).map {
                AppPolicies.Policy(locale: $0["locale"] as? String ?? "", policyText: $0["policyText"] as? String ?? "",
                                   policyURL: $0["policyURL"] as? String ?? "")
            })
        }
        let currency = Storefront.currency(for: storefrontCode)
        var products: [CatalogProduct] = []
        var groups: [String: String] = [:]

        func product(_ entry: [String: Any], fallbackType: ProductType) throws -> CatalogProduct {
            guard let productId = entry["productID"] as? String else { throw ParseError(description: "a product has no productID") }
            let type = (entry["type"] as? String).flatMap(ProductType.init(loose:)) ?? fallbackType
            let localizations = (entry["localizations"] as? [[String: Any]] ?? []).map {
                ProductLocalization(locale: $0["locale"] as? String ?? "en_US",
                                    displayName: $0["displayName"] as? String ?? productId,
                                    description: $0["description"] as? String ?? "")
            }
            let amount = StoreKitConfiguration.priceText(entry["displayPrice"]) ?? "0"
            return CatalogProduct(productId: productId, type: type, referenceName: entry["referenceName"] as? String ?? productId,
                                  prices: [ProductPrice(storefront: storefrontCode, currency: currency, amount: amount)],
                                  localizations: localizations, familyShareable: entry["familyShareable"] as? Bool ?? false)
        }

        for entry in root["products"] as? [[String: Any]] ?? [] {
            var item = try product(entry, fallbackType: .consumable)
            // Xcode has no "free subscription" type; a free non-consumable is how one is written.
            if item.type == .nonConsumable, let price = item.prices.first, Decimal(string: price.amount) == 0 { item.type = .freeSubscription }
            item.oneTimeOfferCodes = StoreKitConfiguration.oneTimeOfferCodes(entry)
            products.append(item)
        }
        for entry in root["nonRenewingSubscriptions"] as? [[String: Any]] ?? [] {
            var item = try product(entry, fallbackType: .nonRenewing)
            item.type = .nonRenewing
            item.oneTimeOfferCodes = StoreKitConfiguration.oneTimeOfferCodes(entry)
            products.append(item)
        }
        for group in root["subscriptionGroups"] as? [[String: Any]] ?? [] {
            let groupId = group["id"] as? String ?? UUID().uuidString
            groups[groupId] = group["name"] as? String ?? groupId
            for entry in group["subscriptions"] as? [[String: Any]] ?? [] {
                var item = try product(entry, fallbackType: .autoRenewable)
                item.type = .autoRenewable
                item.subscriptionGroupId = entry["subscriptionGroupID"] as? String ?? groupId
                item.groupLevel = entry["groupNumber"] as? Int ?? 1
                item.period = (entry["recurringSubscriptionPeriod"] as? String).flatMap(SubscriptionPeriod.init(loose:)) ?? .oneMonth
                // Version 5 lists one introductory offer per billing plan: the up-front plan's is the product's (else the first).
                let listed = entry["introductoryOffers"] as? [[String: Any]]
                let upFront = listed?.first {
                    ($0["billingPlanType"] as? String).flatMap(BillingPlan.Kind.init(loose:)).map { $0 == .billedUpfront } ?? true
                }
                let offer = (entry["introductoryOffer"] as? [String: Any]) ?? upFront ?? listed?.first
                if let offer, let mode = (offer["paymentMode"] as? String).flatMap(IntroductoryOffer.PaymentMode.init(rawValue:)) {
                    item.introductoryOffer = IntroductoryOffer(
                        paymentMode: mode,
                        period: (offer["subscriptionPeriod"] as? String).flatMap(SubscriptionPeriod.init(loose:)) ?? .oneWeek,
                        numberOfPeriods: offer["numberOfPeriods"] as? Int ?? 1,
                        amount: StoreKitConfiguration.priceText(offer["displayPrice"]))
                }
                func promotionalOffer(_ promotion: [String: Any]) -> PromotionalOffer? {
                    guard let id = promotion["offerID"] as? String ?? promotion["referenceName"] as? String,
                          let mode = (promotion["paymentMode"] as? String).flatMap(IntroductoryOffer.PaymentMode.init(rawValue:)) else { return nil }
                    var offer = PromotionalOffer(
                        offerId: id, paymentMode: mode,
                        period: (promotion["subscriptionPeriod"] as? String).flatMap(SubscriptionPeriod.init(loose:)) ?? item.period ?? .oneMonth,
                        numberOfPeriods: promotion["numberOfPeriods"] as? Int ?? 1,
                        amount: StoreKitConfiguration.priceText(promotion["displayPrice"]))
                    // Offer codes say who may redeem them (new, existing, expired subscribers) and whether they stack.
                    // Values kept as written: one the emulator does not know matches no customer (fails closed).
                    if let eligibility = promotion["eligibility"] as? [String] { offer.eligibility = eligibility }
                    offer.isStackable = promotion["isStackable"] as? Bool
                    return offer
                }
                func offers(_ key: String) -> [PromotionalOffer] { (entry[key] as? [[String: Any]] ?? []).compactMap(promotionalOffer) }
                // Xcode writes promotional offers as `adHocOffers` (`subscriptionOffers` in some older files).
                item.promotionalOffers = offers("adHocOffers") + offers("subscriptionOffers")
                item.offerCodes = offers("codeOffers")
                item.billingPlans = (entry["billingPlans"] as? [[String: Any]] ?? []).compactMap { plan in
                    // A plan without a price is not read as a free one.
                    guard let type = (plan["billingPlanType"] as? String).flatMap(BillingPlan.Kind.init(loose:)),
                          let amount = StoreKitConfiguration.priceText(plan["displayPrice"]) else { return nil }
                    return BillingPlan(type: type, amount: amount,
                                       commitmentAmount: StoreKitConfiguration.priceText(plan["commitmentDisplayPrice"]),
                                       isEnabled: plan["isEnabled"] as? Bool ?? true)
                }
                item.winBackOffers = offers("winbackOffers")
                products.append(item)
            }
        }
        self.products = products
        subscriptionGroups = groups
    }

    /// `codeOffers` of a one-time purchase's entry: each a reference name and the price it sells at.
    private static func oneTimeOfferCodes(_ entry: [String: Any]) -> [OneTimeOfferCode] {
        (entry["codeOffers"] as? [[String: Any]] ?? []).compactMap { code in
            guard let id = code["offerID"] as? String ?? code["referenceName"] as? String else { return nil }
            return OneTimeOfferCode(offerId: id, amount: priceText(code["displayPrice"]))
        }
    }

    private static func priceText(_ value: Any?) -> String? {
        switch value {
        case let text as String: return text
        case let number as NSNumber: return number.stringValue
        default: return nil
        }
    }
}
