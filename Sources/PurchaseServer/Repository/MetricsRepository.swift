import AppStoreModels
import Foundation
import Storage

/// The SQL of the subscription-metrics rollup. A ledger or subscription change marks its chain in `metrics_dirty`
/// (one statement in the settlement's transaction); `refresh` later replaces each marked chain's contribution
/// (`metrics_chains`, `metrics_moments`) and adds the difference to `metrics_days`. A question reads days.
struct MetricsRepository {
    let db: any SQLConnection
    var dialect: SQLDialect = .sqlite

    /// A mark that already exists is updated, not skipped, so that it locks the row: a refresher that claimed the
    /// chain waits for this writer's commit, and then sees its rows (PostgreSQL; SQLite has one writer anyway).
    private static let touch =
        "ON CONFLICT (app_id, environment, original_transaction_id) DO UPDATE SET original_transaction_id = excluded.original_transaction_id"

    /// A chain of one app: an environment and an original transaction.
    struct Chain: Hashable {
        var appId: String
        var environment: String
        var originalTransactionId: String
    }

    // MARK: Marking, in the writer's transaction

    /// Marks chains whose rows or end reason changed.
    func markDirty(appId: String, environment: String, originalTransactionIds: Set<String>) throws {
        // Marks are a set: rows may be gathered and written together (`append`); a repeated mark changes nothing.
        for original in originalTransactionIds.sorted() {
            try db.append(into: "metrics_dirty", columns: ["app_id", "environment", "original_transaction_id"],
                          values: [appId, environment, original], conflict: Self.touch)
        }
    }

    /// Marks the chains of these transactions (changes that name a transaction, not its chain).
    func markDirty(environment: String, transactionIds: Set<String>) throws {
        for chunk in Array(transactionIds).sorted().chunked(400) {
            let (marks, ids) = InList.padded(chunk)
            try db.run("""
                INSERT INTO metrics_dirty (app_id, environment, original_transaction_id)
                SELECT DISTINCT app_id, environment, original_transaction_id FROM ledger
                WHERE environment = ? AND transaction_id IN (\(marks))
                \(Self.touch)
                """, [environment] + ids)
        }
    }

    /// Marks every chain of the ledger (a rebuild).
    func markAllDirty() throws {
        try db.query("""
            INSERT INTO metrics_dirty (app_id, environment, original_transaction_id)
            SELECT DISTINCT app_id, environment, original_transaction_id FROM ledger WHERE true ON CONFLICT DO NOTHING
            """)
    }

    func dirtyCount() throws -> Int64 {
        try db.query("SELECT COUNT(*) AS n FROM metrics_dirty").first?.int("n") ?? 0
    }

    // MARK: Refreshing

    /// Claims up to `limit` marked chains and brings their contributions up to date. Returns how many it claimed.
    /// On PostgreSQL chains another process is refreshing are skipped, not waited for.
    func refresh(limit: Int) throws -> Int {
        // The claimed set is read once, in key order (an index scan, which skips the entries of rows already
        // taken), and then joined: PostgreSQL would otherwise be free to read it again for every row of the table.
        let sql = dialect == .postgres ? """
            WITH claimed AS MATERIALIZED (SELECT app_id, environment, original_transaction_id FROM metrics_dirty
                ORDER BY app_id, environment, original_transaction_id LIMIT ? FOR UPDATE SKIP LOCKED)
            DELETE FROM metrics_dirty AS dirty USING claimed WHERE dirty.app_id = claimed.app_id AND dirty.environment = claimed.environment
            AND dirty.original_transaction_id = claimed.original_transaction_id
            RETURNING dirty.app_id, dirty.environment, dirty.original_transaction_id
            """ : """
            DELETE FROM metrics_dirty WHERE (app_id, environment, original_transaction_id) IN
            (SELECT app_id, environment, original_transaction_id FROM metrics_dirty ORDER BY app_id, environment, original_transaction_id LIMIT ?)
            RETURNING app_id, environment, original_transaction_id
            """
        let claimed = try db.query(sql, [limit]).map { Chain(appId: $0.string("app_id") ?? "", environment: $0.string("environment") ?? "",
                                      originalTransactionId: $0.string("original_transaction_id") ?? "") }
        var difference: [DayKey: MetricsTally] = [:]
        let groups = Dictionary(grouping: claimed) { [$0.appId, $0.environment] }
        for (group, chains) in groups.sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) {
            for chunk in chains.map(\.originalTransactionId).sorted().chunked(400) {
                for (key, tally) in try refresh(appId: group[0], environment: group[1], originalTransactionIds: chunk) {
                    difference[DayKey(appId: group[0], environment: group[1], key: key), default: MetricsTally()] += tally
                }
            }
        }
        // One upsert for the whole claim, in key order: two processes refreshing at once lock days in the same
        // order, so they cannot deadlock.
        let changed = difference.filter { !$0.value.isZero }.sorted { $0.key < $1.key }
        let dayColumns = MetricsField.allCases.map(\.column)
        try insert("metrics_days", columns: "app_id, environment, day, currency, " + dayColumns.joined(separator: ", "),
                   rows: changed.map { key, tally in
                       [key.appId, key.environment, key.key.day, key.key.currency] + MetricsField.allCases.map { tally[$0] as any SQLBindable }
                   },
                   onConflict: "ON CONFLICT (app_id, environment, day, currency) DO UPDATE SET "
                       + dayColumns.map { "\($0) = metrics_days.\($0) + excluded.\($0)" }.joined(separator: ", "))
        return claimed.count
    }

    /// A row of `metrics_days`.
    struct DayKey: Hashable, Comparable {
        var appId: String
        var environment: String
        var key: MetricsKey
        static func < (left: DayKey, right: DayKey) -> Bool {
            (left.appId, left.environment, left.key.day, left.key.currency) < (right.appId, right.environment, right.key.day, right.key.currency)
        }
    }

    /// Replaces these chains' stored contributions; what `metrics_days` must add.
    private func refresh(appId: String, environment: String, originalTransactionIds ids: [String]) throws -> [MetricsKey: MetricsTally] {
        let (list, listed) = InList.padded(ids)
        let scope: [any SQLBindable] = [appId, environment] + listed
        var rows: [String: [MetricsRow]] = [:]
        for row in try db.query("""
            SELECT transaction_id, original_transaction_id, environment, product_type, purchase_date, expires_date, cancellation_date, is_trial,
            quantity, price, currency, refund_percentage FROM ledger WHERE app_id = ? AND environment = ? AND original_transaction_id IN (\(list))
            """, scope) {
            let parsed = LedgerReader.metricsRow(row)
            rows[parsed.originalTransactionId, default: []].append(parsed)
        }
        var reasons: [String: String] = [:]
        for row in try db.query("""
            SELECT original_transaction_id, expiration_intent FROM subscriptions
            WHERE app_id = ? AND environment = ? AND original_transaction_id IN (\(list)) AND expiration_intent IS NOT NULL
            """, scope) {
            reasons[row.string("original_transaction_id") ?? ""] = row.string("expiration_intent")
        }
        // The difference to add to metrics_days: new contributions minus the stored ones, which are taken out as they
        // are read (one lookup of the chains, not a read and then a delete).
        var difference: [MetricsKey: MetricsTally] = [:]
        for row in try db.query("""
            DELETE FROM metrics_chains WHERE app_id = ? AND environment = ? AND original_transaction_id IN (\(list)) RETURNING days
            """, scope) {
            for (key, tally) in Self.decode(row.string("days") ?? "") { difference[key, default: MetricsTally()] -= tally }
        }
        for row in try db.query("""
            DELETE FROM metrics_moments WHERE app_id = ? AND environment = ? AND original_transaction_id IN (\(list))
            RETURNING visible_at, day, currency, \(Self.momentColumns)
            """, scope) {
            let moment = Self.moment(row)
            difference[moment.key, default: MetricsTally()] -= moment.tally
        }

        var chainRows: [[any SQLBindable]] = []
        var momentRows: [[any SQLBindable]] = []
        for id in ids {
            guard let chain = rows[id] else { continue }
            let contribution = SubscriptionMetricsRollup.contribution(of: chain, churnReason: reasons[id])
            for (key, tally) in contribution.byDay { difference[key, default: MetricsTally()] += tally }
            chainRows.append([appId, environment, id, Self.encode(contribution.days)])
            for moment in contribution.moments {
                momentRows.append([appId, environment, id, moment.visibleAt, moment.key.day, moment.key.currency]
                                  + MetricsField.moments.map { moment.tally[$0] as any SQLBindable })
            }
        }
        try insert("metrics_chains", columns: "app_id, environment, original_transaction_id, days", rows: chainRows)
        try insert("metrics_moments", columns: "app_id, environment, original_transaction_id, visible_at, day, currency, \(Self.momentColumns)",
                   rows: momentRows)
        return difference
    }

    /// A multi-row insert, in chunks that stay under both engines' parameter limits.
    private func insert(_ table: String, columns: String, rows: [[any SQLBindable]], onConflict: String = "") throws {
        guard let width = rows.first?.count else { return }
        let tuple = "(" + Array(repeating: "?", count: width).joined(separator: ", ") + ")"
        for chunk in rows.chunked(max(1, 20_000 / width)) {
            try db.query("INSERT INTO \(table) (\(columns)) VALUES " + Array(repeating: tuple, count: chunk.count).joined(separator: ", ") + " " + onConflict,
                         chunk.flatMap { $0 })
        }
    }

    // MARK: Reading

    /// Totals by day and currency for every day before `end`, and the moments of `today` already seen at `now`
    /// (`visible_at < now`) summed per currency, of one environment or all. One statement, so one snapshot on
    /// PostgreSQL too: a refresh that commits in between cannot be half seen.
    func rollup(appId: String, environment: String?, before end: Int64, today: Int64, now: Int64) throws
        -> (days: [MetricsKey: MetricsTally], moments: [MetricsMoment]) {
        let filter = environment == nil ? "" : " AND environment = ?"
        let daySums = MetricsField.allCases.map { "SUM(\($0.column)) AS \($0.column)" }.joined(separator: ", ")
        let momentSums = MetricsField.allCases.map { $0.isMoment ? "SUM(\($0.column)) AS \($0.column)" : "0 AS \($0.column)" }.joined(separator: ", ")
        var parameters: [any SQLBindable] = [appId, end]
        if let environment { parameters.append(environment) }
        parameters += [appId, today, now] as [any SQLBindable]
        if let environment { parameters.append(environment) }
        let rows = try db.query("""
            SELECT 'day' AS part, day, currency, \(daySums) FROM metrics_days WHERE app_id = ? AND day < ?\(filter) GROUP BY day, currency
            UNION ALL
            SELECT 'moment' AS part, day, currency, \(momentSums) FROM metrics_moments WHERE app_id = ? AND day = ? AND visible_at < ?\(filter)
            GROUP BY day, currency
            """, parameters)
        var days: [MetricsKey: MetricsTally] = [:]
        var moments: [MetricsMoment] = []
        days.reserveCapacity(rows.count)
        // Columns by position, found once (a name lookup per value is most of the cost on years of days).
        guard let columns = rows.first?.columns else { return (days, moments) }
        let part = columns.firstIndex(of: "part"), day = columns.firstIndex(of: "day"), currency = columns.firstIndex(of: "currency")
        let fields = MetricsField.allCases.map { columns.firstIndex(of: $0.column) }
        for row in rows {
            var tally = MetricsTally()
            for (field, index) in zip(MetricsField.allCases, fields) { tally[field] = index.flatMap { Self.integer(row.values[$0]) } ?? 0 }
            let key = MetricsKey(day: day.flatMap { Self.integer(row.values[$0]) } ?? 0, currency: currency.map { row.values[$0].description } ?? "")
            if part.map({ row.values[$0].description }) == "moment" {
                moments.append(MetricsMoment(visibleAt: now - 1, key: key, tally: tally))
            } else {
                days[key] = tally
            }
        }
        return (days, moments)
    }

    private static func integer(_ value: SQLValue) -> Int64? {
        switch value {
        case .integer(let number): number
        case .text(let text): Int64(text)
        case .null: nil
        }
    }

    // MARK: Encoding

    private static let momentColumns = MetricsField.moments.map(\.column).joined(separator: ", ")

    private static func moment(_ row: SQLRow) -> MetricsMoment {
        var tally = MetricsTally()
        for field in MetricsField.moments { tally[field] = row.int(field.column) ?? 0 }
        return MetricsMoment(visibleAt: row.int("visible_at") ?? 0, key: MetricsKey(day: row.int("day") ?? 0, currency: row.string("currency") ?? ""),
                             tally: tally)
    }

    /// A chain's day tallies as text: `day currency v0 v1 …` per line (the day fields only; the currency percent-escaped).
    /// Written into one string: a chain's encoding is made for every chain the rollup refreshes, on the SQLite writer,
    /// and arrays of parts joined twice, with Foundation's percent-encoding of an ISO code that needs none, cost as much
    /// as the refresh's statements.
    static func encode(_ days: [MetricsKey: MetricsTally]) -> String {
        var text = ""
        for (key, tally) in days.sorted(by: { $0.key < $1.key }) {
            if !text.isEmpty { text += "\n" }
            text += String(key.day)
            text += " "
            text += escaped(currency: key.currency)
            for field in MetricsField.days {
                text += " "
                text += String(tally[field])
            }
        }
        return text
    }

    /// A currency as `encode` writes it: "-" for none; ASCII letters and digits as they are (percent-encoding leaves them
    /// so); anything else percent-encoded.
    static func escaped(currency: String) -> String {
        if currency.isEmpty { return "-" }
        if currency.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x41...0x5a).contains($0) || (0x61...0x7a).contains($0) }) { return currency }
        return currency.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "-"
    }

    static func decode(_ text: String) -> [MetricsKey: MetricsTally] {
        var days: [MetricsKey: MetricsTally] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: " ")
            guard parts.count == MetricsField.days.count + 2, let day = Int64(parts[0]) else { continue }
            var tally = MetricsTally()
            for (index, field) in MetricsField.days.enumerated() { tally[field] = Int64(parts[index + 2]) ?? 0 }
            days[MetricsKey(day: day, currency: parts[1] == "-" ? "" : String(parts[1]).removingPercentEncoding ?? ""), default: MetricsTally()] += tally
        }
        return days
    }
}

extension Array {
    /// The array in consecutive slices of at most `size` elements.
    func chunked(_ size: Int) -> [[Element]] {
        stride(from: 0, to: count, by: size).map { Array(self[$0..<Swift.min($0 + size, count)]) }
    }
}
