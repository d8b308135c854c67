import Dispatch
@testable import PurchaseServer
import Synchronization
import Testing

@Suite("Checks of unauthenticated input: a bounded backlog and a bounded wait")
struct BoundedWorkTests {
    /// Waits (at most 30 s) until `condition` holds; fails the test if it never does.
    static func until(_ condition: @Sendable () -> Bool, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let deadline = ContinuousClock.now + .seconds(30)
        while !condition(), ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(2)) }
        try #require(condition(), sourceLocation: sourceLocation)
    }

    /// Waits until `work` holds `count` checks (running or waiting).
    static func holding(_ work: BoundedWork, _ count: Int) async throws {
        try await until { work.waiting == count }
    }

    @Test("Past the backlog a check is refused at once; one whose turn comes past the wait is refused without running; then checks run again")
    func backlogAndWait() async throws {
        let clock = Mutex(ContinuousClock.now)
        let work = BoundedWork(label: "test.bounded", width: 1, maximumPending: 2, maximumWait: .seconds(1), now: { clock.withLock { $0 } })
        let gate = DispatchSemaphore(value: 0)
        let lateRan = Atomic<Bool>(false), firstRunning = Atomic<Bool>(false)
        defer { gate.signal() }
        let first = Task { try await work.run { firstRunning.store(true, ordering: .relaxed); gate.wait(); return 1 } }
        // Running, so past its own deadline check before the clock moves.
        try await Self.until { firstRunning.load(ordering: .relaxed) }
        try await Self.holding(work, 1)
        let late = Task { try await work.run { lateRan.store(true, ordering: .relaxed); return 2 } }
        try await Self.holding(work, 2)
        await #expect(throws: BoundedWork.Busy.self) { try await work.run { 3 } }
        #expect(work.waiting == 2, "a refused check holds no place")
        // The first check's turn came at once; the second's comes two seconds after it was taken.
        clock.withLock { $0 += .seconds(2) }
        gate.signal()
        #expect(try await first.value == 1)
        let lateResult = await late.result
        #expect(throws: BoundedWork.Busy.self) { try lateResult.get() }
        let ranLate = lateRan.load(ordering: .relaxed)
        #expect(!ranLate, "a check refused for its wait never runs")
        #expect(work.waiting == 0)
        #expect(try await work.run { 4 } == 4)
    }

    @Test("Without a bound on the wait, a check that waited long still runs")
    func noWaitBound() async throws {
        let clock = Mutex(ContinuousClock.now)
        let work = BoundedWork(label: "test.unbounded", width: 1, maximumPending: 2, now: { clock.withLock { $0 } })
        let gate = DispatchSemaphore(value: 0)
        defer { gate.signal() }
        let first = Task { try await work.run { gate.wait(); return 1 } }
        try await Self.holding(work, 1)
        let second = Task { try await work.run { 2 } }
        try await Self.holding(work, 2)
        clock.withLock { $0 += .seconds(3600) }
        gate.signal()
        #expect(try await first.value == 1)
        #expect(try await second.value == 2)
    }
}
