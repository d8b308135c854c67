import AppStoreModels
import Foundation
import Storage

/// The SQL of what one user owns, read back: the `users`, `balances` and `spends` tables and the
/// user's rows of `ledger` and `subscriptions` (through `ownership`). `LedgerRepository` writes them.
struct UserRepository {
    let db: any SQLConnection
    let appId: String

    typealias Flag = (flagged: Bool, reason: String?, promotional: Bool)

    /// What a user view is made of.
    struct Standing {
        var transactions: [UserView.Transaction]
        var flag: Flag
        var subscriptions: [SubscriptionRecord]
        var balances: [String: Int64]
        var promotional: [PromotionalGrant]
        /// The app's product mappings, when asked for.
        var products: [ProductMapping]?
    }

    /// Everything a user view shows (and the app's product mappings with `products`), read with independent
    /// statements sent together: one round trip on PostgreSQL (two for a user who ever had a promotional grant).
    func standing(_ appUserId: String, products: Bool) throws -> Standing {
        var statements = [transactionsStatement(appUserId), flagStatement(appUserId), subscriptionsStatement(appUserId),
                          balancesStatement(appUserId)]
        if products { statements.append(AppRepository.productsStatement(appId: appId)) }
        let rows = try db.query(together: statements)
        let flag = Self.flag(rows[1])
        // Promotional grants are rare: read (a second round trip) only for a user the flag says ever had one.
        return Standing(transactions: Self.transactions(rows[0]), flag: flag, subscriptions: Self.subscriptions(rows[2]),
                        balances: Self.balances(rows[3]), promotional: flag.promotional ? try promotional(appUserId) : [],
                        products: products ? AppRepository.products(rows[4]) : nil)
    }

    /// Whether a refund drove one of the user's balances negative, and why; and whether the user ever had a promotional grant.
    func flag(_ appUserId: String) throws -> Flag {
        Self.flag(try db.query(together: [flagStatement(appUserId)])[0])
    }

    private func flagStatement(_ appUserId: String) -> SQLStatement {
        SQLStatement("SELECT flagged, flag_reason, promotional FROM users WHERE app_id = ? AND app_user_id = ?", [appId, appUserId])
    }

    private static func flag(_ rows: [SQLRow]) -> Flag {
        let row = rows.first
        return (row?.bool("flagged") ?? false, row?.string("flag_reason"), row?.bool("promotional") ?? false)
    }

    /// The user whose id is this UUID, compared without case (an `appAccountToken`), or nil; nil too when two users'
    /// ids both are (ids that differ only in case): the token does not say which, and the purchase waits for its own
    /// user's upload rather than go to whichever an index lists first.
    func user(uuid: UUID) throws -> String? {
        let lower = uuid.uuidString.lowercased(), upper = uuid.uuidString.uppercased()
        let users = try db.query(Self.userByToken, [appId, lower, upper, appId, lower]).compactMap { $0.string("app_user_id") }
        return users.count == 1 ? users[0] : nil
    }

    /// An id equal to a UUID without case is either the UUID in lower case, or in upper case (both found by the
    /// primary key), or 36 characters in mixed case: those alone are in the index of migration 30, whose condition the
    /// second branch repeats word for word (SQLite uses a partial index only for a query that states its condition).
    /// Two rows are enough to tell that the token names more than one user.
    static let userByToken = """
        SELECT app_user_id FROM users WHERE app_id = ? AND app_user_id IN (?, ?)
        UNION ALL
        SELECT app_user_id FROM users WHERE app_id = ? AND lower(app_user_id) = ?
            AND length(app_user_id) = 36 AND app_user_id <> lower(app_user_id) AND app_user_id <> upper(app_user_id)
        LIMIT 2
        """

    /// Every ledger row the user owns (through ownership) and every consumable credited to them, oldest first.
    func transactions(_ appUserId: String) throws -> [UserView.Transaction] {
        Self.transactions(try db.query(together: [transactionsStatement(appUserId)])[0])
    }

    /// The columns a user view shows of a ledger row.
    private static let transactionColumns = """
        environment, transaction_id, original_transaction_id, product_id, product_type, quantity, purchase_date, expires_date,
        cancellation_date, verification_id
        """

    private func transactionsStatement(_ appUserId: String) -> SQLStatement {
        // Written as IN (subquery) so both engines walk the user's ownership first (see migration 2). UNION ALL, not
        // UNION: a consumable the user also owns through its chain comes twice and is dropped in Swift by its key, where
        // UNION would sort every row, all its columns, to find it.
        SQLStatement("""
            SELECT \(Self.transactionColumns) FROM ledger WHERE app_id = ? AND (environment, original_transaction_id) IN
                (SELECT environment, original_transaction_id FROM ownership WHERE app_id = ? AND app_user_id = ?)
            UNION ALL
            SELECT \(Self.transactionColumns) FROM ledger WHERE app_id = ? AND app_user_id = ? AND product_type = 'consumable'
            """, [appId, appId, appUserId, appId, appUserId])
    }

    /// The rows as transactions, oldest first, each ledger row once (its key: the environment and the transaction id).
    private static func transactions(_ rows: [SQLRow]) -> [UserView.Transaction] {
        struct LedgerKey: Hashable { let environment: String, transactionId: String }
        var seen = Set<LedgerKey>(minimumCapacity: rows.count)
        return rows.compactMap { row -> UserView.Transaction? in
            let transactionId = row.string("transaction_id") ?? "", environment = row.string("environment") ?? ""
            guard seen.insert(LedgerKey(environment: environment, transactionId: transactionId)).inserted else { return nil }
            return UserView.Transaction(transactionId: transactionId, originalTransactionId: row.string("original_transaction_id") ?? "",
                                        productId: row.string("product_id") ?? "", productType: row.string("product_type") ?? "",
                                        quantity: row.int("quantity") ?? 1, purchaseDate: row.int("purchase_date") ?? 0,
                                        expiresDate: row.int("expires_date"), cancellationDate: row.int("cancellation_date"),
                                        environment: environment, verificationId: row.string("verification_id") ?? "")
        }.sorted { ($0.purchaseDate, $0.transactionId) < ($1.purchaseDate, $1.transactionId) }
    }

    /// The renewal state of every subscription the user owns.
    func subscriptions(_ appUserId: String) throws -> [SubscriptionRecord] {
        Self.subscriptions(try db.query(together: [subscriptionsStatement(appUserId)])[0])
    }

    private func subscriptionsStatement(_ appUserId: String) -> SQLStatement {
        SQLStatement("""
            SELECT original_transaction_id, product_id, environment, expires_date, grace_period_expires_date, is_in_billing_retry,
                revoked_at, auto_renew_status, auto_renew_product_id, price_increase_status
            FROM subscriptions WHERE app_id = ? AND (environment, original_transaction_id) IN
                (SELECT environment, original_transaction_id FROM ownership WHERE app_id = ? AND app_user_id = ?)
            """, [appId, appId, appUserId])
    }

    private static func subscriptions(_ rows: [SQLRow]) -> [SubscriptionRecord] {
        rows.map { row in
            SubscriptionRecord(originalTransactionId: row.string("original_transaction_id") ?? "", productId: row.string("product_id") ?? "",
                               environment: row.string("environment") ?? "", expiresDate: row.int("expires_date"),
                               gracePeriodExpiresDate: row.int("grace_period_expires_date"), isInBillingRetry: row.bool("is_in_billing_retry"),
                               revokedAt: row.int("revoked_at"), autoRenewStatus: row.int("auto_renew_status").map { $0 != 0 },
                               autoRenewProductId: row.string("auto_renew_product_id"), priceIncreaseStatus: row.int("price_increase_status"))
        }
    }

    func balances(_ appUserId: String) throws -> [String: Int64] {
        Self.balances(try db.query(together: [balancesStatement(appUserId)])[0])
    }

    private func balancesStatement(_ appUserId: String) -> SQLStatement {
        SQLStatement("SELECT currency, amount FROM balances WHERE app_id = ? AND app_user_id = ?", [appId, appUserId])
    }

    private static func balances(_ rows: [SQLRow]) -> [String: Int64] {
        var balances: [String: Int64] = [:]
        for row in rows {
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

extension UserRepository {
    /// Creates the user if it does not exist (a grant or an adjustment makes a customer, as a purchase does).
    func ensureUser(_ appUserId: String, now: Int64) throws {
        try db.query("INSERT INTO users (app_id, app_user_id, flagged, created_at) VALUES (?, ?, 0, ?) ON CONFLICT DO NOTHING", [appId, appUserId, now])
    }

    /// The user's live promotional grants (not revoked; expired ones included, the calculator judges them).
    func promotional(_ appUserId: String) throws -> [PromotionalGrant] {
        Self.promotional(try db.query(together: [promotionalStatement(appUserId)])[0])
    }

    fileprivate func promotionalStatement(_ appUserId: String) -> SQLStatement {
        SQLStatement("""
            SELECT * FROM promotional_entitlements WHERE app_id = ? AND app_user_id = ? AND revoked_at IS NULL ORDER BY entitlement
            """, [appId, appUserId])
    }

    fileprivate static func promotional(_ rows: [SQLRow]) -> [PromotionalGrant] {
        rows.map {
            PromotionalGrant(entitlement: $0.string("entitlement") ?? "", expiresDate: $0.int("expires_date"), reason: $0.string("reason") ?? "",
                             grantedAt: $0.int("granted_at") ?? 0)
        }
    }

    /// Grants (or replaces the grant of) an entitlement.
    func grant(_ appUserId: String, _ grant: PromotionalGrant) throws {
        try db.query("UPDATE users SET promotional = 1 WHERE app_id = ? AND app_user_id = ?", [appId, appUserId])
        try db.query("""
            INSERT INTO promotional_entitlements (app_id, app_user_id, entitlement, expires_date, reason, granted_at) VALUES (?, ?, ?, ?, ?, ?)
            ON CONFLICT (app_id, app_user_id, entitlement) DO UPDATE SET expires_date = excluded.expires_date, reason = excluded.reason,
            granted_at = excluded.granted_at, revoked_at = NULL
            """, [appId, appUserId, grant.entitlement, grant.expiresDate, grant.reason, grant.grantedAt])
    }

    /// Revokes a live grant; false when there is none.
    func revoke(_ appUserId: String, entitlement: String, now: Int64) throws -> Bool {
        try !db.query("""
            UPDATE promotional_entitlements SET revoked_at = ? WHERE app_id = ? AND app_user_id = ? AND entitlement = ? AND revoked_at IS NULL
            RETURNING entitlement
            """, [now, appId, appUserId, entitlement]).isEmpty
    }

    /// An adjustment recorded under this idempotency key.
    func adjustment(_ appUserId: String, idempotencyKey: String) throws -> (currency: String, amount: Int64, balanceAfter: Int64)? {
        try db.query("SELECT * FROM balance_adjustments WHERE app_id = ? AND app_user_id = ? AND idempotency_key = ?",
                     [appId, appUserId, idempotencyKey]).first.map { ($0.string("currency") ?? "", $0.int("amount") ?? 0, $0.int("balance_after") ?? 0) }
    }

    /// Adds `amount` (negative to take) unless the balance would go below zero; the new balance, or nil.
    func adjust(_ appUserId: String, currency: String, by amount: Int64) throws -> Int64? {
        guard amount < 0 else {
            return try db.query("""
                INSERT INTO balances (app_id, app_user_id, currency, amount) VALUES (?, ?, ?, ?)
                ON CONFLICT (app_id, app_user_id, currency) DO UPDATE SET amount = balances.amount + excluded.amount RETURNING amount
                """, [appId, appUserId, currency, amount]).first?.int("amount")
        }
        return try db.query("""
            UPDATE balances SET amount = amount + ? WHERE app_id = ? AND app_user_id = ? AND currency = ? AND amount + ? >= 0 RETURNING amount
            """, [amount, appId, appUserId, currency, amount]).first?.int("amount")
    }

    func recordAdjustment(_ appUserId: String, idempotencyKey: String, currency: String, amount: Int64, balanceAfter: Int64, reason: String,
                          now: Int64) throws {
        try db.query("""
            INSERT INTO balance_adjustments (app_id, app_user_id, idempotency_key, currency, amount, balance_after, reason, created_at)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?)
            """, [appId, appUserId, idempotencyKey, currency, amount, balanceAfter, reason, now])
    }
}
