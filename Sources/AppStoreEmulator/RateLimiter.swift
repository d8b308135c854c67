import Foundation
import Locking
import Synchronization

/// Fixed hourly windows of requests per key, as Apple enforces Server API limits ("per hour").
final class RateLimiter: Sendable {
    private let windows = Locked<[String: (start: Date, count: Int)]>([:])

    /// Counts one request; returns when the window reopens if `limit` is already used up.
    func take(_ key: String, limit: Int, now: Date = Date()) -> Date? {
        windows.withLock { windows in
            var window = windows[key] ?? (now, 0)
            if now.timeIntervalSince(window.start) >= 3600 { window = (now, 0) }
            guard window.count < limit else { return window.start.addingTimeInterval(3600) }
            window.count += 1
            windows[key] = window
            return nil
        }
    }
}
