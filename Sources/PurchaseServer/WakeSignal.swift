import Foundation
import Locking
import Synchronization

/// A wake-up signal for a loop that otherwise sleeps: `wake()` ends the current or next `wait`.
///
/// The timeout is kept by one ticker per signal, not a timer per wait: a worker woken a thousand times a second
/// would otherwise leave a thousand cancelled timers a second in Dispatch's timer heap.
final class WakeSignal: Sendable {
    private struct State {
        var pending = false
        var waiter: CheckedContinuation<Void, Never>?
        var ticker: Task<Void, Never>?
        var interval: Duration?
    }
    private let state = Locked(State())

    deinit { state.withLock { $0.ticker?.cancel() } }

    func wake() {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            if let waiter = state.waiter {
                state.waiter = nil
                return waiter
            }
            state.pending = true
            return nil
        }
        waiter?.resume()
    }

    /// Whether a wake-up is waiting for the next `wait` (nobody was waiting when it came).
    var isPending: Bool { state.withLock { $0.pending } }

    /// Returns when woken, or at the latest after `timeout` (the ticker's next beat).
    func wait(timeout: Duration) async {
        startTicker(every: max(timeout, .milliseconds(10)))
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let resumeNow = state.withLock { state -> Bool in
                if state.pending {
                    state.pending = false
                    return true
                }
                state.waiter = continuation
                return false
            }
            if resumeNow { continuation.resume() }
        }
        state.withLock { $0.pending = false }
    }

    /// Starts (or, for a new interval, restarts) the ticker that wakes a waiter every `interval`.
    private func startTicker(every interval: Duration) {
        let previous = state.withLock { state -> Task<Void, Never>?? in
            guard state.interval != interval else { return .none }
            state.interval = interval
            let old = state.ticker
            state.ticker = Task { [weak self] in
                while !Task.isCancelled {
                    try? await Task.sleep(for: interval)
                    guard let self, !Task.isCancelled else { return }
                    self.wakeWaiter()
                }
            }
            return .some(old)
        }
        if case .some(let old) = previous { old?.cancel() }
    }

    /// Wakes a loop that is waiting, without leaving a wake-up for one that is busy (a beat, not news).
    private func wakeWaiter() {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }
}
