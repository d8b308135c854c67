import Foundation

extension StoreKitConfiguration {
    /// An app's catalog as an Xcode `.storekit` file (version 4.0): what `StoreKitConfiguration(data:)` reads back
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
            return entry
        }
        func item(_ product: CatalogProduct, type: String) -> [String: Any] {
            ["productID": product.productId, "referenceName": product.referenceName, "internalID": product.productId, "type": type,
             "displayPrice": price(product), "familyShareable": product.familyShareable, "localizations": localizations(product)]
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
        let root: [String: Any] = ["identifier": app.bundleId, "products": products, "nonRenewingSubscriptions": nonRenewing,
                                   "subscriptionGroups": subscriptionGroups, "settings": block, "version": ["major": 4, "minor": 0]]
        return try JSONSerialization.data(withJSONObject: root, options: [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes])
    }
}
