import Foundation
import SQLiteStorage
import Storage
import Testing

@Suite("Row writes' SQL texts")
struct SQLTextCacheTests {
    struct Skipped: Error {}

    @Test("Each shape keeps its own text: the same table, as many columns, other columns or clauses get other texts")
    func textsByShape() {
        var cache = SQLTextCache()
        let plain = cache.insert(into: "t", columns: ["a", "b"], conflict: "")
        #expect(plain == SQLStatement.insert(into: "t", columns: ["a", "b"], rows: 1, conflict: ""))
        #expect(cache.insert(into: "t", columns: ["a", "c"], conflict: "") == "INSERT INTO t (a, c) VALUES (?, ?)")
        #expect(cache.insert(into: "t", columns: ["a", "b"], conflict: "ON CONFLICT DO NOTHING")
                == "INSERT INTO t (a, b) VALUES (?, ?) ON CONFLICT DO NOTHING")
        #expect(cache.insert(into: "u", columns: ["a", "b"], conflict: "") == "INSERT INTO u (a, b) VALUES (?, ?)")
        #expect(cache.update("t", set: ["b = ?"], keyColumn: "a") == "UPDATE t SET b = ? WHERE a = ?")
        #expect(cache.update("t", set: ["c = ?"], keyColumn: "a") == "UPDATE t SET c = ? WHERE a = ?")
        #expect(cache.addition(to: "n", of: "t", keyColumns: ["a"])
                == SQLStatement.addition(to: "n", of: "t", keyColumns: ["a"], rows: 1))
        #expect(cache.count == 7)
        #expect(cache.insert(into: "t", columns: ["a", "b"], conflict: "") == plain)
        #expect(cache.count == 7)
    }

    @Test("An IN list is padded to a power of two with its last value, and selects what the list names")
    func inListPadded() async throws {
        #expect(InList.padded([String]()) == ("", []))
        #expect(InList.padded(["a"]) == ("?", ["a"]))
        #expect(InList.padded(["a", "b", "c"]) == ("?, ?, ?, ?", ["a", "b", "c", "c"]))
        #expect(InList.padded(Array(repeating: "x", count: 4)).values.count == 4)
        #expect(InList.padded(Array(repeating: "x", count: 5)).values.count == 8)
        #expect(InList.padded(Array(repeating: "x", count: 400)).values.count == 512)
        let shapes = Set((1...400).map { InList.padded(Array(repeating: "x", count: $0)).marks })
        #expect(shapes.count == 10)  // 1, 2, 4, … 512: a statement prepared ten ways at most
        try await Self.withDatabase { database in
            let selected = try await database.transaction { connection in
                try connection.run("CREATE TABLE t (id TEXT PRIMARY KEY)")
                for id in ["a", "b", "c", "d", "e"] { try connection.append(into: "t", columns: ["id"], values: [id], conflict: "") }
                return try (1...5).map { count in
                    let wanted = Array(["e", "c", "a", "zz", "b"].prefix(count))
                    let (marks, values) = InList.padded(wanted)
                    return try connection.query("SELECT id FROM t WHERE id IN (\(marks)) ORDER BY id", values).compactMap { $0.string("id") }
                }
            }
            #expect(selected == [["e"], ["c", "e"], ["a", "c", "e"], ["a", "c", "e"], ["a", "b", "c", "e"]])
        }
    }

    @Test("The cache stays under its limit whatever shapes pass through it")
    func bounded() {
        var cache = SQLTextCache()
        for index in 0..<(SQLTextCache.limit * 3) {
            #expect(cache.insert(into: "t\(index)", columns: ["a"], conflict: "") == "INSERT INTO t\(index) (a) VALUES (?)")
        }
        #expect(cache.count <= SQLTextCache.limit)
    }

    @Test("Text holding a NUL, or not UTF-8 as stored, comes back whole through SQLConnection")
    func textWhole() async throws {
        try await Self.withDatabase { database in
            let texts = ["a\u{0}b", "\u{0}", "", "é😀\u{0}z", String(repeating: "x", count: 10_000) + "\u{0}" + "y"]
            let read = try await database.transaction { connection in
                try connection.run("CREATE TABLE t (n INTEGER PRIMARY KEY, s TEXT, b BLOB)")
                for (index, text) in texts.enumerated() {
                    try connection.append(into: "t", columns: ["n", "s", "b"], values: [index, text, text], conflict: "")
                }
                return try connection.query("SELECT s, CAST(b AS BLOB) AS b FROM t ORDER BY n", []).map { [$0.string("s"), $0.string("b")] }
            }
            #expect(read == texts.map { [$0, $0] })
        }
    }

    @Test("On SQLite, appends, returning appends, updates and additions write what they say, again and again")
    func writes() async throws {
        try await Self.withDatabase { database in
            try await database.transaction { connection in
                try connection.run("CREATE TABLE t (a TEXT PRIMARY KEY, b TEXT, c TEXT)")
                try connection.run("CREATE TABLE n (k TEXT PRIMARY KEY, v INTEGER NOT NULL)")
            }
            for round in 0..<3 {
                try await database.transaction { connection in
                    try connection.append(into: "t", columns: ["a", "b"], values: ["x\(round)", "b\(round)"], conflict: "")
                    try connection.append(into: "t", columns: ["a", "c"], values: ["y\(round)", "c\(round)"], conflict: "")
                    try connection.append(into: "t", columns: ["a", "b"], values: ["x\(round)", "again"], conflict: "ON CONFLICT DO NOTHING")
                    try connection.update("t", set: ["c = ?"], values: ["set\(round)"], keyColumn: "a", key: "x\(round)")
                    try connection.add(5, to: "v", of: "n", keyColumns: ["k"], key: ["total"])
                }
                await #expect(throws: Skipped.self) {
                    try await database.transaction { connection in
                        try connection.append(into: "t", columns: ["a", "b"], values: ["x\(round)", "dup"],
                                              conflict: "ON CONFLICT DO NOTHING", returning: "a", orElse: Skipped())
                    }
                }
            }
            let rows = try await database.transaction { connection in
                try connection.query("SELECT a, b, c FROM t ORDER BY a").map { [$0.string("a"), $0.string("b"), $0.string("c")] }
            }
            #expect(rows == [["x0", "b0", "set0"], ["x1", "b1", "set1"], ["x2", "b2", "set2"],
                             ["y0", nil, "c0"], ["y1", nil, "c1"], ["y2", nil, "c2"]])
            let total = try await database.transaction { try $0.query("SELECT v FROM n WHERE k = 'total'").first?.int("v") }
            #expect(total == 15)
        }
    }

    @Test("On SQLite, a row write that reads a row back is refused: its transaction fails, none of it stays, and the statement is usable again")
    func rowWriteReturningARowFails() async throws {
        try await Self.withDatabase { database in
            try await database.transaction { try $0.run("CREATE TABLE t (a TEXT PRIMARY KEY, b TEXT)") }
            // A clause that makes the insert give its row back: row writes count changes and read nothing, so this is a
            // caller's mistake, told as one, not a row written and its answer dropped.
            let returning = "ON CONFLICT DO NOTHING RETURNING a"
            for round in 0..<2 {
                await #expect {
                    try await database.transaction { connection in
                        try connection.append(into: "t", columns: ["a", "b"], values: ["kept\(round)", "x"], conflict: "ON CONFLICT DO NOTHING")
                        try connection.append(into: "t", columns: ["a", "b"], values: ["returned\(round)", "x"], conflict: returning)
                    }
                } throws: { ($0 as? StorageError)?.code == "sql_failed" }
                await #expect {
                    try await database.transaction { connection in
                        try connection.append(into: "t", columns: ["a", "b"], values: ["must\(round)", "x"], conflict: returning,
                                              returning: "a", orElse: Skipped())
                    }
                } throws: { ($0 as? StorageError)?.code == "sql_failed" }
            }
            // The same texts again, now without a row to give back (the conflict skips it): the statements were reset.
            try await database.transaction { connection in
                try connection.append(into: "t", columns: ["a", "b"], values: ["after", "x"], conflict: "ON CONFLICT DO NOTHING")
            }
            try await database.transaction { connection in
                try connection.append(into: "t", columns: ["a", "b"], values: ["after", "y"], conflict: returning)
            }
            let rows = try await database.transaction { connection in
                try connection.query("SELECT a, b FROM t ORDER BY a").map { [$0.string("a"), $0.string("b")] }
            }
            #expect(rows == [["after", "x"]])
        }
    }

    @Test("Prepared statements whose texts share their length and first and last 32 bytes are each their own")
    func statementsAlikeAtBothEnds() async throws {
        try await Self.withDatabase { database in
            let head = "SELECT /* the same thirty-two bytes or more */ ", tail = " AS v /* and the same thirty-two bytes at the end */"
            // The same length, the same ends: only the middle differs (the key hashes the ends, and compares all of it).
            let values = (0..<40).map { String(format: "%03d", $0) } + ["\u{1E0B}\u{0323}", "\u{1E0D}\u{0307}"]
            // The last two are equal as Strings (canonically equivalent: d with a dot above and one below) and as long in
            // bytes, but not the same bytes: each is its own statement.
            let texts = values.map { head + "'\($0)'" + tail }
            for round in 0..<3 {
                for (text, expected) in zip(texts, values) {
                    let value = try await database.transaction { try $0.query(text).first?.string("v") }
                    #expect(value.map { Array($0.utf8) } == Array(expected.utf8), "round \(round), \(expected)")
                }
            }
        }
    }

    /// Runs `body` with an SQLite database in a directory of its own, removed afterwards.
    private static func withDatabase(_ body: (SQLiteSQLDatabase) async throws -> Void) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("sqltexts-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        try await body(try SQLiteSQLDatabase(path: directory.appendingPathComponent("t.sqlite").path))
    }
}
