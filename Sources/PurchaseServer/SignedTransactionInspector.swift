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
    /// Chains already verified (the leaf and intermediate of x5c as sent → the leaf's key, the window in which the chain
    /// is valid, and the third entry seen): afterwards only the leaf's signature is checked, with the key already parsed.
    private let verifiedChains = Locked<[[String]: KnownChain]>([:])
    /// Chains checked in full (not from `verifiedChains`) so far, refused ones included.
    let chainVerifications = Atomic<Int>(0)
    /// Header segments (Base64url, as sent) whose chain verified: the fast path skips decoding them.
    private let verifiedHeaders = Locked<[String: (key: PublicKey, notBefore: Date, notAfter: Date)]>([:])
    /// SHA-256 of whole signed transactions lately found signed by a trusted key (cleared when full): their own signature
    /// verified, or a verified notification carried them under its own header (its signature covers them). A
    /// notification's transaction is inspected again moments later by its settlement: a hash instead of a signature.
    /// The verdict depends only on the bytes (the date checked is the transaction's own signedDate) and the trust store;
    /// once forgotten, the bytes get the full check again.
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
        let (transaction, environment, _) = try inspect(compact, bundleIds: bundleIds, carriedBy: nil)
        return (transaction, environment)
    }

    /// The same for a transaction a verified envelope carried (a notification's `signedTransactionInfo`): every check
    /// but its signature's when it is signed under the envelope's own header, whose signature covers its bytes.
    public func inspect(_ carried: CarriedJWS, bundleIds: [String]) throws(ReceiptRejection) -> (JWSTransaction, AppStoreEnvironment) {
        let (transaction, environment, _) = try inspect(carried.compact, bundleIds: bundleIds, carriedBy: carried.signer)
        return (transaction, environment)
    }

    /// `inspect(_:bundleIds:)`, with the SHA-256 of the carried JWS's text (its UTF-8 bytes), which the check takes
    /// anyway: a notification's job keeps it as its receipt's digest.
    public func inspectDigesting(_ carried: CarriedJWS, bundleIds: [String]) throws(ReceiptRejection)
        -> (transaction: JWSTransaction, environment: AppStoreEnvironment, sha256: [UInt8]) {
        try inspect(carried.compact, bundleIds: bundleIds, carriedBy: carried.signer, digesting: true)
    }

    private func inspect(_ compact: String, bundleIds: [String], carriedBy signer: VerifiedSigner?, digesting: Bool = false)
        throws(ReceiptRejection) -> (JWSTransaction, AppStoreEnvironment, [UInt8]) {
        // Split and decode on UTF-8 bytes: a JWS is kilobytes of ASCII, and Character-wise String work costs more than the crypto.
        let bytes = Array(compact.utf8)
        guard let dots = bytes.withUnsafeBufferPointer({ JWS.dots(in: $0) }),
              let payload = bytes.withUnsafeBufferPointer({ Base64URL.decode(UnsafeBufferPointer(rebasing: $0[(dots.first + 1)..<dots.second])) }),
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
        let digest = remembersVerified || digesting ? Digest.sha256.hash(bytes) : []
        if !remembersVerified || digest.count != 32 || !recentlyVerified.withLock({ $0.contains(digest) }) {
            if signer?.covers(header: bytes[..<dots.first], at: date) != true {
                try checkSignature(compact, bytes: bytes, dots: (dots.first, dots.second), at: date)
            }
            // Its settlement inspects the same bytes moments later: a hash then, not a signature.
            if remembersVerified, digest.count == 32 {
                recentlyVerified.withLock { verified in
                    if verified.count >= Self.recentlyVerifiedLimit { verified.removeAll(keepingCapacity: true) }
                    verified.insert(digest)
                }
            }
        }
        guard bundleIds.contains(transaction.bundleId) else {
            throw ReceiptRejection(code: "bundle_id_not_allowed", reason: "transaction is for bundle id '\(transaction.bundleId)', which this app does not accept")
        }
        for id in [transaction.transactionId, transaction.originalTransactionId] where !id.isASCIIDigits {
            throw ReceiptRejection(code: "invalid_transaction_id", reason: "transaction id '\(id)' is not an App Store id")
        }
        return (transaction, environment, digest)
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
        if let leaf = try? jws.certificates().first, let key = leaf.publicKey, let chainKey = Self.chainKey(jws),
           let window = verifiedChains.withLock({ chains in chains[chainKey.verified].map { ($0.notBefore, $0.notAfter) } }) {
            verifiedHeaders.withLock { cache in
                if cache.count > 64 { cache.removeAll() }
                cache[header] = (key, window.0, window.1)
            }
        }
    }

    /// Verifies any Apple JWS (a notification, renewal info) with this inspector's chain cache.
    public func verify(_ jws: JWS, at date: Date, subject: String) throws(ReceiptRejection) {
        try Self.check(jws, at: date, trust: trust, cache: verifiedChains, counted: chainVerifications, subject: subject)
    }

    /// Verifies a notification's envelope as `verify` does. What it returns vouches for the JWS its payload carries.
    public func verify(_ envelope: Envelope, at date: Date, subject: String) throws(ReceiptRejection) -> VerifiedEnvelope {
        let window = try Self.check(envelope.jws, at: date, trust: trust, cache: verifiedChains, counted: chainVerifications, subject: subject)
        let header = envelope.jws.encodedHeader
        return VerifiedEnvelope(payload: envelope.payload, payloadBytes: envelope.jws.payload,
                                signer: window.map { VerifiedSigner(header: header, notBefore: $0.notBefore, notAfter: $0.notAfter) })
    }

    /// Verifies renewal info (or any JWS but a transaction) that a verified envelope carried, as `inspect(_:bundleIds:)`
    /// does a transaction: its own signature is not checked when its envelope's covers it. The date checked is
    /// `date(payload)`. Returns the payload.
    public func verify(_ carried: CarriedJWS, subject: String, at date: (JSONValue) -> Date) throws(ReceiptRejection) -> JSONValue {
        let jws: JWS, payload: JSONValue
        do {
            jws = try JWS(compact: carried.compact)
            payload = try jws.payloadJSON()
        } catch {
            throw ReceiptRejection(code: "malformed_jws", reason: "\(subject) JWS is malformed: \(error)")
        }
        let when = date(payload)
        let header = jws.encodedHeader
        if carried.signer?.covers(header: header, at: when) != true {
            try Self.check(jws, at: when, trust: trust, cache: verifiedChains, counted: chainVerifications, subject: subject)
        }
        return payload
    }

    private func checkSignature(_ jws: JWS, at date: Date) throws(ReceiptRejection) {
        try Self.check(jws, at: date, trust: trust, cache: verifiedChains, counted: chainVerifications, subject: "the transaction's")
    }

    /// A chain that verified: its leaf's key, the window in which the chain is valid, and the third `x5c` entry it came with.
    struct KnownChain {
        let key: PublicKey
        let notBefore: Date
        let notAfter: Date
        let third: String
    }

    /// How a verified chain is remembered: by its leaf and intermediate as sent, the two entries the check verifies (the
    /// third is not trusted: the roots are the trust store's). Keyed by all three, a sender varying the third entry under
    /// Apple's real leaf and intermediate made every check a full chain verification, and filled the cache until it was
    /// emptied of the genuine chain too. The entries' text is a key because a certificate has one spelling that verifies
    /// (`JWS.certificate(x5c:)`). Nil unless `x5c` holds exactly three strings, as the full check requires.
    static func chainKey(_ jws: JWS) -> (verified: [String], third: String)? {
        guard let list = jws.header["x5c"]?.array, list.count == JWS.chainLength else { return nil }
        let entries = list.compactMap(\.text)
        return entries.count == JWS.chainLength ? (Array(entries.prefix(2)), entries[2]) : nil
    }

    /// Verifies `jws` (ES256, x5c chain to the trust store's roots at `date`, Apple's OIDs, signature), remembering chains.
    /// Returns the window in which its chain is valid, when its certificates' dates could be read.
    @discardableResult
    static func check(_ jws: JWS, at date: Date, trust: TrustStore, cache: borrowing Locked<[[String]: KnownChain]>,
                      counted verifications: borrowing Atomic<Int>, subject: String) throws(ReceiptRejection) -> (notBefore: Date, notAfter: Date)? {
        let chainKey = Self.chainKey(jws)
        if let chainKey, let known = cache.withLock({ $0[chainKey.verified] }), date >= known.notBefore, date <= known.notAfter {
            // The third entry is not trusted (the roots are the trust store's), but it must be a certificate, as the full
            // check requires: one other than the entry seen when the chain verified is parsed.
            if chainKey.third != known.third {
                do { _ = try JWS.certificate(x5c: chainKey.third) } catch {
                    throw ReceiptRejection(code: "untrusted_certificate", reason: "\(subject) certificate chain is not trusted: \(error)")
                }
            }
            guard jws.header["alg"]?.text == "ES256", known.key.isValidES256(jws.signature, for: jws.signingInput) else {
                throw ReceiptRejection(code: "invalid_signature", reason: "\(subject) signature is invalid")
            }
            return (known.notBefore, known.notAfter)
        }
        let chain: [Certificate]
        verifications.add(1, ordering: .relaxed)
        do {
            chain = try jws.verifyChain(with: trust.verifier, at: date)
        } catch {
            throw ReceiptRejection(code: "untrusted_certificate", reason: "\(subject) certificate chain is not trusted: \(error)")
        }
        // The chain is remembered before the signature is judged: a flood of bad signatures under a real
        // chain costs one ES256 check each, not a chain verification each.
        let fields = chain.prefix(2).compactMap { try? $0.fields }
        guard let key = chain[0].publicKey else { throw ReceiptRejection(code: "untrusted_certificate", reason: "\(subject) leaf has no key") }
        var window: (notBefore: Date, notAfter: Date)?
        if fields.count == 2, let notBefore = fields.map(\.notBefore).max(), let notAfter = fields.map(\.notAfter).min() {
            window = (notBefore, notAfter)
            if let chainKey {
                cache.withLock { cache in
                    if cache.count > 64 { cache.removeAll() }
                    cache[chainKey.verified] = KnownChain(key: key, notBefore: notBefore, notAfter: notAfter, third: chainKey.third)
                }
            }
        }
        guard key.isValidES256(jws.signature, for: jws.signingInput) else {
            throw ReceiptRejection(code: "invalid_signature", reason: "\(subject) signature is invalid")
        }
        return window
    }
}

/// Who signed a JWS this inspector verified: its header segment as sent (`alg` and the `x5c` chain, which name the
/// key) and the window in which that chain is valid.
struct VerifiedSigner: Sendable {
    let header: ArraySlice<UInt8>
    let notBefore: Date
    let notAfter: Date

    /// Whether a JWS with this header segment, dated `date`, is signed as the verified one was. A JWS carried in the
    /// verified one's payload is then covered by its signature: the holder of that key signed these very bytes, so
    /// checking its own signature again proves nothing more. Apple signs a notification and the transaction and
    /// renewal info it carries under one header; any other header gets the full check.
    func covers(header segment: some Collection<UInt8>, at date: Date) -> Bool {
        date >= notBefore && date <= notAfter && segment.hasSameBytes(as: header)
    }
}

/// A notification's envelope, split and its payload parsed, not yet verified.
public struct Envelope: Sendable {
    public let jws: JWS
    public let payload: JSONValue

    /// Made only from the compact form, so that `payload` is always `jws`'s own.
    public init(compact: String) throws {
        jws = try JWS(compact: compact)
        payload = try jws.payloadJSON()
    }
}

/// A notification's envelope whose chain and signature verified, and its payload.
public struct VerifiedEnvelope: Sendable {
    public let payload: JSONValue
    /// The payload's bytes as decoded from the envelope (the JSON text `payload` was parsed from).
    let payloadBytes: [UInt8]
    /// nil when the chain's window could not be read: what the envelope carries then gets the full check.
    let signer: VerifiedSigner?

    /// Made only by `SignedTransactionInspector.verify(_:at:subject:)`, once the envelope verified.
    fileprivate init(payload: JSONValue, payloadBytes: [UInt8], signer: VerifiedSigner?) {
        self.payload = payload
        self.payloadBytes = payloadBytes
        self.signer = signer
    }

    /// The JWS at `payload[section][key]`, carried by this envelope (and so covered by its signature when signed
    /// under the same header). The only way to make a `CarriedJWS`: its text comes from the verified payload.
    public func carried(_ section: String, _ key: String) -> CarriedJWS? {
        guard let text = payload[section]?[key]?.text else { return nil }
        return CarriedJWS(compact: text, signer: signer)
    }
}

/// A compact JWS found in a verified envelope's payload.
public struct CarriedJWS: Sendable {
    public let compact: String
    let signer: VerifiedSigner?

    /// Made only by `VerifiedEnvelope.carried`, from the verified payload.
    fileprivate init(compact: String, signer: VerifiedSigner?) {
        self.compact = compact
        self.signer = signer
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
