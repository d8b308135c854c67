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
        try JWS.sign(payload: Self.jwsTransaction(record, signedAt: signedAt).jsonBytes(), key: jwsAuthority.leafKey,
                     chain: jwsAuthority.chain)
    }

    /// The decoded payload of `record`'s signed transaction.
    static func jwsTransaction(_ record: TransactionRecord, signedAt: Date) -> JWSTransaction {
        let milliseconds = ReceiptDate.milliseconds
        // StoreKit 1's applicationUsername becomes appAccountToken when it is a UUID, as on devices.
        let token = record.appAccountToken ?? record.applicationUsername.flatMap(UUID.init(uuidString:))?.uuidString.lowercased()
        let storefront = record.price?.storefront
        return JWSTransaction(
            transactionId: record.id, originalTransactionId: record.originalId, webOrderLineItemId: record.webOrderLineItemId.map(String.init),
            bundleId: record.bundleId, productId: record.productId, subscriptionGroupIdentifier: record.subscriptionGroupId,
            purchaseDate: milliseconds(record.purchaseDate), originalPurchaseDate: milliseconds(record.originalPurchaseDate),
            expiresDate: record.expiresDate.map(milliseconds), quantity: record.quantity, type: record.productType.jwsTypeName,
            appAccountToken: token, inAppOwnershipType: "PURCHASED", signedDate: milliseconds(signedAt),
            revocationReason: record.cancellationDate == nil ? nil : (record.cancellationReason ?? 0),
            revocationDate: record.cancellationDate.map(milliseconds), isUpgraded: record.isUpgraded ? true : nil,
            offerType: record.isTrialPeriod || record.isInIntroOfferPeriod ? 1 : nil, offerIdentifier: nil,
            environment: record.environment == .production ? "Production" : "Sandbox", storefront: storefront,
            storefrontId: storefront.flatMap(StorefrontId.forStorefront), transactionReason: record.isRenewal ? "RENEWAL" : "PURCHASE",
            currency: record.price?.currency, price: record.price.flatMap { Milliunits.from($0.amount) })
    }
}
