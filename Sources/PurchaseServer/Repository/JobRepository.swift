import AppStoreModels
import Foundation
import Storage

/// The SQL of the `verification_jobs` table, the durable queue of uploads, their leases and outcomes, and of
/// `verification_receipts`, each job's receipt (written once, read by the claim, dropped when the job settles: on SQLite
/// a verified job's by the sweep seconds later, `ReceiptSweep`).
struct JobRepository {
    let db: any SQLConnection
    let dialect: SQLDialect

    /// A new job: pending, claimed by the lease it carries (with the claim counted), or (refused by the look before
    /// storage) already rejected without its bytes.
    func insert(_ job: VerificationJob) throws {
        let now = job.createdAt.milliseconds
        // New rows only, each its own: uploads committed together are written with one statement where the database can.
        let columns = ["id", "app_id", "app_user_id", "kind", "state", "attempts", "next_attempt_at", "created_at", "updated_at",
                       "user_authenticated", "receipt_size"]
        if job.state == .rejected {
            try db.append(into: "verification_jobs", columns: columns + ["receipt_sha256", "reason", "settled_at"],
                          values: [job.id, job.appId, job.appUserId, job.kind.rawValue, "rejected", 0, now, now, now, job.userAuthenticated,
                                   Int64(job.receiptData.utf8.count), job.receiptSHA256, job.reason, now])
            try totals.add(state: JobState.rejected.rawValue)
            return
        }
        if let lease = job.lease {
            try db.append(into: "verification_jobs", columns: columns + ["deliver_transaction_id", "deliver_product_id", "lease_owner",
                                                                         "lease_expires_at", "open_claims"],
                          values: [job.id, job.appId, job.appUserId, job.kind.rawValue, "verifying", 1, now, now, now, job.userAuthenticated,
                                   Int64(job.receiptData.utf8.count), job.deliver?.transactionId, job.deliver?.productId, lease.owner,
                                   lease.expiresAt.milliseconds, 1])
        } else {
            try db.append(into: "verification_jobs", columns: columns + ["deliver_transaction_id", "deliver_product_id"],
                          values: [job.id, job.appId, job.appUserId, job.kind.rawValue, "pending", 0, now, now, now, job.userAuthenticated,
                                   Int64(job.receiptData.utf8.count), job.deliver?.transactionId, job.deliver?.productId])
        }
        try db.append(into: "verification_receipts", columns: ["job_id", "receipt_data"], values: [job.id, job.storedReceipt ?? job.receiptData])
    }

    /// Wakes the workers of other processes listening on `channel` when this transaction commits (PostgreSQL).
    func notify(_ channel: String) throws {
        try db.run("SELECT pg_notify(?, '')", [channel])
    }

    /// The job, without its receipt (`receiptData` is empty): what its state and outcome are.
    func job(_ id: String) throws -> VerificationJob? {
        try db.query("SELECT * FROM verification_jobs WHERE id = ?", [id]).first.map(Self.job)
    }

    /// The job's receipt as uploaded; nil once dropped (a settled job, an erased customer's).
    func receipt(of id: String) throws -> String? {
        try db.query("SELECT receipt_data FROM verification_receipts WHERE job_id = ?", [id]).first?.string("receipt_data")
            .map { try expanded([$0])[0] }
    }

    /// Receipts as uploaded, from their stored texts: a notification's transaction, stored with its headers named by
    /// digest (`StoredJWS`), and an app receipt stored with its certificates named so (`StoredReceipt`), get them back
    /// from `jws_headers`, read once for all of them. Uploads never begin with
    /// `~` (`ReceiptShape`). A text that does not expand (a header missing, or one an earlier version took) is given
    /// as stored, and its check rejects it as malformed: one job, never the claim of the others.
    private func expanded(_ stored: [String]) throws -> [String] {
        // A form this server wrote names one to three headers (an envelope's own and those it carries); a text naming
        // more, or anything but digests, was not written by it and is given as stored without a look-up.
        let named = stored.map { text -> [String] in
            guard text.utf8.first == UInt8(ascii: "~") else { return [] }
            if StoredReceipt.isCompacted(text) { return StoredReceipt.digest(of: text).map { [$0] } ?? [] }
            let digests = StoredJWS.headerDigests(of: text)
            return digests.count <= 4 && digests.allSatisfy({ StoredJWS.isDigest($0.utf8) }) ? digests : []
        }
        let digests = Set(named.joined())
        guard !digests.isEmpty else { return stored }
        let headers = try JWSHeaderRepository(db: db, dialect: dialect).headers(digests.sorted())
        return zip(stored, named).map { text, digests in
            guard !digests.isEmpty else { return text }
            if StoredReceipt.isCompacted(text) { return StoredReceipt.expand(text, part: { headers[$0] }) ?? text }
            return StoredJWS.expand(text, header: { headers[$0] }) ?? text
        }
    }

    /// Drops a job's receipt (its SHA-256 stays on the job).
    func dropReceipt(of id: String) throws {
        try db.run("DELETE FROM verification_receipts WHERE job_id = ?", [id])
    }

    /// Takes up to `limit` due jobs (and jobs whose lease expired) for `owner`, counting the claim;
    /// returns each job with how many claims it has had without an outcome.
    func claim(owner: String, limit: Int, leaseUntil: Int64, now: Int64) throws -> [(job: VerificationJob, openClaims: Int64)] {
        // One ordered, limited index scan per kind of due job rather than one scan of their union: a queue's index
        // is mostly entries of rows that moved on, and only a scan that walks it in order stops after `limit` rows
        // (and marks the dead entries it passed, so the next claim skips them).
        let lock = dialect == .postgres ? " FOR UPDATE SKIP LOCKED" : ""
        let claimed = try db.query("""
            UPDATE verification_jobs SET state = 'verifying', lease_owner = ?, lease_expires_at = ?, attempts = attempts + 1,
            open_claims = open_claims + 1, updated_at = ?
            WHERE id IN (
                SELECT id FROM (
                    SELECT id, next_attempt_at FROM (SELECT id, next_attempt_at FROM verification_jobs
                        WHERE state = 'pending' AND next_attempt_at <= ? ORDER BY next_attempt_at LIMIT ?\(lock)) AS due
                    UNION ALL
                    SELECT id, next_attempt_at FROM (SELECT id, next_attempt_at FROM verification_jobs
                        WHERE state = 'timed_out' AND next_attempt_at <= ? ORDER BY next_attempt_at LIMIT ?\(lock)) AS retried
                    UNION ALL
                    SELECT id, next_attempt_at FROM (SELECT id, next_attempt_at FROM verification_jobs
                        WHERE state = 'verifying' AND lease_expires_at <= ? ORDER BY lease_expires_at LIMIT ?\(lock)) AS lapsed
                ) AS candidates ORDER BY next_attempt_at LIMIT ?)
            RETURNING *, (SELECT receipt_data FROM verification_receipts WHERE job_id = verification_jobs.id) AS receipt_data
            """, [owner, leaseUntil, now, now, limit, now, limit, now, limit, limit]).map { (job: Self.job($0), openClaims: $0.int("open_claims") ?? 0) }
        let receipts = try expanded(claimed.map(\.job.receiptData))
        return zip(claimed, receipts).map { claim, receipt in
            var job = claim.job
            job.receiptData = receipt
            return (job, claim.openClaims)
        }
    }

    /// Moves a job to `dead` whatever holds it (a poison job).
    func bury(_ id: String, reason: String, now: Int64) throws {
        try db.query("""
            UPDATE verification_jobs SET state = 'dead', reason = ?, lease_owner = NULL, lease_expires_at = NULL, updated_at = ?, settled_at = ?
            WHERE id = ?
            """, [reason, now, now, id])
    }

    /// Puts a job `owner` holds back in the queue (`pending`, `timed_out`) or into `dead`.
    func reschedule(_ id: String, owner: String, state: JobState, reason: String, nextAttempt: Int64, now: Int64) throws {
        try db.query("""
            UPDATE verification_jobs SET state = ?, reason = ?, next_attempt_at = ?, lease_owner = NULL, lease_expires_at = NULL,
            open_claims = 0, updated_at = ?, settled_at = ? WHERE id = ? AND lease_owner = ? AND state = 'verifying'
            """, [state.rawValue, reason, nextAttempt, now, state == .dead ? now : nil, id, owner])
    }

    /// Settles a job `owner` holds as rejected, dropping its bytes and keeping their hash; false when the lease was lost.
    func reject(_ id: String, owner: String, reason: String, environment: String?, receiptSHA256: String, now: Int64) throws -> Bool {
        guard try !db.query("""
            UPDATE verification_jobs SET state = 'rejected', reason = ?, environment = ?, lease_owner = NULL, lease_expires_at = NULL,
            open_claims = 0, receipt_sha256 = ?, updated_at = ?, settled_at = ?
            WHERE id = ? AND lease_owner = ? AND state = 'verifying' RETURNING id
            """, [reason, environment, receiptSHA256, now, now, id, owner]).isEmpty else { return false }
        try totals.add(state: JobState.rejected.rawValue)
        try dropReceipt(of: id)
        return true
    }

    /// Whether `owner` still holds the job's lease; on PostgreSQL the row stays locked until the transaction ends.
    func holdsLease(_ id: String, owner: String) throws -> Bool {
        try !db.query("SELECT id FROM verification_jobs WHERE id = ? AND lease_owner = ? AND state = 'verifying'" +
                      (dialect == .postgres ? " FOR UPDATE" : ""), [id, owner]).isEmpty
    }

    /// The lease owners of these jobs while they are being verified (job id → owner); on PostgreSQL the rows stay
    /// locked until the transaction ends, taken in id order so that two batches never wait on each other in a cycle.
    ///
    /// The state is checked here, not in SQL: with `state = ?` beside `id IN (…)`, SQLite (without statistics) may
    /// choose the index on the state and read every job being verified, thousands while Apple is slow, for every batch.
    func leases(_ ids: [String]) throws -> [String: String] {
        var owners: [String: String] = [:]
        for chunk in Array(Set(ids)).sorted().chunked(400) {
            let (marks, listed) = InList.padded(chunk)
            for row in try db.query("""
                SELECT id, state, lease_owner FROM verification_jobs WHERE id IN (\(marks))
                ORDER BY id
                """ + (dialect == .postgres ? " FOR UPDATE" : ""), listed) where row.string("state") == JobState.verifying.rawValue {
                if let id = row.string("id"), let owner = row.string("lease_owner") { owners[id] = owner }
            }
        }
        return owners
    }

    /// Records a settlement's outcome, keeping the receipt's SHA-256. The caller then closes the transaction's
    /// settlements with `closeSettled`, after its other writes.
    func settle(_ id: String, state: JobState, reason: String?, environment: String, result: String, receiptSHA256: String?, now: Int64) throws {
        // Gathered with the batch's other settlements into one statement (PostgreSQL).
        try db.update("verification_jobs", set: Self.settledAssignments,
                      values: [state.rawValue, reason, environment, result, now, now, receiptSHA256],
                      keyColumn: "id", key: id)
    }

    /// The last writes of a transaction that settled jobs (`settle`): their receipts dropped, then the jobs added to the
    /// running totals.
    ///
    /// Nothing reads a settled job's receipt (a replay takes only dead and timed-out jobs), so the receipts table holds
    /// the queue's receipts and its dead letters', not every receipt ever uploaded (about 5 KB each). On SQLite a
    /// verified job's receipt is left to the sweep (`dropSettledReceipts`), which drops them seconds later in id order:
    /// with Apple's latency the jobs settling together were uploaded seconds apart, and each `DELETE` here read and
    /// rewrote a page of its own on the only writer (a quarter of its time per receipt, bench/README, forty-first round),
    /// where the sweep frees whole pages of receipts uploaded together.
    ///
    /// The totals come last so that a total's row is the last lock the transaction takes. PostgreSQL writes gathered
    /// changes at the commit in the order they were first gathered; a total added with a batch's first job was locked
    /// before the rows of later jobs (ledger, balances), and two batches whose connections share a shard number could
    /// each hold what the other waits for. On PostgreSQL the receipts' `DELETE` is sent ahead of the batch's gathered
    /// writes (ledger, jobs: they go at the commit), after the jobs' rows were locked by the lease check; an erasure and
    /// a rejection also lock a job before its receipt, so no two of them wait on each other in a cycle.
    func closeSettled(_ settled: [(id: String, state: JobState)]) throws {
        let dropped = dialect == .sqlite ? settled.filter { $0.state != .verified } : settled
        for chunk in dropped.map(\.id).chunked(400) {
            let (condition, parameters) = dialect.membership("job_id", in: chunk)
            try db.run("DELETE FROM verification_receipts WHERE " + condition, parameters)
        }
        for state in JobState.allCases where state.isFinal {
            let count = settled.count { $0.state == state }
            if count > 0 { try totals.add(Int64(count), state: state.rawValue) }
        }
    }

    /// Drops the receipts of up to `limit` verified jobs that still have one (on SQLite every verified job's, until this
    /// runs; elsewhere those settled by a version that kept them), the first after the job id `after` in id order and,
    /// with `before`, only ids below it; returns how many, and the last id dropped (the next pass's `after`). Rejected
    /// jobs' receipts were always dropped with the rejection.
    ///
    /// The receipts are walked by their key from the cursor, each job looked up by its own: led by the jobs' index on
    /// the state, every pass would walk again the verified jobs whose receipts earlier passes dropped (seconds per pass
    /// on SQLite's only writer with a million of them). Receipts another transaction holds are skipped (PostgreSQL).
    func dropSettledReceipts(after: String, before: String? = nil, limit: Int) throws -> (dropped: Int, last: String?) {
        let below = before == nil ? "" : " AND r.job_id < ?"
        let receipts = dialect == .postgres
            ? """
              SELECT r.job_id FROM verification_receipts r JOIN verification_jobs j ON j.id = r.job_id
              WHERE r.job_id > ?\(below) AND j.state = 'verified' ORDER BY r.job_id LIMIT ? FOR UPDATE OF r SKIP LOCKED
              """
            // CROSS JOIN: SQLite keeps the receipts as the outer loop.
            : """
              SELECT r.job_id FROM verification_receipts r CROSS JOIN verification_jobs j ON j.id = r.job_id
              WHERE r.job_id > ?\(below) AND j.state = 'verified' ORDER BY r.job_id LIMIT ?
              """
        let parameters: [any SQLBindable] = before.map { [after, $0, limit] } ?? [after, limit]
        let dropped = try db.query("DELETE FROM verification_receipts WHERE job_id IN (\(receipts)) RETURNING job_id", parameters)
            .compactMap { $0.string("job_id") }
        // Swift's order of text may differ from a PostgreSQL collation's for ids other than the server's UUIDs: a cursor
        // past the database's last then skips some receipts until the next round of passes starts again from the first.
        return (dropped.count, dropped.max())
    }

    private static let settledAssignments = [
        "state = ?", "reason = ?", "environment = ?", "result = ?", "lease_owner = NULL", "lease_expires_at = NULL", "open_claims = 0",
        "updated_at = CAST(? AS BIGINT)", "settled_at = CAST(? AS BIGINT)", "receipt_sha256 = COALESCE(?, receipt_sha256)",
    ]

    /// How many of a state's latest jobs a list of one app's jobs looks through (`list`).
    static let appListWindow = 10_000

    /// Jobs of an app (all apps when nil) in a state (all when nil), the latest first by `next_attempt_at`: for a settled
    /// job when its last attempt was due (the upload for most), for a waiting one when its next attempt is.
    ///
    /// Each state's jobs are read in the order of the index on (state, next_attempt_at), newest first, and no more than
    /// the list needs: a sort of every job (there was no other order to read them in) took seconds once millions were
    /// kept, on SQLite on the only writer. One app's waiting and dead jobs are all looked at; its verified and rejected
    /// ones, which are kept without end, among the latest `appListWindow` of each of those states.
    func list(appId: String?, state: JobState?, limit: Int) throws -> [VerificationJob] {
        let (sql, parameters) = Self.listStatement(appId: appId, state: state, limit: limit)
        return try db.query(sql, parameters).map(Self.job)
    }

    /// The statement of `list`.
    static func listStatement(appId: String?, state: JobState?, limit: Int) -> (String, [any SQLBindable]) {
        let states = state.map { [$0] } ?? JobState.allCases
        var parts: [String] = []
        var parameters: [any SQLBindable] = []
        for (index, state) in states.enumerated() {
            let latest = "SELECT * FROM verification_jobs WHERE state = ? ORDER BY next_attempt_at DESC LIMIT ?"
            if let appId, !state.isFinal {
                // The queue and its dead letters: every one of the app's is looked at (as many as wait).
                parts.append("SELECT * FROM (SELECT * FROM verification_jobs WHERE state = ? AND app_id = ? ORDER BY next_attempt_at DESC LIMIT ?) AS latest\(index)")
                parameters += [state.rawValue, appId, limit]
            } else if let appId {
                parts.append("SELECT * FROM (SELECT * FROM (\(latest)) AS window\(index) WHERE app_id = ? LIMIT ?) AS latest\(index)")
                parameters += [state.rawValue, Self.appListWindow, appId, limit]
            } else {
                parts.append("SELECT * FROM (\(latest)) AS latest\(index)")
                parameters += [state.rawValue, limit]
            }
        }
        return (parts.joined(separator: " UNION ALL ") + " ORDER BY next_attempt_at DESC, id LIMIT ?", parameters + [limit])
    }

    /// How many jobs are in each state, every state named (0 when none): the queue's states and `dead` counted from their
    /// entries in the index on the state, the final states from their running totals. Never a read of every job.
    func counts() throws -> [String: Int64] {
        let counted = JobState.allCases.filter { !$0.isFinal }
        // The states' names are this enum's, written into the statement: PostgreSQL cannot type a parameter selected as a value.
        let sql = counted.map { "SELECT '\($0.rawValue)' AS state, COUNT(*) AS n FROM verification_jobs WHERE state = '\($0.rawValue)'" }
            .joined(separator: " UNION ALL ")
        var counts = Dictionary(uniqueKeysWithValues: JobState.allCases.map { ($0.rawValue, Int64(0)) })
        counts.merge(try totals.totals()) { $1 }
        for row in try db.query(sql) {
            counts[row.string("state") ?? ""] = row.int("n") ?? 0
        }
        return counts
    }

    private var totals: StateTotalsRepository { StateTotalsRepository(db: db, subject: "verification_jobs") }

    /// Puts these dead or timed-out jobs (every dead one when nil) back in the queue; returns how many.
    func replay(_ ids: [String]?, now: Int64) throws -> Int {
        let reset = "UPDATE verification_jobs SET state = 'pending', open_claims = 0, next_attempt_at = ?, created_at = ?, settled_at = NULL, updated_at = ?"
        guard let ids else { return try db.query(reset + " WHERE state = 'dead' RETURNING id", [now, now, now]).count }
        var total = 0
        for chunk in Array(Set(ids)).chunked(400) {
            let (condition, parameters) = dialect.membership("id", in: chunk)
            total += try db.query(reset + " WHERE \(condition) AND state IN (\(JobState.replayableSQL)) RETURNING id", [now, now, now] + parameters).count
        }
        return total
    }

    private static func job(_ row: SQLRow) -> VerificationJob {
        VerificationJob(id: row.string("id") ?? "", appId: row.string("app_id") ?? "", appUserId: row.string("app_user_id") ?? "",
                        kind: VerificationJob.Kind(rawValue: row.string("kind") ?? "") ?? .purchase, receiptData: row.string("receipt_data") ?? "",
                        state: JobState(rawValue: row.string("state") ?? "") ?? .pending, reason: row.string("reason"),
                        environment: row.string("environment").flatMap(AppStoreEnvironment.init(rawValue:)),
                        attempts: row.int("attempts") ?? 0, nextAttemptAt: Date(milliseconds: row.int("next_attempt_at") ?? 0),
                        createdAt: Date(milliseconds: row.int("created_at") ?? 0), updatedAt: Date(milliseconds: row.int("updated_at") ?? 0),
                        settledAt: row.int("settled_at").map(Date.init(milliseconds:)), result: row.string("result"),
                        userAuthenticated: row.int("user_authenticated").map { $0 != 0 } ?? true,
                        deliver: DeliveryHint(transactionId: row.string("deliver_transaction_id"), productId: row.string("deliver_product_id")))
    }
}
