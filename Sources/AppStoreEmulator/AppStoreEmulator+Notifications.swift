import Clocks
import AppStoreCrypto
import AppStoreModels
import Foundation
import HTTPClient

/// Where an app wants App Store Server Notifications V2, per environment.
public struct NotificationURLs: Codable, Sendable, Equatable {
    public var production: String?
    public var sandbox: String?

    public init(production: String? = nil, sandbox: String? = nil) {
        self.production = production
        self.sandbox = sandbox
    }

    func url(for environment: AppStoreEnvironment) -> String? { environment == .production ? production : sandbox }
}

/// Something that happened which Apple reports with a notification.
struct NotificationEvent: Sendable {
    var type: String
    var subtype: String?
    /// The transaction it is about (nil for TEST).
    var transactionId: String?
    var bundleId: String
    var environment: AppStoreEnvironment
    /// For TEST notifications: the id to use (the token's first half).
    var uuid: String?
    /// For CONSUMPTION_REQUEST: why the customer asked for a refund.
    var consumptionRequestReason: String?
    /// For RENEWAL_EXTENSION / SUMMARY: the outcome, sent in `summary` instead of `data`.
    var summary: NotificationSummary?
}

/// The `summary` of a mass renewal-date extension's notification.
struct NotificationSummary: Sendable {
    var productId: String
    var requestIdentifier: String
    var storefrontCountryCodes: [String]
    var succeededCount: Int
    var failedCount: Int
}

/// One notification: its signed payload and every attempt to deliver it (Get Notification History).
public struct NotificationRecord: Codable, Sendable, Equatable {
    public struct Attempt: Codable, Sendable, Equatable {
        public var attemptDate: Date
        /// `SUCCESS`, `TIMED_OUT`, `UNSUCCESSFUL_HTTP_RESPONSE_CODE`, `NO_RESPONSE`, `SOCKET_ISSUE`, `TLS_ISSUE`, …
        public var sendAttemptResult: String
    }

    public var notificationUUID: String
    public var bundleId: String
    public var environment: AppStoreEnvironment
    public var notificationType: String
    public var subtype: String?
    public var transactionId: String?
    public var originalTransactionId: String?
    public var signedPayload: String
    public var createdAt: Date
    public var attempts: [Attempt]
    /// When the next attempt is due (emulator clock); nil when delivered or given up.
    public var nextAttemptAt: Date?
    public var delivered: Bool
}

extension Changes {
    mutating func notify(_ type: String, _ subtype: String? = nil, _ record: TransactionRecord) {
        notifications.append(NotificationEvent(type: type, subtype: subtype, transactionId: record.id, bundleId: record.bundleId,
                                               environment: record.environment))
    }
}

extension AppStoreEmulator {
    /// Production retries after a failed attempt: 1, 12, 24, 48 and 72 hours (sandbox sends once).
    static let retryDelays: [TimeInterval] = [3600, 12 * 3600, 24 * 3600, 48 * 3600, 72 * 3600]

    /// Sets (or clears, with nil) where an app's notifications go.
    public func setNotificationURLs(bundleId: String, _ urls: NotificationURLs) async throws {
        try await mutate { state, changes, _ in
            guard state.apps[bundleId] != nil else { throw StoreError.notFound("App \(bundleId)") }
            state.notificationURLs[bundleId] = urls
            changes.settings = true
        }
    }

    public func notificationURLs(bundleId: String) async throws -> NotificationURLs {
        try await read { state, _ in state.notificationURLs[bundleId] ?? NotificationURLs() }
    }

    /// Request a Test Notification: returns the test notification token (`uuid_milliseconds`).
    public func requestTestNotification(bundleId: String, environment: AppStoreEnvironment) async throws -> String {
        let uuid = ids.nextString()
        return try await mutate { state, changes, now in
            changes.notifications.append(NotificationEvent(type: "TEST", subtype: nil, transactionId: nil, bundleId: bundleId,
                                                           environment: environment, uuid: uuid))
            return "\(uuid)_\(ReceiptDate.milliseconds(now))"
        }
    }

    /// A notification by id.
    public func notification(_ uuid: String) async throws -> NotificationRecord? {
        try await read { state, _ in state.notifications[uuid] }
    }

    /// The app's notifications in `environment` created in [from, to), oldest first.
    public func notificationHistory(bundleId: String, environment: AppStoreEnvironment, from: Date, to: Date) async throws -> [NotificationRecord] {
        try await read { state, _ in
            state.notifications.values.filter { $0.bundleId == bundleId && $0.environment == environment && $0.createdAt >= from && $0.createdAt < to }
                .sorted { ($0.createdAt, $0.notificationUUID) < ($1.createdAt, $1.notificationUUID) }
        }
    }

    /// Turns the operation's events into signed notifications in the state (under the lock, so the
    /// payload shows the state the event produced). Apps without a URL for the environment get none.
    func recordNotifications(_ state: inout EmulatorState, _ changes: inout Changes, now: Date) {
        // Signed dates carry milliseconds, as Apple's do: receivers order notifications by them, and
        // several may come out of one second (the state's `now` is whole seconds, for receipts).
        var signedAt = max(clock.now(), now)
        for event in changes.notifications {
            signedAt = signedAt.addingTimeInterval(0.001)  // strictly increasing within one operation, too
            guard state.notificationURLs[event.bundleId]?.url(for: event.environment) != nil || event.type == "TEST" else { continue }
            let uuid = event.uuid ?? ids.nextString()
            let record = event.transactionId.flatMap { state.transactions[$0] }
            let chain = record.flatMap { state.chains[$0.originalId] }
            var json = JSONBuffer(capacity: 4096)
            do {
                let transactionJWS = try record.map { try self.signedTransaction(for: $0, signedAt: signedAt) }
                var renewalJWS: String?
                if let chain, let latest = state.transactions[chain.latestTransactionId] {
                    renewalJWS = try signedRenewalInfo(chain, latest: latest, signedAt: signedAt)
                }
                let app = state.apps[event.bundleId]
                var status: Int64?
                if let chain, let latest = state.transactions[chain.latestTransactionId] {
                    status = Int64(AppStoreEmulator.subscriptionStatus(chain, latest: latest, now: now))
                }
                json.object { json in
                    json.field("notificationType", event.type)
                    json.field("subtype", event.subtype)
                    json.field("notificationUUID", uuid)
                    if let summary = event.summary {
                        json.key("summary")
                        json.object { json in
                            json.field("environment", event.environment == .production ? "Production" : "Sandbox")
                            if event.environment == .production, let app { json.field("appAppleId", app.appAppleId) }
                            json.field("bundleId", event.bundleId)
                            json.field("productId", summary.productId)
                            json.field("requestIdentifier", summary.requestIdentifier)
                            json.key("storefrontCountryCodes")
                            json.array(summary.storefrontCountryCodes) { json, code in json.string(code) }
                            json.field("succeededCount", Int64(summary.succeededCount))
                            json.field("failedCount", Int64(summary.failedCount))
                        }
                    } else {
                    json.key("data")
                    json.object { json in
                        if event.environment == .production, let app { json.field("appAppleId", app.appAppleId) }
                        json.field("bundleId", event.bundleId)
                        json.field("bundleVersion", app?.version)
                        json.field("environment", event.environment == .production ? "Production" : "Sandbox")
                        json.field("signedTransactionInfo", transactionJWS)
                        json.field("signedRenewalInfo", renewalJWS)
                        if let status { json.field("status", status) }
                        json.field("consumptionRequestReason", event.consumptionRequestReason)
                    }
                    }
                    json.field("version", "2.0")
                    json.field("signedDate", ReceiptDate.milliseconds(signedAt))
                }
                let payload = try JWS.sign(payload: json.bytes, key: jwsAuthority.leafKey, chain: jwsAuthority.chain)
                state.notifications[uuid] = NotificationRecord(
                    notificationUUID: uuid, bundleId: event.bundleId, environment: event.environment, notificationType: event.type,
                    subtype: event.subtype, transactionId: record?.id, originalTransactionId: record?.originalId, signedPayload: payload,
                    createdAt: now, attempts: [], nextAttemptAt: now, delivered: false)
                changes.notificationIds.insert(uuid)
            } catch {
                continue  // signing with our own key does not fail; a notification is never worth failing the purchase
            }
        }
        changes.notifications = []
    }

    /// Delivers due notifications until cancelled: POSTs `{"signedPayload"}` to the app's URL; 200–206
    /// is success; sandbox tries once, production retries on Apple's schedule by the emulator clock.
    public func runNotificationDelivery(pollInterval: Duration = .milliseconds(200)) async {
        guard let client = try? HTTPClient(configuration: .init(maxConnectionsPerHost: 64, userAgent: "App Store Server Notifications (Storekeeper)")) else { return }
        defer { client.shutdown() }
        while !Task.isCancelled {
            let due = (try? await read { state, now in
                state.notifications.values.filter { !$0.delivered && ($0.nextAttemptAt.map { $0 <= now } ?? false) }
                    .sorted { $0.createdAt < $1.createdAt }
                    .map { ($0, state.notificationURLs[$0.bundleId]?.url(for: $0.environment)) }
            }) ?? []
            await withTaskGroup(of: Void.self) { group in
                for (notification, url) in due.prefix(64) {
                    group.addTask { await self.deliver(notification, to: url, client: client) }
                }
            }
            if due.isEmpty { try? await Task.sleep(for: pollInterval) }
        }
    }

    private func deliver(_ notification: NotificationRecord, to url: String?, client: HTTPClient) async {
        var result = "NO_RESPONSE"
        if let url, let target = URL(string: url) {
            var body = JSONBuffer(capacity: notification.signedPayload.utf8.count + 32)
            body.object { $0.field("signedPayload", notification.signedPayload) }
            do {
                let response = try await client.send("POST", target, headers: [("Content-Type", "application/json")], body: body.bytes, timeout: 10)
                result = (200...206).contains(response.status) ? "SUCCESS" : "UNSUCCESSFUL_HTTP_RESPONSE_CODE"
            } catch {
                switch error.code {
                case .timedOut: result = "TIMED_OUT"
                case .tlsFailed: result = "TLS_ISSUE"
                case .connectFailed, .resolveFailed: result = "SOCKET_ISSUE"
                case .malformedResponse: result = "INVALID_RESPONSE"
                case .connectionClosed: result = "PREMATURE_CLOSE"
                default: result = "OTHER"
                }
            }
        }
        let outcome = result
        _ = try? await mutate { state, changes, now in
            guard var record = state.notifications[notification.notificationUUID] else { return }
            record.attempts.append(.init(attemptDate: now, sendAttemptResult: outcome))
            record.delivered = outcome == "SUCCESS"
            let failures = record.attempts.count - 1
            if record.delivered || record.environment == .sandbox || failures >= Self.retryDelays.count {
                record.nextAttemptAt = nil
            } else {
                record.nextAttemptAt = now.addingTimeInterval(Self.retryDelays[failures])
            }
            state.notifications[record.notificationUUID] = record
            changes.notificationIds.insert(record.notificationUUID)
        }
    }
}
