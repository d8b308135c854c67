import Foundation
import Storage

extension PurchaseStore {
    /// Analyzes the watched tables whose planner statistics are missing or stale (PostgreSQL; `PlannerStatistics`);
    /// returns the names of those analyzed. One another process is analyzing is left to it; one whose lock autovacuum
    /// holds past a second is left for the next round.
    /// Nothing on SQLite, whose plans are checked without statistics.
    @discardableResult
    public func refreshPlannerStatistics() async throws -> [String] {
        guard database.dialect == .postgres else { return [] }
        let stale = try await database.read { db in try PlannerStatistics(db: db).staleTables() }
        var analyzed: [String] = []
        for (table, qualified) in stale {
            do {
                if try await database.transaction({ db in try PlannerStatistics(db: db).analyze(table: table, qualified: qualified) }) {
                    analyzed.append(table)
                }
            } catch {
                continue  // autovacuum held the table's lock past a second, or the analysis failed: the next pass looks again
            }
        }
        return analyzed
    }

    /// Brings the metrics rollup up to date with chains marked since, `batch` chains per transaction, at most
    /// `limit` in all. Returns how many chains are still marked (0: up to date).
    @discardableResult
    public func refreshMetrics(batch: Int = 1_000, limit: Int = .max) async throws -> Int64 {
        var done = 0
        while done < limit {
            let size = min(batch, limit - done)
            let claimed = try await database.transaction { [dialect = database.dialect] db in
                try MetricsRepository(db: db, dialect: dialect).refresh(limit: size)
            }
            // Nothing claimed: none left, or only chains another process holds (counted, so that no answer claims to be exact).
            if claimed == 0 { break }
            done += claimed
        }
        return try await database.transaction { db in try MetricsRepository(db: db).dirtyCount() }
    }

    /// Marks every chain of the ledger, so that the rollup is computed again from the ledger (`storekeeper server metrics --rebuild`).
    public func markMetricsForRebuild() async throws {
        try await database.transaction { db in try MetricsRepository(db: db).markAllDirty() }
    }

    /// The rollup's days before `end` and the moments of the day holding `now` seen by then (summed), read in one transaction.
    func metricsRollup(appId: String, environment: String?, before end: Int64, now: Int64) async throws
        -> (days: [MetricsKey: MetricsTally], moments: [MetricsMoment]) {
        try await database.read { [dialect = database.dialect] db in
            try MetricsRepository(db: db, dialect: dialect).rollup(appId: appId, environment: environment, before: end,
                                                                  today: SubscriptionMetricsRollup.day(of: now), now: now)
        }
    }
}
