import AppStoreModels
import Clocks
import Foundation
import Storage

/// A unit price as Apple charged it: an exact decimal amount and its ISO 4217 currency.
public struct ChargedPrice: Sendable, Equatable {
    public var amount: String
    public var currency: String
}

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
    /// For a refund of part of the price (`REFUND_PRORATED`): the refunded share in milliunits of the whole
    /// (1…99,999). Nil for a refund in full, and for every source but a signed transaction.
    public var refundPercentage: Int?
    /// What Apple charged for one unit, from a signed transaction (`price` in milliunits and `currency`): an offer's
    /// price, a monthly plan's installment, the storefront's currency. Nil from verifyReceipt, which says nothing of
    /// it; the product mapping's price is recorded then.
    public var charged: ChargedPrice?
    public var isTrial: Bool
    /// `receipt`, `latest_receipt_info`, `transaction_receipt` or `signed_transaction`.
    public var source: String
    /// When this information was current, for a current source: a JWS's `signedDate`, or the time
    /// Apple answered for `latest_receipt_info`. Nil for history (a receipt's own purchase list),
    /// which can add a refund but never undo one (`SettlementPlan`).
    public var observedAt: Date?

    /// Whether this comes from a JWS Apple signed (a signed transaction, a notification's, the Server API's).
    public var isSigned: Bool { source == "signed_transaction" }

    public init(transactionId: String, originalTransactionId: String? = nil, productId: String, quantity: Int64 = 1, purchaseDate: Date,
                expiresDate: Date? = nil, cancellationDate: Date? = nil, cancellationReason: String? = nil, isTrial: Bool = false,
                source: String, observedAt: Date? = nil) {
        self.transactionId = transactionId
        self.originalTransactionId = originalTransactionId ?? transactionId
        self.productId = productId
        self.quantity = quantity
        self.purchaseDate = purchaseDate
        self.expiresDate = expiresDate
        self.cancellationDate = cancellationDate
        self.cancellationReason = cancellationReason
        self.isTrial = isTrial
        self.source = source
        self.observedAt = observedAt
    }

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
    public var priceIncreaseStatus: Int64?
}

/// Everything a successful verification settles in one database transaction.
public struct Settlement: Sendable {
    public var job: VerificationJob
    public var owner: String
    public var environment: AppStoreEnvironment
    public var transactions: [ConfirmedTransaction]
    public var subscriptions: [ConfirmedSubscription]
    /// When it was settled: the ledger's `recorded_at` and the job's `settled_at`. `PurchaseStore.settle(_:clock:)`
    /// sets it again when the settlement's transaction runs, so time to grant counts the wait for a batch.
    public var now: Date
    /// When Apple's answer was taken: the time of the subscription state it carries, which must not look newer than
    /// a notification signed while the settlement waited for its batch. Nil: `now` as first given.
    public var answeredAt: Date? = nil
    /// How long Apple took to answer (zero where nothing was asked): a tenth of it is how long the settlement may wait
    /// to be committed with others (`Gathering.patience(afterApple:)`).
    public var appleTook: Duration = .zero
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
    /// Refunds reversed, with the credit given back.
    public var reinstated: [String] = []
    /// New consumables left for the upload that names them (`DeliveryHint`).
    public var deferred: [String] = []

    enum CodingKeys: String, CodingKey { case granted, alreadyOwned, refused, unknownProducts, revoked, reinstated, deferred }

    public init() {}

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        granted = try container.decodeIfPresent([String].self, forKey: .granted) ?? []
        alreadyOwned = try container.decodeIfPresent([String].self, forKey: .alreadyOwned) ?? []
        refused = try container.decodeIfPresent([Refusal].self, forKey: .refused) ?? []
        unknownProducts = try container.decodeIfPresent([String].self, forKey: .unknownProducts) ?? []
        revoked = try container.decodeIfPresent([String].self, forKey: .revoked) ?? []
        reinstated = try container.decodeIfPresent([String].self, forKey: .reinstated) ?? []
        deferred = try container.decodeIfPresent([String].self, forKey: .deferred) ?? []
    }

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
            for (name, list) in [("unknownProducts", unknownProducts), ("revoked", revoked), ("reinstated", reinstated), ("deferred", deferred)] {
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
    /// Each settlement is stamped with `clock`'s time when its transaction runs.
    public func settle(_ settlement: Settlement, clock: any WallClock) async throws -> (JobState, SettlementResult)? {
        // Events it wrote go out now rather than at the deliverer's next poll.
        try await wakingWebhooks {
            try await settlements.write(settlement, patience: Gathering.patience(afterApple: settlement.appleTook)) { [self] batch in
                await self.settle(batch: batch, clock: clock)
            }
        }
    }

    /// Settles a batch in one transaction (one commit for many jobs, applied in order, as if one by
    /// one); if that fails, each half of it the same way, the first half first, down to single jobs: one job's failure
    /// never holds back the others, and it costs a gathered batch of two thousand about twenty transactions more, not
    /// two thousand.
    func settle(batch: [Settlement], clock: any WallClock) async -> [Result<(JobState, SettlementResult)?, any Error>] {
        guard batch.count > 1 else {
            guard let settlement = batch.first else { return [] }
            return [await Result { try await self.settleTogether([settlement], clock: clock)[0] }]
        }
        if let all = try? await settleTogether(batch, clock: clock) {
            return all.map { .success($0) }
        }
        let half = batch.count / 2
        return await settle(batch: Array(batch[..<half]), clock: clock) + settle(batch: Array(batch[half...]), clock: clock)
    }

    /// Settles `batch` in one transaction, in order; the reads of all of them first, in one statement per kind.
    /// Every settlement of the batch is stamped with `clock`'s time when its transaction began.
    func settleTogether(_ batch: [Settlement], clock: any WallClock) async throws -> [(JobState, SettlementResult)?] {
        try await database.transaction { db in
            let now = clock.now()
            var batch = batch
            for index in batch.indices {
                batch[index].answeredAt = batch[index].answeredAt ?? batch[index].now
                batch[index].now = now
            }
            var catalog = SettlementCatalog()
            var reads = try SettlementReads.load(batch, jobs: self.jobs(db), db: db, audit: self.audit(db))
            let outcomes = try batch.map { try self.apply($0, db, catalog: &catalog, reads: &reads) }
            try self.jobs(db).closeSettled(zip(batch, outcomes).compactMap { settlement, outcome in outcome.map { (settlement.job.id, $0.0) } })
            return outcomes
        }
    }

    /// Apps and product mappings read once per settlement transaction, however many jobs it settles.
    struct SettlementCatalog {
        var apps: [String: ServerApp] = [:]
        var mappings: [String: [String: ProductMapping]] = [:]
        var webhooks: [String: [WebhookEndpoint]] = [:]

        mutating func webhooks(_ appId: String, _ repository: WebhookRepository) throws -> [WebhookEndpoint] {
            if let known = webhooks[appId] { return known }
            let loaded = try repository.endpoints(appId: appId).map(\.endpoint)
            webhooks[appId] = loaded
            return loaded
        }

        mutating func app(_ id: String, _ db: any SQLConnection) throws -> ServerApp {
            if let app = apps[id] { return app }
            // No secrets are needed to settle, so none are opened.
            guard let app = try AppRepository(db: db, secrets: nil).app(id) else {
                throw ServerError(.appNotFound, "App \(id) is not registered.")
            }
            apps[id] = app
            return app
        }

        mutating func mappings(_ appId: String, _ db: any SQLConnection) throws -> [String: ProductMapping] {
            if let known = mappings[appId] { return known }
            let loaded = Dictionary(try AppRepository(db: db, secrets: nil).products(appId: appId).map { ($0.productId, $0) }, uniquingKeysWith: { $1 })
            mappings[appId] = loaded
            return loaded
        }
    }

    /// One settlement inside the caller's transaction: read what the plan needs, plan, write.
    func apply(_ settlement: Settlement, _ db: any SQLConnection, catalog: inout SettlementCatalog,
               reads: inout SettlementReads) throws -> (JobState, SettlementResult)? {
        let job = settlement.job
        let now = settlement.now.milliseconds
        let env = settlement.environment.rawValue
        let jobs = self.jobs(db)
        let ledger = LedgerRepository(db: db, appId: job.appId, environment: env, audit: self.audit(db))
        let mappings = try catalog.mappings(job.appId, db)
        let known = settlement.transactions.filter { mappings[$0.productId] != nil }
        let snapshot = try reads.snapshot(for: settlement, known: known, jobs: jobs, ledger: ledger)
        guard snapshot.holdsLease else { return nil }
        let app = try catalog.app(job.appId, db)
        let entries = snapshot.entries
        let plan = SettlementPlan.make(.init(appId: job.appId, appUserId: job.appUserId, verificationId: job.id, replayPolicy: app.replayPolicy,
                                             mappings: mappings, transactions: settlement.transactions, ledger: entries,
                                             owners: snapshot.owners, deliver: job.deliver, now: now))
        try ledger.write(plan.actions, user: job.appUserId, verificationId: job.id, now: settlement.now)
        let endpoints = try catalog.webhooks(job.appId, webhooks(db))
        if !endpoints.isEmpty {
            try recordEvents(WebhookEvents.of(plan.actions, user: job.appUserId, environment: env, ledger: entries), appId: job.appId,
                             endpoints: endpoints, db, now: settlement.now, mappings: mappings)
        }
        let result = plan.result
        let subscriptions = SubscriptionRepository(db: db, appId: job.appId, environment: env)
        for subscription in settlement.subscriptions {
            let expires = settlement.transactions.filter { $0.originalTransactionId == subscription.originalTransactionId && $0.cancellationDate == nil }
                .compactMap(\.expiresDate).max()
            let latest = settlement.transactions.filter { $0.originalTransactionId == subscription.originalTransactionId }
                .max { $0.purchaseDate < $1.purchaseDate }
            let revoked = latest?.cancellationDate
            // Apple's answer is the state at the time it answered (not when its batch was written).
            try subscriptions.record(SubscriptionState(originalTransactionId: subscription.originalTransactionId, productId: subscription.productId,
                                                       autoRenewProductId: subscription.autoRenewProductId, autoRenewStatus: subscription.autoRenewStatus,
                                                       expiresDate: expires?.milliseconds, expirationIntent: subscription.expirationIntent,
                                                       isInBillingRetry: subscription.isInBillingRetry,
                                                       gracePeriodExpiresDate: subscription.gracePeriodExpiresDate?.milliseconds,
                                                       revokedAt: revoked?.milliseconds, priceIncreaseStatus: subscription.priceIncreaseStatus,
                                                       signedDate: (settlement.answeredAt ?? settlement.now).milliseconds,
                                                       periodPurchaseDate: latest?.purchaseDate.milliseconds))
        }
        let state: JobState
        var reason: String?
        if result.granted.isEmpty && result.alreadyOwned.isEmpty && !result.refused.isEmpty {
            state = .rejected
            reason = result.refused[0].reason
        } else if result.granted.isEmpty && result.alreadyOwned.isEmpty && result.revoked.isEmpty && result.reinstated.isEmpty {
            state = .rejected
            reason = result.unknownProducts.isEmpty ? "the receipt contains no purchases" : "the receipt contains only products this app does not sell: \(result.unknownProducts.joined(separator: ", "))"
        } else {
            state = .verified
        }
        let summary = result.jsonText
        try jobs.settle(job.id, state: state, reason: reason, environment: env, result: summary, receiptSHA256: job.receiptSHA256, now: now)
        return (state, result)
    }
}
