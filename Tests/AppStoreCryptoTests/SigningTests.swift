@testable import AppStoreCrypto
import AppStoreModels
import Foundation
import Testing

@Suite("Emulator-style chains and receipts")
struct SigningTests {
    struct Chain {
        let rootKey: PrivateKey, root: Certificate, intermediate: Certificate, leaf: Certificate, leafKey: PrivateKey
    }

    static let chain: Chain = {
        do {
            let start = Date(timeIntervalSince1970: 1_600_000_000), end = Date(timeIntervalSince1970: 1_900_000_000)
            let rootKey = try PrivateKey.generateRSA()
            let root = try CertificateBuilder(subject: [("CN", "Test Root")], serial: 1, notBefore: start, notAfter: end, isCertificateAuthority: true)
                .issue(for: rootKey, issuer: nil, issuerKey: rootKey)
            let intermediateKey = try PrivateKey.generateRSA()
            let intermediate = try CertificateBuilder(subject: [("CN", "Test WWDR")], serial: 2, notBefore: start, notAfter: end,
                                                      isCertificateAuthority: true, pathLength: 0, markerExtensions: [OID.appleWWDRIntermediate])
                .issue(for: intermediateKey, issuer: root, issuerKey: rootKey)
            let leafKey = try PrivateKey.generateRSA()
            let leaf = try CertificateBuilder(subject: [("CN", "Test Receipt Signing")], serial: 3, notBefore: start, notAfter: end,
                                              isCertificateAuthority: false, markerExtensions: [OID.appleReceiptSigner])
                .issue(for: leafKey, issuer: intermediate, issuerKey: intermediateKey)
            return Chain(rootKey: rootKey, root: root, intermediate: intermediate, leaf: leaf, leafKey: leafKey)
        } catch { fatalError("\(error)") }
    }()

    static func sampleReceipt() -> AppReceipt {
        let date = Date(timeIntervalSince1970: 1_700_000_000)
        return AppReceipt(receiptType: .productionSandbox, bundleId: "com.example.coins", applicationVersion: "1.0",
                          opaqueValue: Data(repeating: 7, count: 16), sha1Hash: Data(repeating: 9, count: 20), creationDate: date,
                          originalPurchaseDate: Date(timeIntervalSince1970: 1_375_340_400), originalApplicationVersion: "1.0",
                          inApp: [
                              InAppPurchase(quantity: 3, productId: "Nada.JPYF01", transactionId: "2000000000000001", originalTransactionId: "2000000000000001",
                                            purchaseDate: date, originalPurchaseDate: date, productTypeCode: 1),
                              InAppPurchase(productId: "monthly", transactionId: "2000000000000002", originalTransactionId: "2000000000000002",
                                            purchaseDate: date, originalPurchaseDate: date, expiresDate: date.addingTimeInterval(300),
                                            webOrderLineItemId: 2_000_000_000_000_001, isTrialPeriod: true, isInIntroOfferPeriod: false, productTypeCode: 3),
                          ], bundleIdBytes: Data(ReceiptPayload.bundleIdBytes("com.example.coins")))
    }

    @Test("The receipt payload round-trips, with Apple's layout (empty 1712, sorted SET)")
    func payloadRoundTrip() throws {
        let receipt = Self.sampleReceipt()
        let encoded = ReceiptPayload.encode(receipt)
        let decoded = try ReceiptPayload.decode(encoded)
        #expect(decoded == receipt)
        // Attributes are sorted by their DER bytes.
        let children = try ASN1Element.parse(encoded).children().map { Array($0.encoded) }
        #expect(children == children.sorted { $0.lexicographicallyPrecedes($1) })
    }

    @Test("Signed receipts verify with the chain; other roots, wrong times and tampering fail")
    func signAndVerify() throws {
        let chain = Self.chain
        let der = try SignedData.sign(payload: ReceiptPayload.encode(Self.sampleReceipt()), key: chain.leafKey, chain: [chain.leaf, chain.intermediate, chain.root])
        let signed = try SignedData(ber: der)
        let verifier = ChainVerifier(roots: [chain.root])
        try signed.verify(with: verifier, at: Date(timeIntervalSince1970: 1_700_000_000))
        #expect(throws: CryptoError.self) { try signed.verify(with: verifier, at: Date(timeIntervalSince1970: 1_950_000_000)) }
        let stranger = try CertificateBuilder(subject: [("CN", "Stranger")], serial: 9, notBefore: Date(timeIntervalSince1970: 1_600_000_000),
                                              notAfter: Date(timeIntervalSince1970: 1_900_000_000), isCertificateAuthority: true)
            .issue(for: chain.rootKey, issuer: nil, issuerKey: chain.rootKey)
        _ = stranger
        let otherKey = try PrivateKey.generateRSA()
        let otherRoot = try CertificateBuilder(subject: [("CN", "Other Root")], serial: 10, notBefore: Date(timeIntervalSince1970: 1_600_000_000),
                                               notAfter: Date(timeIntervalSince1970: 1_900_000_000), isCertificateAuthority: true)
            .issue(for: otherKey, issuer: nil, issuerKey: otherKey)
        #expect(throws: CryptoError.self) { try signed.verify(with: ChainVerifier(roots: [otherRoot]), at: Date(timeIntervalSince1970: 1_700_000_000)) }
        var tampered = der
        let index = try #require((0..<(der.count - 11)).first { Array(der[$0..<($0 + 11)]) == Array("Nada.JPYF01".utf8) })
        tampered[index] = UInt8(ascii: "M")
        #expect(throws: CryptoError.self) { try SignedData(ber: tampered).verify(with: verifier, at: Date(timeIntervalSince1970: 1_700_000_000)) }
    }

    @Test("A leaf without Apple's receipt-signer OID is refused under Apple's policy")
    func missingOID() throws {
        let chain = Self.chain
        let start = Date(timeIntervalSince1970: 1_600_000_000), end = Date(timeIntervalSince1970: 1_900_000_000)
        let plainKey = try PrivateKey.generateRSA()
        let plainLeaf = try CertificateBuilder(subject: [("CN", "Plain")], serial: 11, notBefore: start, notAfter: end, isCertificateAuthority: false)
            .issue(for: plainKey, issuer: chain.root, issuerKey: chain.rootKey)
        let der = try SignedData.sign(payload: ReceiptPayload.encode(Self.sampleReceipt()), key: plainKey, chain: [plainLeaf, chain.root])
        let error = #expect(throws: CryptoError.self) {
            try SignedData(ber: der).verify(with: ChainVerifier(roots: [chain.root]), at: Date(timeIntervalSince1970: 1_700_000_000))
        }
        #expect(error?.code == "missing_receipt_signer_oid")
    }

    @Test("iOS 6 style receipts round-trip and verify; an edited purchase-info fails")
    func legacyReceipts() throws {
        let chain = Self.chain
        let bytes = try LegacyTransactionReceipt.make(purchaseInfo: [("transaction-id", "2000000000000009"), ("product-id", "coins"), ("purchase-date-ms", "1700000000000")],
                                                      environment: .sandbox, key: chain.leafKey, certificate: chain.leaf)
        let receipt = try LegacyTransactionReceipt(bytes: bytes)
        #expect(receipt.environment == .sandbox)
        #expect(receipt.receiptJSON["transaction_id"] == "2000000000000009")
        try receipt.verify(with: ChainVerifier(roots: [chain.root]), intermediates: [chain.intermediate])
        let text = String(decoding: bytes, as: UTF8.self)
        let info = try #require(text.firstMatch(of: /"purchase-info" = "([^"]+)"/)?.1)
        var decoded = try #require(Data(base64Encoded: String(info)))
        decoded[decoded.firstIndex(of: UInt8(ascii: "9"))!] = UInt8(ascii: "8")
        let forged = text.replacingOccurrences(of: String(info), with: decoded.base64EncodedString())
        #expect(throws: CryptoError.self) { try LegacyTransactionReceipt(bytes: Array(forged.utf8)).verify(with: ChainVerifier(roots: [chain.root]), intermediates: [chain.intermediate]) }
    }
}

@Suite("Apple's chain policy on the chain OpenSSL built")
struct ChainPolicyTests {
    @Test("An intermediate without the WWDR marker is refused even when another certificate with its subject carries it")
    func markerOnTheBuiltChain() throws {
        // P-256 keys: generated in microseconds (RSA key generation would hold a cooperative thread for seconds).
        let start = Date(timeIntervalSince1970: 1_600_000_000), end = Date(timeIntervalSince1970: 1_900_000_000)
        let rootKey = try PrivateKey.generateEC(), intermediateKey = try PrivateKey.generateEC(), leafKey = try PrivateKey.generateEC()
        let root = try CertificateBuilder(subject: [("CN", "Root")], serial: 1, notBefore: start, notAfter: end, isCertificateAuthority: true)
            .issue(for: rootKey, issuer: nil, issuerKey: rootKey)
        // The real issuer lacks the marker; a decoy with the same subject (signed by nobody we trust) has it.
        let unmarked = try CertificateBuilder(subject: [("CN", "WWDR")], serial: 2, notBefore: start, notAfter: end, isCertificateAuthority: true)
            .issue(for: intermediateKey, issuer: root, issuerKey: rootKey)
        let decoyKey = try PrivateKey.generateEC()
        let decoy = try CertificateBuilder(subject: [("CN", "WWDR")], serial: 3, notBefore: start, notAfter: end, isCertificateAuthority: true,
                                           markerExtensions: [OID.appleWWDRIntermediate])
            .issue(for: decoyKey, issuer: nil, issuerKey: decoyKey)
        let leaf = try CertificateBuilder(subject: [("CN", "Signer")], serial: 4, notBefore: start, notAfter: end, isCertificateAuthority: false,
                                          markerExtensions: [OID.appleReceiptSigner])
            .issue(for: leafKey, issuer: unmarked, issuerKey: intermediateKey)
        let verifier = ChainVerifier(roots: [root])
        let error = #expect(throws: CryptoError.self) {
            try verifier.verify(leaf: leaf, intermediates: [decoy, unmarked], at: Date(timeIntervalSince1970: 1_700_000_000), policy: .appleReceiptSigning)
        }
        #expect(error?.code == "missing_intermediate_oid")
    }

    @Test("iOS 6 receipts get Apple's policy too: the iTunes Store marker, or the receipt-signing chain")
    func transactionReceiptPolicy() throws {
        let start = Date(timeIntervalSince1970: 1_600_000_000), end = Date(timeIntervalSince1970: 1_900_000_000), at = Date(timeIntervalSince1970: 1_700_000_000)
        let rootKey = try PrivateKey.generateEC(), leafKey = try PrivateKey.generateEC()
        let root = try CertificateBuilder(subject: [("CN", "iTunes Store CA")], serial: 1, notBefore: start, notAfter: end, isCertificateAuthority: true)
            .issue(for: rootKey, issuer: nil, issuerKey: rootKey)
        func leaf(_ markers: [String], serial: UInt64) throws -> Certificate {
            try CertificateBuilder(subject: [("CN", "PurchaseReceiptCertificate")], serial: serial, notBefore: start, notAfter: end,
                                   isCertificateAuthority: false, markerExtensions: markers)
                .issue(for: leafKey, issuer: root, issuerKey: rootKey)
        }
        let verifier = ChainVerifier(roots: [root])
        let marked = try leaf([OID.appleTransactionReceiptSigner], serial: 2)
        try verifier.verify(leaf: marked, intermediates: [], at: at, policy: .appleTransactionReceiptSigning)
        #expect(throws: CryptoError.self) { try verifier.verify(leaf: marked, intermediates: [], at: at, policy: .appleReceiptSigning) }
        let plain = try leaf([], serial: 3)
        try verifier.verify(leaf: plain, intermediates: [], at: at, policy: .none)
        let error = #expect(throws: CryptoError.self) { try verifier.verify(leaf: plain, intermediates: [], at: at, policy: .appleTransactionReceiptSigning) }
        #expect(error?.code == "missing_receipt_signer_oid")
        // The app-receipt chain (what the emulator signs iOS 6 receipts with) passes as well.
        let chain = SigningTests.chain
        try ChainVerifier(roots: [chain.root]).verify(leaf: chain.leaf, intermediates: [chain.intermediate], at: at, policy: .appleTransactionReceiptSigning)
    }
}
