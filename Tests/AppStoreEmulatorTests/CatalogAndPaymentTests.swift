@testable import AppStoreEmulator
import AppStoreModels
import Foundation
import HTTP
import Storage
import StorekeeperTesting
import Testing

@Suite("Catalog, accounts and payments")
struct CatalogAndPaymentTests {
    @Test("Products requests return valid products with localized prices and list invalid identifiers")
    func productsRequest() async throws {
        let world = try await World.make()
        let (status, body) = try await world.client.json(.get, "/device/v1/products?app=com.example.football&device=\(world.device)&ids=ProtectiveGloves,EnergyBottle,Nope")
        #expect(status == 200)
        let products = try #require(body["products"] as? [[String: Any]])
        #expect(products.map { $0["productIdentifier"] as? String } == ["ProtectiveGloves", "EnergyBottle"])
        #expect(products.first?["price"] as? String == "1.99")
        #expect(products.first?["currencyCode"] as? String == "USD")
        #expect(body["invalidProductIdentifiers"] as? [String] == ["Nope"])
    }

    @Test("Review states: production sells only Ready for Sale and cleared; the sandbox sells anything not rejected or removed")
    func reviewStates() async throws {
        let world = try await World.make()
        let app = CatalogApp(bundleId: "com.example.review", appAppleId: 1, name: "Review", sharedSecret: "s", products: [
            CatalogProduct(productId: "ready", type: .consumable, referenceName: "r", prices: [ProductPrice(storefront: "USA", currency: "USD", amount: "1")]),
            CatalogProduct(productId: "waiting", type: .consumable, referenceName: "w", prices: [ProductPrice(storefront: "USA", currency: "USD", amount: "1")], reviewState: .waitingForReview),
            CatalogProduct(productId: "uncleared", type: .consumable, referenceName: "u", prices: [ProductPrice(storefront: "USA", currency: "USD", amount: "1")], clearedForSale: false),
            CatalogProduct(productId: "rejected", type: .consumable, referenceName: "x", prices: [ProductPrice(storefront: "USA", currency: "USD", amount: "1")], reviewState: .rejected),
        ])
        try await world.emulator.register(app: app)
        try await world.emulator.addAccount(email: "customer@example.com", environment: .production)
        let phone = try await world.emulator.signIn(deviceId: nil, email: "customer@example.com")
        let ids = ["ready", "waiting", "uncleared", "rejected"]
        let production = try await world.emulator.products(bundleId: app.bundleId, deviceId: phone.id, ids: ids)
        #expect(production.products.map(\.productIdentifier) == ["ready"])
        #expect(production.invalidProductIdentifiers == ["waiting", "uncleared", "rejected"])
        let sandbox = try await world.emulator.products(bundleId: app.bundleId, deviceId: world.device, ids: ids)
        #expect(sandbox.products.map(\.productIdentifier) == ["ready", "waiting", "uncleared"])
    }

    @Test("Identifiers: bad characters and duplicates are refused; a deleted identifier cannot be reused")
    func identifierRules() async throws {
        let world = try await World.make()
        let price = [ProductPrice(storefront: "USA", currency: "USD", amount: "1")]
        await #expect(throws: StoreError.self) {
            try await world.emulator.register(app: CatalogApp(bundleId: "com.x", appAppleId: 1, name: "x", sharedSecret: "s",
                                                              products: [CatalogProduct(productId: "bad-id", type: .consumable, referenceName: "", prices: price)]))
        }
        await #expect(throws: StoreError.self) {
            try await world.emulator.register(app: CatalogApp(bundleId: "com.x", appAppleId: 1, name: "x", sharedSecret: "s", products: [
                CatalogProduct(productId: "a", type: .consumable, referenceName: "", prices: price),
                CatalogProduct(productId: "a", type: .consumable, referenceName: "", prices: price)]))
        }
        try await world.emulator.deleteProduct(bundleId: "com.example.coins", productId: "Nada.JPYF05")
        var app = try await world.emulator.app("com.example.coins")
        app.products.append(CatalogProduct(productId: "Nada.JPYF05", type: .consumable, referenceName: "again", prices: price))
        let error = await #expect(throws: StoreError.self) { try await world.emulator.register(app: app) }
        #expect(error?.code == "product_id_reused")
    }

    @Test("Quantity must be 1–10, restricted devices cannot pay, unknown products are not available", arguments: [0, 11])
    func paymentErrors(quantity: Int) async throws {
        let world = try await World.make()
        let (status, body) = try await world.client.json(.post, "/device/v1/payments", json: ["app": "com.example.coins", "device": world.device, "productId": "Nada.JPYF01", "quantity": quantity])
        #expect(status == 400)
        #expect((body["error"] as? [String: Any])?["skError"] as? String == "paymentInvalid")
        let restricted = try await world.emulator.signIn(deviceId: nil, email: World.tester, canMakePayments: false)
        let denied = await #expect(throws: StoreError.self) { try await world.buy("com.example.coins", "Nada.JPYF01", device: restricted.id) }
        #expect(denied?.skError == .paymentNotAllowed)
        let missing = await #expect(throws: StoreError.self) { try await world.buy("com.example.coins", "Nada.JPYF99") }
        #expect(missing?.skError == .storeProductNotAvailable)
    }

    @Test("Cancelled and failed payments are failed transactions with SKError codes")
    func cancelAndFail() async throws {
        let world = try await World.make()
        let (status, body) = try await world.client.json(.post, "/device/v1/payments", json: ["app": "com.example.coins", "device": world.device, "productId": "Nada.JPYF01", "simulate": "cancel"])
        #expect(status == 201)
        #expect(body["transactionState"] as? String == "failed")
        #expect((body["error"] as? [String: Any])?["name"] as? String == "paymentCancelled")
        #expect(try await world.emulator.appReceipt(bundleId: "com.example.coins", deviceId: world.device) != nil)
        let verified = try await world.verify(try await world.receipt("com.example.coins"))
        #expect(verified.inApp.isEmpty)
    }

    @Test("Consumables stay in the receipt until finished; unfinished transactions are delivered again")
    func consumableLifecycle() async throws {
        let world = try await World.make()
        #expect(try await world.emulator.appReceipt(bundleId: "com.example.coins", deviceId: world.device) == nil)
        let bought = try await world.buy("com.example.coins", "Nada.JPYF03", quantity: 3)
        #expect(bought.state == .purchased)
        let first = try await world.emulator.pendingTransactions(bundleId: "com.example.coins", deviceId: world.device)
        let again = try await world.emulator.pendingTransactions(bundleId: "com.example.coins", deviceId: world.device)
        #expect(first.map(\.id) == [bought.id])
        #expect(again.map(\.id) == [bought.id])
        let verified = try await world.verify(try await world.receipt("com.example.coins"))
        #expect(verified.inApp.map { $0["transaction_id"] as? String } == [bought.id])
        #expect(verified.inApp.first?["quantity"] as? String == "3")
        _ = try await world.emulator.finish(transactionId: bought.id, deviceId: world.device)
        #expect(try await world.emulator.pendingTransactions(bundleId: "com.example.coins", deviceId: world.device).isEmpty)
        #expect(try await world.verify(try await world.receipt("com.example.coins")).inApp.isEmpty)
    }

    @Test("Buying an owned non-consumable delivers it again without a new receipt entry")
    func nonConsumableRedelivery() async throws {
        let world = try await World.make()
        let first = try await world.buy("com.example.football", "ProtectiveGloves")
        _ = try await world.emulator.finish(transactionId: first.id, deviceId: world.device)
        let second = try await world.buy("com.example.football", "ProtectiveGloves")
        #expect(second.state == .purchased)
        #expect(second.originalId == first.id)
        #expect(second.price == nil)
        let inApp = try await world.verify(try await world.receipt("com.example.football")).inApp
        #expect(inApp.map { $0["transaction_id"] as? String } == [first.id])
    }

    @Test("Restore brings back non-consumables and auto-renewables on a second device, never consumables")
    func restore() async throws {
        let world = try await World.make()
        _ = try await world.buy("com.example.football", "GoldenGlobe")
        _ = try await world.buy("com.example.football", "EnergyBottle")
        let tablet = try await world.emulator.signIn(deviceId: UUID().uuidString, email: World.tester)
        let restored = try await world.emulator.restore(bundleId: "com.example.football", deviceId: tablet.id)
        #expect(restored.map(\.productId) == ["GoldenGlobe"])
        #expect(restored.allSatisfy { $0.state == .restored })
        let (status, body) = try await world.client.json(.post, "/device/v1/restore", json: ["app": "com.example.football", "device": tablet.id])
        #expect(status == 200)
        let transactions = try #require(body["transactions"] as? [[String: Any]])
        #expect(transactions.first?["originalTransactionIdentifier"] as? String != nil)
        #expect(transactions.first?["transactionReceipt"] as? String != nil)
    }

    @Test("Ask to Buy: deferred until a parent approves (purchased) or declines (failed)")
    func askToBuy() async throws {
        let world = try await World.make()
        try await world.emulator.addAccount(email: "kid@example.com", environment: .sandbox, askToBuy: true)
        let phone = try await world.emulator.signIn(deviceId: nil, email: "kid@example.com")
        let first = try await world.buy("com.example.comics", "com.raywenderlich.inapprage.nightlyrage", device: phone.id)
        let second = try await world.buy("com.example.comics", "com.raywenderlich.inapprage.drummerrage", device: phone.id)
        #expect(first.state == .deferred && second.state == .deferred)
        await #expect(throws: StoreError.self) { try await world.emulator.finish(transactionId: first.id, deviceId: phone.id) }
        let approved = try await world.emulator.answerAskToBuy(transactionId: first.id, approve: true)
        let declined = try await world.emulator.answerAskToBuy(transactionId: second.id, approve: false)
        #expect(approved.state == .purchased)
        #expect(declined.state == .failed && declined.error == .paymentCancelled)
        await #expect(throws: StoreError.self) { try await world.emulator.answerAskToBuy(transactionId: first.id, approve: true) }
        let inApp = try await world.verify(try await world.receipt("com.example.comics", device: phone.id)).inApp
        #expect(inApp.map { $0["product_id"] as? String } == ["com.raywenderlich.inapprage.nightlyrage"])
    }

    @Test("Production accounts cannot sign in to unknown devices' sandbox; deleted accounts are rejected")
    func accounts() async throws {
        let world = try await World.make()
        await #expect(throws: StoreError.self) { try await world.emulator.addAccount(email: World.tester, environment: .production) }
        await #expect(throws: StoreError.self) { try await world.emulator.addAccount(email: "not-an-email", environment: .sandbox) }
        try await world.emulator.deleteAccount(email: World.tester)
        let error = await #expect(throws: StoreError.self) { try await world.buy("com.example.coins", "Nada.JPYF01") }
        #expect(error?.skError == .clientInvalid)
    }

    @Test("The payment state machine allows only StoreKit's transitions")
    func stateMachine() throws {
        var machine = PaymentStateMachine()
        #expect(try machine.handle(.needsApproval) == .waitForParent)
        #expect(throws: PaymentStateMachine.InvalidTransition.self) { try machine.handle(.finished) }
        #expect(try machine.handle(.approved) == .deliver)
        #expect(try machine.handle(.finished) == .removeFromQueue)
        #expect(throws: PaymentStateMachine.InvalidTransition.self) { try machine.handle(.finished) }
        var cancelled = PaymentStateMachine()
        #expect(try cancelled.handle(.cancelledByUser) == .reportFailure(.paymentCancelled))
        #expect(throws: PaymentStateMachine.InvalidTransition.self) { try cancelled.handle(.charged) }
    }

    @Test("The whole state survives a restart on SQLite")
    func persistence() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("emulator-\(UUID().uuidString).sqlite").path
        let clock = TestSupport.fixedClock()
        var transactionId = ""
        var deviceId = ""
        do {
            let world = try await World.make(store: try SQLiteDocumentStore(path: path), clock: clock)
            transactionId = try await world.buy("com.example.magazine", "com.example.magazine.monthly").id
            deviceId = world.device
            try await world.emulator.addFault(endpoint: "verifyReceipt", environment: .production, behavior: .status(21005))
            try await world.emulator.advanceTime(by: 600)
        }
        let reopened = try await TestSupport.emulator(store: try SQLiteDocumentStore(path: path), clock: TestSupport.fixedClock())
        #expect(reopened.clock.now() == TestSupport.referenceDate.addingTimeInterval(600))
        #expect(try await reopened.transaction(transactionId).productId == "com.example.magazine.monthly")
        #expect(try await reopened.faults().count == 1)
        #expect(try await reopened.device(deviceId).accountEmail == World.tester)
        // Renewals made before the restart are there, and counters continue without reusing ids.
        let next = try await reopened.addPayment(bundleId: "com.example.coins", deviceId: deviceId, request: PaymentRequest(productId: "Nada.JPYF01"))
        #expect(next.id > transactionId)
    }
}

import SQLiteStorage

@Suite("Environments")
struct EnvironmentTests {
    @Test("A production account cannot buy in a sandbox build, nor a sandbox tester in an App Store build")
    func mismatch() async throws {
        let world = try await World.make()
        try await world.emulator.addAccount(email: "real@example.com", environment: .production)
        let development = try await world.emulator.signIn(deviceId: nil, email: "real@example.com", buildEnvironment: .sandbox)
        let production = try await world.emulator.signIn(deviceId: nil, email: World.tester, buildEnvironment: .production)
        for device in [development.id, production.id] {
            let error = await #expect(throws: StoreError.self) { try await world.buy("com.example.coins", "Nada.JPYF01", device: device) }
            #expect(error?.skError == .clientInvalid)
        }
        let matching = try await world.emulator.signIn(deviceId: nil, email: "real@example.com", buildEnvironment: .production)
        #expect(try await world.buy("com.example.coins", "Nada.JPYF01", device: matching.id).environment == .production)
        let (status, body) = try await world.client.json(.post, "/device/v1/devices", json: ["account": World.tester, "environment": "production"])
        #expect(status == 201)
        let (paymentStatus, payment) = try await world.client.json(.post, "/device/v1/payments", json: ["app": "com.example.coins", "device": body["id"] as? String ?? "", "productId": "Nada.JPYF01"])
        #expect(paymentStatus == 403)
        #expect((payment["error"] as? [String: Any])?["skError"] as? String == "clientInvalid")
    }
}
