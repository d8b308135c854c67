import AppStoreCrypto
import AppStoreModels
import Clocks
import Foundation
import HTTPClient
import Storage

/// Where the App Store Server API lives.
public struct ServerAPIEndpoints: Sendable, Equatable {
    public var production: URL
    public var sandbox: URL

    public init(production: URL, sandbox: URL) {
        self.production = production
        self.sandbox = sandbox
    }

    /// `https://api.storekit.itunes.apple.com` and `https://api.storekit-sandbox.itunes.apple.com`.
    public static let apple = ServerAPIEndpoints(production: URL(string: "https://api.storekit.itunes.apple.com")!,
                                                 sandbox: URL(string: "https://api.storekit-sandbox.itunes.apple.com")!)

    /// A Storekeeper App Store emulator at `base`.
    public static func emulator(_ base: URL) -> ServerAPIEndpoints {
        ServerAPIEndpoints(production: base.appendingPathComponent("production"), sandbox: base.appendingPathComponent("sandbox"))
    }

    public func url(for environment: AppStoreEnvironment) -> URL { environment == .production ? production : sandbox }
}

extension PurchaseServer {
    /// One App Store Server API call for `app`, with a fresh ES256 bearer token (5 minutes) from its key.
    func serverAPICall(app: ServerApp, credentials: ServerAPICredentials, key: PrivateKey, client: HTTPClient, method: String, path: String,
                       environment: AppStoreEnvironment, query: String = "", body: [UInt8] = []) async throws -> HTTPClientResponse {
        // The token's iat and exp are judged by Apple's own clock, so they come from the system clock, not
        // the server's (which may follow an emulator whose time was moved by days).
        let now = Int64(SystemClock().now().timeIntervalSince1970)
        var claims = JSONBuffer(capacity: 200)
        claims.object { json in
            json.field("iss", credentials.issuerId)
            json.field("iat", now)
            json.field("exp", now + 300)
            json.field("aud", "appstoreconnect-v1")
            json.field("bid", app.bundleIds.first ?? app.id)
        }
        let token = try JWS.sign(payload: claims.bytes, key: key, keyId: credentials.keyId)
        var target = serverAPI.url(for: environment).appendingPathComponent(path).absoluteString
        if !query.isEmpty { target += "?" + query }
        guard let url = URL(string: target) else { throw ServerError(.invalidUrl, "bad Server API URL \(target)") }
        // Labelled by the path with its ids replaced, so the metric has one series per endpoint.
        // Any segment with a digit but a version (v1, v2) is an id: transaction ids, order ids.
        let endpoint = path.split(separator: "/").map { segment in
            segment.contains(where: \.isNumber) && !(segment.first == "v" && segment.dropFirst().allSatisfy(\.isNumber)) || segment.count > 24
                ? ":id" : String(segment)
        }.joined(separator: "/")
        let started = ContinuousClock.now
        do {
            let response = try await client.send(method, url, headers: [("Authorization", "Bearer " + token), ("Content-Type", "application/json"),
                                                                        ("Accept", "application/json")], body: body, timeout: 30)
            recorder?.record(method: method, url: url, requestBody: Data(body), status: response.status, contentType: response.header("Content-Type"),
                             body: Data(response.body), at: Date())
            metrics.appleCall(endpoint: "\(method) \(endpoint)", environment: environment.rawValue, outcome: "http_\(response.status)",
                              seconds: (ContinuousClock.now - started).seconds)
            return response
        } catch {
            metrics.appleCall(endpoint: "\(method) \(endpoint)", environment: environment.rawValue,
                              outcome: error.code == .timedOut ? "timed_out" : "connection", seconds: (ContinuousClock.now - started).seconds)
            throw error
        }
    }

    /// Answers a CONSUMPTION_REQUEST with Send Consumption Information (v2): the customer consented through
    /// the app's terms (the app opted in with `consumptionPolicy: send`), delivery as the ledger shows it,
    /// and for credited consumables how much of the credit was spent. Records the outcome on the notification.
    func reportConsumption(app: ServerApp, environment: AppStoreEnvironment, transactionId: String, notificationUUID: String) async {
        let outcome = await sendConsumption(app: app, environment: environment, transactionId: transactionId)
        _ = try? await store.database.transaction { db in
            try NotificationRepository(db: db).mark(notificationUUID, state: outcome)
        }
    }

    private func sendConsumption(app: ServerApp, environment: AppStoreEnvironment, transactionId: String) async -> String {
        guard let credentials = app.serverAPIKey, let client = serverAPIClient, let key = try? PrivateKey(pem: credentials.privateKey) else {
            return "consumption_not_sent: no Server API key"
        }
        let facts = try? await store.database.transaction { db in
            try LedgerReader(db: db).consumption(appId: app.id, environment: environment.rawValue, transactionId: transactionId)
        }
        let ledger = facts.map { $0.report }
        var body = JSONBuffer(capacity: 160)
        body.object { json in
            json.field("customerConsented", true)
            json.field("sampleContentProvided", false)
            json.field("deliveryStatus", ledger?.delivered == true ? "DELIVERED" : "UNDELIVERED_OTHER")
            if let percentage = ledger?.percentage { json.field("consumptionPercentage", percentage) }
        }
        do {
            let response = try await serverAPICall(app: app, credentials: credentials, key: key, client: client, method: "PUT",
                                                   path: "inApps/v2/transactions/consumption/\(transactionId)", environment: environment, body: body.bytes)
            return (200...299).contains(response.status) ? "consumption_sent" : "consumption_failed: HTTP \(response.status)"
        } catch {
            return "consumption_failed: \(error)"
        }
    }
}

extension ConsumptionFacts {
    /// What Send Consumption Information says: delivered unless never recorded or refunded (a credited
    /// consumable stays delivered), and for a credit the share spent in 1/1000 of a percent, from the
    /// owner's balance now (a balance above the credit counts as nothing spent).
    var report: (delivered: Bool, percentage: Int64?) {
        guard recorded else { return (false, nil) }
        guard let credited = creditedAmount, credited > 0 else { return (!cancelled, nil) }
        let spent = credited - min(max(balance ?? 0, 0), credited)
        // In Double: credits written before amounts were bounded may be near Int64.max.
        return (true, Int64((Double(spent) / Double(credited) * 100_000).rounded(.down)))
    }
}
