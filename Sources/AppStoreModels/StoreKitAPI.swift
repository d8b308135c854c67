/// The StoreKit APIs StoreKit Testing can make fail (`SKTestSession.setSimulatedError(_:forAPI:)`, the
/// `_storeKitErrors` list of a `.storekit` file), with the errors each may be given.
public enum StoreKitAPI: String, CaseIterable, Codable, Sendable {
    case loadProducts, purchase, verification, appStoreSync, subscriptionStatus, appTransaction
    case manageSubscriptions, refundRequest, offerCodeRedeem

    /// The name Xcode writes in `_storeKitErrors`.
    public var fileName: String {
        switch self {
        case .loadProducts: "Load Products"
        case .purchase: "Purchase"
        case .verification: "Verification"
        case .appStoreSync: "App Store Sync"
        case .subscriptionStatus: "Subscription Status"
        case .appTransaction: "App Transaction"
        case .manageSubscriptions: "Manage Subscriptions Sheet"
        case .refundRequest: "Refund Request Sheet"
        case .offerCodeRedeem: "Offer Code Redeem Sheet"
        }
    }

    /// The API a `_storeKitErrors` name means (Xcode's spelling, any letter case; "Sheet" may be left out).
    public init?(fileName: String) {
        let wanted = fileName.lowercased()
        guard let found = Self.allCases.first(where: { $0.fileName.lowercased() == wanted || $0.fileName.lowercased() == wanted + " sheet" }) else { return nil }
        self = found
    }

    /// The families of errors this API can be given, as StoreKit Testing's `SKTestFailures` allows them.
    public var families: [StoreKitTestError.Family] {
        switch self {
        case .loadProducts, .appStoreSync, .subscriptionStatus, .manageSubscriptions, .offerCodeRedeem: [.generic]
        case .purchase: [.generic, .purchase, .verification]
        case .verification: [.verification]
        case .appTransaction: [.generic, .verification]
        case .refundRequest: [.generic, .refundRequest]
        }
    }

    /// The error used when one is switched on without a choice.
    public var defaultError: StoreKitTestError { self == .verification ? .invalidSignature : .unknown }

    /// Whether `error` is one this API can be given.
    public func allows(_ error: StoreKitTestError) -> Bool { families.contains(error.family) }
}

/// An error StoreKit can report, by the StoreKit 2 case name, with the StoreKit 1 `SKError` code an
/// original-API app sees for it.
public enum StoreKitTestError: String, CaseIterable, Codable, Sendable {
    // StoreKitError
    case unknown, userCancelled, networkError, systemError, notAvailableInStorefront, notEntitled, unsupported
    // Product.PurchaseError
    case invalidQuantity, productUnavailable, purchaseNotAllowed, ineligibleForOffer, invalidOfferIdentifier, invalidOfferPrice
    case invalidOfferSignature, missingOfferParameters
    // VerificationResult.VerificationError
    case revokedCertificate, invalidCertificateChain, invalidDeviceVerification, invalidEncoding, invalidSignature, missingRequiredProperties
    // Transaction.RefundRequestError
    case duplicateRequest, failed

    /// Which StoreKit error type the case belongs to (`SKTestFailures`' grouping).
    public enum Family: String, CaseIterable, Codable, Sendable {
        case generic, purchase, verification, refundRequest

        /// The StoreKit type's name.
        public var typeName: String {
            switch self {
            case .generic: "StoreKitError"
            case .purchase: "Product.PurchaseError"
            case .verification: "VerificationResult.VerificationError"
            case .refundRequest: "Transaction.RefundRequestError"
            }
        }

        /// The family's cases in declaration order (a `.storekit` file's `current.index` counts in it).
        public var errors: [StoreKitTestError] { StoreKitTestError.allCases.filter { $0.family == self } }
    }

    public var family: Family {
        switch self {
        case .unknown, .userCancelled, .networkError, .systemError, .notAvailableInStorefront, .notEntitled, .unsupported: .generic
        case .invalidQuantity, .productUnavailable, .purchaseNotAllowed, .ineligibleForOffer, .invalidOfferIdentifier, .invalidOfferPrice,
             .invalidOfferSignature, .missingOfferParameters: .purchase
        case .revokedCertificate, .invalidCertificateChain, .invalidDeviceVerification, .invalidEncoding, .invalidSignature,
             .missingRequiredProperties: .verification
        case .duplicateRequest, .failed: .refundRequest
        }
    }

    /// Whether the error is about a signature: the App Store answers, but what it signed does not verify.
    public var isVerification: Bool { family == .verification }

    /// What StoreKit 1 reports for it.
    public var skError: SKErrorCode {
        switch self {
        case .userCancelled: .paymentCancelled
        case .networkError: .cloudServiceNetworkConnectionFailed
        case .notAvailableInStorefront, .productUnavailable: .storeProductNotAvailable
        case .purchaseNotAllowed: .paymentNotAllowed
        case .invalidQuantity: .paymentInvalid
        case .ineligibleForOffer: .ineligibleForOffer
        case .invalidOfferIdentifier: .invalidOfferIdentifier
        case .invalidOfferPrice: .invalidOfferPrice
        case .invalidOfferSignature: .invalidSignature
        case .missingOfferParameters: .missingOfferParams
        case .unsupported: .unsupportedPlatform
        case .notEntitled: .clientInvalid
        default: .unknown
        }
    }
}
