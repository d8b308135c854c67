import Foundation
@testable import SQLiteStorage
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

    @Test("Under constant writes and reads a checkpoint runs per thousand new pages of log, not after every commit")
    func checkpointsPerThousandPages() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("checkpoint-\(UUID().uuidString).sqlite").path
        defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) } }
        let database = try SQLiteDatabase(path: path)
        let reader = try SQLiteDatabase(path: path)
        try await database.run { try $0.execute("CREATE TABLE blobs (id INTEGER PRIMARY KEY, body BLOB NOT NULL)") }
        let body = Data(repeating: 0x5A, count: 3000)
        // A reader that keeps taking fresh snapshots, as the server's reads do: the log is rarely idle enough to restart.
        let reading = Task {
            while !Task.isCancelled {
                _ = try? await reader.run { db in
                    try db.execute("BEGIN")
                    defer { try? db.execute("COMMIT") }
                    return try db.query("SELECT MAX(id) FROM blobs")
                }
            }
        }
        for index in 0..<4000 {
            try await database.run { db in
                try db.execute("BEGIN IMMEDIATE")
                try db.query("INSERT INTO blobs (id, body) VALUES (?, ?)", [.integer(Int64(index)), .blob(body)])
                try db.execute("COMMIT")
            }
        }
        reading.cancel()
        _ = await reading.result
        // About 4,000 pages of log: four checkpoints, and a few more for the reader's timing; one per commit past
        // the first thousand pages would be about 3,000.
        #expect(database.checkpoints >= 1)
        #expect(database.checkpoints <= 40, "\(database.checkpoints) checkpoints for 4,000 commits")
    }

    @Test("The schedule: a request per thousand new pages, the writer's own checkpoint per eight thousand, again after a busy one, and from zero once the log restarts")
    func schedule() {
        var schedule = CheckpointSchedule()
        #expect(schedule.committed(pages: 999) == .none)
        #expect(schedule.committed(pages: 1000) == .request)
        #expect(schedule.committed(pages: 1999) == .none)     // counted from the last request, not the log's start
        #expect(schedule.committed(pages: 2000) == .request)
        #expect(schedule.committed(pages: 5) == .none)        // the log restarted: counted from its first frame again
        #expect(schedule.committed(pages: 999) == .none)
        #expect(schedule.committed(pages: 1000) == .request)
        // A log that never restarts: the writer's own checkpoint at 8,000 pages.
        var steady = CheckpointSchedule()
        for pages in stride(from: Int32(1000), through: 7000, by: 1000) { #expect(steady.committed(pages: pages) == .request) }
        #expect(steady.committed(pages: 8000) == .force)
        // It found the other connection checkpointing (not forced): due again after the next commit.
        #expect(steady.committed(pages: 8001) == .force)
        steady.forced(at: 8001)
        #expect(steady.committed(pages: 8002) == .none)
        #expect(steady.committed(pages: 9001) == .request)
        #expect(steady.committed(pages: 16_000) == .request)
        #expect(steady.committed(pages: 16_001) == .force)
    }
}
