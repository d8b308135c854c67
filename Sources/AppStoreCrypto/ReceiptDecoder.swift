import AppStoreModels
import Foundation

/// Any receipt the App Store has issued: an app receipt (PKCS#7) or an iOS 6 style transaction receipt.
public enum DecodedReceipt: Sendable {
    case app(AppReceipt, SignedData)
    case transaction(LegacyTransactionReceipt)
}

/// Turns `receipt-data` into a decoded receipt.
public enum ReceiptDecoder {
    /// Base64 decoding that tolerates whitespace, line breaks, missing padding and the URL-safe
    /// alphabet, as Apple's decoders do. Nil for any other character or an impossible length.
    public static func base64Decode(_ text: String) -> [UInt8]? {
        var text = text
        return text.withUTF8 { decode(base64: $0) }
    }

    private static let base64Table: [UInt8] = {
        var table = [UInt8](repeating: 0xff, count: 256)
        for (index, byte) in Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8).enumerated() {
            table[Int(byte)] = UInt8(index)
        }
        table[Int(UInt8(ascii: "-"))] = 62
        table[Int(UInt8(ascii: "_"))] = 63
        for space in [9, 10, 13, 32] { table[space] = 0xfe }
        table[Int(UInt8(ascii: "="))] = 0xfd
        return table
    }()

    public static func decode(base64 input: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
        var output: [UInt8] = []
        output.reserveCapacity(input.count / 4 * 3 + 3)
        var accumulator: UInt32 = 0
        var count = 0
        var padding = 0
        for byte in input {
            let value = base64Table[Int(byte)]
            switch value {
            case 0xfe: continue
            case 0xfd:
                padding += 1
                continue
            case 0xff: return nil
            default:
                guard padding == 0 else { return nil }
                accumulator = accumulator << 6 | UInt32(value)
                count += 1
                if count == 4 {
                    output.append(UInt8(truncatingIfNeeded: accumulator >> 16))
                    output.append(UInt8(truncatingIfNeeded: accumulator >> 8))
                    output.append(UInt8(truncatingIfNeeded: accumulator))
                    accumulator = 0
                    count = 0
                }
            }
        }
        switch count {
        case 0: break
        case 2: output.append(UInt8(truncatingIfNeeded: accumulator >> 4))
        case 3:
            output.append(UInt8(truncatingIfNeeded: accumulator >> 10))
            output.append(UInt8(truncatingIfNeeded: accumulator >> 2))
        default: return nil
        }
        guard padding <= 2, !output.isEmpty else { return nil }
        return output
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
