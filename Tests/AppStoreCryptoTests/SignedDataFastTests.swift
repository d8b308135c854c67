@testable import AppStoreCrypto
import AppStoreModels
import Foundation
import Testing

@Suite("SignedData fast path")
struct SignedDataFastTests {
    static func emulatorLayout() throws -> [UInt8] {
        let chain = SigningTests.chain
        return try SignedData.sign(payload: ReceiptPayload.encode(SigningTests.sampleReceipt()), key: chain.leafKey,
                                   chain: [chain.leaf, chain.intermediate, chain.root])
    }

    static func realReceipt(_ prefix: String) throws -> [UInt8] {
        let text = try Fixtures.text("fixtures/real", prefix: prefix, suffix: ".receipt.b64")
        return try #require(ReceiptDecoder.base64Decode(text))
    }

    @Test("The emulator's receipts and Apple's real ones are read by the fast path exactly as by the general parser",
          arguments: ["emulator", "r01", "r04"])
    func agree(source: String) throws {
        let der = source == "emulator" ? try Self.emulatorLayout() : try Self.realReceipt(source)
        let fast = try #require(SignedData.parseDER(der))
        let general = try SignedData(generalBER: der)
        #expect(fast == general)
        #expect(fast.certificates.count == 3 || source == "r01")
        #expect(!fast.payload.isEmpty && !fast.signature.isEmpty)
    }

    @Test("Xcode's BER receipt and truncated receipts go to the general parser, which reads or refuses them as before")
    func fallsBack() throws {
        let xcode = try #require(ReceiptDecoder.base64Decode(try Fixtures.text("fixtures/xcode", prefix: "xcode-receipt", suffix: ".b64")))
        #expect(SignedData.parseDER(xcode) == nil)
        #expect(try SignedData(ber: xcode).payload == SignedData(generalBER: xcode).payload)
        let der = try Self.emulatorLayout()
        for cut in [0, 1, 2, 20, der.count / 2, der.count - 1] {
            let truncated = Array(der.prefix(cut))
            #expect(SignedData.parseDER(truncated) == nil)
            #expect(throws: CryptoError.self) { try SignedData(ber: truncated) }
        }
        // Trailing bytes after the outer element are refused, as the general parser refuses them.
        #expect(SignedData.parseDER(der + [0]) == nil)
        #expect(throws: CryptoError.self) { try SignedData(ber: der + [0]) }
    }

    @Test("On corrupted receipts the fast path reads nothing the general parser would not read the same way",
          arguments: ["emulator", "r04"])
    func corrupted(source: String) throws {
        let der = source == "emulator" ? try Self.emulatorLayout() : try Self.realReceipt(source)
        var rng = SystemRandomNumberGenerator()
        var read = 0
        for round in 0..<3_000 {
            var corrupted = der
            // Mostly the structure (the first 64 bytes and the signer's at the end), sometimes anywhere.
            let index = switch round % 3 {
            case 0: Int.random(in: 0..<64, using: &rng)
            case 1: Int.random(in: (der.count - 400)..<der.count, using: &rng)
            default: Int.random(in: 0..<der.count, using: &rng)
            }
            corrupted[index] = UInt8.random(in: 0...255, using: &rng)
            let general = try? SignedData(generalBER: corrupted)
            guard let fast = SignedData.parseDER(corrupted) else { continue }
            read += 1
            let expected = try #require(general, "the fast path read bytes the general parser refuses (byte \(index))")
            #expect(fast == expected, "byte \(index)")
        }
        #expect(read > 100, "most single-byte corruptions of contents are still read")
    }
}
