import Foundation

/// Holds calls for a fault's latency: one thread and one heap of wake-up times for every held call of the process.
///
/// `Task.sleep` arms a Dispatch timer source per call; an emulator holding thousands of verifyReceipt calls for 3–6 s
/// spent 4.3% of its CPU on those timers (bench/README.md, twentieth round). Here a held call costs a heap entry and
/// one resume. Cancelling the waiting task ends its wait at once, as `Task.sleep` does.
final class HeldCalls: @unchecked Sendable {  // every field is guarded by `condition`
    static let shared = HeldCalls()

    private struct Entry {
        let due: UInt64
        let id: UInt64
    }

    private enum Waiter {
        case pending  // its continuation not handed over yet
        case waiting(CheckedContinuation<Void, Never>)
        case cancelled
    }

    private let condition = NSCondition()
    private var heap: [Entry] = []
    private var waiters: [UInt64: Waiter] = [:]
    private var lastID: UInt64 = 0
    private var started = false

    /// Calls held now (for tests).
    var count: Int { condition.withLock { waiters.count } }

    /// Returns after `duration`, or at once when the task is cancelled.
    func hold(for duration: Duration) async {
        guard duration > .zero else { return }
        let (seconds, attoseconds) = duration.components
        // At most a day (a fault's latency is seconds).
        let nanoseconds = seconds >= 86_400 ? 86_400 * 1_000_000_000 : UInt64(seconds) * 1_000_000_000 + UInt64(attoseconds / 1_000_000_000)
        let id: UInt64 = condition.withLock {
            lastID += 1
            waiters[lastID] = .pending
            return lastID
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                condition.lock()
                if case .cancelled = waiters[id] {
                    waiters[id] = nil
                    condition.unlock()
                    continuation.resume()
                    return
                }
                waiters[id] = .waiting(continuation)
                let due = Self.now + nanoseconds
                push(Entry(due: due, id: id))
                if !started {
                    started = true
                    let thread = Thread { [self] in run() }
                    thread.name = "storekeeper-held-calls"
                    thread.start()
                }
                if heap[0].id == id { condition.signal() }  // sooner than the thread is waiting for
                condition.unlock()
            }
        } onCancel: {
            condition.lock()
            switch waiters[id] {
            case .waiting(let continuation):
                waiters[id] = nil
                condition.unlock()
                continuation.resume()
            case .pending:
                waiters[id] = .cancelled  // `hold` resumes at once when it hands its continuation over
                condition.unlock()
            case .cancelled, nil:  // nil: already woken
                condition.unlock()
            }
        }
    }

    private func run() {
        condition.lock()
        while true {
            guard let first = heap.first else {
                condition.wait()
                continue
            }
            let now = Self.now
            guard first.due <= now else {
                // At most a second: the wait is on the wall clock, which may be set back.
                _ = condition.wait(until: Date(timeIntervalSinceNow: min(1, Double(first.due - now) / 1e9)))
                continue
            }
            var due: [CheckedContinuation<Void, Never>] = []
            while let entry = heap.first, entry.due <= now {
                popFirst()
                if case .waiting(let continuation) = waiters.removeValue(forKey: entry.id) { due.append(continuation) }
            }
            condition.unlock()
            for continuation in due { continuation.resume() }
            condition.lock()
        }
    }

    private func push(_ entry: Entry) {
        heap.append(entry)
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard heap[child].due < heap[parent].due else { break }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    private func popFirst() {
        let last = heap.removeLast()
        guard !heap.isEmpty else { return }
        heap[0] = last
        var parent = 0
        while true {
            let left = 2 * parent + 1
            guard left < heap.count else { break }
            let right = left + 1
            let smaller = right < heap.count && heap[right].due < heap[left].due ? right : left
            guard heap[smaller].due < heap[parent].due else { break }
            heap.swapAt(parent, smaller)
            parent = smaller
        }
    }

    private static var now: UInt64 {
        var spec = timespec()
        clock_gettime(CLOCK_MONOTONIC, &spec)
        return UInt64(spec.tv_sec) * 1_000_000_000 + UInt64(spec.tv_nsec)
    }
}
