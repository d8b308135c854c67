import Foundation
import Storage
import Testing
@testable import PurchaseServer

/// A job's receipt lives in `verification_receipts`, written once: the job's own row, rewritten by every claim and
/// settlement, stays small.
@Suite("Job receipts in their own table")
struct JobReceiptTests {
    @Test("Jobs stored before the move keep their receipts: a pending one is claimed with its whole receipt, a rejected one has none",
          arguments: Engine.available)
    func migrated(engine: Engine) async throws {
        let database = try await engine.makeDatabase()
        defer { Task { await database.close() } }
        try await database.migrate(Schema.migrations.filter { $0.version < 20 })
        let receipt = String(repeating: "MIIT", count: 2_000) + "xyz="
        _ = try await database.transaction { db in
            for (id, state, text) in [("old-pending", "pending", receipt), ("old-rejected", "rejected", "")] {
                try db.query("""
                    INSERT INTO verification_jobs (id, app_id, app_user_id, kind, receipt_data, state, attempts, next_attempt_at, created_at, updated_at)
                    VALUES (?, 'com.example.coins', 'alice', 'purchase', ?, ?, 0, 0, 0, 0)
                    """, [id, text, state])
            }
        }
        let store = PurchaseStore(database: database)
        try await store.migrate()
        let claimed = try await store.claim(owner: "worker", limit: 10, lease: 30, now: Date())
        #expect(claimed.map(\.id) == ["old-pending"])
        #expect(claimed.first?.receiptData == receipt)
        #expect(try await store.receipt(of: "old-pending") == receipt)
        #expect(try await store.receipt(of: "old-rejected") == nil)
        // Read for its state, a job comes without its receipt.
        #expect(try await store.job("old-pending")?.receiptData == "")
    }

    @Test("A claim returns each job with its own receipt, a claim and a settlement leave the receipt as written, a rejection drops it",
          arguments: Engine.available)
    func claimSettleReject(engine: Engine) async throws {
        let store = PurchaseStore(database: try await engine.makeDatabase())
        defer { Task { await store.database.close() } }
        try await store.migrate()
        let now = Date()
        let jobs = (0..<40).map { index in
            store.newJob(appId: "com.example.coins", appUserId: "u\(index)", kind: .purchase,
                         receiptData: "receipt-\(index)-" + String(repeating: "A", count: index * 300), now: now)
        }
        try await store.database.transaction { db in try store.insert(jobs, db) }
        let claimed = try await store.claim(owner: "worker", limit: 64, lease: 30, now: now)
        #expect(claimed.count == jobs.count)
        let written = Dictionary(uniqueKeysWithValues: jobs.map { ($0.id, $0.receiptData) })
        #expect(claimed.allSatisfy { written[$0.id] == $0.receiptData })
        let (kept, dropped) = (claimed[0], claimed[1])
        _ = try await store.database.transaction { db in
            try store.jobs(db).settle(kept.id, state: .verified, reason: nil, environment: "Sandbox", result: "{}", receiptSHA256: nil,
                                      now: now.milliseconds)
        }
        try await store.reject(dropped, owner: "worker", code: "test", reason: "a test rejection", environment: nil, now: now)
        #expect(try await store.receipt(of: kept.id) == written[kept.id])
        #expect(try await store.receipt(of: dropped.id) == nil)
        #expect(try await store.job(dropped.id)?.state == .rejected)
    }
}
