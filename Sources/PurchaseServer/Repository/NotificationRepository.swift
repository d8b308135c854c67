import AppStoreModels
import Foundation
import Storage

/// A notification as recorded (`GET /admin/v1/notifications`).
public struct RecordedNotification: Codable, Sendable, Equatable {
    public var notificationUUID: String
    public var app: String
    public var notificationType: String
    public var subtype: String?
    public var environment: String
    public var signedDate: Int64
    public var receivedAt: Int64
    public var transactionId: String?
    public var originalTransactionId: String?
    /// `received`, `queued`, `unmatched`, `recorded`, `ignored`, `consumption_*`.
    public var state: String
    public var verificationId: String?
    public var reason: String?
    /// The body's `signedPayload` as Apple sent it (`GET /admin/v1/notifications/{uuid}` only).
    public var signedPayload: String?
}

/// The SQL of the `apple_notifications` table.
struct NotificationRepository {
    let db: any SQLConnection

    /// Records a notification once; false when its UUID was already recorded (one recorded as `ignored` is
    /// taken again: the app it names may have been added since).
    func insert(_ uuid: String, appId: String, type: String, subtype: String?, environment: String, signedDate: Int64, signed: String,
                transaction: JWSTransaction?, state: String, reason: String?, now: Date) throws -> Bool {
        !(try db.query("""
            INSERT INTO apple_notifications (notification_uuid, app_id, notification_type, subtype, environment, signed_date, received_at,
            transaction_id, original_transaction_id, state, signed_payload, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (notification_uuid) DO UPDATE SET app_id = excluded.app_id, notification_type = excluded.notification_type,
            subtype = excluded.subtype, environment = excluded.environment, received_at = excluded.received_at,
            transaction_id = excluded.transaction_id, original_transaction_id = excluded.original_transaction_id, state = excluded.state,
            reason = excluded.reason
            WHERE apple_notifications.state = 'ignored' AND excluded.state <> 'ignored'
            RETURNING notification_uuid
            """, [uuid, appId, type, subtype, environment, signedDate, now.milliseconds, transaction?.transactionId,
                  transaction?.originalTransactionId, state, signed, reason]).isEmpty)
    }

    func mark(_ uuid: String, state: String, verificationId: String? = nil) throws {
        try db.query("UPDATE apple_notifications SET state = ?, verification_id = COALESCE(?, verification_id) WHERE notification_uuid = ?",
                     [state, verificationId, uuid])
    }

    /// The newest notifications first, filtered by app, type and state when given.
    func list(appId: String?, type: String?, state: String?, limit: Int) throws -> [RecordedNotification] {
        var sql = "SELECT \(Self.listed) FROM apple_notifications WHERE 1 = 1"
        var parameters: [String] = []
        for (column, value) in [("app_id", appId), ("notification_type", type), ("state", state)] {
            if let value {
                sql += " AND \(column) = ?"
                parameters.append(value)
            }
        }
        return try db.query(sql + " ORDER BY received_at DESC, notification_uuid LIMIT \(max(1, min(limit, 500)))", parameters).map(Self.notification)
    }

    /// One notification with its stored `signedPayload` (`StoredJWS`: the caller expands it), or nil.
    func find(_ uuid: String) throws -> (notification: RecordedNotification, storedPayload: String)? {
        guard let row = try db.query("SELECT \(Self.listed), signed_payload FROM apple_notifications WHERE notification_uuid = ?", [uuid]).first else {
            return nil
        }
        return (Self.notification(row), row.string("signed_payload") ?? "")
    }

    /// Every column but the signed payload, kilobytes that lists do not show.
    private static let listed = """
        notification_uuid, app_id, notification_type, subtype, environment, signed_date, received_at, transaction_id,
        original_transaction_id, state, verification_id, reason
        """

    private static func notification(_ row: SQLRow) -> RecordedNotification {
        RecordedNotification(notificationUUID: row.string("notification_uuid") ?? "", app: row.string("app_id") ?? "",
                             notificationType: row.string("notification_type") ?? "", subtype: row.string("subtype"),
                             environment: row.string("environment") ?? "", signedDate: row.int("signed_date") ?? 0,
                             receivedAt: row.int("received_at") ?? 0, transactionId: row.string("transaction_id"),
                             originalTransactionId: row.string("original_transaction_id"), state: row.string("state") ?? "",
                             verificationId: row.string("verification_id"), reason: row.string("reason"))
    }
}
