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
/// A notification decided under the emulator's lock and signed after it (`publish`).
struct NotificationDraft: Sendable {
    var event: NotificationEvent
    var uuid: String
    var signedAt: Date
    var createdAt: Date
    var record: TransactionRecord?
    var chain: SubscriptionChain?
    var latest: TransactionRecord?
    var status: Int64?
    var appAppleId: Int64?
    var bundleVersion: String?
}

struct NotificationEvent: Sendable {
    var type: NotificationType
    var subtype: NotificationSubtype?
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
    public var notificationType: NotificationType
    public var subtype: NotificationSubtype?
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
    mutating func notify(_ type: NotificationType, _ subtype: NotificationSubtype? = nil, _ record: TransactionRecord) {
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
            changes.notifications.append(NotificationEvent(type: .test, subtype: nil, transactionId: nil, bundleId: bundleId,
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

    /// Turns the operation's events into drafts, under the lock: each gets its id and signed date, and a
    /// copy of everything its payload shows (the transaction, the renewal state, the status) as the event
    /// left it. Apps without a URL for the environment get none. Signing happens after the lock (`publish`).
    func draftNotifications(_ state: EmulatorState, _ changes: inout Changes, now: Date) -> [NotificationDraft] {
        // Signed dates carry milliseconds, as Apple's do: receivers order notifications by them, and
        // several may come out of one second (the state's `now` is whole seconds, for receipts). They never go back
        // from one operation to the next either: two operations within a millisecond (a refund request, then its
        // refund) would otherwise sign the later event earlier, and a receiver that keeps the newest would keep the
        // wrong one. A clock set back on purpose (`time set`, more than a second) starts from the clock again.
        let clockNow = max(clock.now(), now)
        var signedAt = lastSignedAt.withLock { last in last > clockNow && last.timeIntervalSince(clockNow) < 1 ? last : clockNow }
        defer { lastSignedAt.withLock { $0 = max($0 > clockNow.addingTimeInterval(1) ? clockNow : $0, signedAt) } }
        var drafts: [NotificationDraft] = []
        for event in changes.notifications {
            signedAt = signedAt.addingTimeInterval(0.001)  // strictly increasing within one operation, too
            guard state.notificationURLs[event.bundleId]?.url(for: event.environment) != nil || event.type == .test else { continue }
            let record = event.transactionId.flatMap { state.transactions[$0] }
            // Xcode's StoreKit Testing sends no server notifications: nor does the emulator for its testers.
            if let record, state.accounts[record.accountEmail.lowercased()]?.xcode == true { continue }
            let chain = record.flatMap { state.chains[$0.originalId] }
            let latest = chain.flatMap { state.transactions[$0.latestTransactionId] }
            let app = state.apps[event.bundleId]
            drafts.append(NotificationDraft(event: event, uuid: event.uuid ?? ids.nextString(), signedAt: signedAt, createdAt: now, record: record,
                                            chain: latest == nil ? nil : chain, latest: latest,
                                            status: chain.flatMap { chain in latest.map { Int64(AppStoreEmulator.subscriptionStatus(chain, latest: $0, now: now)) } },
                                            appAppleId: app?.appAppleId, bundleVersion: app?.version))
        }
        changes.notifications = []
        return drafts
    }

    /// Signs drafts outside the lock (three ECDSA signatures each), then stores and persists them in one
    /// short critical section: the outbox between an operation and the notifications it causes.
    func publish(_ drafts: [NotificationDraft]) async throws {
        let records = drafts.compactMap { try? sign($0) }  // signing with our own key does not fail; never worth failing the operation
        let store = self.store
        let pending = state.withLock { state -> Task<Void, any Error> in
            var changes = Changes()
            for record in records {
                state.notifications[record.notificationUUID] = record
                changes.notificationIds.insert(record.notificationUUID)
            }
            let writes = AppStoreEmulator.writes(for: changes, in: state)
            return persistLock.enqueue { try await store.apply(writes) }
        }
        try await pending.value
    }

    private func sign(_ draft: NotificationDraft) throws -> NotificationRecord {
        let event = draft.event
        let transactionJWS = try draft.record.map { try self.signedTransaction(for: $0, signedAt: draft.signedAt) }
        var renewalJWS: String?
        if let chain = draft.chain, let latest = draft.latest {
            renewalJWS = try signedRenewalInfo(chain, latest: latest, signedAt: draft.signedAt)
        }
        var json = JSONBuffer(capacity: 4096)
        json.object { json in
            json.field("notificationType", event.type.rawValue)
            json.field("subtype", event.subtype?.rawValue)
            json.field("notificationUUID", draft.uuid)
            if let summary = event.summary {
                json.key("summary")
                json.object { json in
                    json.field("environment", event.environment == .production ? "Production" : "Sandbox")
                    if event.environment == .production, let appAppleId = draft.appAppleId { json.field("appAppleId", appAppleId) }
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
                    if event.environment == .production, let appAppleId = draft.appAppleId { json.field("appAppleId", appAppleId) }
                    json.field("bundleId", event.bundleId)
                    json.field("bundleVersion", draft.bundleVersion)
                    json.field("environment", event.environment == .production ? "Production" : "Sandbox")
                    json.field("signedTransactionInfo", transactionJWS)
                    json.field("signedRenewalInfo", renewalJWS)
                    if let status = draft.status { json.field("status", status) }
                    json.field("consumptionRequestReason", event.consumptionRequestReason)
                }
            }
            json.field("version", "2.0")
            json.field("signedDate", ReceiptDate.milliseconds(draft.signedAt))
        }
        let payload = try JWS.sign(payload: json.bytes, key: jwsAuthority.leafKey, chain: jwsAuthority.chain)
        return NotificationRecord(notificationUUID: draft.uuid, bundleId: event.bundleId, environment: event.environment, notificationType: event.type,
                                  subtype: event.subtype, transactionId: draft.record?.id, originalTransactionId: draft.record?.originalId,
                                  signedPayload: payload, createdAt: draft.createdAt, attempts: [], nextAttemptAt: draft.createdAt, delivered: false)
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
