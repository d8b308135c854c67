import AppStoreCrypto
import AppStoreModels
import Foundation
import Locking
import Synchronization

/// What the local checks learnt from a receipt before anyone calls Apple.
public struct InspectedReceipt: Sendable {
    /// The environment the receipt names (`receipt_type`, or the iOS 6 receipt's `environment`).
    public let environment: AppStoreEnvironment
    public let bundleId: String
    /// (product id, transaction id) of each purchase the receipt contains.
    public let purchases: [(productId: String, transactionId: String)]
    /// Whether this is an iOS 6 style transaction receipt.
    public let isTransactionReceipt: Bool
    /// Whether the app receipt's embedded certificates are its signer's chain and nothing else, in order (the signer,
    /// then each one's issuer, at most `ReceiptInspector.chainLengthLearnt`), as the App Store writes them. Only such a
    /// receipt's certificates are remembered for storing later uploads without them (`StoredReceipt`): the field is not
    /// signed, so a receipt that verifies may carry them reordered, or with anything else beside them.
    public var certificatesAreChain = false
}

/// A receipt refused by the local checks, with the reason shown to the app.
public struct ReceiptRejection: Error, Sendable, Equatable {
    public let code: String
    public let reason: String
}

/// The local checks of seed 003's server mode, done before calling Apple: Base64 and PKCS#7
/// structure, the signature chain to the configured roots at the receipt's own date, the bundle id
/// allow-list. Signers already verified are remembered with their key and validity window.
public final class ReceiptInspector: Sendable {
    let trust: TrustStore
    private let trustedSigners = Locked<[SignerKey: TrustedSigner]>([:])

    /// Identifies a receipt signer: the certificates the receipt embeds and which of them signed.
    private struct SignerKey: Hashable {
        let certificates: [[UInt8]]
        let issuer: [UInt8]
        let serial: [UInt8]

        // Hashes the signer id and the certificates' sizes in bulk (hashing kilobytes of DER byte by byte
        // showed in profiles); equality still compares every byte, by memcmp (`==` on the arrays went a byte at a time).
        func hash(into hasher: inout Hasher) {
            serial.withUnsafeBytes { hasher.combine(bytes: $0) }
            issuer.withUnsafeBytes { hasher.combine(bytes: $0) }
            for certificate in certificates { hasher.combine(certificate.count) }
        }

        static func == (left: SignerKey, right: SignerKey) -> Bool {
            left.serial.hasSameBytes(as: right.serial) && left.issuer.hasSameBytes(as: right.issuer)
                && left.certificates.count == right.certificates.count
                && zip(left.certificates, right.certificates).allSatisfy { $0.hasSameBytes(as: $1) }
        }
    }

    /// A signer whose chain verified, with the window in which every certificate of it is valid.
    private struct TrustedSigner {
        let key: PublicKey
        let notBefore: Date
        let notAfter: Date
        /// Whether the embedded certificates are the chain and nothing else, in order (`InspectedReceipt.certificatesAreChain`).
        let certificatesAreChain: Bool
    }

    /// The longest chain of embedded certificates remembered (`InspectedReceipt.certificatesAreChain`): the App Store's
    /// receipts carry three (the signer, Apple's intermediate, Apple's root).
    static let chainLengthLearnt = 4

    public init(trust: TrustStore) { self.trust = trust }

    /// Decodes and authenticates `receiptData` for an app accepting `bundleIds`.
    public func inspect(_ receiptData: String, bundleIds: [String]) throws(ReceiptRejection) -> InspectedReceipt {
        guard let bytes = ReceiptDecoder.base64Decode(receiptData) else {
            throw ReceiptRejection(code: "malformed_receipt", reason: "receipt-data is not Base64")
        }
        let decoded: DecodedReceipt
        do { decoded = try ReceiptDecoder.decode(bytes) } catch {
            throw ReceiptRejection(code: "malformed_receipt", reason: "receipt-data is not an App Store receipt")
        }
        let inspected: InspectedReceipt
        switch decoded {
        case .app(let receipt, let signed):
            guard let environment = receipt.receiptType.environment else {
                throw ReceiptRejection(code: "untrusted_environment", reason: "receipt type '\(receipt.receiptType.rawValue)' is not from the App Store")
            }
            let chained = try checkChain(signed, at: receipt.creationDate ?? Date())
            var app = InspectedReceipt(environment: environment, bundleId: receipt.bundleId,
                                       purchases: receipt.inApp.map { ($0.productId, $0.transactionId) }, isTransactionReceipt: false)
            app.certificatesAreChain = chained
            inspected = app
        case .transaction(let legacy):
            do {
                try legacy.verify(with: trust.verifier, intermediates: trust.intermediates)
            } catch {
                throw ReceiptRejection(code: "invalid_signature", reason: "the transaction receipt's signature does not chain to a trusted root")
            }
            let info = legacy.purchaseInfo
            guard let productId = info["product-id"], let transactionId = info["transaction-id"] else {
                throw ReceiptRejection(code: "malformed_receipt", reason: "the transaction receipt names no product or transaction")
            }
            inspected = InspectedReceipt(environment: legacy.environment, bundleId: info["bid"] ?? "",
                                         purchases: [(productId, transactionId)], isTransactionReceipt: true)
        }
        guard bundleIds.contains(inspected.bundleId) else {
            throw ReceiptRejection(code: "bundle_id_not_allowed", reason: "receipt is for bundle id '\(inspected.bundleId)', which this app does not accept")
        }
        for purchase in inspected.purchases where !purchase.transactionId.isASCIIDigits {
            throw ReceiptRejection(code: "invalid_transaction_id", reason: "transaction id '\(purchase.transactionId)' is not an App Store id")
        }
        return inspected
    }

    /// Checks the signature and the chain; returns whether the embedded certificates are the chain and nothing else.
    private func checkChain(_ signed: SignedData, at date: Date) throws(ReceiptRejection) -> Bool {
        // A signer seen before (same embedded certificates, same signer id) already chained to a trusted
        // root: only its validity window and the signature remain to check, with its key already parsed.
        let cacheKey = SignerKey(certificates: signed.certificates, issuer: signed.signerIssuer, serial: signed.signerSerial)
        if let known = trustedSigners.withLock({ $0[cacheKey] }), date >= known.notBefore, date <= known.notAfter {
            do { try signed.verifySignature(with: known.key) } catch {
                throw ReceiptRejection(code: "invalid_signature", reason: "the receipt signature is invalid")
            }
            return known.certificatesAreChain
        }
        let signer: Certificate
        do {
            signer = try signed.signerCertificate()
            try signed.verifySignature(with: signer)
        } catch {
            throw ReceiptRejection(code: "invalid_signature", reason: "the receipt signature is invalid")
        }
        let others = signed.certificates.filter { !$0.hasSameBytes(as: signer.der) }.compactMap { try? Certificate(der: $0) }
        do {
            try trust.verifier.verify(leaf: signer, intermediates: others + trust.intermediates, at: date, policy: .appleReceiptSigning)
        } catch {
            throw ReceiptRejection(code: "untrusted_certificate", reason: "the receipt's certificate chain is not trusted: \(error)")
        }
        let fields = ([signer] + others).compactMap { try? $0.fields }
        let chained = Self.isChain(signed.certificates, signer: signer, roots: trust.roots, at: date)
        if let key = signer.publicKey, let notBefore = fields.map(\.notBefore).max(), let notAfter = fields.map(\.notAfter).min() {
            trustedSigners.withLock { cache in
                if cache.count > 64 { cache.removeAll() }
                cache[cacheKey] = TrustedSigner(key: key, notBefore: notBefore, notAfter: notAfter, certificatesAreChain: chained)
            }
        }
        return chained
    }

    /// Whether `certificates` are the signer's chain and nothing else, in order: the signer, then each one's issuer (at
    /// most `chainLengthLearnt`, none repeated), the last one of `roots` byte for byte, and the chain verifying with
    /// those certificates alone at `date`. The field is not signed: a receipt verifies with its root altered or left
    /// out, its certificates reordered, or others beside them, and none of those is learnt.
    static func isChain(_ certificates: [[UInt8]], signer: Certificate, roots: [Certificate], at date: Date) -> Bool {
        guard (2...chainLengthLearnt).contains(certificates.count), certificates[0].hasSameBytes(as: signer.der),
              let last = certificates.last, let root = roots.first(where: { $0.der.hasSameBytes(as: last) }) else { return false }
        let read = certificates.compactMap { try? Certificate(der: $0) }
        let fields = read.compactMap { try? $0.fields }
        guard fields.count == certificates.count else { return false }
        for index in 1..<certificates.count {
            guard fields[index].subject.hasSameBytes(as: fields[index - 1].issuer),
                  !certificates[..<index].contains(where: { $0.hasSameBytes(as: certificates[index]) }) else { return false }
        }
        do {
            try ChainVerifier(roots: [root]).verify(leaf: signer, intermediates: Array(read.dropFirst().dropLast()), at: date,
                                                    policy: .appleReceiptSigning)
        } catch {
            return false
        }
        return true
    }
}
