import Foundation
@testable import PurchaseServer
import Storage
import Testing

@Suite("Group commit")
struct GroupCommitTests {
    /// Writes `count` rows together, the one at `failing` throwing; answers each writer's outcome and the rows stored.
    static func writeTogether(_ engine: Engine, count: Int, failing: Int?) async throws -> (outcomes: [Bool], stored: [Int64]) {
        let database = try await engine.makeDatabase()
        defer { Task { await database.close() } }
        let table = "group_commit_\(UUID().uuidString.prefix(8).lowercased())"
        try await database.transaction { db in try db.run("CREATE TABLE \(table) (n BIGINT PRIMARY KEY)") }
        struct Refused: Error {}
        let commits = GroupCommit<Int, Int>(maxBatch: 64)
        let outcomes = await withTaskGroup(of: (Int, Bool).self) { group in
            for index in 0..<count {
                group.addTask {
                    do {
                        _ = try await commits.write(index, in: database) { item, db in
                            try db.run("INSERT INTO \(table) (n) VALUES (?)", [Int64(item)])
                            if item == failing { throw Refused() }
                            return item
                        }
                        return (index, true)
                    } catch {
                        return (index, false)
                    }
                }
            }
            var outcomes = [Bool](repeating: false, count: count)
            for await (index, succeeded) in group { outcomes[index] = succeeded }
            return outcomes
        }
        let stored = try await database.transaction { db in try db.query("SELECT n FROM \(table) ORDER BY n", []).compactMap { $0.int("n") } }
        return (outcomes, stored)
    }

    @Test("Writers that arrive together share commits; each gets its own outcome", arguments: Engine.available)
    func together(engine: Engine) async throws {
        let (outcomes, stored) = try await Self.writeTogether(engine, count: 200, failing: nil)
        #expect(outcomes.allSatisfy { $0 })
        #expect(stored == (0..<200).map(Int64.init))
    }

    @Test("One failing writer fails alone: the others of its batch are written again without it", arguments: Engine.available)
    func failingAlone(engine: Engine) async throws {
        let (outcomes, stored) = try await Self.writeTogether(engine, count: 200, failing: 57)
        #expect(outcomes.enumerated().allSatisfy { $0.offset == 57 ? !$0.element : $0.element })
        #expect(stored == (0..<200).filter { $0 != 57 }.map(Int64.init))
    }
}
