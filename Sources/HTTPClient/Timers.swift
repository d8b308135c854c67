import Clocks
/// Ids in the order of a moment that only grows (when each request's last byte went out): the oldest are at the front,
/// so what is due is a prefix.
struct MomentQueue {
    private var entries: [(moment: UInt64, id: UInt64)] = []
    private var head = 0

    var count: Int { entries.count - head }

    mutating func append(moment: UInt64, id: UInt64) { entries.append((moment, id)) }

    /// The id at the front if it was appended at or before `moment`, removed from the queue.
    mutating func popFirst(atOrBefore moment: UInt64) -> UInt64? {
        guard head < entries.count, entries[head].moment <= moment else { return nil }
        let id = entries[head].id
        head += 1
        if head == entries.count {
            entries.removeAll(keepingCapacity: entries.count <= 4096)
            head = 0
        } else if head > 1024 && head * 2 > entries.count {
            entries.removeFirst(head)
            head = 0
        }
        return id
    }
}
