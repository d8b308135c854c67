import Foundation
#if os(Linux)
import CSystem
#endif
import Locking
import Synchronization

/// Where every part of Storekeeper gets new identifiers (job ids, audit ids, notification UUIDs, order ids):
/// injected like the clock, so a test can make them predictable and rules never make them up.
public protocol IDGenerator: Sendable {
    /// A new identifier.
    func next() -> UUID
    /// A new identifier that sorts after those made in earlier milliseconds: for the keys of rows written in time
    /// order (jobs, audit events, webhook events), so that each is written at the end of its index, on a page just
    /// written, not on a random page of it. Not for what must not tell when it was made.
    func nextOrdered() -> UUID
}

extension IDGenerator {
    /// A new identifier in the lowercase form Apple and Storekeeper write (`notificationUUID`, job ids).
    public func nextString() -> String { next().lowercasedString }

    /// `nextOrdered()` in the same lowercase form.
    public func nextOrderedString() -> String { nextOrdered().lowercasedString }

    /// A generator whose identifiers already come in order (`SequentialIDs`) needs nothing else.
    public func nextOrdered() -> UUID { next() }
}

/// Random version-4 UUIDs, and version-7 ones for ordered keys (their time from the system clock): the production source.
///
/// The bits come from the system generator (`getrandom(2)` on Linux). Foundation's `UUID()` opens and closes
/// `/dev/urandom` on every call there, which cost about 2% of the server's CPU per receipt.
public struct RandomIDs: IDGenerator {
    public init() {}
    public func next() -> UUID {
        let (first, second) = Self.randomWords()
        // Version 4 in the high nibble of byte 6, variant 10 in the top bits of byte 8 (RFC 9562).
        let high = first & 0xffff_ffff_ffff_0fff | 0x0000_0000_0000_4000
        let low = second & 0x3fff_ffff_ffff_ffff | 0x8000_0000_0000_0000
        return Self.uuid(high: high, low: low)
    }

    /// Version 7 (RFC 9562): the Unix time in milliseconds in the first 48 bits, then 74 random bits (12 after the
    /// version, 62 after the variant). Ids of the same millisecond are in no particular order.
    public func nextOrdered() -> UUID {
        let (first, second) = Self.randomWords()
        let high = Self.milliseconds(Date()) << 16 | 0x7000 | first & 0x0fff
        let low = second & 0x3fff_ffff_ffff_ffff | 0x8000_0000_0000_0000
        return Self.uuid(high: high, low: low)
    }

    /// Sixteen bytes from the system generator in one `getrandom(2)` call (the standard generator makes one call per eight
    /// bytes: two system calls for every id, on the SQLite writer's thread for each audit row). If the call fails or
    /// returns short, the standard generator, which does not fail.
    private static func randomWords() -> (UInt64, UInt64) {
        var words: (UInt64, UInt64) = (0, 0)
        #if os(Linux)
        let filled = withUnsafeMutableBytes(of: &words) { getrandom($0.baseAddress, $0.count, 0) }
        if filled == MemoryLayout<(UInt64, UInt64)>.size { return words }
        #endif
        var generator = SystemRandomNumberGenerator()
        return (generator.next(), generator.next())
    }

    /// A version-7 id's first 48 bits: the Unix time in milliseconds.
    private static func milliseconds(_ date: Date) -> UInt64 {
        UInt64(max(0, (date.timeIntervalSince1970 * 1000).rounded(.down))) & 0xffff_ffff_ffff
    }

    private static func uuid(high: UInt64, low: UInt64) -> UUID {
        func byte(_ word: UInt64, _ index: UInt64) -> UInt8 { UInt8(truncatingIfNeeded: word >> (56 - 8 * index)) }
        return UUID(uuid: (byte(high, 0), byte(high, 1), byte(high, 2), byte(high, 3), byte(high, 4), byte(high, 5), byte(high, 6), byte(high, 7),
                           byte(low, 0), byte(low, 1), byte(low, 2), byte(low, 3), byte(low, 4), byte(low, 5), byte(low, 6), byte(low, 7)))
    }
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

extension UUID {
    /// `uuidString.lowercased()`, written directly: the settlement's audit rows and every job take one, on the SQLite
    /// writer's thread, and Foundation's string and its lowercased copy were a quarter of writing an audit row.
    public var lowercasedString: String {
        let digits: StaticString = "0123456789abcdef"
        return withUnsafeBytes(of: uuid) { bytes in
            String(unsafeUninitializedCapacity: 36) { buffer in
                var offset = 0
                for (index, byte) in bytes.enumerated() {
                    if index == 4 || index == 6 || index == 8 || index == 10 {
                        buffer[offset] = UInt8(ascii: "-")
                        offset += 1
                    }
                    buffer[offset] = digits.utf8Start[Int(byte >> 4)]
                    buffer[offset + 1] = digits.utf8Start[Int(byte & 0x0f)]
                    offset += 2
                }
                return offset
            }
        }
    }
}

extension RandomIDs {
    /// The text below which the lowercase form of every version-7 id made before `date`'s millisecond sorts, and above
    /// which every one made from it on sorts: its first 48 bits, the time, as `xxxxxxxx-xxxx` (byte order, as in SQLite).
    public static func orderedBound(_ date: Date) -> String {
        String(uuid(high: milliseconds(date) << 16, low: 0).lowercasedString.prefix(13))
    }
}
