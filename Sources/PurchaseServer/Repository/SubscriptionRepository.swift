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
    /// transaction it carried, so a transaction older than the stored one (a refund of a past period, say)
    /// moves neither: the chain's current period stands.
    func record(_ state: SubscriptionState) throws {
        try db.query("""
            INSERT INTO subscriptions (app_id, environment, original_transaction_id, product_id, auto_renew_product_id, auto_renew_status,
            expires_date, expiration_intent, is_in_billing_retry, grace_period_expires_date, revoked_at, updated_at, price_increase_status)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (app_id, environment, original_transaction_id) DO UPDATE SET
            product_id = excluded.product_id, auto_renew_product_id = excluded.auto_renew_product_id,
            auto_renew_status = excluded.auto_renew_status,
            expires_date = CASE WHEN excluded.expires_date IS NULL OR excluded.expires_date < subscriptions.expires_date
                                THEN subscriptions.expires_date ELSE excluded.expires_date END,
            expiration_intent = excluded.expiration_intent, is_in_billing_retry = excluded.is_in_billing_retry,
            grace_period_expires_date = excluded.grace_period_expires_date,
            revoked_at = CASE WHEN excluded.expires_date < subscriptions.expires_date THEN subscriptions.revoked_at ELSE excluded.revoked_at END,
            updated_at = excluded.updated_at,
            price_increase_status = excluded.price_increase_status
            WHERE subscriptions.updated_at <= excluded.updated_at
            """, [appId, environment, state.originalTransactionId, state.productId, state.autoRenewProductId,
                  state.autoRenewStatus.map { $0 ? 1 : 0 }, state.expiresDate, state.expirationIntent, state.isInBillingRetry,
                  state.gracePeriodExpiresDate, state.revokedAt, state.signedDate, state.priceIncreaseStatus])
        // Why it ended (expirationIntent) splits churn in the metrics rollup.
        try MetricsRepository(db: db).markDirty(appId: appId, environment: environment, originalTransactionIds: [state.originalTransactionId])
    }

    /// Every original transaction id with a recorded state, for the reconciler's Transaction History pass.
    func originalTransactionIds() throws -> [String] {
        try db.query("SELECT original_transaction_id FROM subscriptions WHERE app_id = ? AND environment = ?", [appId, environment])
            .compactMap { $0.string("original_transaction_id") }
    }
}
