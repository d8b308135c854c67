import Foundation
import StoreKitClient

/// Where a `storekeeper shop` device talks and keeps its state: `storekeeper up`'s URLs and keys by default.
struct ShopOptions {
    static let help = """
      --catalog NAME      coins, football, comics or magazine (the example stores of `storekeeper up`); default coins.
      --app BUNDLE        The app instead of --catalog.
      --account EMAIL     The Apple ID signed in on the device (default sandbox@example.com, the tester of `up`).
      --device ID         The device (default: one created on first use and kept in DATA/shop).
      --user ID           The app's user id on the purchase server (default player).
      --appstore URL      Default http://127.0.0.1:8010.     --server URL   Default http://127.0.0.1:8020.
      --api-key KEY       The app's purchase server key (default read from DATA/server/app-keys.json, written by `up`).
      --data DIR          `up`'s data directory (default ./.storekeeper); the device's journal lives in DIR/shop.
    """
    var bundleId: String
    var account: String
    var device: String?
    var user: String
    var appStoreURL: URL
    var serverURL: URL
    var apiKey: String?
    var data: URL

    init(_ arguments: inout Arguments) throws {
        let catalogs = ["coins": "com.example.coins", "football": "com.example.football", "comics": "com.example.comics", "magazine": "com.example.magazine"]
        let catalog = try arguments.option("catalog") ?? "coins"
        guard let fromCatalog = catalogs[catalog] else { throw UsageError(description: "--catalog is one of \(catalogs.keys.sorted().joined(separator: ", "))") }
        bundleId = try arguments.option("app") ?? fromCatalog
        account = try arguments.option("account") ?? "sandbox@example.com"
        device = try arguments.option("device")
        user = try arguments.option("user") ?? "player"
        data = URL(fileURLWithPath: try arguments.option("data") ?? "./.storekeeper", isDirectory: true)
        // A running `storekeeper up` with the same --data says where it listens; else the default ports.
        let running = (try? Data(contentsOf: data.appendingPathComponent("up.json")))
            .flatMap { try? JSONSerialization.jsonObject(with: $0) as? [String: String] } ?? [:]
        guard let appStore = URL(string: try arguments.option("appstore") ?? running["appstore"] ?? "http://127.0.0.1:8010"),
              let server = URL(string: try arguments.option("server") ?? running["server"] ?? "http://127.0.0.1:8020") else {
            throw UsageError(description: "bad URL")
        }
        appStoreURL = appStore
        serverURL = server
        apiKey = try arguments.option("api-key")
    }

    /// The device's shop: signs in (keeping the device id for next time), opens the journal, resumes open orders.
    func open() async throws -> Shop {
        let directory = data.appendingPathComponent("shop")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let name = "\(bundleId)-\(account)".replacingOccurrences(of: "/", with: "_")
        let deviceFile = directory.appendingPathComponent(name + ".device")
        let known = device ?? (try? String(contentsOf: deviceFile, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
        let deviceId = try await AppStoreConnection.signIn(baseURL: appStoreURL, account: account, deviceId: known)
        try deviceId.write(to: deviceFile, atomically: true, encoding: .utf8)
        guard let key = apiKey ?? Self.keyFromUp(data: data, bundleId: bundleId) else {
            throw CommandFailure(description: "no API key for \(bundleId): give --api-key, or run `storekeeper up` with --data \(data.path)")
        }
        let journal = try await OrderJournal(path: directory.appendingPathComponent(name + "-\(deviceId).sqlite").path)
        return Shop(appStore: AppStoreConnection(baseURL: appStoreURL, bundleId: bundleId, deviceId: deviceId),
                    server: PurchaseServerConnection(baseURL: serverURL, apiKey: key, appUserId: user), journal: journal)
    }

    static func keyFromUp(data: URL, bundleId: String) -> String? {
        guard let contents = try? Data(contentsOf: data.appendingPathComponent("server/app-keys.json")),
              let keys = try? JSONDecoder().decode([String: String].self, from: contents) else { return nil }
        return keys[bundleId]
    }
}

/// What `shop list` shows for one product.
struct ShopRow: Encodable {
    var productId: String
    var title: String
    var price: String
    var type: String
    var owned: Bool
    var count: Int
    var expiresDate: Int64?
}

extension Shop {
    /// The store's products with their state for this user and device.
    func rows(_ identifiers: [String]) async throws -> (rows: [ShopRow], offline: Bool) {
        let products = try await appStore.products(identifiers).products
        let delivered = try await journal.deliveredCounts()
        var owned: [String: ServerEntitlements.Entitlement] = [:]
        var offline = false
        do {
            let answer = try await entitlements()  // the last answer kept in the journal when the server is down
            offline = answer.offline
            for entitlement in answer.entitlements.entitlements where entitlement.active {
                if let product = entitlement.productId { owned[product] = entitlement }
            }
        } catch {
            offline = true  // nothing cached yet: the journal still knows what this device delivered
        }
        let rows = products.map { product in
            ShopRow(productId: product.productIdentifier, title: product.localizedTitle, price: product.displayPrice(), type: product.type,
                    owned: owned[product.productIdentifier] != nil || (!product.isConsumable && (delivered[product.productIdentifier] ?? 0) > 0),
                    count: delivered[product.productIdentifier] ?? 0, expiresDate: owned[product.productIdentifier]?.expiresDate)
        }
        return (rows, offline)
    }
}

/// `storekeeper shop list|buy|restore`
struct ShopCommand: Command {
    static let abstract = "The seeds' demo shop as a device: list products with their state, buy, restore (for scripts)."
    static let help = """
    [list [--json] | buy PRODUCT [--quantity N] | restore]   [options]

    Without an action: the interactive shop (keys 1–9 buy, r restore, f refresh, q quit).

    Runs against `storekeeper up` by default. Every purchase goes through the order journal (created → paid →
    verified by the purchase server → delivered → finished); open orders resume first.
    \(ShopOptions.help)
    """
    let options: ShopOptions
    let action: String
    let product: String?
    let quantity: Int
    let json: Bool

    init(_ arguments: inout Arguments) throws {
        options = try ShopOptions(&arguments)
        json = arguments.flag("json")
        quantity = Int(try arguments.option("quantity") ?? "1") ?? 1
        let words = try arguments.positionals()
        let first = words.first ?? "interactive"
        guard ["list", "buy", "restore", "interactive"].contains(first) else { throw UsageError(description: "give list, buy PRODUCT or restore (or nothing)") }
        action = first
        product = words.dropFirst().first
        if action == "buy", product == nil { throw UsageError(description: "buy needs a product id") }
    }

    func run() async throws {
        let shop = try await options.open()
        defer { Task { await shop.journal.close() } }
        if action == "interactive" {
            let client = try AdminClient(url: options.appStoreURL.absoluteString, bearer: emulatorToken())
            let app = (try? JSONSerialization.jsonObject(with: try await client.send("GET", "/admin/v1/apps/\(options.bundleId)"))) as? [String: Any]
            var screen = ShopScreen(shop: shop, title: "\(app?["name"] as? String ?? options.bundleId) — \(options.account)",
                                    identifiers: try await productIdentifiers())
            await screen.run()
            return
        }
        _ = try? await shop.resume()
        switch action {
        case "buy":
            let order = try await shop.buy(product ?? "", quantity: quantity)
            try printJSON(["orderId": order.id, "productId": order.productIdentifier, "state": order.state.rawValue,
                           "transactionId": order.transactionIdentifier as Any, "verificationId": order.verificationId as Any])
        case "restore":
            let verdict = try await shop.restore()
            try printJSON(["restored": verdict != nil, "state": verdict?.state as Any, "verificationId": verdict?.verificationId as Any])
        default:
            let identifiers = try await productIdentifiers()
            let (rows, offline) = try await shop.rows(identifiers)
            if json {
                let data = try JSONEncoder().encode(rows)
                FileHandle.standardOutput.write(data + Data("\n".utf8))
            } else {
                if offline { say("(offline: showing what this device delivered)") }
                for row in rows {
                    let state = row.type == "consumable" ? "x\(row.count)" : (row.owned ? "owned" : "")
                    say("\(row.productId.padding(toLength: 44, withPad: " ", startingAt: 0)) \(row.price.padding(toLength: 10, withPad: " ", startingAt: 0)) \(state)")
                }
            }
        }
    }

    /// The app's product ids, from the emulator's catalog.
    func productIdentifiers() async throws -> [String] {
        let client = try AdminClient(url: options.appStoreURL.absoluteString, bearer: emulatorToken())
        let data = try await client.send("GET", "/admin/v1/apps/\(options.bundleId)")
        let app = (try JSONSerialization.jsonObject(with: data)) as? [String: Any] ?? [:]
        return (app["products"] as? [[String: Any]] ?? []).compactMap { $0["productId"] as? String }
    }
}

/// `storekeeper shop bench`: time from "buy" to content delivered, end to end, at p50/p99.
struct ShopBenchCommand: Command {
    static let abstract = "Measure buy → verified → delivered → finished end to end from devices (p50/p99)."
    static let help = """
    [--purchases N] [--concurrency C] [--proof receipt|jws] [--product ID]   [shop options]

    C devices buy N purchases in all through the order journal; each purchase's time from the payment to its
    delivery (and finish) is measured. --proof receipt uploads the app receipt (the server calls verifyReceipt,
    so App Store latency counts); jws uploads the signed transaction (checked locally by the server).
    \(ShopOptions.help)
    """
    let options: ShopOptions
    let purchases: Int
    let concurrency: Int
    let proof: Shop.Proof
    let product: String

    init(_ arguments: inout Arguments) throws {
        options = try ShopOptions(&arguments)
        purchases = Int(try arguments.option("purchases") ?? "200") ?? 200
        concurrency = Int(try arguments.option("concurrency") ?? "16") ?? 16
        proof = try arguments.option("proof") == "jws" ? .signedTransaction : .receipt
        product = try arguments.option("product") ?? "Nada.JPYF01"
    }

    func run() async throws {
        guard let key = options.apiKey ?? ShopOptions.keyFromUp(data: options.data, bundleId: options.bundleId) else {
            throw CommandFailure(description: "no API key: give --api-key or --data of `storekeeper up`")
        }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("shop-bench-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        var shops: [Shop] = []
        let admin = try AdminClient(url: options.appStoreURL.absoluteString, bearer: emulatorToken())
        let run = UUID().uuidString.prefix(8).lowercased()
        for index in 0..<concurrency {
            // One customer per device: a receipt carries all of its Apple ID's purchases, so devices sharing an
            // account would present each other's consumables (a replay the server rightly refuses).
            let account = "bench-\(run)-\(index)@example.com"
            _ = try await admin.send("POST", "/admin/v1/accounts", json: ["email": account])
            let device = try await AppStoreConnection.signIn(baseURL: options.appStoreURL, account: account)
            shops.append(Shop(appStore: AppStoreConnection(baseURL: options.appStoreURL, bundleId: options.bundleId, deviceId: device, timeout: 60),
                              server: PurchaseServerConnection(baseURL: options.serverURL, apiKey: key, appUserId: "bench-\(index)"),
                              journal: try await OrderJournal(path: directory.appendingPathComponent("\(index).sqlite").path), proof: proof))
        }
        let started = ContinuousClock.now
        let per = purchases / concurrency
        let results = try await withThrowingTaskGroup(of: [Double].self) { group in
            for shop in shops {
                group.addTask {
                    var times: [Double] = []
                    for _ in 0..<per {
                        let start = ContinuousClock.now
                        let order = try await shop.buy(product)
                        guard order.state == .finished else { throw CommandFailure(description: "an order ended \(order.state.rawValue): \(order.lastError ?? "")") }
                        let elapsed = ContinuousClock.now - start
                        times.append(Double(elapsed.components.seconds) * 1000 + Double(elapsed.components.attoseconds) / 1e15)
                    }
                    return times
                }
            }
            return try await group.reduce(into: [Double]()) { $0 += $1 }
        }.sorted()
        let total = ContinuousClock.now - started
        func percentile(_ p: Double) -> Double { results.isEmpty ? 0 : results[min(results.count - 1, Int(Double(results.count) * p))] }
        var delivered = 0
        for shop in shops { delivered += try await shop.journal.deliveredCounts().values.reduce(0, +) }
        try printJSON(["purchases": results.count, "delivered": delivered, "p50_ms": Int(percentile(0.5)), "p99_ms": Int(percentile(0.99)),
                       "seconds": Double(total.components.seconds), "proof": proof == .receipt ? "receipt" : "jws", "concurrency": concurrency])
    }
}
