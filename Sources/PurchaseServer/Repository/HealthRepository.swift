import Foundation
import Storage

/// The SQL of readiness and of the gauges `GET /metrics` reads at scrape time.
struct HealthRepository {
    let db: any SQLConnection

    /// The newest schema version applied (the database answers at all when this returns).
    func schemaVersion() throws -> Int64 {
        try db.query("SELECT MAX(version) AS version FROM schema_migrations").first?.int("version") ?? 0
    }

    /// When the oldest verification still waiting (pending or timed out) was uploaded (ms), or nil.
    func oldestWaitingJob() throws -> Int64? {
        try db.query("SELECT MIN(created_at) AS oldest FROM verification_jobs WHERE state IN ('pending', 'timed_out', 'verifying')").first?.int("oldest")
    }

    /// When the oldest webhook delivery still owed was created (ms), or nil.
    func oldestPendingDelivery() throws -> Int64? {
        try db.query(Self.oldestPendingDeliverySQL).first?.int("oldest")
    }

    /// When the newest notification arrived (ms), or nil.
    func newestNotification() throws -> Int64? {
        try db.query(Self.newestNotificationSQL).first?.int("newest")
    }

    /// Served by `webhook_deliveries_pending` (migration 26), whose `WHERE` this must keep implying.
    static let oldestPendingDeliverySQL = "SELECT MIN(created_at) AS oldest FROM webhook_deliveries WHERE state = 'pending'"
    /// Served by `apple_notifications_received` (migration 26).
    static let newestNotificationSQL = "SELECT MAX(received_at) AS newest FROM apple_notifications"
}
