import Storage

/// The SQL of `state_totals`: running totals of the rows of a table in a state that gathers rows without end (settled
/// jobs, delivered webhooks), so that counting them does not read every row ever written. Whatever moves a row into
/// such a state adds one, whatever moves it out or deletes it subtracts one, in the same transaction (an addition
/// counts only if it commits). Each total is the sum of its shards (`SQLConnection.shard`), so that transactions
/// settling at the same time add to different rows.
struct StateTotalsRepository {
    let db: any SQLConnection
    let subject: String

    /// Counts `amount` more rows of `subject` in `state` (PostgreSQL gathers the additions of a transaction into one
    /// statement at its end).
    func add(_ amount: Int64 = 1, state: String) throws {
        try db.add(amount, to: "total", of: "state_totals", keyColumns: ["subject", "state", "shard"], key: [subject, state, db.shard])
    }

    /// Each state's total.
    func totals() throws -> [String: Int64] {
        var totals: [String: Int64] = [:]
        for row in try db.query("SELECT state, CAST(SUM(total) AS BIGINT) AS n FROM state_totals WHERE subject = ? GROUP BY state", [subject]) {
            totals[row.string("state") ?? ""] = row.int("n") ?? 0
        }
        return totals
    }

    /// What `recount` counts: each subject's table and the states kept as running totals.
    static let kept: [(subject: String, states: [String])] = [
        ("verification_jobs", JobState.allCases.filter(\.isFinal).map(\.rawValue)),
        ("webhook_deliveries", ["delivered"]),
    ]

    /// The statements that set every total from a count of its rows: a read of each state's entries in the index on the
    /// state (as migration 24's, whose text stays as it was applied).
    static var countedFromRows: [String] {
        kept.map { subject, states in
            """
            INSERT INTO state_totals (subject, state, shard, total)
            SELECT '\(subject)', state, 0, COUNT(*) FROM \(subject) WHERE state IN (\(states.map { "'\($0)'" }.joined(separator: ", "))) GROUP BY state
            ON CONFLICT DO NOTHING
            """
        }
    }

    /// Sets every total again from a count of its rows, mending totals that drifted (rows a process of an older version
    /// settled after the totals began). Writes to the counted tables wait meanwhile: on PostgreSQL under a share lock,
    /// given up after 10 s of waiting for it; on SQLite the transaction is the only writer.
    static func recount(_ db: any SQLConnection, dialect: SQLDialect) throws {
        if dialect == .postgres {
            try db.query("SET LOCAL lock_timeout = '10s'", [])
            try db.query("LOCK TABLE \(kept.map(\.subject).reversed().joined(separator: ", ")) IN SHARE MODE", [])
        }
        try db.query("DELETE FROM state_totals", [])
        for statement in countedFromRows { try db.query(statement, []) }
    }
}
