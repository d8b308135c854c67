import Foundation

/// Nanoseconds on the monotonic clock.
public enum Monotonic {
    public static var now: UInt64 {
        var spec = timespec()
        clock_gettime(CLOCK_MONOTONIC, &spec)
        return UInt64(spec.tv_sec) * 1_000_000_000 + UInt64(spec.tv_nsec)
    }
}

/// Ids by deadline, soonest first (a binary min-heap of monotonic nanoseconds and ids): the HTTP client's
/// requests' deadlines, and `Alarms`' work.
///
/// The event loop pushes each request once, when it is submitted, and pops only the entries that are due, so a sweep
/// costs what ends rather than what is held: thousands of calls wait seconds on Apple. An entry is not removed when
/// its request finishes early; the loop skips ids it no longer holds, and drops the stale entries with
/// `removeAll(keeping:)` once they outnumber the live ones (callers may give timeouts of hours).
public struct DeadlineHeap {
    struct Entry {
        let deadline: UInt64
        let id: UInt64
    }

    private(set) var entries: [Entry] = []

    public init() {}

    public var count: Int { entries.count }

    /// The soonest deadline, if any.
    public var soonest: UInt64? { entries.first?.deadline }

    public mutating func push(deadline: UInt64, id: UInt64) {
        entries.append(Entry(deadline: deadline, id: id))
        var child = entries.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard entries[child].deadline < entries[parent].deadline else { break }
            entries.swapAt(child, parent)
            child = parent
        }
    }

    /// The id of the soonest entry if its deadline is at or before `now`, removed from the heap.
    public mutating func popDue(now: UInt64) -> UInt64? {
        guard let first = entries.first, first.deadline <= now else { return nil }
        let last = entries.removeLast()
        guard !entries.isEmpty else { return first.id }
        entries[0] = last
        var parent = 0
        while true {
            let left = 2 * parent + 1
            guard left < entries.count else { break }
            let right = left + 1
            let smaller = right < entries.count && entries[right].deadline < entries[left].deadline ? right : left
            guard entries[smaller].deadline < entries[parent].deadline else { break }
            entries.swapAt(parent, smaller)
            parent = smaller
        }
        return first.id
    }

    /// Keeps only the entries whose id `live` accepts, in heap order again.
    public mutating func removeAll(keeping live: (UInt64) -> Bool) {
        let kept = entries.filter { live($0.id) }
        entries = []
        entries.reserveCapacity(kept.count)
        for entry in kept { push(deadline: entry.deadline, id: entry.id) }
    }
}

