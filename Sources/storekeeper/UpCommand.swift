import Clocks
import AppStoreEmulator
import AppStoreModels
import Foundation
import HTTP
import HTTPServer
import PurchaseServer
import SQLiteStorage

/// The example stores and what their products grant on the purchase server.
enum ExampleStores {
    struct Store {
        let bundleId: String
        let file: String
        let products: [ProductMapping]
    }

    static let all: [Store] = [
        Store(bundleId: "com.example.coins", file: "coins.storekit", products: [
            ("Nada.JPYF01", 20, "0.99"), ("Nada.JPYF02", 100, "1.99"), ("Nada.JPYF03", 600, "4.99"),
            ("Nada.JPYF04", 1000, "9.99"), ("Nada.JPYF05", 6000, "24.99"),
        ].map { ProductMapping(productId: $0.0, type: .consumable, currency: "coins", amount: $0.1, price: $0.2, priceCurrency: "USD") }),
        Store(bundleId: "com.example.football", file: "football.storekit", products: [
            ProductMapping(productId: "ProtectiveGloves", type: .nonConsumable, entitlement: "protective_gloves", price: "1.99", priceCurrency: "USD"),
            ProductMapping(productId: "GoldenGlobe", type: .nonConsumable, entitlement: "golden_globe", price: "2.99", priceCurrency: "USD"),
            ProductMapping(productId: "EnergyBottle", type: .consumable, currency: "energy_bottles", amount: 1, price: "0.99", priceCurrency: "USD"),
        ]),
        Store(bundleId: "com.example.comics", file: "comics.storekit", products: ["drummerrage", "itunesconnectrage", "nightlyrage", "studylikeaboss", "updogsadness"].map { (name: String) in
            ProductMapping(productId: "com.raywenderlich.inapprage." + name, type: .nonConsumable, entitlement: name, price: "0.99", priceCurrency: "USD")
        }),
        Store(bundleId: "com.example.magazine", file: "magazine.storekit", products: [
            ProductMapping(productId: "com.example.magazine.monthly", type: .autoRenewable, entitlement: "magazine", price: "4.99", priceCurrency: "USD"),
            ProductMapping(productId: "com.example.magazine.yearly", type: .autoRenewable, entitlement: "magazine", price: "49.99", priceCurrency: "USD"),
            ProductMapping(productId: "com.example.magazine.weekpass", type: .nonRenewing, entitlement: "magazine", durationDays: 7, price: "1.99", priceCurrency: "USD"),
            ProductMapping(productId: "com.example.magazine.free", type: .freeSubscription, entitlement: "magazine_free", price: "0", priceCurrency: "USD"),
        ]),
    ]
}

/// `storekeeper up`
struct UpCommand: Command {
    static let abstract = "Run the App Store emulator and the purchase server together, wired to each other, with the example stores."
    static let help = """
    [--data DIR] [--appstore-port P] [--server-port P] [--examples DIR] [--https-port P | --no-proxy] [--quiet]

    The first line of output is one JSON object for scripts:
      {"appstore": URL, "server": URL, "adminKey": KEY, "apps": [{"bundleId", "apiKey"}, …]}
    OPTIONS:
      --data DIR            State directory (default ./.storekeeper): appstore/ and server/ inside.
      --appstore-port P     Emulator port (default 8010; 0 = any free port).
      --server-port P       Purchase server port (default 8020; 0 = any free port).
      --examples DIR        Where the example .storekit files are (default ./examples; the copies built into the binary when absent).
      --https-port P        Also serve Apple's host names over TLS directly on P (see appstore serve).
      --no-proxy            The emulator speaks plain HTTP only (no CONNECT tunnels to Apple's host names).
      --quiet               No access logs.
    """

    let data: String
    let appstorePort: UInt16
    let serverPort: UInt16
    let examples: String
    let quiet: Bool
    let tls: EmulatorTLS.Options

    init(_ arguments: inout Arguments) throws {
        data = try arguments.option("data") ?? "./.storekeeper"
        tls = try EmulatorTLS.Options(&arguments)
        guard let appstorePort = UInt16(try arguments.option("appstore-port") ?? "8010"),
              let serverPort = UInt16(try arguments.option("server-port") ?? "8020") else {
            throw UsageError(description: "ports are 0–65535")
        }
        self.appstorePort = appstorePort
        self.serverPort = serverPort
        examples = try arguments.option("examples") ?? "./examples"
        quiet = arguments.flag("quiet")
    }

    func run() async throws {
        FileLimits.raise()
        let root = URL(fileURLWithPath: data, isDirectory: true)
        let appstoreDirectory = root.appendingPathComponent("appstore")
        try FileManager.default.createDirectory(at: appstoreDirectory, withIntermediateDirectories: true)

        // The App Store.
        let authority = try CertificateAuthority.loadOrCreate(in: appstoreDirectory.appendingPathComponent("ca"))
        let jwsAuthority = try CertificateAuthority.loadOrCreate(in: appstoreDirectory.appendingPathComponent("ca/jws"), algorithm: .ecP256)
        let emulator = try await AppStoreEmulator.open(store: try SQLiteDocumentStore(path: appstoreDirectory.appendingPathComponent("appstore.sqlite").path),
                                                       authority: authority, jwsAuthority: jwsAuthority,
                                                       xcodeAuthority: try XcodeAuthority.loadOrCreate(in: appstoreDirectory.appendingPathComponent("ca/xcode")))
        for store in ExampleStores.all {
            try await CatalogLoader.load("\(store.bundleId)=\(examples)/\(store.file)", into: emulator)
        }
        if try await !emulator.accounts().contains(where: { $0.email == "sandbox@example.com" }) {
            try await emulator.addAccount(email: "sandbox@example.com", environment: .sandbox)
        }
        var appstoreConfiguration = HTTPServer.Configuration(port: appstorePort, connectionLimit: FileLimits.connectionLimit(share: 0.3), accessLog: !quiet)
        let tlsAuthority = try tls.apply(to: &appstoreConfiguration, directory: appstoreDirectory)
        let appstoreHTTP = HTTPServer(configuration: appstoreConfiguration, responder: AppStoreResponder(emulator: emulator, tlsRoot: tlsAuthority?.root))
        let appstorePortBound = try appstoreHTTP.start()
        let appstoreURL = "http://127.0.0.1:\(appstorePortBound)"

        // The purchase server, trusting the emulator's chain and calling its verifyReceipt.
        var arguments = Arguments(["--data", root.appendingPathComponent("server").path, "--appstore-url", appstoreURL])
        var options = try ServerOptions(&arguments)
        // One process holds both ends of each call (the server's socket and the emulator's): a sixth of the file limit
        // each, beside the emulator's clients (0.3), the server's (0.2) and the webhook deliveries (an eighth).
        options.concurrency = options.concurrency ?? FileLimits.concurrency(files: FileLimits.openFileLimit() / 6)
        let (server, _, database) = try await options.openServer(emulatorCA: authority.root.pem + authority.intermediate.pem
                                                                              + jwsAuthority.root.pem + jwsAuthority.intermediate.pem,
                                                                          clock: DelegatingClock { [clock = emulator.clock] in clock.now() })
        var apps: [[String: String]] = []
        let keysFile = root.appendingPathComponent("server/app-keys.json")
        var keys = (try? JSONDecoder().decode([String: String].self, from: Data(contentsOf: keysFile))) ?? [:]
        for store in ExampleStores.all {
            let catalog = try await emulator.app(store.bundleId)
            if try await server.store.app(store.bundleId) == nil {
                try await server.store.createApp(ServerApp(id: store.bundleId, name: catalog.name, sharedSecret: catalog.sharedSecret,
                                                                     userAuth: .optional), now: Date())
            }
            for product in store.products { try await server.store.setProduct(appId: store.bundleId, product) }
            if keys[store.bundleId] == nil {
                keys[store.bundleId] = try await server.store.createKey(appId: store.bundleId, label: "storekeeper up", now: Date())
            }
            apps.append(["bundleId": store.bundleId, "apiKey": keys[store.bundleId] ?? ""])
        }
        try SecretFiles.replace(keysFile, with: try JSONEncoder().encode(keys))
        // `up` is the local playground: its first line gives scripts the admin key (read from the 0600 file), never a log.
        let adminKey = try ServerOptions.persistentAdminKey(in: root.appendingPathComponent("server")).0
        let worker = server.runWorker()
        let reconciler = server.runReconciler(every: .milliseconds(Int(options.reconcileInterval * 1000)))
        let serverHTTP = HTTPServer(configuration: .init(port: serverPort, connectionLimit: FileLimits.connectionLimit(share: 0.2), accessLog: !quiet),
                                    responder: PurchaseServerResponder(server: server, emulator: EmulatorConsoleControl(emulator: emulator)))
        let serverURL = "http://127.0.0.1:\(try serverHTTP.start())"
        // The App Store tells the server about renewals, refunds and expiries, as Apple would.
        for store in ExampleStores.all {
            let url = serverURL + "/v1/notifications/apple"
            try await emulator.setNotificationURLs(bundleId: store.bundleId, NotificationURLs(production: url, sandbox: url))
        }
        let notifications = Task { await emulator.runNotificationDelivery() }

        // A first admin for the console, and a link that signs them in once (a new one each start).
        let (_, linkToken) = try await server.store.addOperator(email: "admin@localhost", role: .admin, password: nil, now: Date())
        let consoleLink = serverURL + "/console/login/link?token=" + linkToken
        let summary: [String: Any] = ["appstore": appstoreURL, "server": serverURL, "adminKey": adminKey, "apps": apps,
                                      "console": serverURL + "/console", "consoleLoginLink": consoleLink]
        let line = try JSONSerialization.data(withJSONObject: summary, options: [.sortedKeys, .withoutEscapingSlashes])
        try ShutdownSignal.catch()  // from here a signal stops gracefully (one sent as soon as the address is read is kept)
        say(String(decoding: line, as: UTF8.self))
        // Where this `up` listens, for `storekeeper shop` and scripts started with the same --data (removed at exit).
        let addresses = root.appendingPathComponent("up.json")
        try SecretFiles.replace(addresses, with: try JSONSerialization.data(withJSONObject: ["appstore": appstoreURL, "server": serverURL],
                                                                            options: [.sortedKeys, .withoutEscapingSlashes]))
        defer { try? FileManager.default.removeItem(at: addresses) }
        let coins = keys["com.example.coins"] ?? ""
        say("""

        App Store emulator: \(appstoreURL)    purchase server: \(serverURL)    sandbox tester: sandbox@example.com
        Console: \(serverURL)/console — sign in once as admin@localhost at \(consoleLink)
        The example apps keep userAuth optional (a playground: a public key may name any user); apps you add default to required.
        Try:
          R=$(storekeeper appstore buy --url \(appstoreURL) --app com.example.coins --product Nada.JPYF02 --account sandbox@example.com | python3 -c 'import json,sys; print(json.load(sys.stdin)["receipt"])')
          curl -s -X POST '\(serverURL)/v1/receipts?wait=10' -H 'Authorization: Bearer \(coins)' -d "{\\"appUserId\\":\\"alice\\",\\"receiptData\\":\\"$R\\"}"
          curl -s \(serverURL)/v1/users/alice -H 'Authorization: Bearer \(coins)'      # 100 coins
        """)
        await ShutdownSignal.wait()
        FileHandle.standardError.write(Data("shutting down\n".utf8))
        notifications.cancel()
        reconciler.cancel()
        // The purchase server first, its worker included: its requests in flight may still need the App Store.
        await serverHTTP.shutdown()
        worker.cancel()
        await server.worker.drain(timeout: .seconds(5))
        await appstoreHTTP.shutdown()
        await database.close()
    }
}
