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
}
