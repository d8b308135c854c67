import AppStoreModels
import Foundation
import Storage

/// One transaction Apple confirmed, ready for the ledger.
public struct ConfirmedTransaction: Sendable, Equatable {
    public var transactionId: String
    public var originalTransactionId: String
    public var productId: String
    public var quantity: Int64
    public var purchaseDate: Date
    public var originalPurchaseDate: Date?
    public var expiresDate: Date?
    public var webOrderLineItemId: String?
    public var cancellationDate: Date?
    public var cancellationReason: String?
    public var isTrial: Bool
    /// `receipt`, `latest_receipt_info` or `transaction_receipt`.
    public var source: String

    /// From a verifyReceipt entry.
    init?(_ info: ReceiptTransactionInfo, source: String) {
        guard let purchase = info.purchaseDate?.date else { return nil }
        transactionId = info.transactionId
        originalTransactionId = info.originalTransactionId ?? info.transactionId
        productId = info.productId
        quantity = Int64(info.quantity) ?? 1
        purchaseDate = purchase
        originalPurchaseDate = info.originalPurchaseDate?.date
        expiresDate = info.expiresDate?.date
        webOrderLineItemId = info.webOrderLineItemId
        cancellationDate = info.cancellationDate?.date
        cancellationReason = info.cancellationReason
        isTrial = info.isTrialPeriod == "true"
        self.source = source
    }

    /// From an iOS 6 style receipt object (hyphens already turned into underscores).
    init?(legacy fields: [String: Any], source: String) {
        func text(_ key: String) -> String? { fields[key] as? String }
        guard let id = text("transaction_id"), let product = text("product_id"), let ms = text("purchase_date_ms").flatMap(Int64.init) else { return nil }
        transactionId = id
        originalTransactionId = text("original_transaction_id") ?? id
        productId = product
        quantity = text("quantity").flatMap(Int64.init) ?? 1
        purchaseDate = Date(milliseconds: ms)
        originalPurchaseDate = text("original_purchase_date_ms").flatMap(Int64.init).map(Date.init(milliseconds:))
        expiresDate = text("expires_date").flatMap(Int64.init).map(Date.init(milliseconds:))
        webOrderLineItemId = text("web_order_line_item_id")
        cancellationDate = text("cancellation_date_ms").flatMap(Int64.init).map(Date.init(milliseconds:))
        cancellationReason = nil
        isTrial = text("is_trial_period") == "true"
        self.source = source
    }
}

/// The renewal state of one subscription as Apple reported it.
public struct ConfirmedSubscription: Sendable, Equatable {
    public var originalTransactionId: String
    public var productId: String
    public var autoRenewProductId: String?
    public var autoRenewStatus: Bool?
    public var expirationIntent: String?
    public var isInBillingRetry: Bool
    public var gracePeriodExpiresDate: Date?
}

/// Everything a successful verification settles in one database transaction.
public struct Settlement: Sendable {
    public var job: VerificationJob
    public var owner: String
    public var environment: AppStoreEnvironment
    public var transactions: [ConfirmedTransaction]
    public var subscriptions: [ConfirmedSubscription]
    public var now: Date
}

/// What settlement did, stored with the job and returned to the app.
public struct SettlementResult: Codable, Sendable, Equatable {
    public struct Refusal: Codable, Sendable, Equatable {
        public var transactionId: String
        public var productId: String
        public var code: String
        public var reason: String
    }
    /// Transactions newly granted to this user.
    public var granted: [String] = []
    /// Transactions this user already owned (seen before).
    public var alreadyOwned: [String] = []
    /// Transactions refused, with reasons.
    public var refused: [Refusal] = []
    /// Product ids the server has no mapping for (recorded nowhere, granted nothing).
    public var unknownProducts: [String] = []
    /// Refunds found, with the credit taken back.
    public var revoked: [String] = []

    /// The JSON stored with the job (the same keys `Codable` reads back), written without JSONEncoder: once per settlement.
    var jsonText: String {
        var json = JSONBuffer(capacity: 256)
        json.object { json in
            for (name, list) in [("granted", granted), ("alreadyOwned", alreadyOwned)] {
                json.key(name)
                json.array(list) { json, id in json.string(id) }
            }
            json.key("refused")
            json.array(refused) { json, refusal in
                json.object { json in
                    json.field("transactionId", refusal.transactionId)
                    json.field("productId", refusal.productId)
                    json.field("code", refusal.code)
                    json.field("reason", refusal.reason)
                }
            }
            for (name, list) in [("unknownProducts", unknownProducts), ("revoked", revoked)] {
                json.key(name)
                json.array(list) { json, id in json.string(id) }
            }
        }
        return String(decoding: json.bytes, as: UTF8.self)
    }
}

extension PurchaseStore {
    /// Records Apple's answer: ledger rows once per (environment, transaction), ownership under the
    /// app's replay policy, balance credits for new consumables, claw-backs for refunds, subscription
    /// states, and the job's final state — all in one transaction, guarded by the worker's lease.
    /// Returns nil when the lease was lost (another worker settles the job).
    public func settle(_ settlement: Settlement) async throws -> (JobState, SettlementResult)? {
        try await settlements.write(settlement) { [self] batch in await self.settle(batch: batch) }
    }

    /// Settles a batch in one transaction (one commit for many jobs, applied in order, as if one by
    /// one); if that fails, each job in its own transaction, so one job's failure never holds back the others.
    func settle(batch: [Settlement]) async -> [Result<(JobState, SettlementResult)?, any Error>] {
        if batch.count > 1, let all = try? await database.transaction({ db in
            var catalog = SettlementCatalog()
            return try batch.map { try self.apply($0, db, catalog: &catalog) }
        }) {
            return all.map { .success($0) }
        }
        var results: [Result<(JobState, SettlementResult)?, any Error>] = []
        for settlement in batch {
            results.append(await Result { try await self.database.transaction { db in
                var catalog = SettlementCatalog()
                return try self.apply(settlement, db, catalog: &catalog)
            } })
        }
        return results
    }

    /// Apps and product mappings read once per settlement transaction, however many jobs it settles.
    struct SettlementCatalog {
        var apps: [String: ServerApp] = [:]
        var mappings: [String: [String: ProductMapping]] = [:]

        mutating func app(_ id: String, _ db: any SQLConnection) throws -> ServerApp {
            if let app = apps[id] { return app }
            guard let row = try db.query("SELECT * FROM apps WHERE id = ?", [id]).first else {
                throw ServerError(404, "app_not_found", "App \(id) is not registered.")
            }
            let app = PurchaseStore.app(row, secrets: nil)
            apps[id] = app
            return app
        }

        mutating func mappings(_ appId: String, _ db: any SQLConnection) throws -> [String: ProductMapping] {
            if let known = mappings[appId] { return known }
            let loaded = Dictionary(try PurchaseStore.products(db, appId: appId).map { ($0.productId, $0) }, uniquingKeysWith: { $1 })
            mappings[appId] = loaded
            return loaded
        }
    }

    /// One settlement inside the caller's transaction.
    func apply(_ settlement: Settlement, _ db: any SQLConnection, catalog: inout SettlementCatalog) throws -> (JobState, SettlementResult)? {
        let job = settlement.job
        let now = settlement.now.milliseconds
        let env = settlement.environment.rawValue
        let held = try db.query("SELECT id FROM verification_jobs WHERE id = ? AND lease_owner = ? AND state = 'verifying'" +
                                (self.database.dialect == .postgres ? " FOR UPDATE" : ""), [job.id, settlement.owner])
        guard !held.isEmpty else { return nil }
        let app = try catalog.app(job.appId, db)
        let mappings = try catalog.mappings(job.appId, db)
        var result = SettlementResult()
        var seen: Set<String> = []
        for transaction in settlement.transactions where seen.insert(transaction.transactionId).inserted {
            guard let mapping = mappings[transaction.productId] else {
                if !result.unknownProducts.contains(transaction.productId) { result.unknownProducts.append(transaction.productId) }
                continue
            }
            try Self.record(db, transaction, mapping: mapping, app: app, settlement: settlement, result: &result)
        }
        for subscription in settlement.subscriptions {
            let expires = settlement.transactions.filter { $0.originalTransactionId == subscription.originalTransactionId && $0.cancellationDate == nil }
                .compactMap(\.expiresDate).max()
            let revoked = settlement.transactions.filter { $0.originalTransactionId == subscription.originalTransactionId }
                .max { $0.purchaseDate < $1.purchaseDate }?.cancellationDate
            try db.query("DELETE FROM subscriptions WHERE app_id = ? AND environment = ? AND original_transaction_id = ?",
                         [job.appId, env, subscription.originalTransactionId])
            try db.query("""
                INSERT INTO subscriptions (app_id, environment, original_transaction_id, product_id, auto_renew_product_id, auto_renew_status,
                expires_date, expiration_intent, is_in_billing_retry, grace_period_expires_date, revoked_at, updated_at)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                """, [job.appId, env, subscription.originalTransactionId, subscription.productId, subscription.autoRenewProductId,
                      subscription.autoRenewStatus.map { $0 ? 1 : 0 }, expires?.milliseconds, subscription.expirationIntent,
                      subscription.isInBillingRetry, subscription.gracePeriodExpiresDate?.milliseconds, revoked?.milliseconds, now])
        }
        let state: JobState
        var reason: String?
        if result.granted.isEmpty && result.alreadyOwned.isEmpty && !result.refused.isEmpty {
            state = .rejected
            reason = result.refused[0].reason
        } else if result.granted.isEmpty && result.alreadyOwned.isEmpty && result.revoked.isEmpty {
            state = .rejected
            reason = result.unknownProducts.isEmpty ? "the receipt contains no purchases" : "the receipt contains only products this app does not sell: \(result.unknownProducts.joined(separator: ", "))"
        } else {
            state = .verified
        }
        let summary = result.jsonText
        try db.query("""
            UPDATE verification_jobs SET state = ?, reason = ?, environment = ?, result = ?, lease_owner = NULL, lease_expires_at = NULL,
            open_claims = 0, updated_at = ?, settled_at = ?, receipt_sha256 = COALESCE(?, receipt_sha256)\(state == .rejected ? ", receipt_data = ''" : "")
            WHERE id = ?
            """, [state.rawValue, reason, env, summary, now, now, state == .rejected ? job.receiptSHA256 : nil, job.id])
        return (state, result)
    }

    static func record(_ db: any SQLConnection, _ transaction: ConfirmedTransaction, mapping: ProductMapping, app: ServerApp,
                       settlement: Settlement, result: inout SettlementResult) throws {
        let job = settlement.job
        let env = settlement.environment.rawValue
        let now = settlement.now.milliseconds
        // Apple sells 1…10 units per transaction; anything else is refused before it can multiply a credit.
        guard ProductMapping.acceptedQuantities.contains(transaction.quantity) else {
            result.refused.append(.init(transactionId: transaction.transactionId, productId: transaction.productId, code: "invalid_quantity",
                                        reason: "transaction \(transaction.transactionId) has quantity \(transaction.quantity)"))
            return
        }
        let inserted = !(try db.query("""
            INSERT INTO ledger (environment, transaction_id, app_id, app_user_id, product_id, product_type, quantity, purchase_date,
            original_purchase_date, original_transaction_id, web_order_line_item_id, expires_date, price, currency, source, verification_id,
            cancellation_date, cancellation_reason, is_trial, recorded_at)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING transaction_id
            """, [env, transaction.transactionId, job.appId, job.appUserId, transaction.productId, mapping.type.rawValue, transaction.quantity,
                  transaction.purchaseDate.milliseconds, transaction.originalPurchaseDate?.milliseconds, transaction.originalTransactionId,
                  transaction.webOrderLineItemId, transaction.expiresDate?.milliseconds, mapping.price, mapping.priceCurrency,
                  transaction.source, job.id, transaction.cancellationDate?.milliseconds, transaction.cancellationReason, transaction.isTrial,
                  now]).isEmpty)
        // A row just inserted is ours; one seen before is read back (another app's, a refund to apply).
        let ledgerRow = inserted ? nil : try db.query("SELECT * FROM ledger WHERE environment = ? AND transaction_id = ?", [env, transaction.transactionId]).first
        guard inserted || ledgerRow?.string("app_id") == job.appId else {
            result.refused.append(.init(transactionId: transaction.transactionId, productId: transaction.productId, code: "other_app",
                                        reason: "transaction \(transaction.transactionId) belongs to another app"))
            return
        }

        // Ownership, bound to the original transaction under the app's replay policy.
        let owners = try db.query("SELECT app_user_id FROM ownership WHERE app_id = ? AND environment = ? AND original_transaction_id = ?",
                                  [job.appId, env, transaction.originalTransactionId]).compactMap { $0.string("app_user_id") }
        var owns = owners.contains(job.appUserId)
        if owners.isEmpty {
            try grant(db, transaction, job: job, env: env, now: now)
            owns = true
        } else if !owns {
            let policy = mapping.type == .consumable ? ReplayPolicy.reject : app.replayPolicy
            switch policy {
            case .reject:
                result.refused.append(.init(transactionId: transaction.transactionId, productId: transaction.productId, code: "replay_refused",
                                            reason: "transaction \(transaction.originalTransactionId) is bound to another user"))
                try audit(db, appId: job.appId, userId: job.appUserId, kind: "replay_refused",
                          detail: ["originalTransactionId": transaction.originalTransactionId, "owner": owners.joined(separator: ","),
                                   "verificationId": job.id], now: settlement.now)
                return
            case .transfer:
                try db.query("DELETE FROM ownership WHERE app_id = ? AND environment = ? AND original_transaction_id = ?",
                             [job.appId, env, transaction.originalTransactionId])
                try grant(db, transaction, job: job, env: env, now: now)
                try audit(db, appId: job.appId, userId: job.appUserId, kind: "ownership_transferred",
                          detail: ["originalTransactionId": transaction.originalTransactionId, "from": owners.joined(separator: ","),
                                   "verificationId": job.id], now: settlement.now)
                owns = true
            case .share:
                try grant(db, transaction, job: job, env: env, now: now)
                try audit(db, appId: job.appId, userId: job.appUserId, kind: "ownership_shared",
                          detail: ["originalTransactionId": transaction.originalTransactionId, "with": owners.joined(separator: ","),
                                   "verificationId": job.id], now: settlement.now)
                owns = true
            }
        }

        if inserted {
            result.granted.append(transaction.transactionId)
        } else {
            result.alreadyOwned.append(transaction.transactionId)
        }

        // Consumables credit their balance once, when first recorded (never when already refunded).
        if inserted, owns, mapping.type == .consumable, transaction.cancellationDate == nil, let currency = mapping.currency, let amount = mapping.amount {
            let credit = ProductMapping.credit(amount, times: transaction.quantity)
            try adjustBalance(db, appId: job.appId, userId: job.appUserId, currency: currency, by: credit)
            try db.query("UPDATE ledger SET credited_currency = ?, credited_amount = ? WHERE environment = ? AND transaction_id = ?",
                         [currency, credit, env, transaction.transactionId])
            try audit(db, appId: job.appId, userId: job.appUserId, kind: "balance_credited",
                      detail: ["transactionId": transaction.transactionId, "currency": currency, "amount": String(credit)], now: settlement.now)
        }

        // A refund seen now: mark it, revoke, and claw back credit (the balance may go negative).
        if !inserted, let ledgerRow, let cancelled = transaction.cancellationDate, ledgerRow.int("cancellation_date") == nil {
            try db.query("UPDATE ledger SET cancellation_date = ?, cancellation_reason = ? WHERE environment = ? AND transaction_id = ?",
                         [cancelled.milliseconds, transaction.cancellationReason, env, transaction.transactionId])
            result.revoked.append(transaction.transactionId)
            try audit(db, appId: job.appId, userId: ledgerRow.string("app_user_id"), kind: "transaction_revoked",
                      detail: ["transactionId": transaction.transactionId, "verificationId": job.id], now: settlement.now)
            if let currency = ledgerRow.string("credited_currency"), let credited = ledgerRow.int("credited_amount"), ledgerRow.int("clawed_back_at") == nil,
               let creditedUser = ledgerRow.string("app_user_id") {
                let balance = try adjustBalance(db, appId: job.appId, userId: creditedUser, currency: currency, by: -credited)
                try db.query("UPDATE ledger SET clawed_back_at = ? WHERE environment = ? AND transaction_id = ?", [now, env, transaction.transactionId])
                try audit(db, appId: job.appId, userId: creditedUser, kind: "balance_clawed_back",
                          detail: ["transactionId": transaction.transactionId, "currency": currency, "amount": String(credited),
                                   "balanceAfter": String(balance)], now: settlement.now)
                if balance < 0 {
                    try db.query("UPDATE users SET flagged = 1, flag_reason = ? WHERE app_id = ? AND app_user_id = ?",
                                 ["negative \(currency) balance after a refund", job.appId, creditedUser])
                }
            }
        }
    }

    static func grant(_ db: any SQLConnection, _ transaction: ConfirmedTransaction, job: VerificationJob, env: String, now: Int64) throws {
        // A user exists from the first thing granted (an upload alone creates none: junk fills nothing).
        try db.query("INSERT INTO users (app_id, app_user_id, flagged, created_at) VALUES (?, ?, 0, ?) ON CONFLICT DO NOTHING",
                     [job.appId, job.appUserId, now])
        try db.query("""
            INSERT INTO ownership (app_id, environment, original_transaction_id, app_user_id, product_id, granted_at)
            VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING
            """, [job.appId, env, transaction.originalTransactionId, job.appUserId, transaction.productId, now])
    }

    /// Adds `delta` to a balance and returns the new amount.
    @discardableResult
    static func adjustBalance(_ db: any SQLConnection, appId: String, userId: String, currency: String, by delta: Int64) throws -> Int64 {
        let rows = try db.query("""
            INSERT INTO balances (app_id, app_user_id, currency, amount) VALUES (?, ?, ?, ?)
            ON CONFLICT (app_id, app_user_id, currency) DO UPDATE SET amount = balances.amount + excluded.amount RETURNING amount
            """, [appId, userId, currency, delta])
        return rows.first?.int("amount") ?? delta
    }
}
