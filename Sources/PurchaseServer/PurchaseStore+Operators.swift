import AppStoreCrypto
import Foundation
import Storage

/// Console sign-in: operators, passwords, one-time links and sessions. Every secret handed out (a session
/// cookie, a link) is 32 random bytes; only its SHA-256 is stored.
extension PurchaseStore {
    /// How long a session lives without use, and a login link at all.
    static let sessionLifetime: TimeInterval = 12 * 3600
    static let linkLifetime: TimeInterval = 24 * 3600

    static func secretToken() -> String {
        var generator = SystemRandomNumberGenerator()
        return (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &generator)) }.joined()
    }

    /// Adds (or updates) an operator and returns a one-time login link token for them.
    /// - Parameter replacing: whether an existing operator of that email may be changed (the CLI and the admin API);
    ///   the console refuses it, so that an admin cannot take a link into someone else's account.
    public func addOperator(email: String, role: OperatorRole, password: String?, replacing: Bool = true, now: Date) async throws
        -> (Operator, linkToken: String) {
        guard let email = Operator.normalizedEmail(email) else { throw ServerError(.invalidOperator, "The email address is not valid.") }
        if !replacing, try await database.transaction({ db in try OperatorRepository(db: db).operatorRecord(email) }) != nil {
            throw ServerError(.operatorExists, "\(email) is already an operator.")
        }
        var hash: String?
        if let password {
            guard (8...PasswordHash.maximumLength).contains(password.utf8.count) else {
                throw ServerError(.invalidPassword, "A password is 8 to \(PasswordHash.maximumLength) bytes.")
            }
            hash = try await passwordChecks.run { try PasswordHash.make(password) }
        }
        let token = Self.secretToken()
        let record = try await database.transaction { [ids, hash] db in
            let operators = OperatorRepository(db: db)
            try operators.upsert(email: email, role: role, passwordHash: hash, now: now.milliseconds)
            try operators.addLink(tokenHash: APIKey.hash(token), email: email, expiresAt: now.addingTimeInterval(Self.linkLifetime).milliseconds)
            try AuditRepository(db: db, ids: ids).append(appId: "", userId: nil, kind: "operator_added", detail: ["email": email, "role": role.rawValue],
                                                         now: now)
            return try operators.operatorRecord(email)?.operator
        }
        guard let record else { throw ServerError(.internalError, "The operator was not stored.") }
        return (record, token)
    }

    public func operators() async throws -> [Operator] {
        try await database.transaction { db in try OperatorRepository(db: db).operators() }
    }

    public func removeOperator(email: String, by actor: String, now: Date) async throws {
        let removed = try await database.transaction { [ids] db in
            let removed = try OperatorRepository(db: db).remove(email: email)
            if removed {
                try AuditRepository(db: db, ids: ids).append(appId: "", userId: nil, kind: "operator_removed", detail: ["email": email, "by": actor], now: now)
            }
            return removed
        }
        guard removed else { throw ServerError(.operatorNotFound, "No operator \(email).") }
    }

    /// Checks a password and opens a session: its cookie token, or nil when the email or password is wrong
    /// (the same answer for both, and a hash is checked either way so that timing does not tell them apart).
    /// scrypt runs on two queues of its own, at most 8 checks in flight (2 running, 6 waiting): a burst of sign-ins
    /// gets `busy`, not the server's threads.
    public func logIn(email: String, password: String, now: Date) async throws -> String? {
        guard let email = Operator.normalizedEmail(email), password.utf8.count <= PasswordHash.maximumLength else { return nil }
        let stored = try await database.transaction { db in try OperatorRepository(db: db).operatorRecord(email)?.passwordHash }
        let valid: Bool
        do {
            valid = try await passwordChecks.run { [decoy = Self.decoyHash] in PasswordHash.verify(password, against: stored ?? decoy) }
        } catch is BoundedWork.Busy {
            throw ServerError(.busy, "Too many sign-ins are being checked; try again in a moment.")
        }
        guard valid, stored != nil else { return nil }
        return try await openSession(email: email, now: now)
    }

    /// A hash that no password matches, checked for unknown emails.
    private static let decoyHash = (try? PasswordHash.make(secretToken())) ?? ""

    /// Uses a one-time login link: a session token, or nil when the link is unknown, used or expired.
    public func logIn(linkToken: String, now: Date) async throws -> String? {
        guard linkToken.utf8.count == 64 else { return nil }
        guard let email = try await database.transaction({ db in
            try OperatorRepository(db: db).useLink(tokenHash: APIKey.hash(linkToken), now: now.milliseconds)
        }) else { return nil }
        return try await openSession(email: email, now: now)
    }

    private func openSession(email: String, now: Date) async throws -> String {
        let token = Self.secretToken(), csrf = Self.secretToken()
        try await database.transaction { [ids] db in
            try OperatorRepository(db: db).addSession(tokenHash: APIKey.hash(token), email: email, csrf: csrf, now: now.milliseconds,
                                                      expiresAt: now.addingTimeInterval(Self.sessionLifetime).milliseconds)
            try AuditRepository(db: db, ids: ids).append(appId: "", userId: nil, kind: "operator_logged_in", detail: ["email": email], now: now)
        }
        return token
    }

    /// The live session of a cookie token (its lifetime extended), or nil.
    public func consoleSession(token: String, now: Date) async throws -> ConsoleSession? {
        guard token.utf8.count == 64 else { return nil }
        return try await database.transaction { db in
            try OperatorRepository(db: db).session(tokenHash: APIKey.hash(token), now: now.milliseconds,
                                                   extendTo: now.addingTimeInterval(Self.sessionLifetime).milliseconds)
        }
    }

    public func logOut(token: String) async throws {
        try await database.transaction { db in try OperatorRepository(db: db).endSession(tokenHash: APIKey.hash(token)) }
    }

    /// Sets an operator's password. One that has a password must give it (a stolen session cannot take the account
    /// over for good), and every other session of theirs ends.
    public func setOperatorPassword(email: String, current: String?, password: String, keeping sessionToken: String, now: Date) async throws {
        guard (8...PasswordHash.maximumLength).contains(password.utf8.count) else {
            throw ServerError(.invalidPassword, "A password is 8 to \(PasswordHash.maximumLength) bytes.")
        }
        let stored = try await database.transaction { db in try OperatorRepository(db: db).operatorRecord(email)?.passwordHash }
        if let stored {
            let given = current ?? ""
            let matches = (try? await passwordChecks.run { PasswordHash.verify(given, against: stored) }) ?? false
            guard matches else { throw ServerError(.invalidPassword, "The current password is wrong.") }
        }
        let hash = try await passwordChecks.run { try PasswordHash.make(password) }
        try await database.transaction { [ids] db in
            let operators = OperatorRepository(db: db)
            try operators.setPassword(email: email, passwordHash: hash)
            try operators.endSessions(email: email, except: APIKey.hash(sessionToken))
            try AuditRepository(db: db, ids: ids).append(appId: "", userId: nil, kind: "operator_password_set", detail: ["email": email], now: now)
        }
    }

    /// Records that an offer was signed for a user (who asked for which discount).
    func auditOffer(appId: String, userId: String?, productId: String, offerId: String, now: Date, kind: String = "offer_signed",
                    detail extra: [String: String] = [:]) async throws {
        try await database.transaction { [ids] db in
            try AuditRepository(db: db, ids: ids).append(appId: appId, userId: userId, kind: kind,
                                                         detail: ["productId": productId, "offerId": offerId].merging(extra) { $1 }, now: now)
        }
    }

    /// Whether the user was granted this transaction (what a signed offer bound to it may name).
    func userOwns(appId: String, userId: String, transactionId: String) async throws -> Bool {
        try await database.transaction { db in try LedgerReader(db: db).owns(appId: appId, appUserId: userId, transactionId: transactionId) }
    }

    /// Records a console action with the operator's name (the API's own audit records say what changed).
    func auditConsole(_ session: ConsoleSession, appId: String, userId: String?, action: String, detail: [String: String], now: Date) async throws {
        try await database.transaction { [ids] db in
            try AuditRepository(db: db, ids: ids).append(appId: appId, userId: userId, kind: "console_" + action,
                                                         detail: detail.merging(["operator": session.operatorInfo.email]) { $1 }, now: now)
        }
    }
}
