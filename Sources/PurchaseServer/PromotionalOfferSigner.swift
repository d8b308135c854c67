import AppStoreCrypto
import AppStoreModels
import Foundation

/// A promotional offer signed for the app with its In-App Purchase key, as Apple's StoreKit checks it
/// (`SKPaymentDiscount` / `Product.PurchaseOption.promotionalOffer`): ECDSA with SHA-256 over
/// bundleId⁣keyId⁣productId⁣offerId⁣appAccountToken⁣nonce⁣timestamp (U+2063 between, lowercased token and nonce).
public struct SignedPromotionalOffer: Codable, Sendable, Equatable {
    public var productId: String
    public var offerId: String
    public var keyIdentifier: String
    public var nonce: String
    /// Unix ms, on real time: StoreKit refuses a signature older than 24 hours.
    public var timestamp: Int64
    /// Base64 of the DER signature.
    public var signature: String
}

public enum PromotionalOfferSigner {
    /// The bytes StoreKit verifies.
    public static func payload(bundleId: String, keyId: String, productId: String, offerId: String, appAccountToken: String?, nonce: String,
                               timestamp: Int64) -> [UInt8] {
        Array([bundleId, keyId, productId, offerId, (appAccountToken ?? "").lowercased(), nonce.lowercased(), String(timestamp)]
            .joined(separator: "\u{2063}").utf8)
    }

    public static func sign(bundleId: String, credentials: ServerAPICredentials, productId: String, offerId: String, appAccountToken: String?,
                            nonce: String, timestamp: Int64) throws -> SignedPromotionalOffer {
        let key = try PrivateKey(pem: credentials.privateKey)
        let signature = try key.sign(payload(bundleId: bundleId, keyId: credentials.keyId, productId: productId, offerId: offerId,
                                             appAccountToken: appAccountToken, nonce: nonce, timestamp: timestamp), digest: .sha256)
        return SignedPromotionalOffer(productId: productId, offerId: offerId, keyIdentifier: credentials.keyId, nonce: nonce.lowercased(),
                                      timestamp: timestamp, signature: Data(signature).base64EncodedString())
    }

    /// The 2025 form: a compact JWS (ES256, `kid` the key id) StoreKit takes as
    /// `.promotionalOffer(_:compactJWS:)` (`aud` `promotional-offer`) or `.introductoryOfferEligibility(compactJWS:)`
    /// (`aud` `introductory-offer-eligibility`), with `bid`, `iss`, `iat` (seconds), a fresh `nonce` and the claims of the feature.
    public static func signJWS(audience: String, bundleId: String, credentials: ServerAPICredentials, productId: String,
                               offerIdentifier: String? = nil, transactionId: String? = nil, allowIntroductoryOffer: Bool? = nil,
                               nonce: String, issuedAt: Int64) throws -> String {
        var payload = JSONBuffer(capacity: 256)
        payload.object { json in
            json.field("productId", productId)
            json.field("offerIdentifier", offerIdentifier)
            if let allowIntroductoryOffer { json.field("allowIntroductoryOffer", allowIntroductoryOffer) }
            json.field("transactionId", transactionId)
            json.field("bid", bundleId)
            json.field("iss", credentials.issuerId)
            json.field("aud", audience)
            json.field("iat", issuedAt)
            json.field("nonce", nonce.lowercased())
        }
        return try JWS.sign(payload: payload.bytes, key: PrivateKey(pem: credentials.privateKey), keyId: credentials.keyId)
    }
}
