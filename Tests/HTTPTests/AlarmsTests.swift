import Clocks
import Locking
import Testing

@Suite("Alarms: work run at moments ahead from one thread")
struct AlarmsTests {
    /// Schedules work after each delay (milliseconds) and waits until all of it ran; returns, for each, how long after
    /// scheduling it ran (milliseconds), and the batches the thread ran.
    private func run(delays: [Int], slack: Duration) async throws -> (ranAfter: [Double], wakes: Int) {
        let alarms = Alarms(name: "storekeeper-test-alarms", slack: slack)
        let ran = Locked<[Int: UInt64]>([:])
        let start = Monotonic.now
        for (index, delay) in delays.enumerated() {
            alarms.schedule(after: .milliseconds(delay)) { ran.withLock { $0[index] = Monotonic.now } }
        }
        for _ in 0..<500 where ran.withLock({ $0.count }) < delays.count {
            try await Task.sleep(for: .milliseconds(10))
        }
        let times = ran.withLock { $0 }
        try #require(times.count == delays.count)
        return (delays.indices.map { Double(times[$0]! - start) / 1e6 }, alarms.wakes)
    }

    @Test("With slack, the alarms due within it of the soonest run together in one wake, none before its moment")
    func slackRunsAlarmsTogether() async throws {
        let delays = [10, 40, 70]
        let (ranAfter, wakes) = try await run(delays: delays, slack: .milliseconds(300))
        #expect(wakes == 1)
        for (delay, after) in zip(delays, ranAfter) { #expect(after >= Double(delay)) }
    }

    @Test("Without slack, each alarm runs at its own moment, in a wake of its own")
    func noSlackRunsEachAlone() async throws {
        let delays = [0, 500, 1000]
        let (ranAfter, wakes) = try await run(delays: delays, slack: .zero)
        #expect(wakes == 3)
        for (delay, after) in zip(delays, ranAfter) { #expect(after >= Double(delay)) }
    }
}
