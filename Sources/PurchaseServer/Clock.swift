import Foundation
import Synchronization

/// Where the server reads "now"; injected so tests control time.
public protocol ServerClock: Sendable {
    func now() -> Date
}

/// The system clock.
public struct SystemClock: ServerClock {
    public init() {}
    public func now() -> Date { Date() }
}

/// A settable clock for tests.
public final class ManualClock: ServerClock {
    private let current: Mutex<Date>
    public init(_ date: Date) { current = Mutex(date) }
    public func now() -> Date { current.withLock { $0 } }
    public func advance(by seconds: TimeInterval) { current.withLock { $0 = $0.addingTimeInterval(seconds) } }
}

/// A wake-up signal for a loop that otherwise sleeps: `wake()` ends the current or next `wait`.
final class WakeSignal: Sendable {
    private let state = Mutex<(pending: Bool, waiter: CheckedContinuation<Void, Never>?)>((false, nil))

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

    /// Returns when woken or after `timeout`.
    func wait(timeout: Duration) async {
        let timer = Task { [weak self] in
            try? await Task.sleep(for: timeout)
            self?.wake()
        }
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
        timer.cancel()
        state.withLock { $0.pending = false }
    }
}
