import Foundation
import Locking
import Synchronization

/// Token buckets of uploads per app, in this process: `rate` per second with bursts of two
/// seconds' worth. Protects storage from junk; verification's own queue absorbs honest bursts.
final class UploadRateLimiter: Sendable {
    private let buckets = Locked<[String: (tokens: Double, updated: ContinuousClock.Instant)]>([:])
    /// Uploads per second and app (0: unlimited).
    let rate: Double

    init(rate: Double) { self.rate = rate }

    /// Takes one token for `key`; returns the seconds to wait when there is none.
    func take(_ key: String, now: ContinuousClock.Instant = .now) -> Double? {
        guard rate > 0 else { return nil }
        let capacity = rate * 2
        return buckets.withLock { buckets in
            var bucket = buckets[key] ?? (capacity, now)
            let elapsed = now - bucket.updated
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            bucket.tokens = min(capacity, bucket.tokens + seconds * rate)
            bucket.updated = now
            defer { buckets[key] = bucket }
            guard bucket.tokens >= 1 else { return (1 - bucket.tokens) / rate }
            bucket.tokens -= 1
            return nil
        }
    }
}
