import AppStoreCrypto
import AppStoreModels
import Foundation
import Storage

/// What the server did with an App Store Server Notification V2.
public struct NotificationReceipt: Sendable, Equatable {
    public enum Outcome: String, Sendable {
        /// New; its transaction was queued for settlement (verificationId names the job).
        case queued
        /// Already received (same notificationUUID): nothing done again.
        case duplicate
        /// Recorded; its transaction belongs to no user yet (granted when the user's receipt or transaction arrives).
        case unmatched
        /// Recorded only (TEST, types that change nothing a user owns, types not yet known).
        case recorded
        /// Signed by Apple but not for this server to act on (no app here accepts its bundle id, another
        /// app's Apple id, a nested JWS that does not verify): recorded with the reason, answered 200 so
        /// Apple does not retry it for days.
        case ignored
    }

    public var notificationUUID: String
    public var notificationType: String
    public var outcome: Outcome
    public var verificationId: String?
    /// Why an ignored notification was not acted on.
    public var reason: String?
}

/// What the purchase server does with each notification type (the README's table, as a value).
public enum NotificationEffect: String, Sendable {
    /// The nested transaction is settled for its owner (renewals, refunds and their reversals,
    /// extensions, revocations, purchases, offers, expiries): the signed transaction is Apple's
    /// current truth and the ledger's rules (SettlementPlan) decide what changes.
    case settle
    /// Apple asks for consumption data: answered in the background when the app opted in.
    case consumption
    /// Recorded and visible (`GET /admin/v1/notifications`); nothing a user owns changes.
    case record

    /// The effect of `type` for a notification that does or does not carry a transaction.
    /// Renewal info, when present, always updates the subscription state (newest signedDate wins).
    public static func of(_ type: NotificationType, hasTransaction: Bool) -> NotificationEffect {
        switch type {
        case .consumptionRequest: return hasTransaction ? .consumption : .record
        case .test, .externalPurchaseToken, .rescindConsent, .renewalExtension: return .record
        default: return hasTransaction ? .settle : .record
        }
    }
}

/// The environment and bundle a notification names, read from whichever section it has.
struct NotificationAddress: Equatable {
    var bundleId: String?
    var environment: AppStoreEnvironment?
    var appAppleId: Int64?

    /// `data`, else `summary`, else `externalPurchaseToken`, else `appData` (reference §3.8: exactly one is present).
    init(_ payload: JSONValue) {
        let section = payload["data"] ?? payload["summary"] ?? payload["externalPurchaseToken"] ?? payload["appData"] ?? .null
        bundleId = section["bundleId"]?.text
        appAppleId = section["appAppleId"]?.int64
        if let text = section["environment"]?.text {
            environment = AppStoreEnvironment(rawValue: text)  // exactly Apple's two spellings
        } else if let purchase = section["externalPurchaseId"]?.text {
            environment = purchase.hasPrefix("SANDBOX") ? .sandbox : .production
        }
    }
}

extension PurchaseServer {
    /// Receives `{"signedPayload"}`: verifies the envelope against the trusted roots (400 when it is not
    /// Apple's), de-duplicates on notificationUUID, records the notification durably, updates the
    /// subscription's renewal state (newest signedDate wins), and queues its transaction for the user
    /// who owns it. A validly signed notification is never answered 4xx: one this server cannot act on
    /// is recorded as `ignored` with the reason (another app's is answered and not stored), a type it does
    /// not know is recorded, and settled like any other when it carries a transaction. A notification
    /// once ignored is processed again when it comes back (its app was added since).
    public func receiveNotification(_ body: Data) async throws -> NotificationReceipt {
        // Everything done to an unauthenticated body before its signature is known (JSON, Base64, the
        // envelope's chain and signature) runs on the notification queue, off the cooperative pool.
        let inspector = engine.transactionInspector
        let (signed, envelope, uuid, type, signedDate) = try await checkedOffPool { () throws(ServerError) in
            try Self.verifiedEnvelope(body, inspector: inspector)
        }
        let payload = envelope.payload
        metrics.notificationLag(seconds: Double(clock.now().milliseconds - signedDate) / 1000)
        let subtype = payload["subtype"]?.text
        let address = NotificationAddress(payload)
        // The envelope as stored: the certificate chain in its header and in the JWS it carries named by digest.
        let store = self.store
        func storedEnvelope() async throws -> String {
            try await store.storedJWS(signed, carried: [envelope.carried("data", "signedTransactionInfo"),
                                                        envelope.carried("data", "signedRenewalInfo")].compactMap { $0?.compact },
                                      decodedPayload: envelope.payloadBytes)
        }
        func ignore(_ appId: String?, _ reason: String) async throws -> NotificationReceipt {
            let fresh = try await recordNotification(uuid, appId: appId ?? "", type: type, subtype: subtype,
                                                     environment: address.environment?.rawValue ?? "", signedDate: signedDate, signed: try await storedEnvelope(),
                                                     transaction: nil, state: "ignored", reason: reason)
            return NotificationReceipt(notificationUUID: uuid, notificationType: type, outcome: fresh ? .ignored : .duplicate, reason: reason)
        }
        guard let bundleId = address.bundleId else { return try await ignore(nil, "the notification names no bundle id") }
        guard let environment = address.environment else { return try await ignore(nil, "the notification's environment is neither Sandbox nor Production") }
        guard let app = try await store.cachedApp(forBundle: bundleId) else {
            // Apple signs every developer's notifications with one chain: another app's (pointed here by anyone)
            // is answered, never stored, so it cannot fill the table or hide a later copy meant for an app added here.
            let reason = "no app here accepts bundle id \(bundleId)"
            return NotificationReceipt(notificationUUID: uuid, notificationType: type, outcome: .ignored, reason: reason)
        }
        if environment == .production, let expected = app.appAppleId, address.appAppleId != expected {
            return try await ignore(app.id, "the notification is for app Apple id \(address.appAppleId.map(String.init) ?? "none"), not \(expected)")
        }

        var decodedTransaction: JWSTransaction?
        var transactionJWS: DigestedReceipt?
        if let nested = envelope.carried("data", "signedTransactionInfo") {
            do {
                let bundleIds = app.bundleIds
                // Its digest, which the check takes, is its job's: not taken again on the writer.
                let inspected = try await checkedOffPool { () throws(ReceiptRejection) in
                    try inspector.inspectDigesting(nested, bundleIds: bundleIds)
                }
                guard inspected.environment == environment else {
                    return try await ignore(app.id, "the transaction's environment differs from the notification's")
                }
                decodedTransaction = inspected.transaction
                transactionJWS = DigestedReceipt(nested.compact, sha256: inspected.sha256)
            } catch let error as ReceiptRejection {
                // Apple signed the envelope, so a nested transaction we cannot verify is our trust store's problem
                // (a missing intermediate, a stale cache): 503, so that Apple sends it again.
                throw ServerError(.nestedUnverifiable, "signedTransactionInfo was refused: \(error.reason); send it again")
            }
        }
        let transaction = decodedTransaction, nestedJWS = transactionJWS
        var renewalInfo: JSONValue?
        if let nested = envelope.carried("data", "signedRenewalInfo") {
            do {
                renewalInfo = try await checkedOffPool { () throws(ReceiptRejection) in
                    try inspector.verify(nested, subject: "the renewal info's") { info in
                        ReceiptDate.date(milliseconds: info["signedDate"]?.int64 ?? signedDate)
                    }
                }
            } catch let error as ReceiptRejection {
                return try await ignore(app.id, "signedRenewalInfo was refused: \(error.reason)")
            }
        }

        let renewal = renewalInfo
        let stored = try await storedEnvelope()
        let effect = NotificationEffect.of(NotificationType(type), hasTransaction: transaction != nil)
        // A settlement job's receipt as stored: the same chain, named by the digest the envelope's form wrote (5.3 KB → about 1).
        let storedTransaction: String? = if effect == .settle, let nestedJWS { try await store.storedJWS(nestedJWS.text) } else { nil }
        let env = environment.rawValue
        let now = clock.now()
        // A settlement's job is written already claimed by this process's worker when it has a free place, and handed
        // to it with the transaction verified above once committed: no claim, no second check of the JWS.
        let lease = effect == .settle && nestedJWS != nil ? worker.reserve(now: now) : nil
        // Everything in one transaction: the record (or finding it already recorded), the renewal state, the
        // owner, and the settlement's job. A crash leaves either all of it or nothing, and Apple's retry finds nothing.
        // Notifications arriving together share the transaction (group commit), each applied in arrival order.
        let record: @Sendable (any SQLConnection) throws -> (NotificationReceipt.Outcome, VerificationJob?) = { db in
            let notifications = NotificationRepository(db: db)
            guard try notifications.insert(uuid, appId: app.id, type: type, subtype: subtype, environment: env, signedDate: signedDate,
                                           signed: stored, transaction: transaction, state: "received", reason: nil, now: now) else {
                return (.duplicate, nil)
            }
            let owner = try self.recordNotificationEffects(signed: signed, app: app, environment: env, type: type, subtype: subtype,
                                                           transaction: transaction, renewal: renewal, signedDate: signedDate, db, now: now)
            switch effect {
            case .record:
                try notifications.mark(uuid, state: "recorded")
                return (.recorded, nil)
            case .consumption:
                try notifications.mark(uuid, state: app.consumptionPolicy == .send ? "consumption_requested" : "consumption_ignored")
                return (.recorded, nil)
            case .settle:
                guard let nestedJWS, let owner else {
                    try notifications.mark(uuid, state: "unmatched")
                    return (.unmatched, nil)
                }
                var job = self.store.newJob(appId: app.id, appUserId: owner, kind: .signedTransaction, receipt: nestedJWS, now: now)
                job.storedReceipt = storedTransaction
                if let lease { job.claim(lease) }
                try self.store.insert([job], db)
                try notifications.mark(uuid, state: "queued", verificationId: job.id)
                return (.queued, job)
            }
        }
        // Webhook events it wrote go out now rather than at the deliverer's next poll.
        let outcome: NotificationReceipt.Outcome, job: VerificationJob?
        do {
            (outcome, job) = try await store.wakingWebhooks {
                try await notificationWrites.write(record, in: store.database) { write, db in try write(db) }
            }
        } catch {
            // Not written, or (the commit's answer lost) written under a lease that lapses and is taken over.
            if lease != nil { worker.giveBack() }
            throw error
        }
        if let job, job.lease != nil, let transaction {
            worker.handOver(job, inspected: VerificationEngine.InspectedTransaction(transaction: transaction, environment: environment))
        } else if lease != nil {
            worker.giveBack()
        }
        guard outcome != .duplicate else {
            // Usually Apple sending again. It may also be this very request's batch, committed although its commit
            // answered an error and retried alone: a wake-up costs one claim and finds its job if so (once its lease
            // lapses, when it was written claimed).
            worker.wake()
            return NotificationReceipt(notificationUUID: uuid, notificationType: type, outcome: .duplicate)
        }
        switch outcome {
        case .queued:
            if job?.lease == nil { worker.wake() }
            return NotificationReceipt(notificationUUID: uuid, notificationType: type, outcome: .queued, verificationId: job?.id)
        case .recorded where effect == .consumption && app.consumptionPolicy == .send:
            // Apple asks about a refund request: answered in the background; the 200 goes back now.
            if let transaction {
                Task { await self.reportConsumption(app: app, environment: environment, transactionId: transaction.transactionId, notificationUUID: uuid) }
            }
            return NotificationReceipt(notificationUUID: uuid, notificationType: type, outcome: .recorded)
        default:
            return NotificationReceipt(notificationUUID: uuid, notificationType: type, outcome: outcome)
        }
    }

    /// What a fresh notification changes besides its own record, in its transaction: the copy forwarded to
    /// the developer's backend, the subscription's renewal state (newest signedDate wins), and the webhook
    /// events of renewal-state news for the transaction's owner. Returns that owner: the user whose ledger
    /// holds the chain, else the app user whose UUID is the transaction's appAccountToken, else nil.
    private func recordNotificationEffects(signed: String, app: ServerApp, environment env: String, type: String, subtype: String?,
                                           transaction: JWSTransaction?, renewal: JSONValue?, signedDate: Int64,
                                           _ db: any SQLConnection, now: Date) throws -> String? {
        try store.forwardNotification(signed: signed, appId: app.id, db, now: now)
        if let renewal, let original = renewal["originalTransactionId"]?.text ?? transaction?.originalTransactionId {
            try SubscriptionRepository(db: db, appId: app.id, environment: env).record(SubscriptionState(
                originalTransactionId: original, productId: renewal["productId"]?.text ?? transaction?.productId ?? "",
                autoRenewProductId: renewal["autoRenewProductId"]?.text, autoRenewStatus: renewal["autoRenewStatus"]?.int64.map { $0 != 0 },
                expiresDate: transaction?.expiresDate, expirationIntent: renewal["expirationIntent"]?.int64.map(String.init),
                isInBillingRetry: renewal["isInBillingRetryPeriod"]?.bool ?? false, gracePeriodExpiresDate: renewal["gracePeriodExpiresDate"]?.int64,
                revokedAt: transaction?.revocationDate, priceIncreaseStatus: renewal["priceIncreaseStatus"]?.int64, signedDate: signedDate,
                periodPurchaseDate: transaction?.purchaseDate))
        }
        guard let transaction else { return nil }
        let owner = try LedgerReader(db: db).firstOwner(appId: app.id, environment: env, originalTransactionId: transaction.originalTransactionId)
        if let owner {
            // Renewal-state changes are news to the developer's backend here; ledger changes come with the settlement.
            let drafts = WebhookEvents.of(notification: NotificationType(type), subtype: subtype.map(NotificationSubtype.init), owner: owner,
                                          environment: env, transaction: transaction)
            if !drafts.isEmpty {
                try store.recordEvents(drafts, appId: app.id, endpoints: try store.webhooks(db).endpoints(appId: app.id).map(\.endpoint),
                                        db, now: now)
            }
            return owner
        }
        // Nobody owns it yet: its appAccountToken names the user only when an app user with exactly that
        // UUID exists (apps whose user ids are UUIDs). A token is never made into a new user: the purchase
        // waits, unmatched, for its user's own upload.
        guard let token = transaction.appAccountToken.flatMap(UUIDText.parse) else { return nil }
        return try UserRepository(db: db, appId: app.id).user(uuid: token)
    }

    /// Records a notification in its own transaction; false when it was already recorded.
    private func recordNotification(_ uuid: String, appId: String, type: String, subtype: String?, environment: String, signedDate: Int64,
                                    signed: String, transaction: JWSTransaction?, state: String, reason: String?) async throws -> Bool {
        let now = clock.now()
        return try await store.database.transaction { db in
            try NotificationRepository(db: db).insert(uuid, appId: appId, type: type, subtype: subtype, environment: environment, signedDate: signedDate,
                                                      signed: signed, transaction: transaction, state: state, reason: reason, now: now)
        }
    }
}

extension PurchaseServer {
    /// The envelope of a notification body, its payload and the fields every notification has, once its
    /// chain and signature verify; a 400 naming what is wrong otherwise.
    static func verifiedEnvelope(_ body: Data, inspector: SignedTransactionInspector) throws(ServerError)
        -> (signed: String, envelope: VerifiedEnvelope, uuid: String, type: String, signedDate: Int64) {
        guard let json = try? JSONValue.parse(body), let signed = json["signedPayload"]?.text else {
            throw ServerError(.invalidNotification, "The body must be {\"signedPayload\": JWS}.")
        }
        let envelope: Envelope
        do {
            envelope = try Envelope(compact: signed)
        } catch {
            throw ServerError(.invalidNotification, "signedPayload is not a JWS.")
        }
        let payload = envelope.payload
        guard let uuid = payload["notificationUUID"]?.text, let type = payload["notificationType"]?.text,
              let signedDate = payload["signedDate"]?.int64 else {
            throw ServerError(.invalidNotification, "The notification lacks notificationUUID, notificationType or signedDate.")
        }
        do {
            let verified = try inspector.verify(envelope, at: ReceiptDate.date(milliseconds: signedDate), subject: "the notification's")
            return (signed, verified, uuid, type, signedDate)
        } catch {
            throw ServerError(.invalidSignature, "The notification's signature does not verify: \(error.reason)")
        }
    }

    /// Runs a check on the notification queue; a full backlog is a 503 (Apple retries).
    func checkedOffPool<T: Sendable, E: Error>(_ body: @escaping @Sendable () throws(E) -> T) async throws -> T {
        do {
            return try await notificationChecks.run(body)
        } catch is BoundedWork.Busy {
            throw ServerError(.busy, "Too many notifications are being checked; Apple retries.")
        }
    }
}
