import AppStoreCrypto
import AppStoreModels
import Clocks
import Foundation

/// The 2025 form of developer-signed purchase options: a compact JWS (ES256, `kid` of the app's In-App
/// Purchase key) instead of the v1 signature, for promotional offers (`aud` `promotional-offer`) and for
/// overriding introductory-offer eligibility (`aud` `introductory-offer-eligibility`), as
/// `Product.PurchaseOption.promotionalOffer(_:compactJWS:)` and `.introductoryOfferEligibility(compactJWS:)`.
extension AppStoreEmulator {
    /// What a verified signature says.
    struct SignedOption {
        let claims: JSONValue
    }

    /// Verifies a developer-signed JWS as StoreKit does: the app's key by `kid`, the signature, `bid`, `iss`, `aud`,
    /// `iat` within the last 24 hours (on real time, as the developer's server signs), a `nonce`, the product.
    static func verifySignedOption(_ compact: String, audience: String, bundleId: String, productId: String,
                                   keys: [String: ServerAPIKey]) throws -> SignedOption {
        func refuse(_ why: String) -> StoreError { StoreError.storeKit(.invalidSignature, "The signed \(audience) is refused: \(why).", status: .badRequest) }
        guard let jws = try? JWS(compact: compact) else { throw refuse("it is not a compact JWS") }
        guard jws.header["alg"]?.text == "ES256", let keyId = jws.header["kid"]?.text else { throw refuse("it needs alg ES256 and a kid") }
        guard let key = keys[keyId], key.bundleId == bundleId, let publicKey = try? PublicKey(pem: key.publicKey),
              publicKey.isValidES256(jws.signature, for: jws.signingInput) else {
            throw refuse("the signature does not verify with an In-App Purchase key of \(bundleId)")
        }
        guard let claims = try? jws.payloadJSON(), claims.isObject else { throw refuse("the payload is not a JSON object") }
        guard claims["bid"]?.text == bundleId else { throw refuse("bid is not \(bundleId)") }
        guard claims["iss"]?.text == key.issuerId else { throw refuse("iss is not the key's issuer") }
        guard claims["aud"]?.text == audience else { throw refuse("aud is not \(audience)") }
        guard let nonce = claims["nonce"]?.text, UUIDText.parse(nonce) != nil else { throw refuse("nonce is not a UUID") }
        guard let issuedAt = claims["iat"]?.int64 else { throw refuse("iat is missing") }
        let age = SystemClock().now().timeIntervalSince1970 - Double(issuedAt)
        guard age <= 24 * 3600, age >= -300 else { throw refuse("iat is more than 24 hours old or in the future") }
        guard claims["productId"]?.text == productId else {
            throw StoreError.storeKit(.invalidOfferIdentifier, "The signed \(audience) is for another product than \(productId).", status: .badRequest)
        }
        return SignedOption(claims: claims)
    }

    /// Whether `id` names the customer: one of their transactions of the app, or their appTransactionId.
    static func namesCustomer(_ id: String, account: Account, app: CatalogApp, history: [TransactionRecord]) -> Bool {
        id == String(downloadId(account, app)) || history.contains { $0.id == id || $0.originalId == id }
    }

    /// A promotional offer signed as a JWS: the product's offer with that identifier, for this customer.
    static func checkSignedPromotionalOffer(_ compact: String, product: CatalogProduct, account: Account, app: CatalogApp,
                                            keys: [String: ServerAPIKey], history: [TransactionRecord]) throws -> PromotionalOffer {
        let option = try verifySignedOption(compact, audience: "promotional-offer", bundleId: app.bundleId, productId: product.productId, keys: keys)
        guard let offerId = option.claims["offerIdentifier"]?.text else {
            throw StoreError.storeKit(.missingOfferParams, "The signed promotional offer has no offerIdentifier.", status: .badRequest)
        }
        guard product.type == .autoRenewable, let offer = product.promotionalOffers.first(where: { $0.offerId == offerId }) else {
            throw StoreError.storeKit(.invalidOfferIdentifier, "Offer \(offerId) is not an offer of \(product.productId).", status: .badRequest)
        }
        if let transactionId = option.claims["transactionId"]?.text, !namesCustomer(transactionId, account: account, app: app, history: history) {
            throw StoreError.storeKit(.ineligibleForOffer, "The offer was signed for another customer (transactionId \(transactionId)).", status: .forbidden)
        }
        guard history.contains(where: { $0.productType == .autoRenewable && $0.subscriptionGroupId == product.subscriptionGroupId && $0.state == .purchased }) else {
            throw StoreError.storeKit(.ineligibleForOffer, "Promotional offers are for current and former subscribers of the group.", status: .forbidden)
        }
        return offer
    }

    /// The developer's word on introductory-offer eligibility: `allowIntroductoryOffer` for this customer.
    static func checkIntroductoryEligibility(_ compact: String, product: CatalogProduct, account: Account, app: CatalogApp,
                                             keys: [String: ServerAPIKey], history: [TransactionRecord]) throws -> Bool {
        let option = try verifySignedOption(compact, audience: "introductory-offer-eligibility", bundleId: app.bundleId,
                                            productId: product.productId, keys: keys)
        guard let allow = option.claims["allowIntroductoryOffer"]?.bool, let transactionId = option.claims["transactionId"]?.text else {
            throw StoreError.storeKit(.missingOfferParams, "The eligibility needs allowIntroductoryOffer and transactionId.", status: .badRequest)
        }
        guard namesCustomer(transactionId, account: account, app: app, history: history) else {
            throw StoreError.storeKit(.ineligibleForOffer, "The eligibility was signed for another customer (transactionId \(transactionId)).", status: .forbidden)
        }
        return allow
    }
}
