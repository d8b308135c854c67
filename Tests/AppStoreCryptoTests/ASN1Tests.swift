@testable import AppStoreCrypto
import AppStoreModels
import Foundation
import Testing

@Suite("BER/DER")
struct ASN1Tests {
    @Test("Integers and OIDs round-trip", arguments: [Int64(0), 1, 127, 128, 255, 256, 1_000_000_030_274_153, Int64.max])
    func integers(value: Int64) throws {
        #expect(try ASN1Element.parse(DER.integer(value)).integer() == value)
    }

    @Test("Object identifiers round-trip", arguments: [OID.signedData, OID.sha256, OID.appleReceiptSigner, OID.appleWWDRIntermediate,
                                                           "0.9.2342.19200300.100.1.1", "1.3.6.1.4.1.311", "2.999.3", "2.5"])
    func oids(oid: String) throws {
        #expect(try ASN1Element.parse(DER.objectIdentifier(oid)).objectIdentifier() == oid)
    }

    @Test("Object identifiers that are not DER are refused: an arc with a leading 0x80, an arc cut short, an arc past 64 bits",
          arguments: [[0x2a, 0x80, 0x01], [0x2a, 0x86], [0x2a, 0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00], [0x80, 0x2a]])
    func malformedOIDs(content: [UInt8]) {
        #expect(throws: ASN1Error.self) { try ASN1Element.parse([0x06, UInt8(content.count)] + content).objectIdentifier() }
    }

    @Test("SET OF is sorted by encoding, not by insertion")
    func setOrdering() throws {
        let set = DER.setOf([DER.integer(300), DER.integer(2), DER.utf8String("a")])
        let children = try ASN1Element.parse(set).children()
        #expect(children.map(\.tag) == [0x02, 0x02, 0x0c])
        #expect(try children[0].integer() == 2)
    }

    @Test("Indefinite lengths and constructed OCTET STRINGs (Xcode's BER) are read")
    func indefinite() throws {
        // SEQUENCE (indefinite) { OCTET STRING constructed (indefinite) { "ab", "cd" } }
        let bytes: [UInt8] = [0x30, 0x80, 0x24, 0x80, 0x04, 0x02, 0x61, 0x62, 0x04, 0x02, 0x63, 0x64, 0x00, 0x00, 0x00, 0x00]
        let sequence = try ASN1Element.parse(bytes)
        let octets = try sequence.children()[0].octets()
        #expect(octets == Array("abcd".utf8))
    }

    @Test("Truncated, over-long and junk input fail with an error, never a crash",
          arguments: [[UInt8](), [0x30], [0x30, 0x05, 0x02], [0x30, 0x84, 0xff, 0xff, 0xff, 0xff], [0x1f, 0x01, 0x00], [0x30, 0x80, 0x02, 0x01, 0x00]])
    func malformed(bytes: [UInt8]) {
        #expect(throws: ASN1Error.self) { _ = try ASN1Element.parse(bytes).children() }
    }

    /// Constructed OCTET STRINGs nested `depth` times, definite or indefinite lengths.
    static func nestedOctetStrings(depth: Int, indefinite: Bool) -> [UInt8] {
        var bytes = DER.octetString([0x61])
        for _ in 0..<depth { bytes = indefinite ? [0x24, 0x80] + bytes + [0, 0] : DER.tlv(0x24, bytes) }
        return bytes
    }

    @Test("Hostile nesting is refused with an error, not a stack overflow", arguments: [false, true])
    func hostileNesting(indefinite: Bool) {
        let deep = Self.nestedOctetStrings(depth: 20_000, indefinite: indefinite)
        #expect(throws: ASN1Error.self) { _ = try ASN1Element.parse(deep).octets() }
        // Inside a receipt-shaped ContentInfo, and through the whole decoder.
        let receipt = DER.sequence([DER.objectIdentifier(OID.signedData), DER.explicit(0, deep)])
        #expect(throws: (any Error).self) { _ = try ReceiptDecoder.decode(receipt) }
        #expect(throws: (any Error).self) { _ = try SignedData(ber: receipt) }
    }

    @Test("Nesting up to the bound is read; one level more is refused")
    func nestingBound() throws {
        let allowed = Self.nestedOctetStrings(depth: ASN1Element.maximumDepth - 1, indefinite: false)
        #expect(try ASN1Element.parse(allowed).octets() == [0x61])
        let tooDeep = Self.nestedOctetStrings(depth: ASN1Element.maximumDepth, indefinite: true)
        #expect(throws: ASN1Error("nesting too deep")) { _ = try ASN1Element.parse(tooDeep).octets() }
    }

    @Test("Random bytes never crash the parser")
    func randomBytes() {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<2000 {
            let bytes = (0..<Int.random(in: 0...64, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
            _ = try? ReceiptDecoder.decode(bytes)
        }
    }
}

@Suite("Base64 of receipt-data")
struct Base64Tests {
    @Test("Standard, unpadded, URL-safe and line-wrapped forms decode alike",
          arguments: ["TWFu/+8=", "TWFu/+8", "TWFu_-8=", "TWFu\n/+8=\r\n", " TWFu /+8= "])
    func forms(text: String) {
        #expect(ReceiptDecoder.base64Decode(text) == [77, 97, 110, 255, 239])
    }

    @Test("Invalid characters, data after padding and impossible lengths are refused", arguments: ["", "%%%%", "TWFu=TWFu", "T", "TWFuT"])
    func invalid(text: String) {
        #expect(ReceiptDecoder.base64Decode(text) == nil)
    }

    @Test("Decoding agrees with a character-at-a-time reading on random text: plain runs, line breaks, padding and invalid characters anywhere")
    func agreesWithOneCharacterAtATime() {
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_".utf8)
        let others = Array("= \n\r\t*%.\u{0}".utf8) + [0x80, 0xc3, 0xff]
        // The rules of `base64Decode`, one character at a time: spaces skipped, data after padding refused, a last
        // group of two or three characters kept, of one refused.
        func reference(_ text: [UInt8]) -> [UInt8]? {
            var bits: UInt32 = 0, count = 0, padding = 0, output: [UInt8] = []
            for character in text {
                if [9, 10, 13, 32].contains(character) { continue }
                if character == UInt8(ascii: "=") { padding += 1; continue }
                guard let index = alphabet.firstIndex(of: character), padding == 0 else { return nil }
                bits = bits << 6 | UInt32(index < 64 ? index : index - 2)
                count += 1
                if count == 4 {
                    output += [UInt8(truncatingIfNeeded: bits >> 16), UInt8(truncatingIfNeeded: bits >> 8), UInt8(truncatingIfNeeded: bits)]
                    bits = 0
                    count = 0
                }
            }
            switch count {
            case 0: break
            case 2: output.append(UInt8(truncatingIfNeeded: bits >> 4))
            case 3: output += [UInt8(truncatingIfNeeded: bits >> 10), UInt8(truncatingIfNeeded: bits >> 2)]
            default: return nil
            }
            return padding > 2 || output.isEmpty ? nil : output
        }
        var decoded = 0
        for trial in 0..<20_000 {
            var text = (0..<Int.random(in: 0...90)).map { _ in alphabet[Int.random(in: 0..<64)] }
            // Most texts get a few characters that are not plain, so every path meets every other at any offset.
            for _ in 0..<[0, 1, 1, 2, 3][trial % 5] where !text.isEmpty {
                text[Int.random(in: 0..<text.count)] = Bool.random() ? alphabet[Int.random(in: 62..<66)] : others.randomElement()!
            }
            if trial % 7 == 0 { text += Array("==".utf8.prefix(Int.random(in: 0...2))) }
            let expected = reference(text)
            if expected != nil { decoded += 1 }
            #expect(text.withUnsafeBufferPointer { ReceiptDecoder.decode(base64: $0) } == expected, "\(String(decoding: text, as: UTF8.self))")
        }
        #expect(decoded > 5_000, "too few texts were valid to compare what they decode to")
    }

    @Test("Decoding agrees with Foundation on random data")
    func agreesWithFoundation() {
        for length in 1..<200 {
            let bytes = (0..<length).map { _ in UInt8.random(in: 0...255) }
            #expect(ReceiptDecoder.base64Decode(Data(bytes).base64EncodedString(options: .lineLength64Characters)) == bytes)
        }
    }
}

/// The DER fast path of receipt payloads reads what the general decoder reads, and leaves the rest to it.
@Suite("Receipt payload fast path")
struct ReceiptPayloadFastPathTests {
    static func receipt(purchases: Int, type: ReceiptType = .productionSandbox) -> AppReceipt {
        let date = Date(timeIntervalSince1970: 1_790_000_000)
        let inApp = (0..<purchases).map { index in
            InAppPurchase(quantity: index % 3 + 1, productId: "product.\(index % 7)", transactionId: String(2_000_000_000 + index),
                          originalTransactionId: String(2_000_000_000 + index / 2), purchaseDate: date.addingTimeInterval(Double(index)),
                          originalPurchaseDate: date, expiresDate: index % 2 == 0 ? date.addingTimeInterval(86_400) : nil,
                          webOrderLineItemId: index % 2 == 0 ? Int64(index + 1) : nil,
                          cancellationDate: index % 5 == 0 ? date.addingTimeInterval(60) : nil, cancellationReason: index % 5 == 0 ? 1 : nil,
                          isTrialPeriod: index % 4 == 0, isInIntroOfferPeriod: index % 2 == 0 ? (index % 3 == 0) : nil,
                          promotionalOfferId: index % 6 == 0 ? "offer" : nil, productTypeCode: index % 4)
        }
        return AppReceipt(receiptType: type, appItemId: 1_234_567_890, bundleId: "com.example.fast", applicationVersion: "2.1",
                          opaqueValue: Data([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]), sha1Hash: Data(repeating: 7, count: 20),
                          creationDate: date, originalPurchaseDate: date, originalApplicationVersion: "1.0", downloadId: 99,
                          versionExternalIdentifier: 5, inApp: inApp, bundleIdBytes: Data(ReceiptPayload.bundleIdBytes("com.example.fast")))
    }

    @Test("Both decoders agree on DER payloads", arguments: [0, 1, 17, 300])
    func agree(purchases: Int) throws {
        let payload = ReceiptPayload.encode(Self.receipt(purchases: purchases))
        let fast = try #require(ReceiptPayload.decodeFast(payload))
        #expect(fast == (try ReceiptPayload.decodeGeneral(payload)))
        #expect(fast.inApp.count == purchases)
    }

    @Test("Anything unusual goes to the general decoder: BER, truncation, a corrupted byte")
    func fallsBack() throws {
        // Xcode's real receipt: BER with indefinite lengths around a payload the general decoder reads.
        let payload = ReceiptPayload.encode(Self.receipt(purchases: 3))
        for cut in [1, 10, payload.count / 2, payload.count - 1] {
            #expect(ReceiptPayload.decodeFast(Array(payload.prefix(cut))) == nil)
            #expect(throws: (any Error).self) { try ReceiptPayload.decode(Array(payload.prefix(cut))) }
        }
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<500 {
            var corrupted = payload
            corrupted[Int.random(in: 0..<corrupted.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
            let general = try? ReceiptPayload.decodeGeneral(corrupted)
            if let fast = ReceiptPayload.decodeFast(corrupted) { #expect(fast == general, "the fast path never answers differently") }
        }
    }
}
