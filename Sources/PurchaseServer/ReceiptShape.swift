import AppStoreCrypto

/// The look an upload gets before it is stored: its first bytes must be Base64 of a PKCS#7
/// ContentInfo naming signed data (an app receipt) or of an iOS 6 transaction receipt (`{`).
/// Anything else is refused at once and stored only as a rejection (hash, size, reason), so junk
/// never waits in the verification queue ahead of real purchases. It reads at most 64 characters;
/// the full checks stay with the worker. A signed transaction's look is its form as a compact JWS.
enum ReceiptShape {
    /// DER of the PKCS#7 signedData object identifier, 1.2.840.113549.1.7.2.
    private static let signedDataOID: [UInt8] = [0x06, 0x09, 0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x07, 0x02]

    /// Why `receiptData` cannot be an App Store receipt, or nil when it may be one.
    static func rejection(of receiptData: String) -> ReceiptRejection? {
        var prefix: [UInt8] = []
        prefix.reserveCapacity(64)
        for byte in receiptData.utf8 where !(byte == 9 || byte == 10 || byte == 13 || byte == 32) {
            prefix.append(byte)
            if prefix.count == 64 { break }
        }
        prefix.removeLast(prefix.count % 4)
        guard let bytes = prefix.withUnsafeBufferPointer({ ReceiptDecoder.decode(base64: $0) }), !bytes.isEmpty else {
            return ReceiptRejection(code: "malformed_receipt", reason: "receipt-data is not Base64")
        }
        if isTransactionReceipt(bytes) || isSignedData(bytes) { return nil }
        return ReceiptRejection(code: "malformed_receipt", reason: "receipt-data is not an App Store receipt")
    }

    /// Why `text` cannot be a StoreKit 2 signed transaction, or nil when it may be one: a compact JWS is three
    /// non-empty parts of Base64url (`A`–`Z`, `a`–`z`, `0`–`9`, `-`, `_`) joined by two dots, as the worker's check
    /// requires of it too. So no upload is stored in a form this server writes itself (`StoredJWS`, which begins with
    /// `~`).
    static func rejection(ofSignedTransaction text: String) -> ReceiptRejection? {
        var dots = 0, partLength = 0
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                 UInt8(ascii: "-"), UInt8(ascii: "_"):
                partLength += 1
            case UInt8(ascii: "."):
                guard partLength > 0, dots < 2 else { return malformedTransaction }
                dots += 1
                partLength = 0
            default:
                return malformedTransaction
            }
        }
        return dots == 2 && partLength > 0 ? nil : malformedTransaction
    }

    private static let malformedTransaction = ReceiptRejection(code: "malformed_transaction",
                                                               reason: "signedTransaction is not a StoreKit 2 signed transaction")

    private static func isTransactionReceipt(_ bytes: [UInt8]) -> Bool {
        bytes.first(where: { !($0 == 9 || $0 == 10 || $0 == 13 || $0 == 32) }) == UInt8(ascii: "{")
    }

    /// A SEQUENCE (definite or indefinite length) whose first element is the signedData OID.
    private static func isSignedData(_ bytes: [UInt8]) -> Bool {
        guard bytes.count >= 2, bytes[0] == 0x30 else { return false }
        let lengthBytes = bytes[1] < 0x80 ? 0 : bytes[1] == 0x80 ? 0 : Int(bytes[1] & 0x7f)
        guard lengthBytes <= 4 else { return false }
        let start = 2 + lengthBytes
        return bytes.count >= start + signedDataOID.count && Array(bytes[start..<start + signedDataOID.count]) == signedDataOID
    }
}
