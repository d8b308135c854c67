import AppStoreCrypto
@testable import AppStoreEmulator
import AppStoreModels
import Foundation
import StorekeeperTesting
import Testing

/// The fields Apple added to signed transactions and renewal info in 2025: appTransactionId, offerPeriod,
/// offerDiscountType, revocationType and revocationPercentage, and Server API lookups by appTransactionId.
@Suite("Signed transaction fields of 2025")
struct TransactionFieldsTests {
    func payload(_ jws: String) throws -> JSONValue { try JWS(compact: jws).payloadJSON() }

    @Test("An introductory trial says its period and discount type; appTransactionId is the AppTransaction's")
    func offersAndAppTransaction() async throws {
        let world = try await World.make()
        let bought = try await world.buy("com.example.magazine", "com.example.magazine.monthly")
        let transaction = try payload(try await world.emulator.signedTransaction(transactionId: bought.id))
        #expect(transaction["offerType"]?.int64 == 1)
        #expect(transaction["offerDiscountType"]?.text == "FREE_TRIAL")
        #expect(transaction["offerPeriod"]?.text == "P1W")
        let appTransaction = try payload(try await world.emulator.signedAppTransaction(bundleId: "com.example.magazine", deviceId: world.device, nonce: UUID()))
        let appTransactionId = try #require(appTransaction["appTransactionId"]?.text)
        #expect(transaction["appTransactionId"]?.text == appTransactionId)
        // Another app of the same account has another download id.
        let gloves = try await world.buy("com.example.football", "ProtectiveGloves")
        let other = try payload(try await world.emulator.signedTransaction(transactionId: gloves.id))
        #expect(other["appTransactionId"]?.text != appTransactionId && other["offerType"] == nil && other["offerPeriod"] == nil)
        // The Server API takes the appTransactionId where it takes a transaction id: it stands for the latest transaction.
        let resolved = try await world.emulator.serverAPIRecord(bundleId: "com.example.magazine", environment: .sandbox, transactionId: appTransactionId)
        #expect(resolved.id == bought.id)
        await #expect(throws: ServerAPIError.self) {
            _ = try await world.emulator.serverAPIRecord(bundleId: "com.example.coins", environment: .sandbox, transactionId: appTransactionId)
        }
        let renewal = try #require(try await world.emulator.read { state, _ in state.chains[bought.originalId] })
        let info = try payload(try world.emulator.signedRenewalInfo(renewal, latest: bought, signedAt: Date()))
        #expect(info["appTransactionId"]?.text == appTransactionId)
    }

    @Test("A refund is REFUND_FULL at 100000 milliunits; a family member's copy that goes is FAMILY_REVOKE")
    func revocations() async throws {
        let world = try await World.make()
        let bought = try await world.buy("com.example.football", "ProtectiveGloves")
        #expect(try payload(try await world.emulator.signedTransaction(transactionId: bought.id))["revocationType"] == nil)
        _ = try await world.emulator.refund(transactionId: bought.id)
        let refunded = try payload(try await world.emulator.signedTransaction(transactionId: bought.id))
        #expect(refunded["revocationType"]?.text == "REFUND_FULL" && refunded["revocationPercentage"]?.int64 == 100_000)
        #expect(refunded["revocationDate"] != nil)
        // Family Sharing: the member's copy of a shareable purchase is revoked when the member leaves.
        try await world.emulator.addAccount(email: "kid@example.com", environment: .sandbox)
        _ = try await world.emulator.setFamily(email: World.tester, family: "f")
        _ = try await world.emulator.setFamily(email: "kid@example.com", family: "f")
        let shared = try await world.buy("com.example.football", "GoldenGlobe")  // the family-shareable one
        let copy = try #require(try await world.emulator.read { state, _ in state.transactions.values.first { $0.sharedFromTransactionId == shared.id } })
        #expect(try payload(try await world.emulator.signedTransaction(transactionId: copy.id))["inAppOwnershipType"]?.text == "FAMILY_SHARED")
        _ = try await world.emulator.setFamily(email: "kid@example.com", family: nil)
        let gone = try payload(try await world.emulator.signedTransaction(transactionId: copy.id))
        #expect(gone["revocationType"]?.text == "FAMILY_REVOKE" && gone["revocationPercentage"] == nil)
    }
}
