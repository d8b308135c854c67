import AppStoreCrypto
import AppStoreModels
import Foundation
import Testing

@Suite("Apple's real receipts")
struct RealReceiptTests {
    static func appleRoots() throws -> ChainVerifier {
        let pem = String(decoding: try Data(contentsOf: Fixtures.root.appendingPathComponent("certs/apple-inc-root-ca.pem")), as: UTF8.self)
        return ChainVerifier(roots: try Certificate.parsePEM(pem))
    }

    static func receipt(_ prefix: String) throws -> (AppReceipt, SignedData) {
        let text = try Fixtures.text("fixtures/real", prefix: prefix, suffix: ".receipt.b64")
        let bytes = try #require(ReceiptDecoder.base64Decode(text))
        guard case .app(let receipt, let signed) = try ReceiptDecoder.decode(bytes) else { throw CryptoError("unexpected", "not an app receipt") }
        return (receipt, signed)
    }

    @Test("r01 decodes field for field as Apple's verifyReceipt answered")
    func r01MatchesApple() throws {
        let (receipt, _) = try Self.receipt("r01")
        let response = try VerifyReceiptResponse(jsonBytes: Fixtures.data("fixtures/real", prefix: "r01", suffix: ".response.json"))
        let apple = try #require(response.receipt)
        let ours = ReceiptInfo(receipt, requestDate: nil)
        #expect(ours.receiptType == apple.receiptType)
        #expect(ours.bundleId == apple.bundleId)
        #expect(ours.applicationVersion == apple.applicationVersion)
        #expect(ours.receiptCreationDate == apple.receiptCreationDate)
        #expect(ours.originalPurchaseDate == apple.originalPurchaseDate)
        #expect(ours.originalApplicationVersion == apple.originalApplicationVersion)
        #expect(ours.inApp.count == 7)
        let sortKey: (ReceiptTransactionInfo) -> String = { $0.transactionId }
        #expect(ours.inApp.sorted { sortKey($0) < sortKey($1) } == apple.inApp.sorted { sortKey($0) < sortKey($1) })
    }

    @Test("r01 verifies through Apple Inc. Root at its creation date (SHA-1) but not today")
    func r01Signature() throws {
        let (receipt, signed) = try Self.receipt("r01")
        let verifier = try Self.appleRoots()
        #expect(signed.digest == .sha1)
        try signed.verify(with: verifier, at: #require(receipt.creationDate))
        #expect(throws: CryptoError.self) { try signed.verify(with: verifier, at: Date(timeIntervalSince1970: 1_790_000_000)) }
    }

    @Test("r04 is a SHA-256 production receipt that verifies at creation and routes to production")
    func r04() throws {
        let (receipt, signed) = try Self.receipt("r04")
        #expect(receipt.receiptType.environment == .production)
        #expect(signed.digest == .sha256)
        #expect(receipt.inApp.count == 4)
        #expect(receipt.downloadId > 1 << 53 || receipt.downloadId > 0)
        try signed.verify(with: try Self.appleRoots(), at: #require(receipt.creationDate))
    }

    @Test("A receipt whose payload was altered fails its signature")
    func tampered() throws {
        let text = try Fixtures.text("fixtures/real", prefix: "r04", suffix: ".receipt.b64")
        var bytes = try #require(ReceiptDecoder.base64Decode(text))
        let (receipt, _) = try Self.receipt("r04")
        // Change one letter of the bundle id inside the signed payload.
        let needle = Array(receipt.bundleId.utf8)
        let index = try #require((0..<(bytes.count - needle.count)).first { Array(bytes[$0..<($0 + needle.count)]) == needle })
        bytes[index] ^= 0x01
        guard case .app(let altered, let signed) = try ReceiptDecoder.decode(bytes) else { Issue.record("not an app receipt"); return }
        #expect(throws: CryptoError.self) { try signed.verify(with: try Self.appleRoots(), at: altered.creationDate ?? Date()) }
    }

    @Test("The iOS 6 style receipt r12 verifies through the iTunes Store CA at its purchase date")
    func r12() throws {
        let text = try Fixtures.text("fixtures/real", prefix: "r12", suffix: ".receipt.b64")
        guard case .transaction(let legacy) = try ReceiptDecoder.decode(try #require(ReceiptDecoder.base64Decode(text))) else {
            Issue.record("not a transaction receipt")
            return
        }
        #expect(legacy.environment == .sandbox)
        #expect(legacy.purchaseInfo["transaction-id"] == "1000000181298734")
        let ca = try Certificate.parsePEM(String(decoding: try Data(contentsOf: Fixtures.root.appendingPathComponent("certs/apple-itunes-store-ca.pem")), as: UTF8.self))
        try legacy.verify(with: ChainVerifier(roots: ca, allowPartialChain: true))
        let apple = try #require(try JSONSerialization.jsonObject(with: Fixtures.data("fixtures/real", prefix: "r12", suffix: "mbaasy.response.json")) as? [String: Any])
        #expect(legacy.receiptJSON == apple["receipt"] as? [String: String])
    }

    @Test("Xcode's BER receipt decodes: one auto-renewable with transaction id 0")
    func xcode() throws {
        let text = try Fixtures.text("fixtures/xcode", prefix: "xcode-receipt", suffix: ".b64")
        guard case .app(let receipt, let signed) = try ReceiptDecoder.decode(try #require(ReceiptDecoder.base64Decode(text))) else {
            Issue.record("not an app receipt")
            return
        }
        #expect(receipt.receiptType == .xcode)
        #expect(receipt.inApp.map(\.transactionId) == ["0"])
        #expect(receipt.inApp.first?.productId == "pass.premium")
        #expect(signed.certificates.count == 1)
        // Untrusted unless told otherwise.
        #expect(throws: CryptoError.self) { try signed.verify(with: try Self.appleRoots(), at: receipt.creationDate ?? Date()) }
    }
}
