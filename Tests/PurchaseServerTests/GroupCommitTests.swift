import Foundation
import Locking
@testable import PurchaseServer
import Storage
import Synchronization
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

    @Test("A small batch waits until its oldest item is 10 ms old, only while writers arrive fast enough to at least double it")
    func gatheringRule() {
        let rule = Gathering(wait: .milliseconds(10), below: 64)
        // Items 0.4 ms apart (2,500 a second): 25 expected during the whole wait.
        #expect(rule.pause(pending: 1, meanGap: 400_000, oldestAge: 0) == .milliseconds(10))
        #expect(rule.pause(pending: 25, meanGap: 400_000, oldestAge: 0) == .milliseconds(10))
        #expect(rule.pause(pending: 26, meanGap: 400_000, oldestAge: 0) == nil)
        // The wait counts from the oldest item's arrival: 4 ms old, it waits 6 ms if that still doubles the batch.
        #expect(rule.pause(pending: 5, meanGap: 400_000, oldestAge: 4_000_000) == .milliseconds(6))
        #expect(rule.pause(pending: 16, meanGap: 400_000, oldestAge: 4_000_000) == nil)
        // Gathered while the batch before committed for 10 ms or more: taken at once.
        #expect(rule.pause(pending: 3, meanGap: 400_000, oldestAge: 10_000_000) == nil)
        #expect(rule.pause(pending: 3, meanGap: 400_000, oldestAge: 60_000_000) == nil)
        // A batch as large as `below` is taken at once, however fast they come.
        #expect(rule.pause(pending: 64, meanGap: 1_000, oldestAge: 0) == nil)
        #expect(rule.pause(pending: 63, meanGap: 1_000, oldestAge: 0) == .milliseconds(10))
        // A trickle (20 ms apart) or a lone writer after a pause never waits; nor does an empty queue.
        #expect(rule.pause(pending: 1, meanGap: 20_000_000, oldestAge: 0) == nil)
        #expect(rule.pause(pending: 1, meanGap: Double(Gathering.slowestGap), oldestAge: 0) == nil)
        #expect(rule.pause(pending: 0, meanGap: 1_000, oldestAge: 0) == nil)
    }

    @Test("A settlement's batch waits a tenth of what Apple took for its oldest settlement, at most half a second")
    func settlementsWaitATenthOfApple() {
        #expect(Gathering.patience(afterApple: .milliseconds(4_500)) == .milliseconds(450))
        #expect(Gathering.patience(afterApple: .milliseconds(20)) == .milliseconds(2))
        #expect(Gathering.patience(afterApple: .zero) == .zero)
        let rule = Gathering.settlements
        // 3,000 settlements a second: the oldest's patience bounds the wait, counted from its arrival.
        #expect(rule.pause(pending: 1, meanGap: 333_333, oldestAge: 0, patience: .milliseconds(450)) == .milliseconds(450))
        #expect(rule.pause(pending: 100, meanGap: 333_333, oldestAge: 50_000_000, patience: .milliseconds(450)) == .milliseconds(400))
        // Never past the rule's half second, however slow Apple was (a job retried for an hour).
        #expect(rule.pause(pending: 1, meanGap: 333_333, oldestAge: 0, patience: .seconds(360)) == .milliseconds(500))
        // Apple answered at once, or nothing was asked (a signed transaction): taken at once.
        #expect(rule.pause(pending: 1, meanGap: 333_333, oldestAge: 0, patience: .zero) == nil)
        #expect(rule.pause(pending: 1, meanGap: 333_333, oldestAge: 3_000_000, patience: .milliseconds(2)) == nil)
        // As many as a batch holds: taken at once.
        #expect(rule.pause(pending: 2048, meanGap: 1_000, oldestAge: 0, patience: .milliseconds(450)) == nil)
        // Uploads keep their fixed 10 ms.
        #expect(Gathering.uploads.pause(pending: 1, meanGap: 400_000, oldestAge: 0) == .milliseconds(10))
    }

    /// A wait that ends when the test says so, and counts how often it was entered.
    final class Gate: Sendable {
        private let state = Locked((open: false, entered: 0, waiters: [CheckedContinuation<Void, Never>]()))
        var entered: Int { state.withLock { $0.entered } }
        func wait() async {
            await withCheckedContinuation { continuation in
                let open = state.withLock { state -> Bool in
                    state.entered += 1
                    if !state.open { state.waiters.append(continuation) }
                    return state.open
                }
                if open { continuation.resume() }
            }
        }
        func set(open: Bool) {
            let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
                state.open = open
                defer { if open { state.waiters = [] } }
                return open ? state.waiters : []
            }
            for waiter in waiters { waiter.resume() }
        }
    }

    /// Whether `condition` holds within five seconds.
    static func eventually(_ condition: () -> Bool) async -> Bool {
        let deadline = ContinuousClock.now + .seconds(5)
        while !condition() {
            guard ContinuousClock.now < deadline else { return false }
            try? await Task.sleep(for: .milliseconds(1))
        }
        return true
    }

    /// Each batch a flush was given, in order.
    final class Batches: Sendable {
        private let list = Locked<[[Int]]>([])
        var all: [[Int]] { list.withLock { $0 } }
        func clear() { list.withLock { $0 = [] } }
        /// A flush that records its batch and gives each item back.
        var flush: @Sendable ([Int]) async -> [Result<Int, any Error>] {
            { [self] items in
                list.withLock { $0.append(items) }
                return items.map { .success($0) }
            }
        }
    }

    /// A clock the test moves.
    final class Clock: Sendable {
        let nanoseconds = Atomic<UInt64>(1_000_000_000)
        func advance(_ gap: UInt64) { nanoseconds.add(gap, ordering: .relaxed) }
    }

    /// A group commit whose gathering reads `clock` and waits on `gate`.
    static func gatheringCommits(clock: Clock, gate: Gate) -> GroupCommit<Int, Int> {
        let gathering = Gathering(wait: .milliseconds(10), below: 64,
                                  now: { clock.nanoseconds.load(ordering: .relaxed) }, sleep: { _ in await gate.wait() })
        return GroupCommit<Int, Int>(maxBatch: 64, gathering: gathering)
    }

    @Test("Writers one after another at a slow pace are each written at once, never held for company")
    func trickleNeverWaits() async throws {
        let gate = Gate()
        gate.set(open: true)  // a wait is counted, not held
        let clock = Clock()
        let commits = Self.gatheringCommits(clock: clock, gate: gate)
        let batches = Batches()
        // 20 ms apart: each is written the moment it arrives (its age 0), as the pace would not double a batch.
        for index in 0..<20 {
            clock.advance(20_000_000)
            #expect(try await commits.write(index, flush: batches.flush) == index)
        }
        #expect(gate.entered == 0)
        #expect(commits.gathered.load(ordering: .relaxed) == 0)
        #expect(batches.all == (0..<20).map { [$0] })
    }

    @Test("Once writers arrive fast, a small batch waits, and the writers arriving meanwhile join it")
    func fastWritersGather() async throws {
        let gate = Gate()
        gate.set(open: true)
        let clock = Clock()
        let commits = Self.gatheringCommits(clock: clock, gate: gate)
        let batches = Batches()
        // 0.2 ms apart. The pace is learnt from the arrivals: the first 35 or so are taken at once, later ones wait (the gate open).
        for index in 0..<60 {
            clock.advance(200_000)
            _ = try await commits.write(index, flush: batches.flush)
        }
        #expect(batches.all.count == 60)
        #expect(gate.entered > 0 && gate.entered < 60)
        batches.clear()

        gate.set(open: false)
        let entered = gate.entered
        let lead = Task { try await commits.write(100, flush: batches.flush) }
        try #require(await Self.eventually { gate.entered > entered }, "the lone writer's batch did not wait")
        let others = (101...104).map { index in Task { try await commits.write(index, flush: batches.flush) } }
        try #require(await Self.eventually { commits.waiting == 5 })
        #expect(batches.all.isEmpty)
        gate.set(open: true)
        #expect(try await lead.value == 100)
        for (offset, other) in others.enumerated() { #expect(try await other.value == 101 + offset) }
        #expect(batches.all.map { Set($0) } == [Set(100...104)])
    }

    @Test("A batch waits as long as its oldest writer allows: not at all for one that allows none, the rule's wait at most")
    func oldestWritersPatience() async throws {
        let asked = Locked<[Duration]>([])
        let clock = Clock()
        let gathering = Gathering(wait: .milliseconds(500), below: 64, now: { clock.nanoseconds.load(ordering: .relaxed) },
                                  sleep: { duration in asked.withLock { $0.append(duration) } })
        let commits = GroupCommit<Int, Int>(maxBatch: 64, gathering: gathering)
        let batches = Batches()
        // Learn a fast pace (0.2 ms apart) from writers that allow no wait: none of them waits.
        for index in 0..<60 {
            clock.advance(200_000)
            #expect(try await commits.write(index, patience: .zero, flush: batches.flush) == index)
        }
        #expect(asked.withLock { $0 }.isEmpty)
        #expect(commits.gathered.load(ordering: .relaxed) == 0)
        // The same pace, writers that allow 40 ms: the batch waits 40 ms; one allowing a minute waits the rule's 500 ms.
        clock.advance(200_000)
        #expect(try await commits.write(60, patience: .milliseconds(40), flush: batches.flush) == 60)
        clock.advance(200_000)
        #expect(try await commits.write(61, patience: .seconds(60), flush: batches.flush) == 61)
        #expect(asked.withLock { $0 } == [.milliseconds(40), .milliseconds(500)])
    }
}
