import AppStoreModels
import Foundation
import Storage

/// Sales summed by what the revenue report groups and prices them by: one per day, product and environment (each when
/// the report groups by it, else nil), currency, unit price and refund.
struct LedgerSales: Sendable, Equatable {
    /// Days since 1970-01-01 (UTC).
    var day: Int64?
    var productId: String?
    var environment: String?
    var currency: String?
    /// The price of one unit, as the product mapping gave it when the rows were recorded.
    var price: String?
    var refunded: Bool
    /// A prorated refund's share in milliunits of the whole (nil: all of it).
    var refundPercentage: Int?
    /// How many ledger rows, and their quantities summed.
    var transactions: Int64
    var units: Int64
}

/// What the consumption report needs to know of one transaction.
struct ConsumptionFacts: Sendable, Equatable {
    var recorded: Bool
    var cancelled: Bool
    var creditedAmount: Int64?
    /// The owner's balance of the credited currency now.
    var balance: Int64?
}

/// Reads of the `ledger` and `ownership` tables across users: reports, the admin listing, the
/// owner of a subscription. (`LedgerRepository` writes them; `UserRepository` reads one user's.)
struct LedgerReader {
    let db: any SQLConnection

    /// The first user granted an original transaction.
    func firstOwner(appId: String, environment: String, originalTransactionId: String) throws -> String? {
        try db.query("""
            SELECT app_user_id FROM ownership WHERE app_id = ? AND environment = ? AND original_transaction_id = ? ORDER BY granted_at LIMIT 1
            """, [appId, environment, originalTransactionId]).first?.string("app_user_id")
    }

    /// Whether the user was granted this transaction (by its id or its original id), in any environment.
    func owns(appId: String, appUserId: String, transactionId: String) throws -> Bool {
        try !db.query("""
            SELECT 1 FROM ledger WHERE app_id = ? AND app_user_id = ? AND (transaction_id = ? OR original_transaction_id = ?) LIMIT 1
            """, [appId, appUserId, transactionId, transactionId]).isEmpty
    }

    /// Rows recorded newest first, of one app and user when given, every column as text. One app's newest rows are
    /// read from the end of `ledger_recorded` (one user's from the end of theirs in `ledger_user_recorded`); without an
    /// app, each app's are read so in turn, once a page is full only those newer than its oldest, and merged into it. No
    /// listing reads or holds more than a page of an app's rows, whatever the ledger has grown to. Run it in one snapshot
    /// (`SQLDatabase.snapshotRead`).
    func rows(appId: String?, appUserId: String?, limit: Int) throws -> [[String: String]] {
        let apps = try appId.map { [$0] } ?? appsInLedger()
        var page: [(recordedAt: Int64, row: [String: String])] = []
        for app in apps {
            var sql = "SELECT * FROM ledger WHERE app_id = ?"
            var parameters: [any SQLBindable] = [app]
            if let appUserId { sql += " AND app_user_id = ?"; parameters.append(appUserId) }
            // A later app's row at the page's oldest time would be merged after the page's own: only newer ones can enter.
            if page.count == limit, let oldest = page.last?.recordedAt { sql += " AND recorded_at > ?"; parameters.append(oldest) }
            var rows: [(recordedAt: Int64, row: [String: String])] = []
            for row in try db.query(sql + " ORDER BY recorded_at DESC LIMIT ?", parameters + [limit]) {
                var object: [String: String] = [:]
                for (column, value) in zip(row.columns, row.values) where value != .null { object[column] = value.description }
                rows.append((row.int("recorded_at") ?? 0, object))
            }
            // Both are newest first; a stable merge keeps the earlier app's rows first among equal times.
            page = Self.merged(page, rows, limit: limit)
        }
        return page.map(\.row)
    }

    /// Two lists newest first merged into one, newest first, of at most `limit`; `first`'s before `second`'s at equal times.
    static func merged<Row>(_ first: [(recordedAt: Int64, row: Row)], _ second: [(recordedAt: Int64, row: Row)],
                            limit: Int) -> [(recordedAt: Int64, row: Row)] {
        var result: [(recordedAt: Int64, row: Row)] = []
        result.reserveCapacity(min(limit, first.count + second.count))
        var left = first.startIndex, right = second.startIndex
        while result.count < limit, left < first.endIndex || right < second.endIndex {
            if right == second.endIndex || (left < first.endIndex && first[left].recordedAt >= second[right].recordedAt) {
                result.append(first[left]); left += 1
            } else {
                result.append(second[right]); right += 1
            }
        }
        return result
    }

    /// The app ids the ledger holds, each found by one seek along an index that begins with the app id rather than by
    /// reading every row (a registered app may have none, and a restored ledger may hold an app no longer registered).
    func appsInLedger() throws -> [String] {
        try db.query("""
            WITH RECURSIVE found(app_id) AS (
                SELECT min(app_id) FROM ledger
                UNION ALL
                SELECT (SELECT min(app_id) FROM ledger WHERE app_id > found.app_id) FROM found WHERE found.app_id IS NOT NULL
            )
            SELECT app_id FROM found WHERE app_id IS NOT NULL
            """, []).compactMap { $0.string("app_id") }
    }

    /// An app's transactions for the console, newest first: purchased in [from, to), narrowed by product, type,
    /// environment and whether refunded.
    func transactions(_ filter: TransactionFilter) throws -> [TransactionListing] {
        var sql = "SELECT * FROM ledger WHERE app_id = ? AND purchase_date >= ? AND purchase_date < ?"
        var parameters: [any SQLBindable] = [filter.appId, filter.from, filter.to]
        if let product = filter.productId { sql += " AND product_id = ?"; parameters.append(product) }
        if let type = filter.productType { sql += " AND product_type = ?"; parameters.append(type.rawValue) }
        if let environment = filter.environment { sql += " AND environment = ?"; parameters.append(environment) }
        if let refunded = filter.refunded { sql += refunded ? " AND cancellation_date IS NOT NULL" : " AND cancellation_date IS NULL" }
        return try db.query(sql + " ORDER BY purchase_date DESC, transaction_id LIMIT ?", parameters + [filter.limit]).map { row in
            TransactionListing(transaction: UserView.Transaction(
                transactionId: row.string("transaction_id") ?? "", originalTransactionId: row.string("original_transaction_id") ?? "",
                productId: row.string("product_id") ?? "", productType: row.string("product_type") ?? "", quantity: row.int("quantity") ?? 1,
                purchaseDate: row.int("purchase_date") ?? 0, expiresDate: row.int("expires_date"), cancellationDate: row.int("cancellation_date"),
                environment: row.string("environment") ?? "", verificationId: row.string("verification_id") ?? ""),
                appUserId: row.string("app_user_id") ?? "", price: row.string("price"), currency: row.string("currency"))
        }
    }

    /// Sales purchased in [from, to) (Unix ms, `from` not before 1970), of one app when given, summed by the database
    /// into one row per group (`LedgerSales`), so that a report over years reads its groups, not every sale, and holds
    /// only them in memory. With an app, `ledger_purchase_date` finds the range.
    func sales(appId: String?, from: Int64, to: Int64, byDay: Bool, byProduct: Bool, byEnvironment: Bool) throws -> [LedgerSales] {
        // The day by integer division, the same on both engines for times from 1970 (`from` is one).
        let keys = [(byDay, "purchase_date / 86400000", "day"), (byProduct, "product_id", "product_id"), (byEnvironment, "environment", "environment"),
                    (true, "currency", "currency"), (true, "price", "price"),
                    (true, "CASE WHEN cancellation_date IS NULL THEN 0 ELSE 1 END", "refunded"), (true, "refund_percentage", "refund_percentage")]
            .filter(\.0)
        var sql = "SELECT " + keys.map { "\($0.1) AS \($0.2)" }.joined(separator: ", ")
            + ", COUNT(*) AS transactions, CAST(SUM(quantity) AS BIGINT) AS units FROM ledger WHERE purchase_date >= ? AND purchase_date < ?"
        var parameters: [any SQLBindable] = [max(from, 0), to]
        if let appId {
            sql += " AND app_id = ?"
            parameters.append(appId)
        }
        sql += " GROUP BY " + keys.map(\.1).joined(separator: ", ")
        return try db.query(sql, parameters).map { row in
            LedgerSales(day: byDay ? row.int("day") : nil, productId: byProduct ? row.string("product_id") ?? "" : nil,
                        environment: byEnvironment ? row.string("environment") ?? "" : nil, currency: row.string("currency"),
                        price: row.string("price"), refunded: row.int("refunded") == 1, refundPercentage: row.int("refund_percentage").map(Int.init),
                        transactions: row.int("transactions") ?? 0, units: row.int("units") ?? 0)
        }
    }

    /// Whether a transaction was recorded and refunded, and for a credited consumable how much of its credit is left.
    func consumption(appId: String, environment: String, transactionId: String) throws -> ConsumptionFacts {
        guard let row = try db.query("SELECT * FROM ledger WHERE environment = ? AND transaction_id = ?", [environment, transactionId]).first else {
            return ConsumptionFacts(recorded: false, cancelled: false)
        }
        var facts = ConsumptionFacts(recorded: true, cancelled: row.int("cancellation_date") != nil, creditedAmount: row.int("credited_amount"))
        if let currency = row.string("credited_currency"), let user = row.string("app_user_id") {
            facts.balance = try UserRepository(db: db, appId: appId).balance(user, currency: currency)
        }
        return facts
    }

    /// Every row of an app, of one environment when given: what `SubscriptionMetrics.compute` reads (the rollup's oracle).
    func metricsRows(appId: String, environment: String?) throws -> [MetricsRow] {
        var sql = """
            SELECT transaction_id, original_transaction_id, environment, product_type, purchase_date, expires_date, cancellation_date, is_trial,
            quantity, price, currency, refund_percentage FROM ledger WHERE app_id = ?
            """
        var parameters: [any SQLBindable] = [appId]
        if let environment {
            sql += " AND environment = ?"
            parameters.append(environment)
        }
        return try db.query(sql, parameters).map(Self.metricsRow)
    }

    /// A ledger row as metrics read it.
    static func metricsRow(_ row: SQLRow) -> MetricsRow {
        var parsed = MetricsRow(transactionId: row.string("transaction_id") ?? "", originalTransactionId: row.string("original_transaction_id") ?? "",
                   environment: row.string("environment") ?? "", productType: ProductType(rawValue: row.string("product_type") ?? "") ?? .consumable,
                   purchaseDate: row.int("purchase_date") ?? 0, expiresDate: row.int("expires_date"), cancellationDate: row.int("cancellation_date"),
                   isTrial: row.bool("is_trial"), quantity: row.int("quantity") ?? 1, price: row.string("price").flatMap { Decimal(string: $0) },
                   currency: row.string("currency"))
        parsed.refundPercentage = row.int("refund_percentage").map(Int.init)
        return parsed
    }

    /// Why each of an app's subscriptions stopped renewing (Apple's `expirationIntent`), by `environment|originalTransactionId`.
    func expirationIntents(appId: String) throws -> [String: String] {
        var intents: [String: String] = [:]
        for row in try db.query("SELECT environment, original_transaction_id, expiration_intent FROM subscriptions WHERE app_id = ? AND expiration_intent IS NOT NULL",
                                [appId]) {
            intents[(row.string("environment") ?? "") + "|" + (row.string("original_transaction_id") ?? "")] = row.string("expiration_intent")
        }
        return intents
    }
}
