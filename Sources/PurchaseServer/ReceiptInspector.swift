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
    }

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
            try checkChain(signed, at: receipt.creationDate ?? Date())
            inspected = InspectedReceipt(environment: environment, bundleId: receipt.bundleId,
                                         purchases: receipt.inApp.map { ($0.productId, $0.transactionId) }, isTransactionReceipt: false)
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

    private func checkChain(_ signed: SignedData, at date: Date) throws(ReceiptRejection) {
        // A signer seen before (same embedded certificates, same signer id) already chained to a trusted
        // root: only its validity window and the signature remain to check, with its key already parsed.
        let cacheKey = SignerKey(certificates: signed.certificates, issuer: signed.signerIssuer, serial: signed.signerSerial)
        if let known = trustedSigners.withLock({ $0[cacheKey] }), date >= known.notBefore, date <= known.notAfter {
            do { try signed.verifySignature(with: known.key) } catch {
                throw ReceiptRejection(code: "invalid_signature", reason: "the receipt signature is invalid")
            }
            return
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
        if let key = signer.publicKey, let notBefore = fields.map(\.notBefore).max(), let notAfter = fields.map(\.notAfter).min() {
            trustedSigners.withLock { cache in
                if cache.count > 64 { cache.removeAll() }
                cache[cacheKey] = TrustedSigner(key: key, notBefore: notBefore, notAfter: notAfter)
            }
        }
    }
}
