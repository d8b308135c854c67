import AppStoreModels
import Foundation

/// The fast path of `ReceiptPayload.decode` for payloads in plain DER, as the App Store writes them: one pass over the
/// bytes with `DERCursor`. Anything it does not expect (indefinite lengths, constructed strings, multi-byte tags, a value
/// out of range) makes it give up and the general decoder reads the payload instead, with its own errors: the fast path
/// never decides that a payload is bad.
extension ReceiptPayload {
    private static func integer(_ bytes: UnsafeBufferPointer<UInt8>, _ element: DERElement) -> Int64? {
        guard element.tag == 0x02, element.end > element.start, bytes[element.start] & 0x80 == 0 else { return nil }
        var start = element.start
        while start < element.end, bytes[start] == 0 { start += 1 }
        guard element.end - start <= 8 else { return nil }
        var value: UInt64 = 0
        for index in start..<element.end { value = value << 8 | UInt64(bytes[index]) }
        return value <= UInt64(Int64.max) ? Int64(value) : nil
    }

    private static func string(_ bytes: UnsafeBufferPointer<UInt8>, _ element: DERElement) -> String? {
        guard ASN1Element.isString(tag: element.tag) else { return nil }
        return String(validUTF8: UnsafeBufferPointer(rebasing: bytes[element.start..<element.end]))
    }

    /// A date attribute: absent (an empty string), a date, or something the fast path leaves to the general decoder.
    private enum DateValue {
        case absent
        case date(Date)
        case unreadable
    }

    private static func date(_ bytes: UnsafeBufferPointer<UInt8>, _ element: DERElement) -> DateValue {
        guard ASN1Element.isString(tag: element.tag) else { return .unreadable }
        if element.start == element.end { return .absent }
        guard let date = ReceiptDate.parseRFC3339(utf8: UnsafeBufferPointer(rebasing: bytes[element.start..<element.end])) else { return .unreadable }
        return .date(date)
    }

    /// The date or nil (absent), or false when the fast path stops.
    private static func readDate(_ bytes: UnsafeBufferPointer<UInt8>, _ octets: DERElement) -> (ok: Bool, date: Date?) {
        guard let value = single(bytes, octets) else { return (false, nil) }
        switch date(bytes, value) {
        case .absent: return (true, nil)
        case .date(let date): return (true, date)
        case .unreadable: return (false, nil)
        }
    }

    /// Calls `body` with each attribute's (type, value element inside the OCTET STRING); false where the fast path stops.
    private static func forEachAttribute(_ bytes: UnsafeBufferPointer<UInt8>, in range: DERElement,
                                         _ body: (Int, DERElement) -> Bool) -> Bool {
        var cursor = DERCursor(bytes: bytes, position: range.start, end: range.end)
        guard let set = cursor.next(), set.tag == DER.Tag.set, cursor.isAtEnd else { return false }
        var attributes = cursor.children(of: set)
        while !attributes.isAtEnd {
            guard let attribute = attributes.next(), attribute.tag == DER.Tag.sequence else { return false }
            var fields = attributes.children(of: attribute)
            guard let type = fields.next(), let typeValue = integer(bytes, type), let version = fields.next(), version.tag == 0x02,
                  let octets = fields.next(), octets.tag == DER.Tag.octetString, fields.isAtEnd else { return false }
            guard body(Int(typeValue), octets) else { return false }
        }
        return true
    }

    /// The value inside an attribute's OCTET STRING, when it is exactly one element.
    private static func single(_ bytes: UnsafeBufferPointer<UInt8>, _ octets: DERElement) -> DERElement? {
        var cursor = DERCursor(bytes: bytes, position: octets.start, end: octets.end)
        guard let element = cursor.next(), cursor.isAtEnd else { return nil }
        return element
    }

    /// The payload read in one DER pass, or nil to have the general decoder read it.
    package static func decodeFast(_ payload: [UInt8]) -> AppReceipt? {
        payload.withUnsafeBufferPointer { bytes -> AppReceipt? in
            var receipt = AppReceipt(receiptType: ReceiptType(rawValue: ""), bundleId: "", applicationVersion: "", creationDate: nil)
            var sawBundle = false
            let whole = DERElement(tag: 0, start: 0, end: bytes.count)
            let complete = forEachAttribute(bytes, in: whole) { type, octets in
                switch type {
                case Field.opaqueValue: receipt.opaqueValue = Data(UnsafeBufferPointer(rebasing: bytes[octets.start..<octets.end]))
                case Field.sha1Hash: receipt.sha1Hash = Data(UnsafeBufferPointer(rebasing: bytes[octets.start..<octets.end]))
                case Field.inAppPurchase:
                    guard let purchase = decodePurchaseFast(bytes, octets) else { return false }
                    receipt.inApp.append(purchase)
                case Field.receiptType, Field.appItemId, Field.bundleId, Field.applicationVersion, Field.creationDate, Field.downloadId,
                     Field.installerVersion, Field.originalPurchaseDate, Field.originalApplicationVersion, Field.expirationDate:
                    guard let value = single(bytes, octets) else { return false }
                    switch type {
                    case Field.receiptType:
                        guard let text = string(bytes, value) else { return false }
                        receipt.receiptType = ReceiptType(rawValue: text)
                    case Field.appItemId:
                        guard let number = integer(bytes, value) else { return false }
                        receipt.appItemId = number
                    case Field.bundleId:
                        guard let text = string(bytes, value) else { return false }
                        receipt.bundleId = text
                        receipt.bundleIdBytes = Data(UnsafeBufferPointer(rebasing: bytes[octets.start..<octets.end]))
                        sawBundle = true
                    case Field.applicationVersion:
                        guard let text = string(bytes, value) else { return false }
                        receipt.applicationVersion = text
                    case Field.downloadId: receipt.downloadId = integer(bytes, value) ?? 0
                    case Field.installerVersion: receipt.versionExternalIdentifier = integer(bytes, value) ?? 0
                    case Field.originalApplicationVersion:
                        guard let text = string(bytes, value) else { return false }
                        receipt.originalApplicationVersion = text
                    default:
                        let (ok, date) = readDate(bytes, octets)
                        guard ok else { return false }
                        switch type {
                        case Field.creationDate: receipt.creationDate = date
                        case Field.originalPurchaseDate: receipt.originalPurchaseDate = date
                        default: receipt.expirationDate = date
                        }
                    }
                default: break
                }
                return true
            }
            return complete && sawBundle ? receipt : nil
        }
    }

    private static func decodePurchaseFast(_ bytes: UnsafeBufferPointer<UInt8>, _ octets: DERElement) -> InAppPurchase? {
        var purchase = InAppPurchase(productId: "", transactionId: "", purchaseDate: nil)
        let complete = forEachAttribute(bytes, in: octets) { type, octets in
            switch type {
            case InAppField.quantity, InAppField.productType, InAppField.webOrderLineItemId, InAppField.isTrialPeriod,
                 InAppField.isInIntroOfferPeriod, InAppField.cancellationReason:
                guard let value = single(bytes, octets), let number = integer(bytes, value) else { return false }
                switch type {
                case InAppField.quantity: purchase.quantity = Int(number)
                case InAppField.productType: purchase.productTypeCode = Int(number)
                case InAppField.webOrderLineItemId: purchase.webOrderLineItemId = number == 0 ? nil : number
                case InAppField.isTrialPeriod: purchase.isTrialPeriod = number != 0
                case InAppField.isInIntroOfferPeriod: purchase.isInIntroOfferPeriod = number != 0
                default: purchase.cancellationReason = Int(number)
                }
            case InAppField.productId, InAppField.transactionId, InAppField.originalTransactionId, InAppField.promotionalOfferId:
                guard let value = single(bytes, octets), let text = string(bytes, value) else { return false }
                switch type {
                case InAppField.productId: purchase.productId = text
                case InAppField.transactionId: purchase.transactionId = text
                case InAppField.originalTransactionId: purchase.originalTransactionId = text
                default: purchase.promotionalOfferId = text.isEmpty ? nil : text
                }
            case InAppField.purchaseDate, InAppField.originalPurchaseDate, InAppField.expiresDate, InAppField.cancellationDate:
                let (ok, date) = readDate(bytes, octets)
                guard ok else { return false }
                switch type {
                case InAppField.purchaseDate: purchase.purchaseDate = date
                case InAppField.originalPurchaseDate: purchase.originalPurchaseDate = date
                case InAppField.expiresDate: purchase.expiresDate = date
                default: purchase.cancellationDate = date
                }
            default: break
            }
            return true
        }
        return complete ? purchase : nil
    }
}
