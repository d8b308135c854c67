import AppStoreCrypto
import AppStoreModels
import Foundation
import Locking
import Synchronization

/// The local checks of a StoreKit 2 signed transaction — all of them, since no call to Apple is
/// needed: alg ES256, the x5c chain to the configured roots at `signedDate` with Apple's marker OIDs,
/// the signature, a known environment, the bundle id allow-list and App Store ids.
public final class SignedTransactionInspector: Sendable {
    let trust: TrustStore
    /// Chains already verified (x5c as sent → the leaf's key and the window in which the chain is valid):
    /// afterwards only the leaf's signature is checked, with the key already parsed.
    private let verifiedChains = Locked<[[String]: (key: PublicKey, notBefore: Date, notAfter: Date)]>([:])
    /// Header segments (Base64url, as sent) whose chain verified: the fast path skips decoding them.
    private let verifiedHeaders = Locked<[String: (key: PublicKey, notBefore: Date, notAfter: Date)]>([:])
    /// SHA-256 of whole signed transactions whose signature verified lately (cleared when full). A notification's
    /// transaction is checked again moments later by its settlement: a hash instead of a signature. The verdict
    /// depends only on the bytes (the date checked is the transaction's own signedDate) and the trust store.
    private let recentlyVerified = Locked<Set<[UInt8]>>([])
    private let remembersVerified: Bool
    static let recentlyVerifiedLimit = 4096

    /// `remembersVerified` false checks every signature again (benchmarks comparing verifiers).
    public init(trust: TrustStore, remembersVerified: Bool = true) {
        self.trust = trust
        self.remembersVerified = remembersVerified
    }

    /// Verifies and decodes `compact` for an app accepting `bundleIds`.
    public func inspect(_ compact: String, bundleIds: [String]) throws(ReceiptRejection) -> (JWSTransaction, AppStoreEnvironment) {
        // Split and decode on UTF-8 bytes: a JWS is kilobytes of ASCII, and Character-wise String work costs more than the crypto.
        let bytes = Array(compact.utf8)
        let dots = bytes.indices.filter { bytes[$0] == UInt8(ascii: ".") }
        guard dots.count == 2,
              let payload = bytes.withUnsafeBufferPointer({ Base64URL.decode(UnsafeBufferPointer(rebasing: $0[(dots[0] + 1)..<dots[1]])) }),
              let json = try? JSONValue.parse(payload), let transaction = JWSTransaction(json: json) else {
            throw ReceiptRejection(code: "malformed_transaction", reason: "signedTransaction is not a StoreKit 2 signed transaction")
        }
        let environment: AppStoreEnvironment
        switch transaction.environment {
        case "Production": environment = .production
        case "Sandbox": environment = .sandbox
        default:
            throw ReceiptRejection(code: "untrusted_environment",
                                   reason: "environment '\(transaction.environment)' is signed by Xcode or StoreKit Testing, not the App Store")
        }
        let date = ReceiptDate.date(milliseconds: transaction.signedDate)
        // Remembered only with a whole digest: one that failed (empty) is never looked up or stored.
        let digest = remembersVerified ? Digest.sha256.hash(bytes) : []
        if digest.count == 32 {
            if !recentlyVerified.withLock({ $0.contains(digest) }) {
                try checkSignature(compact, bytes: bytes, dots: (dots[0], dots[1]), at: date)
                recentlyVerified.withLock { verified in
                    if verified.count >= Self.recentlyVerifiedLimit { verified.removeAll(keepingCapacity: true) }
                    verified.insert(digest)
                }
            }
        } else {
            try checkSignature(compact, bytes: bytes, dots: (dots[0], dots[1]), at: date)
        }
        guard bundleIds.contains(transaction.bundleId) else {
            throw ReceiptRejection(code: "bundle_id_not_allowed", reason: "transaction is for bundle id '\(transaction.bundleId)', which this app does not accept")
        }
        for id in [transaction.transactionId, transaction.originalTransactionId] where !id.isASCIIDigits {
            throw ReceiptRejection(code: "invalid_transaction_id", reason: "transaction id '\(id)' is not an App Store id")
        }
        return (transaction, environment)
    }

    /// The signature check. A header already verified (same bytes: alg and x5c are signed content) needs
    /// only the leaf's ES256 signature, with the key parsed back then; other headers get the full check.
    private func checkSignature(_ compact: String, bytes: [UInt8], dots: (Int, Int), at date: Date) throws(ReceiptRejection) {
        let header = String(decoding: bytes[..<dots.0], as: UTF8.self)
        if let known = verifiedHeaders.withLock({ $0[header] }), date >= known.notBefore, date <= known.notAfter {
            let signature = bytes.withUnsafeBufferPointer { Base64URL.decode(UnsafeBufferPointer(rebasing: $0[(dots.1 + 1)...])) }
            guard let signature, known.key.isValidES256(signature, for: Array(bytes[..<dots.1])) else {
                throw ReceiptRejection(code: "invalid_signature", reason: "the transaction's signature is invalid")
            }
            return
        }
        let jws: JWS
        do { jws = try JWS(compact: compact) } catch {
            throw ReceiptRejection(code: "malformed_transaction", reason: "signedTransaction is not a StoreKit 2 signed transaction")
        }
        try checkSignature(jws, at: date)
        if let leaf = try? jws.certificates().first, let key = leaf.publicKey, let window = verifiedChains.withLock({ chains in
            chains[(jws.header["x5c"]?.array ?? []).compactMap(\.text)].map { ($0.notBefore, $0.notAfter) }
        }) {
            verifiedHeaders.withLock { cache in
                if cache.count > 64 { cache.removeAll() }
                cache[header] = (key, window.0, window.1)
            }
        }
    }

    /// Verifies any Apple JWS (a notification, renewal info) with this inspector's chain cache.
    public func verify(_ jws: JWS, at date: Date, subject: String) throws(ReceiptRejection) {
        try Self.check(jws, at: date, trust: trust, cache: verifiedChains, subject: subject)
    }

    private func checkSignature(_ jws: JWS, at date: Date) throws(ReceiptRejection) {
        try Self.check(jws, at: date, trust: trust, cache: verifiedChains, subject: "the transaction's")
    }

    /// Verifies `jws` (ES256, x5c chain to the trust store's roots at `date`, Apple's OIDs, signature), remembering chains.
    static func check(_ jws: JWS, at date: Date, trust: TrustStore, cache: borrowing Locked<[[String]: (key: PublicKey, notBefore: Date, notAfter: Date)]>,
                      subject: String) throws(ReceiptRejection) {
        let x5c = (jws.header["x5c"]?.array ?? []).compactMap(\.text)
        if let known = cache.withLock({ $0[x5c] }), date >= known.notBefore, date <= known.notAfter {
            guard jws.header["alg"]?.text == "ES256", known.key.isValidES256(jws.signature, for: jws.signingInput) else {
                throw ReceiptRejection(code: "invalid_signature", reason: "\(subject) signature is invalid")
            }
            return
        }
        let chain: [Certificate]
        do {
            chain = try jws.verifyChain(with: trust.verifier, at: date)
        } catch {
            throw ReceiptRejection(code: "untrusted_certificate", reason: "\(subject) certificate chain is not trusted: \(error)")
        }
        // The chain is remembered before the signature is judged: a flood of bad signatures under a real
        // chain costs one ES256 check each, not a chain verification each.
        let fields = chain.prefix(2).compactMap { try? $0.fields }
        guard let key = chain[0].publicKey else { throw ReceiptRejection(code: "untrusted_certificate", reason: "\(subject) leaf has no key") }
        if let notBefore = fields.map(\.notBefore).max(), let notAfter = fields.map(\.notAfter).min() {
            cache.withLock { cache in
                if cache.count > 64 { cache.removeAll() }
                cache[x5c] = (key, notBefore, notAfter)
            }
        }
        guard key.isValidES256(jws.signature, for: jws.signingInput) else {
            throw ReceiptRejection(code: "invalid_signature", reason: "\(subject) signature is invalid")
        }
    }
}

extension ConfirmedTransaction {
    /// 4990 → "4.99", 120000 → "120", 5 → "0.005": exact, as the ledger keeps prices.
    static func decimalText(milliunits: Int64) -> String {
        let whole = milliunits / 1000, fraction = milliunits % 1000
        guard fraction != 0 else { return String(whole) }
        var digits = String(fraction)
        digits = String(repeating: "0", count: 3 - digits.count) + digits
        while digits.hasSuffix("0") { digits.removeLast() }
        return "\(whole).\(digits)"
    }

    /// From a verified StoreKit 2 transaction.
    init(_ jws: JWSTransaction, source: String) {
        transactionId = jws.transactionId
        originalTransactionId = jws.originalTransactionId
        productId = jws.productId
        quantity = Int64(jws.quantity)
        purchaseDate = ReceiptDate.date(milliseconds: jws.purchaseDate)
        originalPurchaseDate = ReceiptDate.date(milliseconds: jws.originalPurchaseDate)
        expiresDate = jws.expiresDate.map(ReceiptDate.date(milliseconds:))
        webOrderLineItemId = jws.webOrderLineItemId
        cancellationDate = jws.revocationDate.map(ReceiptDate.date(milliseconds:))
        cancellationReason = jws.revocationReason.map(String.init)
        if let price = jws.price, (0...1_000_000_000_000).contains(price), let currency = jws.currency,
           currency.utf8.count == 3, currency.utf8.allSatisfy({ (65...90).contains($0) }) {
            charged = ChargedPrice(amount: Self.decimalText(milliunits: price), currency: currency)
        }
        if jws.revocationDate != nil, jws.revocationType == "REFUND_PRORATED", let share = jws.revocationPercentage, (1..<100_000).contains(share) {
            refundPercentage = share
        }
        isTrial = jws.offerType == 1
        self.source = source
        observedAt = ReceiptDate.date(milliseconds: jws.signedDate)
    }
}
