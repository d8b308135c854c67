import Foundation
import Storage

/// The SQL of the `reconcile_state` table: how far each catch-up with the App Store Server API got
/// (a Notification History date, a Transaction History revision per subscription).
struct ReconcileRepository {
    let db: any SQLConnection
    let appId: String
    let environment: String

    /// The stored watermark of `subject`, or nil before the first pass.
    func watermark(_ subject: String) throws -> String? {
        try db.query("SELECT value FROM reconcile_state WHERE app_id = ? AND environment = ? AND subject = ?",
                     [appId, environment, subject]).first?.string("value")
    }

    /// Moves the watermark of `subject`.
    func setWatermark(_ subject: String, _ value: String, now: Date) throws {
        try db.query("""
            INSERT INTO reconcile_state (app_id, environment, subject, value, updated_at) VALUES (?, ?, ?, ?, ?)
            ON CONFLICT (app_id, environment, subject) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at
            """, [appId, environment, subject, value, now.milliseconds])
    }
}
