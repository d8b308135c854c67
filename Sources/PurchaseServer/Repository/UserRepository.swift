import AppStoreModels
import Foundation
import Storage

/// The SQL of what one user owns, read back: the `users`, `balances` and `spends` tables and the
/// user's rows of `ledger` and `subscriptions` (through `ownership`). `LedgerRepository` writes them.
struct UserRepository {
    let db: any SQLConnection
    let appId: String

    /// Whether a refund drove one of the user's balances negative, and why.
    func flag(_ appUserId: String) throws -> (flagged: Bool, reason: String?) {
        let row = try db.query("SELECT flagged, flag_reason FROM users WHERE app_id = ? AND app_user_id = ?", [appId, appUserId]).first
        return (row?.bool("flagged") ?? false, row?.string("flag_reason"))
    }

    /// The user whose id is this UUID, compared without case (an `appAccountToken`), or nil.
    func user(uuid: UUID) throws -> String? {
        try db.query("SELECT app_user_id FROM users WHERE app_id = ? AND lower(app_user_id) = ? LIMIT 1",
                     [appId, uuid.uuidString.lowercased()]).first?.string("app_user_id")
    }

    /// Every ledger row the user owns (through ownership) and every consumable credited to them, oldest first.
    func transactions(_ appUserId: String) throws -> [UserView.Transaction] {
        // Written as IN (subquery) so both engines walk the user's ownership first (see migration 2).
        try db.query("""
            SELECT * FROM ledger WHERE app_id = ? AND (environment, original_transaction_id) IN
                (SELECT environment, original_transaction_id FROM ownership WHERE app_id = ? AND app_user_id = ?)
            UNION
            SELECT * FROM ledger WHERE app_id = ? AND app_user_id = ? AND product_type = 'consumable'
            """, [appId, appId, appUserId, appId, appUserId]).map { row in
            UserView.Transaction(transactionId: row.string("transaction_id") ?? "", originalTransactionId: row.string("original_transaction_id") ?? "",
                                 productId: row.string("product_id") ?? "", productType: row.string("product_type") ?? "",
                                 quantity: row.int("quantity") ?? 1, purchaseDate: row.int("purchase_date") ?? 0,
                                 expiresDate: row.int("expires_date"), cancellationDate: row.int("cancellation_date"),
                                 environment: row.string("environment") ?? "", verificationId: row.string("verification_id") ?? "")
        }.sorted { ($0.purchaseDate, $0.transactionId) < ($1.purchaseDate, $1.transactionId) }
    }

    /// The renewal state of every subscription the user owns.
    func subscriptions(_ appUserId: String) throws -> [SubscriptionRecord] {
        try db.query("""
            SELECT * FROM subscriptions WHERE app_id = ? AND (environment, original_transaction_id) IN
                (SELECT environment, original_transaction_id FROM ownership WHERE app_id = ? AND app_user_id = ?)
            """, [appId, appId, appUserId]).map { row in
            SubscriptionRecord(originalTransactionId: row.string("original_transaction_id") ?? "", productId: row.string("product_id") ?? "",
                               environment: row.string("environment") ?? "", expiresDate: row.int("expires_date"),
                               gracePeriodExpiresDate: row.int("grace_period_expires_date"), isInBillingRetry: row.bool("is_in_billing_retry"),
                               revokedAt: row.int("revoked_at"), autoRenewStatus: row.int("auto_renew_status").map { $0 != 0 },
                               autoRenewProductId: row.string("auto_renew_product_id"), priceIncreaseStatus: row.int("price_increase_status"))
        }
    }

    func balances(_ appUserId: String) throws -> [String: Int64] {
        var balances: [String: Int64] = [:]
        for row in try db.query("SELECT currency, amount FROM balances WHERE app_id = ? AND app_user_id = ?", [appId, appUserId]) {
            balances[row.string("currency") ?? ""] = row.int("amount") ?? 0
        }
        return balances
    }

    func balance(_ appUserId: String, currency: String) throws -> Int64 {
        try db.query("SELECT amount FROM balances WHERE app_id = ? AND app_user_id = ? AND currency = ?",
                     [appId, appUserId, currency]).first?.int("amount") ?? 0
    }

    /// A spend recorded under this idempotency key: its currency, amount and the balance after it.
    func spend(_ appUserId: String, idempotencyKey: String) throws -> (currency: String, amount: Int64, balanceAfter: Int64)? {
        try db.query("SELECT * FROM spends WHERE app_id = ? AND app_user_id = ? AND idempotency_key = ?", [appId, appUserId, idempotencyKey]).first.map {
            ($0.string("currency") ?? "", $0.int("amount") ?? 0, $0.int("balance_after") ?? 0)
        }
    }

    /// Takes `amount` from a balance only if it holds that much; the new balance, or nil when it does not.
    func debit(_ appUserId: String, currency: String, amount: Int64) throws -> Int64? {
        try db.query("""
            UPDATE balances SET amount = amount - ? WHERE app_id = ? AND app_user_id = ? AND currency = ? AND amount >= ? RETURNING amount
            """, [amount, appId, appUserId, currency, amount]).first?.int("amount")
    }

    func recordSpend(_ appUserId: String, idempotencyKey: String, currency: String, amount: Int64, balanceAfter: Int64, now: Date) throws {
        try db.query("""
            INSERT INTO spends (app_id, app_user_id, idempotency_key, currency, amount, balance_after, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)
            """, [appId, appUserId, idempotencyKey, currency, amount, balanceAfter, now.milliseconds])
    }
}
