import AppStoreModels
import Foundation
@testable import PurchaseServer
import Testing

/// Every metric on a ledger computed by hand (the numbers in the comments).
@Suite("Subscription metrics")
struct SubscriptionMetricsTests {
    static let t0: Int64 = 1_772_323_200_000   // 2026-03-01T00:00:00Z
    static let day: Int64 = 86_400_000

    static func row(_ id: String, _ original: String, _ type: ProductType = .autoRenewable, from: Int64, days: Int64? = nil, trial: Bool = false,
                    price: String? = nil, currency: String? = nil, refundedAt: Int64? = nil) -> MetricsRow {
        MetricsRow(transactionId: id, originalTransactionId: original, productType: type, purchaseDate: t0 + from * day,
                   expiresDate: days.map { t0 + (from + $0) * day }, cancellationDate: refundedAt.map { t0 + $0 * day }, isTrial: trial,
                   price: price.flatMap { Decimal(string: $0) }, currency: currency)
    }

    static let ledger: [MetricsRow] = [
        row("a1", "a1", from: 0, days: 7, trial: true),                         // A: a week's trial,
        row("a2", "a1", from: 7, days: 30, price: "10", currency: "USD"),       //    converted to monthly,
        row("a3", "a1", from: 37, days: 30, price: "10", currency: "USD"),      //    renewed in April
        row("b1", "b1", from: 2, days: 30, price: "10", currency: "USD"),       // B: monthly, not renewed (voluntary)
        row("c1", "c1", from: 3, days: 365, price: "120", currency: "USD", refundedAt: 10),  // C: yearly, refunded
        row("d1", "d1", from: 5, days: 7, price: "2", currency: "EUR"),         // D: weekly, renewed once, then billing failed
        row("d2", "d1", from: 12, days: 7, price: "2", currency: "EUR"),
        row("e1", "e1", from: 20, days: 7, trial: true),                        // E: a trial that did not convert
        row("k1", "k1", .consumable, from: 1, price: "0.99", currency: "USD"),  // a consumable: revenue only
    ]

    static var months: [MetricsInterval] {
        SubscriptionMetrics.compute(rows: ledger, churnReasons: ["Production|b1": "1", "Production|d1": "2"],
                                    boundaries: SubscriptionMetrics.boundaries(from: t0, to: t0 + 61 * day, interval: .month), now: t0 + 40 * day)
    }

    @Test("March: who is active at its end, what started, converted, renewed, churned, was refunded, and the money")
    func march() throws {
        let march = try #require(Self.months.first)
        #expect(march.start == Self.t0 && march.end == Self.t0 + 31 * Self.day)
        #expect(march.activeSubscriptions == 2 && march.activeTrials == 0)           // A and B
        #expect(march.trialsStarted == 2 && march.trialsEnded == 2)                   // A, E
        #expect(march.trialConversions == 1 && march.trialConversionRate == 0.5)      // A
        #expect(march.newSubscriptions == 3)                                          // B, C, D
        #expect(march.renewals == 1)                                                  // D's second week
        #expect(march.churned == 1 && march.churnedBilling == 1 && march.churnedVoluntary == 0)  // D
        #expect(march.refunds == 1 && march.refundRate == 0.2)                        // C, of 5 paid periods
        #expect(march.mrr == ["USD": "20.00"] && march.arr == ["USD": "240.00"])      // A and B at 10 a month
        #expect(march.grossRevenue == ["USD": "140.99", "EUR": "4.00"])
        #expect(march.purchases == 6)                                                  // a2, b1, c1, d1, d2 and the consumable
        #expect(march.netRevenue == ["USD": "20.99", "EUR": "4.00"])
    }

    @Test("April, partly elapsed: measured at now, not at the month's end")
    func april() throws {
        let april = try #require(Self.months.last)
        #expect(Self.months.count == 2)
        #expect(april.activeSubscriptions == 1 && april.renewals == 1 && april.newSubscriptions == 0)  // A renewed
        #expect(april.churned == 1 && april.churnedVoluntary == 1)                                    // B, at day 32
        #expect(april.trialsEnded == 0 && april.trialConversionRate == nil)
        #expect(april.refunds == 0 && april.refundRate == 0)
        #expect(april.mrr == ["USD": "10.00"] && april.grossRevenue == ["USD": "10.00"] && april.netRevenue == ["USD": "10.00"])
        #expect(april.purchases == 1)                                                  // a3
    }

    @Test("Periods normalise to a month: weekly × 52/12, yearly / 12, and Apple's accelerated sandbox periods likewise")
    func normalisation() {
        let weekly = SubscriptionMetrics.monthsPerPeriod(length: 7 * Self.day, environment: "Production")
        #expect(weekly == Decimal(12) / Decimal(52))
        #expect(SubscriptionMetrics.monthsPerPeriod(length: 31 * Self.day, environment: "Production") == 1)
        #expect(SubscriptionMetrics.monthsPerPeriod(length: 92 * Self.day, environment: "Production") == 3)
        #expect(SubscriptionMetrics.monthsPerPeriod(length: 366 * Self.day, environment: "Production") == 12)
        #expect(SubscriptionMetrics.monthsPerPeriod(length: 5 * 60_000, environment: "Sandbox") == 1)
        #expect(SubscriptionMetrics.monthsPerPeriod(length: 60 * 60_000, environment: "Sandbox") == 12)
        let weeklyMRR = SubscriptionMetrics.compute(rows: [Self.row("w", "w", from: 0, days: 7, price: "3", currency: "EUR")], churnReasons: [:],
                                                    boundaries: [(Self.t0, Self.t0 + Self.day)], now: Self.t0 + Self.day)
        #expect(weeklyMRR.first?.mrr == ["EUR": "13.00"])   // 3 × 52 / 12
    }

    @Test("Boundaries: UTC days, weeks from Monday, calendar months; at most 1,000")
    func boundaries() {
        let weeks = SubscriptionMetrics.boundaries(from: Self.t0, to: Self.t0 + 14 * Self.day, interval: .week)
        // 2026-03-01 is a Sunday: its week began on Monday 2026-02-23.
        #expect(weeks.first?.0 == Self.t0 - 6 * Self.day && weeks.count == 3)
        #expect(SubscriptionMetrics.boundaries(from: Self.t0, to: Self.t0 + Self.day, interval: .day).count == 1)
        #expect(SubscriptionMetrics.boundaries(from: 0, to: 4_000_000_000_000, interval: .day).count == 1000)
    }
}
