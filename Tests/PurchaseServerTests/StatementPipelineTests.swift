import AppStoreModels
import Clocks
import Foundation
@testable import PurchaseServer
import Storage
import Testing

/// Statements whose rows are not read (`run`) may be held and sent together (PostgreSQL pipelines them): they must
/// behave exactly as if each ran at once. And settlements of one batch, whose reads are fetched together, must
/// end exactly as if each were settled alone, in order.
@Suite("Held statements and batched settlements")
struct StatementPipelineTests {
    private func table(_ engine: Engine) async throws -> any SQLDatabase {
        try await database(engine, "CREATE TABLE items (id TEXT PRIMARY KEY, n BIGINT NOT NULL)")
    }

    /// A fresh database with these statements run in one transaction.
    private func database(_ engine: Engine, _ statements: String...) async throws -> any SQLDatabase {
        let database = try await engine.makeDatabase()
        try await database.transaction { db in for statement in statements { try db.query(statement) } }
        return database
    }

    private func count(_ database: any SQLDatabase) async throws -> Int64 {
        try await database.transaction { db in try db.query("SELECT COUNT(*) AS n FROM items").first?.int("n") ?? -1 }
    }

    @Test("Text holding a NUL is stored and read whole on SQLite, and refused on PostgreSQL (never cut short)", arguments: Engine.available)
    func textWithNUL(engine: Engine) async throws {
        let database = try await database(engine, "CREATE TABLE notes (id TEXT PRIMARY KEY, body TEXT NOT NULL)")
        defer { Task { await database.close() } }
        let body = "before\u{0}after"
        do {
            let read = try await database.transaction { db -> String? in
                try db.run("INSERT INTO notes (id, body) VALUES (?, ?)", ["a", body])
                return try db.query("SELECT body FROM notes WHERE id = ?", ["a"]).first?.string("body")
            }
            #expect(database.dialect == .sqlite && read == body)
        } catch let error as StorageError {
            #expect(database.dialect == .postgres && error.code == "text_with_nul")
            let count = try await database.transaction { db in try db.query("SELECT COUNT(*) AS n FROM notes").first?.int("n") }
            #expect(count == 0)
        }
    }

    @Test("A held statement is seen by the next query of its transaction, and commits", arguments: Engine.available)
    func heldStatementsAreSeen(engine: Engine) async throws {
        let database = try await table(engine)
        defer { Task { await database.close() } }
        let seen = try await database.transaction { db -> Int64 in
            for index in 0..<300 { try db.run("INSERT INTO items (id, n) VALUES (?, ?)", ["item-\(index)", index]) }
            try db.run("UPDATE items SET n = n + 1 WHERE id = ?", ["item-7"])
            return try db.query("SELECT n FROM items WHERE id = ?", ["item-7"]).first?.int("n") ?? -1
        }
        #expect(seen == 8)
        #expect(try await count(database) == 300)
    }

    @Test("A held statement that fails fails its transaction, and nothing of it stays", arguments: Engine.available)
    func failureRollsBack(engine: Engine) async throws {
        let database = try await table(engine)
        defer { Task { await database.close() } }
        await #expect(throws: (any Error).self) {
            try await database.transaction { db in
                try db.run("INSERT INTO items (id, n) VALUES (?, ?)", ["a", 1])
                try db.run("INSERT INTO items (id, n) VALUES (?, ?)", ["a", 2])  // a duplicate key
                try db.run("INSERT INTO items (id, n) VALUES (?, ?)", ["b", 3])
            }
        }
        #expect(try await count(database) == 0)
        // The connection is usable afterwards.
        try await database.transaction { db in try db.run("INSERT INTO items (id, n) VALUES (?, ?)", ["c", 4]) }
        #expect(try await count(database) == 1)
    }

    @Test("A read sees what was committed, statements sent together included; a failing read leaves the connection ready",
          arguments: Engine.available)
    func reads(engine: Engine) async throws {
        let database = try await table(engine)
        defer { Task { await database.close() } }
        try await database.transaction { db in
            for index in 0..<5 { try db.run("INSERT INTO items (id, n) VALUES (?, ?)", ["item-\(index)", index]) }
        }
        let together = try await database.read { db in
            try db.query(together: [SQLStatement("SELECT n FROM items WHERE id = ?", ["item-3"]), SQLStatement("SELECT COUNT(*) AS n FROM items", [])])
        }
        #expect(together.map { $0.first?.int("n") } == [3, 5])
        await #expect(throws: (any Error).self) {
            try await database.read { db in try db.query("SELECT no_such_column FROM items", []) }
        }
        // The next transaction on the same connections commits as usual, and a read sees it.
        try await database.transaction { db in try db.run("UPDATE items SET n = 30 WHERE id = ?", ["item-3"]) }
        #expect(try await database.read { db in try db.query("SELECT n FROM items WHERE id = ?", ["item-3"]).first?.int("n") } == 30)
        #expect(try await count(database) == 5)
    }

    struct Missing: Error, Equatable { let id: String }

    @Test("A held statement expected to return a row fails with the caller's error when it returns none", arguments: Engine.available)
    func expectedRow(engine: Engine) async throws {
        let database = try await table(engine)
        defer { Task { await database.close() } }
        try await database.transaction { db in try db.run("INSERT INTO items (id, n) VALUES (?, ?)", ["a", 1]) }
        await #expect(throws: Missing(id: "a")) {
            try await database.transaction { db in
                try db.run("INSERT INTO items (id, n) VALUES (?, ?)", ["b", 2])
                try db.run("INSERT INTO items (id, n) VALUES (?, ?) ON CONFLICT DO NOTHING RETURNING id", ["a", 9], orElse: Missing(id: "a"))
            }
        }
        #expect(try await count(database) == 1)
        try await database.transaction { db in
            try db.run("INSERT INTO items (id, n) VALUES (?, ?) ON CONFLICT DO NOTHING RETURNING id", ["z", 1], orElse: Missing(id: "z"))
        }
        #expect(try await count(database) == 2)
    }

    @Test("Rows that must be written: one that a conflict skips fails its transaction with its own error, and nothing stays",
          arguments: Engine.available)
    func rowsThatMustBeWritten(engine: Engine) async throws {
        let database = try await table(engine)
        defer { Task { await database.close() } }
        try await database.transaction { db in try db.run("INSERT INTO items (id, n) VALUES (?, ?)", ["taken", 1]) }
        @Sendable func insert(_ db: any SQLConnection, _ id: String, _ n: Int) throws {
            try db.append(into: "items", columns: ["id", "n"], values: [id, n], conflict: "ON CONFLICT DO NOTHING", returning: "id",
                          orElse: Missing(id: id))
        }
        await #expect(throws: Missing(id: "taken")) {
            try await database.transaction { db in
                for index in 0..<40 { try insert(db, "new-\(index)", index) }
                try insert(db, "taken", 2)
                for index in 40..<80 { try insert(db, "new-\(index)", index) }
            }
        }
        #expect(try await count(database) == 1)
        // All new: every row is written, and a read in the same transaction sees them.
        let seen = try await database.transaction { db -> Int64 in
            for index in 0..<1_200 { try insert(db, "new-\(index)", index) }
            return try db.query("SELECT SUM(n) AS total FROM items WHERE id LIKE 'new-%'").first?.int("total") ?? -1
        }
        #expect(seen == Int64((0..<1_200).reduce(0, +)))
        #expect(try await count(database) == 1_201)
    }

    @Test("Rows changed by their key are changed in order, before the next statement that names their table, and commit",
          arguments: Engine.available)
    func rowsChangedByKey(engine: Engine) async throws {
        let database = try await database(engine, "CREATE TABLE jobs (id TEXT PRIMARY KEY, state TEXT NOT NULL, reason TEXT, at BIGINT, hash TEXT, visits BIGINT NOT NULL DEFAULT 0)")
        defer { Task { await database.close() } }
        try await database.transaction { db in
            for index in 0..<600 { try db.run("INSERT INTO jobs (id, state, hash) VALUES (?, 'open', ?)", ["job-\(index)", "hash-\(index)"]) }
        }
        // `visits` counts the changes that reached the row: a row changed twice in one statement would count one.
        let assignments = ["state = ?", "reason = ?", "at = CAST(? AS BIGINT)", "hash = COALESCE(?, hash)", "visits = visits + 1"]
        let inside = try await database.transaction { db -> [String] in
            for index in 0..<600 {
                let reason: String? = index % 2 == 0 ? nil : "odd", hash: String? = index % 3 == 0 ? "new-\(index)" : nil
                try db.update("jobs", set: assignments, values: ["done", reason, Int64(index) * 1_000_000_000_000, hash], keyColumn: "id", key: "job-\(index)")
            }
            // The same row changed again, and a row inserted then changed: each ends as its last change says.
            try db.update("jobs", set: assignments, values: ["again", "twice", 7, SQLValue.null], keyColumn: "id", key: "job-5")
            try db.run("INSERT INTO jobs (id, state) VALUES (?, 'open')", ["late"])
            try db.update("jobs", set: assignments, values: ["done", SQLValue.null, SQLValue.null, "late-hash"], keyColumn: "id", key: "late")
            return try db.query("SELECT state FROM jobs WHERE id IN ('job-5', 'late') ORDER BY id").map { $0.string("state") ?? "" }
        }
        #expect(inside == ["again", "done"])
        let rows = try await database.transaction { db in try db.query("SELECT id, state, reason, at, hash, visits FROM jobs") }
        let byId = Dictionary(uniqueKeysWithValues: rows.map { ($0.string("id") ?? "", $0) })
        #expect(byId.count == 601)
        for index in [0, 1, 2, 3, 599] {
            let row = try #require(byId["job-\(index)"])
            #expect(row.string("state") == "done")
            #expect(row.string("reason") == (index % 2 == 0 ? nil : "odd"))
            #expect(row.int("at") == Int64(index) * 1_000_000_000_000)
            #expect(row.string("hash") == (index % 3 == 0 ? "new-\(index)" : "hash-\(index)"))
        }
        #expect(byId["job-5"]?.string("state") == "again")
        #expect(byId["job-5"]?.string("reason") == "twice")
        #expect(byId["job-5"]?.int("at") == 7)
        #expect(byId["job-5"]?.string("hash") == "hash-5")
        #expect(byId["job-5"]?.int("visits") == 2)
        #expect(byId["job-6"]?.int("visits") == 1)
        #expect(byId["late"]?.string("hash") == "late-hash")
        #expect(byId["late"]?.int("at") == nil)
        #expect(rows.allSatisfy { $0.string("state") != "open" })
    }

    @Test("Additions to a row are summed, also with rows that exist, and seen by the next statement that names the table",
          arguments: Engine.available)
    func additionsAreSummed(engine: Engine) async throws {
        let database = try await database(engine, "CREATE TABLE totals (owner TEXT NOT NULL, currency TEXT NOT NULL, amount BIGINT NOT NULL, PRIMARY KEY (owner, currency))",
                                          "INSERT INTO totals (owner, currency, amount) VALUES ('user-0', 'coins', 1000)")
        defer { Task { await database.close() } }
        var expected: [String: Int64] = ["user-0 coins": 1000]
        var random = SplitMix64(state: 7)
        let additions = (0..<300).map { _ in
            (owner: "user-\(random.next() % 5)", currency: random.next() % 2 == 0 ? "coins" : "gems", amount: Int64(random.next() % 200) - 50)
        }
        for addition in additions { expected["\(addition.owner) \(addition.currency)", default: 0] += addition.amount }
        let halfway = 1_000 + additions.prefix(151).map(\.amount).reduce(0, +)
        let inside = try await database.transaction { db -> [String: Int64] in
            for (index, addition) in additions.enumerated() {
                try db.add(addition.amount, to: "amount", of: "totals", keyColumns: ["owner", "currency"], key: [addition.owner, addition.currency])
                // A statement that names the table halfway: what was added before it is written first, and counted once.
                if index == 150 {
                    let sum = try db.query("SELECT SUM(amount) AS total FROM totals").first?.int("total")
                    #expect(sum == halfway)
                }
            }
            return Dictionary(uniqueKeysWithValues: try db.query("SELECT owner, currency, amount FROM totals").map {
                ("\($0.string("owner") ?? "") \($0.string("currency") ?? "")", $0.int("amount") ?? 0)
            })
        }
        #expect(inside == expected)
        let committed = try await database.transaction { db in try db.query("SELECT SUM(amount) AS total FROM totals").first?.int("total") }
        #expect(committed == expected.values.reduce(0, +))
    }

    @Test("A transaction whose body throws before anything reached the database leaves nothing", arguments: Engine.available)
    func bodyThrows(engine: Engine) async throws {
        let database = try await table(engine)
        defer { Task { await database.close() } }
        await #expect(throws: Missing(id: "body")) {
            try await database.transaction { db in
                try db.run("INSERT INTO items (id, n) VALUES (?, ?)", ["a", 1])
                throw Missing(id: "body")
            }
        }
        #expect(try await count(database) == 0)
    }

    @Test("A batch with one settlement that fails is settled in halves: the others settle, in order, and only that one fails", arguments: Engine.available)
    func failedBatchSettledInHalves(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine, startWorker: false)
        defer { Task { await world.stop() } }
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF01")
        for index in 0..<7 {
            _ = try await world.server.store.enqueue(appId: "com.example.coins", appUserId: "user\(index)", kind: .purchase, receiptData: receipt,
                                                     now: world.server.clock.now())
        }
        let claimed = try await world.server.store.claim(owner: "worker", limit: 10, lease: 60, now: world.server.clock.now())
            .sorted { $0.appUserId < $1.appUserId }
        try #require(claimed.count == 7)
        let batch = claimed.enumerated().map { index, job in
            var job = job
            if index == 4 { job.appId = "com.example.gone" }  // an app no longer registered: its settlement throws
            return Settlement(job: job, owner: "worker", environment: .sandbox,
                              transactions: [ConfirmedTransaction(transactionId: "\(3000 + index)", productId: "Nada.JPYF01",
                                                                  purchaseDate: world.server.clock.now(), source: "receipt")],
                              subscriptions: [], now: world.server.clock.now())
        }
        let results = await world.server.store.settle(batch: batch, clock: world.server.clock)
        #expect(results.count == 7)
        for (index, result) in results.enumerated() {
            switch result {
            case .success(let outcome):
                #expect(index != 4)
                #expect(outcome?.0 == .verified)
                #expect(outcome?.1.granted == ["\(3000 + index)"])
            case .failure:
                #expect(index == 4)
            }
        }
        for (index, job) in claimed.enumerated() {
            #expect(try await world.server.store.job(job.id)?.state == (index == 4 ? .verifying : .verified))
        }
    }

    @Test("Settlements of one batch that share jobs, transactions and users end as if settled one by one", arguments: Engine.available)
    func batchEqualsOneByOne(engine: Engine) async throws {
        var outcomes: [[String]] = []
        var balances: [[String: Int]] = []
        for together in [true, false] {
            let world = try await ServerWorld.make(engine, startWorker: false)
            defer { Task { await world.stop() } }
            let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF01")
            var jobs: [VerificationJob] = []
            for user in ["alice", "alice", "bob", "bob"] {
                jobs.append(try await world.server.store.enqueue(appId: "com.example.coins", appUserId: user, kind: .purchase, receiptData: receipt,
                                                                 now: world.server.clock.now()))
            }
            let claimed = try await world.server.store.claim(owner: "worker", limit: 10, lease: 60, now: world.server.clock.now())
            #expect(claimed.count == 4)
            let byId = Dictionary(uniqueKeysWithValues: claimed.map { ($0.id, $0) })
            func coins(_ id: String, _ product: String) -> ConfirmedTransaction {
                ConfirmedTransaction(transactionId: id, productId: product, purchaseDate: world.server.clock.now(), source: "receipt")
            }
            func settlement(_ job: VerificationJob, _ transactions: [ConfirmedTransaction]) -> Settlement {
                Settlement(job: byId[job.id]!, owner: "worker", environment: .sandbox, transactions: transactions, subscriptions: [], now: world.server.clock.now())
            }
            let batch = [
                settlement(jobs[0], [coins("1000", "Nada.JPYF01")]),                            // alice is granted 1000
                settlement(jobs[1], [coins("1000", "Nada.JPYF01"), coins("1001", "Nada.JPYF02")]),  // alice again: 1000 owned, 1001 new
                settlement(jobs[0], [coins("1002", "Nada.JPYF02")]),                            // the first job again: its lease is gone
                settlement(jobs[2], [coins("1001", "Nada.JPYF02")]),                            // bob uploads alice's 1001
                settlement(jobs[3], [coins("2000", "Nada.JPYF03")]),                            // bob's own
            ]
            var results: [(JobState, SettlementResult)?] = []
            if together {
                results = try await world.server.store.settleTogether(batch, clock: world.server.clock)
            } else {
                for item in batch { results += try await world.server.store.settleTogether([item], clock: world.server.clock) }
            }
            outcomes.append(results.map { result in result.map { "\($0.0.rawValue) \($0.1.jsonText)" } ?? "lease lost" })
            var seen: [String: Int] = [:]
            for user in ["alice", "bob"] {
                for (currency, amount) in try await world.user("com.example.coins", user).balances { seen["\(user) \(currency)"] = amount }
            }
            balances.append(seen)
        }
        #expect(outcomes[0] == outcomes[1])
        #expect(balances[0] == balances[1])
        #expect(outcomes[0][2] == "lease lost")
        #expect(balances[0]["alice coins"] == 120)  // 20 + 100, each once
        #expect(balances[0]["bob coins"] == 600)
    }

    @Test("Two users settling different transactions of one new chain at once: the chain gets one owner (replay refused)",
          arguments: Engine.available)
    func oneOwnerPerChain(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine, startWorker: false)
        defer { Task { await world.stop() } }
        let app = "com.example.magazine", chains = 64
        let now = world.server.clock.now()
        for chain in 0..<chains {
            for user in ["alice", "bob"] {
                _ = try await world.server.store.enqueue(appId: app, appUserId: "\(user)-\(chain)", kind: .purchase, receiptData: "r-\(user)-\(chain)", now: now)
            }
        }
        let claimed = try await world.server.store.claim(owner: "worker", limit: 2 * chains, lease: 60, now: now)
        #expect(claimed.count == 2 * chains)
        let store = world.server.store, clock = world.server.clock
        await withTaskGroup(of: Void.self) { group in
            for job in claimed {
                let chain = job.appUserId.split(separator: "-")[1], user = job.appUserId.split(separator: "-")[0]
                let transaction = ConfirmedTransaction(transactionId: "4\(chain)\(user == "alice" ? 1 : 2)", originalTransactionId: "4\(chain)0",
                                                       productId: "com.example.magazine.monthly", purchaseDate: now,
                                                       expiresDate: now.addingTimeInterval(30 * 86_400), source: "receipt")
                let settlement = Settlement(job: job, owner: "worker", environment: .sandbox, transactions: [transaction], subscriptions: [], now: now)
                group.addTask { _ = try? await store.settle(settlement, clock: clock) }
            }
        }
        let owners = try await store.database.transaction { db in
            try db.query("SELECT original_transaction_id, count(*) AS n FROM ownership WHERE app_id = ? GROUP BY original_transaction_id", [app])
        }
        #expect(owners.count == chains)
        #expect(owners.allSatisfy { $0.int("n") == 1 })
    }

    @Test("Chain locks stay within PostgreSQL's lock table: a few chains one by one under a shared lock, many under one exclusive lock",
          arguments: Engine.available.filter { $0 == .postgres })
    func chainLocksBounded(engine: Engine) async throws {
        let database = try await engine.makeDatabase()
        defer { Task { await database.close() } }
        func held(_ count: Int) async throws -> [String: Int64] {
            try await database.transaction { db in
                try ChainLocks(db: db).lock(Set((0..<count).map { ChainLocks.Chain(appId: "app", environment: "Sandbox", originalTransactionId: "\($0)") }))
                let rows = try db.query("SELECT mode, count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() GROUP BY mode", [])
                return Dictionary(uniqueKeysWithValues: rows.map { ($0.string("mode") ?? "", $0.int("n") ?? 0) })
            }
        }
        #expect(try await held(3) == ["ShareLock": 1, "ExclusiveLock": 3])
        #expect(try await held(ChainLocks.mostLocks) == ["ShareLock": 1, "ExclusiveLock": Int64(ChainLocks.mostLocks)])
        #expect(try await held(ChainLocks.mostLocks + 1) == ["ExclusiveLock": 1])
        #expect(try await held(5_000) == ["ExclusiveLock": 1])
    }

    @Test("A settlement's renewal state keeps the time Apple answered, though the settlement is written later", arguments: Engine.available)
    func renewalStateAtAnswer(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine, startWorker: false)
        defer { Task { await world.stop() } }
        let answered = world.server.clock.now()
        let job = try await world.server.store.enqueue(appId: "com.example.magazine", appUserId: "carol", kind: .purchase, receiptData: "r", now: answered)
        let claimed = try #require(try await world.server.store.claim(owner: "worker", limit: 1, lease: 60, now: answered).first)
        let transaction = ConfirmedTransaction(transactionId: "5001", productId: "com.example.magazine.monthly", purchaseDate: answered,
                                               expiresDate: answered.addingTimeInterval(30 * 86_400), source: "receipt")
        let renewal = ConfirmedSubscription(originalTransactionId: "5001", productId: "com.example.magazine.monthly", autoRenewStatus: true,
                                            isInBillingRetry: false)
        let settlement = Settlement(job: claimed, owner: "worker", environment: .sandbox, transactions: [transaction], subscriptions: [renewal], now: answered)
        let written = ManualClock(answered.addingTimeInterval(9))
        #expect(try await world.server.store.settle(settlement, clock: written)?.0 == .verified)
        let stamped = try await world.server.store.database.transaction { db in
            try db.query("SELECT updated_at FROM subscriptions WHERE original_transaction_id = '5001'", []).first?.int("updated_at")
        }
        // A notification signed in those nine seconds must stay newer than this answer.
        #expect(stamped == answered.milliseconds)
        #expect(try await world.server.store.job(job.id)?.settledAt?.milliseconds == written.now().milliseconds)
    }

    @Test("A settlement is stamped when its transaction runs, not when Apple answered: time to grant counts the wait for a batch",
          arguments: Engine.available)
    func stampedWhenWritten(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine, startWorker: false)
        defer { Task { await world.stop() } }
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF01")
        let answered = world.server.clock.now()
        let job = try await world.server.store.enqueue(appId: "com.example.coins", appUserId: "alice", kind: .purchase, receiptData: receipt, now: answered)
        let claimed = try #require(try await world.server.store.claim(owner: "worker", limit: 1, lease: 60, now: answered).first)
        let written = ManualClock(answered.addingTimeInterval(7))  // the batch ran seven seconds after the answer
        let transaction = ConfirmedTransaction(transactionId: "3000", productId: "Nada.JPYF01", purchaseDate: answered, source: "receipt")
        let settlement = Settlement(job: claimed, owner: "worker", environment: .sandbox, transactions: [transaction], subscriptions: [], now: answered)
        let outcome = try await world.server.store.settle(settlement, clock: written)
        #expect(outcome?.0 == .verified)
        let settled = try #require(try await world.server.store.job(job.id))
        #expect(settled.settledAt?.milliseconds == written.now().milliseconds)
    }
}
