import Foundation
import Storage
import Testing
@testable import PurchaseServer

/// `append(…, returning:orElse:)`: a row that must be written (a ledger row) fails its transaction with the given
/// error when the conflict clause skipped it, on each engine (SQLite counts the statement's changes; PostgreSQL
/// gathers the rows and reads what `RETURNING` gives back at the latest at commit).
@Suite("Rows that must be written")
struct MustWriteTests {
    private struct Skipped: Error, Equatable { let key: String }

    private static func write(_ key: String, _ value: Int64, conflict: String = "ON CONFLICT DO NOTHING", _ db: any SQLConnection) throws {
        try db.append(into: "rows", columns: ["k", "v"], values: [key, value], conflict: conflict, returning: "k", orElse: Skipped(key: key))
    }

    @Test("A skipped row fails its transaction with its own error, right after rows that were written or changed", arguments: Engine.available)
    func skippedRowFails(engine: Engine) async throws {
        let database = try await engine.makeDatabase()
        defer { Task { await database.close() } }
        _ = try await database.transaction { db in try db.query("CREATE TABLE rows (k TEXT PRIMARY KEY, v BIGINT NOT NULL)") }
        // New rows: written, in one transaction.
        _ = try await database.transaction { db in
            for key in ["a", "b", "c"] { try Self.write(key, 1, db) }
        }
        // A row that exists, right after one that was written: the transaction fails with the skipped row's error, and
        // none of it stays.
        await #expect(throws: Skipped(key: "a")) {
            _ = try await database.transaction { db in
                try Self.write("d", 1, db)
                try Self.write("a", 1, db)
            }
        }
        // Right after an update that changed every row: the count of the update is not taken for the skipped insert's.
        await #expect(throws: Skipped(key: "b")) {
            _ = try await database.transaction { db in
                try db.run("UPDATE rows SET v = v + 1")
                try Self.write("b", 1, db)
            }
        }
        // An upsert that updates counts as written; one whose condition leaves the row as it is does not.
        let upsert = "ON CONFLICT (k) DO UPDATE SET v = excluded.v WHERE rows.v <> excluded.v"
        _ = try await database.transaction { db in try Self.write("c", 5, conflict: upsert, db) }
        await #expect(throws: Skipped(key: "c")) {
            _ = try await database.transaction { db in try Self.write("c", 5, conflict: upsert, db) }
        }
        let rows = try await database.transaction { db in try db.query("SELECT k, v FROM rows ORDER BY k") }
        #expect(rows.map { "\($0.string("k") ?? "")=\($0.int("v") ?? -1)" } == ["a=1", "b=1", "c=5"])
    }
}
