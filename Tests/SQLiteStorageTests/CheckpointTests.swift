import Foundation
import SQLiteStorage
import Testing

@Suite("SQLite checkpoints")
struct CheckpointTests {
    static func size(_ path: String) -> Int {
        ((try? FileManager.default.attributesOfItem(atPath: path))?[.size] as? NSNumber)?.intValue ?? 0
    }

    @Test("The write-ahead log is still copied into the database file while writes go on (a second connection checkpoints instead of the writer), and stays bounded")
    func checkpointsWhileWriting() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("checkpoint-\(UUID().uuidString).sqlite").path
        defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) } }
        let database = try SQLiteDatabase(path: path)
        try await database.run { try $0.execute("CREATE TABLE blobs (id INTEGER PRIMARY KEY, body BLOB NOT NULL)") }
        let body = Data(repeating: 0xA5, count: 3000)
        // 4,000 commits of one row each: about 4,000 pages of log, four times the threshold.
        for index in 0..<4000 {
            try await database.run { db in
                try db.execute("BEGIN IMMEDIATE")
                try db.query("INSERT INTO blobs (id, body) VALUES (?, ?)", [.integer(Int64(index)), .blob(body)])
                try db.execute("COMMIT")
            }
        }
        // The rows reached the database file itself (a checkpoint ran) before the connection closed.
        var copied = Self.size(path)
        for _ in 0..<100 where copied < 4000 * 3000 {
            try await Task.sleep(for: .milliseconds(50))
            copied = Self.size(path)
        }
        #expect(copied >= 4000 * 3000)
        #expect(Self.size(path + "-wal") < 8 * 1000 * 4096 + 1_000_000)
        let count = try await database.run { db in try db.query("SELECT COUNT(*) FROM blobs") }
        guard case .integer(let rows)? = count.first?.first else { Issue.record("no count"); return }
        #expect(rows == 4000)
    }
}
