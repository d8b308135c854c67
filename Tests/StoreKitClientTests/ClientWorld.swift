import AppStoreEmulator
import AppStoreModels
import Foundation
import HTTPServer
import PurchaseServer
import SQLiteStorage
import StoreKitClient
import StorekeeperTesting

/// A live App Store emulator and purchase server on loopback (port 0), as a device would reach them.
struct ClientWorld {
    let emulator: AppStoreEmulator
    let appStoreHTTP: HTTPServer
    let appStoreURL: URL
    let server: PurchaseServer
    let serverHTTP: HTTPServer
    let serverURL: URL
    let keys: [String: String]
    let worker: Task<Void, Never>
    let directory: URL
    static let tester = "device@example.com"

    static func make() async throws -> ClientWorld {
        let emulator = try await TestSupport.emulator(clock: TestSupport.runningClock(from: Date()))
        let examples = TestSupport.repositoryRoot().appendingPathComponent("examples")
        for (bundle, file) in [("com.example.coins", "coins"), ("com.example.football", "football")] {
            try await emulator.register(storeKit: StoreKitConfiguration(data: Data(contentsOf: examples.appendingPathComponent("\(file).storekit"))), bundleId: bundle)
        }
        try await emulator.addAccount(email: tester, environment: .sandbox)
        try await emulator.addAccount(email: "kid@example.com", environment: .sandbox, askToBuy: true)
        let appStoreHTTP = HTTPServer(configuration: .init(port: 0, accessLog: false), responder: AppStoreResponder(emulator: emulator))
        let appStoreURL = URL(string: "http://127.0.0.1:\(try appStoreHTTP.start())")!
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("client-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let configuration = PurchaseServer.Configuration(
            trust: TrustStore(certificates: [TestSupport.authority.root, TestSupport.authority.intermediate,
                                             TestSupport.jwsAuthority.root, TestSupport.jwsAuthority.intermediate]),
            endpoints: .emulator(appStoreURL), transport: try ClientTransport(), adminKey: "sk_admin_client",
            worker: .init(concurrency: 64, batchSize: 16, lease: 30, pollInterval: .milliseconds(50)), callTimeout: 5)
        let server = try await PurchaseServer.open(database: try SQLiteSQLDatabase(path: directory.appendingPathComponent("server.sqlite").path),
                                                   configuration: configuration)
        var keys: [String: String] = [:]
        for bundle in ["com.example.coins", "com.example.football"] {
            try await server.store.createApp(ServerApp(id: bundle, sharedSecret: try await emulator.app(bundle).sharedSecret), now: Date())
            keys[bundle] = try await server.store.createKey(appId: bundle, label: nil, now: Date())
        }
        try await server.store.setProduct(appId: "com.example.coins", ProductMapping(productId: "Nada.JPYF02", type: .consumable, currency: "coins", amount: 100))
        try await server.store.setProduct(appId: "com.example.football", ProductMapping(productId: "GoldenGlobe", type: .nonConsumable, entitlement: "golden_globe"))
        try await server.store.setProduct(appId: "com.example.football", ProductMapping(productId: "EnergyBottle", type: .consumable, currency: "energy_bottles", amount: 1))
        let worker = server.runWorker()
        let serverHTTP = HTTPServer(configuration: .init(port: 0, accessLog: false), responder: PurchaseServerResponder(server: server))
        let serverURL = URL(string: "http://127.0.0.1:\(try serverHTTP.start())")!
        return ClientWorld(emulator: emulator, appStoreHTTP: appStoreHTTP, appStoreURL: appStoreURL, server: server, serverHTTP: serverHTTP,
                           serverURL: serverURL, keys: keys, worker: worker, directory: directory)
    }

    func stop() async {
        await serverHTTP.shutdown()
        await appStoreHTTP.shutdown()
        worker.cancel()
        await server.worker.drain(timeout: .seconds(2))
        await server.store.database.close()
        try? FileManager.default.removeItem(at: directory)
    }

    /// A device signed in to `account` running the app `bundle` for `user`, with its journal file.
    func shop(_ bundle: String = "com.example.coins", account: String = tester, device: String? = nil, user: String = "player",
              journal: String = "journal", serverURL: URL? = nil, crashAfter: OrderState? = nil) async throws -> Shop {
        let deviceId = try await AppStoreConnection.signIn(baseURL: appStoreURL, account: account, deviceId: device)
        let journal = try await OrderJournal(path: directory.appendingPathComponent("\(journal).sqlite").path)
        return Shop(appStore: AppStoreConnection(baseURL: appStoreURL, bundleId: bundle, deviceId: deviceId),
                    server: PurchaseServerConnection(baseURL: serverURL ?? self.serverURL, apiKey: keys[bundle]!, appUserId: user,
                                                     attempts: 2, backoff: .milliseconds(50)),
                    journal: journal, crashAfter: crashAfter)
    }

    /// The same device and journal after a "restart" (a new Shop without the crash hook).
    func relaunch(_ shop: Shop, journal: String = "journal", serverURL: URL? = nil, user: String = "player") async throws -> Shop {
        Shop(appStore: shop.appStore,
             server: PurchaseServerConnection(baseURL: serverURL ?? self.serverURL, apiKey: shop.server.apiKey, appUserId: user,
                                              attempts: 2, backoff: .milliseconds(50)),
             journal: try await OrderJournal(path: directory.appendingPathComponent("\(journal).sqlite").path))
    }
}
