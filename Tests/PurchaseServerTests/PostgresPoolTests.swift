import Foundation
import PostgresStorage
import Storage
import StorekeeperTesting
import Testing

/// The connection pool hands waiting work to the connection that frees up (no task waits for a connection).
@Suite("PostgreSQL connection pool", .enabled(if: ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES"] != nil))
struct PostgresPoolTests {
    @Test("Far more work than connections: every piece runs once, on one of the pool's two sessions, a failure frees its connection, and the pool ends idle")
    func moreWorkThanConnections() async throws {
        let url = try #require(ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES"])
        let database = try PostgresDatabase(url: url, size: 2)
        // Each piece reads its own number back through the server, and its session's pid: two sessions, never more.
        let answers = try await withThrowingTaskGroup(of: (Int, Int64, Int64).self) { group in
            for index in 0..<400 {
                group.addTask {
                    if index % 2 == 0 {
                        return try await database.read { db in
                            let row = try db.query("SELECT ?::bigint AS n, pg_backend_pid() AS pid", [Int64(index)]).first
                            return (index, row?.int("n") ?? -1, row?.int("pid") ?? -1)
                        }
                    }
                    return try await database.transaction { db in
                        let row = try db.query("SELECT ?::bigint AS n, pg_backend_pid() AS pid", [Int64(index)]).first
                        return (index, row?.int("n") ?? -1, row?.int("pid") ?? -1)
                    }
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(answers.count == 400)
        #expect(answers.allSatisfy { Int64($0.0) == $0.1 })
        #expect(Set(answers.map(\.2)).count == 2)
        // A caller is answered before its connection goes back to the idle list: waited for, briefly.
        func settled() async throws {
            try await TestSupport.eventually { database.poolStatistics?.idle == 2 }
        }
        try await settled()
        let statistics = try #require(database.poolStatistics)
        #expect(statistics.idle == 2 && statistics.inUse == 0 && statistics.waiting == 0)
        // A failing piece frees its connection for the next.
        await #expect(throws: (any Error).self) { try await database.read { db in try db.query("SELECT * FROM no_such_table") } }
        #expect(try await database.read { db in try db.query("SELECT 1 AS one").first?.int("one") } == 1)
        try await settled()
        #expect(database.poolStatistics?.idle == 2)
    }
}
