import AppStoreCrypto
import AppStoreModels
import Foundation
import HTTPClient
import Storage

/// What one reconciliation pass found.
public struct ReconcileReport: Codable, Sendable, Equatable {
    /// Apps with a Server API key that were checked.
    public var apps: Int = 0
    /// Notifications from Notification History (onlyFailures) that had never arrived and were applied now.
    public var missedNotifications: Int = 0
    /// Transactions from Transaction History queued for their owners (new renewals, refunds).
    public var transactionsQueued: Int = 0
    /// Calls that failed (they are retried on the next pass; watermarks do not move).
    public var errors: [String] = []
}

/// Catches up with Apple through the App Store Server API, so a notification that never arrived still
/// changes the ledger: Notification History with `onlyFailures` since the last pass (each one applied as
/// if it had arrived, de-duplicated on notificationUUID), and Transaction History with the stored
/// `revision` for every subscription the server knows, settling new transactions for their owners.
extension PurchaseServer {
    /// Runs `reconcile()` every `interval` until cancelled.
    public func runReconciler(every interval: Duration) -> Task<Void, Never> {
        Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: interval)
                if Task.isCancelled { break }
                _ = await reconcile()
            }
        }
    }

    /// One pass over every app that has a Server API key.
    public func reconcile() async -> ReconcileReport {
        var report = ReconcileReport()
        guard let client = serverAPIClient, let apps = try? await store.apps() else { return report }
        for app in apps {
            guard let credentials = app.serverAPIKey, let key = try? PrivateKey(pem: credentials.privateKey) else { continue }
            report.apps += 1
            for environment in [AppStoreEnvironment.production, .sandbox] {
                await reconcileNotifications(app, environment, credentials, key, client, &report)
                await reconcileTransactions(app, environment, credentials, key, client, &report)
            }
        }
        return report
    }

    private func reconcileNotifications(_ app: ServerApp, _ environment: AppStoreEnvironment, _ credentials: ServerAPICredentials, _ key: PrivateKey,
                                        _ client: HTTPClient, _ report: inout ReconcileReport) async {
        let now = clock.now().milliseconds
        let mark = (try? await watermark(app.id, environment, "notifications")) ?? nil
        // From the last pass (an hour of overlap; duplicates are free), at most Apple's 180 days back.
        let start = max(now - 179 * 86_400_000, (mark.flatMap { Int64($0) } ?? now - 7 * 86_400_000) - 3_600_000)
        var pagination: String?
        repeat {
            var body = JSONBuffer(capacity: 128)
            body.object { json in
                json.field("startDate", start)
                json.field("endDate", now)
                json.field("onlyFailures", true)
            }
            let query = pagination.map { "paginationToken=" + ($0.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? $0) } ?? ""
            guard let page = await call(app, credentials, key, client, "POST", "inApps/v1/notifications/history", environment, query: query,
                                        body: body.bytes, &report) else { return }
            for item in page["notificationHistory"]?.array ?? [] {
                guard let signed = item["signedPayload"]?.text else { continue }
                var envelope = JSONBuffer(capacity: signed.utf8.count + 32)
                envelope.object { $0.field("signedPayload", signed) }
                do {
                    if try await receiveNotification(Data(envelope.bytes)).outcome != .duplicate { report.missedNotifications += 1 }
                } catch {
                    report.errors.append("notification from history refused: \(error)")
                }
            }
            pagination = page["hasMore"]?.bool == true ? page["paginationToken"]?.text : nil
        } while pagination != nil
        try? await setWatermark(app.id, environment, "notifications", String(now))
    }

    private func reconcileTransactions(_ app: ServerApp, _ environment: AppStoreEnvironment, _ credentials: ServerAPICredentials, _ key: PrivateKey,
                                       _ client: HTTPClient, _ report: inout ReconcileReport) async {
        let env = environment.rawValue
        guard let originals = try? await store.database.transaction({ db in
            try SubscriptionRepository(db: db, appId: app.id, environment: env).originalTransactionIds()
        }) else { return }
        for original in originals {
            var revision = (try? await watermark(app.id, environment, original)) ?? nil
            var more = true
            while more {
                let query = revision.map { "revision=" + ($0.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? $0) } ?? ""
                guard let page = await call(app, credentials, key, client, "GET", "inApps/v2/history/\(original)", environment, query: query,
                                            body: [], &report) else { break }
                for signed in (page["signedTransactions"]?.array ?? []).compactMap(\.text) {
                    guard let (transaction, _) = try? engine.transactionInspector.inspect(signed, bundleIds: app.bundleIds),
                          let owner = try? await owner(app.id, env, transaction.originalTransactionId) else { continue }
                    if (try? await submit(appId: app.id, appUserId: owner, receiptData: signed, kind: .signedTransaction)) != nil {
                        report.transactionsQueued += 1
                    }
                }
                revision = page["revision"]?.text ?? revision
                more = page["hasMore"]?.bool == true
            }
            if let revision { try? await setWatermark(app.id, environment, original, revision) }
        }
    }

    /// A Server API call answered with JSON, or nil (recorded in the report) on any failure.
    private func call(_ app: ServerApp, _ credentials: ServerAPICredentials, _ key: PrivateKey, _ client: HTTPClient, _ method: String, _ path: String,
                      _ environment: AppStoreEnvironment, query: String, body: [UInt8], _ report: inout ReconcileReport) async -> JSONValue? {
        do {
            let response = try await serverAPICall(app: app, credentials: credentials, key: key, client: client, method: method, path: path,
                                                   environment: environment, query: query, body: body)
            guard response.status == 200 else {
                // 404 for an environment the app has nothing in is normal; anything else is worth reporting.
                if response.status != 404 { report.errors.append("\(method) \(path) (\(environment.rawValue)): HTTP \(response.status)") }
                return nil
            }
            return try JSONValue.parse(response.body)
        } catch {
            report.errors.append("\(method) \(path) (\(environment.rawValue)): \(error)")
            return nil
        }
    }

    private func owner(_ appId: String, _ env: String, _ original: String) async throws -> String? {
        try await store.database.transaction { db in
            try LedgerReader(db: db).firstOwner(appId: appId, environment: env, originalTransactionId: original)
        }
    }

    private func watermark(_ appId: String, _ environment: AppStoreEnvironment, _ subject: String) async throws -> String? {
        try await store.database.transaction { db in
            try ReconcileRepository(db: db, appId: appId, environment: environment.rawValue).watermark(subject)
        }
    }

    private func setWatermark(_ appId: String, _ environment: AppStoreEnvironment, _ subject: String, _ value: String) async throws {
        let now = clock.now()
        try await store.database.transaction { db in
            try ReconcileRepository(db: db, appId: appId, environment: environment.rawValue).setWatermark(subject, value, now: now)
        }
    }
}
