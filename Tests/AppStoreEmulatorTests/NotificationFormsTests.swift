@testable import AppStoreEmulator
import AppStoreCrypto
import AppStoreModels
import Foundation
import StorekeeperTesting
import Testing

/// Notification forms Apple sends that the emulator sends too: a reverted downgrade, auto-renew turned back on by
/// buying again, auto-renew turned off by a refund request, a price increase that needs no consent.
@Suite("Notification forms")
struct NotificationFormsTests {
    static let app = "com.example.magazine"

    /// Every notification sent so far about the chain, in order, as "TYPE/SUBTYPE".
    func sent(_ world: World, chain original: String) async throws -> [String] {
        try await world.emulator.read { state, _ in
            state.notifications.values.filter { $0.originalTransactionId == original }.sorted { $0.createdAt < $1.createdAt || ($0.createdAt == $1.createdAt && $0.signedPayload < $1.signedPayload) }
                .map { [$0.notificationType.rawValue, $0.subtype?.rawValue].compactMap { $0 }.joined(separator: "/") }
        }
    }

    func types(_ world: World, _ original: String) async throws -> Set<String> { Set(try await sent(world, chain: original)) }

    @Test("Renewals and expiries are found however the clock moves: operations in between that change no subscription do not hide them")
    func dueWithoutChanges() async throws {
        let clock = TestSupport.fixedClock()
        let world = try await World.make(clock: clock)
        try await world.emulator.setNotificationURLs(bundleId: Self.app, NotificationURLs(sandbox: "http://127.0.0.1:9/none"))
        func quietOperations() async throws {
            // A consumable purchase and a read change no subscription; each is an operation that asks what is due.
            _ = try await world.buy("com.example.coins", "Nada.JPYF01")
            _ = try await world.verify(try await world.receipt("com.example.coins"))
        }
        // A subscription that will lapse (auto-renew off), alone: its expiry is the only thing ahead.
        let lapsing = try await world.buy(Self.app, "com.example.magazine.monthly")
        _ = try await world.emulator.setAutoRenew(originalTransactionId: lapsing.originalId, enabled: false)
        try await quietOperations()
        #expect(try await sent(world, chain: lapsing.originalId).contains("EXPIRED/VOLUNTARY") == false)
        // The clock passes it without an operation; the next one finds it.
        clock.advance(by: try #require(lapsing.expiresDate).timeIntervalSince(clock.now()) + 1)
        try await quietOperations()
        #expect(try await sent(world, chain: lapsing.originalId).contains("EXPIRED/VOLUNTARY"))

        // Then one that renews, on another account, alone again.
        try await world.emulator.addAccount(email: "second@example.com", environment: .sandbox)
        let secondDevice = try await world.emulator.signIn(deviceId: nil, email: "second@example.com")
        let renewing = try await world.buy(Self.app, "com.example.magazine.monthly", device: secondDevice.id)
        try await quietOperations()
        #expect(try await sent(world, chain: renewing.originalId).contains("DID_RENEW") == false)
        clock.advance(by: try #require(renewing.expiresDate).timeIntervalSince(clock.now()) + 1)
        try await quietOperations()
        #expect(try await sent(world, chain: renewing.originalId).contains("DID_RENEW"))
    }

    @Test("Buying the current product again reverts a pending downgrade (no subtype) and turns auto-renew back on")
    func revertAndResubscribe() async throws {
        let world = try await World.make()
        try await world.emulator.setNotificationURLs(bundleId: Self.app, NotificationURLs(sandbox: "http://127.0.0.1:9/none"))
        let yearly = try await world.buy(Self.app, "com.example.magazine.yearly")
        _ = try await world.buy(Self.app, "com.example.magazine.monthly")
        #expect(try await types(world, yearly.originalId).contains("DID_CHANGE_RENEWAL_PREF/DOWNGRADE"))
        _ = try await world.buy(Self.app, "com.example.magazine.yearly")
        #expect(try await types(world, yearly.originalId).contains("DID_CHANGE_RENEWAL_PREF"), "the downgrade was reverted")
        let chain = try #require(try await world.emulator.read { state, _ in state.chains[yearly.originalId] })
        #expect(chain.autoRenewProductId == "com.example.magazine.yearly")
        _ = try await world.emulator.setAutoRenew(originalTransactionId: yearly.originalId, enabled: false)
        _ = try await world.buy(Self.app, "com.example.magazine.yearly")
        #expect(try await types(world, yearly.originalId).contains("DID_CHANGE_RENEWAL_STATUS/AUTO_RENEW_ENABLED"))
        #expect(try await world.emulator.read { state, _ in state.chains[yearly.originalId]?.autoRenewEnabled } == true)
    }

    @Test("A refund request turns auto-renew off; a price increase Apple only announces is accepted at once")
    func refundRequestAndAnnouncedIncrease() async throws {
        let world = try await World.make()
        try await world.emulator.setNotificationURLs(bundleId: Self.app, NotificationURLs(sandbox: "http://127.0.0.1:9/none"))
        let monthly = try await world.buy(Self.app, "com.example.magazine.monthly")
        _ = try await world.emulator.advanceTime(by: 8 * 60)  // past the trial: a paid period
        let chainBefore = try #require(try await world.emulator.read { state, _ in state.chains[monthly.originalId] })
        let paid = chainBefore.latestTransactionId
        _ = try await world.emulator.requestRefund(transactionId: paid, reason: "UNSATISFIED_WITH_PURCHASE")
        let after = try await types(world, monthly.originalId)
        #expect(after.contains("CONSUMPTION_REQUEST") && after.contains("DID_CHANGE_RENEWAL_STATUS/AUTO_RENEW_DISABLED"))
        #expect(try await world.emulator.read { state, _ in state.chains[monthly.originalId]?.autoRenewEnabled } == false)

        let other = try await World.make()
        try await other.emulator.setNotificationURLs(bundleId: Self.app, NotificationURLs(sandbox: "http://127.0.0.1:9/none"))
        let subscribed = try await other.buy(Self.app, "com.example.magazine.monthly")
        let chain = try await other.emulator.priceIncrease(originalTransactionId: subscribed.originalId, amount: "5.49", consent: false, needsConsent: false)
        #expect(chain.priceIncreaseConsented == true && chain.priceIncreaseAmount == "5.49")
        let sent = try await types(other, subscribed.originalId)
        #expect(sent.contains("PRICE_INCREASE/ACCEPTED") && !sent.contains("PRICE_INCREASE/PENDING"))
    }

    @Test("Signed dates never go back from one operation to the next: a refund granted in the millisecond of its request is signed after it")
    func signedDatesAcrossOperations() async throws {
        let clock = TestSupport.fixedClock()  // still: every operation below falls in one millisecond
        let world = try await World.make(clock: clock)
        try await world.emulator.setNotificationURLs(bundleId: Self.app, NotificationURLs(sandbox: "http://127.0.0.1:9/none"))
        let monthly = try await world.buy(Self.app, "com.example.magazine.monthly")
        _ = try await world.emulator.requestRefund(transactionId: monthly.id, reason: "UNINTENDED_PURCHASE")
        _ = try await world.emulator.refund(transactionId: monthly.id)
        let signed = try await world.emulator.read { state, _ in
            state.notifications.values.filter { $0.originalTransactionId == monthly.originalId }.map { record in
                (record.notificationType.rawValue + (record.subtype.map { "/" + $0.rawValue } ?? ""),
                 (try? JWS(compact: record.signedPayload).payloadJSON()["signedDate"]?.int64) ?? nil)
            }
        }
        let disabled = try #require(signed.first { $0.0 == "DID_CHANGE_RENEWAL_STATUS/AUTO_RENEW_DISABLED" }?.1)
        let refund = try #require(signed.first { $0.0 == "REFUND" }?.1)
        // A receiver keeps the newest signed state of a subscription: the refund must be it.
        #expect(refund > disabled)
        #expect(Set(signed.compactMap { $0.1 }).count == signed.count, "every notification has its own signed date")
    }

    @Test("A crossgrade to another duration waits for the next renewal (DOWNGRADE); one to the same duration is immediate")
    func crossgrades() async throws {
        let world = try await World.make()
        func subscription(_ id: String, _ period: String, number: String) -> String {
            """
            { "adHocOffers" : [], "codeOffers" : [], "displayPrice" : "4.99", "familyShareable" : false, "groupNumber" : 1,
              "internalID" : "\(number)", "introductoryOffer" : null, "localizations" : [], "productID" : "\(id)",
              "recurringSubscriptionPeriod" : "\(period)", "referenceName" : "\(id)", "subscriptionGroupID" : "g", "type" : "RecurringSubscription" }
            """
        }
        let file = Data("""
            { "identifier" : "X", "nonRenewingSubscriptions" : [], "products" : [], "settings" : {}, "version" : { "major" : 4, "minor" : 0 },
              "subscriptionGroups" : [ { "id" : "g", "name" : "Plans", "localizations" : [], "subscriptions" : [
                \(subscription("plan.monthly", "P1M", number: "1")), \(subscription("plan.yearly", "P1Y", number: "2")),
                \(subscription("plan.monthly.plus", "P1M", number: "3")) ] } ] }
            """.utf8)
        try await world.emulator.register(storeKit: StoreKitConfiguration(data: file), bundleId: "com.example.plans")
        try await world.emulator.setNotificationURLs(bundleId: "com.example.plans", NotificationURLs(sandbox: "http://127.0.0.1:9/none"))
        let monthly = try await world.buy("com.example.plans", "plan.monthly")
        _ = try await world.buy("com.example.plans", "plan.yearly")
        var chain = try #require(try await world.emulator.read { state, _ in state.chains[monthly.originalId] })
        #expect(chain.productId == "plan.monthly" && chain.autoRenewProductId == "plan.yearly", "the yearly plan starts at the next renewal")
        #expect(try await types(world, monthly.originalId).contains("DID_CHANGE_RENEWAL_PREF/DOWNGRADE"))
        _ = try await world.buy("com.example.plans", "plan.monthly.plus")
        chain = try #require(try await world.emulator.read { state, _ in state.chains[monthly.originalId] })
        #expect(chain.productId == "plan.monthly.plus", "the same duration changes at once")
    }

    @Test("A mass extension reports each subscription it cannot extend: RENEWAL_EXTENSION / FAILURE, beside the summary")
    func massExtensionFailure() async throws {
        let world = try await World.make()
        try await world.emulator.setNotificationURLs(bundleId: Self.app, NotificationURLs(sandbox: "http://127.0.0.1:9/none"))
        let yearly = try await world.buy(Self.app, "com.example.magazine.yearly")
        for round in 0..<3 {  // Apple allows two extensions a year; the third fails
            let body = try JSONValue.parse(Array(#"{"extendByDays": 3, "extendReasonCode": 0, "requestIdentifier": "r\#(round)", "productId": "com.example.magazine.yearly"}"#.utf8))
            _ = try await world.emulator.serverAPIMassExtend(bundleId: Self.app, environment: .sandbox, body: body)
        }
        let sent = try await sent(world, chain: yearly.originalId)
        #expect(sent.filter { $0 == "RENEWAL_EXTENDED" }.count == 2)
        #expect(sent.filter { $0 == "RENEWAL_EXTENSION/FAILURE" }.count == 1)
    }
}
