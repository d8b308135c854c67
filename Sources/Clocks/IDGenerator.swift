import Foundation
import Locking
import Synchronization

/// Where every part of Storekeeper gets new identifiers (job ids, audit ids, notification UUIDs, order ids):
/// injected like the clock, so a test can make them predictable and rules never make them up.
public protocol IDGenerator: Sendable {
    /// A new identifier.
    func next() -> UUID
}

extension IDGenerator {
    /// A new identifier in the lowercase form Apple and Storekeeper write (`notificationUUID`, job ids).
    public func nextString() -> String { next().uuidString.lowercased() }
}

/// Random version-4 UUIDs: the production source.
public struct RandomIDs: IDGenerator {
    public init() {}
    public func next() -> UUID { UUID() }
}

/// `00000000-0000-4000-8000-000000000001`, `…002`, …: predictable identifiers for tests (still valid
/// version-4 UUIDs, so code that checks the form accepts them).
public final class SequentialIDs: IDGenerator {
    private let counter: Locked<UInt64>
    private let prefix: UInt16

    /// Counts from `start`; `prefix` (the third group's last bytes) tells two generators apart.
    public init(start: UInt64 = 1, prefix: UInt16 = 0) {
        counter = Locked(start)
        self.prefix = prefix
    }

    public func next() -> UUID {
        let value = counter.withLock { value -> UInt64 in
            defer { value &+= 1 }
            return value
        }
        let text = String(format: "00000000-0000-4%03x-8000-%012llx", Int(prefix & 0xfff), value & 0xffff_ffff_ffff)
        return UUID(uuidString: text)!
    }
}
