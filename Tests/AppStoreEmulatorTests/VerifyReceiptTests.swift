import AppStoreCrypto
@testable import AppStoreEmulator
import AppStoreModels
import Foundation
import HTTP
import Locking
import Storage
import StorekeeperTesting
import Testing

@Suite("verifyReceipt")
struct VerifyReceiptTests {
    @Test("A valid sandbox receipt answers 0 in the sandbox and 21007 in production")
    func routing() async throws {
        let world = try await World.make()
        let bought = try await world.buy("com.example.coins", "Nada.JPYF01")
        let receipt = try await world.receipt("com.example.coins")
        let sandbox = try await world.verify(receipt, .sandbox)
        #expect(sandbox.status == 0)
        #expect(sandbox["environment"] as? String == "Sandbox")
        let body = try #require(sandbox["receipt"] as? [String: Any])
        #expect(body["receipt_type"] as? String == "ProductionSandbox")
        #expect(body["bundle_id"] as? String == "com.example.coins")
        #expect(body["original_purchase_date"] as? String == "2013-08-01 07:00:00 Etc/GMT")
        #expect(body["request_date_ms"] as? String != nil)
        #expect(sandbox.inApp.first?["transaction_id"] as? String == bought.id)
        #expect(try await world.verify(receipt, .production).status == 21007)
    }

    @Test("Production receipts answer 0 in production and 21008 in the sandbox, with the app's Apple id")
    func productionReceipts() async throws {
        let world = try await World.make()
        try await world.emulator.addAccount(email: "buyer@example.com", environment: .production)
        let phone = try await world.emulator.signIn(deviceId: nil, email: "buyer@example.com")
        _ = try await world.buy("com.example.comics", "com.raywenderlich.inapprage.studylikeaboss", device: phone.id)
        let receipt = try await world.receipt("com.example.comics", device: phone.id)
        let production = try await world.verify(receipt, .production)
        #expect(production.status == 0)
        let body = try #require(production["receipt"] as? [String: Any])
        #expect(body["receipt_type"] as? String == "Production")
        #expect(body["app_item_id"] as? Int64 == (try await world.emulator.app("com.example.comics")).appAppleId)
        #expect(try await world.verify(receipt, .sandbox).status == 21008)
    }

    @Test("Apple's Host headers route /verifyReceipt")
    func hostRouting() async throws {
        let world = try await World.make()
        _ = try await world.buy("com.example.coins", "Nada.JPYF01")
        let receipt = try await world.receipt("com.example.coins")
        let (_, production) = try await world.client.json(.post, "/verifyReceipt", json: ["receipt-data": receipt], headers: ["Host": "buy.itunes.apple.com"])
        let (_, sandbox) = try await world.client.json(.post, "/verifyReceipt", json: ["receipt-data": receipt], headers: ["Host": "sandbox.itunes.apple.com:443"])
        #expect(production.status == 21007)
        #expect(sandbox.status == 0)
    }

    @Test("Bad input gets Apple's answers", arguments: [
        ("not json", 21000), (#"{"receipt-data": 5}"#, 21002), (#"{}"#, 21002), (#"{"receipt-data":"%%%not base64"}"#, 21002),
        (#"{"receipt-data":"MIIBAgMEBQ=="}"#, 21002), (#"{"receipt-data":"AAAAAAAAAAAA"}"#, 21002), (#"{"receipt-data":"e30="}"#, 21002),
    ])
    func badInput(body: String, expected: Int) async throws {
        let world = try await World.make()
        let (status, object) = try await world.client.json(.post, "/sandbox/verifyReceipt", body: Data(body.utf8))
        #expect(status == 200)
        #expect(object.status == expected)
    }

    @Test("Wrong methods answer 21000")
    func wrongMethod() async throws {
        let world = try await World.make()
        let (status, object) = try await world.client.json(.get, "/production/verifyReceipt")
        #expect(status == 200)
        #expect(object.status == 21000)
    }

    @Test("Truncated receipts answer 21002 and tampered ones 21003; state is untouched")
    func truncatedAndTampered() async throws {
        let world = try await World.make()
        _ = try await world.buy("com.example.coins", "Nada.JPYF02")
        var bytes = [UInt8](try #require(Data(base64Encoded: try await world.receipt("com.example.coins"))))
        #expect(try await world.verify(Data(bytes.prefix(bytes.count / 2)).base64EncodedString()).status == 21002)
        let needle = Array("Nada.JPYF02".utf8)
        let index = try #require((0..<(bytes.count - needle.count)).first { Array(bytes[$0..<($0 + needle.count)]) == needle })
        bytes[index + needle.count - 1] = UInt8(ascii: "5")
        #expect(try await world.verify(Data(bytes).base64EncodedString()).status == 21003)
        #expect(try await world.emulator.pendingTransactions(bundleId: "com.example.coins", deviceId: world.device).count == 1)
    }

    @Test("A receipt signed by another CA answers 21003")
    func foreignSigner() async throws {
        let world = try await World.make()
        let other = try CertificateAuthority.generate()
        let receipt = AppReceipt(receiptType: .productionSandbox, bundleId: "com.example.coins", applicationVersion: "1.0", creationDate: TestSupport.referenceDate)
        let der = try SignedData.sign(payload: ReceiptPayload.encode(receipt), key: other.leafKey, chain: other.chain)
        #expect(try await world.verify(Data(der).base64EncodedString()).status == 21003)
    }

    @Test("Real Apple receipts are not ours: 21003 (or 21007 routing first for sandbox ones is not attempted)")
    func appleReceiptsAreForeign() async throws {
        let world = try await World.make()
        let text = String(decoding: try TestSupport.fixtureNamed(prefix: "r04", suffix: ".receipt.b64"), as: UTF8.self)
        #expect(try await world.verify(text, .production).status == 21003)
    }

    @Test("A receipt made before the account subscribed still needs the shared secret, and its answer carries the subscription")
    func subscriptionBoughtAfterTheReceipt() async throws {
        let world = try await World.make()
        let free = try await world.buy("com.example.magazine", "com.example.magazine.free")
        let older = try await world.receipt("com.example.magazine")
        let secret = try await world.secret("com.example.magazine")
        let before = try await world.verify(older, password: secret)
        #expect(before.status == 0 && before["latest_receipt_info"] == nil)
        let subscription = try await world.buy("com.example.magazine", "com.example.magazine.monthly")
        #expect(try await world.verify(older).status == 21004)
        let after = try await world.verify(older, password: secret)
        #expect(after.status == 0)
        let latest = try #require(after["latest_receipt_info"] as? [[String: Any]])
        #expect(latest.map { $0["transaction_id"] as? String } == [subscription.id, free.id])  // every purchase, newest first
    }

    @Test("Subscriptions need the shared secret (21004); a wrong secret is always refused")
    func sharedSecret() async throws {
        let world = try await World.make()
        _ = try await world.buy("com.example.magazine", "com.example.magazine.monthly")
        let receipt = try await world.receipt("com.example.magazine")
        #expect(try await world.verify(receipt).status == 21004)
        #expect(try await world.verify(receipt, password: "wrong").status == 21004)
        let ok = try await world.verify(receipt, password: try await world.secret("com.example.magazine"))
        #expect(ok.status == 0)
        #expect(ok["latest_receipt"] as? String != nil)
        _ = try await world.buy("com.example.coins", "Nada.JPYF01")
        #expect(try await world.verify(try await world.receipt("com.example.coins"), password: "wrong").status == 21004)
        #expect(try await world.verify(try await world.receipt("com.example.coins")).status == 0)
    }

    @Test("Sandbox subscriptions renew every 5 minutes on the emulator clock; latest_receipt_info sees renewals the receipt does not")
    func renewals() async throws {
        let world = try await World.make()
        let secret = try await world.secret("com.example.magazine")
        let first = try await world.buy("com.example.magazine", "com.example.magazine.monthly")
        #expect(first.isTrialPeriod)
        #expect(first.expiresDate == TestSupport.referenceDate.addingTimeInterval(180))
        let oldReceipt = try await world.receipt("com.example.magazine")
        try await world.emulator.advanceTime(by: 180 + 300 * 2 + 1)
        let answer = try await world.verify(oldReceipt, password: secret)
        #expect(answer.inApp.count == 1)
        #expect(answer.latest.count == 4)
        #expect(Set(answer.latest.compactMap { $0["original_transaction_id"] as? String }) == [first.id])
        let newest = try #require(answer.latest.first)
        #expect(newest["expires_date_ms"] as? String == String(ReceiptDate.milliseconds(TestSupport.referenceDate.addingTimeInterval(180 + 900))))
        #expect(newest["subscription_group_identifier"] as? String == "21000001")
        let pending = try #require((answer["pending_renewal_info"] as? [[String: Any]])?.first)
        #expect(pending["auto_renew_status"] as? String == "1")
        let excluded = try await world.verify(oldReceipt, password: secret, excludeOld: true)
        #expect(excluded.latest.count == 1)
        // The fresh latest_receipt contains every renewal.
        let latestReceipt = try #require(answer["latest_receipt"] as? String)
        #expect(try await world.verify(latestReceipt, password: secret).inApp.count == 4)
    }

    @Test("After 12 sandbox renewals auto-renew turns off with expiration intent 1")
    func renewalCap() async throws {
        let world = try await World.make()
        _ = try await world.buy("com.example.magazine", "com.example.magazine.yearly")
        try await world.emulator.advanceTime(by: 3600 * 20)
        let answer = try await world.verify(try await world.receipt("com.example.magazine"), password: try await world.secret("com.example.magazine"))
        #expect(answer.latest.count == 13)
        let pending = try #require((answer["pending_renewal_info"] as? [[String: Any]])?.first)
        #expect(pending["auto_renew_status"] as? String == "0")
        #expect(pending["expiration_intent"] as? String == "1")
    }

    @Test("Upgrading within a group cancels the old period and keeps the original transaction id")
    func upgrade() async throws {
        let world = try await World.make()
        let monthly = try await world.buy("com.example.magazine", "com.example.magazine.monthly")
        let yearly = try await world.buy("com.example.magazine", "com.example.magazine.yearly")
        #expect(yearly.originalId == monthly.id)
        let upgraded = try await world.emulator.transaction(monthly.id)
        #expect(upgraded.isUpgraded && upgraded.cancellationDate != nil)
        let again = try await world.buy("com.example.magazine", "com.example.magazine.yearly")
        #expect(again.isRedelivery)
    }

    @Test("Deleted accounts answer 21010")
    func deletedAccount() async throws {
        let world = try await World.make()
        _ = try await world.buy("com.example.coins", "Nada.JPYF01")
        let receipt = try await world.receipt("com.example.coins")
        try await world.emulator.deleteAccount(email: World.tester)
        #expect(try await world.verify(receipt).status == 21010)
    }

    @Test("Refunds show cancellation_date and reason")
    func refund() async throws {
        let world = try await World.make()
        let bought = try await world.buy("com.example.football", "GoldenGlobe")
        _ = try await world.emulator.refund(transactionId: bought.id, reason: 1)
        let entry = try #require(try await world.verify(try await world.receipt("com.example.football")).inApp.first)
        #expect(entry["cancellation_reason"] as? String == "1")
        #expect(entry["cancellation_date_ms"] as? String != nil)
    }

    @Test("iOS 6 transaction receipts verify; expired subscriptions answer 21006 with the decoded receipt")
    func legacyReceipts() async throws {
        let world = try await World.make()
        let secret = try await world.secret("com.example.magazine")
        let coin = try await world.buy("com.example.coins", "Nada.JPYF01")
        let coinReceipt = try await world.emulator.transactionReceipt(transactionId: coin.id).base64EncodedString()
        let coinAnswer = try await world.verify(coinReceipt)
        #expect(coinAnswer.status == 0)
        #expect((coinAnswer["receipt"] as? [String: Any])?["transaction_id"] as? String == coin.id)
        #expect((coinAnswer["receipt"] as? [String: Any])?["bid"] as? String == "com.example.coins")
        #expect(try await world.verify(coinReceipt, .production).status == 21007)

        let sub = try await world.buy("com.example.magazine", "com.example.magazine.monthly")
        let subReceipt = try await world.emulator.transactionReceipt(transactionId: sub.id).base64EncodedString()
        let active = try await world.verify(subReceipt, password: secret)
        #expect(active.status == 0)
        #expect(active["latest_receipt_info"] as? [String: Any] != nil)
        _ = try await world.emulator.setAutoRenew(originalTransactionId: sub.id, enabled: false)
        try await world.emulator.advanceTime(by: 3600)
        let expired = try await world.verify(subReceipt, password: secret)
        #expect(expired.status == 21006)
        #expect(expired["receipt"] as? [String: Any] != nil)
        #expect(expired["latest_expired_receipt_info"] as? [String: Any] != nil)
    }

    @Test("Receipts carry a device hash over the device id, opaque value and bundle id bytes")
    func deviceHash() async throws {
        let world = try await World.make()
        _ = try await world.buy("com.example.coins", "Nada.JPYF01")
        let bytes = [UInt8](try #require(Data(base64Encoded: try await world.receipt("com.example.coins"))))
        guard case .app(let receipt, _) = try ReceiptDecoder.decode(bytes) else { Issue.record("not an app receipt"); return }
        let device = try await world.emulator.device(world.device)
        #expect(receipt.sha1Hash == Data(Digest.sha1.hash(device.identifierBytes + receipt.opaqueValue + receipt.bundleIdBytes)))
        #expect(receipt.opaqueValue.count == 16)
    }
}

@Suite("Faults")
struct FaultTests {
    @Test("Status faults answer 21005 and 211xx with is_retryable, only where configured")
    func statusFaults() async throws {
        let world = try await World.make()
        _ = try await world.buy("com.example.coins", "Nada.JPYF01")
        let receipt = try await world.receipt("com.example.coins")
        try await world.emulator.addFault(endpoint: "verifyReceipt", environment: .production, behavior: .status(21105))
        let production = try await world.verify(receipt, .production)
        #expect(production.status == 21105)
        #expect(production["is_retryable"] as? Bool == true)
        #expect(try await world.verify(receipt, .sandbox).status == 0)
        try await world.emulator.clearFaults()
        try await world.emulator.addFault(endpoint: "verifyReceipt", environment: nil, behavior: .status(21005), duration: 60)
        #expect(try await world.verify(receipt).status == 21005)
        try await world.emulator.advanceTime(by: 61)
        #expect(try await world.verify(receipt).status == 0)
    }

    @Test("HTTP, HTML and drop faults")
    func transportFaults() async throws {
        let world = try await World.make()
        try await world.emulator.addFault(endpoint: "verifyReceipt", environment: .sandbox, behavior: .http(503))
        #expect(try await world.client.send(.post, "/sandbox/verifyReceipt", json: [:]).status.code == 503)
        try await world.emulator.clearFaults()
        try await world.emulator.addFault(endpoint: "verifyReceipt", environment: .sandbox, behavior: .html)
        let html = try await world.client.send(.post, "/sandbox/verifyReceipt", json: [:])
        #expect(html.status.code == 200)
        #expect(html.headers["Content-Type"]?.hasPrefix("text/html") == true)
        try await world.emulator.clearFaults()
        try await world.emulator.addFault(endpoint: "payments", environment: nil, behavior: .drop)
        #expect(try await world.client.send(.post, "/device/v1/payments", json: [:]).dropConnection)
    }

    @Test("Latency faults delay answers by a value in the range")
    func latency() async throws {
        let world = try await World.make()
        try await world.emulator.addFault(endpoint: "verifyReceipt", environment: nil, behavior: .none, latency: 0.2...0.3)
        let started = ContinuousClock.now
        _ = try await world.client.send(.post, "/sandbox/verifyReceipt", json: [:])
        #expect(ContinuousClock.now - started >= .milliseconds(200))
    }

    @Test("Held calls wake after their own delay, soonest first, and a cancelled one at once", .timeLimit(.minutes(1)))
    func heldCalls() async throws {
        let held = HeldCalls()  // its own: other suites hold calls on the shared one meanwhile
        let started = ContinuousClock.now
        let order = try await withThrowingTaskGroup(of: (Int, Duration).self) { group in
            for (index, milliseconds) in [(0, 3000), (1, 100), (2, 1200), (3, 100)] {
                group.addTask {
                    await held.hold(for: .milliseconds(milliseconds))
                    return (index, ContinuousClock.now - started)
                }
            }
            return try await group.reduce(into: [(Int, Duration)]()) { $0.append($1) }
        }
        #expect(Set(order.prefix(2).map(\.0)) == [1, 3] && order[2].0 == 2 && order[3].0 == 0)
        for (index, elapsed) in order { #expect(elapsed >= .milliseconds([3000, 100, 1200, 100][index])) }
        // Cancelled while held: it returns long before its hour, and nothing stays held.
        let cancelled = ContinuousClock.now
        let task = Task { await held.hold(for: .seconds(3600)) }
        try await Task.sleep(for: .milliseconds(50))
        task.cancel()
        await task.value
        #expect(ContinuousClock.now - cancelled < .seconds(30))
        let early = Task { await held.hold(for: .seconds(3600)) }
        early.cancel()  // possibly before its continuation is handed over
        await early.value
        #expect(held.count == 0)
        // The thread waits at most a second at a time, then ends: polled, for a loaded machine.
        try await TestSupport.eventually { !held.threadRunning }
        #expect(!held.threadRunning)
    }

    @Test("Invalid faults are refused", arguments: [("nowhere", Fault.Behavior.drop), ("verifyReceipt", .status(200)), ("verifyReceipt", .http(200))])
    func invalidFaults(endpoint: String, behavior: Fault.Behavior) async throws {
        let world = try await World.make()
        await #expect(throws: StoreError.self) { try await world.emulator.addFault(endpoint: endpoint, environment: nil, behavior: behavior) }
    }

    @Test("Seed 000's quirk: with the switch on, a sandbox consumable receipt sent to production answers 21002")
    func quirk21002() async throws {
        let world = try await World.make()
        _ = try await world.buy("com.example.coins", "Nada.JPYF01")
        let receipt = try await world.receipt("com.example.coins")
        #expect(try await world.verify(receipt, .production).status == 21007)
        var quirks = Quirks()
        quirks.sandboxConsumableAnswers21002InProduction = true
        try await world.emulator.setQuirks(quirks)
        #expect(try await world.verify(receipt, .production).status == 21002)
    }

    @Test("verifyReceipt is answered on the transport's thread, after a fault's latency held there, unless it hangs or its read found renewals to store")
    func promptAnswers() async throws {
        let store = FailingDocumentStore()
        let clock = TestSupport.fixedClock()
        let world = try await World.make(store: store, clock: clock)
        let responder = AppStoreResponder(emulator: world.emulator)
        let secret = try await world.secret("com.example.magazine")
        _ = try await world.buy("com.example.magazine", "com.example.magazine.monthly")
        let receipt = try await world.receipt("com.example.magazine")
        func request(_ path: String = "/sandbox/verifyReceipt", host: String? = nil) throws -> Request {
            let body = try JSONSerialization.data(withJSONObject: ["receipt-data": receipt, "password": secret])
            return Request(method: .post, target: path, headers: host.map { ["Host": $0] } ?? [:], body: body)
        }
        func status(_ response: Response) -> Int? {
            ((try? JSONSerialization.jsonObject(with: response.body)) as? [String: Any])?.status
        }

        // Nothing to store: answered at once, under Apple's host name too, with the route the access log names.
        for (path, host) in [("/sandbox/verifyReceipt", nil), ("/verifyReceipt", "sandbox.itunes.apple.com")] {
            guard case .now(let response) = responder.respondPromptly(to: try request(path, host: host)) else {
                Issue.record("\(path) was not answered at once")
                continue
            }
            #expect(status(response) == 0)
            #expect(response.route == "/sandbox/verifyReceipt")
        }
        // Other routes go on as tasks.
        guard case .later = responder.respondPromptly(to: Request(method: .get, target: "/health")) else {
            Issue.record("a route other than verifyReceipt was answered on the transport's thread")
            return
        }
        // A fault's misbehaviour without latency is answered at once; with a latency, after it, held by the transport
        // (the misbehaviour, or the verification, decided when it is due); a hang goes on as a task.
        try await world.emulator.addFault(endpoint: "verifyReceipt", environment: .sandbox, behavior: .status(21005))
        guard case .now(let faulted) = responder.respondPromptly(to: try request()) else {
            Issue.record("a fault's misbehaviour without latency was not answered at once")
            return
        }
        #expect(status(faulted) == 21005)
        #expect(faulted.route == "/sandbox/verifyReceipt")
        for (behavior, expected) in [(Fault.Behavior.status(21005), 21005), (.none, 0)] {
            try await world.emulator.clearFaults()
            try await world.emulator.addFault(endpoint: "verifyReceipt", environment: .sandbox, behavior: behavior, latency: 0.2...0.3)
            guard case .after(let delay, let due) = responder.respondPromptly(to: try request()) else {
                Issue.record("a fault's latency (\(behavior)) was not held by the transport")
                continue
            }
            #expect(delay >= .milliseconds(200) && delay <= .milliseconds(300))
            guard case .now(let answer) = due() else {
                Issue.record("a held verification (\(behavior)) was not answered when due")
                continue
            }
            #expect(status(answer) == expected)
            #expect(answer.route == "/sandbox/verifyReceipt")
        }
        try await world.emulator.clearFaults()
        try await world.emulator.addFault(endpoint: "verifyReceipt", environment: .sandbox, behavior: .hang)
        guard case .later = responder.respondPromptly(to: try request()) else {
            Issue.record("a hanging verification was not handed to a task")
            return
        }
        try await world.emulator.clearFaults()

        // Renewals found by the verification's own read: the answer waits for them to be stored, and says so when they
        // cannot be (the clock is moved without an operation, so the read is the first to see them due).
        store.failing.withLock { $0 = true }
        clock.advance(by: 180 + 300 + 1)
        guard case .later(let renewing) = responder.respondPromptly(to: try request()) else {
            Issue.record("a verification that found renewals was answered before they were stored")
            return
        }
        #expect(status(await renewing()) == VerifyReceiptStatus.internalDataAccessError)
        store.failing.withLock { $0 = false }
        clock.advance(by: 300)
        guard case .later(let stored) = responder.respondPromptly(to: try request()) else {
            Issue.record("a verification that found renewals was answered before they were stored")
            return
        }
        let answer = await stored()
        #expect(status(answer) == 0)
        // The renewal the answer shows was stored before it was given.
        let object = try #require((try JSONSerialization.jsonObject(with: answer.body)) as? [String: Any])
        let newest = try #require(object.latest.first?["transaction_id"] as? String)
        #expect(try await store.document(in: "transactions", id: newest) != nil)
    }
}

/// A store in memory whose writes fail while `failing` is set.
final class FailingDocumentStore: DocumentStore {
    let inner = InMemoryDocumentStore()
    let failing = Locked(false)

    struct WriteFailed: Error {}

    func apply(_ writes: [DocumentWrite]) async throws {
        if failing.withLock({ $0 }) { throw WriteFailed() }
        try await inner.apply(writes)
    }

    func documents(in collection: String) async throws -> [StoredDocument] { try await inner.documents(in: collection) }
    func document(in collection: String, id: String) async throws -> Data? { try await inner.document(in: collection, id: id) }
}
