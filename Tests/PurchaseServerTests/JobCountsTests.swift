import Foundation
@testable import PurchaseServer
import PostgresStorage
import SQLiteStorage
import Storage
import Testing

/// Counting and listing jobs reads what waits and what is asked for, never every job ever uploaded: jobs are kept,
/// and `GET /metrics`, the console and the admin list ask often.
@Suite("Job counts and lists")
struct JobCountsTests {
    /// Each state's count read from every job, the oracle the running totals must equal.
    static func countedByReading(_ database: any SQLDatabase) async throws -> [String: Int64] {
        try await database.transaction { db in
            var counts: [String: Int64] = [:]
            for row in try db.query("SELECT state, COUNT(*) AS n FROM verification_jobs GROUP BY state", []) {
                counts[row.string("state") ?? ""] = row.int("n") ?? 0
            }
            return counts
        }
    }

    /// A migrated store of `engine` with `count` new jobs, all claimed by "worker".
    static func storeWithClaimedJobs(_ engine: Engine, count: Int, now: Date) async throws -> (any SQLDatabase, PurchaseStore, [VerificationJob]) {
        let database = try await engine.makeDatabase()
        let store = PurchaseStore(database: database)
        try await store.migrate()
        let jobs = (0..<count).map { store.newJob(appId: "com.example.coins", appUserId: "u\($0)", kind: .purchase, receiptData: "r\($0)", now: now) }
        try await store.insert(jobs)
        #expect(try await store.claim(owner: "worker", limit: count, lease: 30, now: now).count == count)
        return (database, store, jobs)
    }

    /// Settles `jobs` in one transaction as a settlement batch does: each job's outcome, then their receipts and the totals, last.
    static func settle(_ jobs: some Collection<VerificationJob>, as states: [JobState], _ store: PurchaseStore, now: Date) async throws {
        let jobs = Array(jobs)
        try await store.database.transaction { db in
            for (job, state) in zip(jobs, states) {
                try store.jobs(db).settle(job.id, state: state, reason: nil, environment: "Sandbox", result: "{}", receiptSHA256: nil,
                                          now: now.milliseconds)
            }
            try store.jobs(db).closeSettled(zip(jobs, states).map { ($0.id, $1) })
        }
    }

    /// `counts` without the states no job is in (the oracle has no row for them, the store answers 0 for the queue's).
    static func nonZero(_ counts: [String: Int64]) -> [String: Int64] { counts.filter { $0.value != 0 } }

    /// A job of com.example.coins written as it is stored, in `state`, uploaded and due at `order` (ms since 1970).
    static func insertJob(_ db: any SQLConnection, id: String, state: String, order: Int, user: String = "alice") throws {
        try db.query("""
            INSERT INTO verification_jobs (id, app_id, app_user_id, kind, state, attempts, next_attempt_at, created_at, updated_at)
            VALUES (?, 'com.example.coins', ?, 'purchase', ?, 1, ?, ?, ?)
            """, [id, user, state, order, order, order])
    }

    @Test("Counts per state equal a count of every job: jobs settled before the totals existed, refused at upload, rejected, settled, dead, replayed",
          arguments: Engine.available)
    func countsEqualTheJobs(engine: Engine) async throws {
        let database = try await engine.makeDatabase()
        defer { Task { await database.close() } }
        // A database from before the totals, with jobs settled, dead and waiting.
        try await database.migrate(Schema.migrations.filter { $0.version < 24 })
        _ = try await database.transaction { db in
            for (index, state) in ["verified", "verified", "verified", "rejected", "rejected", "dead", "pending"].enumerated() {
                try Self.insertJob(db, id: "old-\(index)", state: state, order: index)
            }
        }
        let store = PurchaseStore(database: database)
        try await store.migrate()
        #expect(try await store.jobCounts() == ["verified": 3, "rejected": 2, "dead": 1, "pending": 1, "verifying": 0, "timed_out": 0])

        let now = Date()
        _ = try await store.enqueue(appId: "com.example.coins", appUserId: "bob", kind: .purchase, receiptData: "not a receipt",
                                    rejection: ReceiptRejection(code: "malformed_receipt", reason: "not Base64"), now: now)
        var uploaded: [VerificationJob] = []
        for index in 0..<6 {
            uploaded.append(try await store.enqueue(appId: "com.example.coins", appUserId: "u\(index)", kind: .purchase, receiptData: "receipt-\(index)",
                                                    now: now))
        }
        let claimed = try await store.claim(owner: "worker", limit: 10, lease: 30, now: now)
        #expect(Set(claimed.map(\.id)) == Set(uploaded.map(\.id) + ["old-6"]))
        let last = uploaded[5]
        let byId = Dictionary(uniqueKeysWithValues: claimed.map { ($0.id, $0) })
        let (first, second, third, fourth, fifth) = (byId[uploaded[0].id]!, byId[uploaded[1].id]!, byId[uploaded[2].id]!, byId[uploaded[3].id]!,
                                                     byId[uploaded[4].id]!)
        // Two settlements in one transaction, as a batch is written; one rejected by the worker; one dead, one retried.
        try await Self.settle([first, second], as: [.verified, .rejected], store, now: now)
        try await store.reject(third, owner: "worker", code: "test", reason: "a test rejection", environment: nil, now: now)
        // A rejection by a worker that lost the lease changes nothing and counts nothing.
        try await store.reject(fifth, owner: "another worker", code: "test", reason: "not its job", environment: nil, now: now)
        try await store.reschedule(fourth, owner: "worker", reason: "gave up", timedOut: false, nextAttempt: now, dead: true, now: now)
        try await store.reschedule(fifth, owner: "worker", reason: "Apple timed out", timedOut: true, nextAttempt: now.addingTimeInterval(60),
                                   dead: false, now: now)
        #expect(Self.nonZero(try await store.jobCounts()) == (try await Self.countedByReading(database)))
        #expect(try await store.jobCounts() == ["verified": 4, "rejected": 5, "dead": 2, "pending": 0, "verifying": 2, "timed_out": 1])

        // A batch whose transaction fails adds nothing.
        await #expect(throws: (any Error).self) {
            try await database.transaction { db in
                try store.jobs(db).settle(last.id, state: .verified, reason: nil, environment: "Sandbox", result: "{}", receiptSHA256: nil,
                                          now: now.milliseconds)
                try store.jobs(db).closeSettled([(last.id, .verified)])
                _ = try db.query("SELECT * FROM no_such_table", [])
            }
        }
        // Replayed dead jobs wait again.
        #expect(try await store.replay(ids: nil, now: now) == 2)
        #expect(Self.nonZero(try await store.jobCounts()) == (try await Self.countedByReading(database)))
        #expect(try await store.jobCounts()["pending"] == 2)
    }

    @Test("Settlements on many connections at once add up exactly, each transaction to its connection's row", arguments: Engine.available)
    func concurrentSettlementsAddUp(engine: Engine) async throws {
        let now = Date()
        let (database, store, jobs) = try await Self.storeWithClaimedJobs(engine, count: 200, now: now)
        defer { Task { await database.close() } }
        // Twenty batches of ten, all at once (four connections on PostgreSQL).
        try await withThrowingTaskGroup(of: Void.self) { group in
            for batch in jobs.chunked(10) {
                group.addTask { try await Self.settle(batch, as: batch.indices.map { $0 % 5 == 0 ? .rejected : .verified }, store, now: now) }
            }
            try await group.waitForAll()
        }
        #expect(try await store.jobCounts() == ["verified": 160, "rejected": 40, "dead": 0, "pending": 0, "verifying": 0, "timed_out": 0])
        let rows = try await database.transaction { db in try db.query("SELECT shard FROM state_totals WHERE state = 'verified'", []).count }
        if engine == .postgres { #expect(rows > 1, "the additions of concurrent transactions went to one row") }
    }

    @Test("Lists read each state's latest jobs by the index on the state, newest first, one app's among them", arguments: Engine.available)
    func listsAreLatestFirst(engine: Engine) async throws {
        let database = try await engine.makeDatabase()
        defer { Task { await database.close() } }
        let store = PurchaseStore(database: database)
        try await store.migrate()
        // Every state is named, 0 when no job is in it (no total exists yet).
        #expect(try await store.jobCounts() == ["verified": 0, "rejected": 0, "dead": 0, "pending": 0, "verifying": 0, "timed_out": 0])
        #expect(try await store.webhookDeliveryCounts() == ["pending": 0, "delivered": 0, "failed": 0])
        let start = Date(timeIntervalSince1970: 1_800_000_000)
        var jobs: [VerificationJob] = []
        for index in 0..<30 {
            var job = store.newJob(appId: index % 3 == 0 ? "com.example.other" : "com.example.coins", appUserId: "u\(index)", kind: .purchase,
                                   receiptData: "r\(index)", now: start.addingTimeInterval(Double(index)))
            job.state = [JobState.pending, .timedOut, .dead, .rejected][index % 4]
            if job.state == .rejected { job.receiptData = "" }
            jobs.append(job)
        }
        try await store.insert(jobs.filter { $0.state == .pending || $0.state == .rejected })
        // Timed-out and dead jobs, as the worker leaves them.
        let written = jobs
        _ = try await database.transaction { db in
            for job in written where job.state == .timedOut || job.state == .dead {
                try db.query("""
                    INSERT INTO verification_jobs (id, app_id, app_user_id, kind, state, attempts, next_attempt_at, created_at, updated_at)
                    VALUES (?, ?, ?, 'purchase', ?, 1, ?, ?, ?)
                    """, [job.id, job.appId, job.appUserId, job.state.rawValue, job.nextAttemptAt.milliseconds, job.createdAt.milliseconds,
                          job.createdAt.milliseconds])
            }
        }
        let newestFirst = jobs.reversed().map(\.id)
        #expect(try await store.jobs(state: nil, limit: 100).map(\.id) == newestFirst)
        #expect(try await store.jobs(state: nil, limit: 7).map(\.id) == Array(newestFirst.prefix(7)))
        #expect(try await store.jobs(state: .dead, limit: 3).map(\.id) == Array(jobs.reversed().filter { $0.state == .dead }.prefix(3).map(\.id)))
        let coins = jobs.reversed().filter { $0.appId == "com.example.coins" }
        #expect(try await store.jobs(appId: "com.example.coins", state: nil, limit: 5).map(\.id) == Array(coins.prefix(5).map(\.id)))
        #expect(try await store.jobs(appId: "com.example.coins", state: .timedOut, limit: 100).map(\.id)
                == coins.filter { $0.state == .timedOut }.map(\.id))
        #expect(try await store.jobs(appId: "com.example.none", state: nil, limit: 100).isEmpty)
    }

    @Test("Counting jobs and listing the latest read about as much with 20,000 settled jobs as with 2,000")
    func countsAndListsDoNotGrowWithTheJobs() async throws {
        let scratch = try await SQLiteScratch("counts")
        defer { scratch.remove() }
        let (database, store) = (scratch.database, scratch.store)
        var pages: [[Int]] = []
        var settled = 0
        for target in [2_000, 20_000] {
            // Settled jobs with a result each, as the worker leaves them.
            let first = settled
            _ = try await database.transaction { db in
                for index in first..<target {
                    try db.query("""
                        INSERT INTO verification_jobs (id, app_id, app_user_id, kind, state, attempts, next_attempt_at, created_at, updated_at, result)
                        VALUES (?, ?, ?, 'purchase', ?, 1, ?, ?, ?, ?)
                        """, ["job-\(index)", index % 2 == 0 ? "com.example.coins" : "com.example.other", "u\(index)",
                              index % 10 == 0 ? "rejected" : "verified", index, index, index, String(repeating: "r", count: 300)])
                }
            }
            settled = target
            var touched: [Int] = []
            for read in [{ _ = try await store.jobCounts() }, { _ = try await store.jobs(state: nil, limit: 50) },
                         { _ = try await store.jobs(state: .verified, limit: 50) },
                         { _ = try await store.jobs(appId: "com.example.coins", state: nil, limit: 50) }] as [() async throws -> Void] {
                let before = try await database.pagesTouched()
                try await read()
                touched.append(try await database.pagesTouched() - before)
            }
            pages.append(touched)
        }
        // Page lookups: reading every job of 20,000 (their table is about 1,700 pages) or every entry of the index on the
        // state (about 150) grows tenfold with the jobs; reading the latest 50 of each state grows by one level of the
        // table's tree per row read.
        for (small, large) in zip(pages[0], pages[1]) {
            #expect(large < 400 && large < 2 * small + 10, "\(pages)")
        }
    }

    @Test("PostgreSQL reads each state's latest jobs backwards along the index on the state, with or without an app",
          .enabled(if: Engine.available.contains(.postgres)))
    func listPlanOnPostgres() async throws {
        let database = try await Engine.postgres.makeDatabase()
        defer { Task { await database.close() } }
        _ = try await QueryCostTests.migrate(database)
        for appId in [nil, "com.example.coins"] {
            let plan = try await database.transaction { db -> String in
                let (sql, parameters) = JobRepository.listStatement(appId: appId, state: nil, limit: 100)
                _ = try db.query("SET LOCAL enable_seqscan = off", [])  // an empty table would be read whole otherwise
                return try db.query("EXPLAIN " + sql, parameters).compactMap { $0.string("QUERY PLAN") }.joined(separator: "\n")
            }
            let backwards = plan.components(separatedBy: "Index Scan Backward using verification_jobs_due").count - 1
            #expect(backwards == JobState.allCases.count && !plan.contains("Seq Scan") && !plan.contains("Bitmap"), "\(plan)")
        }
    }

    @Test("Processes starting at once on a new PostgreSQL schema take turns at the migrations, and all start",
          .enabled(if: Engine.available.contains(.postgres)))
    func concurrentMigrations() async throws {
        let first = try await Engine.postgres.makeDatabase()
        defer { Task { await first.close() } }
        // Four more pools on the same schema, as four processes would have.
        let url = try await first.transaction { db in try db.query("SELECT current_schema() AS s", []).first?.string("s") ?? "" }
        let base = ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES"]!
        let separator = base.contains("?") ? "&" : "?"
        let others = try (0..<4).map { _ in try PostgresDatabase(url: base + separator + "options=-csearch_path%3D\(url)", size: 1) }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for database in others + [first] { group.addTask { try await PurchaseStore(database: database).migrate() } }
            try await group.waitForAll()
        }
        for database in others { await database.close() }
        let versions = try await first.transaction { db in try db.query("SELECT version FROM schema_migrations", []).count }
        #expect(versions == Schema.migrations.count)
    }

    @Test("One app's dead jobs are all listed however many newer dead jobs other apps have; its settled ones among each state's latest")
    func appListsFindEveryWaitingJob() async throws {
        let database = try await Engine.sqlite.makeDatabase()
        defer { Task { await database.close() } }
        let store = PurchaseStore(database: database)
        try await store.migrate()
        let window = JobRepository.appListWindow
        _ = try await database.transaction { db in
            let insert = """
                INSERT INTO verification_jobs (id, app_id, app_user_id, kind, state, attempts, next_attempt_at, created_at, updated_at)
                VALUES (?, ?, 'u', 'purchase', ?, 1, ?, ?, ?)
                """
            for (index, state) in ["dead", "verified"].enumerated() {
                try db.query(insert, ["small-\(state)", "com.example.small", state, index, index, index])
            }
            for index in 0..<(window + 1) {
                for state in ["dead", "verified"] {
                    try db.query(insert, ["big-\(state)-\(index)", "com.example.big", state, 10 + index, 10 + index, 10 + index])
                }
            }
        }
        #expect(try await store.jobs(appId: "com.example.small", state: .dead, limit: 10).map(\.id) == ["small-dead"])
        #expect(try await store.jobs(appId: "com.example.small", state: nil, limit: 10).map(\.id) == ["small-dead"])
        #expect(try await store.jobs(appId: "com.example.small", state: .verified, limit: 10).isEmpty)
        #expect(try await store.jobs(appId: "com.example.big", state: .verified, limit: 2).map(\.id) == ["big-verified-\(window)", "big-verified-\(window - 1)"])
    }

    @Test("A recount mends totals that drifted: counts equal the rows again, and settlements go on adding to them", arguments: Engine.available)
    func recountMendsDrift(engine: Engine) async throws {
        let now = Date()
        let (database, store, jobs) = try await Self.storeWithClaimedJobs(engine, count: 10, now: now)
        defer { Task { await database.close() } }
        try await Self.settle(jobs[0..<6], as: Array(repeating: .verified, count: 6), store, now: now)
        try await Self.settle(jobs[6..<8], as: [.rejected, .rejected], store, now: now)
        // Three settled by a process that did not count them; a redelivery it never counted, subtracted.
        _ = try await database.transaction { db in
            try db.query("UPDATE state_totals SET total = total - 3 WHERE subject = 'verification_jobs' AND state = 'verified'", [])
            try db.query("INSERT INTO state_totals (subject, state, shard, total) VALUES ('webhook_deliveries', 'delivered', 5, -2)", [])
        }
        #expect(try await store.jobCounts()["verified"] == 3)
        #expect(try await store.webhookDeliveryCounts()["delivered"] == -2)
        let (counted, deliveries) = try await store.recountTotals()
        #expect(Self.nonZero(counted) == (try await Self.countedByReading(database)))
        #expect(counted == ["verified": 6, "rejected": 2, "verifying": 2, "pending": 0, "timed_out": 0, "dead": 0])
        #expect(deliveries == ["pending": 0, "delivered": 0, "failed": 0])
        #expect(try await store.jobCounts() == counted)
        try await Self.settle(jobs[8..<10], as: [.verified, .verified], store, now: now)
        #expect(try await store.jobCounts()["verified"] == 8)
        #expect(Self.nonZero(try await store.jobCounts()) == (try await Self.countedByReading(database)))
    }

    @Test("POST /admin/v1/jobs/recount answers the counts, and only to the admin key")
    func recountRoute() async throws {
        let world = try await ServerWorld.make(.sqlite)
        defer { Task { await world.stop() } }
        let (refused, _) = try await world.client.json(.post, "/admin/v1/jobs/recount", json: [:])
        #expect(refused == 401)
        let (status, body) = try await world.client.json(.post, "/admin/v1/jobs/recount", json: [:],
                                                         headers: ["Authorization": "Bearer \(ServerWorld.adminKey)"])
        #expect(status == 200)
        #expect((body["verificationJobs"] as? [String: Any])?["verified"] as? Int == 0)
        #expect((body["webhookDeliveries"] as? [String: Any])?["delivered"] as? Int == 0)
    }

    @Test("The console's jobs page offers Replay on exactly the jobs a replay puts back in the queue")
    func replayOfferedWhereItActs() async throws {
        let database = try await Engine.sqlite.makeDatabase()
        defer { Task { await database.close() } }
        let store = PurchaseStore(database: database)
        try await store.migrate()
        _ = try await database.transaction { db in
            for (index, state) in JobState.allCases.enumerated() {
                try Self.insertJob(db, id: "job-\(state.rawValue)", state: state.rawValue, order: index)
            }
        }
        let jobs = try await store.jobs(appId: nil, state: nil, limit: 100)
        #expect(jobs.count == JobState.allCases.count)
        let session = ConsoleSession(operatorInfo: Operator(email: "a@x.io", role: .admin, hasPassword: true, createdAt: 0), csrf: "c", expiresAt: 0)
        let page = ConsolePages.jobs(.init(session: session, apps: [], appId: "", environment: nil), state: nil, jobs: jobs,
                                     counts: try await store.jobCounts()).text
        let offered = Set(jobs.map(\.id).filter { page.contains("name=\"id\" value=\"\($0)\"><button") })
        var replayed: Set<String> = []
        for job in jobs where try await store.replay(ids: [job.id], now: Date()) == 1 { replayed.insert(job.id) }
        #expect(replayed == ["job-dead", "job-timed_out"])
        #expect(offered == replayed)
    }

    @Test("POST /admin/v1/jobs/replay takes at most 1,000 ids, and replays the dead and timed-out ones among them, each once",
          arguments: Engine.available)
    func replayById(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine, startWorker: false)
        defer { Task { await world.stop() } }
        _ = try await world.server.store.database.transaction { db in
            for (index, state) in JobState.allCases.enumerated() {
                try Self.insertJob(db, id: "job-\(state.rawValue)", state: state.rawValue, order: index)
            }
        }
        let admin = ["Authorization": "Bearer \(ServerWorld.adminKey)"]
        let tooMany = (0...PurchaseStore.replayLimit).map { "job-\($0)" }
        let (refused, error) = try await world.client.json(.post, "/admin/v1/jobs/replay", json: ["ids": tooMany], headers: admin)
        #expect(refused == 400 && (error["error"] as? [String: Any])?["code"] as? String == "too_many_ids", "\(error)")
        // Every state named, one twice, among ids of no job.
        let named = JobState.allCases.map { "job-\($0.rawValue)" } + ["job-dead", "no-such-job"] + (0..<900).map { "missing-\($0)" }
        let (status, body) = try await world.client.json(.post, "/admin/v1/jobs/replay", json: ["ids": named], headers: admin)
        #expect(status == 200 && body["replayed"] as? Int == 2, "\(body)")
        let states = try await world.server.store.database.read { db in
            try db.query("SELECT id, state FROM verification_jobs", []).reduce(into: [String: String]()) { $0[$1.string("id") ?? ""] = $1.string("state") }
        }
        #expect(states == ["job-pending": "pending", "job-verifying": "verifying", "job-timed_out": "pending", "job-verified": "verified",
                           "job-rejected": "rejected", "job-dead": "pending"])
    }
}
