import Foundation
import Locking
@testable import PurchaseServer
import Storage
import Testing

@Suite("Group commit")
struct GroupCommitTests {
    /// Writes `count` rows together, the one at `failing` throwing; answers each writer's outcome and the rows stored.
    static func writeTogether(_ engine: Engine, count: Int, failing: Int?, lanes: Int = 1) async throws -> (outcomes: [Bool], stored: [Int64]) {
        let database = try await engine.makeDatabase()
        defer { Task { await database.close() } }
        let table = "group_commit_\(UUID().uuidString.prefix(8).lowercased())"
        try await database.transaction { db in try db.run("CREATE TABLE \(table) (n BIGINT PRIMARY KEY)") }
        struct Refused: Error {}
        let commits = GroupCommit<Int, Int>(maxBatch: 64, lanes: lanes)
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

    @Test("With two lanes, two batches commit at once and every writer still gets its own outcome", arguments: Engine.available)
    func lanes(engine: Engine) async throws {
        let (outcomes, stored) = try await Self.writeTogether(engine, count: 300, failing: 123, lanes: 2)
        #expect(outcomes.enumerated().allSatisfy { $0.offset == 123 ? !$0.element : $0.element })
        #expect(stored == (0..<300).filter { $0 != 123 }.map(Int64.init))
    }

    @Test("Batches at once never exceed the lanes, and a second lane is used when writers wait", arguments: [1, 2, 3])
    func concurrency(lanes: Int) async throws {
        let commits = GroupCommit<Int, Int>(maxBatch: 8, lanes: lanes)
        final class Gauge: Sendable { let state = Locked((now: 0, most: 0)) }
        let gauge = Gauge()
        await withTaskGroup(of: Void.self) { group in
            for index in 0..<200 {
                group.addTask {
                    _ = try? await commits.write(index) { items in
                        gauge.state.withLock { $0.now += 1; $0.most = max($0.most, $0.now) }
                        try? await Task.sleep(for: .milliseconds(5))
                        gauge.state.withLock { $0.now -= 1 }
                        return items.map { .success($0) }
                    }
                }
            }
        }
        #expect(gauge.state.withLock { $0.most } == lanes)
    }
}
