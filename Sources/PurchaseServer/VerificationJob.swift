import AppStoreCrypto
import AppStoreModels
import Foundation
import Storage

/// A receipt waiting to be, or already, verified.
public struct VerificationJob: Sendable, Codable, Equatable {
    /// Why the job exists: a purchase upload or a restore.
    public enum Kind: String, Codable, Sendable {
        case purchase
        case restore
        /// A StoreKit 2 signed transaction (JWS) from `POST /v1/transactions`, checked without calling Apple.
        case signedTransaction = "signed_transaction"
    }

    public var id: String
    public var appId: String
    public var appUserId: String
    public var kind: Kind
    /// The receipt as uploaded (Base64, or a JWS): present on a new job and a claimed one; a job read for its
    /// state or listed has it empty (`PurchaseStore.receipt(of:)` reads it).
    public var receiptData: String
    public var state: JobState
    public var reason: String?
    public var environment: AppStoreEnvironment?
    public var attempts: Int64
    public var nextAttemptAt: Date
    public var createdAt: Date
    public var updatedAt: Date
    public var settledAt: Date?
    /// JSON summary of what settlement granted and refused.
    public var result: String?
    /// Whether the user was authenticated (a secret key or a user token) rather than only named by a public key.
    public var userAuthenticated: Bool = true
    /// What the upload says it delivers (`transactionId`, `productId`): see `DeliveryHint`.
    public var deliver: DeliveryHint?
    /// The SHA-256 of `receiptData`, taken when a new job is made and kept when the verification engine lets the text go
    /// while Apple answers.
    var receiptDigest: String?
    /// The receipt as `verification_receipts` holds it, when that is not `receiptData` itself: a notification's
    /// transaction with its certificate chain named by digest (`StoredJWS`), about a fifth of its size. Set on a new
    /// job only; the claim reads it back expanded.
    var storedReceipt: String?
    /// On a new job written already claimed by this process's worker (`VerificationWorker.reserve`): its lease.
    var lease: Lease?

    /// Makes a new job one written already claimed under `lease` (its first attempt counted).
    mutating func claim(_ lease: Lease) {
        state = .verifying
        attempts = 1
        self.lease = lease
    }

    /// Who holds a job being verified, and until when; past that, any worker may take it over.
    public struct Lease: Sendable, Codable, Equatable {
        public var owner: String
        public var expiresAt: Date
    }
}

/// What a receipt upload says it is delivering: the StoreKit 1 transaction the device just
/// completed (`transactionId`) and/or its product. An app receipt holds every unfinished purchase of
/// the Apple ID, so two users sharing one (a family iPad), or several uploads in flight, would
/// otherwise race for its consumables. With a hint, the named consumable goes to this user; other
/// new consumables wait for the upload that names them, and go to whoever uploads them once they are
/// older than `SettlementPlan.deliveryWindow`. An upload without a hint takes every consumable (as before).
public struct DeliveryHint: Sendable, Equatable, Codable {
    public var transactionId: String?
    public var productId: String?

    /// Nil when neither is given.
    public init?(transactionId: String?, productId: String?) {
        guard transactionId != nil || productId != nil else { return nil }
        self.transactionId = transactionId
        self.productId = productId
    }

    /// Whether `transaction` is what the upload names.
    func names(_ transaction: ConfirmedTransaction) -> Bool {
        if let transactionId { return transaction.transactionId == transactionId }
        return transaction.productId == productId
    }
}

extension VerificationJob {
    /// The SHA-256 of the uploaded text, kept when the bytes are dropped.
    var receiptSHA256: String { receiptDigest ?? DigestedReceipt(receiptData).sha256 }
}

/// A receipt's text with the SHA-256 of its UTF-8 bytes in lowercase hex, as a job keeps it.
struct DigestedReceipt: Sendable {
    let text: String
    let sha256: String

    init(_ text: String) {
        self.init(text, sha256: Digest.sha256.hash(text.utf8))
    }

    /// With the 32-byte digest of `text`'s UTF-8 bytes taken already (`SignedTransactionInspector.inspectDigesting`);
    /// anything but 32 bytes is taken again.
    init(_ text: String, sha256 digest: [UInt8]) {
        self.text = text
        sha256 = (digest.count == 32 ? digest : Digest.sha256.hash(text.utf8)).hexString
    }
}
