import Foundation
import Storage

/// The SQL of the `api_keys` table (hashes only: a key is shown once and never stored).
struct KeyRepository {
    let db: any SQLConnection

    func insert(hash: String, _ record: APIKeyRecord) throws {
        try db.query("INSERT INTO api_keys (key_hash, app_id, label, created_at, kind, hint) VALUES (?, ?, ?, ?, ?, ?)",
                     [hash, record.appId, record.label, record.createdAt, record.kind.rawValue, record.hint])
    }

    /// Every key live at `now` or later (not revoked, or revoked with effect ahead), by hash.
    func live(now: Date) throws -> [String: APIKeyRecord] {
        var ring: [String: APIKeyRecord] = [:]
        for row in try db.query("SELECT * FROM api_keys WHERE revoked_at IS NULL OR revoked_at > ?", [now.milliseconds]) {
            guard let hash = row.string("key_hash") else { continue }
            ring[hash] = Self.record(row)
        }
        return ring
    }

    /// Every key of an app, revoked ones included, oldest first, with its hash.
    func keys(appId: String) throws -> [(hash: String, record: APIKeyRecord)] {
        try db.query("SELECT * FROM api_keys WHERE app_id = ? ORDER BY created_at, key_hash", [appId]).map { (($0.string("key_hash") ?? ""), Self.record($0)) }
    }

    func setRevoked(hash: String, at: Int64) throws {
        try db.query("UPDATE api_keys SET revoked_at = ? WHERE key_hash = ?", [at, hash])
    }

    private static func record(_ row: SQLRow) -> APIKeyRecord {
        let hash = row.string("key_hash") ?? ""
        return APIKeyRecord(id: APIKeyRecord.id(forHash: hash), appId: row.string("app_id") ?? "",
                            kind: APIKeyKind(rawValue: row.string("kind") ?? "") ?? .secret, label: row.string("label"),
                            hint: row.string("hint"), createdAt: row.int("created_at") ?? 0, revokedAt: row.int("revoked_at"))
    }
}
