import Foundation

extension StoreKitConfiguration {
    /// An app's catalog as an Xcode `.storekit` file (version 4.0, or 5.0 with billing plans): what `StoreKitConfiguration(data:)` reads back
    /// as the same products, groups, offers and settings. Keys sorted, two-space indented, as Xcode writes.
    public static func export(_ app: CatalogApp) throws -> Data {
        let settings = app.testSettings ?? StoreKitTestSettings()
        let storefront = settings.storefront ?? "USA"
        func price(_ product: CatalogProduct) -> String {
            (product.prices.first { $0.storefront == storefront } ?? product.prices.first)?.amount ?? "0"
        }
        func localizations(_ product: CatalogProduct) -> [[String: Any]] {
            product.localizations.map { ["locale": $0.locale, "displayName": $0.displayName, "description": $0.description] }
        }
        func offer(_ offer: PromotionalOffer) -> [String: Any] {
            var entry: [String: Any] = ["offerID": offer.offerId, "referenceName": offer.offerId, "internalID": offer.offerId,
                                        "paymentMode": offer.paymentMode.rawValue, "subscriptionPeriod": offer.period.rawValue,
                                        "numberOfPeriods": offer.numberOfPeriods]
            if let amount = offer.amount { entry["displayPrice"] = amount }
            if let eligibility = offer.eligibility { entry["eligibility"] = eligibility }
            if let stackable = offer.isStackable { entry["isStackable"] = stackable }
            return entry
        }
        func oneTimeCodes(_ product: CatalogProduct) -> [[String: Any]] {
            product.oneTimeOfferCodes.map { code in
                var entry: [String: Any] = ["referenceName": code.offerId, "offerID": code.offerId, "internalID": code.offerId]
                if let amount = code.amount { entry["displayPrice"] = amount }
                return entry
            }
        }
        func item(_ product: CatalogProduct, type: String) -> [String: Any] {
            var entry: [String: Any] = ["productID": product.productId, "referenceName": product.referenceName, "internalID": product.productId,
                                        "type": type, "displayPrice": price(product), "familyShareable": product.familyShareable,
                                        "localizations": localizations(product)]
            if !product.oneTimeOfferCodes.isEmpty { entry["codeOffers"] = oneTimeCodes(product) }
            return entry
        }
        var products: [[String: Any]] = [], nonRenewing: [[String: Any]] = []
        var groups: [String: [[String: Any]]] = [:]
        for product in app.products {
            switch product.type {
            case .consumable: products.append(item(product, type: "Consumable"))
            // Xcode has no free subscription: a free non-consumable is how one is written (and read back).
            case .nonConsumable, .freeSubscription:
                var entry = item(product, type: "NonConsumable")
                if product.type == .freeSubscription { entry["displayPrice"] = "0" }
                products.append(entry)
            case .nonRenewing: nonRenewing.append(item(product, type: "NonRenewingSubscription"))
            case .autoRenewable:
                var entry = item(product, type: "RecurringSubscription")
                entry["recurringSubscriptionPeriod"] = (product.period ?? .oneMonth).rawValue
                entry["groupNumber"] = product.groupLevel ?? 1
                entry["subscriptionGroupID"] = product.subscriptionGroupId ?? "group"
                entry["introductoryOffer"] = product.introductoryOffer.map { intro -> [String: Any] in
                    var offer: [String: Any] = ["internalID": product.productId + ".intro", "paymentMode": intro.paymentMode.rawValue,
                                                "subscriptionPeriod": intro.period.rawValue, "numberOfPeriods": intro.numberOfPeriods]
                    if let amount = intro.amount { offer["displayPrice"] = amount }
                    return offer
                } ?? NSNull()
                entry["adHocOffers"] = product.promotionalOffers.map(offer)
                entry["codeOffers"] = product.offerCodes.map(offer)
                entry["winbackOffers"] = product.winBackOffers.map(offer)
                if !product.billingPlans.isEmpty {
                    entry["billingPlans"] = product.billingPlans.map { plan -> [String: Any] in
                        var written: [String: Any] = ["billingPlanType": plan.type.rawValue, "displayPrice": plan.amount,
                                                      "internalID": "\(product.productId).\(plan.type.rawValue.lowercased())", "isEnabled": plan.isEnabled]
                        if let commitment = plan.commitmentAmount { written["commitmentDisplayPrice"] = commitment }
                        return written
                    }
                }
                groups[product.subscriptionGroupId ?? "group", default: []].append(entry)
            }
        }
        let subscriptionGroups = groups.keys.sorted().map { id -> [String: Any] in
            ["id": id, "name": app.subscriptionGroups[id] ?? id, "localizations": [], "subscriptions": groups[id] ?? []]
        }
        var block: [String: Any] = [
            "_askToBuyEnabled": settings.askToBuyEnabled,
            "_billingGracePeriodEnabled": settings.billingGracePeriodEnabled, "_billingIssuesEnabled": settings.billingIssuesEnabled,
            "_failTransactionsEnabled": settings.failTransactionsEnabled, "_disableDialogs": settings.disableDialogs,
            "_storeKitErrors": settings.storeKitErrors.map { ["name": $0.name, "enabled": $0.enabled, "current": $0.current] },
            "_timeRate": settings.timeRate ?? 0,
        ]
        if let storefront = settings.storefront { block["_storefront"] = storefront }
        if let locale = settings.locale { block["_locale"] = locale }
        if let id = settings.applicationInternalID { block["_applicationInternalID"] = id }
        if let team = settings.developerTeamID { block["_developerTeamID"] = team }
        // Billing plans came with version 5 of the format; a catalog without them is written as version 4, as before.
        let major = app.products.contains { !$0.billingPlans.isEmpty } ? 5 : 4
        var root: [String: Any] = ["identifier": app.bundleId, "products": products, "nonRenewingSubscriptions": nonRenewing,
                                   "subscriptionGroups": subscriptionGroups, "settings": block, "version": ["major": major, "minor": 0]]
        if let policies = app.appPolicies {
            root["appPolicies"] = ["eula": policies.eula,
                                   "policies": policies.policies.map { ["locale": $0.locale, "policyText": $0.policyText, "policyURL": $0.policyURL] }]
        }
        return try JSONSerialization.data(withJSONObject: root, options: [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes])
    }
}
