import Foundation
import SQLiteStorage
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

    @Test("A claim returns each job with its own receipt; a settlement (on SQLite the sweep after it) or a rejection drops it and keeps its SHA-256, a dead job keeps it for its replay",
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
        let (verified, alsoRejected, rejected, dead) = (claimed[0], claimed[1], claimed[2], claimed[3])
        // Settled together, as a batch is: both receipts dropped, their hashes kept.
        _ = try await store.database.transaction { db in
            for (job, state) in [(verified, JobState.verified), (alsoRejected, .rejected)] {
                try store.jobs(db).settle(job.id, state: state, reason: nil, environment: "Sandbox", result: "{}",
                                          receiptSHA256: job.receiptSHA256, now: now.milliseconds)
            }
            try store.jobs(db).closeSettled([(verified.id, .verified), (alsoRejected.id, .rejected)])
        }
        try await store.reject(rejected, owner: "worker", code: "test", reason: "a test rejection", environment: nil, now: now)
        try await store.reschedule(dead, owner: "worker", reason: "gave up", timedOut: false, nextAttempt: now, dead: true, now: now)
        // On SQLite the verified job's receipt waits for the sweep, which drops it (and nothing else); elsewhere it went
        // with the settlement.
        #expect(try await store.receipt(of: verified.id) == (engine == .sqlite ? written[verified.id] : nil))
        #expect(try await store.dropSettledReceipts(limit: 100).dropped == (engine == .sqlite ? 1 : 0))
        for job in [verified, alsoRejected, rejected] {
            #expect(try await store.receipt(of: job.id) == nil)
            let hash = try await store.database.read { db in
                try db.query("SELECT receipt_sha256 FROM verification_jobs WHERE id = ?", [job.id]).first?.string("receipt_sha256")
            }
            #expect(hash == job.receiptSHA256)
        }
        #expect(try await store.job(rejected.id)?.state == .rejected)
        // The others keep theirs: the dead one is claimed again with it once replayed.
        for job in claimed.dropFirst(3) { #expect(try await store.receipt(of: job.id) == written[job.id]) }
        #expect(try await store.replay(ids: [dead.id], now: now) == 1)
        let again = try await store.claim(owner: "worker", limit: 64, lease: 30, now: now)
        #expect(again.map(\.id) == [dead.id] && again.first?.receiptData == written[dead.id])
    }

    @Test("Receipts that verified jobs kept before this version are dropped a pass at a time; the queue's and dead jobs' stay",
          arguments: Engine.available)
    func sweep(engine: Engine) async throws {
        let database = try await engine.makeDatabase()
        defer { Task { await database.close() } }
        let store = PurchaseStore(database: database)
        try await store.migrate()
        let states = Array(repeating: "verified", count: 5) + ["pending", "verifying", "timed_out", "dead"]
        _ = try await database.transaction { db in
            for (index, state) in states.enumerated() {
                try JobCountsTests.insertJob(db, id: "job-\(index)", state: state, order: index)
                try db.query("INSERT INTO verification_receipts (job_id, receipt_data) VALUES (?, ?)", ["job-\(index)", "receipt-\(index)"])
            }
        }
        // Passes go on from where the last one ended (ids in order), and a pass from the start finds nothing left.
        let first = try await store.dropSettledReceipts(after: "", limit: 3)
        #expect(first.dropped == 3 && first.last == "job-2")
        let second = try await store.dropSettledReceipts(after: first.last ?? "", limit: 3)
        #expect(second.dropped == 2 && second.last == "job-4")
        #expect(try await store.dropSettledReceipts(after: second.last ?? "", limit: 3).dropped == 0)
        #expect(try await store.dropSettledReceipts(after: "", limit: 3).dropped == 0)
        for (index, state) in states.enumerated() {
            #expect(try await store.receipt(of: "job-\(index)") == (state == "verified" ? nil : "receipt-\(index)"), "\(state)")
        }
    }

    @Test("A running server on SQLite sweeps a verified job's receipt by itself within seconds")
    func runningServerSweeps() async throws {
        let world = try await ServerWorld.make(.sqlite)
        defer { Task { await world.stop() } }
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        #expect(try await world.upload("com.example.coins", user: "alice", receipt: receipt).state == "verified")
        func left() async throws -> Int {
            try await world.server.store.database.read { db in try db.query("SELECT job_id FROM verification_receipts", []).count }
        }
        // Its id is below the bound of ten seconds ago within about eleven seconds; a pass runs every second.
        let deadline = ContinuousClock.now + .seconds(30)
        while try await left() > 0, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(250)) }
        #expect(try await left() == 0)
    }

    @Test("Through the server: receipts settled as a batch are gone once granted and swept, and the receipts table holds nothing",
          arguments: Engine.available)
    func settledThroughTheServer(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        var receipts: [String] = []
        for index in 0..<6 {
            // A tester and device each, so that every receipt holds its own purchase only.
            try await world.emulator.addAccount(email: "buyer\(index)@example.com", environment: .sandbox)
            let device = try await world.emulator.signIn(deviceId: nil, email: "buyer\(index)@example.com").id
            receipts.append(try await world.buy("com.example.coins", "Nada.JPYF02", device: device).1)
        }
        // Uploaded at once, so that settlements share batches.
        let answers = try await withThrowingTaskGroup(of: String.self) { group in
            for (index, receipt) in receipts.enumerated() {
                group.addTask {
                    let body = try await world.upload("com.example.coins", user: "user-\(index)", receipt: receipt)
                    return "\(body.state ?? "none") \(body.granted.count)"
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(answers == Array(repeating: "verified 1", count: 6))
        // On SQLite they go with the sweep's next pass (seconds later in a running server), elsewhere with the settlement.
        #expect(try await world.server.store.dropSettledReceipts(limit: 100).dropped == (engine == .sqlite ? 6 : 0))
        let left = try await world.server.store.database.read { db in try db.query("SELECT job_id FROM verification_receipts", []).count }
        #expect(left == 0)
        for index in 0..<6 { #expect(try await world.user("com.example.coins", "user-\(index)").balances == ["coins": 100]) }
    }

    @Test("A membership condition matches exactly the values given, whatever they hold (quotes, backslashes, commas, braces, NULL)",
          arguments: Engine.available)
    func membership(engine: Engine) async throws {
        let database = try await engine.makeDatabase()
        defer { Task { await database.close() } }
        let values = ["plain", "a\"b", "c\\d", "e,f", "{g}", "NULL", "", " h ", "ü", "\\\"", "x", "q\"\u{301}", "b\\\u{301}", "\u{301}"]
        let chosen = [values[1], values[2], values[3], values[4], values[5], values[6], values[7], values[9], values[11], values[12]]
        let found = try await database.transaction { db -> [String] in
            try db.query("CREATE TABLE membership_probe (value TEXT NOT NULL)", [])
            for value in values { try db.query("INSERT INTO membership_probe (value) VALUES (?)", [value]) }
            let (condition, parameters) = database.dialect.membership("value", in: chosen)
            return try db.query("SELECT value FROM membership_probe WHERE " + condition, parameters).compactMap { $0.string("value") }
        }
        #expect(found.sorted() == chosen.sorted())
    }

    @Test("Each pass of the receipts' sweep reads about as much at the end of a long drain as at its start (SQLite)")
    func sweepDoesNotGrow() async throws {
        let scratch = try await SQLiteScratch("sweep")
        defer { scratch.remove() }
        let (database, store) = (scratch.database, scratch.store)
        let count = 20_000
        _ = try await database.transaction { db in
            for index in 0..<count {
                // Every hundredth job still waits: its receipt stays.
                try JobCountsTests.insertJob(db, id: String(format: "job-%06d", index), state: index % 100 == 0 ? "pending" : "verified",
                                             order: index, user: "u\(index)")
                try db.query("INSERT INTO verification_receipts (job_id, receipt_data) VALUES (?, ?)",
                             [String(format: "job-%06d", index), String(repeating: "M", count: 200)])
            }
        }
        var (after, passes, dropped) = ("", [Int](), 0)
        while true {
            let before = try await database.pagesTouched()
            let pass = try await store.dropSettledReceipts(after: after, limit: 1_000)
            passes.append(try await database.pagesTouched() - before)
            dropped += pass.dropped
            guard pass.dropped == 1_000, let last = pass.last else { break }
            after = last
        }
        #expect(dropped == count - count / 100)
        let left = try await database.read { db in try db.query("SELECT COUNT(*) AS n FROM verification_receipts", []).first?.int("n") }
        #expect(left == Int64(count / 100))
        // Led by the jobs' index on the state, the last passes walked the 19,000 verified jobs of the earlier ones again.
        let full = passes.dropLast()
        #expect(full.count == 19 && full.max()! < 2 * full.min()!, "\(passes)")
    }
}
