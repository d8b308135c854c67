import AppStoreCrypto
@testable import AppStoreEmulator
import AppStoreModels
import Clocks
import Foundation
import HTTP
@testable import PurchaseServer
import StorekeeperTesting
import Testing

@Suite("Purchase flows", .serialized)
struct PurchaseFlowTests {
    @Test("Coins: a consumable credits its balance once, however often the receipt is uploaded", arguments: Engine.available)
    func coins(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let (bought, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        let first = try await world.upload("com.example.coins", user: "alice", receipt: receipt)
        #expect(first.state == "verified")
        #expect(first.granted == [bought.id])
        let second = try await world.upload("com.example.coins", user: "alice", receipt: receipt)
        #expect(second.state == "verified")
        #expect(second.granted.isEmpty)
        let (bought2, receipt2) = try await world.buy("com.example.coins", "Nada.JPYF01", quantity: 2)
        _ = try await world.upload("com.example.coins", user: "alice", receipt: receipt2)
        let alice = try await world.user("com.example.coins", "alice")
        #expect(alice.balances == ["coins": 140])
        // Each purchase listed once, though the user both owns its chain and was credited it (two ways the read finds it).
        let listed = (alice["transactions"] as? [[String: Any]])?.compactMap { $0["transactionId"] as? String }
        #expect(listed == [bought.id, bought2.id])
    }

    @Test("Verification ids and audit ids come from the injected id source, not from UUID()")
    func injectedIdentifiers() async throws {
        let world = try await ServerWorld.make(.sqlite, ids: SequentialIDs(prefix: 7))
        defer { Task { await world.stop() } }
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        let first = try await world.upload("com.example.coins", user: "alice", receipt: receipt)
        let second = try await world.upload("com.example.coins", user: "bob", receipt: "not a receipt at all, refused before the queue")
        let generated = SequentialIDs(prefix: 7)
        let expected = (0..<10).map { _ in generated.nextString() }
        let firstId = try #require(first["verificationId"] as? String)
        let secondId = try #require(second["verificationId"] as? String)
        #expect(expected.contains(firstId) && expected.contains(secondId) && firstId != secondId)
        #expect(expected.firstIndex(of: firstId)! < expected.firstIndex(of: secondId)!)
    }

    @Test("Concurrent uploads of one receipt grant once", arguments: Engine.available)
    func concurrentDuplicates(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF03")
        try await withThrowingTaskGroup(of: String?.self) { group in
            for _ in 0..<20 { group.addTask { try await world.upload("com.example.coins", user: "alice", receipt: receipt).state } }
            for try await state in group { #expect(state == "verified") }
        }
        #expect(try await world.user("com.example.coins", "alice").balances == ["coins": 600])
        let rows = try await world.server.store.database.transaction { db in try db.query("SELECT COUNT(*) AS n FROM ledger").first?.int("n") }
        #expect(rows == 1)
    }

    @Test("Football: gloves and golden globe owned, energy bottles counted, restore on a new device", arguments: Engine.available)
    func football(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        _ = try await world.buy("com.example.football", "ProtectiveGloves")
        _ = try await world.buy("com.example.football", "EnergyBottle")
        _ = try await world.buy("com.example.football", "EnergyBottle")
        let (_, receipt) = try await world.buy("com.example.football", "GoldenGlobe")
        _ = try await world.upload("com.example.football", user: "player", receipt: receipt)
        let player = try await world.user("com.example.football", "player")
        #expect(Set(player.entitlementIds) == ["protective_gloves", "golden_globe"])
        #expect(player.balances == ["energy_bottles": 2])
        // A re-installed app on a new device: restore, refresh the receipt, upload it as a restore.
        let tablet = try await world.emulator.signIn(deviceId: UUID().uuidString, email: ServerWorld.tester)
        _ = try await world.emulator.restore(bundleId: "com.example.football", deviceId: tablet.id)
        let restoredReceipt = try await world.emulator.appReceipt(bundleId: "com.example.football", deviceId: tablet.id, refresh: true)!.base64EncodedString()
        let restored = try await world.upload("com.example.football", user: "player", receipt: restoredReceipt, path: "restore")
        #expect(restored.state == "verified")
        let after = try await world.user("com.example.football", "player")
        #expect(Set(after.entitlementIds) == ["protective_gloves", "golden_globe"])
        #expect(after.balances == ["energy_bottles": 2])
    }

    @Test("Replay across users: rejected by default, transferred or shared when the policy says so", arguments: Engine.available)
    func replayPolicies(engine: Engine) async throws {
        for policy in ReplayPolicy.allCases {
            let world = try await ServerWorld.make(engine) { $0.replayPolicy = policy }
            let (_, receipt) = try await world.buy("com.example.football", "GoldenGlobe")
            _ = try await world.upload("com.example.football", user: "first", receipt: receipt)
            let second = try await world.upload("com.example.football", user: "second", receipt: receipt)
            let firstOwns = try await world.user("com.example.football", "first").entitlementIds.contains("golden_globe")
            let secondOwns = try await world.user("com.example.football", "second").entitlementIds.contains("golden_globe")
            switch policy {
            case .reject:
                #expect(second.state == "rejected")
                #expect((second["reason"] as? String)?.contains("bound to another user") == true)
                #expect(firstOwns && !secondOwns)
            case .transfer:
                #expect(second.state == "verified")
                #expect(!firstOwns && secondOwns)
            case .share:
                #expect(firstOwns && secondOwns)
            }
            // Consumables never move between users, whatever the policy.
            let (bottle, coins) = try await world.buy("com.example.football", "EnergyBottle")
            _ = try await world.upload("com.example.football", user: "first", receipt: coins)
            let stolen = try await world.upload("com.example.football", user: "third", receipt: coins)
            #expect(try await world.user("com.example.football", "third").balances["energy_bottles"] == nil)
            let refused = ((stolen["result"] as? [String: Any])?["refused"] as? [[String: Any]] ?? []).compactMap { $0["transactionId"] as? String }
            #expect(refused.contains(bottle.id))
            await world.stop()
        }
    }

    @Test("Forged receipts are refused with clear reasons", arguments: Engine.available)
    func forgeries(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        // Signed by a CA the server does not trust.
        let stranger = try CertificateAuthority.generate()
        let fake = AppReceipt(receiptType: .productionSandbox, bundleId: "com.example.coins", applicationVersion: "1", creationDate: TestSupport.referenceDate,
                              inApp: [InAppPurchase(productId: "Nada.JPYF03", transactionId: "2000000099999999", purchaseDate: TestSupport.referenceDate)])
        let selfSigned = Data(try SignedData.sign(payload: ReceiptPayload.encode(fake), key: stranger.leafKey, chain: stranger.chain)).base64EncodedString()
        let untrusted = try await world.upload("com.example.coins", user: "mallory", receipt: selfSigned)
        #expect(untrusted.state == "rejected")
        #expect((untrusted["reason"] as? String)?.contains("not trusted") == true)
        // A genuine receipt of another app.
        let (_, comics) = try await world.buy("com.example.comics", "com.raywenderlich.inapprage.nightlyrage")
        let other = try await world.upload("com.example.coins", user: "mallory", receipt: comics)
        #expect(other.state == "rejected")
        #expect((other["reason"] as? String)?.contains("com.example.comics") == true)
        // A genuine receipt with an edited payload.
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF01")
        var bytes = [UInt8](Data(base64Encoded: receipt)!)
        let needle = Array("Nada.JPYF01".utf8)
        let index = (0..<(bytes.count - needle.count)).first { Array(bytes[$0..<($0 + needle.count)]) == needle }!
        bytes[index + needle.count - 1] = UInt8(ascii: "3")
        let tampered = try await world.upload("com.example.coins", user: "mallory", receipt: Data(bytes).base64EncodedString())
        #expect(tampered.state == "rejected")
        #expect((tampered["reason"] as? String)?.contains("signature") == true)
        for garbage in ["not base64!", Data("hello".utf8).base64EncodedString()] {
            #expect(try await world.upload("com.example.coins", user: "mallory", receipt: garbage).state == "rejected")
        }
        #expect(try await world.user("com.example.coins", "mallory").balances.isEmpty)
    }

    @Test("Sandbox purchases reach production users only on the allow-list", arguments: Engine.available)
    func sandboxAllowList(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine) { app in
            app.sandboxPolicy = .allowList
            app.sandboxAllowList = ["app-review"]
        }
        defer { Task { await world.stop() } }
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        let refused = try await world.upload("com.example.coins", user: "customer", receipt: receipt)
        #expect(refused.state == "rejected")
        #expect((refused["reason"] as? String)?.contains("allow-list") == true)
        let reviewer = try await world.upload("com.example.coins", user: "app-review", receipt: receipt)
        #expect(reviewer.state == "verified")
    }

    @Test("Two users on one Apple ID (a family iPad): each upload names its consumable and each gets their own", arguments: Engine.available)
    func sharedReceipt(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let (alices, _) = try await world.buy("com.example.coins", "Nada.JPYF02")
        let (bobs, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")  // the same device: the receipt holds both
        func upload(_ user: String, naming transaction: String) async throws -> [String: Any] {
            let (_, body) = try await world.client.json(.post, "/v1/receipts?wait=10",
                                                        json: ["appUserId": user, "receiptData": receipt, "transactionId": transaction, "productId": "Nada.JPYF02"],
                                                        headers: ["Authorization": "Bearer \(world.keys["com.example.coins"]!)"])
            return body
        }
        let bob = try await upload("bob", naming: bobs.id)
        #expect(bob.state == "verified" && bob.granted == [bobs.id])
        #expect(((bob["result"] as? [String: Any])?["deferred"] as? [String]) == [alices.id])
        let alice = try await upload("alice", naming: alices.id)
        #expect(alice.state == "verified" && alice.granted == [alices.id])
        #expect(try await world.user("com.example.coins", "bob").balances == ["coins": 100])
        #expect(try await world.user("com.example.coins", "alice").balances == ["coins": 100])

        let (status, bad) = try await world.client.json(.post, "/v1/receipts", json: ["appUserId": "bob", "receiptData": receipt, "transactionId": "12a"],
                                                        headers: ["Authorization": "Bearer \(world.keys["com.example.coins"]!)"])
        #expect(status == 400 && (bad["error"] as? [String: Any])?["code"] as? String == "invalid_transaction_id")
        // A NUL inside the receipt or the signed transaction is refused at the edge (PostgreSQL's text cannot hold one).
        for (field, path, code) in [("receiptData", "/v1/receipts", "invalid_receipt"), ("signedTransaction", "/v1/transactions", "invalid_transaction")] {
            let (status, refused) = try await world.client.json(.post, path, json: ["appUserId": "bob", field: String(receipt.prefix(100)) + "\u{0}" + String(receipt.dropFirst(100))],
                                                                headers: ["Authorization": "Bearer \(world.keys["com.example.coins"]!)"])
            #expect(status == 400 && (refused["error"] as? [String: Any])?["code"] as? String == code)
        }
    }

    @Test("A refund revokes the entitlement and claws back credit; a negative balance flags the user", arguments: Engine.available)
    func refunds(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let (coin, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        _ = try await world.upload("com.example.coins", user: "alice", receipt: receipt)
        let (status, spent) = try await world.client.json(.post, "/v1/users/alice/balances/coins/spend", json: ["amount": 80],
                                                          headers: ["Authorization": "Bearer \(world.keys["com.example.coins"]!)", "Idempotency-Key": "k1"])
        #expect(status == 200)
        #expect(spent["balance"] as? Int == 20)
        _ = try await world.emulator.refund(transactionId: coin.id)
        let refreshed = try await world.emulator.appReceipt(bundleId: "com.example.coins", deviceId: world.device, refresh: true)!.base64EncodedString()
        let again = try await world.upload("com.example.coins", user: "alice", receipt: refreshed)
        #expect((again["result"] as? [String: Any])?["revoked"] as? [String] == [coin.id])
        let alice = try await world.user("com.example.coins", "alice")
        #expect(alice.balances == ["coins": -80])
        #expect(alice["flagged"] as? Bool == true)

        let (gloves, glovesReceipt) = try await world.buy("com.example.football", "ProtectiveGloves")
        _ = try await world.upload("com.example.football", user: "bob", receipt: glovesReceipt)
        #expect(try await world.user("com.example.football", "bob").entitlementIds == ["protective_gloves"])
        _ = try await world.emulator.refund(transactionId: gloves.id, reason: 1)
        let after = try await world.emulator.appReceipt(bundleId: "com.example.football", deviceId: world.device, refresh: true)!.base64EncodedString()
        _ = try await world.upload("com.example.football", user: "bob", receipt: after)
        #expect(try await world.user("com.example.football", "bob").entitlementIds.isEmpty)
    }

    @Test("Spending is idempotent and never goes below zero", arguments: Engine.available)
    func spending(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        _ = try await world.upload("com.example.coins", user: "alice", receipt: receipt)
        let headers = ["Authorization": "Bearer \(world.keys["com.example.coins"]!)", "Idempotency-Key": "order-1"]
        let (firstStatus, first) = try await world.client.json(.post, "/v1/users/alice/balances/coins/spend", json: ["amount": 60], headers: headers)
        let (_, replay) = try await world.client.json(.post, "/v1/users/alice/balances/coins/spend", json: ["amount": 60], headers: headers)
        #expect(firstStatus == 200 && first["balance"] as? Int == 40)
        #expect(replay["balance"] as? Int == 40 && replay["replayed"] as? Bool == true)
        let (tooMuch, error) = try await world.client.json(.post, "/v1/users/alice/balances/coins/spend", json: ["amount": 41],
                                                           headers: ["Authorization": headers["Authorization"]!, "Idempotency-Key": "order-2"])
        #expect(tooMuch == 409)
        #expect((error["error"] as? [String: Any])?["code"] as? String == "insufficient_balance")
        let (missingKey, _) = try await world.client.json(.post, "/v1/users/alice/balances/coins/spend", json: ["amount": 1],
                                                          headers: ["Authorization": headers["Authorization"]!])
        #expect(missingKey == 400)
        #expect(try await world.user("com.example.coins", "alice").balances == ["coins": 40])
    }

    @Test("Subscriptions follow renewals in latest_receipt_info; non-renewing passes run back to back", arguments: Engine.available)
    func subscriptions(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let (_, receipt) = try await world.buy("com.example.magazine", "com.example.magazine.monthly")
        _ = try await world.upload("com.example.magazine", user: "reader", receipt: receipt)
        var reader = try await world.user("com.example.magazine", "reader")
        #expect(reader.entitlementIds == ["magazine"])
        try await world.emulator.advanceTime(by: 180 + 300 * 3)
        #expect(try await world.user("com.example.magazine", "reader").entitlementIds.isEmpty)
        _ = try await world.upload("com.example.magazine", user: "reader", receipt: receipt)
        reader = try await world.user("com.example.magazine", "reader")
        #expect(reader.entitlementIds == ["magazine"])
        #expect((reader["subscriptions"] as? [[String: Any]])?.first?["state"] as? String == "active")
        #expect((reader["transactions"] as? [Any])?.count == 5)

        _ = try await world.buy("com.example.magazine", "com.example.magazine.weekpass", device: nil)
        let (_, passes) = try await world.buy("com.example.magazine", "com.example.magazine.weekpass")
        _ = try await world.upload("com.example.magazine", user: "commuter", receipt: passes)
        let commuter = try await world.user("com.example.magazine", "commuter")
        let pass = (commuter["entitlements"] as? [[String: Any]])?.first { $0["source"] as? String == "non-renewing" }
        let expires = try #require(pass?["expiresDate"] as? Int64)
        let purchase = ReceiptDate.milliseconds(world.emulator.clock.now())
        #expect(expires - purchase > 13 * 86_400_000)
    }

    @Test("The revenue report reconciles with the ledger to the cent", arguments: Engine.available)
    func revenue(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        _ = try await world.buy("com.example.football", "EnergyBottle", quantity: 3)
        let (refunded, _) = try await world.buy("com.example.football", "ProtectiveGloves")
        let (_, receipt) = try await world.buy("com.example.football", "GoldenGlobe")
        _ = try await world.upload("com.example.football", user: "p", receipt: receipt)
        _ = try await world.emulator.refund(transactionId: refunded.id)
        _ = try await world.upload("com.example.football", user: "p", receipt: try await world.emulator.appReceipt(bundleId: "com.example.football", deviceId: world.device, refresh: true)!.base64EncodedString())
        let report = try await world.server.store.revenue(appId: "com.example.football", from: TestSupport.referenceDate.addingTimeInterval(-86400),
                                                          to: TestSupport.referenceDate.addingTimeInterval(86400 * 2), group: [.currency])
        let row = try #require(report.rows.first)
        #expect(row.transactions == 3)
        #expect(row.units == 5)
        #expect(row.gross == "7.95")   // 3 × 0.99 + 1.99 + 2.99
        #expect(row.refunded == "1.99")
        #expect(row.net == "5.96")
        #expect(report.totals == ["USD": "5.96"])
    }
}
