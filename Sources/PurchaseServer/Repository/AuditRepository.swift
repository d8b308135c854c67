import AppStoreModels
import Clocks
import Foundation
import Storage

/// The SQL of the `audit_events` table: an append-only log of what changed and why.
struct AuditRepository {
    let db: any SQLConnection
    let ids: any IDGenerator

    /// Appends an event; `detail` is stored as a JSON object with sorted keys.
    func append(appId: String, userId: String?, kind: String, detail: [String: String], now: Date) throws {
        var json = JSONBuffer(capacity: 128)
        json.object { json in
            for (name, value) in detail.sorted(by: { $0.key < $1.key }) { json.field(name, value) }
        }
        // A log: rows may be gathered and written together (`append`).
        try db.append(into: "audit_events", columns: ["id", "app_id", "app_user_id", "kind", "detail", "created_at"],
                      values: [ids.nextOrderedString(), appId, userId, kind, String(decoding: json.bytes, as: UTF8.self), now.milliseconds])
    }

    /// A user's events, newest first.
    func events(appId: String, appUserId: String, limit: Int) throws -> [[String: String]] {
        try db.query("SELECT * FROM audit_events WHERE app_id = ? AND app_user_id = ? ORDER BY created_at DESC LIMIT ?", [appId, appUserId, limit]).map {
            ["kind": $0.string("kind") ?? "", "detail": $0.string("detail") ?? "", "createdAt": $0.string("created_at") ?? ""]
        }
    }
}
