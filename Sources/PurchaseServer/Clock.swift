import Foundation
import Locking
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

/// The system clock shifted by an offset that something else keeps current — for a server that follows an
/// App Store emulator whose clock was moved forward (`appstore time advance`), so both judge expiry alike.
public final class OffsetClock: ServerClock {
    private let offset = Locked<TimeInterval>(0)
    public init() {}
    public func now() -> Date { Date().addingTimeInterval(offset.withLock { $0 }) }
    public func set(offset seconds: TimeInterval) { offset.withLock { $0 = seconds } }
}

/// A clock read from elsewhere (a closure), e.g. the emulator's clock in the same process.
public struct DelegatingClock: ServerClock {
    private let read: @Sendable () -> Date
    public init(_ read: @escaping @Sendable () -> Date) { self.read = read }
    public func now() -> Date { read() }
}

/// A settable clock for tests.
public final class ManualClock: ServerClock {
    private let current: Locked<Date>
    public init(_ date: Date) { current = Locked(date) }
    public func now() -> Date { current.withLock { $0 } }
    public func advance(by seconds: TimeInterval) { current.withLock { $0 = $0.addingTimeInterval(seconds) } }
}

/// A wake-up signal for a loop that otherwise sleeps: `wake()` ends the current or next `wait`.
final class WakeSignal: Sendable {
    private let state = Locked<(pending: Bool, waiter: CheckedContinuation<Void, Never>?)>((false, nil))

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
