import AppStoreCrypto
import AppStoreModels
import Foundation

extension AppStoreEmulator {
    /// Sandbox receipts carry this original purchase date (reference §5.4).
    static let sandboxOriginalPurchaseDate = Date(timeIntervalSince1970: 1_375_340_400)

    /// The app receipt for a device, or nil in the sandbox before the first purchase (as on iOS).
    public func appReceipt(bundleId: String, deviceId: String, refresh: Bool = false) async throws -> Data? {
        let (receipt, hasPurchases) = try await read { state, now -> (AppReceipt, Bool) in
            let (device, account) = try AppStoreEmulator.device(deviceId, in: state)
            guard let app = state.apps[bundleId] else { throw StoreError.notFound("App \(bundleId)") }
            let records = state.transactions(account: account.email, bundle: bundleId, environment: account.environment)
            let receipt = self.makeReceipt(app: app, account: account, device: device, records: records, now: now)
            return (receipt, !records.isEmpty)
        }
        if !hasPurchases && !refresh && receipt.receiptType.environment != .production { return nil }
        if receipt.receiptType == .xcode { return Data(try xcodeAuthority.signReceipt(ReceiptPayload.encode(receipt))) }
        return Data(try sign(receipt))
    }

    /// Builds the receipt contents for an account's purchases on one device.
    func makeReceipt(app: CatalogApp, account: Account, device: Device, records: [TransactionRecord], now: Date) -> AppReceipt {
        let sandbox = account.environment == .sandbox
        var opaque = [UInt8](repeating: 0, count: 16)
        for index in opaque.indices { opaque[index] = UInt8.random(in: 0...255) }
        let bundleBytes = ReceiptPayload.bundleIdBytes(app.bundleId)
        let hash = Digest.sha1.hash(device.identifierBytes + opaque + bundleBytes)
        let firstPurchase = records.map(\.originalPurchaseDate).min() ?? now
        return AppReceipt(
            receiptType: account.xcode == true ? .xcode : account.environment.receiptType, appItemId: sandbox ? 0 : app.appAppleId, bundleId: app.bundleId,
            applicationVersion: app.version, opaqueValue: Data(opaque), sha1Hash: Data(hash), creationDate: now,
            originalPurchaseDate: sandbox ? AppStoreEmulator.sandboxOriginalPurchaseDate : firstPurchase,
            originalApplicationVersion: sandbox ? "1.0" : app.version, downloadId: sandbox ? 0 : AppStoreEmulator.downloadId(account, app),
            versionExternalIdentifier: 0, inApp: records.filter(\.belongsInReceipt).map(\.inAppPurchase),
            bundleIdBytes: Data(bundleBytes))
    }

    static func downloadId(_ account: Account, _ app: CatalogApp) -> Int64 {
        var hash: UInt64 = 0xcbf29ce484222325
        for byte in (account.identifier + app.bundleId).utf8 { hash = (hash ^ UInt64(byte)) &* 0x100000001b3 }
        return Int64(hash >> 8) // below 2^56 but above 2^53 often, as real ids are
    }

    /// Signs receipt contents into PKCS#7 DER.
    func sign(_ receipt: AppReceipt) throws -> [UInt8] {
        try SignedData.sign(payload: ReceiptPayload.encode(receipt), key: authority.leafKey, chain: authority.chain)
    }

    /// The iOS 6 style `transactionReceipt` of one transaction.
    public func transactionReceipt(transactionId: String) async throws -> Data {
        let (record, app) = try await read { state, _ -> (TransactionRecord, CatalogApp) in
            guard let record = state.transactions[transactionId], let app = state.apps[record.bundleId] else {
                throw StoreError.notFound("Transaction \(transactionId)")
            }
            return (record, app)
        }
        return Data(try legacyReceipt(for: record, app: app))
    }

    func legacyReceipt(for record: TransactionRecord, app: CatalogApp) throws -> [UInt8] {
        try LegacyTransactionReceipt.make(purchaseInfo: AppStoreEmulator.legacyPurchaseInfo(record, app: app), environment: record.environment,
                                          key: authority.leafKey, certificate: authority.leaf)
    }

    /// The `purchase-info` fields of an iOS 6 style receipt, in Apple's order.
    static func legacyPurchaseInfo(_ record: TransactionRecord, app: CatalogApp) -> [(String, String)] {
        let purchase = ReceiptDateTriple(record.purchaseDate)
        let original = ReceiptDateTriple(record.originalPurchaseDate)
        let deviceHash = Digest.sha1.hash(Array(record.deviceId.utf8)).hexString
        var info: [(String, String)] = [
            ("original-purchase-date-pst", original.pacific), ("purchase-date-ms", purchase.milliseconds),
            ("unique-identifier", deviceHash), ("original-transaction-id", record.originalId),
        ]
        if let expires = record.expiresDate {
            let triple = ReceiptDateTriple(expires)
            info += [("expires-date", triple.milliseconds), ("expires-date-formatted", triple.gmt), ("expires-date-formatted-pst", triple.pacific)]
        }
        info += [
            ("transaction-id", record.id), ("original-purchase-date-ms", original.milliseconds),
        ]
        if let web = record.webOrderLineItemId { info.append(("web-order-line-item-id", String(web))) }
        info += [
            ("bvrs", app.version), ("unique-vendor-identifier", record.deviceId),
            ("item-id", String(CatalogApp.derivedAppleId(app.bundleId + "/" + record.productId))),
            ("product-id", record.productId), ("purchase-date", purchase.gmt), ("original-purchase-date", original.gmt),
            ("bid", app.bundleId), ("purchase-date-pst", purchase.pacific), ("quantity", String(record.quantity)),
        ]
        if record.environment == .production {
            info += [("app-item-id", String(app.appAppleId)), ("version-external-identifier", "0")]
        }
        if record.productType == .autoRenewable {
            info += [("is-trial-period", record.isTrialPeriod ? "true" : "false"),
                     ("is-in-intro-offer-period", record.isInIntroOfferPeriod ? "true" : "false")]
        }
        if let cancelled = record.cancellationDate {
            let triple = ReceiptDateTriple(cancelled)
            info += [("cancellation-date", triple.gmt), ("cancellation-date-ms", triple.milliseconds), ("cancellation-date-pst", triple.pacific)]
        }
        return info
    }
}
