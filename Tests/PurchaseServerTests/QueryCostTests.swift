import Foundation
@testable import PurchaseServer
import PostgresStorage
import SQLiteStorage
import Storage
import StorekeeperTesting
import Testing

/// Work that must not grow with what else the database holds.
@Suite("Query cost")
struct QueryCostTests {
    @Test("Checking the leases of a settlement batch reads those jobs only, not every job being verified")
    func leasesReadTheirJobsOnly() async throws {
        let scratch = try await SQLiteScratch("cost")
        defer { scratch.remove() }
        let (database, store) = (scratch.database, scratch.store)
        // Thousands of jobs being verified, each with a receipt of a real one's size, as while Apple is slow.
        let receipt = String(repeating: "MIIQTgYJKoZIhvcNAQcCoIIQPzCCEDsCAQExDzAN", count: 140)
        let now = Date()
        let jobs = (0..<3_000).map { store.newJob(appId: "com.example.app", appUserId: "user-\($0)", kind: .purchase, receiptData: receipt, now: now) }
        try await store.insert(jobs)
        let claimed = try await store.database.transaction { db in
            try store.jobs(db).claim(owner: "worker", limit: 3_000, leaseUntil: now.milliseconds + 60_000, now: now.milliseconds + 1).count
        }
        #expect(claimed == 3_000)
        // A batch of 64 (about 320 pages): with `state = 'verifying'` in the statement, SQLite (without statistics)
        // chose the index on the state and read all 3,000 jobs with their receipts to find them (about 1,600 pages).
        let batch = Array(jobs.shuffled().prefix(64).map(\.id))
        let before = try await database.pagesTouched()
        let leases = try await store.database.transaction { db in try store.jobs(db).leases(batch) }
        let touched = try await database.pagesTouched() - before
        #expect(leases.count == 64 && leases.values.allSatisfy { $0 == "worker" })
        #expect(touched < 64 * 8, "\(touched) pages for 64 jobs")
    }

    /// Opens a server that refuses every call to Apple on `database` (applying every migration) and returns its store.
    static func migrate(_ database: any SQLDatabase) async throws -> PurchaseStore {
        let configuration = PurchaseServer.Configuration(trust: TrustStore(certificates: []), endpoints: .apple,
                                                         transport: RefusingTransport(), adminKey: "sk_admin_test_key_0000")
        return try await PurchaseServer.open(database: database, configuration: configuration).store
    }

    /// A fresh database of `engine` with every migration applied.
    /// The engine's plan of `query`, as text; on PostgreSQL with sequential scans off (an empty table is read whole otherwise).
    static func plan(_ query: String, in database: any SQLDatabase) async throws -> String {
        try await database.transaction { db -> String in
            if database.dialect == .postgres {
                _ = try db.query("SET LOCAL enable_seqscan = off", [])
                return try db.query("EXPLAIN " + query, []).compactMap { $0.string("QUERY PLAN") }.joined(separator: "\n")
            }
            return try db.query("EXPLAIN QUERY PLAN " + query, []).compactMap { $0.string("detail") }.joined(separator: "\n")
        }
    }

    static func migratedDatabase(_ engine: Engine) async throws -> any SQLDatabase {
        let database = try await engine.makeDatabase()
        _ = try await migrate(database)
        return database
    }

    @Test("No index is the start of another index on the same table: every index costs each insert a write", arguments: Engine.available)
    func noRedundantIndexes(engine: Engine) async throws {
        let database = try await Self.migratedDatabase(engine)
        let indexes = try await database.transaction { db in try CatalogIndex.all(db, dialect: database.dialect) }
        // The catalog read sees columns in order, and keys (ownership's primary key) as well as plain indexes.
        #expect(indexes.contains { $0.name == "ownership_by_user" && $0.columns == ["app_id", "app_user_id", "environment", "original_transaction_id"] },
                "\(indexes)")
        #expect(indexes.contains { $0.table == "ownership" && $0.unique && $0.columns == ["app_id", "environment", "original_transaction_id", "app_user_id"] },
                "\(indexes)")
        // A unique index enforces something even when it repeats another; any other index must add something.
        for index in indexes where !index.unique {
            let covering = indexes.filter { other in
                other.table == index.table && other.name != index.name && other.columns.count >= index.columns.count
                    && Array(other.columns.prefix(index.columns.count)) == index.columns
            }
            #expect(covering.isEmpty, "\(index.name) on \(index.table) (\(index.columns)) is the start of \(covering.map(\.name))")
        }
        await database.close()
    }
}

extension QueryCostTests {
    /// Statements on hot or growing paths, each with the index that must serve it.
    static let servedStatements: [(what: String, query: String, index: String)] = [
        // The claim's branch for expired leases, as `JobRepository.claim` writes it: the index of the jobs in flight.
        ("expired leases", "SELECT id, next_attempt_at FROM verification_jobs WHERE state = 'verifying' AND lease_expires_at <= 5 ORDER BY lease_expires_at LIMIT 10",
         "verification_jobs_lapsing"),
        // A transaction's appAccountToken finds its user without a scan of the app's users: by the primary key, and
        // among ids in mixed case by the index that holds only those.
        ("a user by token", bound(UserRepository.userByToken, ["'com.example.app'", "'6b3f1d2e-4c5a-4e8f-9a7b-0c1d2e3f4a5b'",
                                                                "'6B3F1D2E-4C5A-4E8F-9A7B-0C1D2E3F4A5B'", "'com.example.app'",
                                                                "'6b3f1d2e-4c5a-4e8f-9a7b-0c1d2e3f4a5b'"]),
         "users_by_mixed_case_id"),
        // The gauges of GET /metrics read one index entry each, not every notification or pending delivery.
        ("the newest notification", HealthRepository.newestNotificationSQL, "apple_notifications_received"),
        ("the oldest pending delivery", HealthRepository.oldestPendingDeliverySQL, "webhook_deliveries_pending"),
    ]

    @Test("A customer's notifications are read through their subscriptions' chains, not by walking every notification of the app",
          arguments: Engine.available)
    func customerNotificationsThroughChains(engine: Engine) async throws {
        let database = try await Self.migratedDatabase(engine)
        let app = "com.example.app", day: Int64 = 86_400_000
        try await database.transaction { db in
            // 3,000 notifications of 1,000 other customers' subscriptions, newer than the customer's two.
            for index in 0..<3_000 {
                try db.query("""
                    INSERT INTO apple_notifications (notification_uuid, app_id, notification_type, environment, signed_date, received_at,
                    original_transaction_id, state, signed_payload) VALUES (?, ?, 'DID_RENEW', 'Production', 0, ?, ?, 'verified', '')
                    """, ["other-\(index)", app, 10 * day + Int64(index), "9\(index % 1_000)"])
            }
            for (index, original) in ["100", "100", "200"].enumerated() {
                try db.query("""
                    INSERT INTO apple_notifications (notification_uuid, app_id, notification_type, environment, signed_date, received_at,
                    original_transaction_id, state, signed_payload) VALUES (?, ?, 'DID_RENEW', 'Production', 0, ?, ?, 'verified', '')
                    """, ["mine-\(index)", app, day * Int64(index + 1), original])
            }
            for original in ["100", "200"] {
                try db.query("INSERT INTO ownership (app_id, environment, original_transaction_id, app_user_id, product_id, granted_at) VALUES (?, 'Production', ?, 'customer', 'p', 0)",
                             [app, original])
            }
            for index in 0..<1_000 {
                try db.query("INSERT INTO ownership (app_id, environment, original_transaction_id, app_user_id, product_id, granted_at) VALUES (?, 'Production', ?, ?, 'p', 0)",
                             [app, "9\(index)", "other-\(index)"])
            }
        }
        // PostgreSQL plans from statistics, which autovacuum keeps on an established database; SQLite has none.
        if engine == .postgres { _ = try await database.transaction { db in try db.query("ANALYZE apple_notifications, ownership") } }
        let plan = try await Self.plan(Self.bound(CustomerRepository.notificationsSQL, ["'\(app)'", "'customer'", "\(Int64.max)", "50"]), in: database)
        #expect(plan.contains("apple_notifications_chain"), "\(plan)")
        #expect(!plan.contains("apple_notifications_by_app"), "\(plan)")
        let items = try await database.read { db in try CustomerRepository(db: db, appId: app).notifications("customer", before: Int64.max, limit: 50) }
        #expect(items.map(\.id) == ["mine-2", "mine-1", "mine-0"])
        let page = try await database.read { db in try CustomerRepository(db: db, appId: app).notifications("customer", before: 2 * day, limit: 1) }
        #expect(page.map(\.id) == ["mine-1"])
        await database.close()
    }

    /// `sql` with its parameters written in, in order.
    static func bound(_ sql: String, _ values: [String]) -> String {
        var text = sql
        for value in values {
            guard let mark = text.firstIndex(of: "?") else { break }
            text.replaceSubrange(mark...mark, with: value)
        }
        return text
    }

    @Test("The admin listing of ledger rows reads each app's newest along an index, merges apps newest first, and narrows to a user",
          arguments: Engine.available)
    func ledgerListing(engine: Engine) async throws {
        let database = try await Self.migratedDatabase(engine)
        let apps = ["com.example.a", "com.example.b", "com.example.c"]
        try await database.transaction { db in
            // 600 rows: the app of row i is i % 3 (c has none past the first 30), its user i % 7, recorded at i * 10 ms but
            // written in a shuffled order, so neither the primary key nor insertion order gives the answer.
            for index in (0..<600).shuffled() where index % 3 != 2 || index < 90 {
                try db.query("""
                    INSERT INTO ledger (environment, transaction_id, app_id, app_user_id, product_id, product_type, quantity, purchase_date,
                    original_transaction_id, source, verification_id, is_trial, recorded_at)
                    VALUES ('Production', ?, ?, ?, 'coins', 'Consumable', 1, 0, ?, 'receipt', 'v', 0, ?)
                    """, ["t\(index)", apps[index % 3], "user-\(index % 7)", "t\(index)", Int64(index) * 10])
            }
        }
        if engine == .postgres { _ = try await database.transaction { db in try db.query("ANALYZE ledger") } }
        // One app's rows from the end of an index, nothing read past the page and nothing sorted; one user's through
        // theirs (PostgreSQL may sort a user's few rows rather than walk the index: its statistics say how few).
        for (filter, index) in [("", "ledger_recorded"), (" AND app_user_id = 'user-3'", "ledger_user_recorded")] {
            let plan = try await Self.plan("SELECT * FROM ledger WHERE app_id = 'com.example.a'\(filter) ORDER BY recorded_at DESC LIMIT 100",
                                           in: database)
            #expect(plan.contains(index), "\(plan)")
            if filter.isEmpty { #expect(!plan.lowercased().contains("temp b-tree") && !plan.contains("Sort"), "no sort of the app's rows: \(plan)") }
        }
        #expect(try await database.read { db in try LedgerReader(db: db).appsInLedger() } == apps)

        func listed(_ app: String?, _ user: String?, _ limit: Int) async throws -> [String] {
            try await database.snapshotRead { db in try LedgerReader(db: db).rows(appId: app, appUserId: user, limit: limit) }.compactMap { $0["transaction_id"] }
        }
        let written = (0..<600).filter { $0 % 3 != 2 || $0 < 90 }
        func expected(_ keep: (Int) -> Bool, _ limit: Int) -> [String] { written.filter(keep).sorted(by: >).prefix(limit).map { "t\($0)" } }
        #expect(try await listed("com.example.a", nil, 25) == expected({ $0 % 3 == 0 }, 25))
        #expect(try await listed("com.example.b", "user-3", 10) == expected({ $0 % 3 == 1 && $0 % 7 == 3 }, 10))
        // Without an app: every app the ledger holds, newest first (c's rows are older than the first 50 of the others).
        #expect(try await listed(nil, nil, 50) == expected({ _ in true }, 50))
        #expect(try await listed(nil, nil, 1_000) == expected({ _ in true }, 1_000))
        #expect(try await listed(nil, "user-5", 40) == expected({ $0 % 7 == 5 }, 40))
        #expect(try await listed("com.example.none", nil, 10).isEmpty)
        // On PostgreSQL the page's statements share one snapshot.
        if engine == .postgres {
            let isolation = try await database.snapshotRead { db in try db.query("SHOW transaction_isolation").first?.string("transaction_isolation") }
            #expect(isolation == "repeatable read")
        }
        // The merge keeps the page's rows before the next app's at equal times, and stops at the page's size.
        let merged = LedgerReader.merged([(5, "a1"), (3, "a2")], [(5, "b1"), (4, "b2"), (1, "b3")], limit: 4).map(\.row)
        #expect(merged == ["a1", "b1", "b2", "a2"])
        await database.close()
    }

    @Test("An appAccountToken names the user whose id is its UUID in lower, upper or mixed case, and nobody when two ids differ only in case, without a scan of the app's users",
          arguments: Engine.available)
    func userByToken(engine: Engine) async throws {
        let database = try await Self.migratedDatabase(engine)
        let app = "com.example.app"
        let lower = UUID(), upper = UUID(), missing = UUID(), twice = UUID(), digits = UUID(uuidString: "12345678-1234-4234-8234-123456789012")!
        let mixed = UUID(uuidString: "6B3F1D2E-4C5A-4E8F-9A7B-0C1D2E3F4A5B")!, mixedId = "6b3F1d2E-4c5a-4E8f-9A7b-0c1D2e3F4a5B"
        try await database.transaction { db in
            for (user, appId) in [(lower.uuidString.lowercased(), app), (upper.uuidString, app), (mixedId, app),
                                  (digits.uuidString, app), (missing.uuidString.lowercased(), "com.example.other"), ("alice", app),
                                  (twice.uuidString, app), (twice.uuidString.lowercased(), app)] {
                try db.query("INSERT INTO users (app_id, app_user_id, flagged, created_at) VALUES (?, ?, 0, 0)", [appId, user])
            }
            // Other customers, so that a scan would have something to read.
            for _ in 0..<500 {
                try db.query("INSERT INTO users (app_id, app_user_id, flagged, created_at) VALUES (?, ?, 0, 0)", [app, UUID().uuidString])
            }
        }
        let found = try await database.read { db in
            let users = UserRepository(db: db, appId: app)
            return try [lower, upper, mixed, digits, missing, twice].map { try users.user(uuid: $0) }
        }
        #expect(found == [lower.uuidString.lowercased(), upper.uuidString, mixedId, digits.uuidString, nil, nil])
        let plan = try await Self.plan(Self.bound(UserRepository.userByToken, ["'\(app)'", "'\(lower.uuidString.lowercased())'", "'\(lower.uuidString)'",
                                                                                 "'\(app)'", "'\(lower.uuidString.lowercased())'"]), in: database)
        #expect(plan.contains("users_by_mixed_case_id") && !plan.contains("SCAN users") && !plan.contains("Seq Scan"), "\(plan)")
        #expect(!plan.contains("(app_id=?)"), "\(plan)")  // not every id of the app, in the primary key's order
        // Migration 25's index, which every new customer wrote, is gone.
        let old = try await database.read { db in
            try db.query(database.dialect == .postgres ? "SELECT indexname FROM pg_indexes WHERE indexname = 'users_by_token' AND schemaname = current_schema()"
                                                       : "SELECT name FROM sqlite_master WHERE type = 'index' AND name = 'users_by_token'")
        }
        #expect(old.isEmpty)
        await database.close()
    }

    @Test("Expired leases, a user by appAccountToken and the gauges of GET /metrics are each found through their index, not a scan",
          arguments: Engine.available)
    func statementsUseTheirIndex(engine: Engine) async throws {
        let database = try await Self.migratedDatabase(engine)
        for statement in Self.servedStatements {
            let plan = try await Self.plan(statement.query, in: database)
            #expect(plan.contains(statement.index), "\(statement.what): \(plan)")
        }
        await database.close()
    }
}

/// An index read from the database's catalog, with its key columns in order: every index of this schema that has no
/// `WHERE` and no expression among its keys (those are left out), keys and unique constraints included.
struct CatalogIndex: CustomStringConvertible {
    let name: String, table: String, columns: [String], unique: Bool
    var description: String { "\(table).\(name)(\(columns.joined(separator: ", ")))\(unique ? " unique" : "")" }

    static func all(_ db: any SQLConnection, dialect: SQLDialect) throws -> [CatalogIndex] {
        if dialect == .postgres {
            // Key columns only (`indnkeyatts`: `INCLUDE` columns come after them).
            return try db.query("""
                SELECT c.relname AS name, t.relname AS tbl, CASE WHEN i.indisunique THEN 1 ELSE 0 END AS is_unique,
                    array_to_string(ARRAY(
                        SELECT a.attname FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
                        JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
                        WHERE k.n <= i.indnkeyatts ORDER BY k.n), ',') AS columns
                FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid
                WHERE t.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
                    AND i.indpred IS NULL AND i.indexprs IS NULL
                """, []).map { CatalogIndex(name: $0.string("name") ?? "", table: $0.string("tbl") ?? "",
                                             columns: ($0.string("columns") ?? "").split(separator: ",").map(String.init),
                                             unique: $0.int("is_unique") == 1) }
        }
        var indexes: [CatalogIndex] = []
        for table in try db.query("SELECT name FROM sqlite_master WHERE type = 'table'", []).compactMap({ $0.string("name") }) {
            for row in try db.query("SELECT name, \"unique\" AS is_unique FROM pragma_index_list(?) WHERE partial = 0", [table]) {
                guard let name = row.string("name") else { continue }
                // An expression among the keys has no column name.
                let keys = try db.query("SELECT name FROM pragma_index_info(?) ORDER BY seqno", [name]).map { $0.string("name") }
                guard !keys.isEmpty, keys.allSatisfy({ $0 != nil }) else { continue }
                indexes.append(CatalogIndex(name: name, table: table, columns: keys.compactMap { $0 }, unique: row.int("is_unique") == 1))
            }
        }
        return indexes
    }
}

/// PostgreSQL's planner statistics of young tables (`PlannerStatistics`).
@Suite("Planner statistics", .enabled(if: Engine.available.contains(.postgres)))
struct PlannerStatisticsTests {
    /// A server's store on a new schema whose job queue has just grown from empty to 3,000 jobs.
    static func storeWithYoungQueue() async throws -> (any SQLDatabase, PurchaseStore) {
        let database = try await Engine.postgres.makeDatabase()
        let store = try await QueryCostTests.migrate(database)
        // Autovacuum analyzes a table that grew within its next round (a minute): on a busy machine it could analyze this
        // one between a test's look and the server's, leaving nothing stale. The tests are about the server's analyses.
        _ = try await database.transaction { db in try db.query("ALTER TABLE verification_jobs SET (autovacuum_enabled = false)") }
        let now = Date()
        try await store.insert((0..<3_000).map { store.newJob(appId: "com.example.app", appUserId: "user-\($0)", kind: .purchase, receiptData: "r\($0)", now: now) })
        return (database, store)
    }

    @Test("A watched table that grew from empty is analyzed, and not again while its statistics are fresh; small and unwatched tables never")
    func youngTablesAreAnalyzed() async throws {
        let (database, store) = try await Self.storeWithYoungQueue()
        defer { Task { await database.close() } }
        func analyzed() async throws -> Set<String> {
            Set(try await database.read { db in
                try db.query("SELECT relname FROM pg_stat_user_tables WHERE schemaname = current_schema() AND last_analyze IS NOT NULL")
                    .compactMap { $0.string("relname") }
            })
        }
        // The counts reach PostgreSQL's statistics views within about a second of the commit (at most ten).
        var refreshed: [String] = []
        try await TestSupport.eventually(within: .seconds(20), every: .milliseconds(500)) {
            refreshed = try await store.refreshPlannerStatistics()
            return refreshed.contains("verification_jobs")
        }
        #expect(refreshed.contains("verification_jobs"))
        let after = try await analyzed()
        #expect(after.contains("verification_jobs"))
        // Unwatched tables, however large (the receipts), and watched ones under the minimum (the ledger, empty), are not.
        #expect(!after.contains("verification_receipts") && !after.contains("ledger"), "analyzed: \(after.sorted())")
        // Fresh now: not analyzed again.
        #expect(!(try await store.refreshPlannerStatistics()).contains("verification_jobs"))
    }

    @Test("Processes that find a young table stale at the same moment analyze it once between them")
    func oneAnalysisAcrossProcesses() async throws {
        let (database, store) = try await Self.storeWithYoungQueue()
        defer { Task { await database.close() } }
        var stale = false
        try await TestSupport.eventually(within: .seconds(20), every: .milliseconds(500)) {
            stale = try await database.read { db in try PlannerStatistics(db: db).staleTables() }.contains { $0.table == "verification_jobs" }
            return stale
        }
        #expect(stale)
        // Three more processes on the same schema, each with its own connections.
        let schema = try #require(try await database.read { db in try db.query("SELECT current_schema() AS name").first?.string("name") })
        let base = try #require(ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES"])
        let stores = try (0..<3).map { _ in
            PurchaseStore(database: try PostgresDatabase(url: base + (base.contains("?") ? "&" : "?") + "options=-csearch_path%3D\(schema)", size: 2))
        }
        let analyses = try await withThrowingTaskGroup(of: Int.self) { group in
            for other in stores + [store] {
                group.addTask { try await other.refreshPlannerStatistics().filter { $0 == "verification_jobs" }.count }
            }
            return try await group.reduce(0, +)
        }
        #expect(analyses == 1)
        for other in stores { await other.database.close() }
    }
}

/// A migrated store on an SQLite file of its own (a write-ahead log, reading connections beside the writer), for tests
/// that need a file rather than memory; `remove()` deletes the file and its log.
struct SQLiteScratch {
    let path: String
    let database: SQLiteSQLDatabase
    let store: PurchaseStore

    init(_ name: String) async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("\(name)-\(UUID().uuidString).sqlite").path
        self.path = path
        do {
            database = try SQLiteSQLDatabase(path: path)
            store = try await QueryCostTests.migrate(database)
        } catch {
            Self.remove(path)
            throw error
        }
    }

    func remove() { Self.remove(path) }

    private static func remove(_ path: String) {
        for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) }
    }
}
