import Foundation

/// Runs work at moments ahead on the monotonic clock, from one thread of its own and one heap of deadlines for all of
/// it: thousands of pending alarms cost a heap entry each, not a timer or a thread each. The thread starts with the
/// first alarm and ends when none is left. Setting the wall clock back delays nothing.
///
/// Work runs on the alarms' thread (or on the caller's, for `fireNow` and `fireAll`), so it must be quick and must
/// not block: it hands anything longer to a task or a queue. (A thread that found nothing pending may still be running
/// its last work when an alarm set meanwhile starts the next one.)
public final class Alarms: @unchecked Sendable {  // every field but `wakeUps`, `name` and `slack` is guarded by `lock`
    private let name: String
    private let lock = NSLock()
    /// Wakes the thread early for an alarm sooner than the one it waits for.
    private let wakeUps = DispatchSemaphore(value: 0)
    private var heap = DeadlineHeap()
    private var pending: [UInt64: @Sendable () -> Void] = [:]
    private var lastID: UInt64 = 0
    private var running = false
    /// How late an alarm may run (nanoseconds), so that alarms due close together run in one wake of the thread.
    private let slack: UInt64

    /// `name` names the thread (for profiles and debuggers). `slack`: how late an alarm may run so that the alarms due
    /// within it of the soonest run together, in one wake of the thread rather than one each (zero: each at its moment).
    public init(name: String, slack: Duration = .zero) {
        self.name = name
        self.slack = Self.nanoseconds(slack)
    }

    /// Batches of alarms the thread has run, each in one wake (for tests and profiles).
    public var wakes: Int { lock.withLock { wakeCount } }
    private var wakeCount = 0

    /// Alarms not yet fired.
    public var count: Int { lock.withLock { pending.count } }

    /// Whether the thread runs: it ends when no alarm is pending.
    public var threadRunning: Bool { lock.withLock { running } }

    /// Runs `work` on the alarms' thread once `delay` has passed (at most a day; zero or less: at the thread's next
    /// turn). Returns the alarm's id, for `fireNow`.
    @discardableResult
    public func schedule(after delay: Duration, _ work: @escaping @Sendable () -> Void) -> UInt64 {
        let nanoseconds = Self.nanoseconds(delay)
        lock.lock()
        lastID += 1
        let id = lastID
        pending[id] = work
        let due = Monotonic.now + nanoseconds
        heap.push(deadline: due, id: id)
        let soonest = heap.soonest == due
        let start = !running
        running = true
        lock.unlock()
        if start {
            let thread = Thread { [self] in run() }
            thread.name = name
            thread.start()
        } else if soonest {
            wakeUps.signal()
        }
        return id
    }

    /// `delay` in nanoseconds, from zero (a delay of zero or less) to a day.
    private static func nanoseconds(_ delay: Duration) -> UInt64 {
        let (seconds, attoseconds) = delay.components
        return seconds < 0 || (seconds == 0 && attoseconds <= 0) ? 0
            : seconds >= 86_400 ? 86_400 * 1_000_000_000 : UInt64(seconds) * 1_000_000_000 + UInt64(attoseconds / 1_000_000_000)
    }

    /// Runs the alarm's work now, on the caller's thread, unless it has run already (then false).
    @discardableResult
    public func fireNow(_ id: UInt64) -> Bool {
        guard let work = lock.withLock({ pending.removeValue(forKey: id) }) else { return false }
        work()
        return true
    }

    /// Runs every pending alarm's work now, on the caller's thread, soonest first (a server shutting down answers
    /// what it held).
    public func fireAll() {
        let all = lock.withLock { () -> [@Sendable () -> Void] in
            var due: [@Sendable () -> Void] = []
            while let id = heap.popDue(now: .max) {
                if let work = pending.removeValue(forKey: id) { due.append(work) }
            }
            return due
        }
        for work in all { work() }
    }

    /// Runs what is due, then waits for the next (at most a second) or a sooner alarm; ends when none is pending.
    private func run() {
        while true {
            var due: [@Sendable () -> Void] = []
            let now = Monotonic.now
            lock.lock()
            while let id = heap.popDue(now: now) {
                if let work = pending.removeValue(forKey: id) { due.append(work) }
            }
            if !due.isEmpty { wakeCount += 1 }
            if pending.isEmpty {
                // Every entry left belongs to an alarm fired early.
                heap = DeadlineHeap()
                running = false
                lock.unlock()
                for work in due { work() }
                return
            }
            if heap.count > 1024, heap.count > 2 * pending.count {
                heap.removeAll { pending[$0] != nil }  // alarms fired early leave their entries behind
            }
            let wait = heap.soonest.map { $0 > now ? min($0 - now + slack, 1_000_000_000) : 0 } ?? 1_000_000_000
            lock.unlock()
            for work in due { work() }
            _ = wakeUps.wait(timeout: .now() + .nanoseconds(Int(wait)))
        }
    }
}
