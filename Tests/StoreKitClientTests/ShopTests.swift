import AppStoreEmulator
import Foundation
import PurchaseServer
import StoreKitClient
import Testing

@Suite("StoreKit client: purchases through the order journal", .serialized)
struct ShopTests {
    static func balance(_ world: ClientWorld, _ bundle: String, _ user: String, _ currency: String) async throws -> Int64 {
        let appId = bundle
        return try await world.server.store.user(appId: appId, appUserId: user, now: Date()).balances[currency] ?? 0
    }

    @Test("Products: localized prices, subscription periods and invalid identifiers")
    func products() async throws {
        let world = try await ClientWorld.make()
        defer { Task { await world.stop() } }
        let shop = try await world.shop()
        let response = try await shop.appStore.products(["Nada.JPYF02", "no.such.product"])
        #expect(response.products.map(\.productIdentifier) == ["Nada.JPYF02"])
        #expect(response.invalidProductIdentifiers == ["no.such.product"])
        let price = try #require(response.products.first).displayPrice()
        #expect(price.contains("$") || price.contains("¥"))
    }

    @Test("A purchase goes created → paid → verified → delivered → finished, granted once on the server")
    func purchase() async throws {
        let world = try await ClientWorld.make()
        defer { Task { await world.stop() } }
        let shop = try await world.shop()
        let order = try await shop.buy("Nada.JPYF02")
        #expect(order.state == .finished)
        #expect(order.verificationId != nil)
        #expect(try await shop.journal.deliveredCounts() == ["Nada.JPYF02": 1])
        #expect(try await Self.balance(world, "com.example.coins", "player", "coins") == 100)
        #expect(try await shop.appStore.unfinishedTransactions().isEmpty)
        let entitlements = try await shop.server.entitlements()
        #expect(entitlements.balances["coins"] == 100)
        #expect(try await shop.server.spend(30, of: "coins", idempotencyKey: "level-3") == 70)
        #expect(try await shop.server.spend(30, of: "coins", idempotencyKey: "level-3") == 70)  // a retry is not spent twice
        await #expect(throws: ClientRefusal.self) { try await shop.server.spend(100, of: "coins", idempotencyKey: "level-4") }
        #expect(try await shop.server.entitlements().balances["coins"] == 70)
    }

    @Test("A crash after any step resumes at the next launch and delivers exactly once", arguments: [OrderState.paid, .uploaded, .verified, .delivered])
    func crashes(after state: OrderState) async throws {
        let world = try await ClientWorld.make()
        defer { Task { await world.stop() } }
        let crashing = try await world.shop(crashAfter: state)
        await #expect(throws: InjectedCrash(after: state)) { try await crashing.buy("Nada.JPYF02") }
        let relaunched = try await world.relaunch(crashing)
        let resumed = try await relaunched.resume()
        #expect(resumed.map(\.state) == [.finished])
        #expect(try await relaunched.journal.deliveredCounts() == ["Nada.JPYF02": 1])
        #expect(try await Self.balance(world, "com.example.coins", "player", "coins") == 100)
        #expect(try await relaunched.appStore.unfinishedTransactions().isEmpty)
        #expect(try await relaunched.resume().isEmpty)  // nothing left to do
    }

    @Test("A crash before the payment charges nothing and delivers nothing")
    func crashBeforePayment() async throws {
        let world = try await ClientWorld.make()
        defer { Task { await world.stop() } }
        let crashing = try await world.shop(crashAfter: .created)
        await #expect(throws: InjectedCrash(after: .created)) { try await crashing.buy("Nada.JPYF02") }
        let relaunched = try await world.relaunch(crashing)
        #expect(try await relaunched.resume().map(\.state) == [.failed])
        #expect(try await relaunched.journal.deliveredCounts().isEmpty)
        #expect(try await relaunched.appStore.unfinishedTransactions().isEmpty)
    }

    @Test("Server down during the upload: the order waits as paid, unfinished at the App Store, and completes later")
    func serverDown() async throws {
        let world = try await ClientWorld.make()
        defer { Task { await world.stop() } }
        let offline = try await world.shop(serverURL: URL(string: "http://127.0.0.1:9")!)
        await #expect(throws: ServerUnavailable.self) { try await offline.buy("Nada.JPYF02") }
        #expect(try await offline.journal.orders().map(\.state) == [.paid])
        #expect(try await offline.appStore.unfinishedTransactions().count == 1)  // not finished before the server confirmed it
        #expect(try await offline.journal.deliveredCounts().isEmpty)
        let online = try await world.relaunch(offline)
        #expect(try await online.resume().map(\.state) == [.finished])
        #expect(try await online.journal.deliveredCounts() == ["Nada.JPYF02": 1])
        #expect(try await Self.balance(world, "com.example.coins", "player", "coins") == 100)
    }

    @Test("Offline, the last entitlements the server gave come from the journal, marked offline")
    func offline() async throws {
        let world = try await ClientWorld.make()
        defer { Task { await world.stop() } }
        let online = try await world.shop()
        _ = try await online.buy("Nada.JPYF02")
        let fresh = try await online.entitlements()
        #expect(!fresh.offline && fresh.entitlements.balances["coins"] == 100)
        let offline = try await world.relaunch(online, serverURL: URL(string: "http://127.0.0.1:9")!)
        let cached = try await offline.entitlements()
        #expect(cached.offline)
        #expect(cached.entitlements.balances["coins"] == 100)
        #expect(cached.savedAt != nil)
    }

    @Test("Cancelled and failed payments deliver nothing; a cancellation is not an error to show")
    func cancelledAndFailed() async throws {
        let world = try await ClientWorld.make()
        defer { Task { await world.stop() } }
        let shop = try await world.shop()
        let cancelled = try await shop.buy("Nada.JPYF02", simulate: "cancel")
        #expect(cancelled.state == .cancelled)
        let failed = try await shop.buy("Nada.JPYF02", simulate: "fail")
        #expect(failed.state == .failed)
        #expect(try await shop.journal.deliveredCounts().isEmpty)
        #expect(try await shop.appStore.unfinishedTransactions().isEmpty)
    }

    @Test("Ask to Buy: deferred, then approved by the parent and delivered at the next launch; a declined one is not")
    func askToBuy() async throws {
        let world = try await ClientWorld.make()
        defer { Task { await world.stop() } }
        let shop = try await world.shop(account: "kid@example.com", user: "kid")
        let order = try await shop.buy("Nada.JPYF02")
        #expect(order.state == .deferred)
        _ = try await world.emulator.answerAskToBuy(transactionId: try #require(order.transactionIdentifier), approve: true)
        #expect(try await shop.resume().map(\.state) == [.finished])
        #expect(try await Self.balance(world, "com.example.coins", "kid", "coins") == 100)
        let declined = try await shop.buy("Nada.JPYF02")
        _ = try await world.emulator.answerAskToBuy(transactionId: try #require(declined.transactionIdentifier), approve: false)
        _ = try await shop.resume()
        #expect(try await shop.journal.deliveredCounts() == ["Nada.JPYF02": 1])
    }

    @Test("A reinstalled app (empty journal) adopts the unfinished purchase and delivers it once")
    func reinstall() async throws {
        let world = try await ClientWorld.make()
        defer { Task { await world.stop() } }
        let before = try await world.shop(crashAfter: .paid)
        await #expect(throws: InjectedCrash(after: .paid)) { try await before.buy("Nada.JPYF02") }
        let reinstalled = try await world.relaunch(before, journal: "fresh-journal")
        #expect(try await reinstalled.resume().map(\.state) == [.finished])
        #expect(try await reinstalled.journal.deliveredCounts() == ["Nada.JPYF02": 1])
        #expect(try await Self.balance(world, "com.example.coins", "player", "coins") == 100)
    }

    @Test("Restore on a second device signed in to the same account re-grants the non-consumable")
    func restoreOnSecondDevice() async throws {
        let world = try await ClientWorld.make()
        defer { Task { await world.stop() } }
        let first = try await world.shop("com.example.football", user: "owner")
        #expect(try await first.buy("GoldenGlobe").state == .finished)
        let second = try await world.shop("com.example.football", user: "owner", journal: "second-device")
        let verdict = try await second.restore()
        #expect(verdict?.state == "verified")
        let entitlements = try await second.server.entitlements()
        #expect(entitlements.entitlements.filter(\.active).map(\.id) == ["golden_globe"])
    }
}

@Suite("StoreKit client: receipts as proof")
struct ReceiptProofTests {
    @Test("With the app receipt as proof the server verifies it through verifyReceipt and the order completes once")
    func receiptProof() async throws {
        let world = try await ClientWorld.make()
        defer { Task { await world.stop() } }
        let template = try await world.shop()
        let shop = Shop(appStore: template.appStore, server: template.server, journal: template.journal, proof: .receipt)
        #expect(try await shop.buy("Nada.JPYF02").state == .finished)
        #expect(try await shop.buy("Nada.JPYF02").state == .finished)
        #expect(try await shop.journal.deliveredCounts() == ["Nada.JPYF02": 2])
        #expect(try await world.server.store.user(appId: "com.example.coins", appUserId: "player", now: Date()).balances["coins"] == 200)
    }
}
