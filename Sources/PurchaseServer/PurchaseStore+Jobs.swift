import AppStoreModels
import Foundation
import Storage

extension PurchaseStore {
    func jobs(_ db: any SQLConnection) -> JobRepository { JobRepository(db: db, dialect: database.dialect) }

    /// Writes a new job durably and returns it.
    /// A job refused by the look before storage (`rejection`) is written already rejected, with the
    /// upload's hash and size but not its bytes, and never reaches the queue. Any other is written pending, or with
    /// a `lease` already claimed (its first attempt counted, as a claim counts it) by the worker that holds the lease.
    /// `storedReceipt`: the receipt as `verification_receipts` is to hold it, when not as it came (`storedReceipt(_:)`).
    public func enqueue(appId: String, appUserId: String, kind: VerificationJob.Kind, receiptData: String, userAuthenticated: Bool = true,
                        deliver: DeliveryHint? = nil, rejection: ReceiptRejection? = nil, lease: VerificationJob.Lease? = nil,
                        storedReceipt: String? = nil, now: Date) async throws -> VerificationJob {
        var job = newJob(appId: appId, appUserId: appUserId, kind: kind, receiptData: receiptData, userAuthenticated: userAuthenticated,
                         deliver: deliver, now: now)
        job.storedReceipt = storedReceipt
        if let rejection {
            job.state = .rejected
            job.reason = rejection.reason
            job.settledAt = now
        } else if let lease {
            job.claim(lease)
        }
        try await uploads.write(job, all: { [self] jobs in try await self.insert(jobs) })
        if rejection != nil { job.receiptData = "" }
        return job
    }

    /// Inserts a batch of new jobs in one transaction (group commit: uploads that arrive while a
    /// commit is running share the next one), then wakes other processes.
    func insert(_ jobs: [VerificationJob]) async throws {
        try await database.transaction { db in try self.insert(jobs, db) }
    }

    /// A new pending job, not yet written, its receipt's SHA-256 taken once: its row and, handed over, its worker read it.
    func newJob(appId: String, appUserId: String, kind: VerificationJob.Kind, receiptData: String, userAuthenticated: Bool = true,
                deliver: DeliveryHint? = nil, now: Date) -> VerificationJob {
        newJob(appId: appId, appUserId: appUserId, kind: kind, receipt: DigestedReceipt(receiptData), userAuthenticated: userAuthenticated,
               deliver: deliver, now: now)
    }

    /// The same for a receipt whose digest was taken already (a notification's transaction, digested as it was checked).
    func newJob(appId: String, appUserId: String, kind: VerificationJob.Kind, receipt: DigestedReceipt, userAuthenticated: Bool = true,
                deliver: DeliveryHint? = nil, now: Date) -> VerificationJob {
        var job = VerificationJob(id: ids.nextOrderedString(), appId: appId, appUserId: appUserId, kind: kind, receiptData: receipt.text,
                                  state: .pending, attempts: 0, nextAttemptAt: now, createdAt: now, updatedAt: now,
                                  userAuthenticated: userAuthenticated, deliver: deliver)
        job.receiptDigest = receipt.sha256
        return job
    }

    /// Writes new jobs in the caller's transaction. This process's worker is the caller's to wake; other processes'
    /// workers wake when it commits (PostgreSQL delivers a notification at commit) only if this one is stopped or has
    /// no free place (`localWorkerHasRoom`). A worker with a free place claims in batches and again as places free up.
    func insert(_ jobs: [VerificationJob], _ db: any SQLConnection) throws {
        let repository = self.jobs(db)
        try addReceiptParts(of: jobs, db)
        for job in jobs {
            try repository.insert(job)
            if job.state == .rejected {
                try audit(db).append(appId: job.appId, userId: job.appUserId, kind: "verification_rejected",
                                     detail: ["verificationId": job.id, "code": "malformed_receipt", "reason": job.reason ?? ""], now: job.createdAt)
            }
        }
        if database.dialect == .postgres, wakesOtherProcesses(for: jobs) { try repository.notify(Self.jobsChannel) }
    }

    /// Whether new `jobs` need other processes' workers: some are to be verified, and this process's worker is not
    /// running or has no free place.
    func wakesOtherProcesses(for jobs: [VerificationJob]) -> Bool {
        jobs.contains { $0.state == .pending } && !localWorkerHasRoom.load(ordering: .relaxed)
    }

    /// One job (of one app when `appId` is given), without its receipt.
    public func job(_ id: String, appId: String? = nil) async throws -> VerificationJob? {
        try await database.read { db in try self.jobs(db).job(id) }.flatMap { appId == nil || $0.appId == appId ? $0 : nil }
    }

    /// A job's receipt as uploaded; nil once dropped (rejected, or its customer erased).
    func receipt(of id: String) async throws -> String? {
        try await database.read { db in try self.jobs(db).receipt(of: id) }
    }

    /// How many claims may end without an outcome (the process died holding the lease) before a
    /// job is poison: the input that killed the process three times is not run a fourth.
    public static let maximumOpenClaims: Int64 = 3

    /// Claims up to `limit` due jobs for `owner` under a lease; expired leases are taken over.
    /// Every claim is counted until the job reaches an outcome (settled, rejected, rescheduled); a
    /// job whose count would pass `maximumOpenClaims` goes to `dead` with reason `poison` instead,
    /// in the same transaction, and stays there until an operator replays it.
    public func claim(owner: String, limit: Int, lease: TimeInterval, now: Date) async throws -> [VerificationJob] {
        try await claimCounting(owner: owner, limit: limit, lease: lease, now: now).jobs
    }

    /// `claim`, with how many due jobs it found (the poison ones among them are not returned).
    func claimCounting(owner: String, limit: Int, lease: TimeInterval, now: Date) async throws -> (jobs: [VerificationJob], found: Int) {
        try await database.transaction { db in
            let repository = self.jobs(db)
            var claimed: [VerificationJob] = []
            let found = try repository.claim(owner: owner, limit: limit, leaseUntil: now.addingTimeInterval(lease).milliseconds, now: now.milliseconds)
            for (job, openClaims) in found {
                guard openClaims > Self.maximumOpenClaims else {
                    claimed.append(job)
                    continue
                }
                try repository.bury(job.id, reason: "poison: claimed \(Self.maximumOpenClaims) times without an outcome (the server stopped while processing it)",
                                    now: now.milliseconds)
                try self.audit(db).append(appId: job.appId, userId: job.appUserId, kind: "verification_poisoned",
                                          detail: ["verificationId": job.id, "attempts": String(job.attempts)], now: now)
            }
            return (claimed, found.count)
        }
    }

    /// Puts a claimed job back for a later attempt (or into the dead-letter state past its maximum age).
    public func reschedule(_ job: VerificationJob, owner: String, reason: String, timedOut: Bool, nextAttempt: Date, dead: Bool, now: Date) async throws {
        let state: JobState = dead ? .dead : (timedOut ? .timedOut : .pending)
        try await database.transaction { db in
            try self.jobs(db).reschedule(job.id, owner: owner, state: state, reason: reason, nextAttempt: nextAttempt.milliseconds, now: now.milliseconds)
            if dead {
                try self.audit(db).append(appId: job.appId, userId: job.appUserId, kind: "verification_dead_lettered",
                                          detail: ["verificationId": job.id, "reason": reason, "attempts": String(job.attempts)], now: now)
            }
        }
    }

    /// Settles a claimed job as rejected.
    /// The bytes are dropped; their SHA-256 (computed here, off the upload path and outside the transaction) is kept.
    public func reject(_ job: VerificationJob, owner: String, code: String, reason: String, environment: AppStoreEnvironment?, now: Date) async throws {
        let hash = job.receiptSHA256
        try await database.transaction { db in
            guard try self.jobs(db).reject(job.id, owner: owner, reason: reason, environment: environment?.rawValue, receiptSHA256: hash,
                                           now: now.milliseconds) else { return }
            try self.audit(db).append(appId: job.appId, userId: job.appUserId, kind: "verification_rejected",
                                      detail: ["verificationId": job.id, "code": code, "reason": reason], now: now)
        }
    }

    /// Jobs in a state (all states when nil), newest first.
    public func jobs(appId: String? = nil, state: JobState?, limit: Int) async throws -> [VerificationJob] {
        try await database.read { db in try self.jobs(db).list(appId: appId, state: state, limit: limit) }
    }

    /// Counts of jobs per state.
    public func jobCounts() async throws -> [String: Int64] {
        try await database.read { db in try self.jobs(db).counts() }
    }

    /// Sets the running totals of settled jobs and delivered webhooks again from a count of their rows, and returns the
    /// counts of jobs and of deliveries per state. It mends totals that drifted: jobs that processes of an older version
    /// settled after migration 24. A read of those states' index entries (0.35 s per two million jobs here), while writes
    /// to both tables wait (PostgreSQL: a share lock, given up after 10 s rather than hold uploads longer; SQLite: the writer).
    public func recountTotals() async throws -> (jobs: [String: Int64], deliveries: [String: Int64]) {
        try await database.transaction { db in
            try StateTotalsRepository.recount(db, dialect: self.database.dialect)
            return (try self.jobs(db).counts(), try self.webhooks(db).counts())
        }
    }

    /// Drops the receipts of up to `limit` verified jobs that still have one (on SQLite every verified job's until this
    /// runs; elsewhere those settled by a version that kept them), the first after the job id `after` and, with
    /// `before`, only ids below it; returns how many it dropped and the last id, where the next pass starts.
    public func dropSettledReceipts(after: String = "", before: String? = nil, limit: Int) async throws -> (dropped: Int, last: String?) {
        try await database.transaction { db in try self.jobs(db).dropSettledReceipts(after: after, before: before, limit: limit) }
    }

    /// How many jobs one replay by id may name: each is looked up on the only writer (SQLite), in one transaction.
    public static let replayLimit = 1_000

    /// Puts dead (or timed-out) jobs back in the queue: those of `ids` (at most `replayLimit`), or every dead job when
    /// nil; returns how many.
    public func replay(ids: [String]?, now: Date) async throws -> Int {
        if let ids, ids.count > Self.replayLimit {
            throw ServerError(.tooManyIds, "A replay names at most \(Self.replayLimit) jobs (\(ids.count) given); send the rest in further requests.")
        }
        let count = try await database.transaction { db in try self.jobs(db).replay(ids, now: now.milliseconds) }
        if count > 0, database.dialect == .postgres { await database.notify(Self.jobsChannel) }
        return count
    }
}
