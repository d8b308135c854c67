@testable import AppStoreEmulator
import AppStoreCrypto
import AppStoreModels
import Clocks
import Foundation
import Locking
@testable import PurchaseServer
import StorekeeperTesting
import Testing

/// The emulator is the oracle. A seeded generator writes random lifecycle scripts (purchases of
/// consumables, non-consumables and subscriptions by two app users, on one Apple ID or two; refunds and
/// their reversals; time passing and renewing; auto-renew off and on; renewal-date extensions; old
/// receipts uploaded again), while the notifications each step causes are delivered in order, in
/// reverse, twice, late or not at all. Whenever every notification so far has been delivered, and after
/// a catch-up pass that delivers the missed ones from Notification History (what the reconciler's first
/// pass does), what the server says each user owns must equal the truth computed from the emulator's App
/// Store Server API: Transaction History (revocations) and All Subscription Statuses, with the script's
/// own record of who bought what. A failure prints the seed and the shortest failing script.
///
/// `STOREKEEPER_MODEL_SCRIPTS` (default 300) and `STOREKEEPER_MODEL_SEED` choose the run; `make soak-model SCRIPTS=N` runs long.
@Suite("Model: the server agrees with the App Store after every step", .serialized)
struct ModelTests {
    typealias Generator = SplitMix64

    enum Delivery: String, CaseIterable { case inOrder = "in order", reversed, twice, late, never }

    enum Step: CustomStringConvertible {
        case buy(user: Int, product: Int)
        case refund(pick: Int)
        case refundRequest(pick: Int, granted: Bool)
        case restoreOnNewDevice(user: Int)
        case reverseRefund(pick: Int)
        case advance(seconds: Int)
        case autoRenew(enabled: Bool)
        case extend(days: Int)
        case reupload(user: Int)
        case billing(failing: Bool)
        case gracePeriod(days: Int?)
        case priceIncrease(consent: Bool)
        case catchUp

        var description: String {
            switch self {
            case .buy(let user, let product): return "u\(user + 1) buys \(ModelTests.products[product].id)"
            case .refund(let pick): return "refund purchase #\(pick)"
            case .refundRequest(let pick, let granted): return "refund requested for #\(pick), \(granted ? "granted" : "declined")"
            case .restoreOnNewDevice(let user): return "u\(user + 1) restores on a new device"
            case .reverseRefund(let pick): return "reverse refund #\(pick)"
            case .advance(let seconds): return "advance \(seconds) s"
            case .autoRenew(let enabled): return "auto-renew \(enabled ? "on" : "off")"
            case .extend(let days): return "extend renewal \(days) days"
            case .reupload(let user): return "u\(user + 1) uploads an old receipt again"
            case .billing(let failing): return failing ? "billing starts failing" : "billing recovers"
            case .gracePeriod(let days): return days.map { "grace period of \($0) days" } ?? "no grace period"
            case .priceIncrease(let consent): return "price increase, \(consent ? "consented" : "no consent yet")"
            case .catchUp: return "catch up from Notification History"
            }
        }
    }

    struct Script: CustomStringConvertible {
        var sharedAppleId: Bool
        var steps: [(Step, Delivery)]
        var description: String {
            (sharedAppleId ? "[one Apple ID]" : "[two Apple IDs]") + " " + steps.map { "\($0.0) (notifications \($0.1.rawValue))" }.joined(separator: "; ")
        }
    }

    struct Product {
        let bundle: String
        let id: String
        let kind: ProductType
    }

    static let products = [
        Product(bundle: "com.example.coins", id: "Nada.JPYF02", kind: .consumable),
        Product(bundle: "com.example.football", id: "ProtectiveGloves", kind: .nonConsumable),
        Product(bundle: "com.example.magazine", id: "com.example.magazine.monthly", kind: .autoRenewable),
        // The same subscription group: buying it while subscribed monthly is a crossgrade in the same chain.
        Product(bundle: "com.example.magazine", id: "com.example.magazine.yearly", kind: .autoRenewable),
    ]
    static let bundles = ["com.example.coins", "com.example.football", "com.example.magazine"]

    static func generate(_ random: inout Generator) -> Script {
        let shared = random.below(10) < 3
        var steps: [(Step, Delivery)] = [(.buy(user: 0, product: 2), .inOrder)]
        for _ in 0..<(4 + random.below(7)) {
            let step: Step
            switch random.below(22) {
            case 0...4: step = .buy(user: random.below(2), product: random.below(ModelTests.products.count))
            case 5: step = .refund(pick: random.below(8))
            case 6: step = .refundRequest(pick: random.below(8), granted: random.below(2) == 0)
            case 20: step = .restoreOnNewDevice(user: random.below(2))
            case 7: step = .reverseRefund(pick: random.below(8))
            case 8, 9: step = .advance(seconds: 20 + random.below(300))
            case 10: step = .autoRenew(enabled: random.below(2) == 0)
            case 11: step = .extend(days: 1 + random.below(30))
            case 12: step = .reupload(user: random.below(2))
            case 13, 14: step = .billing(failing: random.below(3) != 0)
            case 15: step = .gracePeriod(days: [nil, 3, 16, 28][random.below(4)])
            case 16: step = .priceIncrease(consent: random.below(2) == 0)
            default: step = .catchUp
            }
            let roll = random.below(20)
            let delivery: Delivery = roll < 11 ? .inOrder : roll < 13 ? .reversed : roll < 15 ? .twice : roll < 18 ? .late : .never
            steps.append((step, delivery))
        }
        steps.append((.catchUp, .inOrder))
        return Script(sharedAppleId: shared, steps: steps)
    }

    /// One run of a script against a fresh emulator and server; the first disagreement, or nil.
    final class Run {
        let world: ServerWorld
        let devices: [String]
        let emails: [String]
        /// Purchases the script made: (buyer, bundle, record, delivered).
        var purchases: [(user: Int, bundle: String, record: TransactionRecord)] = []
        var seen: Set<String> = []
        var late: [NotificationRecord] = []
        var missed = false
        var now: Date { world.server.clock.now() }

        init(_ world: ServerWorld, devices: [String], emails: [String], time: PausableTime) {
            self.world = world
            self.time = time
            self.devices = devices
            self.emails = emails
        }

        /// Real time, held still while the server is compared with the truth.
        let time: PausableTime

        static func start(shared: Bool) async throws -> Run {
            // Time runs (the worker's retries and leases need it), but a comparison reads the App Store and the
            // server at one instant: otherwise an expiry falling between the two reads is a disagreement of the test's.
            let time = PausableTime()
            let clock = AdjustableClock(offset: TestSupport.referenceDate.timeIntervalSinceNow, base: time.now)
            let world = try await ServerWorld.make(.sqlite, clock: clock)
            for bundle in ModelTests.bundles {
                try await world.emulator.setNotificationURLs(bundleId: bundle, NotificationURLs(sandbox: "http://127.0.0.1:9/unused"))
            }
            var devices = [world.device]
            var emails = [ServerWorld.tester]
            if shared {
                devices.append(world.device)
                emails.append(ServerWorld.tester)
            } else {
                try await world.emulator.addAccount(email: "second@example.com", environment: .sandbox)
                devices.append(try await world.emulator.signIn(deviceId: nil, email: "second@example.com").id)
                emails.append("second@example.com")
            }
            return Run(world, devices: devices, emails: emails, time: time)
        }

        func user(_ index: Int) -> String { "u\(index + 1)" }

        /// Notifications the emulator produced since the last look, oldest first.
        func fresh() async throws -> [NotificationRecord] {
            var all: [NotificationRecord] = []
            for bundle in ModelTests.bundles {
                all += try await world.emulator.notificationHistory(bundleId: bundle, environment: .sandbox, from: .distantPast, to: .distantFuture)
            }
            let new = all.filter { !seen.contains($0.notificationUUID) }.sorted { ($0.createdAt, $0.notificationUUID) < ($1.createdAt, $1.notificationUUID) }
            for record in new { seen.insert(record.notificationUUID) }
            return new
        }

        func post(_ record: NotificationRecord) async throws {
            let (status, answer) = try await NotificationTests.post(world, record.signedPayload)
            precondition(status == 200, "notification \(record.notificationType) answered \(status): \(answer)")
            try await NotificationTests.settle(world, answer, bundle: record.bundleId)
        }

        func deliver(_ delivery: Delivery) async throws {
            let new = try await fresh()
            switch delivery {
            case .inOrder: for record in new { try await post(record) }
            case .reversed: for record in new.reversed() { try await post(record) }
            case .twice: for record in new + new { try await post(record) }
            case .late: late += new
            case .never: missed = missed || !new.isEmpty
            }
            if delivery != .late, !late.isEmpty, delivery != .never {
                // Late ones arrive now, after the newer ones.
                for record in late { try await post(record) }
                late = []
            }
        }

        /// What the reconciler's Notification History pass does: every notification, again, in any order.
        func catchUp() async throws {
            var all: [NotificationRecord] = []
            for bundle in ModelTests.bundles {
                all += try await world.emulator.notificationHistory(bundleId: bundle, environment: .sandbox, from: .distantPast, to: .distantFuture)
            }
            for record in all.reversed() { try await post(record) }
            late = []
            missed = false
        }

        func upload(_ bundle: String, user index: Int, naming record: TransactionRecord?, device: String? = nil, restore: Bool = false) async throws {
            guard let receipt = try await world.emulator.appReceipt(bundleId: bundle, deviceId: device ?? devices[index], refresh: true)?
                .base64EncodedString() else { return }
            var body: [String: Any] = ["appUserId": user(index), "receiptData": receipt]
            if let record {
                body["transactionId"] = record.id
                body["productId"] = record.productId
            }
            let path = restore ? "/v1/users/\(user(index))/restore?wait=10" : "/v1/receipts?wait=10"
            let (status, answer) = try await world.client.json(.post, path, json: body,
                                                                headers: ["Authorization": "Bearer \(world.keys[bundle]!)"])
            precondition(status == 200, "upload answered \(status): \(answer)")
        }

        func apply(_ step: Step) async throws {
            switch step {
            case .buy(let index, let product):
                let item = ModelTests.products[product]
                // The second user of a shared Apple ID buys consumables only: the others are the account's already.
                let index = item.kind != .consumable && devices[0] == devices[1] ? 0 : index
                guard let record = try? await world.emulator.addPayment(bundleId: item.bundle, deviceId: devices[index],
                                                                        request: PaymentRequest(productId: item.id)),
                      record.state == .purchased else { return }
                // Buying a non-consumable the Apple ID owns delivers the old purchase again: not a new one.
                if !record.isRedelivery { purchases.append((index, item.bundle, record)) }
                try await upload(item.bundle, user: index, naming: record)
            case .refund(let pick):
                guard !purchases.isEmpty else { return }
                _ = try? await world.emulator.refund(transactionId: purchases[pick % purchases.count].record.id)
            case .refundRequest(let pick, let granted):
                guard !purchases.isEmpty else { return }
                let id = purchases[pick % purchases.count].record.id
                guard (try? await world.emulator.requestRefund(transactionId: id, reason: "UNINTENDED_PURCHASE")) != nil else { return }
                _ = granted ? try? await world.emulator.refund(transactionId: id) : try? await world.emulator.declineRefund(transactionId: id)
            case .restoreOnNewDevice(let index):
                // The same Apple ID on a device the server has never seen: restoring must change nothing.
                let device = try await world.emulator.signIn(deviceId: nil, email: emails[index]).id
                for bundle in ModelTests.bundles { try await upload(bundle, user: index, naming: nil, device: device, restore: true) }
            case .reverseRefund(let pick):
                guard !purchases.isEmpty else { return }
                _ = try? await world.emulator.reverseRefund(transactionId: purchases[pick % purchases.count].record.id)
            case .advance(let seconds):
                _ = try await world.emulator.advanceTime(by: TimeInterval(seconds))
                _ = try await world.emulator.accounts()
            case .autoRenew(let enabled):
                guard let subscription = purchases.first(where: { $0.record.productType == .autoRenewable }) else { return }
                _ = try? await world.emulator.setAutoRenew(originalTransactionId: subscription.record.originalId, enabled: enabled)
            case .extend(let days):
                guard let subscription = purchases.first(where: { $0.record.productType == .autoRenewable }) else { return }
                let body = try JSONValue.parse(Data(#"{"extendByDays": \#(days), "extendReasonCode": 1, "requestIdentifier": "\#(UUID().uuidString)"}"#.utf8))
                _ = try? await world.emulator.serverAPIExtend(bundleId: subscription.bundle, environment: .sandbox,
                                                             originalTransactionId: subscription.record.originalId, body: body)
            case .billing(let failing):
                guard let subscription = purchases.first(where: { $0.record.productType == .autoRenewable }) else { return }
                _ = try? await world.emulator.setBillingIssue(originalTransactionId: subscription.record.originalId, failing: failing)
            case .gracePeriod(let days):
                try await world.emulator.setGracePeriod(bundleId: "com.example.magazine", days: days)
            case .priceIncrease(let consent):
                guard let subscription = purchases.first(where: { $0.record.productType == .autoRenewable }) else { return }
                _ = try? await world.emulator.priceIncrease(originalTransactionId: subscription.record.originalId, amount: "5.99", consent: consent)
            case .reupload(let index):
                for bundle in ModelTests.bundles { try await upload(bundle, user: index, naming: nil) }
            case .catchUp:
                try await catchUp()
            }
        }

        /// The truth from the emulator's Server API, per user: coins, gloves, magazine.
        func truth() async throws -> [String: (coins: Int64, gloves: Bool, magazine: Bool, magazineExpires: Int64?)] {
            var revoked: Set<String> = []
            for purchase in purchases {
                guard let history = try? await world.emulator.serverAPIHistory(bundleId: purchase.bundle, environment: .sandbox,
                                                                              transactionId: purchase.record.id, query: HistoryQuery()) else { continue }
                for signed in history.signed {
                    let payload = try JWS(compact: signed).payloadJSON()
                    if payload["revocationDate"]?.int64 != nil, let id = payload["transactionId"]?.text { revoked.insert(id) }
                }
            }
            var truth: [String: (coins: Int64, gloves: Bool, magazine: Bool, magazineExpires: Int64?)] = [:]
            for index in 0..<2 {
                let mine = purchases.filter { $0.user == index }
                let coins = Int64(mine.filter { $0.record.productType == .consumable && !revoked.contains($0.record.id) }.count) * 100
                let gloves = mine.contains { $0.record.productType == .nonConsumable && !revoked.contains($0.record.id) }
                var magazine = false
                var expires: Int64?
                if let subscription = mine.first(where: { $0.record.productType == .autoRenewable }) {
                    let statuses = try await world.emulator.serverAPISubscriptionStatuses(bundleId: subscription.bundle, environment: .sandbox,
                                                                                         transactionId: subscription.record.id, statuses: [])
                    let mineNow = statuses.groups.flatMap(\.last).filter { $0.originalTransactionId == subscription.record.originalId }
                    magazine = mineNow.contains { [1, 4].contains($0.status) }
                    // Active (status 1): the entitlement runs to the latest transaction's expiresDate.
                    if let active = mineNow.first(where: { $0.status == 1 }) {
                        expires = try JWS(compact: active.signedTransaction).payloadJSON()["expiresDate"]?.int64
                    }
                }
                truth[user(index)] = (coins, gloves, magazine, expires)
            }
            return truth
        }

        /// The first disagreement between the server and the truth, or nil.
        func disagreement() async throws -> String? {
            for (name, expected) in try await truth() {
                let coins = (try await world.user("com.example.coins", name)["balances"] as? [String: Any])?["coins"] as? Int64 ?? 0
                let gloves = try await world.user("com.example.football", name).entitlementIds.contains("protective_gloves")
                let magazineView = try await world.user("com.example.magazine", name)
                let magazine = magazineView.entitlementIds.contains("magazine")
                let entitlement = (magazineView["entitlements"] as? [[String: Any]])?.first { $0["id"] as? String == "magazine" && $0["active"] as? Bool == true }
                let expires = entitlement?["expiresDate"] as? Int64
                if expected.magazineExpires != nil { ModelTests.tally.withLock { $0.expiries += 1 } }
                if let truthExpires = expected.magazineExpires, expires != truthExpires {
                    return "\(name): server says the magazine expires at \(expires.map(String.init) ?? "never"); the App Store says \(truthExpires); the server's magazine transactions \(magazineView["transactions"] ?? "none"), at \(world.server.clock.now().milliseconds)"
                }
                if (coins, gloves, magazine) != (expected.coins, expected.gloves, expected.magazine) {
                    return "\(name): server says coins \(coins), gloves \(gloves), magazine \(magazine); the App Store says coins \(expected.coins), gloves \(expected.gloves), magazine \(expected.magazine); the server's magazine transactions \(magazineView["transactions"] ?? "none"), subscriptions \(magazineView["subscriptions"] ?? "none"), at \(world.server.clock.now().milliseconds)"
                }
            }
            return nil
        }

        /// Whether the metrics rollup, kept up to date on every settlement, says what the definitions say over the
        /// whole ledger (`SubscriptionMetrics.compute`), by day and by week.
        func metricsDisagreement() async throws -> String? {
            let now = world.server.clock.now()
            for bundle in ["com.example.magazine", "com.example.coins", "com.example.football"] {
                for interval in [SubscriptionMetrics.Interval.day, .week] {
                    let from = now.addingTimeInterval(-40 * 86_400), to = now.addingTimeInterval(2 * 86_400)
                    let rollup = try await world.server.subscriptionMetrics(appId: bundle, from: from, to: to, interval: interval, environment: nil)
                    let ledger = try await world.server.subscriptionMetricsFromLedger(appId: bundle, from: from, to: to, interval: interval, environment: nil)
                    if let (mine, truth) = zip(rollup, ledger).first(where: { $0 != $1 }) {
                        return "\(bundle) metrics by \(interval): the rollup says \(mine); the ledger says \(truth)"
                    }
                }
            }
            return nil
        }
    }

    /// Steps run and comparisons made, for the summary line.
    static let tally = Locked((steps: 0, comparisons: 0, expiries: 0))

    /// Runs `script`; the step after which the server disagreed, with what it said, or nil.
    static func run(_ script: Script) async throws -> String? {
        let run = try await Run.start(shared: script.sharedAppleId)
        var problem: String?
        do {
            for (number, (step, delivery)) in script.steps.enumerated() {
                try await run.apply(step)
                try await run.deliver(delivery)
                tally.withLock { $0.steps += 1 }
                run.time.pause()
                defer { run.time.resume() }
                // The rollup follows the ledger at every step, whatever has arrived.
                if let disagreement = try await run.metricsDisagreement() {
                    problem = "after step \(number + 1) (\(step)): \(disagreement)"
                    break
                }
                // Only when every notification so far has arrived is the server expected to know everything.
                guard run.late.isEmpty, !run.missed else { continue }
                // Real time may have reached a renewal since the step's notifications were collected: the App Store
                // renews on its next call, so what that sent arrives now, in order, before the two are compared.
                try await run.deliver(.inOrder)
                tally.withLock { $0.comparisons += 1 }
                if let disagreement = try await run.disagreement() {
                    problem = "after step \(number + 1) (\(step)): \(disagreement)"
                    break
                }
            }
        } catch {
            await run.world.stop()
            throw error
        }
        await run.world.stop()
        return problem
    }

    /// The shortest failing script found by removing steps one at a time while it still fails.
    static func shrink(_ script: Script) async throws -> Script {
        var shortest = script
        var index = 1
        while index < shortest.steps.count - 1 {
            var candidate = shortest
            candidate.steps.remove(at: index)
            if try await run(candidate) != nil { shortest = candidate } else { index += 1 }
        }
        return shortest
    }

    @Test("Random lifecycle scripts: the server's view equals the App Store's truth after every step")
    func scripts() async throws {
        let environment = ProcessInfo.processInfo.environment
        let count = environment["STOREKEEPER_MODEL_SCRIPTS"].flatMap(Int.init) ?? 300
        let seed = environment["STOREKEEPER_MODEL_SEED"].flatMap(UInt64.init) ?? UInt64(Date().timeIntervalSince1970)
        var random = Generator(state: seed)
        for number in 0..<count {
            let scriptSeed = random.next()
            var generator = Generator(state: scriptSeed)
            let script = Self.generate(&generator)
            if let problem = try await Self.run(script) {
                let shortest = try await Self.shrink(script)
                Issue.record("""
                    Script \(number + 1) of \(count) (STOREKEEPER_MODEL_SEED=\(seed), script seed \(scriptSeed)) diverged \(problem)
                    Script: \(script)
                    Shortest failing script: \(shortest) — \(try await Self.run(shortest) ?? "")
                    """)
                return
            }
        }
        let (steps, comparisons, expiries) = Self.tally.withLock { ($0.steps, $0.comparisons, $0.expiries) }
        print("model: \(count) scripts, \(steps) steps, \(comparisons) comparisons with the App Store's truth (\(expiries) of an active subscription's expiry), all equal (STOREKEEPER_MODEL_SEED=\(seed))")
    }
}

/// The system's time, which a test can hold still for a while and let run again (it then jumps to the system's
/// time: it never goes back).
final class PausableTime: Sendable {
    private let held = Locked<Date?>(nil)
    func now() -> Date { held.withLock { $0 } ?? Date() }
    func pause() { held.withLock { $0 = Date() } }
    func resume() { held.withLock { $0 = nil } }
}
