import AppStoreModels
import Foundation
import Storage

/// What a user owns, as `GET /v1/users/{appUserId}` answers.
public struct UserView: Codable, Sendable, Equatable {
    public struct Entitlement: Codable, Sendable, Equatable {
        public var id: String
        public var active: Bool
        /// Milliseconds, or nil for "never expires".
        public var expiresDate: Int64?
        /// The kind of purchase that grants it: `non-consumable`, `auto-renewable`, `non-renewing`, `free-subscription`.
        public var source: String
        public var productId: String
        public var environment: String

        enum CodingKeys: String, CodingKey { case id, active, expiresDate, source, productId, environment }

        /// `expiresDate` is always present: null means the entitlement never expires.
        public func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(id, forKey: .id)
            try container.encode(active, forKey: .active)
            try container.encode(expiresDate, forKey: .expiresDate)
            try container.encode(source, forKey: .source)
            try container.encode(productId, forKey: .productId)
            try container.encode(environment, forKey: .environment)
        }
    }

    public struct Subscription: Codable, Sendable, Equatable {
        public var originalTransactionId: String
        public var productId: String
        /// `active`, `grace_period`, `billing_retry`, `expired` or `revoked`.
        public var state: String
        public var expiresDate: Int64?
        public var autoRenewStatus: Bool?
        public var autoRenewProductId: String?
        public var environment: String
        /// Apple's `priceIncreaseStatus`: 0 the customer has not consented to a price increase yet, 1 consented or notified.
        public var priceIncreaseStatus: Int64?
    }

    public struct Transaction: Codable, Sendable, Equatable {
        public var transactionId: String
        public var originalTransactionId: String
        public var productId: String
        public var productType: String
        public var quantity: Int64
        public var purchaseDate: Int64
        public var expiresDate: Int64?
        public var cancellationDate: Int64?
        public var environment: String
        public var verificationId: String
    }

    public var appUserId: String
    public var entitlements: [Entitlement]
    public var balances: [String: Int64]
    public var subscriptions: [Subscription]
    public var transactions: [Transaction]
    /// Set when a refund drove a balance negative.
    public var flagged: Bool
    public var flagReason: String?
}

extension PurchaseStore {
    /// Everything a user owns at `now`.
    public func user(appId: String, appUserId: String, now: Date) async throws -> UserView {
        try await database.transaction { db in
            let nowMs = now.milliseconds
            let mappings = Dictionary(try Self.products(db, appId: appId).map { ($0.productId, $0) }, uniquingKeysWith: { $1 })
            let userRow = try db.query("SELECT * FROM users WHERE app_id = ? AND app_user_id = ?", [appId, appUserId]).first
            // Written as IN (subquery) so both engines walk the user's ownership first (see migration 2).
            let rows = try db.query("""
                SELECT * FROM ledger WHERE app_id = ? AND (environment, original_transaction_id) IN
                    (SELECT environment, original_transaction_id FROM ownership WHERE app_id = ? AND app_user_id = ?)
                UNION
                SELECT * FROM ledger WHERE app_id = ? AND app_user_id = ? AND product_type = 'consumable'
                """, [appId, appId, appUserId, appId, appUserId])
            let transactions = rows.map { row in
                UserView.Transaction(transactionId: row.string("transaction_id") ?? "", originalTransactionId: row.string("original_transaction_id") ?? "",
                                     productId: row.string("product_id") ?? "", productType: row.string("product_type") ?? "",
                                     quantity: row.int("quantity") ?? 1, purchaseDate: row.int("purchase_date") ?? 0,
                                     expiresDate: row.int("expires_date"), cancellationDate: row.int("cancellation_date"),
                                     environment: row.string("environment") ?? "", verificationId: row.string("verification_id") ?? "")
            }.sorted { ($0.purchaseDate, $0.transactionId) < ($1.purchaseDate, $1.transactionId) }

            let subscriptions = try db.query("""
                SELECT * FROM subscriptions WHERE app_id = ? AND (environment, original_transaction_id) IN
                    (SELECT environment, original_transaction_id FROM ownership WHERE app_id = ? AND app_user_id = ?)
                """, [appId, appId, appUserId]).map { row in
                SubscriptionRecord(originalTransactionId: row.string("original_transaction_id") ?? "", productId: row.string("product_id") ?? "",
                                   environment: row.string("environment") ?? "", expiresDate: row.int("expires_date"),
                                   gracePeriodExpiresDate: row.int("grace_period_expires_date"), isInBillingRetry: row.bool("is_in_billing_retry"),
                                   revokedAt: row.int("revoked_at"), autoRenewStatus: row.int("auto_renew_status").map { $0 != 0 },
                                   autoRenewProductId: row.string("auto_renew_product_id"), priceIncreaseStatus: row.int("price_increase_status"))
            }
            let (entitlements, subscriptionViews) = EntitlementCalculator.entitlements(transactions: transactions, subscriptions: subscriptions,
                                                                                        mappings: mappings, now: nowMs)
            var balances: [String: Int64] = [:]
            for row in try db.query("SELECT currency, amount FROM balances WHERE app_id = ? AND app_user_id = ?", [appId, appUserId]) {
                balances[row.string("currency") ?? ""] = row.int("amount") ?? 0
            }
            return UserView(appUserId: appUserId, entitlements: entitlements, balances: balances, subscriptions: subscriptionViews,
                            transactions: transactions, flagged: userRow?.bool("flagged") ?? false, flagReason: userRow?.string("flag_reason"))
        }
    }

    /// The answer to a spend request.
    public struct SpendResult: Codable, Sendable, Equatable {
        public var currency: String
        public var amount: Int64
        public var balance: Int64
        public var idempotencyKey: String
        /// True when this key was already used: the original result is returned, nothing is spent again.
        public var replayed: Bool
    }

    /// Spends from a balance once per idempotency key; never below zero.
    public func spend(appId: String, appUserId: String, currency: String, amount: Int64, idempotencyKey: String, now: Date) async throws -> SpendResult {
        guard amount > 0 else { throw ServerError(400, "invalid_amount", "The amount to spend must be a positive integer.") }
        guard !idempotencyKey.isEmpty else {
            throw ServerError(400, "missing_idempotency_key", "Send an Idempotency-Key header (1–256 bytes).")
        }
        let idempotencyKey = try ClientIdentifier(idempotencyKey, .idempotencyKey).value
        let currency = try ClientIdentifier(currency, .currency).value
        return try await database.transaction { db in
            if let previous = try db.query("SELECT * FROM spends WHERE app_id = ? AND app_user_id = ? AND idempotency_key = ?",
                                           [appId, appUserId, idempotencyKey]).first {
                guard previous.string("currency") == currency, previous.int("amount") == amount else {
                    throw ServerError(409, "idempotency_key_reused", "This idempotency key was used for a different spend.")
                }
                return SpendResult(currency: currency, amount: amount, balance: previous.int("balance_after") ?? 0, idempotencyKey: idempotencyKey, replayed: true)
            }
            let updated = try db.query("""
                UPDATE balances SET amount = amount - ? WHERE app_id = ? AND app_user_id = ? AND currency = ? AND amount >= ? RETURNING amount
                """, [amount, appId, appUserId, currency, amount])
            guard let balance = updated.first?.int("amount") else {
                let current = try db.query("SELECT amount FROM balances WHERE app_id = ? AND app_user_id = ? AND currency = ?",
                                           [appId, appUserId, currency]).first?.int("amount") ?? 0
                throw ServerError(409, "insufficient_balance", "The \(currency) balance is \(current); \(amount) cannot be spent.")
            }
            try db.query("""
                INSERT INTO spends (app_id, app_user_id, idempotency_key, currency, amount, balance_after, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)
                """, [appId, appUserId, idempotencyKey, currency, amount, balance, now.milliseconds])
            try Self.audit(db, appId: appId, userId: appUserId, kind: "balance_spent",
                           detail: ["currency": currency, "amount": String(amount), "balanceAfter": String(balance), "idempotencyKey": idempotencyKey], now: now)
            return SpendResult(currency: currency, amount: amount, balance: balance, idempotencyKey: idempotencyKey, replayed: false)
        }
    }

    /// Audit events of a user, newest first.
    public func auditEvents(appId: String, appUserId: String, limit: Int = 100) async throws -> [[String: String]] {
        try await database.transaction { db in
            try db.query("SELECT * FROM audit_events WHERE app_id = ? AND app_user_id = ? ORDER BY created_at DESC LIMIT ?", [appId, appUserId, limit]).map {
                ["kind": $0.string("kind") ?? "", "detail": $0.string("detail") ?? "", "createdAt": $0.string("created_at") ?? ""]
            }
        }
    }
}
