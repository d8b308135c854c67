import Foundation
import Storage

/// The SQL of console operators, their sessions and one-time login links. Tokens are stored as their SHA-256 only.
struct OperatorRepository {
    let db: any SQLConnection

    func operatorRecord(_ email: String) throws -> (operator: Operator, passwordHash: String?)? {
        guard let row = try db.query("SELECT * FROM operators WHERE email = ?", [email]).first else { return nil }
        return (Self.operatorValue(row), row.string("password_hash"))
    }

    func operators() throws -> [Operator] {
        try db.query("SELECT * FROM operators ORDER BY email").map(Self.operatorValue)
    }

    /// Adds an operator, or changes the role (and password, when given) of an existing one.
    func upsert(email: String, role: OperatorRole, passwordHash: String?, now: Int64) throws {
        try db.query("""
            INSERT INTO operators (email, role, password_hash, created_at) VALUES (?, ?, ?, ?)
            ON CONFLICT (email) DO UPDATE SET role = excluded.role, password_hash = COALESCE(excluded.password_hash, operators.password_hash)
            """, [email, role.rawValue, passwordHash, now])
    }

    func setPassword(email: String, passwordHash: String) throws {
        try db.query("UPDATE operators SET password_hash = ? WHERE email = ?", [passwordHash, email])
    }

    /// Removes an operator and ends their sessions and links.
    func remove(email: String) throws -> Bool {
        try db.query("DELETE FROM operator_sessions WHERE email = ?", [email])
        try db.query("DELETE FROM operator_login_links WHERE email = ?", [email])
        return !(try db.query("DELETE FROM operators WHERE email = ? RETURNING email", [email])).isEmpty
    }

    func addLink(tokenHash: String, email: String, expiresAt: Int64) throws {
        try db.query("INSERT INTO operator_login_links (token_hash, email, expires_at) VALUES (?, ?, ?)", [tokenHash, email, expiresAt])
    }

    /// Uses a login link once: the operator's email, or nil when it is unknown, used or expired.
    func useLink(tokenHash: String, now: Int64) throws -> String? {
        try db.query("""
            UPDATE operator_login_links SET used_at = ? WHERE token_hash = ? AND used_at IS NULL AND expires_at > ? RETURNING email
            """, [now, tokenHash, now]).first?.string("email")
    }

    func addSession(tokenHash: String, email: String, csrf: String, now: Int64, expiresAt: Int64) throws {
        try db.query("DELETE FROM operator_sessions WHERE expires_at <= ?", [now])
        try db.query("INSERT INTO operator_sessions (token_hash, email, csrf, created_at, expires_at) VALUES (?, ?, ?, ?, ?)",
                     [tokenHash, email, csrf, now, expiresAt])
    }

    /// A live session and its operator, its expiry pushed to `extendTo` (sliding).
    func session(tokenHash: String, now: Int64, extendTo: Int64) throws -> ConsoleSession? {
        guard let row = try db.query("""
            SELECT s.csrf, o.* FROM operator_sessions s JOIN operators o ON o.email = s.email
            WHERE s.token_hash = ? AND s.expires_at > ? AND s.created_at > ?
            """, [tokenHash, now, now - 7 * 86_400_000]).first else { return nil }
        try db.query("UPDATE operator_sessions SET expires_at = ? WHERE token_hash = ?", [extendTo, tokenHash])
        return ConsoleSession(operatorInfo: Self.operatorValue(row), csrf: row.string("csrf") ?? "", expiresAt: extendTo)
    }

    func endSessions(email: String, except tokenHash: String) throws {
        try db.query("DELETE FROM operator_sessions WHERE email = ? AND token_hash <> ?", [email, tokenHash])
    }

    func endSession(tokenHash: String) throws {
        try db.query("DELETE FROM operator_sessions WHERE token_hash = ?", [tokenHash])
    }

    private static func operatorValue(_ row: SQLRow) -> Operator {
        Operator(email: row.string("email") ?? "", role: OperatorRole(rawValue: row.string("role") ?? "") ?? .support,
                 hasPassword: row.string("password_hash") != nil, createdAt: row.int("created_at") ?? 0)
    }
}
