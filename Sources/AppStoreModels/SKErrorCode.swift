/// StoreKit's `SKError.Code` values, with the names StoreKit uses.
public enum SKErrorCode: Int, Codable, Sendable, CaseIterable {
    case unknown = 0
    case clientInvalid = 1
    case paymentCancelled = 2
    case paymentInvalid = 3
    case paymentNotAllowed = 4
    case storeProductNotAvailable = 5
    case cloudServicePermissionDenied = 6
    case cloudServiceNetworkConnectionFailed = 7
    case cloudServiceRevoked = 8
    case privacyAcknowledgementRequired = 9
    case unauthorizedRequestData = 10
    case invalidOfferIdentifier = 11
    case invalidSignature = 12
    case missingOfferParams = 13
    case invalidOfferPrice = 14
    case overlayCancelled = 15
    case ineligibleForOffer = 18
    case unsupportedPlatform = 19

    /// The camel-case name StoreKit uses (`paymentCancelled`).
    public var name: String { String(describing: self) }
}
