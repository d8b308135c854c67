import Clocks
import AppStoreCrypto
@testable import AppStoreEmulator
import AppStoreModels
import Foundation
import HTTP
import Storage
import StorekeeperTesting

/// A ready emulator with the example catalogs and one sandbox tester on one device.
struct World {
    let emulator: AppStoreEmulator
    let client: InProcessClient
    let device: String
    static let tester = "tester@example.com"

    static func make(store: any DocumentStore = InMemoryDocumentStore(), clock: AdjustableClock = TestSupport.fixedClock()) async throws -> World {
        let emulator = try await TestSupport.emulator(store: store, clock: clock)
        let examples = TestSupport.repositoryRoot().appendingPathComponent("examples")
        for (bundle, file) in [("com.example.coins", "coins"), ("com.example.football", "football"), ("com.example.comics", "comics"), ("com.example.magazine", "magazine")] {
            let configuration = try StoreKitConfiguration(data: Data(contentsOf: examples.appendingPathComponent("\(file).storekit")))
            try await emulator.register(storeKit: configuration, bundleId: bundle)
        }
        try await emulator.addAccount(email: tester, environment: .sandbox)
        let device = try await emulator.signIn(deviceId: nil, email: tester)
        return World(emulator: emulator, client: InProcessClient(AppStoreResponder(emulator: emulator)), device: device.id)
    }

    func buy(_ bundle: String, _ product: String, device: String? = nil, quantity: Int = 1) async throws -> TransactionRecord {
        try await emulator.addPayment(bundleId: bundle, deviceId: device ?? self.device, request: PaymentRequest(productId: product, quantity: quantity))
    }

    func receipt(_ bundle: String, device: String? = nil) async throws -> String {
        guard let data = try await emulator.appReceipt(bundleId: bundle, deviceId: device ?? self.device, refresh: true) else { throw StoreError.notFound("receipt") }
        return data.base64EncodedString()
    }

    func verify(_ receipt: String, _ environment: AppStoreEnvironment = .sandbox, password: String? = nil, excludeOld: Bool? = nil) async throws -> [String: Any] {
        var body: [String: Any] = ["receipt-data": receipt]
        if let password { body["password"] = password }
        if let excludeOld { body["exclude-old-transactions"] = excludeOld }
        let (status, object) = try await client.json(.post, "/\(environment.pathComponent)/verifyReceipt", json: body)
        precondition(status == 200, "verifyReceipt always answers HTTP 200")
        return object
    }

    func secret(_ bundle: String) async throws -> String { try await emulator.app(bundle).sharedSecret }
}

extension Dictionary where Key == String, Value == Any {
    var status: Int? { self["status"] as? Int }
    var inApp: [[String: Any]] { (self["receipt"] as? [String: Any])?["in_app"] as? [[String: Any]] ?? [] }
    var latest: [[String: Any]] { self["latest_receipt_info"] as? [[String: Any]] ?? [] }
}
