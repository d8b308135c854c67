import AppStoreEmulator
import AppStoreModels
import Foundation
@testable import PurchaseServer
import StorekeeperTesting
import Testing

/// The rollup (each chain's contribution kept per day) against the definitions (`SubscriptionMetrics.compute` over
/// every row), on random ledgers asked at random times by day, week and month.
@Suite("Subscription metrics rollup")
struct SubscriptionMetricsRollupTests {
    static let t0: Int64 = 1_772_323_200_000   // 2026-03-01T00:00:00Z
    static let day: Int64 = 86_400_000

    typealias Random = SplitMix64

    /// A random chain: an optional trial, then periods (weekly, monthly or yearly; some with gaps, some refunded,
    /// some at odd instants), or a one-off purchase; prices with up to 6 decimals in one of three currencies or none.
    static func chain(_ id: Int, _ random: inout Random) -> (rows: [MetricsRow], reason: String?) {
        let original = "o\(id)"
        let environment = random.chance(20) ? "Sandbox" : "Production"
        let currency: String? = random.chance(10) ? nil : ["USD", "EUR", "JPY"][Int(random.below(int64: 3))]
        let price = Decimal(random.below(int64: 20_000_000)) / 1_000_000
        var start = t0 + random.below(int64: 120 * day)
        if random.chance(20) {
            let type: ProductType = [.consumable, .nonConsumable, .nonRenewing][Int(random.below(int64: 3))]
            return ([MetricsRow(transactionId: "\(original)-0", originalTransactionId: original, environment: environment, productType: type,
                                purchaseDate: start, expiresDate: type == .nonRenewing ? start + 30 * day : nil,
                                cancellationDate: random.chance(15) ? start + random.below(int64: 40 * day) : nil, quantity: 1 + random.below(int64: 3),
                                price: price, currency: currency)], nil)
        }
        let lengths: [Int64] = [7 * day, 30 * day, 365 * day, 3 * 60_000]
        let length = lengths[Int(random.below(int64: 4))]
        var rows: [MetricsRow] = []
        if random.chance(40) {
            rows.append(MetricsRow(transactionId: "\(original)-t", originalTransactionId: original, environment: environment, productType: .autoRenewable,
                                   purchaseDate: start, expiresDate: start + 7 * day, cancellationDate: random.chance(5) ? start + day : nil,
                                   isTrial: true, price: 0, currency: currency))
            start += 7 * day
        }
        for period in 0..<random.below(int64: 8) {
            if random.chance(15) { start += random.below(int64: 10 * day) }   // a gap: billing retry, or a return
            let refunded = random.chance(10) ? start + random.below(int64: length + 5 * day) : nil
            rows.append(MetricsRow(transactionId: "\(original)-\(period)", originalTransactionId: original, environment: environment,
                                   productType: .autoRenewable, purchaseDate: start, expiresDate: start + length, cancellationDate: refunded,
                                   price: random.chance(10) ? price * 2 : price, currency: currency))
            start += length
        }
        return (rows, [nil, "1", "2", "3"][Int(random.below(int64: 4))])
    }

    /// The rollup's answer from stored contributions, as the server reads it.
    static func fromRollup(_ contributions: [MetricsContribution], boundaries: [(Int64, Int64)], now: Int64) -> [MetricsInterval] {
        var days: [MetricsKey: MetricsTally] = [:]
        var moments: [MetricsMoment] = []
        for contribution in contributions {
            for (key, tally) in contribution.byDay where key.day < (boundaries.last?.1 ?? 0) { days[key, default: MetricsTally()] += tally }
            moments += contribution.moments.filter { $0.key.day == SubscriptionMetricsRollup.day(of: now) }
        }
        return SubscriptionMetricsRollup.intervals(days: days, moments: moments, boundaries: boundaries, now: now)
    }

    @Test("Random ledgers: the rollup gives every figure of every interval exactly as the definitions do, at any time of asking")
    func randomLedgers() {
        var random = Random(state: 20_261_201)
        var compared = 0
        for _ in 0..<60 {
            let chains = (0..<Int(random.below(int64: 40)) + 1).map { Self.chain($0, &random) }
            let rows = chains.flatMap(\.rows)
            var reasons: [String: String] = [:]
            for (rows, reason) in chains { if let first = rows.first, let reason { reasons[first.environment + "|" + first.originalTransactionId] = reason } }
            let contributions = chains.map { SubscriptionMetricsRollup.contribution(of: $0.rows, churnReason: $0.reason) }
            for _ in 0..<6 {
                // Now: often mid-day and at the edges of a day, where the moments of today matter.
                var now = Self.t0 + random.below(int64: 500 * Self.day)
                if random.chance(30) { now = SubscriptionMetricsRollup.day(of: now) + [0, 1, Self.day - 1][Int(random.below(int64: 3))] }
                if random.chance(30), let row = rows.randomElement(using: &random), let expires = row.expiresDate { now = expires + random.below(int64: 3) - 1 }
                let interval = SubscriptionMetrics.Interval.allCases[Int(random.below(int64: 3))]
                let from = Self.t0 + random.below(int64: 200 * Self.day) - 30 * Self.day
                let boundaries = SubscriptionMetrics.boundaries(from: from, to: from + (1 + random.below(int64: 300)) * Self.day, interval: interval)
                let expected = SubscriptionMetrics.compute(rows: rows, churnReasons: reasons, boundaries: boundaries, now: now)
                let actual = Self.fromRollup(contributions, boundaries: boundaries, now: now)
                // The first interval that differs, alone (the whole answer is long).
                let differing = zip(actual, expected).first { $0 != $1 }
                #expect(actual.count == expected.count && differing == nil,
                        "now \(now), \(interval) from \(from): rollup \(String(describing: differing?.0)) vs \(String(describing: differing?.1))")
                if differing != nil { return }
                compared += boundaries.count
            }
        }
        #expect(compared > 1_000)
    }

    @Test("A contribution does not depend on the time of asking, and taking a chain's old one away leaves the rest")
    func incremental() {
        var random = Random(state: 7)
        let chains = (0..<30).map { Self.chain($0, &random) }
        var stored = chains.map { SubscriptionMetricsRollup.contribution(of: $0.rows, churnReason: $0.reason) }
        var current = chains
        // Edit chains one at a time (a refund, a renewal, an extension), replacing each one's stored contribution.
        for step in 0..<40 {
            let index = Int(random.below(int64: Int64(current.count)))
            guard var last = current[index].rows.last else { continue }
            switch step % 3 {
            case 0: current[index].rows[current[index].rows.count - 1].cancellationDate = last.purchaseDate + Self.day
            case 1:
                last.transactionId += "r"
                last.purchaseDate = last.expiresDate ?? last.purchaseDate
                last.expiresDate = last.expiresDate.map { $0 + 30 * Self.day }
                last.cancellationDate = nil
                current[index].rows.append(last)
            default: current[index].rows[current[index].rows.count - 1].expiresDate = last.expiresDate.map { $0 + 3 * Self.day }
            }
            stored[index] = SubscriptionMetricsRollup.contribution(of: current[index].rows, churnReason: current[index].reason)
        }
        let rows = current.flatMap(\.rows)
        var reasons: [String: String] = [:]
        for (rows, reason) in current { if let first = rows.first, let reason { reasons[first.environment + "|" + first.originalTransactionId] = reason } }
        let boundaries = SubscriptionMetrics.boundaries(from: Self.t0, to: Self.t0 + 400 * Self.day, interval: .week)
        for now in [Self.t0 + 50 * Self.day + 12_345, Self.t0 + 300 * Self.day, Self.t0 + 1_000 * Self.day] {
            #expect(Self.fromRollup(stored, boundaries: boundaries, now: now)
                    == SubscriptionMetrics.compute(rows: rows, churnReasons: reasons, boundaries: boundaries, now: now))
        }
    }

    @Test("Prices to the millionth; hostile amounts saturate instead of trapping")
    func amounts() {
        #expect(SubscriptionMetricsRollup.micros(Decimal(string: "9.99")!) == 9_990_000)
        #expect(SubscriptionMetricsRollup.micros(Decimal(string: "0.0000005")!) == 0)   // half-even
        #expect(SubscriptionMetricsRollup.micros(Decimal(string: "1e40")!) == 1 << 52)
        let huge = MetricsRow(transactionId: "x", originalTransactionId: "x", productType: .consumable, purchaseDate: 0, quantity: .max,
                              price: Decimal(string: "999999999"), currency: "USD")
        #expect(SubscriptionMetricsRollup.amountMicros(huge) == 1 << 52)
        #expect(SubscriptionMetricsRollup.day(of: -1) == -86_400_000)
        #expect(ProductMapping.isValidPrice("9.99") && ProductMapping.isValidPrice("0") && ProductMapping.isValidPrice("1000000000"))
        for bad in ["", ".5", "1.", "-1", "1e3", "1.1234567", "１", "1000000000.01", "9,99", " 9"] { #expect(!ProductMapping.isValidPrice(bad), "\(bad)") }
    }

    @Test("A chain's stored day tallies read back as written, whatever the currency holds")
    func encoding() {
        var tally = MetricsTally()
        tally[.grossMicros] = -5
        tally[.renewals] = 3
        let days = [MetricsKey(day: 0, currency: ""): tally, MetricsKey(day: 86_400_000, currency: "U S\nD"): tally]
        #expect(MetricsRepository.decode(MetricsRepository.encode(days)) == days)
    }

    /// Chains stored by earlier versions are read back, and chains stored now by a process of an earlier version: the
    /// text is the same byte for byte as the parts joined the way it was first written.
    @Test("A chain's days are written exactly as before, over random tallies and currencies")
    func encodingUnchanged() {
        func joined(_ days: [MetricsKey: MetricsTally]) -> String {
            days.sorted { $0.key < $1.key }.map { key, tally in
                ([String(key.day), key.currency.isEmpty ? "-" : key.currency.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "-"]
                 + MetricsField.days.map { String(tally[$0]) }).joined(separator: " ")
            }.joined(separator: "\n")
        }
        var random = SplitMix64(state: 31)
        let currencies = ["", "USD", "JPY", "usd", "A1b2", "-", "U S\nD", "U S", "USD ", " ", "a\nb", "a%b", "US_D", "\u{20AC}", "e\u{301}", "100%", "Z9z0"]
        #expect(MetricsRepository.encode([:]) == "")
        for _ in 0..<500 {
            var days: [MetricsKey: MetricsTally] = [:]
            for _ in 0..<Int.random(in: 1...4, using: &random) {
                var tally = MetricsTally()
                for field in MetricsField.allCases where Bool.random(using: &random) {
                    tally[field] = [Int64.min, Int64.max, 0, -1].randomElement(using: &random)! &+ Int64.random(in: -1_000...1_000, using: &random)
                }
                days[MetricsKey(day: Int64.random(in: -1...40, using: &random) * 86_400_000, currency: currencies.randomElement(using: &random)!)] = tally
            }
            let text = MetricsRepository.encode(days)
            #expect(text == joined(days))
            #expect(MetricsRepository.decode(text) == days.mapValues { $0.keeping(moments: false) })
        }
    }

    /// Through the real server on each engine: the rollup, kept by settlements and refreshed by two refreshers at
    /// once, says what the definitions say over the ledger after purchases, renewals, a refund and a rebuild.
    @Test("Through the server: the rollup follows purchases, renewals, a refund and a rebuild, with two refreshers at once",
          arguments: Engine.available)
    func throughTheServer(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let app = "com.example.magazine"
        _ = try await world.client.json(.put, "/admin/v1/apps/\(app)/products/com.example.magazine.monthly",
                                        json: ["type": "auto-renewable", "entitlement": "magazine", "price": "9.99", "priceCurrency": "USD"],
                                        headers: ["Authorization": "Bearer \(ServerWorld.adminKey)"])
        // A read refreshes what is marked but does not wait for a chain another refresher (here the server's own
        // one-second loop) holds at that instant, as documented: so the two agree within a few of its passes.
        func agree(_ step: String) async throws {
            let now = world.server.clock.now()
            for interval in [SubscriptionMetrics.Interval.day, .week] {
                let (from, to) = (now.addingTimeInterval(-3 * 86_400), now.addingTimeInterval(86_400))
                let ledger = try await world.server.subscriptionMetricsFromLedger(appId: app, from: from, to: to, interval: interval, environment: nil)
                var rollup = try await world.server.subscriptionMetrics(appId: app, from: from, to: to, interval: interval, environment: nil)
                try await TestSupport.eventually(every: .milliseconds(100)) {
                    if rollup == ledger { return true }
                    rollup = try await world.server.subscriptionMetrics(appId: app, from: from, to: to, interval: interval, environment: nil)
                    return rollup == ledger
                }
                #expect(rollup == ledger, "\(step), by \(interval)")
            }
        }
        var purchases: [String: TransactionRecord] = [:], devices: [String: String] = [:]
        for user in ["u1", "u2", "u3"] {
            try await world.emulator.addAccount(email: "\(user)@example.com", environment: .sandbox)
            devices[user] = try await world.emulator.signIn(deviceId: nil, email: "\(user)@example.com").id
            let (record, receipt) = try await world.buy(app, "com.example.magazine.monthly", device: devices[user])
            purchases[user] = record
            _ = try await world.upload(app, user: user, receipt: receipt)
        }
        func upload(_ user: String) async throws {
            let receipt = try await world.emulator.appReceipt(bundleId: app, deviceId: devices[user]!, refresh: true)!.base64EncodedString()
            _ = try await world.upload(app, user: user, receipt: receipt)
        }
        try await agree("after three purchases")
        let paid = try await world.server.subscriptionMetrics(appId: app, from: world.server.clock.now().addingTimeInterval(-86_400),
                                                              to: world.server.clock.now().addingTimeInterval(1), interval: .day, environment: nil)
        #expect((paid.last?.activeSubscriptions ?? 0) + (paid.last?.activeTrials ?? 0) == 3)

        _ = try await world.emulator.advanceTime(by: 11 * 60)   // two sandbox months: renewals
        for user in ["u1", "u2", "u3"] { try await upload(user) }
        try await agree("after renewals")
        _ = try await world.emulator.refund(transactionId: purchases["u2"]!.id)
        try await upload("u2")
        try await agree("after a refund")

        // A rebuild, refreshed by two refreshers at once (two connections on PostgreSQL): each chain once.
        try await world.server.store.markMetricsForRebuild()
        async let first = world.server.store.refreshMetrics(batch: 1)
        async let second = world.server.store.refreshMetrics(batch: 1)
        _ = try await (first, second)
        #expect(try await world.server.store.refreshMetrics() == 0)
        try await agree("after a rebuild with two refreshers")
    }
}

extension SubscriptionMetricsRollupTests {
    @Test("Money from millionths in integers equals the Decimal rounding half-even, negatives and halves included")
    func money() {
        var random = Random(state: 99)
        var samples: [Int64] = [0, 5_000, 15_000, -5_000, -15_000, 4_999, -4_999, 25_000, 1, -1, 9_990_000, -9_990_000, 1 << 52, -(1 << 52)]
        for _ in 0..<2_000 { samples.append(Int64(bitPattern: random.next()) % (1 << 40)) }
        for micros in samples {
            #expect(SubscriptionMetricsRollup.money(micros: micros) == SubscriptionMetrics.money(Decimal(micros) / 1_000_000), "\(micros)")
        }
    }
}
