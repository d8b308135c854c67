import Foundation
@testable import PurchaseServer
import Storage
import Testing

/// The subscriptions table keeps the current period's expiry and revocation: news about an older period (a
/// refund of a past renewal) changes neither, a refund of the current period revokes, an upgrade moves on.
@Suite("Subscription state by period")
struct SubscriptionStateTests {
    static let january: Int64 = 1_767_225_600_000, february: Int64 = 1_769_904_000_000, march: Int64 = 1_772_323_200_000

    func state(expires: Int64?, revoked: Int64?, period: Int64?, signed: Int64) -> SubscriptionState {
        SubscriptionState(originalTransactionId: "1000", productId: "monthly", autoRenewProductId: "monthly", autoRenewStatus: true,
                          expiresDate: expires, expirationIntent: nil, isInBillingRetry: false, gracePeriodExpiresDate: nil, revokedAt: revoked,
                          priceIncreaseStatus: nil, signedDate: signed, periodPurchaseDate: period)
    }

    func stored(_ world: ServerWorld) async throws -> (expires: Int64?, revoked: Int64?) {
        let row = try await world.server.store.database.transaction { db in
            try db.query("SELECT expires_date, revoked_at FROM subscriptions WHERE original_transaction_id = '1000'").first
        }
        return (row?.int("expires_date"), row?.int("revoked_at"))
    }

    @Test("A refund of a past period changes nothing; a refund of the current period revokes; a later period moves on", arguments: Engine.available)
    func periods(_ engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        func record(_ state: SubscriptionState) async throws {
            try await world.server.store.database.transaction { db in
                try SubscriptionRepository(db: db, appId: "com.example.magazine", environment: "Sandbox").record(state)
            }
        }
        // The first period (bought in December, ends January), then its renewal (bought January, ends February).
        try await record(state(expires: Self.january, revoked: nil, period: Self.january - 2_678_400_000, signed: 1))
        try await record(state(expires: Self.february, revoked: nil, period: Self.january, signed: 2))
        // REFUND of the first period, signed later: the current period stands.
        try await record(state(expires: Self.january, revoked: Self.february - 1000, period: Self.january - 2_678_400_000, signed: 3))
        #expect(try await stored(world) == (Self.february, nil))
        // A receipt after a refund of the current period: expiry from what is left, revoked by the latest.
        try await record(state(expires: Self.january, revoked: Self.february - 500, period: Self.january, signed: 4))
        #expect(try await stored(world) == (Self.january, Self.february - 500))
        // A later period (resubscribed, upgraded) moves on, whatever its expiry.
        try await record(state(expires: Self.march, revoked: nil, period: Self.february, signed: 5))
        #expect(try await stored(world) == (Self.march, nil))
        // A state that knows no period (renewal info alone) keeps the expiry it does not know.
        try await record(state(expires: nil, revoked: nil, period: nil, signed: 6))
        #expect(try await stored(world).expires == Self.march)
    }
}
