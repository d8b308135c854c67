import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// What the purchase server says about an upload.
public struct ServerVerification: Sendable, Equatable {
    public var verificationId: String
    /// `verified`, `rejected`, or still `pending` / `verifying`.
    public var state: String
    public var reason: String?
}

/// What the purchase server says a user owns.
public struct ServerEntitlements: Codable, Sendable, Equatable {
    public struct Entitlement: Codable, Sendable, Equatable {
        public var id: String
        public var active: Bool
        public var expiresDate: Int64?
        public var productId: String?
    }
    public var entitlements: [Entitlement]
    public var balances: [String: Int64]
}

/// A network failure talking to the purchase server (retry later; nothing is lost).
public struct ServerUnavailable: Error, Sendable, CustomStringConvertible {
    public var message: String
    public var description: String { "purchase server unavailable: \(message)" }
}

/// The app's line to its purchase server: uploads with retries and backoff, reads what the user owns.
public struct PurchaseServerConnection: Sendable {
    public let baseURL: URL
    public let apiKey: String
    public let appUserId: String
    /// Attempts per call before giving up with `ServerUnavailable`, and the first backoff.
    public let attempts: Int
    public let backoff: Duration
    /// This connection's own session (a device has its own; sharing URLSession.shared would queue many
    /// in-process devices behind a handful of connections).
    let session: URLSession

    public init(baseURL: URL, apiKey: String, appUserId: String, attempts: Int = 3, backoff: Duration = .milliseconds(200)) {
        self.baseURL = baseURL
        self.apiKey = apiKey
        self.appUserId = appUserId
        self.attempts = attempts
        self.backoff = backoff
        let configuration = URLSessionConfiguration.ephemeral
        configuration.timeoutIntervalForRequest = 45  // uploads wait up to 30 s for the verdict
        configuration.httpMaximumConnectionsPerHost = 4
        // No cache: Foundation on Linux looks a request up in the cache on another queue, and a task cancelled meanwhile
        // (a timeout, a cancelled caller) then fails twice and traps ("a task that in not in the registry").
        configuration.urlCache = nil
        session = URLSession(configuration: configuration)
    }

    /// Uploads a StoreKit 2 signed transaction and waits (up to 10 s) for the verdict.
    public func upload(signedTransaction: String) async throws -> ServerVerification {
        let object = try await call("POST", "/v1/transactions?wait=10", body: ["appUserId": appUserId, "signedTransaction": signedTransaction])
        return try Self.verification(object)
    }

    /// Uploads the app receipt and waits for the verdict. A purchase names the transaction it delivers
    /// (and its product), so a consumable in a receipt shared with another user of the same Apple ID goes
    /// to the one who bought it; a restore names nothing.
    public func upload(receipt: String, transactionId: String? = nil, productId: String? = nil) async throws -> ServerVerification {
        var body: [String: Any] = ["appUserId": appUserId, "receiptData": receipt]
        if let transactionId { body["transactionId"] = transactionId }
        if let productId { body["productId"] = productId }
        let object = try await call("POST", "/v1/receipts?wait=30", body: body)
        return try Self.verification(object)
    }

    /// A verification's state (waiting up to 10 s for it to settle).
    public func verification(_ id: String) async throws -> ServerVerification {
        try Self.verification(try await call("GET", "/v1/verifications/\(id)?wait=10", body: nil))
    }

    /// Spends from a balance, once per `idempotencyKey` (a retried spend is not spent twice); the server never
    /// lets a balance go below zero. Returns the balance after.
    public func spend(_ amount: Int64, of currency: String, idempotencyKey: String) async throws -> Int64 {
        let user = appUserId.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? appUserId
        let object = try await call("POST", "/v1/users/\(user)/balances/\(currency)/spend",
                                    body: ["amount": amount, "idempotencyKey": idempotencyKey])
        guard let balance = (object["balance"] as? NSNumber)?.int64Value else { throw ServerUnavailable(message: "unexpected answer \(object)") }
        return balance
    }

    public func entitlements() async throws -> ServerEntitlements {
        let user = appUserId.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? appUserId
        let object = try await call("GET", "/v1/users/\(user)", body: nil)
        let data = try JSONSerialization.data(withJSONObject: object)
        do { return try JSONDecoder().decode(ServerEntitlements.self, from: data) } catch {
            throw ServerUnavailable(message: "unreadable user view: \(error)")
        }
    }

    static func verification(_ object: [String: Any]) throws -> ServerVerification {
        guard let id = object["verificationId"] as? String, let state = object["state"] as? String else {
            throw ServerUnavailable(message: "unexpected answer \(object)")
        }
        return ServerVerification(verificationId: id, state: state, reason: object["reason"] as? String)
    }

    /// One call with retries: connection failures and 5xx back off and retry; 4xx is final.
    func call(_ method: String, _ path: String, body: [String: Any]?) async throws -> [String: Any] {
        var delay = backoff
        var lastError = "no attempt"
        for attempt in 1...max(1, attempts) {
            do {
                guard let url = URL(string: baseURL.absoluteString.trimmingCharacters(in: CharacterSet(charactersIn: "/")) + path) else {
                    throw ServerUnavailable(message: "bad URL")
                }
                var request = URLRequest(url: url, cachePolicy: .reloadIgnoringLocalCacheData, timeoutInterval: 45)
                request.httpMethod = method
                request.setValue("Bearer \(apiKey)", forHTTPHeaderField: "Authorization")
                if let body {
                    request.httpBody = try JSONSerialization.data(withJSONObject: body)
                    request.setValue("application/json", forHTTPHeaderField: "Content-Type")
                }
                let (data, response) = try await session.data(for: request)
                let status = (response as? HTTPURLResponse)?.statusCode ?? 0
                let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] ?? [:]
                if (200...299).contains(status) { return object }
                if (400...499).contains(status) {
                    let error = object["error"] as? [String: Any]
                    throw ClientRefusal(status: status, code: error?["code"] as? String ?? "", message: error?["message"] as? String ?? "HTTP \(status)")
                }
                lastError = "HTTP \(status)"
            } catch let refusal as ClientRefusal {
                throw refusal
            } catch {
                lastError = error.localizedDescription
            }
            if attempt < attempts {
                try await Task.sleep(for: delay)
                delay *= 2
            }
        }
        throw ServerUnavailable(message: lastError)
    }
}

/// The purchase server refused the request itself (bad key, bad body): retrying will not help.
public struct ClientRefusal: Error, Sendable, CustomStringConvertible {
    public var status: Int
    public var code: String
    public var message: String
    public var description: String { "purchase server refused (\(status) \(code)): \(message)" }
}
