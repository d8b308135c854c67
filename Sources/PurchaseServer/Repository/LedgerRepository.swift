import AppStoreModels
import Foundation
import Storage

/// The SQL of the ledger, ownership and balances tables: reads the rows a settlement plan needs,
/// and writes its actions. No rules here; they are in `SettlementPlan`.
struct LedgerRepository {
    let db: any SQLConnection
    let appId: String
    let environment: String
    let audit: AuditRepository

    /// Two processes recorded the same transaction at once (PostgreSQL): the settlement is retried,
    /// and then sees the other's row.
    struct Conflict: Error, Equatable {
        let transactionId: String
    }

    /// The existing rows of these transactions, by transaction id (any app: the plan refuses another app's). With
    /// `lock` (PostgreSQL) the rows stay locked until the transaction ends, taken in id order, so that what a plan
    /// read is still true when it writes.
    func entries(_ transactionIds: [String], lock: Bool = false) throws -> [String: LedgerEntry] {
        var entries: [String: LedgerEntry] = [:]
        for chunk in Array(Set(transactionIds)).sorted().chunked(400) {
            let (marks, ids) = InList.padded(chunk)
            for row in try db.query("""
                SELECT transaction_id, app_id, app_user_id, product_id, expires_date, cancellation_date, credited_currency, credited_amount,
                clawed_back_at, state_date, refund_percentage FROM ledger WHERE environment = ? AND transaction_id IN (\(marks))
                """ + (lock ? " ORDER BY transaction_id FOR UPDATE" : ""), [environment] + ids) {
                let id = row.string("transaction_id") ?? ""
                entries[id] = LedgerEntry(transactionId: id, appId: row.string("app_id") ?? "", appUserId: row.string("app_user_id") ?? "",
                                          productId: row.string("product_id") ?? "", expiresDate: row.int("expires_date"),
                                          cancellationDate: row.int("cancellation_date"), creditedCurrency: row.string("credited_currency"),
                                          creditedAmount: row.int("credited_amount"), clawedBack: row.int("clawed_back_at") != nil,
                                          stateDate: row.int("state_date") ?? 0)
                entries[id]?.refundPercentage = row.int("refund_percentage").map(Int.init)
            }
        }
        return entries
    }

    /// The owners of these original transactions, in the order they were granted. With `lock` (PostgreSQL) the
    /// rows stay locked until the transaction ends, taken in key order.
    func owners(_ originalTransactionIds: [String], lock: Bool = false) throws -> [String: [String]] {
        var granted: [String: [(at: Int64, user: String)]] = [:]
        for chunk in Array(Set(originalTransactionIds)).sorted().chunked(400) {
            let (marks, ids) = InList.padded(chunk)
            for row in try db.query("""
                SELECT original_transaction_id, app_user_id, granted_at FROM ownership WHERE app_id = ? AND environment = ?
                AND original_transaction_id IN (\(marks)) ORDER BY original_transaction_id, app_user_id
                """ + (lock ? " FOR UPDATE" : ""), [appId, environment] + ids) {
                granted[row.string("original_transaction_id") ?? "", default: []].append((row.int("granted_at") ?? 0, row.string("app_user_id") ?? ""))
            }
        }
        return granted.mapValues { list in list.sorted { ($0.at, $0.user) < ($1.at, $1.user) }.map(\.user) }
    }

    /// Writes a plan's actions for the settling user and job.
    func write(_ actions: [SettlementPlan.Action], user: String, verificationId: String, now: Date) throws {
        let nowMs = now.milliseconds
        // The metrics rollup catches up with every chain whose rows this changes.
        var recordedChains: Set<String> = [], changedTransactions: Set<String> = []
        // A credit of a row this plan records is written with the row, not by an update after it.
        var credits: [String: (currency: String, amount: Int64, withheld: Bool)] = [:]
        var recorded: Set<String> = []
        for action in actions {
            switch action {
            case .credit(let id, let currency, let amount) where recorded.contains(id): credits[id] = (currency, amount, false)
            case .withholdCredit(let id, let currency, let amount) where recorded.contains(id): credits[id] = (currency, amount, true)
            default: break
            }
            switch action {
            case .record(let transaction, _, _):
                recordedChains.insert(transaction.originalTransactionId)
                recorded.insert(transaction.transactionId)
            case .cancel(let id, _, _, _, _), .reinstate(let id, _), .updateExpiry(let id, _, _), .updateRefundShare(let id, _, _):
                changedTransactions.insert(id)
            default: break
            }
        }
        let metrics = MetricsRepository(db: db)
        try metrics.markDirty(appId: appId, environment: environment, originalTransactionIds: recordedChains)
        try metrics.markDirty(environment: environment, transactionIds: changedTransactions)
        for action in actions {
            switch action {
            case .record(let transaction, let mapping, let stateDate):
                let credit = credits[transaction.transactionId]
                // Gathered with the batch's other rows into one insert (PostgreSQL); a row another process wrote first
                // (its conflict skips it) fails the settlement with `Conflict`, which settles it again, seeing that row.
                try db.append(into: "ledger", columns: Self.ledgerColumns, values: [environment, transaction.transactionId, appId, user, transaction.productId, mapping.type.rawValue, transaction.quantity,
                          transaction.purchaseDate.milliseconds, transaction.originalPurchaseDate?.milliseconds, transaction.originalTransactionId,
                          transaction.webOrderLineItemId, transaction.expiresDate?.milliseconds,
                          transaction.charged?.amount ?? mapping.price, transaction.charged?.currency ?? mapping.priceCurrency,
                          transaction.source, verificationId, transaction.cancellationDate?.milliseconds, transaction.cancellationReason,
                          transaction.isTrial, nowMs, stateDate, transaction.cancellationDate == nil ? nil : transaction.refundPercentage,
                          credit?.currency, credit?.amount, credit?.withheld == true ? nowMs : nil],
                              conflict: "ON CONFLICT DO NOTHING", returning: "transaction_id", orElse: Conflict(transactionId: transaction.transactionId))
            case .bind(let original, let productId):
                // A user exists from the first thing granted (an upload alone creates none: junk fills nothing).
                // Both gathered with the batch's other rows (PostgreSQL), written before anything reads the tables.
                try db.append(into: "users", columns: ["app_id", "app_user_id", "flagged", "created_at"], values: [appId, user, 0, nowMs],
                              conflict: "ON CONFLICT DO NOTHING")
                try db.append(into: "ownership", columns: ["app_id", "environment", "original_transaction_id", "app_user_id", "product_id", "granted_at"],
                              values: [appId, environment, original, user, productId, nowMs], conflict: "ON CONFLICT DO NOTHING")
            case .unbindAll(let original):
                try db.run("DELETE FROM ownership WHERE app_id = ? AND environment = ? AND original_transaction_id = ?", [appId, environment, original])
            case .credit(let transactionId, let currency, let amount):
                // Gathered with the batch's other credits (PostgreSQL), one row per balance.
                try db.add(amount, to: "amount", of: "balances", keyColumns: Self.balanceKey, key: [appId, user, currency])
                if credits[transactionId] == nil {
                    try db.run("UPDATE ledger SET credited_currency = ?, credited_amount = ? WHERE environment = ? AND transaction_id = ?",
                               [currency, amount, environment, transactionId])
                }
                try audit.append(appId: appId, userId: user, kind: "balance_credited",
                                        detail: ["transactionId": transactionId, "currency": currency, "amount": String(amount)], now: now)
            case .cancel(let transactionId, let date, let reason, let stateDate, let percentage):
                try db.run("""
                    UPDATE ledger SET cancellation_date = ?, cancellation_reason = ?, refund_percentage = ?, state_date = ?
                    WHERE environment = ? AND transaction_id = ?
                    """, [date, reason, percentage, stateDate, environment, transactionId])
            case .updateRefundShare(let transactionId, let percentage, let stateDate):
                try db.run("UPDATE ledger SET refund_percentage = ?, state_date = ? WHERE environment = ? AND transaction_id = ?",
                             [percentage, stateDate, environment, transactionId])
            case .reinstate(let transactionId, let stateDate):
                try db.run("""
                    UPDATE ledger SET cancellation_date = NULL, cancellation_reason = NULL, refund_percentage = NULL, state_date = ?
                    WHERE environment = ? AND transaction_id = ?
                    """,
                             [stateDate, environment, transactionId])
            case .clawBack(let transactionId, let owner, let currency, let amount):
                let balance = try Self.adjustBalance(db, appId: appId, userId: owner, currency: currency, by: -amount)
                // Only a credit not yet taken back: another process that took it first makes this settlement retry.
                try db.run("UPDATE ledger SET clawed_back_at = ? WHERE environment = ? AND transaction_id = ? AND clawed_back_at IS NULL RETURNING transaction_id",
                           [nowMs, environment, transactionId], orElse: Conflict(transactionId: transactionId))
                try audit.append(appId: appId, userId: owner, kind: "balance_clawed_back",
                                        detail: ["transactionId": transactionId, "currency": currency, "amount": String(amount),
                                                 "balanceAfter": String(balance)], now: now)
                if balance < 0 {
                    try db.run("UPDATE users SET flagged = 1, flag_reason = ? WHERE app_id = ? AND app_user_id = ?",
                                 ["negative \(currency) balance after a refund", appId, owner])
                }
            case .withholdCredit(let transactionId, let currency, let amount):
                guard credits[transactionId] == nil else { break }
                try db.run("UPDATE ledger SET credited_currency = ?, credited_amount = ?, clawed_back_at = ? WHERE environment = ? AND transaction_id = ?",
                             [currency, amount, nowMs, environment, transactionId])
            case .restoreCredit(let transactionId, let owner, let currency, let amount):
                let balance = try Self.adjustBalance(db, appId: appId, userId: owner, currency: currency, by: amount)
                // Only a credit taken back: another process that restored it first makes this settlement retry.
                try db.run("UPDATE ledger SET clawed_back_at = NULL WHERE environment = ? AND transaction_id = ? AND clawed_back_at IS NOT NULL RETURNING transaction_id",
                           [environment, transactionId], orElse: Conflict(transactionId: transactionId))
                try audit.append(appId: appId, userId: owner, kind: "balance_restored",
                                        detail: ["transactionId": transactionId, "currency": currency, "amount": String(amount),
                                                 "balanceAfter": String(balance)], now: now)
            case .updateExpiry(let transactionId, let expires, let stateDate):
                try db.run("UPDATE ledger SET expires_date = ?, state_date = ? WHERE environment = ? AND transaction_id = ?",
                             [expires, stateDate, environment, transactionId])
            case .observe(let transactionId, let stateDate):
                try db.run("UPDATE ledger SET state_date = ? WHERE environment = ? AND transaction_id = ? AND state_date < ?",
                             [stateDate, environment, transactionId, stateDate])
            case .audit(let kind, let auditUser, let detail):
                try audit.append(appId: appId, userId: auditUser, kind: kind, detail: detail, now: now)
            }
        }
    }

    /// Adds `delta` to a balance and returns the new amount.
    @discardableResult
    static func adjustBalance(_ db: any SQLConnection, appId: String, userId: String, currency: String, by delta: Int64) throws -> Int64 {
        let rows = try db.query(adjustBalanceSQL, [appId, userId, currency, delta])
        return rows.first?.int("amount") ?? delta
    }

    private static let ledgerColumns = [
        "environment", "transaction_id", "app_id", "app_user_id", "product_id", "product_type", "quantity", "purchase_date",
        "original_purchase_date", "original_transaction_id", "web_order_line_item_id", "expires_date", "price", "currency", "source",
        "verification_id", "cancellation_date", "cancellation_reason", "is_trial", "recorded_at", "state_date", "refund_percentage",
        "credited_currency", "credited_amount", "clawed_back_at",
    ]

    /// A balance's key: app, user and currency.
    private static let balanceKey = ["app_id", "app_user_id", "currency"]

    private static let adjustBalanceSQL = SQLStatement.addition(to: "amount", of: "balances", keyColumns: balanceKey, rows: 1) + " RETURNING amount"
}
