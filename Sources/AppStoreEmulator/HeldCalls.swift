import Foundation
import HTTPClient

/// Holds calls for a fault's latency: one thread and one heap of wake-up times for every held call of the process.
///
/// `Task.sleep` arms a Dispatch timer source per call; an emulator holding thousands of verifyReceipt calls for 3–6 s
/// spent 4.3% of its CPU on those timers (bench/README.md, twentieth round). Here a held call costs a heap entry and
/// one resume. Cancelling the waiting task ends its wait at once, as `Task.sleep` does.
final class HeldCalls: @unchecked Sendable {  // every field but `wakeUps` is guarded by `lock`
    static let shared = HeldCalls()

    private enum Waiter {
        case pending  // its continuation not handed over yet
        case waiting(CheckedContinuation<Void, Never>)
        case cancelled
    }

    private let lock = NSLock()
    /// Wakes the thread early for a hold sooner than the one it waits for; its waits are on the monotonic clock
    /// (`DispatchTime`), so setting the wall clock back delays nothing.
    private let wakeUps = DispatchSemaphore(value: 0)
    private var heap = DeadlineHeap()
    private var waiters: [UInt64: Waiter] = [:]
    private var lastID: UInt64 = 0
    private var running = false

    init() {}

    /// Calls held now (for tests).
    var count: Int { lock.withLock { waiters.count } }

    /// Whether the thread runs (for tests): it ends when nothing is held.
    var threadRunning: Bool { lock.withLock { running } }

    /// Returns after `duration`, or at once when the task is cancelled.
    func hold(for duration: Duration) async {
        guard duration > .zero else { return }
        let (seconds, attoseconds) = duration.components
        // At most a day (a fault's latency is seconds).
        let nanoseconds = seconds >= 86_400 ? 86_400 * 1_000_000_000 : UInt64(seconds) * 1_000_000_000 + UInt64(attoseconds / 1_000_000_000)
        let id: UInt64 = lock.withLock {
            lastID += 1
            waiters[lastID] = .pending
            return lastID
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                lock.lock()
                if case .cancelled = waiters[id] {
                    waiters[id] = nil
                    lock.unlock()
                    continuation.resume()
                    return
                }
                waiters[id] = .waiting(continuation)
                let due = Monotonic.now + nanoseconds
                heap.push(deadline: due, id: id)
                let soonest = heap.soonest == due
                let start = !running
                running = true
                lock.unlock()
                if start {
                    let thread = Thread { [self] in run() }
                    thread.name = "storekeeper-held-calls"
                    thread.start()
                } else if soonest {
                    wakeUps.signal()
                }
            }
        } onCancel: {
            lock.lock()
            switch waiters[id] {
            case .waiting(let continuation):
                waiters[id] = nil
                lock.unlock()
                continuation.resume()
            case .pending:
                waiters[id] = .cancelled  // `hold` resumes at once when it hands its continuation over
                lock.unlock()
            case .cancelled, nil:  // nil: already woken
                lock.unlock()
            }
        }
    }

    /// Wakes what is due, then waits for the next (at most a second) or a sooner hold; ends when nothing is held.
    private func run() {
        while true {
            var due: [CheckedContinuation<Void, Never>] = []
            let now = Monotonic.now
            lock.lock()
            while let id = heap.popDue(now: now) {
                if case .waiting(let continuation) = waiters.removeValue(forKey: id) { due.append(continuation) }
            }
            if waiters.isEmpty {
                // Every entry left belongs to a cancelled hold.
                heap = DeadlineHeap()
                running = false
                lock.unlock()
                for continuation in due { continuation.resume() }
                return
            }
            let wait = heap.soonest.map { min($0 - now, 1_000_000_000) } ?? 1_000_000_000
            lock.unlock()
            for continuation in due { continuation.resume() }
            _ = wakeUps.wait(timeout: .now() + .nanoseconds(Int(wait)))
        }
    }
}
