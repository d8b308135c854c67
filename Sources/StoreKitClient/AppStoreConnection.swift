import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The device's line to the App Store (the emulator's device API), over URLSession so the library
/// builds unchanged on Apple platforms. Every call has a timeout and fails with a StoreKitError —
/// never a silent hang (the seeds needed 30-second timers for that).
public struct AppStoreConnection: Sendable {
    public let baseURL: URL
    public let bundleId: String
    public let deviceId: String
    public let timeout: TimeInterval

    public init(baseURL: URL, bundleId: String, deviceId: String, timeout: TimeInterval = 15) {
        self.baseURL = baseURL
        self.bundleId = bundleId
        self.deviceId = deviceId
        self.timeout = timeout
    }

    /// Signs `account` in on a device (a new one unless `deviceId` is given) and returns the device id.
    public static func signIn(baseURL: URL, account: String, deviceId: String? = nil, timeout: TimeInterval = 15) async throws -> String {
        var body: [String: Any] = ["account": account]
        if let deviceId { body["deviceId"] = deviceId }
        let object = try await request(baseURL, "POST", "/device/v1/devices", body: body, timeout: timeout)
        guard let id = object["id"] as? String else { throw StoreKitError.network("the App Store did not return a device id") }
        return id
    }

    /// The device as the App Store knows it (restrictions, account).
    public struct DeviceInfo: Decodable, Sendable {
        public var id: String
        public var accountEmail: String
        public var canMakePayments: Bool
    }

    public func device() async throws -> DeviceInfo {
        try await decode(DeviceInfo.self, "GET", "/device/v1/devices/\(deviceId)")
    }

    /// SKProductsRequest: valid products and invalid identifiers.
    public func products(_ identifiers: [String]) async throws -> ProductsResponse {
        let ids = identifiers.joined(separator: ",").addingPercentEncoding(withAllowedCharacters: .urlQueryAllowed) ?? ""
        return try await decode(ProductsResponse.self, "GET", "/device/v1/products?app=\(bundleId)&device=\(deviceId)&ids=\(ids)")
    }

    /// Adds a payment; returns the transaction as the queue reports it (purchased, failed, deferred).
    public func add(_ payment: Payment) async throws -> PaymentTransaction {
        var body: [String: Any] = ["app": bundleId, "device": deviceId, "productId": payment.productIdentifier, "quantity": payment.quantity]
        if let name = payment.applicationUsername { body["applicationUsername"] = name }
        if let simulate = payment.simulate { body["simulate"] = simulate }
        return try await decode(PaymentTransaction.self, "POST", "/device/v1/payments", body: body)
    }

    /// Every unfinished transaction of the account for this app (delivered again at each launch).
    public func unfinishedTransactions() async throws -> [PaymentTransaction] {
        try await decode(TransactionList.self, "GET", "/device/v1/transactions?app=\(bundleId)&device=\(deviceId)").transactions
    }

    public func finish(_ transactionIdentifier: String) async throws {
        _ = try await Self.request(baseURL, "POST", "/device/v1/transactions/\(transactionIdentifier)/finish?device=\(deviceId)", body: nil, timeout: timeout)
    }

    /// restoreCompletedTransactions: restored copies of every restorable purchase.
    public func restore() async throws -> [PaymentTransaction] {
        try await decode(TransactionList.self, "POST", "/device/v1/restore", body: ["app": bundleId, "device": deviceId]).transactions
    }

    /// The app receipt on disk (Base64), refreshed from the App Store when `refresh` is true.
    public func appReceipt(refresh: Bool = false) async throws -> String? {
        let object = refresh
            ? try await Self.request(baseURL, "POST", "/device/v1/receipt/refresh", body: ["app": bundleId, "device": deviceId], timeout: timeout)
            : try await Self.request(baseURL, "GET", "/device/v1/receipt?app=\(bundleId)&device=\(deviceId)", body: nil, timeout: timeout)
        return object["receipt"] as? String
    }

    struct TransactionList: Decodable { var transactions: [PaymentTransaction] }

    private func decode<T: Decodable>(_ type: T.Type, _ method: String, _ path: String, body: [String: Any]? = nil) async throws -> T {
        let data = try await Self.send(baseURL, method, path, body: body, timeout: timeout)
        do { return try JSONDecoder().decode(type, from: data) } catch {
            throw StoreKitError.network("the App Store's answer could not be read: \(error)")
        }
    }

    static func request(_ base: URL, _ method: String, _ path: String, body: [String: Any]?, timeout: TimeInterval) async throws -> [String: Any] {
        let data = try await send(base, method, path, body: body, timeout: timeout)
        return (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] ?? [:]
    }

    /// The device's session: as `URLSession.shared`, without its cache (Foundation on Linux looks a request up in the
    /// cache on another queue, and a task cancelled meanwhile then fails twice and traps: "a task that in not in the registry").
    static let session: URLSession = {
        let configuration = URLSessionConfiguration.default
        configuration.urlCache = nil
        return URLSession(configuration: configuration)
    }()

    /// One call; HTTP errors carrying an SKError become that StoreKitError, others a network error.
    static func send(_ base: URL, _ method: String, _ path: String, body: [String: Any]?, timeout: TimeInterval) async throws -> Data {
        guard let url = URL(string: base.absoluteString.trimmingCharacters(in: CharacterSet(charactersIn: "/")) + path) else {
            throw StoreKitError.network("bad URL for \(path)")
        }
        var request = URLRequest(url: url, cachePolicy: .reloadIgnoringLocalCacheData, timeoutInterval: timeout)
        request.httpMethod = method
        if let body {
            request.httpBody = try JSONSerialization.data(withJSONObject: body)
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        }
        let (data, response): (Data, URLResponse)
        do { (data, response) = try await Self.session.data(for: request) } catch {
            throw StoreKitError(code: 0, name: "unknown", message: "Cannot connect to the App Store: \(error.localizedDescription)")
        }
        let status = (response as? HTTPURLResponse)?.statusCode ?? 0
        guard (200...299).contains(status) else {
            let error = ((try? JSONSerialization.jsonObject(with: data)) as? [String: Any])?["error"] as? [String: Any]
            throw StoreKitError(code: error?["skErrorCode"] as? Int ?? 0, name: error?["skError"] as? String ?? "unknown",
                                message: error?["message"] as? String ?? "The App Store answered HTTP \(status).")
        }
        return data
    }
}
