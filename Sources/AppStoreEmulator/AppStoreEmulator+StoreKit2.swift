import AppStoreCrypto
import AppStoreModels
import Foundation

extension AppStoreEmulator {
    /// A transaction as StoreKit 2 and the App Store Server API sign it (reference §3.4), with the
    /// JWS chain (ECC) in `x5c`.
    public func signedTransaction(transactionId: String) async throws -> String {
        let record = try await transaction(transactionId)
        return try signedTransaction(for: record, signedAt: clock.now())
    }

    /// Signs `record` as a `JWSTransactionDecodedPayload`, dated `signedAt`.
    public func signedTransaction(for record: TransactionRecord, signedAt: Date) throws -> String {
        var payload = Self.jwsTransaction(record, signedAt: signedAt)
        payload.appTransactionId = appTransactionId(account: record.accountEmail, bundleId: record.bundleId)
        if isXcodeTester(record.accountEmail) {
            payload.environment = "Xcode"
            return try xcodeAuthority.sign(payload.jsonBytes())
        }
        return try JWS.sign(payload: payload.jsonBytes(), key: jwsAuthority.leafKey, chain: jwsAuthority.chain)
    }

    /// The decoded payload of `record`'s signed transaction.
    static func jwsTransaction(_ record: TransactionRecord, signedAt: Date) -> JWSTransaction {
        let milliseconds = ReceiptDate.milliseconds
        // StoreKit 1's applicationUsername becomes appAccountToken when it is a UUID, as on devices.
        let token = record.appAccountToken ?? record.applicationUsername.flatMap(UUIDText.parse)?.uuidString.lowercased()
        let storefront = record.price?.storefront
        var transaction = JWSTransaction(
            transactionId: record.id, originalTransactionId: record.originalId, webOrderLineItemId: record.webOrderLineItemId.map(String.init),
            bundleId: record.bundleId, productId: record.productId, subscriptionGroupIdentifier: record.subscriptionGroupId,
            purchaseDate: milliseconds(record.purchaseDate), originalPurchaseDate: milliseconds(record.originalPurchaseDate),
            expiresDate: record.expiresDate.map(milliseconds), quantity: record.quantity, type: record.productType.jwsTypeName,
            appAccountToken: token, inAppOwnershipType: record.sharedFromTransactionId == nil ? "PURCHASED" : "FAMILY_SHARED",
            signedDate: milliseconds(signedAt),
            revocationReason: record.cancellationDate == nil ? nil : (record.cancellationReason ?? 0),
            revocationDate: record.cancellationDate.map(milliseconds), isUpgraded: record.isUpgraded ? true : nil,
            offerType: record.offerType ?? (record.isTrialPeriod || record.isInIntroOfferPeriod ? 1 : nil), offerIdentifier: record.offerIdentifier,
            environment: record.environment == .production ? "Production" : "Sandbox", storefront: storefront,
            storefrontId: storefront.flatMap(StorefrontId.forStorefront), transactionReason: record.isRenewal ? "RENEWAL" : "PURCHASE",
            currency: record.price?.currency, price: record.price.flatMap { Milliunits.from($0.amount) })
        transaction.offerPeriod = record.offerPeriod
        transaction.offerDiscountType = record.offerDiscountType
        if record.cancellationDate != nil {
            // A family member's copy goes when the purchase or the sharing does; the purchaser's own is a refund,
            // in full or of part of the price (prorated).
            if record.sharedFromTransactionId != nil {
                transaction.revocationType = "FAMILY_REVOKE"
            } else {
                let percentage = record.refundPercentage ?? 100_000
                transaction.revocationType = percentage < 100_000 ? "REFUND_PRORATED" : "REFUND_FULL"
                transaction.revocationPercentage = percentage
            }
        }
        transaction.billingPlanType = record.billingPlanType?.rawValue
        transaction.commitmentInfo = record.commitment?.transactionInfo
        return transaction
    }

    /// Whether the account tests with Xcode's StoreKit Testing (its signed data is Xcode's).
    func isXcodeTester(_ email: String) -> Bool {
        state.withLock { $0.accounts[email.lowercased()]?.xcode == true }
    }

    /// Signs StoreKit 2 data about an account: Xcode's way for Xcode testers, the App Store's otherwise.
    func signStoreKitData(_ payload: [UInt8], account email: String) throws -> String {
        isXcodeTester(email) ? try xcodeAuthority.sign(payload) : try JWS.sign(payload: payload, key: jwsAuthority.leafKey, chain: jwsAuthority.chain)
    }

    /// The AppTransaction id of an account's download of an app (the same in transactions, renewal info and the AppTransaction).
    func appTransactionId(account email: String, bundleId: String) -> String? {
        state.withLock { state in
            guard let account = state.accounts[email.lowercased()], let app = state.apps[bundleId] else { return nil }
            return String(Self.downloadId(account, app))
        }
    }
}

/// StoreKit 2 on the device: `Transaction.currentEntitlements`, `.unfinished`, `.updates`,
/// `AppTransaction.shared`, `Product.SubscriptionInfo.status`, `AppStore.sync()`.
extension AppStoreEmulator {
    /// The account, app and environment a device's StoreKit talks about.
    func storeKitContext(bundleId: String, deviceId: String) async throws -> (account: Account, device: Device, app: CatalogApp) {
        try await read { state, _ in
            let (device, account) = try AppStoreEmulator.device(deviceId, in: state)
            guard let app = state.apps[bundleId] else { throw StoreError.notFound("App \(bundleId)") }
            return (account, device, app)
        }
    }

    /// `Transaction.currentEntitlements`: unrefunded non-consumables, the latest transaction of each
    /// active auto-renewable subscription, and non-renewing subscriptions (the app judges their term).
    public func currentEntitlements(bundleId: String, deviceId: String) async throws -> [TransactionRecord] {
        let (account, _, _) = try await storeKitContext(bundleId: bundleId, deviceId: deviceId)
        return try await read { state, now in
            state.transactions(account: account.email, bundle: bundleId, environment: account.environment).filter { record in
                guard record.state == .purchased || record.state == .restored, !record.isRedelivery, record.cancellationDate == nil else { return false }
                switch record.productType {
                case .consumable: return false
                case .nonConsumable, .freeSubscription, .nonRenewing: return record.state == .purchased
                case .autoRenewable:
                    // Active, or in the billing grace period (access continues while Apple retries the charge).
                    guard let chain = state.chains[record.originalId], chain.latestTransactionId == record.id else { return false }
                    return [1, 4].contains(AppStoreEmulator.subscriptionStatus(chain, latest: record, now: now))
                }
            }
        }
    }

    /// `Transaction.updates`: the account's transactions bought, renewed or revoked at or after `since`.
    public func transactionUpdates(bundleId: String, deviceId: String, since: Date) async throws -> (records: [TransactionRecord], now: Date) {
        let (account, _, _) = try await storeKitContext(bundleId: bundleId, deviceId: deviceId)
        return try await read { state, now in
            let records = state.transactions(account: account.email, bundle: bundleId, environment: account.environment).filter { record in
                record.state == .purchased && !record.isRedelivery && (record.purchaseDate >= since || (record.cancellationDate.map { $0 >= since } ?? false))
            }
            return (records, now)
        }
    }

    /// `AppTransaction.shared`: the signed app transaction, with `deviceVerification` over `nonce` and the device id.
    public func signedAppTransaction(bundleId: String, deviceId: String, nonce: UUID) async throws -> String {
        let (account, device, app) = try await storeKitContext(bundleId: bundleId, deviceId: deviceId)
        return try await signedAppTransaction(account: account, app: app, deviceVerification: (nonce, device.id))
    }

    /// The app transaction of `account` for `app`; the device part only when a device asks.
    func signedAppTransaction(account: Account, app: CatalogApp, deviceVerification: (nonce: UUID, deviceId: String)?) async throws -> String {
        let records = try await read { state, _ in state.transactions(account: account.email, bundle: app.bundleId, environment: account.environment) }
        let now = clock.now()
        let sandbox = account.environment == .sandbox
        var json = JSONBuffer(capacity: 512)
        json.object { json in
            json.field("receiptType", account.xcode == true ? "Xcode" : sandbox ? "Sandbox" : "Production")
            if !sandbox { json.field("appAppleId", app.appAppleId) }
            json.field("bundleId", app.bundleId)
            json.field("applicationVersion", app.version)
            json.field("versionExternalIdentifier", Int64(0))
            json.field("receiptCreationDate", ReceiptDate.milliseconds(now))
            json.field("requestDate", ReceiptDate.milliseconds(now))
            json.field("originalPurchaseDate", ReceiptDate.milliseconds(sandbox ? Self.sandboxOriginalPurchaseDate
                                                                                : records.map(\.originalPurchaseDate).min() ?? now))
            json.field("originalApplicationVersion", sandbox ? "1.0" : app.version)
            if let (nonce, deviceId) = deviceVerification {
                let nonceText = nonce.uuidString.lowercased()
                json.field("deviceVerification", Data(Digest.sha384.hash(Array((nonceText + deviceId.lowercased()).utf8))).base64EncodedString())
                json.field("deviceVerificationNonce", nonceText)
            }
            json.field("appTransactionId", String(Self.downloadId(account, app)))
            json.field("originalPlatform", "iOS")
        }
        return try signStoreKitData(json.bytes, account: account.email)
    }
}
