import Foundation

/// The contents of an app receipt (the ASN.1 payload of reference §2.2–2.4), decoded.
public struct AppReceipt: Sendable, Equatable {
    /// Attribute 0: `Production`, `ProductionSandbox`, `Xcode`, ….
    public var receiptType: ReceiptType
    /// Attribute 1: the app's App Store id (0 in the sandbox).
    public var appItemId: Int64
    /// Attribute 2: the bundle identifier.
    public var bundleId: String
    /// Attribute 3: the app version.
    public var applicationVersion: String
    /// Attribute 4: the opaque value hashed into the device hash.
    public var opaqueValue: Data
    /// Attribute 5: SHA-1 of device identifier, opaque value and bundle id attribute bytes.
    public var sha1Hash: Data
    /// Attribute 12: when the App Store made this receipt.
    public var creationDate: Date?
    /// Attribute 18: the original app purchase.
    public var originalPurchaseDate: Date?
    /// Attribute 19: the app version originally bought.
    public var originalApplicationVersion: String?
    /// Attribute 21: expiration (VPP only).
    public var expirationDate: Date?
    /// Attribute 15: the download id (0 in the sandbox).
    public var downloadId: Int64
    /// Attribute 16 (undocumented, kept for `version_external_identifier`).
    public var versionExternalIdentifier: Int64
    /// Attribute 17, one per purchase.
    public var inApp: [InAppPurchase]
    /// The raw DER bytes of attribute 2's value, which the device hash covers.
    public var bundleIdBytes: Data

    /// Creates a receipt.
    public init(receiptType: ReceiptType, appItemId: Int64 = 0, bundleId: String, applicationVersion: String,
                opaqueValue: Data = Data(), sha1Hash: Data = Data(), creationDate: Date?, originalPurchaseDate: Date? = nil,
                originalApplicationVersion: String? = nil, expirationDate: Date? = nil, downloadId: Int64 = 0,
                versionExternalIdentifier: Int64 = 0, inApp: [InAppPurchase] = [], bundleIdBytes: Data = Data()) {
        self.receiptType = receiptType
        self.appItemId = appItemId
        self.bundleId = bundleId
        self.applicationVersion = applicationVersion
        self.opaqueValue = opaqueValue
        self.sha1Hash = sha1Hash
        self.creationDate = creationDate
        self.originalPurchaseDate = originalPurchaseDate
        self.originalApplicationVersion = originalApplicationVersion
        self.expirationDate = expirationDate
        self.downloadId = downloadId
        self.versionExternalIdentifier = versionExternalIdentifier
        self.inApp = inApp
        self.bundleIdBytes = bundleIdBytes
    }
}

/// One in-app purchase inside an app receipt (attribute 17, types 1701–1722).
public struct InAppPurchase: Sendable, Equatable {
    public var quantity: Int
    public var productId: String
    public var transactionId: String
    public var originalTransactionId: String?
    public var purchaseDate: Date?
    public var originalPurchaseDate: Date?
    public var expiresDate: Date?
    public var webOrderLineItemId: Int64?
    public var cancellationDate: Date?
    public var cancellationReason: Int?
    public var isTrialPeriod: Bool
    public var isInIntroOfferPeriod: Bool?
    public var promotionalOfferId: String?
    /// Attribute 1707 (product type code), when present.
    public var productTypeCode: Int?

    /// Creates a purchase entry.
    public init(quantity: Int = 1, productId: String, transactionId: String, originalTransactionId: String? = nil,
                purchaseDate: Date?, originalPurchaseDate: Date? = nil, expiresDate: Date? = nil,
                webOrderLineItemId: Int64? = nil, cancellationDate: Date? = nil, cancellationReason: Int? = nil,
                isTrialPeriod: Bool = false, isInIntroOfferPeriod: Bool? = nil, promotionalOfferId: String? = nil,
                productTypeCode: Int? = nil) {
        self.quantity = quantity
        self.productId = productId
        self.transactionId = transactionId
        self.originalTransactionId = originalTransactionId
        self.purchaseDate = purchaseDate
        self.originalPurchaseDate = originalPurchaseDate
        self.expiresDate = expiresDate
        self.webOrderLineItemId = webOrderLineItemId
        self.cancellationDate = cancellationDate
        self.cancellationReason = cancellationReason
        self.isTrialPeriod = isTrialPeriod
        self.isInIntroOfferPeriod = isInIntroOfferPeriod
        self.promotionalOfferId = promotionalOfferId
        self.productTypeCode = productTypeCode
    }
}
