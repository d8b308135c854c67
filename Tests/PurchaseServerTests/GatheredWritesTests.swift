@testable import PostgresStorage
import Storage
import Testing

/// The rules of gathering a transaction's row writes into statements (`GatheredWrites`), without a database.
@Suite("Gathered writes")
struct GatheredWritesTests {
    private struct Refused: Error, Equatable { let id: String }

    @Test("Rows under a conflict clause are written in key order, identical ones once, each with its own error")
    func insertsInKeyOrder() throws {
        var writes = GatheredWrites()
        for id in ["c", "a", "b", "a"] {
            try writes.insert(into: "ledger", columns: ["id", "n"], row: [id, "1"], conflict: "ON CONFLICT DO NOTHING",
                              mustWrite: ("id", Refused(id: id)))
        }
        let statements = writes.take(namedIn: nil)
        #expect(statements.count == 1)
        #expect(statements[0].texts == ["a", "1", "b", "1", "c", "1"])
        #expect(statements[0].sql.hasSuffix("ON CONFLICT DO NOTHING RETURNING id"))
        #expect(statements[0].mustWrite?.map(\.key) == ["a", "b", "c"])
        #expect(statements[0].mustWrite?.compactMap { $0.error as? Refused } == [Refused(id: "a"), Refused(id: "b"), Refused(id: "c")])
        #expect(writes.isEmpty)
        // Without a conflict clause (a log), rows keep the order they came in.
        for id in ["z", "y"] { try writes.insert(into: "audit", columns: ["id"], row: [id], conflict: "", mustWrite: nil) }
        #expect(writes.take(namedIn: "SELECT * FROM audit").first?.texts == ["z", "y"])
    }

    @Test("A row changed twice is written twice, in order; a statement naming another table leaves the rows gathered")
    func changesInOrder() throws {
        var writes = GatheredWrites()
        for (key, state) in [("b", "one"), ("a", "one"), ("b", "two")] {
            try writes.update("jobs", set: ["state = ?", "at = CAST(? AS BIGINT)"], values: [state, "1"], keyColumn: "id", key: key)
        }
        #expect(writes.take(namedIn: "SELECT * FROM ledger").isEmpty)
        let statements = writes.take(namedIn: "SELECT * FROM jobs")
        #expect(statements.map(\.texts) == [["a", "one", "1", "b", "one", "1"], ["b", "two", "1"]])
        #expect(statements[0].sql == "UPDATE jobs SET state = v.c1, at = CAST(v.c2 AS BIGINT) FROM (VALUES (?, ?, ?), (?, ?, ?)) AS v (c0, c1, c2) WHERE jobs.id = v.c0")
    }

    @Test("Additions to one row are summed into one row per key; a sum past 64 bits is refused")
    func additionsSummed() throws {
        var writes = GatheredWrites()
        for (user, amount) in [("u2", Int64(5)), ("u1", 20), ("u2", -3)] {
            try writes.add(amount, to: "amount", of: "balances", keyColumns: ["user"], key: [user])
        }
        let statements = writes.take(namedIn: nil)
        #expect(statements.map(\.texts) == [["u1", "20", "u2", "2"]])
        #expect(statements[0].sql == SQLStatement.addition(to: "amount", of: "balances", keyColumns: ["user"], rows: 2))
        try writes.add(.max, to: "amount", of: "balances", keyColumns: ["user"], key: ["u1"])
        #expect(throws: StorageError.self) { try writes.add(1, to: "amount", of: "balances", keyColumns: ["user"], key: ["u1"]) }
    }

    @Test("Bad shapes are refused: a row that must be written without its key, a quoted assignment, placeholders without values")
    func badShapesRefused() {
        var writes = GatheredWrites()
        #expect(throws: StorageError.self) {
            try writes.insert(into: "ledger", columns: ["id"], row: [nil], conflict: "ON CONFLICT DO NOTHING", mustWrite: ("id", Refused(id: "")))
        }
        #expect(throws: StorageError.self) {
            try writes.insert(into: "ledger", columns: ["id"], row: ["a"], conflict: "", mustWrite: ("missing", Refused(id: "a")))
        }
        #expect(throws: StorageError.self) { try writes.update("jobs", set: ["state = '?'"], values: [], keyColumn: "id", key: "a") }
        #expect(throws: StorageError.self) { try writes.update("jobs", set: ["state = ?"], values: [], keyColumn: "id", key: "a") }
        #expect(throws: StorageError.self) { try writes.add(1, to: "amount", of: "balances", keyColumns: ["a", "b"], key: ["x"]) }
        #expect(writes.isEmpty)
    }

    @Test("Wide rows are split so that no statement passes PostgreSQL's 65,535 parameters")
    func wideRowsSplit() throws {
        var writes = GatheredWrites()
        let columns = (0..<200).map { "c\($0)" }
        for index in 0..<1_000 {
            try writes.insert(into: "wide", columns: columns, row: columns.map { _ in "\(index)" }, conflict: "", mustWrite: nil)
        }
        let statements = writes.take(namedIn: nil)
        #expect(statements.allSatisfy { $0.texts.count <= 65_535 })
        #expect(statements.map(\.texts.count).reduce(0, +) == 200_000)
    }
}
