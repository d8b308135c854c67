import Dispatch
import Foundation
import SQLiteStorage
import Storage
import Synchronization
import Testing

@Suite("SQLite readers")
struct SQLiteReadersTests {
    static func withDatabase(readers: Int = SQLiteReaders.defaultCount, _ body: (SQLiteSQLDatabase) async throws -> Void) async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("readers-\(UUID().uuidString).sqlite").path
        defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) } }
        let database = try SQLiteSQLDatabase(path: path, readers: readers)
        try await database.transaction { db in
            try db.query("CREATE TABLE items (id INTEGER PRIMARY KEY)")
            try db.query("INSERT INTO items (id) VALUES (1)")
        }
        try await body(database)
    }

    /// Set by a read's body (on its connection's queue) once it is under way.
    final class Begun: Sendable {
        private let flag = Atomic<Bool>(false)
        func set() { flag.store(true, ordering: .releasing) }
        var isSet: Bool { flag.load(ordering: .acquiring) }
        func wait() async throws {
            while !flag.load(ordering: .acquiring) { try await Task.sleep(for: .milliseconds(5)) }
        }
    }

    static func count(_ db: any SQLConnection) throws -> Int64 {
        try db.query("SELECT COUNT(*) AS n FROM items").first?.int("n") ?? -1
    }

    @Test("A read in progress holds up no write: a write made while a read waits for it commits, and the read's snapshot does not see it")
    func readBesideWrite() async throws {
        try await Self.withDatabase { database in
            let written = DispatchSemaphore(value: 0)
            let begun = Begun()
            let reading = Task {
                try await database.read { db -> (Int64, Bool, Int64) in
                    let before = try Self.count(db)
                    begun.set()
                    // The write below must run while this read is under way; on the writer's own queue it never could.
                    let waited = written.wait(timeout: .now() + 10) == .success
                    return (before, waited, try Self.count(db))
                }
            }
            try await begun.wait()
            _ = try await database.transaction { db in try db.query("INSERT INTO items (id) VALUES (2)") }
            written.signal()
            let (before, waited, after) = try await reading.value
            #expect(waited, "the write waited for the read")
            #expect(before == 1 && after == 1, "one snapshot for the whole read")
            // A read begun after the commit sees it.
            #expect(try await database.read { db in try Self.count(db) } == 2)
        }
    }

    @Test("A write inside a read is refused and changes nothing")
    func readsCannotWrite() async throws {
        try await Self.withDatabase { database in
            await #expect(throws: StorageError.self) {
                try await database.read { db in try db.query("INSERT INTO items (id) VALUES (3)") }
            }
            let count = try await database.transaction { db in try Self.count(db) }
            #expect(count == 1)
        }
    }

    @Test("A long read holds up no short read, and long reads take turns")
    func longReadsTakeTurns() async throws {
        // Three short connections: were long reads short ones, the second would find one free whenever it came.
        try await Self.withDatabase(readers: 3) { database in
            let release = DispatchSemaphore(value: 0)
            let begun = Begun(), second = Begun()
            let first = Task {
                try await database.longRead { _ in
                    begun.set()
                    return release.wait(timeout: .now() + 10) == .success
                }
            }
            try await begun.wait()
            let next = Task { try await database.longRead { db in second.set(); return try Self.count(db) } }
            // Short reads are answered meanwhile.
            let one = try await database.read { db in try Self.count(db) }
            let two = try await database.read { db in try Self.count(db) }
            #expect(one == 1 && two == 1)
            try await Task.sleep(for: .milliseconds(100))
            #expect(!second.isSet, "a second long read began while the first was under way")
            release.signal()
            #expect(try await first.value, "short reads waited for the long one")
            #expect(try await next.value == 1)
        }
    }

    @Test("The pages a read looks up on a reading connection are counted with the writer's")
    func pagesCountReaders() async throws {
        try await Self.withDatabase { database in
            let before = try await database.pagesTouched()
            _ = try await database.read { db in try Self.count(db) }
            _ = try await database.longRead { db in try Self.count(db) }
            let after = try await database.pagesTouched()
            #expect(after >= before + 2, "\(before) → \(after)")
        }
    }

    @Test("Readers opened before the schema exists (as a server opens them, before its migrations) see tables made after; none to open without readers")
    func openedAtStart() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("readers-\(UUID().uuidString).sqlite").path
        defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) } }
        let database = try SQLiteSQLDatabase(path: path, readers: 3)
        #expect(database.openReaders() == 4, "three short readers and the one for long reads")
        #expect(database.openReaders() == 4, "opening again opens nothing more")
        try await database.transaction { db in
            try db.query("CREATE TABLE items (id INTEGER PRIMARY KEY)")
            try db.query("INSERT INTO items (id) VALUES (7)")
        }
        for _ in 0..<6 { #expect(try await database.read { db in try Self.count(db) } == 1) }
        #expect(try await database.longRead { db in try Self.count(db) } == 1)
        #expect(try SQLiteSQLDatabase(path: path, readers: 0).openReaders() == 0)
    }

    @Test("Without readers (none asked, or a database in memory) reads run on the writer and see its data")
    func withoutReaders() async throws {
        try await Self.withDatabase(readers: 0) { database in
            let count = try await database.read { db in try Self.count(db) }
            #expect(count == 1)
        }
        let memory = try SQLiteSQLDatabase(path: ":memory:")
        _ = try await memory.transaction { db in try db.query("CREATE TABLE items (id INTEGER PRIMARY KEY)") }
        #expect(try await memory.read { db in try Self.count(db) } == 0)
    }
}
