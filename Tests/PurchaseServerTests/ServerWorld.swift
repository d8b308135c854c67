import Clocks
import AppStoreCrypto
@testable import AppStoreEmulator
import AppStoreModels
import Foundation
import HTTP
import Locking
import PostgresStorage
@testable import PurchaseServer
import SQLiteStorage
import Storage
import StorekeeperTesting
import Synchronization

/// The storage engines every suite runs on: SQLite always, PostgreSQL when `make test` provides one.
enum Engine: String, CaseIterable, CustomStringConvertible {
    case sqlite, postgres
    var description: String { rawValue }

    static var available: [Engine] {
        ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES"] == nil ? [.sqlite] : [.sqlite, .postgres]
    }

    /// A fresh, empty database (a new file, or a new PostgreSQL schema).
    func makeDatabase() async throws -> any SQLDatabase {
        switch self {
        case .sqlite:
            return try SQLiteSQLDatabase(path: FileManager.default.temporaryDirectory.appendingPathComponent("server-\(UUID().uuidString).sqlite").path)
        case .postgres:
            let base = ProcessInfo.processInfo.environment["STOREKEEPER_TEST_POSTGRES"]!
            let schema = "t_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased()
            let setup = try PostgresDatabase(url: base, size: 1)
            _ = try await setup.transaction { db in try db.query("CREATE SCHEMA \(schema)") }
            await setup.close()
            let separator = base.contains("?") ? "&" : "?"
            return try PostgresDatabase(url: base + separator + "options=-csearch_path%3D\(schema)", size: 4, channels: ["storekeeper_jobs"])
        }
    }
}

/// Routes verifyReceipt calls to an in-process emulator, with scriptable failures.
final class EmulatorTransport: HTTPTransport {
    let responder: AppStoreResponder
    /// Failures to serve before answering normally (e.g. `.http(503)`, `.html`, `.timeout`).
    let failures = Locked<[Failure]>([])
    let calls = Locked(0)

    enum Failure {
        case http(Int), html, timeout, connection
        /// Answers normally, with one text replaced in the body (an answer that does not fit the receipt).
        case rewrite(String, String)
    }

    init(emulator: AppStoreEmulator) { responder = AppStoreResponder(emulator: emulator) }

    func post(_ url: URL, body: [UInt8], timeout: TimeInterval) async throws -> (status: Int, contentType: String?, body: Data) {
        calls.withLock { $0 += 1 }
        if let failure = failures.withLock({ $0.isEmpty ? nil : $0.removeFirst() }) {
            switch failure {
            case .http(let code): return (code, "text/plain", Data("unavailable".utf8))
            case .html: return (200, "text/html", Data("<html>sorry</html>".utf8))
            case .timeout: throw URLError(.timedOut)
            case .connection: throw URLError(.networkConnectionLost)
            case .rewrite(let from, let to):
                let response = await responder.respond(to: Request(method: .post, target: url.path, body: Data(body)))
                let text = String(decoding: response.body, as: UTF8.self).replacingOccurrences(of: from, with: to)
                return (response.status.code, response.headers["Content-Type"], Data(text.utf8))
            }
        }
        let response = await responder.respond(to: Request(method: .post, target: url.path, body: Data(body)))
        return (response.status.code, response.headers["Content-Type"], response.body)
    }
}

/// An emulator with the example stores, a purchase server over `engine`, and its worker running.
struct ServerWorld {
    let emulator: AppStoreEmulator
    let server: PurchaseServer
    let transport: EmulatorTransport
    let client: InProcessClient
    let device: String
    let keys: [String: String]
    let worker: Task<Void, Never>
    static let tester = "tester@example.com"
    static let adminKey = "sk_admin_test"

    static func make(_ engine: Engine, retry: VerificationEngine.RetryPolicy = .init(baseDelay: 0.01, maxDelay: 0.05, maxAge: 3600),
                     policies: (inout ServerApp) -> Void = { _ in }, startWorker: Bool = true,
                     ids: any IDGenerator = RandomIDs(), clock: AdjustableClock = TestSupport.runningClock()) async throws -> ServerWorld {
        let emulator = try await TestSupport.emulator(clock: clock)
        let examples = TestSupport.repositoryRoot().appendingPathComponent("examples")
        for (bundle, file) in [("com.example.coins", "coins"), ("com.example.football", "football"), ("com.example.comics", "comics"), ("com.example.magazine", "magazine")] {
            try await emulator.register(storeKit: StoreKitConfiguration(data: Data(contentsOf: examples.appendingPathComponent("\(file).storekit"))), bundleId: bundle)
        }
        try await emulator.addAccount(email: tester, environment: .sandbox)
        let device = try await emulator.signIn(deviceId: nil, email: tester).id
        let transport = EmulatorTransport(emulator: emulator)
        let configuration = PurchaseServer.Configuration(
            trust: TrustStore(certificates: [TestSupport.authority.root, TestSupport.authority.intermediate,
                                             TestSupport.jwsAuthority.root, TestSupport.jwsAuthority.intermediate]),
            endpoints: .emulator(URL(string: "http://emulator")!), transport: transport, adminKey: adminKey,
            worker: .init(concurrency: 64, batchSize: 16, lease: 30, pollInterval: .milliseconds(50)), retry: retry, callTimeout: 5)
        var configured = configuration
        // Webhook retries in tens of milliseconds, not seconds, so a receiver's outage passes within a test.
        // A 30 s call timeout: a receiver in this process answering late on a loaded machine must not count as a timeout (and a duplicate).
        configured.webhooks = .init(timeout: 30, retry: .init(baseDelay: 0.02, maxDelay: 0.2), pollInterval: .milliseconds(50))
        let server = try await PurchaseServer.open(database: try await engine.makeDatabase(), configuration: configured, clock: EmulatorBackedClock(clock),
                                                ids: ids)
        var keys: [String: String] = [:]
        let mappings = ["com.example.coins": [("Nada.JPYF01", 20), ("Nada.JPYF02", 100), ("Nada.JPYF03", 600)].map {
            ProductMapping(productId: $0.0, type: .consumable, currency: "coins", amount: Int64($0.1), price: "0.99", priceCurrency: "USD")
        }, "com.example.football": [
            ProductMapping(productId: "ProtectiveGloves", type: .nonConsumable, entitlement: "protective_gloves", price: "1.99", priceCurrency: "USD"),
            ProductMapping(productId: "GoldenGlobe", type: .nonConsumable, entitlement: "golden_globe", price: "2.99", priceCurrency: "USD"),
            ProductMapping(productId: "EnergyBottle", type: .consumable, currency: "energy_bottles", amount: 1, price: "0.99", priceCurrency: "USD"),
        ], "com.example.magazine": [
            ProductMapping(productId: "com.example.magazine.monthly", type: .autoRenewable, entitlement: "magazine", price: "4.99", priceCurrency: "USD"),
            ProductMapping(productId: "com.example.magazine.yearly", type: .autoRenewable, entitlement: "magazine", price: "49.99", priceCurrency: "USD"),
            ProductMapping(productId: "com.example.magazine.weekpass", type: .nonRenewing, entitlement: "magazine", durationDays: 7, price: "1.99", priceCurrency: "USD"),
            ProductMapping(productId: "com.example.magazine.free", type: .freeSubscription, entitlement: "magazine_free"),
        ]]
        for (bundle, products) in mappings {
            var app = ServerApp(id: bundle, sharedSecret: try await emulator.app(bundle).sharedSecret)
            policies(&app)
            try await server.store.createApp(app, now: Date())
            for product in products { try await server.store.setProduct(appId: bundle, product) }
            keys[bundle] = try await server.store.createKey(appId: bundle, label: nil, now: Date())
        }
        let worker = startWorker ? server.runWorker() : Task {}
        return ServerWorld(emulator: emulator, server: server, transport: transport, client: InProcessClient(PurchaseServerResponder(server: server)),
                           device: device, keys: keys, worker: worker)
    }

    func stop() async {
        worker.cancel()
        await server.worker.drain(timeout: .seconds(2))
        await server.store.database.close()
    }

    /// Buys on the emulator and returns the app receipt after the purchase.
    func buy(_ bundle: String, _ product: String, device: String? = nil, quantity: Int = 1) async throws -> (TransactionRecord, String) {
        let record = try await emulator.addPayment(bundleId: bundle, deviceId: device ?? self.device, request: PaymentRequest(productId: product, quantity: quantity))
        let receipt = try await emulator.appReceipt(bundleId: bundle, deviceId: device ?? self.device, refresh: true)!.base64EncodedString()
        return (record, receipt)
    }

    /// Uploads a receipt and waits for the verification to settle.
    func upload(_ bundle: String, user: String, receipt: String, path: String = "/v1/receipts") async throws -> [String: Any] {
        let target = path == "/v1/receipts" ? "/v1/receipts?wait=10" : "/v1/users/\(user)/restore?wait=10"
        let (status, body) = try await client.json(.post, target, json: ["appUserId": user, "receiptData": receipt],
                                                    headers: ["Authorization": "Bearer \(keys[bundle]!)"])
        precondition(status == 200 || status == 202, "upload answered \(status): \(body)")
        return body
    }

    /// Posts a StoreKit 2 signed transaction (answered once settled); returns the HTTP status and body.
    func postTransaction(_ bundle: String, user: String, signed: String) async throws -> (Int, [String: Any]) {
        try await client.json(.post, "/v1/transactions", json: ["appUserId": user, "signedTransaction": signed],
                              headers: ["Authorization": "Bearer \(keys[bundle]!)"])
    }

    func user(_ bundle: String, _ user: String) async throws -> [String: Any] {
        let (status, body) = try await client.json(.get, "/v1/users/\(user)", headers: ["Authorization": "Bearer \(keys[bundle]!)"])
        precondition(status == 200, "user answered \(status)")
        return body
    }
}

/// The server reads the emulator's clock, so both agree on "now" when tests move time.
struct EmulatorBackedClock: WallClock {
    let clock: AdjustableClock
    init(_ clock: AdjustableClock) { self.clock = clock }
    func now() -> Date { clock.now() }
}

extension Dictionary where Key == String, Value == Any {
    var state: String? { self["state"] as? String }
    var balances: [String: Int] { self["balances"] as? [String: Int] ?? [:] }
    var entitlementIds: [String] { (self["entitlements"] as? [[String: Any]] ?? []).filter { $0["active"] as? Bool == true }.compactMap { $0["id"] as? String } }
    var granted: [String] { ((self["result"] as? [String: Any])?["granted"] as? [String]) ?? [] }
}
