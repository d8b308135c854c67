import Foundation
import Storage

/// PostgreSQL advisory locks on ownership chains (app, environment, original transaction id), held until the
/// transaction ends. Settlements take them before reading a chain's owners: `FOR UPDATE` locks the rows that exist,
/// but a chain nobody owns yet has none, so two settlements running at once (two batches of one process, or two
/// processes) could each see it unowned and both bind it. With the lock, the second waits for the first to commit and
/// then reads its owner.
struct ChainLocks {
    let db: any SQLConnection

    struct Chain: Hashable {
        var appId: String
        var environment: String
        var originalTransactionId: String
    }

    /// Most chains locked one by one in a transaction. PostgreSQL keeps advisory locks in its shared lock table
    /// (`max_locks_per_transaction` × connections slots, 6,400 by default), so a transaction never takes more than
    /// this many plus one: past it, one exclusive lock stands for every chain.
    static let mostLocks = 512
    /// Held shared by a transaction that locks chains one by one, exclusively by one with more than `mostLocks`.
    static let everyChain = key(Chain(appId: "storekeeper", environment: "every", originalTransactionId: "chain"))

    /// Locks every chain, in the order of their keys, the same in every transaction, so that two transactions
    /// locking overlapping chains never wait on each other in a cycle (`everyChain` first in all of them).
    func lock(_ chains: Set<Chain>) throws {
        let keys = Set(chains.map(Self.key)).sorted()
        guard keys.count <= Self.mostLocks else {
            try db.run("SELECT pg_advisory_xact_lock(?::bigint)", [Self.everyChain])
            return
        }
        try db.run("SELECT pg_advisory_xact_lock_shared(?::bigint)", [Self.everyChain])
        for start in stride(from: 0, to: keys.count, by: 400) {
            let chunk = Array(keys[start..<min(start + 400, keys.count)])
            // VALUES rows are read in the order written, so the locks are taken in key order.
            try db.run("SELECT pg_advisory_xact_lock(k) FROM (VALUES \(Array(repeating: "(?::bigint)", count: chunk.count).joined(separator: ", "))) AS v(k)",
                       chunk)
        }
    }

    /// A chain's lock key: FNV-1a over its parts, stable across processes and releases (Swift's `Hasher` is seeded per process).
    static func key(_ chain: Chain) -> Int64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for part in [chain.appId, chain.environment, chain.originalTransactionId] {
            for byte in part.utf8 { hash = (hash ^ UInt64(byte)) &* 0x0000_0100_0000_01b3 }
            hash = (hash ^ 0xff) &* 0x0000_0100_0000_01b3  // a separator no UTF-8 text contains
        }
        return Int64(bitPattern: hash)
    }
}
