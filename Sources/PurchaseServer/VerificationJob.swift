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

    static func from(_ row: SQLRow) -> VerificationJob {
        VerificationJob(id: row.string("id") ?? "", appId: row.string("app_id") ?? "", appUserId: row.string("app_user_id") ?? "",
                        kind: Kind(rawValue: row.string("kind") ?? "") ?? .purchase, receiptData: row.string("receipt_data") ?? "",
                        state: JobState(rawValue: row.string("state") ?? "") ?? .pending, reason: row.string("reason"),
                        environment: row.string("environment").flatMap(AppStoreEnvironment.init(rawValue:)),
                        attempts: row.int("attempts") ?? 0, nextAttemptAt: Date(milliseconds: row.int("next_attempt_at") ?? 0),
                        createdAt: Date(milliseconds: row.int("created_at") ?? 0), updatedAt: Date(milliseconds: row.int("updated_at") ?? 0),
                        settledAt: row.int("settled_at").map(Date.init(milliseconds:)), result: row.string("result"),
                        userAuthenticated: row.int("user_authenticated").map { $0 != 0 } ?? true,
                        deliver: DeliveryHint(transactionId: row.string("deliver_transaction_id"), productId: row.string("deliver_product_id")))
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
    var receiptSHA256: String { Digest.sha256.hash(Array(receiptData.utf8)).hexString }
}

extension PurchaseStore {
    /// Writes a new job durably and returns it.
    /// A job refused by the look before storage (`rejection`) is written already rejected, with the
    /// upload's hash and size but not its bytes, and never reaches the queue.
    public func enqueue(appId: String, appUserId: String, kind: VerificationJob.Kind, receiptData: String, userAuthenticated: Bool = true,
                        deliver: DeliveryHint? = nil, rejection: ReceiptRejection? = nil, now: Date) async throws -> VerificationJob {
        var job = VerificationJob(id: UUID().uuidString.lowercased(), appId: appId, appUserId: appUserId, kind: kind, receiptData: receiptData,
                                  state: .pending, attempts: 0, nextAttemptAt: now, createdAt: now, updatedAt: now, userAuthenticated: userAuthenticated,
                                  deliver: deliver)
        if let rejection {
            job.state = .rejected
            job.reason = rejection.reason
            job.settledAt = now
        }
        try await uploads.write(job, all: { [self] jobs in try await self.insert(jobs) })
        if rejection != nil { job.receiptData = "" }
        return job
    }

    /// Inserts a batch of new jobs in one transaction (group commit: uploads that arrive while a
    /// commit is running share the next one), then wakes other processes.
    func insert(_ jobs: [VerificationJob]) async throws {
        try await database.transaction { db in
            for job in jobs {
                let now = job.createdAt.milliseconds
                if job.state == .rejected {
                    try db.query("""
                        INSERT INTO verification_jobs (id, app_id, app_user_id, kind, receipt_data, state, attempts, next_attempt_at, created_at, updated_at,
                        user_authenticated, receipt_size, receipt_sha256, reason, settled_at)
                        VALUES (?, ?, ?, ?, '', 'rejected', 0, ?, ?, ?, ?, ?, ?, ?, ?)
                        """, [job.id, job.appId, job.appUserId, job.kind.rawValue, now, now, now, job.userAuthenticated,
                              Int64(job.receiptData.utf8.count), job.receiptSHA256, job.reason, now])
                    try Self.audit(db, appId: job.appId, userId: job.appUserId, kind: "verification_rejected",
                                   detail: ["verificationId": job.id, "code": "malformed_receipt", "reason": job.reason ?? ""], now: job.createdAt)
                    continue
                }
                try db.query("""
                    INSERT INTO verification_jobs (id, app_id, app_user_id, kind, receipt_data, state, attempts, next_attempt_at, created_at, updated_at,
                    user_authenticated, receipt_size, deliver_transaction_id, deliver_product_id)
                    VALUES (?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?, ?, ?, ?, ?)
                    """, [job.id, job.appId, job.appUserId, job.kind.rawValue, job.receiptData, now, now, now, job.userAuthenticated,
                          Int64(job.receiptData.utf8.count), job.deliver?.transactionId, job.deliver?.productId])
            }
        }
        if database.dialect == .postgres { await database.notify(Self.jobsChannel) }
    }

    /// One job (of one app when `appId` is given).
    public func job(_ id: String, appId: String? = nil) async throws -> VerificationJob? {
        try await database.transaction { db in
            try db.query("SELECT * FROM verification_jobs WHERE id = ?", [id]).first.map(VerificationJob.from)
        }.flatMap { appId == nil || $0.appId == appId ? $0 : nil }
    }

    /// How many claims may end without an outcome (the process died holding the lease) before a
    /// job is poison: the input that killed the process three times is not run a fourth.
    public static let maximumOpenClaims: Int64 = 3

    /// Claims up to `limit` due jobs for `owner` under a lease; expired leases are taken over.
    /// Every claim is counted until the job reaches an outcome (settled, rejected, rescheduled); a
    /// job whose count would pass `maximumOpenClaims` goes to `dead` with reason `poison` instead,
    /// in the same transaction, and stays there until an operator replays it.
    public func claim(owner: String, limit: Int, lease: TimeInterval, now: Date) async throws -> [VerificationJob] {
        let lock = database.dialect == .postgres ? " FOR UPDATE SKIP LOCKED" : ""
        let nowMs = now.milliseconds
        let leaseUntil = now.addingTimeInterval(lease).milliseconds
        return try await database.transaction { db in
            let rows = try db.query("""
                UPDATE verification_jobs SET state = 'verifying', lease_owner = ?, lease_expires_at = ?, attempts = attempts + 1,
                open_claims = open_claims + 1, updated_at = ?
                WHERE id IN (
                    SELECT id FROM verification_jobs
                    WHERE (state IN ('pending', 'timed_out') AND next_attempt_at <= ?) OR (state = 'verifying' AND lease_expires_at <= ?)
                    ORDER BY next_attempt_at LIMIT ?\(lock))
                RETURNING *
                """, [owner, leaseUntil, nowMs, nowMs, nowMs, limit])
            var claimed: [VerificationJob] = []
            for row in rows {
                let job = VerificationJob.from(row)
                guard (row.int("open_claims") ?? 0) > Self.maximumOpenClaims else {
                    claimed.append(job)
                    continue
                }
                let reason = "poison: claimed \(Self.maximumOpenClaims) times without an outcome (the server stopped while processing it)"
                try db.query("""
                    UPDATE verification_jobs SET state = 'dead', reason = ?, lease_owner = NULL, lease_expires_at = NULL, updated_at = ?, settled_at = ?
                    WHERE id = ?
                    """, [reason, nowMs, nowMs, job.id])
                try Self.audit(db, appId: job.appId, userId: job.appUserId, kind: "verification_poisoned",
                               detail: ["verificationId": job.id, "attempts": String(job.attempts)], now: now)
            }
            return claimed
        }
    }

    /// Puts a claimed job back for a later attempt (or into the dead-letter state past its maximum age).
    public func reschedule(_ job: VerificationJob, owner: String, reason: String, timedOut: Bool, nextAttempt: Date, dead: Bool, now: Date) async throws {
        let state: JobState = dead ? .dead : (timedOut ? .timedOut : .pending)
        try await database.transaction { db in
            try db.query("""
                UPDATE verification_jobs SET state = ?, reason = ?, next_attempt_at = ?, lease_owner = NULL, lease_expires_at = NULL,
                open_claims = 0, updated_at = ?, settled_at = ? WHERE id = ? AND lease_owner = ? AND state = 'verifying'
                """, [state.rawValue, reason, nextAttempt.milliseconds, now.milliseconds, dead ? now.milliseconds : nil, job.id, owner])
            if dead {
                try Self.audit(db, appId: job.appId, userId: job.appUserId, kind: "verification_dead_lettered",
                               detail: ["verificationId": job.id, "reason": reason, "attempts": String(job.attempts)], now: now)
            }
        }
    }

    /// Settles a claimed job as rejected.
    /// The bytes are dropped; their SHA-256 (computed here, off the upload path and outside the transaction) is kept.
    public func reject(_ job: VerificationJob, owner: String, code: String, reason: String, environment: AppStoreEnvironment?, now: Date) async throws {
        let hash = job.receiptSHA256
        try await database.transaction { db in
            let rows = try db.query("""
                UPDATE verification_jobs SET state = 'rejected', reason = ?, environment = ?, lease_owner = NULL, lease_expires_at = NULL,
                open_claims = 0, receipt_data = '', receipt_sha256 = ?, updated_at = ?, settled_at = ?
                WHERE id = ? AND lease_owner = ? AND state = 'verifying' RETURNING id
                """, [reason, environment?.rawValue, hash, now.milliseconds, now.milliseconds, job.id, owner])
            guard !rows.isEmpty else { return }
            try Self.audit(db, appId: job.appId, userId: job.appUserId, kind: "verification_rejected",
                           detail: ["verificationId": job.id, "code": code, "reason": reason], now: now)
        }
    }

    /// Jobs in a state (all states when nil), newest first.
    public func jobs(appId: String? = nil, state: JobState?, limit: Int) async throws -> [VerificationJob] {
        try await database.transaction { db in
            var sql = "SELECT * FROM verification_jobs WHERE 1 = 1"
            var parameters: [any SQLBindable] = []
            if let appId {
                sql += " AND app_id = ?"
                parameters.append(appId)
            }
            if let state {
                sql += " AND state = ?"
                parameters.append(state.rawValue)
            }
            sql += " ORDER BY created_at DESC LIMIT ?"
            parameters.append(limit)
            return try db.query(sql, parameters).map(VerificationJob.from)
        }
    }

    /// Counts of jobs per state.
    public func jobCounts() async throws -> [String: Int64] {
        try await database.transaction { db in
            var counts: [String: Int64] = [:]
            for row in try db.query("SELECT state, COUNT(*) AS n FROM verification_jobs GROUP BY state") {
                counts[row.string("state") ?? ""] = row.int("n") ?? 0
            }
            return counts
        }
    }

    /// Puts dead (or timed-out) jobs back in the queue; returns how many.
    public func replay(ids: [String]?, now: Date) async throws -> Int {
        let count = try await database.transaction { db -> Int in
            var total = 0
            if let ids {
                for id in ids {
                    total += try db.query("""
                        UPDATE verification_jobs SET state = 'pending', open_claims = 0, next_attempt_at = ?, created_at = ?, settled_at = NULL, updated_at = ?
                        WHERE id = ? AND state IN ('dead', 'timed_out') RETURNING id
                        """, [now.milliseconds, now.milliseconds, now.milliseconds, id]).count
                }
            } else {
                total = try db.query("""
                    UPDATE verification_jobs SET state = 'pending', open_claims = 0, next_attempt_at = ?, created_at = ?, settled_at = NULL, updated_at = ?
                    WHERE state = 'dead' RETURNING id
                    """, [now.milliseconds, now.milliseconds, now.milliseconds]).count
            }
            return total
        }
        if count > 0, database.dialect == .postgres { await database.notify(Self.jobsChannel) }
        return count
    }
}
