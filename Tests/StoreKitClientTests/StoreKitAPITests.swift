import AppStoreEmulator
import Foundation
import Locking
import StoreKitClient
import StorekeeperTesting
import Synchronization
import Testing

/// Records what a StoreKit 1 observer sees.
final class Recorder: PaymentTransactionObserver {
    let updates = Locked<[(String, StoreKitClient.TransactionState)]>([])
    let restoreFinished = Locked(false)

    func paymentQueue(_ queue: PaymentQueue, updated transactions: [PaymentTransaction]) async {
        updates.withLock { $0 += transactions.map { ($0.productIdentifier, $0.transactionState) } }
    }

    func paymentQueueRestoreCompletedTransactionsFinished(_ queue: PaymentQueue) async {
        restoreFinished.withLock { $0 = true }
    }

    var states: [StoreKitClient.TransactionState] { updates.withLock { $0.map(\.1) } }
}

@Suite("StoreKit 1 payment queue and StoreKit 2 API", .serialized)
struct StoreKitAPITests {
    static func connection(_ world: ClientWorld, _ bundle: String = "com.example.football", account: String = ClientWorld.tester,
                           canMakePayments: Bool = true) async throws -> AppStoreConnection {
        let device = try await world.emulator.signIn(deviceId: nil, email: account, canMakePayments: canMakePayments)
        return AppStoreConnection(baseURL: world.appStoreURL, bundleId: bundle, deviceId: device.id)
    }

    @Test("Observers see purchasing then purchased or failed; unfinished transactions come back at launch and to late observers")
    func paymentQueue() async throws {
        let world = try await ClientWorld.make()
        defer { Task { await world.stop() } }
        let connection = try await Self.connection(world)
        let queue = PaymentQueue(connection: connection)
        #expect(try await queue.canMakePayments())
        let recorder = Recorder()
        await queue.add(recorder)
        await queue.add(Payment(productIdentifier: "GoldenGlobe"))
        await queue.add(Payment(productIdentifier: "EnergyBottle", simulate: "cancel"))
        #expect(recorder.states == [.purchasing, .purchased, .purchasing, .failed])
        let failed = try #require(await queue.transactions.values.first { $0.transactionState == .failed })
        #expect(failed.error?.isCancellation == true)
        try await queue.finish(failed)

        // Next launch: the purchased transaction was never finished, so it is delivered again, even to a late observer.
        let relaunched = PaymentQueue(connection: connection)
        try await relaunched.start()
        let late = Recorder()
        await relaunched.add(late)
        #expect(late.updates.withLock { $0.map(\.0) } == ["GoldenGlobe"])
        for transaction in await relaunched.transactions.values { try await relaunched.finish(transaction) }
        let third = PaymentQueue(connection: connection)
        try await third.start()
        #expect(await third.transactions.isEmpty)

        let restoring = Recorder()
        await third.add(restoring)
        await third.restoreCompletedTransactions()
        #expect(restoring.updates.withLock { $0.map(\.1) } == [.restored])
        #expect(restoring.restoreFinished.withLock { $0 })

        let restricted = PaymentQueue(connection: try await Self.connection(world, canMakePayments: false))
        #expect(try await restricted.canMakePayments() == false)
        let refused = Recorder()
        await restricted.add(refused)
        await restricted.add(Payment(productIdentifier: "GoldenGlobe"))
        #expect(refused.states == [.purchasing, .failed])
    }

    @Test("StoreKit 2: verified purchases with appAccountToken, entitlements, unfinished, finish, sync; another root is unverified")
    func storeKit2() async throws {
        let world = try await ClientWorld.make()
        defer { Task { await world.stop() } }
        let connection = try await Self.connection(world)
        let root = TestSupport.jwsAuthority.root.pem
        let storeKit = try StoreKit2(connection: connection, rootsPEM: root)
        let token = UUID()
        guard case .success(let result) = try await storeKit.purchase("GoldenGlobe", appAccountToken: token) else {
            Issue.record("the purchase did not succeed")
            return
        }
        let transaction = try #require(result.verified)
        #expect(transaction.productID == "GoldenGlobe")
        #expect(transaction.payload.appAccountToken == token.uuidString.lowercased())
        #expect(try await storeKit.currentEntitlements().compactMap(\.verified).map(\.productID) == ["GoldenGlobe"])
        #expect(try await storeKit.unfinished().compactMap(\.verified).map(\.id) == [transaction.id])
        try await storeKit.finish(transaction)
        #expect(try await storeKit.unfinished().isEmpty)
        #expect(try await storeKit.sync().compactMap(\.verified).map(\.productID) == ["GoldenGlobe"])

        let stranger = try StoreKit2(connection: connection, rootsPEM: TestSupport.authority.root.pem)  // the receipt root, not the JWS one
        #expect(stranger.verify(transaction.jwsRepresentation).verified == nil)

        let kid = try StoreKit2(connection: try await Self.connection(world, account: "kid@example.com"), rootsPEM: root)
        guard case .pending = try await kid.purchase("GoldenGlobe") else {
            Issue.record("Ask to Buy should be pending")
            return
        }
    }

    @Test("Transaction.updates yields purchases made on another device and refunds, once each")
    func updates() async throws {
        let world = try await ClientWorld.make()
        defer { Task { await world.stop() } }
        let root = TestSupport.jwsAuthority.root.pem
        let watching = try StoreKit2(connection: try await Self.connection(world), rootsPEM: root)
        let stream = watching.updates(every: .milliseconds(100))
        let collected = Task { () -> [String] in
            var seen: [String] = []
            for await update in stream {
                let transaction = update.unsafePayloadValue
                seen.append(transaction.productID + (transaction.payload.revocationDate == nil ? "" : " revoked"))
                if seen.count == 2 { break }
            }
            return seen
        }
        // The stream's first look only learns what exists (nothing is yielded): the purchase must come after it.
        // One poll to an emulator in this process; 3 s leave room for a loaded machine.
        try await Task.sleep(for: .seconds(3))
        let other = try StoreKit2(connection: try await Self.connection(world), rootsPEM: root)
        guard case .success(let bought) = try await other.purchase("ProtectiveGloves") else { Issue.record("no purchase"); return }
        try await Task.sleep(for: .milliseconds(1200))  // the refund lands in a later second than the purchase
        _ = try await world.emulator.refund(transactionId: bought.unsafePayloadValue.id)
        let seen = try await withThrowingTaskGroup(of: [String].self) { group in
            group.addTask { await collected.value }
            group.addTask { try await Task.sleep(for: .seconds(10)); collected.cancel(); return ["timeout"] }
            let first = try await group.next() ?? []
            group.cancelAll()
            return first
        }
        #expect(seen == ["ProtectiveGloves", "ProtectiveGloves revoked"])
    }
}
