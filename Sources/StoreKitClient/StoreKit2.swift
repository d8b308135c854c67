import AppStoreCrypto
import AppStoreModels
import Foundation

/// StoreKit 2's answer about a signed value: checked against the configured root, or not (with why).
public enum VerificationResult<Value: Sendable>: Sendable {
    case verified(Value)
    case unverified(Value, String)

    /// The value when verified.
    public var verified: Value? {
        if case .verified(let value) = self { return value }
        return nil
    }

    public var unsafePayloadValue: Value {
        switch self {
        case .verified(let value), .unverified(let value, _): return value
        }
    }
}

/// A StoreKit 2 transaction: the decoded payload and the JWS it came from (`jwsRepresentation`).
public struct Transaction: Sendable, Equatable {
    public let payload: JWSTransaction
    public let jwsRepresentation: String
    public var id: String { payload.transactionId }
    public var productID: String { payload.productId }
}

/// What `purchase()` came to.
public enum PurchaseResult: Sendable {
    case success(VerificationResult<Transaction>)
    /// Ask to Buy, or another step the customer must take; the transaction arrives in `updates`.
    case pending
    case userCancelled
}

/// StoreKit 2's async API over the App Store emulator: `Product.products(for:)`, `purchase`,
/// `Transaction.currentEntitlements`, `.unfinished`, `.updates`, `finish()`, `AppStore.sync()`.
/// Every signed transaction is verified locally against `roots` (chain, Apple's OIDs, ES256 at signedDate).
public struct StoreKit2: Sendable {
    public let connection: AppStoreConnection
    let verifier: ChainVerifier

    /// `rootsPEM`: the JWS root(s) to trust (Apple Root CA - G3 in production, the emulator's `ca export --jws` in tests).
    public init(connection: AppStoreConnection, rootsPEM: String) throws {
        self.connection = connection
        verifier = ChainVerifier(roots: try Certificate.parsePEM(rootsPEM))
    }

    public func products(for identifiers: [String]) async throws -> [StoreProduct] {
        try await connection.products(identifiers).products
    }

    /// `product.purchase(options: [.appAccountToken(token)])` with the token the purchase server expects
    /// for `appUserId` (`AppAccountToken.token(for:)`): a purchase bound so cannot be delivered to anyone else.
    public func purchase(_ productIdentifier: String, for appUserId: String, quantity: Int = 1) async throws -> PurchaseResult {
        try await purchase(productIdentifier, appAccountToken: AppAccountToken.token(for: appUserId), quantity: quantity)
    }

    /// `product.purchase(options: [.appAccountToken(token)])`.
    public func purchase(_ productIdentifier: String, appAccountToken: UUID? = nil, quantity: Int = 1) async throws -> PurchaseResult {
        var body: [String: Any] = ["app": connection.bundleId, "device": connection.deviceId, "productId": productIdentifier, "quantity": quantity]
        if let appAccountToken { body["appAccountToken"] = appAccountToken.uuidString.lowercased() }
        let data: Data
        do {
            data = try await AppStoreConnection.send(connection.baseURL, "POST", "/device/v1/payments", body: body, timeout: connection.timeout)
        } catch let error as StoreKitError where error.isCancellation {
            return .userCancelled
        }
        let transaction = try JSONDecoder().decode(PaymentTransaction.self, from: data)
        switch transaction.transactionState {
        case .deferred: return .pending
        case .failed:
            if transaction.error?.isCancellation == true { return .userCancelled }
            throw transaction.error ?? StoreKitError.network("the purchase failed")
        default:
            guard let jws = transaction.signedTransaction else { throw StoreKitError.network("the App Store sent no signed transaction") }
            return .success(verify(jws))
        }
    }

    /// `Transaction.currentEntitlements`.
    public func currentEntitlements() async throws -> [VerificationResult<Transaction>] {
        try await signedList("/device/v2/entitlements?app=\(connection.bundleId)&device=\(connection.deviceId)")
    }

    /// `Transaction.unfinished`.
    public func unfinished() async throws -> [VerificationResult<Transaction>] {
        try await signedList("/device/v2/transactions/unfinished?app=\(connection.bundleId)&device=\(connection.deviceId)")
    }

    /// `Transaction.updates`: purchases made elsewhere, renewals, approvals and revocations as they happen
    /// (polled every `interval`; each transaction state is yielded once).
    public func updates(every interval: Duration = .seconds(1)) -> AsyncStream<VerificationResult<Transaction>> {
        AsyncStream { continuation in
            let task = Task {
                var since: String?
                var seen: Set<String> = []
                while !Task.isCancelled {
                    let path = "/device/v2/transactions/updates?app=\(connection.bundleId)&device=\(connection.deviceId)" + (since.map { "&since=\($0)" } ?? "")
                    if let data = try? await AppStoreConnection.send(connection.baseURL, "GET", path, body: nil, timeout: connection.timeout),
                       let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] {
                        for jws in object["signedTransactions"] as? [String] ?? [] {
                            let result = verify(jws)
                            let key = result.unsafePayloadValue.id + "|" + String(result.unsafePayloadValue.payload.revocationDate ?? 0)
                            if since != nil, seen.insert(key).inserted { continuation.yield(result) } else { seen.insert(key) }
                        }
                        since = object["next"] as? String
                    }
                    try? await Task.sleep(for: interval)
                }
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    /// `transaction.finish()`.
    public func finish(_ transaction: Transaction) async throws {
        try await connection.finish(transaction.id)
    }

    /// `AppStore.sync()`: the customer signs in again; returns the current entitlements.
    public func sync() async throws -> [VerificationResult<Transaction>] {
        let data = try await AppStoreConnection.send(connection.baseURL, "POST", "/device/v2/sync",
                                                     body: ["app": connection.bundleId, "device": connection.deviceId], timeout: connection.timeout)
        let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] ?? [:]
        return (object["signedTransactions"] as? [String] ?? []).map(verify)
    }

    /// Local verification of a signed transaction (what StoreKit's VerificationResult does on a device).
    public func verify(_ jws: String) -> VerificationResult<Transaction> {
        guard let parsed = try? JWS(compact: jws), let json = try? parsed.payloadJSON(), let payload = JWSTransaction(json: json) else {
            let empty = JWSTransaction(transactionId: "", originalTransactionId: "", bundleId: "", productId: "", purchaseDate: 0, originalPurchaseDate: 0,
                                       quantity: 0, type: "", signedDate: 0, environment: "")
            return .unverified(Transaction(payload: empty, jwsRepresentation: jws), "not a signed transaction")
        }
        let transaction = Transaction(payload: payload, jwsRepresentation: jws)
        do {
            try parsed.verify(with: verifier, at: ReceiptDate.date(milliseconds: payload.signedDate))
        } catch {
            return .unverified(transaction, "\(error)")
        }
        guard payload.bundleId == connection.bundleId else { return .unverified(transaction, "signed for bundle \(payload.bundleId)") }
        return .verified(transaction)
    }

    private func signedList(_ path: String) async throws -> [VerificationResult<Transaction>] {
        let data = try await AppStoreConnection.send(connection.baseURL, "GET", path, body: nil, timeout: connection.timeout)
        let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] ?? [:]
        return (object["signedTransactions"] as? [String] ?? []).map(verify)
    }
}
