import Foundation
import Storage

/// The renewal state of one subscription, from either source: verifyReceipt's `pending_renewal_info`
/// (true when Apple answered) or a notification's renewal info and transaction (true at its `signedDate`).
struct SubscriptionState: Sendable, Equatable {
    var originalTransactionId: String
    var productId: String
    var autoRenewProductId: String?
    var autoRenewStatus: Bool?
    var expiresDate: Int64?
    var expirationIntent: String?
    var isInBillingRetry: Bool
    var gracePeriodExpiresDate: Int64?
    var revokedAt: Int64?
    /// Apple's price-increase consent: 0 not yet, 1 consented (or notified of one that needs none).
    var priceIncreaseStatus: Int64?
    /// When this state was true (ms); the newest wins.
    var signedDate: Int64
    /// The purchase date (ms) of the transaction `expiresDate` and `revokedAt` describe: the chain's latest one
    /// for a receipt, the notification's own for a notification. Nil when unknown.
    var periodPurchaseDate: Int64? = nil
}

/// The one writer of the `subscriptions` table. One rule: the state with the newest `signedDate`
/// wins, whether it came from a receipt or a notification, in whatever order they arrive. A state
/// that does not know the expiry keeps the one recorded.
struct SubscriptionRepository {
    let db: any SQLConnection
    let appId: String
    let environment: String

    /// Records what a notification or a verification says about a subscription, unless a later-signed state is
    /// already stored. The renewal fields are the chain's; the expiry and the revocation are those of the
    /// period it is about (`periodPurchaseDate`), so news about an older period moves neither.
    func record(_ state: SubscriptionState) throws {
        // A state about an older period than the recorded one (a refund of a past renewal, say) updates the chain's
        // renewal fields but neither the expiry nor the revocation: those stay the current period's. Unknown
        // purchase dates (NULL on either side) compare as not older, as before the column existed.
        try db.run("""
            INSERT INTO subscriptions (app_id, environment, original_transaction_id, product_id, auto_renew_product_id, auto_renew_status,
            expires_date, expiration_intent, is_in_billing_retry, grace_period_expires_date, revoked_at, updated_at, price_increase_status,
            period_purchase_date)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (app_id, environment, original_transaction_id) DO UPDATE SET
            product_id = excluded.product_id, auto_renew_product_id = excluded.auto_renew_product_id,
            auto_renew_status = excluded.auto_renew_status,
            expires_date = CASE WHEN excluded.period_purchase_date < subscriptions.period_purchase_date THEN subscriptions.expires_date
                                ELSE COALESCE(excluded.expires_date, subscriptions.expires_date) END,
            expiration_intent = excluded.expiration_intent, is_in_billing_retry = excluded.is_in_billing_retry,
            grace_period_expires_date = excluded.grace_period_expires_date,
            revoked_at = CASE WHEN excluded.period_purchase_date < subscriptions.period_purchase_date THEN subscriptions.revoked_at
                              ELSE excluded.revoked_at END,
            period_purchase_date = CASE WHEN excluded.period_purchase_date < subscriptions.period_purchase_date THEN subscriptions.period_purchase_date
                                        ELSE COALESCE(excluded.period_purchase_date, subscriptions.period_purchase_date) END,
            updated_at = excluded.updated_at,
            price_increase_status = excluded.price_increase_status
            WHERE subscriptions.updated_at <= excluded.updated_at
            """, [appId, environment, state.originalTransactionId, state.productId, state.autoRenewProductId,
                  state.autoRenewStatus.map { $0 ? 1 : 0 }, state.expiresDate, state.expirationIntent, state.isInBillingRetry,
                  state.gracePeriodExpiresDate, state.revokedAt, state.signedDate, state.priceIncreaseStatus, state.periodPurchaseDate])
        // Why it ended (expirationIntent) splits churn in the metrics rollup.
        try MetricsRepository(db: db).markDirty(appId: appId, environment: environment, originalTransactionIds: [state.originalTransactionId])
    }

    /// Every original transaction id with a recorded state, for the reconciler's Transaction History pass.
    func originalTransactionIds() throws -> [String] {
        try db.query("SELECT original_transaction_id FROM subscriptions WHERE app_id = ? AND environment = ?", [appId, environment])
            .compactMap { $0.string("original_transaction_id") }
    }
}
