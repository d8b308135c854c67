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
        /// Recorded only (TEST, or nothing to settle).
        case recorded
    }

    public var notificationUUID: String
    public var notificationType: String
    public var outcome: Outcome
    public var verificationId: String?
}

extension PurchaseServer {
    /// Receives `{"signedPayload"}`: verifies the envelope and every nested JWS against the trusted
    /// roots, refuses anything else (ServerError 400), de-duplicates on notificationUUID, records the
    /// notification durably, updates the subscription's renewal state (newest signedDate wins, so
    /// notifications arriving out of order settle the same way), and queues its transaction for
    /// the user who owns it: renewals extend, refunds and revocations revoke and claw back.
    public func receiveNotification(_ body: Data) async throws -> NotificationReceipt {
        // Everything done to an unauthenticated body before its signature is known (JSON, Base64, the
        // envelope's chain and signature) runs on the notification queue, off the cooperative pool.
        let inspector = engine.transactionInspector
        let (signed, payload, uuid, type, signedDate) = try await checkedOffPool { () throws(ServerError) in
            try Self.verifiedEnvelope(body, inspector: inspector)
        }
        // bundleId and environment come from data, else summary, else appData (reference §3.3).
        let section = payload["data"] ?? payload["summary"] ?? payload["appData"] ?? .null
        guard let bundleId = section["bundleId"]?.text else { throw ServerError(400, "invalid_notification", "The notification names no bundleId.") }
        // Exactly Apple's two spellings: anything else in a signed payload is not Apple's.
        guard let environment = section["environment"]?.text.flatMap({ AppStoreEnvironment(rawValue: $0) }) else {
            throw ServerError(400, "invalid_environment", "The notification's environment must be Sandbox or Production.")
        }
        guard let app = try await store.cachedApp(forBundle: bundleId) else {
            throw ServerError(400, "unknown_bundle", "No app here accepts bundle id \(bundleId).")
        }
        if environment == .production, let expected = app.appAppleId, section["appAppleId"]?.int64 != expected {
            throw ServerError(400, "invalid_app_apple_id", "The notification is for app Apple id \(section["appAppleId"]?.int64.map(String.init) ?? "none"), not \(expected).")
        }

        var decodedTransaction: JWSTransaction?
        var transactionJWS: String?
        if let nested = section["signedTransactionInfo"]?.text {
            do {
                let bundleIds = app.bundleIds
                let (decoded, transactionEnvironment) = try await checkedOffPool { () throws(ReceiptRejection) in
                    try inspector.inspect(nested, bundleIds: bundleIds)
                }
                guard transactionEnvironment == environment else {
                    throw ReceiptRejection(code: "environment_mismatch", reason: "the transaction's environment differs from the notification's")
                }
                decodedTransaction = decoded
                transactionJWS = nested
            } catch let error as ReceiptRejection {
                throw ServerError(400, "invalid_transaction", "signedTransactionInfo was refused: \(error.reason)")
            }
        }
        let transaction = decodedTransaction
        var renewalInfo: JSONValue?
        if let nested = section["signedRenewalInfo"]?.text {
            do {
                let jws = try JWS(compact: nested)
                let info = try jws.payloadJSON()
                let date = ReceiptDate.date(milliseconds: info["signedDate"]?.int64 ?? signedDate)
                try await checkedOffPool { () throws(ReceiptRejection) in try inspector.verify(jws, at: date, subject: "the renewal info's") }
                renewalInfo = info
            } catch let error as ServerError {
                throw error
            } catch {
                throw ServerError(400, "invalid_renewal_info", "signedRenewalInfo was refused: \(error)")
            }
        }

        let renewal = renewalInfo
        let now = clock.now().milliseconds
        let env = environment.rawValue
        // Record (or find it already recorded), update renewal state, and find who owns the transaction, in one transaction.
        let (fresh, owner) = try await store.database.transaction { db -> (Bool, String?) in
            let inserted = try db.query("""
                INSERT INTO apple_notifications (notification_uuid, app_id, notification_type, subtype, environment, signed_date, received_at,
                transaction_id, original_transaction_id, state, signed_payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'received', ?)
                ON CONFLICT DO NOTHING RETURNING notification_uuid
                """, [uuid, app.id, type, payload["subtype"]?.text, env, signedDate, now, transaction?.transactionId,
                      transaction?.originalTransactionId, signed])
            guard !inserted.isEmpty else { return (false, nil) }
            if let renewal, let original = renewal["originalTransactionId"]?.text ?? transaction?.originalTransactionId {
                try SubscriptionRepository(db: db, appId: app.id, environment: env).record(SubscriptionState(
                    originalTransactionId: original, productId: renewal["productId"]?.text ?? transaction?.productId ?? "",
                    autoRenewProductId: renewal["autoRenewProductId"]?.text, autoRenewStatus: renewal["autoRenewStatus"]?.int64.map { $0 != 0 },
                    expiresDate: transaction?.expiresDate, expirationIntent: renewal["expirationIntent"]?.int64.map(String.init),
                    isInBillingRetry: renewal["isInBillingRetryPeriod"]?.bool ?? false, gracePeriodExpiresDate: renewal["gracePeriodExpiresDate"]?.int64,
                    revokedAt: transaction?.revocationDate, signedDate: signedDate))
            }
            guard let transaction else { return (true, nil) }
            let owner = try db.query("""
                SELECT app_user_id FROM ownership WHERE app_id = ? AND environment = ? AND original_transaction_id = ? ORDER BY granted_at LIMIT 1
                """, [app.id, env, transaction.originalTransactionId]).first?.string("app_user_id")
            return (true, owner ?? transaction.appAccountToken)
        }
        guard fresh else { return NotificationReceipt(notificationUUID: uuid, notificationType: type, outcome: .duplicate) }
        guard let transactionJWS, let transaction else {
            try await markNotification(uuid, state: "recorded", verificationId: nil)
            return NotificationReceipt(notificationUUID: uuid, notificationType: type, outcome: .recorded)
        }
        if type == "CONSUMPTION_REQUEST" {
            // Apple asks about a refund request: answer in the background when the app opted in; the 200 goes back now.
            guard app.consumptionPolicy == .send else {
                try await markNotification(uuid, state: "consumption_ignored", verificationId: nil)
                return NotificationReceipt(notificationUUID: uuid, notificationType: type, outcome: .recorded)
            }
            try await markNotification(uuid, state: "consumption_requested", verificationId: nil)
            Task { await self.reportConsumption(app: app, environment: environment, transactionId: transaction.transactionId, notificationUUID: uuid) }
            return NotificationReceipt(notificationUUID: uuid, notificationType: type, outcome: .recorded)
        }
        guard let owner else {
            try await markNotification(uuid, state: "unmatched", verificationId: nil)
            return NotificationReceipt(notificationUUID: uuid, notificationType: type, outcome: .unmatched)
        }
        let job = try await submit(appId: app.id, appUserId: owner, receiptData: transactionJWS, kind: .signedTransaction)
        try await markNotification(uuid, state: "queued", verificationId: job.id)
        return NotificationReceipt(notificationUUID: uuid, notificationType: type, outcome: .queued, verificationId: job.id)
    }

    private func markNotification(_ uuid: String, state: String, verificationId: String?) async throws {
        _ = try await store.database.transaction { db in
            try db.query("UPDATE apple_notifications SET state = ?, verification_id = ? WHERE notification_uuid = ?", [state, verificationId, uuid])
        }
    }
}

extension PurchaseServer {
    /// The envelope of a notification body, its payload and the fields every notification has, once its
    /// chain and signature verify; a 400 naming what is wrong otherwise.
    static func verifiedEnvelope(_ body: Data, inspector: SignedTransactionInspector) throws(ServerError)
        -> (signed: String, payload: JSONValue, uuid: String, type: String, signedDate: Int64) {
        guard let json = try? JSONValue.parse(body), let signed = json["signedPayload"]?.text else {
            throw ServerError(400, "invalid_notification", "The body must be {\"signedPayload\": JWS}.")
        }
        let envelope: JWS
        let payload: JSONValue
        do {
            envelope = try JWS(compact: signed)
            payload = try envelope.payloadJSON()
        } catch {
            throw ServerError(400, "invalid_notification", "signedPayload is not a JWS.")
        }
        guard let uuid = payload["notificationUUID"]?.text, let type = payload["notificationType"]?.text,
              let signedDate = payload["signedDate"]?.int64 else {
            throw ServerError(400, "invalid_notification", "The notification lacks notificationUUID, notificationType or signedDate.")
        }
        do {
            try inspector.verify(envelope, at: ReceiptDate.date(milliseconds: signedDate), subject: "the notification's")
        } catch {
            throw ServerError(400, "invalid_signature", "The notification's signature does not verify: \(error.reason)")
        }
        return (signed, payload, uuid, type, signedDate)
    }

    /// Runs a check on the notification queue; a full backlog is a 503 (Apple retries).
    func checkedOffPool<T: Sendable, E: Error>(_ body: @escaping @Sendable () throws(E) -> T) async throws -> T {
        do {
            return try await notificationChecks.run(body)
        } catch is BoundedWork.Busy {
            throw ServerError(503, "busy", "Too many notifications are being checked; Apple retries.")
        }
    }
}
