import AppStoreModels
import Foundation

/// Encodes and decodes the ASN.1 payload of app receipts (reference §2.2–2.5).
public enum ReceiptPayload {
    /// Attribute type numbers of the app receipt.
    public enum Field {
        public static let receiptType = 0, appItemId = 1, bundleId = 2, applicationVersion = 3, opaqueValue = 4, sha1Hash = 5
        public static let ageRating = 10, developerId = 11, creationDate = 12, downloadId = 15, installerVersion = 16
        public static let inAppPurchase = 17, originalPurchaseDate = 18, originalApplicationVersion = 19, expirationDate = 21
    }

    /// Attribute type numbers inside an in-app purchase.
    public enum InAppField {
        public static let quantity = 1701, productId = 1702, transactionId = 1703, purchaseDate = 1704
        public static let originalTransactionId = 1705, originalPurchaseDate = 1706, productType = 1707, expiresDate = 1708
        public static let webOrderLineItemId = 1711, cancellationDate = 1712, isTrialPeriod = 1713
        public static let isInIntroOfferPeriod = 1719, cancellationReason = 1720, promotionalOfferId = 1721
    }

    static func attribute(_ type: Int, _ value: [UInt8], version: Int64 = 1) -> [UInt8] {
        DER.sequence([DER.integer(Int64(type)), DER.integer(version), DER.octetString(value)])
    }

    static func date(_ date: Date?) -> [UInt8] { DER.ia5String(date.map(ReceiptDate.rfc3339) ?? "") }

    /// The DER bytes of attribute 2's value for a bundle id (what the device hash covers).
    public static func bundleIdBytes(_ bundleId: String) -> [UInt8] { DER.utf8String(bundleId) }

    /// Encodes a receipt as Apple does: a DER SET of attributes, sorted by encoding.
    public static func encode(_ receipt: AppReceipt) -> [UInt8] {
        if receipt.receiptType == .xcode { return encodeXcode(receipt) }
        let sandbox = receipt.receiptType.environment == .sandbox
        var attributes: [[UInt8]] = [
            attribute(Field.receiptType, DER.utf8String(receipt.receiptType.rawValue)),
            attribute(Field.appItemId, DER.integer(receipt.appItemId)),
            attribute(Field.bundleId, bundleIdBytes(receipt.bundleId)),
            attribute(Field.applicationVersion, DER.utf8String(receipt.applicationVersion)),
            attribute(Field.opaqueValue, Array(receipt.opaqueValue), version: 2),
            attribute(Field.sha1Hash, Array(receipt.sha1Hash)),
            attribute(8, DER.ia5String(sandbox ? "" : receipt.creationDate.map(ReceiptDate.rfc3339) ?? "")),
            attribute(9, DER.integer(0)),
            attribute(Field.ageRating, DER.ia5String("4+")),
            attribute(Field.developerId, DER.integer(0)),
            attribute(Field.creationDate, date(receipt.creationDate)),
            attribute(Field.downloadId, DER.integer(receipt.downloadId)),
            attribute(Field.installerVersion, DER.integer(receipt.versionExternalIdentifier)),
            attribute(Field.originalPurchaseDate, date(receipt.originalPurchaseDate)),
            attribute(20, DER.utf8String("")),
            attribute(25, DER.integer(3)),
        ]
        if let version = receipt.originalApplicationVersion {
            attributes.append(attribute(Field.originalApplicationVersion, DER.utf8String(version)))
        }
        if let expiration = receipt.expirationDate {
            attributes.append(attribute(Field.expirationDate, date(expiration)))
        }
        for purchase in receipt.inApp {
            attributes.append(attribute(Field.inAppPurchase, encode(purchase)))
        }
        return DER.setOf(attributes)
    }

    /// A receipt as Xcode's StoreKit Testing writes it (reference §4.8): receipt type `Xcode`, app id 0, an 8-byte
    /// opaque value (attribute version 1), no original application version, expiration 4001-01-01, and in-app
    /// entries without an original transaction id or date.
    static func encodeXcode(_ receipt: AppReceipt) -> [UInt8] {
        var attributes: [[UInt8]] = [
            attribute(Field.receiptType, DER.utf8String(receipt.receiptType.rawValue)),
            attribute(Field.appItemId, DER.integer(0)),
            attribute(Field.bundleId, bundleIdBytes(receipt.bundleId)),
            attribute(Field.applicationVersion, DER.utf8String(receipt.applicationVersion)),
            attribute(Field.opaqueValue, Array(receipt.opaqueValue.prefix(8))),
            attribute(Field.sha1Hash, Array(receipt.sha1Hash)),
            attribute(8, DER.ia5String("")),
            attribute(Field.creationDate, date(receipt.creationDate)),
            attribute(Field.expirationDate, DER.ia5String("4001-01-01T00:00:00Z")),
        ]
        for purchase in receipt.inApp {
            var fields: [[UInt8]] = [
                attribute(InAppField.quantity, DER.integer(Int64(purchase.quantity))),
                attribute(InAppField.productId, DER.utf8String(purchase.productId)),
                attribute(InAppField.transactionId, DER.utf8String(purchase.transactionId)),
                attribute(InAppField.purchaseDate, date(purchase.purchaseDate)),
            ]
            if let expires = purchase.expiresDate { fields.append(attribute(InAppField.expiresDate, date(expires))) }
            if let cancelled = purchase.cancellationDate { fields.append(attribute(InAppField.cancellationDate, date(cancelled))) }
            if let intro = purchase.isInIntroOfferPeriod { fields.append(attribute(InAppField.isInIntroOfferPeriod, DER.integer(intro ? 1 : 0))) }
            fields.append(attribute(InAppField.isTrialPeriod, DER.integer(purchase.isTrialPeriod ? 1 : 0)))
            attributes.append(attribute(Field.inAppPurchase, DER.setOf(fields)))
        }
        return DER.setOf(attributes)
    }

    static func encode(_ purchase: InAppPurchase) -> [UInt8] {
        var attributes: [[UInt8]] = [
            attribute(InAppField.quantity, DER.integer(Int64(purchase.quantity))),
            attribute(InAppField.productId, DER.utf8String(purchase.productId)),
            attribute(InAppField.transactionId, DER.utf8String(purchase.transactionId)),
            attribute(InAppField.purchaseDate, date(purchase.purchaseDate)),
            attribute(InAppField.originalTransactionId, DER.utf8String(purchase.originalTransactionId ?? purchase.transactionId)),
            attribute(InAppField.originalPurchaseDate, date(purchase.originalPurchaseDate ?? purchase.purchaseDate)),
            attribute(InAppField.productType, DER.integer(Int64(max(0, purchase.productTypeCode ?? 0)))),
            attribute(InAppField.expiresDate, date(purchase.expiresDate)),
            attribute(1709, DER.utf8String("")),
            attribute(1710, DER.integer(0)),
            attribute(InAppField.webOrderLineItemId, DER.integer(purchase.webOrderLineItemId ?? 0)),
            attribute(InAppField.cancellationDate, date(purchase.cancellationDate)),
            attribute(InAppField.isTrialPeriod, DER.integer(purchase.isTrialPeriod ? 1 : 0)),
            attribute(InAppField.promotionalOfferId, DER.utf8String(purchase.promotionalOfferId ?? "")),
            attribute(1722, DER.integer(0)),
        ]
        for unknown in 1714...1718 { attributes.append(attribute(unknown, DER.utf8String(""))) }
        if let intro = purchase.isInIntroOfferPeriod {
            attributes.append(attribute(InAppField.isInIntroOfferPeriod, DER.integer(intro ? 1 : 0)))
        }
        if let reason = purchase.cancellationReason {
            attributes.append(attribute(InAppField.cancellationReason, DER.integer(Int64(reason))))
        }
        return DER.setOf(attributes)
    }

    /// Decodes a payload (DER or BER). Unknown attributes are skipped; empty dates mean absent.
    public static func decode(_ payload: [UInt8]) throws -> AppReceipt {
        if let receipt = decodeFast(payload) { return receipt }
        return try decodeGeneral(payload)
    }

    /// The decoder for every payload, DER or BER (the fast path gives the same answer for the DER ones it reads).
    package static func decodeGeneral(_ payload: [UInt8]) throws -> AppReceipt {
        var receipt = AppReceipt(receiptType: ReceiptType(rawValue: ""), bundleId: "", applicationVersion: "", creationDate: nil)
        var sawBundle = false
        try forEachAttribute(payload[...]) { type, value in
            switch type {
            case Field.receiptType: receipt.receiptType = ReceiptType(rawValue: try string(value))
            case Field.appItemId: receipt.appItemId = try integer(value)
            case Field.bundleId:
                receipt.bundleId = try string(value)
                receipt.bundleIdBytes = Data(value)
                sawBundle = true
            case Field.applicationVersion: receipt.applicationVersion = try string(value)
            case Field.opaqueValue: receipt.opaqueValue = Data(value)
            case Field.sha1Hash: receipt.sha1Hash = Data(value)
            case Field.creationDate: receipt.creationDate = try dateValue(value)
            case Field.downloadId: receipt.downloadId = (try? integer(value)) ?? 0
            case Field.installerVersion: receipt.versionExternalIdentifier = (try? integer(value)) ?? 0
            case Field.originalPurchaseDate: receipt.originalPurchaseDate = try dateValue(value)
            case Field.originalApplicationVersion: receipt.originalApplicationVersion = try string(value)
            case Field.expirationDate: receipt.expirationDate = try dateValue(value)
            case Field.inAppPurchase: receipt.inApp.append(try decodePurchase(value))
            default: break
            }
        }
        guard sawBundle else { throw ASN1Error("receipt payload has no bundle id") }
        return receipt
    }

    static func decodePurchase(_ bytes: ArraySlice<UInt8>) throws -> InAppPurchase {
        var purchase = InAppPurchase(productId: "", transactionId: "", purchaseDate: nil)
        try forEachAttribute(bytes) { type, value in
            switch type {
            case InAppField.quantity: purchase.quantity = Int(try integer(value))
            case InAppField.productId: purchase.productId = try string(value)
            case InAppField.transactionId: purchase.transactionId = try string(value)
            case InAppField.purchaseDate: purchase.purchaseDate = try dateValue(value)
            case InAppField.originalTransactionId: purchase.originalTransactionId = try string(value)
            case InAppField.originalPurchaseDate: purchase.originalPurchaseDate = try dateValue(value)
            case InAppField.productType: purchase.productTypeCode = Int(try integer(value))
            case InAppField.expiresDate: purchase.expiresDate = try dateValue(value)
            case InAppField.webOrderLineItemId:
                let id = try integer(value)
                purchase.webOrderLineItemId = id == 0 ? nil : id
            case InAppField.cancellationDate: purchase.cancellationDate = try dateValue(value)
            case InAppField.isTrialPeriod: purchase.isTrialPeriod = try integer(value) != 0
            case InAppField.isInIntroOfferPeriod: purchase.isInIntroOfferPeriod = try integer(value) != 0
            case InAppField.cancellationReason: purchase.cancellationReason = Int(try integer(value))
            case InAppField.promotionalOfferId:
                let text = try string(value)
                purchase.promotionalOfferId = text.isEmpty ? nil : text
            default: break
            }
        }
        return purchase
    }

    /// Calls `body` with (type, value bytes) for each attribute of a SET, without building arrays.
    static func forEachAttribute(_ bytes: ArraySlice<UInt8>, _ body: (Int, ArraySlice<UInt8>) throws -> Void) throws {
        let (set, rest) = try ASN1Element.parsePrefix(bytes)
        guard rest.isEmpty else { throw ASN1Error("trailing bytes after the receipt SET") }
        guard set.tag == DER.Tag.set else { throw ASN1Error("receipt payload is not a SET") }
        var cursor = set.content
        while !cursor.isEmpty {
            let (attribute, remaining) = try ASN1Element.parsePrefix(cursor)
            cursor = remaining
            guard attribute.tag == DER.Tag.sequence else { throw ASN1Error("receipt attribute is not a SEQUENCE") }
            let (typeElement, afterType) = try ASN1Element.parsePrefix(attribute.content)
            let (_, afterVersion) = try ASN1Element.parsePrefix(afterType)
            let (valueElement, afterValue) = try ASN1Element.parsePrefix(afterVersion)
            guard afterValue.isEmpty else { throw ASN1Error("receipt attribute needs three fields") }
            let value: ArraySlice<UInt8>
            if valueElement.tag == DER.Tag.octetString {
                value = valueElement.content
            } else {
                value = try valueElement.octets()[...]
            }
            try body(Int(try typeElement.integer()), value)
        }
    }

    /// The (type, value bytes) pairs of a SET of receipt attributes.
    static func attributes(of bytes: [UInt8]) throws -> [(Int, [UInt8])] {
        var result: [(Int, [UInt8])] = []
        try forEachAttribute(bytes[...]) { result.append(($0, Array($1))) }
        return result
    }

    static func string(_ value: ArraySlice<UInt8>) throws -> String {
        let (element, rest) = try ASN1Element.parsePrefix(value)
        guard rest.isEmpty else { throw ASN1Error("trailing bytes after a string") }
        return try element.string()
    }

    static func integer(_ value: ArraySlice<UInt8>) throws -> Int64 {
        let (element, rest) = try ASN1Element.parsePrefix(value)
        guard rest.isEmpty else { throw ASN1Error("trailing bytes after an integer") }
        return try element.integer()
    }

    static func dateValue(_ value: ArraySlice<UInt8>) throws -> Date? {
        let (element, rest) = try ASN1Element.parsePrefix(value)
        guard rest.isEmpty else { throw ASN1Error("trailing bytes after a string") }
        guard ASN1Element.isString(tag: element.tag) else { throw ASN1Error("expected a string") }
        if element.content.isEmpty { return nil }
        // Read from the bytes themselves (a date is ASCII): no String is made for each date of each purchase.
        guard let date = element.content.withUnsafeBufferPointer({ ReceiptDate.parseRFC3339(utf8: $0) }) else { throw ASN1Error("bad date in receipt") }
        return date
    }
}
