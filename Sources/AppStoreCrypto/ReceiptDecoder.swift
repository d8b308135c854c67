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

    /// Each character's six bits already shifted into place for each of the four positions of a group (four tables of
    /// 256 entries, one after the other), so that a group is four lookups and three ORs. Anything but the 64 plain
    /// characters (line breaks, padding, invalid ones) sets bit 24 in every table, so one test of the OR finds it.
    private static let shiftedBase64Table: [UInt32] = {
        var tables = [UInt32](repeating: 1 << 24, count: 1024)
        for character in 0..<256 where base64Table[character] < 64 {
            let value = UInt32(base64Table[character])
            tables[character] = value << 18
            tables[256 + character] = value << 12
            tables[512 + character] = value << 6
            tables[768 + character] = value
        }
        return tables
    }()

    public static func decode(base64 input: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
        var failed = false
        // Written straight into the array's storage, eight characters at a time while they are plain ones (all but
        // line breaks and the padding), else four, else one: a receipt is kilobytes of Base64, read once per
        // verification (a thousand purchases are half a megabyte).
        let output = base64Table.withUnsafeBufferPointer { table in shiftedBase64Table.withUnsafeBufferPointer { shifted in
            [UInt8](unsafeUninitializedCapacity: input.count / 4 * 3 + 3) { buffer, written in
                var accumulator: UInt32 = 0
                var count = 0, padding = 0, index = 0, out = 0
                let end = input.count
                while index < end {
                    if count == 0, padding == 0, let source = input.baseAddress, let target = buffer.baseAddress {
                        // Two groups make six bytes, stored as eight: the two after them are overwritten next, or lie
                        // past what is kept. There is room: `out` is 3k for the 4k plain characters read so far, so
                        // k ≤ index / 4, and index + 8 ≤ end, so out + 8 < end / 4 * 3 + 3, the capacity.
                        while index + 8 <= end {
                            let group = source + index
                            let first = shifted[Int(group[0])] | shifted[256 + Int(group[1])]
                                | shifted[512 + Int(group[2])] | shifted[768 + Int(group[3])]
                            let second = shifted[Int(group[4])] | shifted[256 + Int(group[5])]
                                | shifted[512 + Int(group[6])] | shifted[768 + Int(group[7])]
                            guard (first | second) & 0xff00_0000 == 0 else { break }
                            UnsafeMutableRawPointer(target + out).storeBytes(of: (UInt64(first) << 40 | UInt64(second) << 16).bigEndian,
                                                                             as: UInt64.self)
                            out += 6
                            index += 8
                        }
                        guard index < end else { break }
                    }
                    if count == 0, index + 4 <= end {
                        let a = table[Int(input[index])], b = table[Int(input[index + 1])]
                        let c = table[Int(input[index + 2])], d = table[Int(input[index + 3])]
                        if a | b | c | d < 64 {
                            guard padding == 0 else { failed = true; return }
                            Base64Group.write(a, b, c, d, into: &buffer, at: out)
                            out += 3
                            index += 4
                            continue
                        }
                    }
                    let value = table[Int(input[index])]
                    index += 1
                    switch value {
                    case 0xfe: continue
                    case 0xfd:
                        padding += 1
                        continue
                    case 0xff:
                        failed = true
                        return
                    default:
                        guard padding == 0 else { failed = true; return }
                        accumulator = accumulator << 6 | UInt32(value)
                        count += 1
                        if count == 4 {
                            buffer[out] = UInt8(truncatingIfNeeded: accumulator >> 16)
                            buffer[out + 1] = UInt8(truncatingIfNeeded: accumulator >> 8)
                            buffer[out + 2] = UInt8(truncatingIfNeeded: accumulator)
                            out += 3
                            accumulator = 0
                            count = 0
                        }
                    }
                }
                switch count {
                case 0: break
                case 2:
                    buffer[out] = UInt8(truncatingIfNeeded: accumulator >> 4)
                    out += 1
                case 3:
                    buffer[out] = UInt8(truncatingIfNeeded: accumulator >> 10)
                    buffer[out + 1] = UInt8(truncatingIfNeeded: accumulator >> 2)
                    out += 2
                default: failed = true
                }
                if padding > 2 { failed = true }
                written = out
            }
        } }
        guard !failed, !output.isEmpty else { return nil }
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
