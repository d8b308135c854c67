import Foundation
import Storage

/// The SQL of finding a customer and of their timeline, across the tables that mention them.
struct CustomerRepository {
    let db: any SQLConnection
    let appId: String
    var dialect: SQLDialect = .sqlite

    /// Users whose id starts with `prefix` (LIKE with its wildcards escaped), first 20 by id. `codePointOrder` says
    /// the ids sort by code point (see `idsSortByCodePoint`): then a range around the prefix, which the index can
    /// seek, holds every match, and LIKE keeps it exact. Otherwise (a linguistic collation on PostgreSQL, where "ch"
    /// may sort after "h") LIKE decides alone.
    func users(prefix: String, limit: Int, codePointOrder: Bool) throws -> [String] {
        let escaped = prefix.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "%", with: "\\%").replacingOccurrences(of: "_", with: "\\_")
        let range = codePointOrder ? " AND app_user_id >= ? AND app_user_id < ?" : ""
        let bounds: [any SQLBindable] = codePointOrder ? [prefix, prefix + "\u{10FFFF}"] : []
        return try db.query("SELECT app_user_id FROM users WHERE app_id = ? AND app_user_id LIKE ? ESCAPE '\\'\(range) ORDER BY app_user_id LIMIT ?",
                            [appId, escaped + "%"] + bounds + [limit]).compactMap { $0.string("app_user_id") }
    }

    /// Whether `users.app_user_id` sorts by code point. SQLite compares text by its bytes (UTF-8 keeps code point
    /// order). On PostgreSQL it is the column's collation: asked once whether 'B' sorts before 'a' and 'z' before 'é',
    /// which every byte-ordered collation (C, POSIX, C.UTF-8, ucs_basic) answers yes and every linguistic one no.
    static func idsSortByCodePoint(_ db: any SQLConnection, dialect: SQLDialect) throws -> Bool {
        guard dialect == .postgres else { return true }
        guard let row = try db.query("""
            SELECT n.nspname, c.collname FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
            JOIN pg_namespace n ON n.oid = c.collnamespace WHERE a.attrelid = 'users'::regclass AND a.attname = 'app_user_id'
            """, []).first, let schema = row.string("nspname"), let name = row.string("collname") else { return false }
        func quoted(_ identifier: String) -> String { "\"" + identifier.replacingOccurrences(of: "\"", with: "\"\"") + "\"" }
        let collation = quoted(schema) + "." + quoted(name)
        return try db.query("SELECT ('B' < 'a' COLLATE \(collation)) AND ('z' < 'é' COLLATE \(collation)) AS ordered", [])
            .first?.bool("ordered") ?? false
    }

    /// Who a transaction was recorded to, and the owners of its original transaction.
    func users(transactionId: String) throws -> [String] {
        try db.query("""
            SELECT app_user_id FROM ledger WHERE environment IN ('Production', 'Sandbox') AND transaction_id = ? AND app_id = ?
            UNION SELECT o.app_user_id FROM ownership o JOIN ledger l ON l.app_id = o.app_id AND l.environment = o.environment
                AND l.original_transaction_id = o.original_transaction_id
                WHERE l.environment IN ('Production', 'Sandbox') AND l.transaction_id = ? AND l.app_id = ?
            """, [transactionId, appId, transactionId, appId]).compactMap { $0.string("app_user_id") }
    }

    /// The owners of an original transaction.
    func users(originalTransactionId: String) throws -> [String] {
        // Both environments named, so the primary key (app, environment, original transaction) finds them.
        try db.query("""
            SELECT DISTINCT app_user_id FROM ownership WHERE app_id = ? AND environment IN ('Production', 'Sandbox') AND original_transaction_id = ?
            ORDER BY app_user_id
            """,
                     [appId, originalTransactionId]).compactMap { $0.string("app_user_id") }
    }

    /// Verification jobs of a user before `before` (ms, inclusive), newest first.
    func jobs(_ user: String, before: Int64, limit: Int) throws -> [TimelineItem] {
        try db.query("""
            SELECT id, kind, state, reason, environment, created_at, settled_at FROM verification_jobs
            WHERE app_id = ? AND app_user_id = ? AND created_at <= ? ORDER BY created_at DESC, id LIMIT ?
            """, [appId, user, before, limit]).map { row in
            TimelineItem(at: row.int("created_at") ?? 0, kind: "verification", id: row.string("id") ?? "",
                         detail: ["kind": row.string("kind"), "state": row.string("state"), "reason": row.string("reason"),
                                  "environment": row.string("environment"), "settledAt": row.int("settled_at").map(String.init)].compactMapValues { $0 })
        }
    }

    /// Notifications about the user's original transactions before `before`, newest first.
    func notifications(_ user: String, before: Int64, limit: Int) throws -> [TimelineItem] {
        try db.query(Self.notificationsSQL, [appId, user, before, limit]).map { row in
            TimelineItem(at: row.int("received_at") ?? 0, kind: "notification", id: row.string("notification_uuid") ?? "",
                         detail: ["type": row.string("notification_type"), "subtype": row.string("subtype"), "state": row.string("state"),
                                  "transactionId": row.string("transaction_id")].compactMapValues { $0 })
        }
    }

    /// A user's notifications: those of each subscription they own, from their ownership rows to each chain's entries
    /// in `apple_notifications_chain` (a chain owned in two environments is one chain here, as before: `DISTINCT`).
    /// `CROSS JOIN` keeps SQLite, which has no statistics, to that order; PostgreSQL plans it as any join.
    static let notificationsSQL = """
        SELECT DISTINCT n.notification_uuid, n.notification_type, n.subtype, n.state, n.transaction_id, n.received_at
        FROM ownership o CROSS JOIN apple_notifications n
        WHERE n.app_id = o.app_id AND n.original_transaction_id = o.original_transaction_id
            AND o.app_id = ? AND o.app_user_id = ? AND n.received_at <= ?
        ORDER BY n.received_at DESC, n.notification_uuid LIMIT ?
        """

    /// Webhook events about the user before `before`, newest first, with how their deliveries stand.
    func webhookEvents(_ user: String, before: Int64, limit: Int) throws -> [TimelineItem] {
        try db.query("""
            SELECT e.id, e.type, e.sequence, e.occurred_at,
                (SELECT COUNT(*) FROM webhook_deliveries d WHERE d.event_id = e.id AND d.state = 'delivered') AS delivered,
                (SELECT COUNT(*) FROM webhook_deliveries d WHERE d.event_id = e.id) AS deliveries
            FROM webhook_events e WHERE e.app_id = ? AND e.app_user_id = ? AND e.occurred_at <= ? ORDER BY e.occurred_at DESC, e.id LIMIT ?
            """, [appId, user, before, limit]).map { row in
            TimelineItem(at: row.int("occurred_at") ?? 0, kind: "webhook", id: row.string("id") ?? "",
                         detail: ["type": row.string("type") ?? "", "sequence": String(row.int("sequence") ?? 0),
                                  "delivered": "\(row.int("delivered") ?? 0)/\(row.int("deliveries") ?? 0)"])
        }
    }

    /// Audit events of the user before `before`, newest first.
    func audit(_ user: String, before: Int64, limit: Int) throws -> [TimelineItem] {
        try db.query("""
            SELECT id, kind, detail, created_at FROM audit_events WHERE app_id = ? AND app_user_id = ? AND created_at <= ?
            ORDER BY created_at DESC, id LIMIT ?
            """, [appId, user, before, limit]).map { row in
            TimelineItem(at: row.int("created_at") ?? 0, kind: "audit", id: row.string("id") ?? "",
                         detail: ["event": row.string("kind") ?? "", "detail": row.string("detail") ?? ""])
        }
    }
}

extension CustomerRepository {
    /// Replaces a user's id everywhere by `tombstone` and drops what is personal: uploaded receipts, the user's own
    /// audit details, webhook events about them. Amounts stay in the ledger for the books. False when the user is unknown.
    func erase(_ user: String, tombstone: String) throws -> Bool {
        let known = try !db.query("SELECT app_user_id FROM users WHERE app_id = ? AND app_user_id = ?", [appId, user]).isEmpty
            || !db.query("SELECT app_user_id FROM verification_jobs WHERE app_id = ? AND app_user_id = ? LIMIT 1", [appId, user]).isEmpty
        guard known else { return false }
        for table in ["ledger", "ownership", "balances", "spends", "balance_adjustments", "promotional_entitlements", "users"] {
            try db.query("UPDATE \(table) SET app_user_id = ? WHERE app_id = ? AND app_user_id = ?", [tombstone, appId, user])
        }
        try db.query("UPDATE users SET flag_reason = NULL WHERE app_id = ? AND app_user_id = ?", [appId, tombstone])
        try db.query("UPDATE verification_jobs SET app_user_id = ?, result = NULL WHERE app_id = ? AND app_user_id = ?",
                     [tombstone, appId, user])
        // After the jobs are the tombstone's (unique to this erase): an upload committed meanwhile was either renamed, and
        // its receipt goes here, or comes after, under the user's id.
        try db.query("""
            DELETE FROM verification_receipts WHERE job_id IN (SELECT id FROM verification_jobs WHERE app_id = ? AND app_user_id = ?)
            """, [appId, tombstone])
        try db.query("UPDATE audit_events SET app_user_id = ?, detail = '{\"redacted\":\"customer deleted\"}' WHERE app_id = ? AND app_user_id = ?",
                     [tombstone, appId, user])
        try db.query("""
            DELETE FROM webhook_attempts WHERE event_id IN (SELECT id FROM webhook_events WHERE app_id = ? AND app_user_id = ?)
            """, [appId, user])
        let delivered = try db.query("""
            DELETE FROM webhook_deliveries WHERE event_id IN (SELECT id FROM webhook_events WHERE app_id = ? AND app_user_id = ?)
            RETURNING state
            """, [appId, user]).filter { $0.string("state") == "delivered" }.count
        if delivered > 0 { try StateTotalsRepository(db: db, subject: "webhook_deliveries").add(-Int64(delivered), state: "delivered") }
        try db.query("DELETE FROM webhook_events WHERE app_id = ? AND app_user_id = ?", [appId, user])
        try db.query("DELETE FROM webhook_sequences WHERE app_id = ? AND app_user_id = ?", [appId, user])
        try db.query("DELETE FROM user_aliases WHERE app_id = ? AND (alias = ? OR app_user_id = ?)", [appId, user, user])
        return true
    }
}

extension CustomerRepository {
    /// Merges `alias` (an anonymous id) into `user`: ownership moves (or, with `share`, is added), balances are
    /// added up, promotional grants move unless `user` has the same one, and the alias is recorded.
    /// Returns the original transactions that changed hands.
    func merge(alias: String, into user: String, share: Bool, now: Int64) throws -> [String] {
        // Taken with DELETE … RETURNING (or locked, to share): two merges of one alias at once, or a merge racing a
        // spend, cannot both read the same rows; the second finds them gone (PostgreSQL runs at read committed).
        let ownership: [SQLRow]
        if share {
            ownership = try db.query("""
                SELECT environment, original_transaction_id, product_id FROM ownership WHERE app_id = ? AND app_user_id = ?\(dialect == .postgres ? " FOR UPDATE" : "")
                """, [appId, alias])
        } else {
            ownership = try db.query("""
                DELETE FROM ownership WHERE app_id = ? AND app_user_id = ? RETURNING environment, original_transaction_id, product_id
                """, [appId, alias])
        }
        for row in ownership {
            try db.query("""
                INSERT INTO ownership (app_id, environment, original_transaction_id, app_user_id, product_id, granted_at) VALUES (?, ?, ?, ?, ?, ?)
                ON CONFLICT DO NOTHING
                """, [appId, row.string("environment") ?? "", row.string("original_transaction_id") ?? "", user, row.string("product_id") ?? "", now])
        }
        for row in try db.query("DELETE FROM balances WHERE app_id = ? AND app_user_id = ? RETURNING currency, amount", [appId, alias]) {
            try db.query("""
                INSERT INTO balances (app_id, app_user_id, currency, amount) VALUES (?, ?, ?, ?)
                ON CONFLICT (app_id, app_user_id, currency) DO UPDATE SET amount = balances.amount + excluded.amount
                """, [appId, user, row.string("currency") ?? "", row.int("amount") ?? 0])
        }
        // The credits moved, so a refund's claw-back must find them with the user who has them now.
        try db.query("UPDATE ledger SET app_user_id = ? WHERE app_id = ? AND app_user_id = ? AND product_type = 'consumable'", [user, appId, alias])
        try db.query("""
            UPDATE users SET promotional = 1 WHERE app_id = ? AND app_user_id = ? AND EXISTS
                (SELECT 1 FROM promotional_entitlements WHERE app_id = ? AND app_user_id = ?)
            """, [appId, user, appId, alias])
        try db.query("""
            UPDATE promotional_entitlements SET app_user_id = ? WHERE app_id = ? AND app_user_id = ? AND entitlement NOT IN
                (SELECT entitlement FROM promotional_entitlements WHERE app_id = ? AND app_user_id = ?)
            """, [user, appId, alias, appId, user])
        try db.query("""
            INSERT INTO user_aliases (app_id, alias, app_user_id, created_at) VALUES (?, ?, ?, ?)
            ON CONFLICT (app_id, alias) DO UPDATE SET app_user_id = excluded.app_user_id, created_at = excluded.created_at
            """, [appId, alias, user, now])
        return Array(Set(ownership.compactMap { $0.string("original_transaction_id") })).sorted()
    }
}
