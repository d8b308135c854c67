import AppStoreModels
import Foundation

extension AppStoreEmulator {
    /// Registers or replaces an app with its products, enforcing Apple's identifier rules.
    @discardableResult
    public func register(app: CatalogApp) async throws -> CatalogApp {
        try AppStoreEmulator.validate(app)
        return try await mutate { state, changes, _ in
            let previous = state.apps[app.bundleId]
            let removed = Set(previous?.products.map(\.productId) ?? []).subtracting(app.products.map(\.productId))
            // Identifiers of deleted products stay reserved; a new product may not take one.
            let reserved = (state.usedProductIds[app.bundleId] ?? []).subtracting(previous?.products.map(\.productId) ?? [])
            if let clash = app.products.first(where: { reserved.contains($0.productId) }) {
                throw StoreError(.conflict, "product_id_reused", "Product identifier \(clash.productId) was used before and cannot be reused.")
            }
            _ = removed
            state.apps[app.bundleId] = app
            state.usedProductIds[app.bundleId, default: []].formUnion(app.products.map(\.productId))
            changes.apps.insert(app.bundleId)
            return app
        }
    }

    /// Loads a `.storekit` file as the catalog of `bundleId` (its products count as Ready for Sale).
    @discardableResult
    public func register(storeKit configuration: StoreKitConfiguration, bundleId: String, name: String? = nil) async throws -> CatalogApp {
        let existing = try await read { state, _ in state.apps[bundleId] }
        var app = existing ?? CatalogApp(bundleId: bundleId, appAppleId: CatalogApp.derivedAppleId(bundleId), name: name ?? bundleId,
                                         sharedSecret: CatalogApp.derivedSharedSecret(bundleId))
        app.products = configuration.products
        app.subscriptionGroups = configuration.subscriptionGroups
        app.testSettings = configuration.settings
        app.appPolicies = configuration.appPolicies
        // A file synced from App Store Connect names the app's Apple id: receipts and signed data carry it.
        if let id = configuration.settings.applicationInternalID.flatMap(Int64.init), id > 0 { app.appAppleId = id }
        let registered = try await register(app: app)
        // Xcode's billing grace period: 16 days (the emulator scales days by each account's renewal rate).
        if configuration.settings.billingGracePeriodEnabled, try await read({ state, _ in state.gracePeriodDays[bundleId] }) == nil {
            try await setGracePeriod(bundleId: bundleId, days: 16)
        }
        return registered
    }

    /// Removes a product from sale for good (its identifier stays reserved).
    public func deleteProduct(bundleId: String, productId: String) async throws {
        try await mutate { state, changes, _ in
            guard var app = state.apps[bundleId] else { throw StoreError.notFound("App \(bundleId)") }
            guard app.products.contains(where: { $0.productId == productId }) else { throw StoreError.notFound("Product \(productId)") }
            app.products.removeAll { $0.productId == productId }
            state.apps[bundleId] = app
            changes.apps.insert(bundleId)
        }
    }

    /// Changes a product's review state and cleared-for-sale switch.
    public func setReviewState(bundleId: String, productId: String, reviewState: ReviewState?, clearedForSale: Bool?) async throws -> CatalogProduct {
        try await mutate { state, changes, _ in
            guard var app = state.apps[bundleId] else { throw StoreError.notFound("App \(bundleId)") }
            guard let index = app.products.firstIndex(where: { $0.productId == productId }) else { throw StoreError.notFound("Product \(productId)") }
            if let reviewState { app.products[index].reviewState = reviewState }
            if let clearedForSale { app.products[index].clearedForSale = clearedForSale }
            state.apps[bundleId] = app
            changes.apps.insert(bundleId)
            return app.products[index]
        }
    }

    /// Every registered app.
    public func apps() async throws -> [CatalogApp] {
        try await read { state, _ in state.apps.values.sorted { $0.bundleId < $1.bundleId } }
    }

    /// One app.
    public func app(_ bundleId: String) async throws -> CatalogApp {
        try await read { state, _ in
            guard let app = state.apps[bundleId] else { throw StoreError.notFound("App \(bundleId)") }
            return app
        }
    }

    /// Billing plans: a monthly plan pays a yearly subscription in 12 installments and names its commitment's price.
    static func validateBillingPlans(_ product: CatalogProduct) throws {
        guard !product.billingPlans.isEmpty else { return }
        guard product.type == .autoRenewable else {
            throw StoreError.invalid("Billing plans are for auto-renewable subscriptions (\(product.productId)).", code: "invalid_billing_plan")
        }
        guard Set(product.billingPlans.map(\.type)).count == product.billingPlans.count else {
            throw StoreError.invalid("\(product.productId) names a billing plan twice.", code: "invalid_billing_plan")
        }
        for plan in product.billingPlans {
            guard let amount = Milliunits.from(plan.amount), amount >= 0 else {
                throw StoreError.invalid("Billing plan prices of \(product.productId) are decimal amounts of 0 or more.", code: "invalid_billing_plan")
            }
            if plan.type == .monthly {
                guard product.period == .oneYear else {
                    throw StoreError.invalid("A monthly billing plan pays a yearly subscription; \(product.productId) is not one.", code: "invalid_billing_plan")
                }
                guard let commitment = plan.commitmentAmount.flatMap(Milliunits.from), commitment >= 0 else {
                    throw StoreError.invalid("The monthly plan of \(product.productId) needs its commitment's price.", code: "invalid_billing_plan")
                }
            }
        }
    }

    static func validate(_ app: CatalogApp) throws {
        guard !app.bundleId.isEmpty, app.bundleId.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "." || $0 == "-") }) else {
            throw StoreError.invalid("Bundle id '\(app.bundleId)' may contain only letters, digits, periods and hyphens.", code: "invalid_bundle_id")
        }
        guard app.appAppleId >= 0 else { throw StoreError.invalid("appAppleId is a positive number.", code: "invalid_app_apple_id") }
        var seen: Set<String> = []
        for product in app.products {
            guard CatalogProduct.isValidIdentifier(product.productId) else {
                throw StoreError.invalid("Product identifier '\(product.productId)' may contain only letters, digits, periods and underscores.", code: "invalid_product_id")
            }
            guard seen.insert(product.productId).inserted else {
                throw StoreError(.conflict, "duplicate_product_id", "Product identifier \(product.productId) appears twice in \(app.bundleId).")
            }
            guard !product.prices.isEmpty else {
                throw StoreError.invalid("Product \(product.productId) has no price.", code: "missing_price")
            }
            let offers = [product.introductoryOffer?.numberOfPeriods].compactMap { $0 }
                + product.promotionalOffers.map(\.numberOfPeriods) + product.offerCodes.map(\.numberOfPeriods)
            guard offers.allSatisfy({ CatalogApp.offerPeriods.contains($0) }) else {
                throw StoreError.invalid("Offers of \(product.productId) run 1…12 periods.", code: "invalid_offer")
            }
            if product.type == .autoRenewable {
                guard product.subscriptionGroupId != nil, product.period != nil else {
                    throw StoreError.invalid("Auto-renewable \(product.productId) needs a subscription group and a period.", code: "invalid_subscription")
                }
            }
            try validateBillingPlans(product)
            guard product.oneTimeOfferCodes.isEmpty || [.consumable, .nonConsumable, .nonRenewing].contains(product.type),
                  product.oneTimeOfferCodes.allSatisfy({ !$0.offerId.isEmpty && $0.offerId.utf8.count <= 64 && ($0.amount.map { Milliunits.from($0).map { $0 >= 0 } ?? false } ?? true) }) else {
                throw StoreError.invalid("One-time offer codes of \(product.productId) need a reference name and a price of 0 or more, on a one-time purchase.",
                                         code: "invalid_offer")
            }
        }
    }
}
