import AppStoreModels
import Foundation

/// Any receipt the App Store has issued: an app receipt (PKCS#7) or an iOS 6 style transaction receipt.
public enum DecodedReceipt: Sendable {
    case app(AppReceipt, SignedData)
    case transaction(LegacyTransactionReceipt)
}

/// Turns `receipt-data` into a decoded receipt.
public enum ReceiptDecoder {
    /// Base64 decoding that tolerates whitespace and line breaks, as Apple's decoders do.
    public static func base64Decode(_ text: String) -> [UInt8]? {
        let cleaned = text.filter { !$0.isWhitespace }
        guard !cleaned.isEmpty else { return nil }
        if let data = Data(base64Encoded: cleaned) { return Array(data) }
        // Some clients drop the padding or use URL-safe characters.
        var normalized = cleaned.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while normalized.count % 4 != 0 { normalized += "=" }
        return Data(base64Encoded: normalized).map(Array.init)
    }

    /// Decodes receipt bytes without checking signatures.
    public static func decode(_ bytes: [UInt8]) throws -> DecodedReceipt {
        if LegacyTransactionReceipt.looksLikeLegacy(bytes) {
            return .transaction(try LegacyTransactionReceipt(bytes: bytes))
        }
        let signedData = try SignedData(ber: bytes)
        do {
            return .app(try ReceiptPayload.decode(signedData.payload), signedData)
        } catch let error as ASN1Error {
            throw CryptoError("malformed_receipt", "the receipt payload is invalid: \(error.description)")
        }
    }
}
