import Foundation
import Locking
import Synchronization

/// Where every part of Storekeeper reads "now": the emulator, the purchase server, the device client and
/// their tests. Injected, so renewals, expiry, retries and leases are testable without sleeping; rules take
/// the time as a parameter and never read a clock themselves.
public protocol WallClock: Sendable {
    /// The current time.
    func now() -> Date
}

/// The system clock.
public struct SystemClock: WallClock {
    public init() {}
    public func now() -> Date { Date() }
}

/// A base clock (the system clock by default) shifted by an offset that can be moved: the emulator's clock
/// (`appstore time advance|set`), and a purchase server following that emulator so both judge expiry alike.
public final class AdjustableClock: WallClock {
    private let offset: Locked<TimeInterval>
    private let base: @Sendable () -> Date

    /// Creates a clock over `base` (the system clock by default).
    public init(offset: TimeInterval = 0, base: @escaping @Sendable () -> Date = { Date() }) {
        self.offset = Locked(offset)
        self.base = base
    }

    public func now() -> Date { base().addingTimeInterval(offset.withLock { $0 }) }

    /// The current offset from the base clock in seconds.
    public var currentOffset: TimeInterval { offset.withLock { $0 } }

    /// Moves time forward (or back, with a negative interval).
    public func advance(by interval: TimeInterval) { offset.withLock { $0 += interval } }

    /// Replaces the offset.
    public func set(offset seconds: TimeInterval) { offset.withLock { $0 = seconds } }

    /// Jumps to a date.
    public func set(to date: Date) {
        let baseNow = base()
        offset.withLock { $0 = date.timeIntervalSince(baseNow) }
    }
}

/// A clock that stands still until advanced, for tests.
public final class ManualClock: WallClock {
    private let current: Locked<Date>
    public init(_ date: Date) { current = Locked(date) }
    public func now() -> Date { current.withLock { $0 } }
    public func advance(by seconds: TimeInterval) { current.withLock { $0 = $0.addingTimeInterval(seconds) } }
}

/// A clock read from elsewhere (a closure), e.g. the emulator's clock in the same process.
public struct DelegatingClock: WallClock {
    private let read: @Sendable () -> Date
    public init(_ read: @escaping @Sendable () -> Date) { self.read = read }
    public func now() -> Date { read() }
}
