import Foundation
import Storage

/// PostgreSQL's planner statistics of this server's tables, kept current while the tables are young. Autovacuum
/// analyzes a table once a tenth of it has changed, but looks only once a minute (`autovacuum_naptime`): a table that
/// grows from empty at thousands of rows a second has no statistics, or those of a table a fraction of its size, for
/// its first minutes. The planner then guesses every condition selective, and a settlement batch's `IN (…)` lookups
/// (hundreds of ids) walk the whole primary key for rows it should find in a few index probes: 22–41 ms per lookup on
/// 50,000 rows instead of 0.6–0.8 ms (`EXPLAIN ANALYZE`, bench/README, eleventh round). A server that reaches here
/// first analyzes the table itself; on an established database autovacuum's own threshold comes first.
struct PlannerStatistics {
    let db: any SQLConnection

    /// The tables whose lookups go wrong without statistics (a settlement batch's reads, the metrics rollup's, the
    /// queue's claim), with the columns those lookups name: analyzing only them keeps each analysis cheap (a whole
    /// ledger of 50,000 rows took 390 ms, against autovacuum's analysis of every column later).
    static let watched: [String: [String]] = [
        "ledger": ["environment", "transaction_id", "app_id", "original_transaction_id"],
        "ownership": ["app_id", "environment", "original_transaction_id", "app_user_id"],
        "metrics_chains": ["app_id", "environment", "original_transaction_id"],
        "verification_jobs": ["id", "state", "next_attempt_at", "lease_expires_at"],
    ]
    /// Tables smaller than this are planned well without statistics.
    static let minimumRows: Int64 = 1_000

    /// The watched tables, as the search path finds them, whose statistics are missing or stale: analyzed never, or
    /// grown by a fifth over their rows at the last analysis (`pg_class.reltuples`, which an analysis of some
    /// columns updates; its count of changes since, which autovacuum reads, it leaves). Only tables this role may
    /// analyze (it owns them). Each as its table name and its schema-qualified, quoted name.
    func staleTables(among tables: [String] = watched.keys.sorted()) throws -> [(table: String, qualified: String)] {
        let names = tables.filter { Self.watched[$0] != nil }
        guard !names.isEmpty else { return [] }
        return try db.query("""
            SELECT c.relname, quote_ident(n.nspname) || '.' || quote_ident(c.relname) AS qualified
            FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace JOIN pg_stat_user_tables AS s ON s.relid = c.oid
            WHERE c.oid IN (\(names.map { _ in "to_regclass(?)" }.joined(separator: ", "))) AND pg_has_role(c.relowner, 'USAGE')
            AND s.n_live_tup >= ? AND (c.reltuples < 0 OR s.n_live_tup > c.reltuples * 1.2) ORDER BY c.relname
            """, names + [Self.minimumRows]).compactMap { row in
                guard let table = row.string("relname"), let qualified = row.string("qualified") else { return nil }
                return (table, qualified)
            }
    }

    /// Analyzes a watched table's watched columns from a small sample (3,000 rows: enough for keys and states, and a
    /// tenth of the default's cost), waiting at most a second for the table's lock (autovacuum working on it) and
    /// running at most a minute; returns whether it did.
    ///
    /// Once per growth across processes: a process that finds another one analyzing the table (a transaction-scoped
    /// advisory lock on the table's name, in the two-key space no other lock of the server uses) leaves it, and the
    /// table is analyzed only if it is still stale once that lock is held (an analysis that committed just before has
    /// made it current). Three processes sharing a database each analyzed every table themselves: 54 analyses in a
    /// run against 24 for one process (bench/README, twelfth round).
    func analyze(table: String, qualified: String) throws -> Bool {
        guard let columns = Self.watched[table],
              try db.query("SELECT pg_try_advisory_xact_lock(?, hashtext(?)) AS taken", [Self.analysisLockSpace, qualified])
                .first?.bool("taken") == true,
              try !staleTables(among: [table]).isEmpty else { return false }
        try db.query("SET LOCAL lock_timeout = '1s'")
        try db.query("SET LOCAL statement_timeout = '60s'")
        try db.query("SET LOCAL default_statistics_target = 10")
        try db.query("ANALYZE \(qualified) (\(columns.joined(separator: ", ")))")
        return true
    }

    /// The first key of the analyses' advisory locks ("SK"): the server's other advisory locks take one 64-bit key.
    static let analysisLockSpace: Int64 = 0x534B
}
