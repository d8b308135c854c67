import AppStoreCrypto
import AppStoreEmulator
import AppStoreModels
import Foundation
@testable import PurchaseServer
import StorekeeperTesting
import Synchronization
import Testing

/// A notification's nested JWS signed under its envelope's own header is covered by the envelope's signature:
/// every other check still applies, and any other header gets the full check.
@Suite("Carried JWS")
struct CarriedJWSTests {
    static let trust = TrustStore(certificates: [TestSupport.jwsAuthority.root, TestSupport.jwsAuthority.intermediate])
    static let signedDate = Int64(TestSupport.referenceDate.timeIntervalSince1970 * 1000)

    /// A sandbox consumable's payload for `bundle`, signed at `signedDate`.
    static func transaction(bundle: String = "com.example.coins", signedDate: Int64 = signedDate) -> [String: Any] {
        ["transactionId": "2000000000000001", "originalTransactionId": "2000000000000001", "bundleId": bundle,
         "productId": "coins.100", "purchaseDate": signedDate, "signedDate": signedDate, "type": "Consumable",
         "environment": "Sandbox", "quantity": 1, "inAppOwnershipType": "PURCHASED"]
    }

    static func sign(_ payload: [String: Any], by authority: CertificateAuthority = TestSupport.jwsAuthority) throws -> String {
        try JWS.sign(payload: Array(try JSONSerialization.data(withJSONObject: payload, options: [.sortedKeys])),
                     key: authority.leafKey, chain: authority.chain)
    }

    /// `compact` with the last bit of its signature flipped: its own signature no longer verifies.
    static func brokenSignature(_ compact: String) -> String {
        var parts = compact.split(separator: ".").map(String.init)
        var signature = Base64URL.decode(parts[2]) ?? []
        signature[signature.count - 1] ^= 1
        parts[2] = Base64URL.encode(signature)
        return parts.joined(separator: ".")
    }

    /// A notification envelope signed by the test chain carrying `data`, verified.
    static func envelope(_ data: [String: Any], inspector: SignedTransactionInspector) throws -> VerifiedEnvelope {
        let signed = try sign(["notificationType": "ONE_TIME_CHARGE", "notificationUUID": UUID().uuidString, "version": "2.0",
                               "signedDate": signedDate, "data": data])
        return try inspector.verify(try Envelope(compact: signed), at: ReceiptDate.date(milliseconds: signedDate), subject: "the notification's")
    }

    @Test("A chain is remembered by its leaf and intermediate: another third x5c entry is judged from memory, one that is not a certificate is refused either way")
    func chainRememberedByTheEntriesItVerifies() throws {
        let authority = TestSupport.jwsAuthority
        let payload = Array(try JSONSerialization.data(withJSONObject: Self.transaction(), options: [.sortedKeys]))
        /// The transaction signed by the test leaf with `third` as x5c's last entry.
        func signed(third: String) throws -> JWS {
            let x5c = [authority.chain[0], authority.chain[1]].map { Data($0.der).base64EncodedString() } + [third]
            let header = Array(try JSONSerialization.data(withJSONObject: ["alg": "ES256", "x5c": x5c], options: [.sortedKeys]))
            let input = Base64URL.encode(header) + "." + Base64URL.encode(payload)
            return try JWS(compact: input + "." + Base64URL.encode(try authority.leafKey.signES256(Array(input.utf8))))
        }
        let date = ReceiptDate.date(milliseconds: Self.signedDate)
        let stranger = try CertificateAuthority.generate(algorithm: .ecP256)
        let genuine = try signed(third: Data(authority.chain[2].der).base64EncodedString())
        let otherCertificate = try signed(third: Data(stranger.chain[2].der).base64EncodedString())
        let notACertificate = try signed(third: "AAAA")

        let inspector = SignedTransactionInspector(trust: Self.trust)
        try inspector.verify(genuine, at: date, subject: "the transaction's")
        #expect(inspector.chainVerifications.load(ordering: .relaxed) == 1)
        // The third entry is not trusted, so a sender varying it gets one signature check, not a chain verification each.
        for _ in 0..<3 { try inspector.verify(otherCertificate, at: date, subject: "the transaction's") }
        #expect(inspector.chainVerifications.load(ordering: .relaxed) == 1)
        // Not a certificate: refused from memory as the full check refuses it on an inspector that never saw the chain.
        let remembered = #expect(throws: ReceiptRejection.self) { try inspector.verify(notACertificate, at: date, subject: "the transaction's") }
        #expect(remembered?.code == "untrusted_certificate")
        let fresh = SignedTransactionInspector(trust: Self.trust)
        let full = #expect(throws: ReceiptRejection.self) { try fresh.verify(notACertificate, at: date, subject: "the transaction's") }
        #expect(full?.code == "untrusted_certificate")
        #expect(fresh.chainVerifications.load(ordering: .relaxed) == 1)
        // Another certificate there verifies in full too: the verdict never depended on it.
        try fresh.verify(otherCertificate, at: date, subject: "the transaction's")
    }

    @Test("A transaction under the envelope's header is covered by its signature: its own is not checked, the rest is")
    func coveredTransaction() throws {
        let inspector = SignedTransactionInspector(trust: Self.trust)
        let broken = Self.brokenSignature(try Self.sign(Self.transaction()))
        let carried = try #require(try Self.envelope(["signedTransactionInfo": broken], inspector: inspector).carried("data", "signedTransactionInfo"))
        #expect(carried.compact == broken)
        let (transaction, environment) = try inspector.inspect(carried, bundleIds: ["com.example.coins"])
        #expect(transaction.transactionId == "2000000000000001" && environment == .sandbox)
        // Alone, on an inspector that never saw the envelope, those bytes are refused: nothing vouches for them.
        #expect(throws: ReceiptRejection(code: "invalid_signature", reason: "the transaction's signature is invalid")) {
            try SignedTransactionInspector(trust: Self.trust).inspect(broken, bundleIds: ["com.example.coins"])
        }
        // The inspector that saw them carried remembers them: the settlement reads the same bytes again without the envelope.
        #expect(try inspector.inspect(broken, bundleIds: ["com.example.coins"]).0 == transaction)
        // Covered, the transaction is still judged: another bundle is refused.
        let otherBundle = Self.brokenSignature(try Self.sign(Self.transaction(bundle: "com.example.comics")))
        let carriedOther = try #require(try Self.envelope(["signedTransactionInfo": otherBundle], inspector: inspector)
            .carried("data", "signedTransactionInfo"))
        let refused = #expect(throws: ReceiptRejection.self) { try inspector.inspect(carriedOther, bundleIds: ["com.example.coins"]) }
        #expect(refused?.code == "bundle_id_not_allowed")
    }

    @Test("A carried transaction under another header, or dated outside the envelope's chain, gets the full check")
    func uncoveredTransaction() throws {
        let inspector = SignedTransactionInspector(trust: Self.trust)
        // Signed by a stranger: another x5c, so another header. Its signature is its own and valid; its chain is not trusted.
        let stranger = try CertificateAuthority.generate(algorithm: .ecP256)
        let foreign = try Self.sign(Self.transaction(), by: stranger)
        let carriedForeign = try #require(try Self.envelope(["signedTransactionInfo": foreign], inspector: inspector)
            .carried("data", "signedTransactionInfo"))
        let foreignRefused = #expect(throws: ReceiptRejection.self) { try inspector.inspect(carriedForeign, bundleIds: ["com.example.coins"]) }
        #expect(foreignRefused?.code == "untrusted_certificate")
        // The envelope's header, but dated 1990: outside its chain's validity, so checked in full, and refused.
        let old = Self.brokenSignature(try Self.sign(Self.transaction(signedDate: 631_152_000_000)))
        let carriedOld = try #require(try Self.envelope(["signedTransactionInfo": old], inspector: inspector).carried("data", "signedTransactionInfo"))
        let oldRefused = #expect(throws: ReceiptRejection.self) { try inspector.inspect(carriedOld, bundleIds: ["com.example.coins"]) }
        #expect(oldRefused?.code == "untrusted_certificate")
        // Nothing at that key: nothing carried.
        #expect(try Self.envelope(["bundleId": "com.example.coins"], inspector: inspector).carried("data", "signedTransactionInfo") == nil)
    }

    @Test("Renewal info under the envelope's header is covered; under another header it is checked in full")
    func renewalInfo() throws {
        let inspector = SignedTransactionInspector(trust: Self.trust)
        let info: [String: Any] = ["originalTransactionId": "2000000000000001", "autoRenewStatus": 1, "signedDate": Self.signedDate]
        let date: (JSONValue) -> Date = { ReceiptDate.date(milliseconds: $0["signedDate"]?.int64 ?? 0) }
        let broken = Self.brokenSignature(try Self.sign(info))
        let covered = try #require(try Self.envelope(["signedRenewalInfo": broken], inspector: inspector).carried("data", "signedRenewalInfo"))
        #expect(try inspector.verify(covered, subject: "the renewal info's", at: date)["autoRenewStatus"]?.int64 == 1)
        let stranger = try CertificateAuthority.generate(algorithm: .ecP256)
        let foreign = try #require(try Self.envelope(["signedRenewalInfo": try Self.sign(info, by: stranger)], inspector: inspector)
            .carried("data", "signedRenewalInfo"))
        let foreignRefused = #expect(throws: ReceiptRejection.self) { try inspector.verify(foreign, subject: "the renewal info's", at: date) }
        #expect(foreignRefused?.code == "untrusted_certificate")
        let garbage = try #require(try Self.envelope(["signedRenewalInfo": "not.a.jws"], inspector: inspector).carried("data", "signedRenewalInfo"))
        let garbageRefused = #expect(throws: ReceiptRejection.self) { try inspector.verify(garbage, subject: "the renewal info's", at: date) }
        #expect(garbageRefused?.code == "malformed_jws")
    }

    @Test("An envelope whose own signature fails vouches for nothing: it is refused before anything it carries is read")
    func brokenEnvelope() throws {
        let inspector = SignedTransactionInspector(trust: Self.trust)
        let signed = Self.brokenSignature(try Self.sign(["notificationType": "ONE_TIME_CHARGE", "notificationUUID": UUID().uuidString,
                                                         "signedDate": Self.signedDate,
                                                         "data": ["signedTransactionInfo": try Self.sign(Self.transaction())]]))
        #expect(throws: ReceiptRejection.self) {
            try inspector.verify(try Envelope(compact: signed), at: ReceiptDate.date(milliseconds: Self.signedDate), subject: "the notification's")
        }
    }

    @Test("Apple signs a real notification's transaction and renewal info under the notification's own header")
    func realAppleNotification() throws {
        let inspector = SignedTransactionInspector(trust: try TrustStore.apple())
        let envelope = try Envelope(compact: try RealAppleJWSTests.jws("j04"))
        let signedDate = try #require(envelope.payload["signedDate"]?.int64)
        let verified = try inspector.verify(envelope, at: ReceiptDate.date(milliseconds: signedDate), subject: "the notification's")
        let transaction = try #require(verified.carried("data", "signedTransactionInfo"))
        let renewal = try #require(verified.carried("data", "signedRenewalInfo"))
        for carried in [transaction, renewal] {
            let jws = try JWS(compact: carried.compact)
            let date = ReceiptDate.date(milliseconds: try #require(jws.payloadJSON()["signedDate"]?.int64))
            #expect(verified.signer?.covers(header: jws.signingInput.prefix { $0 != UInt8(ascii: ".") }, at: date) == true)
            // Nothing is lost by not checking them: their own signatures verify in full, on an inspector that remembers nothing.
            try SignedTransactionInspector(trust: try TrustStore.apple(), remembersVerified: false).verify(jws, at: date, subject: "the nested")
        }
        #expect(try inspector.inspect(transaction, bundleIds: ["com.psychinsight.psychinsights"]).0.transactionReason == "RENEWAL")
    }
}
