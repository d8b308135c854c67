import AppStoreCrypto
import AppStoreModels
import Foundation
@testable import PurchaseServer
import StorekeeperTesting
import Testing

/// Apple's real StoreKit 2 data from `../shared/fixtures/real/`, against Apple's real roots.
@Suite("Real Apple JWS")
struct RealAppleJWSTests {
    static func jws(_ prefix: String) throws -> String {
        String(decoding: try TestSupport.fixtureNamed(prefix: prefix, suffix: ".jws"), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// `compact` with one character of its payload changed (still Base64url).
    static func tampered(_ compact: String) -> String {
        var parts = compact.split(separator: ".").map(String.init)
        var payload = Array(parts[1])
        let index = payload.count / 2
        payload[index] = payload[index] == "A" ? "B" : "A"
        parts[1] = String(payload)
        return parts.joined(separator: ".")
    }

    @Test("The server's verifier accepts Apple's signed transactions at their signedDate and refuses them changed")
    func transactions() throws {
        let inspector = SignedTransactionInspector(trust: try TrustStore.apple())
        let (consumable, environment) = try inspector.inspect(try Self.jws("j05"), bundleIds: ["com.goodheartapp"])
        #expect(environment == .sandbox)
        #expect(consumable.type == "Consumable")
        let (renewal, _) = try inspector.inspect(try Self.jws("j04a"), bundleIds: ["com.psychinsight.psychinsights"])
        #expect(renewal.transactionReason == "RENEWAL")
        #expect(throws: ReceiptRejection.self) { try inspector.inspect(Self.tampered(try Self.jws("j05")), bundleIds: ["com.goodheartapp"]) }
        #expect(throws: ReceiptRejection.self) { try inspector.inspect(try Self.jws("j05"), bundleIds: ["com.example.coins"]) }
        // Verified once, the same bytes pass again (remembered by hash), and a copy with another signature still does not.
        #expect(try inspector.inspect(try Self.jws("j05"), bundleIds: ["com.goodheartapp"]).0 == consumable)
        var parts = try Self.jws("j05").split(separator: ".").map(String.init)
        var signature = Base64URL.decode(parts[2]) ?? []
        signature[signature.count - 1] ^= 1
        parts[2] = Base64URL.encode(signature)
        #expect(throws: ReceiptRejection.self) { try inspector.inspect(parts.joined(separator: "."), bundleIds: ["com.goodheartapp"]) }
    }

    @Test("Apple's real notifications are received (nested JWS verified), once; a changed one is refused")
    func notifications() async throws {
        let database = try await Engine.sqlite.makeDatabase()
        let configuration = PurchaseServer.Configuration(trust: try TrustStore.apple(), endpoints: .apple, transport: NoTransport(),
                                                         adminKey: "sk_admin_real")
        let server = try await PurchaseServer.open(database: database, configuration: configuration)
        try await server.store.createApp(ServerApp(id: "com.psychinsight.psychinsights"), now: Date())
        try await server.store.createApp(ServerApp(id: "com.Abilities"), now: Date())
        let renewal = try Self.jws("j04")
        let received = try await server.receiveNotification(Data(#"{"signedPayload":"\#(renewal)"}"#.utf8))
        #expect(received.notificationType == "DID_RENEW")
        // Nobody here owns that subscription yet, and no user has its appAccountToken as id: it waits, unmatched,
        // for its user's upload (a token is never made into a user).
        #expect(received.outcome == .unmatched)
        #expect(try await server.receiveNotification(Data(#"{"signedPayload":"\#(renewal)"}"#.utf8)).outcome == .duplicate)
        let test = try await server.receiveNotification(Data(#"{"signedPayload":"\#(try Self.jws("j01"))"}"#.utf8))
        #expect(test.notificationType == "TEST" && test.outcome == .recorded)
        await #expect(throws: ServerError.self) {
            try await server.receiveNotification(Data(#"{"signedPayload":"\#(Self.tampered(renewal))"}"#.utf8))
        }
        await database.close()
    }
}

/// A transport for servers that must never call verifyReceipt.
struct NoTransport: HTTPTransport {
    func post(_ url: URL, body: [UInt8], timeout: TimeInterval) async throws -> (status: Int, contentType: String?, body: Data) {
        throw URLError(.notConnectedToInternet)
    }
}
