import AppStoreCrypto
import AppStoreModels
import Foundation
import Storage

extension PurchaseStore {
    /// Whether app user ids sort by code point in this database, asked once (see `CustomerRepository.idsSortByCodePoint`).
    func userIdsSortByCodePoint() async throws -> Bool {
        if let known = userIdOrder.withLock({ $0 }) { return known }
        let dialect = database.dialect
        let ordered = try await database.read { db in try CustomerRepository.idsSortByCodePoint(db, dialect: dialect) }
        userIdOrder.withLock { $0 = ordered }
        return ordered
    }

    /// The longest promotional grant: a century.
    static let maximumGrantDays: Int64 = 36_500

    /// Grants `entitlement` to a user until `expiresDate` (ms; nil for ever), replacing a live grant of it; audited,
    /// and announced (`ENTITLEMENT_GRANTED`). Returns the user as they stand after it.
    public func grantPromotional(appId: String, appUserId: String, entitlement: String, expiresDate: Int64?, reason: String, now: Date) async throws -> UserView {
        let entitlement = try ClientIdentifier(entitlement, .entitlement).value
        let reason = try ClientIdentifier(reason, .reason).value
        if let expiresDate {
            guard expiresDate > now.milliseconds, expiresDate <= now.milliseconds + Self.maximumGrantDays * 86_400_000 else {
                throw ServerError(.invalidDuration, "expiresDate must be in the future and at most \(Self.maximumGrantDays) days away.")
            }
        }
        return try await transactionWakingWebhooks { db in
            guard try self.apps(db).exists(appId) else { throw ServerError(.appNotFound, "App \(appId) is not registered.") }
            let users = UserRepository(db: db, appId: appId)
            try users.ensureUser(appUserId, now: now.milliseconds)
            try users.grant(appUserId, PromotionalGrant(entitlement: entitlement, expiresDate: expiresDate, reason: reason, grantedAt: now.milliseconds))
            try self.audit(db).append(appId: appId, userId: appUserId, kind: "promotional_granted",
                                      detail: ["entitlement": entitlement, "reason": reason, "expiresDate": expiresDate.map(String.init) ?? "never"], now: now)
            try self.recordEvents([WebhookEventDraft(type: .entitlementGranted, appUserId: appUserId, expiresDate: expiresDate, entitlement: entitlement,
                                                     reason: reason)],
                                  appId: appId, endpoints: try self.webhooks(db).endpoints(appId: appId).map(\.endpoint), db, now: now)
            return try self.userView(appId: appId, appUserId: appUserId, db, now: now)
        }
    }

    /// Revokes a live promotional grant; audited and announced (`ENTITLEMENT_REVOKED`).
    public func revokePromotional(appId: String, appUserId: String, entitlement: String, reason: String, now: Date) async throws -> UserView {
        let entitlement = try ClientIdentifier(entitlement, .entitlement).value
        let reason = try ClientIdentifier(reason, .reason).value
        return try await transactionWakingWebhooks { db in
            guard try UserRepository(db: db, appId: appId).revoke(appUserId, entitlement: entitlement, now: now.milliseconds) else {
                throw ServerError(.grantNotFound, "\(appUserId) has no promotional \(entitlement) to revoke.")
            }
            try self.audit(db).append(appId: appId, userId: appUserId, kind: "promotional_revoked", detail: ["entitlement": entitlement, "reason": reason],
                                      now: now)
            try self.recordEvents([WebhookEventDraft(type: .entitlementRevoked, appUserId: appUserId, entitlement: entitlement, reason: reason)],
                                  appId: appId, endpoints: try self.webhooks(db).endpoints(appId: appId).map(\.endpoint), db, now: now)
            return try self.userView(appId: appId, appUserId: appUserId, db, now: now)
        }
    }

    /// The answer to a balance adjustment.
    public struct AdjustmentResult: Codable, Sendable, Equatable {
        public var currency: String
        public var amount: Int64
        public var balance: Int64
        public var idempotencyKey: String
        /// True when this key was already used: the original result, nothing adjusted again.
        public var replayed: Bool
    }

    /// Support adds to (or takes from) a balance, once per idempotency key, never below zero; audited with the
    /// reason and announced (`BALANCE_CHANGED`).
    public func adjustBalance(appId: String, appUserId: String, currency: String, amount: Int64, reason: String, idempotencyKey: String,
                              now: Date) async throws -> AdjustmentResult {
        // `magnitude`, not abs(): abs(Int64.min) traps.
        guard amount != 0, amount.magnitude <= UInt64(ProductMapping.acceptedAmounts.upperBound) else {
            throw ServerError(.invalidAmount, "An adjustment is a non-zero amount of at most \(ProductMapping.acceptedAmounts.upperBound) either way.")
        }
        guard !idempotencyKey.isEmpty else { throw ServerError(.missingIdempotencyKey, "Send an Idempotency-Key header (1–256 bytes).") }
        let idempotencyKey = try ClientIdentifier(idempotencyKey, .idempotencyKey).value
        let currency = try ClientIdentifier(currency, .currency).value
        let reason = try ClientIdentifier(reason, .reason).value
        return try await transactionWakingWebhooks { db in
            guard try self.apps(db).exists(appId) else { throw ServerError(.appNotFound, "App \(appId) is not registered.") }
            let users = UserRepository(db: db, appId: appId)
            if let previous = try users.adjustment(appUserId, idempotencyKey: idempotencyKey) {
                guard previous.currency == currency, previous.amount == amount else {
                    throw ServerError(.idempotencyKeyReused, "This idempotency key was used for a different adjustment.")
                }
                return AdjustmentResult(currency: currency, amount: amount, balance: previous.balanceAfter, idempotencyKey: idempotencyKey, replayed: true)
            }
            try users.ensureUser(appUserId, now: now.milliseconds)
            guard let balance = try users.adjust(appUserId, currency: currency, by: amount) else {
                throw ServerError(.insufficientBalance, "The \(currency) balance is \(try users.balance(appUserId, currency: currency)); \(-amount) cannot be taken.")
            }
            try users.recordAdjustment(appUserId, idempotencyKey: idempotencyKey, currency: currency, amount: amount, balanceAfter: balance, reason: reason,
                                       now: now.milliseconds)
            try self.audit(db).append(appId: appId, userId: appUserId, kind: "balance_adjusted",
                                      detail: ["currency": currency, "amount": String(amount), "balanceAfter": String(balance), "reason": reason,
                                               "idempotencyKey": idempotencyKey], now: now)
            try self.recordEvents([WebhookEventDraft(type: .balanceChanged, appUserId: appUserId, currency: currency, balanceChange: amount, reason: reason)],
                                  appId: appId, endpoints: try self.webhooks(db).endpoints(appId: appId).map(\.endpoint), db, now: now)
            return AdjustmentResult(currency: currency, amount: amount, balance: balance, idempotencyKey: idempotencyKey, replayed: false)
        }
    }
}

extension PurchaseStore {
    /// A privacy request: the user's id is replaced everywhere by a tombstone (`deleted-` and 32 random hex digits:
    /// nobody can compute it to claim what it holds, and a returning customer deleted again gets another), uploaded
    /// receipts and the user's audit details are dropped, and webhook events and aliases about them removed. Ledger
    /// rows keep their amounts, so the revenue report still reconciles to the cent. Returns the tombstone.
    public func deleteCustomer(appId: String, appUserId: String, now: Date) async throws -> String {
        let tombstone = "deleted-" + ids.nextString().replacingOccurrences(of: "-", with: "")
        try await database.transaction { db in
            guard try CustomerRepository(db: db, appId: appId).erase(appUserId, tombstone: tombstone) else {
                throw ServerError(.userNotFound, "App \(appId) has no user \(appUserId).")
            }
            try self.audit(db).append(appId: appId, userId: tombstone, kind: "customer_deleted", detail: [:], now: now)
        }
        return tombstone
    }
}

extension PurchaseStore {
    /// What an alias merge did.
    public struct AliasResult: Codable, Sendable, Equatable {
        public var appUserId: String
        public var alias: String
        /// Original transactions that moved (or, under `share`, were shared) to `appUserId`.
        public var transferred: [String]
        public var user: UserView
    }

    /// Merges an anonymous app user id into a logged-in one: the alias's purchases follow under the app's
    /// replay policy (`share` keeps them on both, otherwise they move), balances add up; audited and announced
    /// (`TRANSFER`, with `fromUsers`). Merging a user into itself is refused.
    public func alias(appId: String, appUserId: String, alias: String, now: Date) async throws -> AliasResult {
        guard alias != appUserId else { throw ServerError(.invalidAlias, "A user cannot be its own alias.") }
        return try await transactionWakingWebhooks { db in
            guard let app = try self.apps(db).app(appId) else { throw ServerError(.appNotFound, "App \(appId) is not registered.") }
            let users = UserRepository(db: db, appId: appId)
            try users.ensureUser(appUserId, now: now.milliseconds)
            let moved = try CustomerRepository(db: db, appId: appId, dialect: self.database.dialect)
                .merge(alias: alias, into: appUserId, share: app.replayPolicy == .share, now: now.milliseconds)
            try self.audit(db).append(appId: appId, userId: appUserId, kind: "alias_merged",
                                      detail: ["alias": alias, "transferred": moved.joined(separator: ",")], now: now)
            if !moved.isEmpty {
                try self.recordEvents([WebhookEventDraft(type: .transfer, appUserId: appUserId, fromUsers: [alias])], appId: appId,
                                      endpoints: try self.webhooks(db).endpoints(appId: appId).map(\.endpoint), db, now: now)
            }
            return AliasResult(appUserId: appUserId, alias: alias, transferred: moved, user: try self.userView(appId: appId, appUserId: appUserId, db, now: now))
        }
    }
}
