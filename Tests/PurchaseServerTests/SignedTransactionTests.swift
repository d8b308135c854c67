import AppStoreCrypto
@testable import AppStoreEmulator
import AppStoreModels
import Foundation
@testable import PurchaseServer
import StorekeeperTesting
import Testing

@Suite("StoreKit 2 signed transactions", .serialized)
struct SignedTransactionTests {
    @Test("A signed transaction is granted without calling Apple, once, and shares the ledger with receipts", arguments: Engine.available)
    func grantedOnce(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let (bought, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        let signed = try await world.emulator.signedTransaction(transactionId: bought.id)
        let callsBefore = world.transport.calls.withLock { $0 }
        let (status, first) = try await world.postTransaction("com.example.coins", user: "alice", signed: signed)
        #expect(status == 200)
        #expect(first.state == "verified")
        #expect(first.granted == [bought.id])
        #expect(first["environment"] as? String == "Sandbox")
        #expect(world.transport.calls.withLock { $0 } == callsBefore)
        let (_, again) = try await world.postTransaction("com.example.coins", user: "alice", signed: signed)
        #expect(again.state == "verified" && again.granted.isEmpty)
        // The receipt of the same purchase finds it in the ledger already.
        let viaReceipt = try await world.upload("com.example.coins", user: "alice", receipt: receipt)
        #expect(viaReceipt.state == "verified" && viaReceipt.granted.isEmpty)
        #expect(try await world.user("com.example.coins", "alice").balances == ["coins": 100])
    }

    @Test("Non-consumables unlock their entitlement; replay to another user is refused by default", arguments: Engine.available)
    func entitlementAndReplay(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let (bought, _) = try await world.buy("com.example.football", "GoldenGlobe")
        let signed = try await world.emulator.signedTransaction(transactionId: bought.id)
        _ = try await world.postTransaction("com.example.football", user: "alice", signed: signed)
        #expect(try await world.user("com.example.football", "alice").entitlementIds == ["golden_globe"])
        let (_, replay) = try await world.postTransaction("com.example.football", user: "mallory", signed: signed)
        #expect(replay.state == "rejected")
        #expect(try await world.user("com.example.football", "mallory").entitlementIds.isEmpty)
    }

    @Test("Forged, tampered, foreign-bundle and mis-bound transactions are refused with their reasons", arguments: Engine.available)
    func refusals(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let (bought, _) = try await world.buy("com.example.coins", "Nada.JPYF03")
        let record = try await world.emulator.transaction(bought.id)
        let payload = AppStoreEmulator.jwsTransaction(record, signedAt: Date())

        let stranger = try CertificateAuthority.generate(algorithm: .ecP256)
        let forged = try JWS.sign(payload: payload.jsonBytes(), key: stranger.leafKey, chain: stranger.chain)
        #expect(try await world.postTransaction("com.example.coins", user: "alice", signed: forged).1["reason"] as? String
                    == "the transaction's certificate chain is not trusted: invalid_certificate_chain: certificate chain rejected: unable to get local issuer certificate")

        let genuine = try await world.emulator.signedTransaction(transactionId: bought.id).split(separator: ".").map(String.init)
        var inflated = payload
        inflated.quantity = 10
        let tampered = genuine[0] + "." + Base64URL.encode(inflated.jsonBytes()) + "." + genuine[2]
        #expect(try await world.postTransaction("com.example.coins", user: "alice", signed: tampered).1["reason"] as? String
                    == "the transaction's signature is invalid")

        var elsewhere = payload
        elsewhere.bundleId = "com.example.football"
        let otherBundle = try JWS.sign(payload: elsewhere.jsonBytes(), key: TestSupport.jwsAuthority.leafKey, chain: TestSupport.jwsAuthority.chain)
        #expect(try await world.postTransaction("com.example.coins", user: "alice", signed: otherBundle).1["reason"] as? String
                    == "transaction is for bundle id 'com.example.football', which this app does not accept")

        var xcode = payload
        xcode.environment = "Xcode"
        let local = try JWS.sign(payload: xcode.jsonBytes(), key: TestSupport.jwsAuthority.leafKey, chain: TestSupport.jwsAuthority.chain)
        #expect(try await world.postTransaction("com.example.coins", user: "alice", signed: local).1.state == "rejected")

        var bound = payload
        bound.appAccountToken = "5b4e7a1c-0d8e-4c43-9a4e-2f2b6f3f6c11"
        let tokened = try JWS.sign(payload: bound.jsonBytes(), key: TestSupport.jwsAuthority.leafKey, chain: TestSupport.jwsAuthority.chain)
        let (_, mismatch) = try await world.postTransaction("com.example.coins", user: "0d6c8c1e-9a2b-4f4f-8a53-6f0c1b3d2e71", signed: tokened)
        #expect(mismatch.state == "rejected")
        let (_, matching) = try await world.postTransaction("com.example.coins", user: "5B4E7A1C-0D8E-4C43-9A4E-2F2B6F3F6C11", signed: tokened)
        #expect(matching.state == "verified")

        // A user id that is not a UUID: its token is the version-5 UUID of the id; anyone else's is refused.
        var named = payload
        named.transactionId = "2000000000000777"
        named.originalTransactionId = "2000000000000777"
        named.appAccountToken = AppAccountToken.token(for: "bob").uuidString.lowercased()
        let forBob = try JWS.sign(payload: named.jsonBytes(), key: TestSupport.jwsAuthority.leafKey, chain: TestSupport.jwsAuthority.chain)
        let (_, stolen) = try await world.postTransaction("com.example.coins", user: "mallory", signed: forBob)
        #expect(stolen.state == "rejected")
        #expect(stolen["reason"] as? String == "the transaction was bought for app account \(named.appAccountToken!), not for user mallory")
        #expect(try await world.user("com.example.coins", "mallory").balances.isEmpty)
        let (_, delivered) = try await world.postTransaction("com.example.coins", user: "bob", signed: forBob)
        #expect(delivered.state == "verified")

        // A user id Foundation's parser on Linux reads as a UUID (it skips the space and reads 7d0c3c4 as 07d0c3c4) is
        // not one here: a purchase bound to that UUID is not this user's.
        var spelled = payload
        spelled.transactionId = "2000000000000778"
        spelled.originalTransactionId = "2000000000000778"
        spelled.appAccountToken = "7d0c3c04-6a8e-4f0e-9d3a-2c5e8f1a7b64"
        let forUUID = try JWS.sign(payload: spelled.jsonBytes(), key: TestSupport.jwsAuthority.leafKey, chain: TestSupport.jwsAuthority.chain)
        let (_, lax) = try await world.postTransaction("com.example.coins", user: " 7d0c3c4-6a8e-4f0e-9d3a-2c5e8f1a7b64", signed: forUUID)
        #expect(lax.state == "rejected")
        #expect(lax["reason"] as? String
                    == "the transaction was bought for app account \(spelled.appAccountToken!), not for user  7d0c3c4-6a8e-4f0e-9d3a-2c5e8f1a7b64")
        #expect(try await world.postTransaction("com.example.coins", user: "7D0C3C04-6A8E-4F0E-9D3A-2C5E8F1A7B64", signed: forUUID).1.state == "verified")

        let (status, missing) = try await world.client.json(.post, "/v1/transactions", json: ["appUserId": "alice"],
                                                             headers: ["Authorization": "Bearer \(world.keys["com.example.coins"]!)"])
        #expect(status == 400)
        #expect((missing["error"] as? [String: Any])?["code"] as? String == "missing_transaction")
        #expect(try await world.user("com.example.coins", "alice").balances.isEmpty)
    }
}
