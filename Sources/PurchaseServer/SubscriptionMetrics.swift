import AppStoreModels
import Foundation

/// One ledger row as the subscription metrics read it.
public struct MetricsRow: Sendable, Equatable {
    public var transactionId: String
    public var originalTransactionId: String
    public var environment: String
    public var productType: ProductType
    public var purchaseDate: Int64
    public var expiresDate: Int64?
    public var cancellationDate: Int64?
    public var isTrial: Bool
    public var quantity: Int64
    /// The unit price and its currency, as the product mapping had them.
    public var price: Decimal?
    public var currency: String?

    public init(transactionId: String, originalTransactionId: String, environment: String = "Production", productType: ProductType,
                purchaseDate: Int64, expiresDate: Int64? = nil, cancellationDate: Int64? = nil, isTrial: Bool = false, quantity: Int64 = 1,
                price: Decimal? = nil, currency: String? = nil) {
        self.transactionId = transactionId
        self.originalTransactionId = originalTransactionId
        self.environment = environment
        self.productType = productType
        self.purchaseDate = purchaseDate
        self.expiresDate = expiresDate
        self.cancellationDate = cancellationDate
        self.isTrial = isTrial
        self.quantity = quantity
        self.price = price
        self.currency = currency
    }
}

/// The figures of one interval (`GET /admin/v1/apps/{app}/metrics`).
public struct MetricsInterval: Codable, Sendable, Equatable {
    /// The interval [start, end) in Unix ms.
    public var start: Int64
    public var end: Int64
    /// Subscriptions in a paid period at the end of the interval.
    public var activeSubscriptions: Int
    /// Subscriptions in a free trial at the end of the interval.
    public var activeTrials: Int
    /// Subscriptions whose first paid period started in the interval, without a trial before it.
    public var newSubscriptions: Int
    public var trialsStarted: Int
    /// Subscriptions whose first paid period, started in the interval, followed a trial.
    public var trialConversions: Int
    /// Trials that ended in the interval (converted or not): the denominator of the conversion rate.
    public var trialsEnded: Int
    /// `trialConversions / trialsEnded`, or nil when no trial ended.
    public var trialConversionRate: Double?
    /// Paid periods after the first that started in the interval.
    public var renewals: Int
    /// Paid subscriptions whose last period ended in the interval with nothing after it, by reason.
    public var churned: Int
    public var churnedVoluntary: Int
    public var churnedBilling: Int
    /// Transactions refunded in the interval (by their cancellation date), and their share of the paid periods started in it.
    public var refunds: Int
    public var refundRate: Double?
    /// Monthly recurring revenue at the end of the interval, per currency: every active paid period's price normalised to a month.
    public var mrr: [String: String]
    /// `12 × mrr`.
    public var arr: [String: String]
    /// Everything bought in the interval, per currency; net takes away what was refunded in it.
    public var grossRevenue: [String: String]
    public var netRevenue: [String: String]
}

/// Subscription metrics as a pure function of ledger rows, subscription end reasons and the interval
/// boundaries: every definition is here, and `SubscriptionMetricsTests` checks each on a hand-computed ledger.
public enum SubscriptionMetrics {
    public enum Interval: String, Codable, Sendable, CaseIterable { case day, week, month }

    /// The boundaries from `from` to `to` (ms, UTC) by `interval`: days, weeks starting Monday, calendar months.
    /// At most 1,000 intervals.
    public static func boundaries(from: Int64, to: Int64, interval: Interval) -> [(Int64, Int64)] {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        calendar.firstWeekday = 2
        let component: Calendar.Component = switch interval {
        case .day: .day
        case .week: .weekOfYear
        case .month: .month
        }
        var start = calendar.dateInterval(of: component, for: Date(timeIntervalSince1970: Double(from) / 1000))?.start
            ?? Date(timeIntervalSince1970: Double(from) / 1000)
        var result: [(Int64, Int64)] = []
        while Int64(start.timeIntervalSince1970 * 1000) < to, result.count < 1000 {
            guard let next = calendar.date(byAdding: component, value: 1, to: start) else { break }
            result.append((Int64(start.timeIntervalSince1970 * 1000), Int64(next.timeIntervalSince1970 * 1000)))
            start = next
        }
        return result
    }

    /// How many of a period fit in a month, from its length: a week is 52/12 a month, a year 1/12. Sandbox
    /// periods are Apple's accelerated ones (3 min a week, 5 min a month, … an hour a year).
    public static func monthsPerPeriod(length: Int64, environment: String) -> Decimal {
        let minutes = Double(length) / 60_000
        let months: [Decimal] = [Decimal(12) / Decimal(52), 1, 2, 3, 6, 12]
        // Each period's length in minutes: Apple's sandbox table, or calendar lengths.
        let sandbox: [Double] = [3, 5, 10, 15, 30, 60]
        let calendar: [Double] = [7, 30.44, 60.88, 91.31, 182.62, 365.25].map { $0 * 1440 }
        let lengths = environment == "Sandbox" ? sandbox : calendar
        let nearest = lengths.indices.min { abs(lengths[$0] - minutes) < abs(lengths[$1] - minutes) } ?? 1
        return months[nearest]
    }

    /// The metrics of each interval.
    /// - Parameter churnReasons: a subscription's `expirationIntent` by `environment|originalTransactionId` (`1` voluntary, `2` billing).
    public static func compute(rows: [MetricsRow], churnReasons: [String: String], boundaries: [(Int64, Int64)], now: Int64) -> [MetricsInterval] {
        var chains: [String: [MetricsRow]] = [:]
        for row in rows where row.productType == .autoRenewable {
            chains[row.environment + "|" + row.originalTransactionId, default: []].append(row)
        }
        for key in chains.keys { chains[key]?.sort { ($0.purchaseDate, $0.transactionId) < ($1.purchaseDate, $1.transactionId) } }
        func amount(_ row: MetricsRow) -> Decimal { (row.price ?? 0) * Decimal(row.quantity) }

        return boundaries.map { start, end in
            var interval = MetricsInterval(start: start, end: end, activeSubscriptions: 0, activeTrials: 0, newSubscriptions: 0, trialsStarted: 0,
                                           trialConversions: 0, trialsEnded: 0, trialConversionRate: nil, renewals: 0, churned: 0,
                                           churnedVoluntary: 0, churnedBilling: 0, refunds: 0, refundRate: nil, mrr: [:], arr: [:],
                                           grossRevenue: [:], netRevenue: [:])
            var mrr: [String: Decimal] = [:]
            var paidStarted = 0
            let at = min(end, now) - 1   // "active at the end": the last instant of the interval that has happened
            for (key, periods) in chains {
                let valid = periods.filter { $0.cancellationDate == nil }
                if let current = valid.last(where: { $0.purchaseDate <= at && ($0.expiresDate ?? .max) > at }) {
                    if current.isTrial {
                        interval.activeTrials += 1
                    } else {
                        interval.activeSubscriptions += 1
                        if let currency = current.currency, let expires = current.expiresDate {
                            mrr[currency, default: 0] += amount(current) / monthsPerPeriod(length: expires - current.purchaseDate, environment: current.environment)
                        }
                    }
                }
                for (index, period) in periods.enumerated() where (start..<end).contains(period.purchaseDate) {
                    if period.isTrial {
                        if index == 0 || periods[..<index].allSatisfy({ !$0.isTrial }) { interval.trialsStarted += 1 }
                        continue
                    }
                    paidStarted += 1
                    let earlierPaid = periods[..<index].contains { !$0.isTrial }
                    if earlierPaid {
                        interval.renewals += 1
                    } else if index > 0, periods[index - 1].isTrial {
                        interval.trialConversions += 1
                    } else {
                        interval.newSubscriptions += 1
                    }
                }
                // Trials that ended in the interval, converted or not.
                interval.trialsEnded += valid.filter { period in
                    period.isTrial && period.expiresDate.map { (start..<end).contains($0) && $0 <= now } == true
                }.count
                // Churn: the chain's last valid period was a paid one, ended in the interval, and nothing follows
                // (a trial that ends unconverted is counted in trialsEnded, not as churn).
                if let last = valid.last, !last.isTrial, let expires = last.expiresDate, (start..<end).contains(expires), expires <= now {
                    interval.churned += 1
                    switch churnReasons[key] {
                    case "1": interval.churnedVoluntary += 1
                    case "2": interval.churnedBilling += 1
                    default: break
                    }
                }
            }
            var gross: [String: Decimal] = [:]
            var net: [String: Decimal] = [:]
            for row in rows {
                guard let currency = row.currency else { continue }
                if (start..<end).contains(row.purchaseDate), !row.isTrial {
                    gross[currency, default: 0] += amount(row)
                    net[currency, default: 0] += amount(row)
                }
                if let refunded = row.cancellationDate, (start..<end).contains(refunded) {
                    interval.refunds += 1
                    net[currency, default: 0] -= amount(row)
                }
            }
            interval.trialConversionRate = interval.trialsEnded == 0 ? nil : Double(interval.trialConversions) / Double(interval.trialsEnded)
            interval.refundRate = paidStarted == 0 ? nil : Double(interval.refunds) / Double(paidStarted)
            interval.mrr = mrr.mapValues(money)
            interval.arr = mrr.mapValues { money($0 * 12) }
            interval.grossRevenue = gross.mapValues(money)
            interval.netRevenue = net.mapValues(money)
            return interval
        }
    }

    /// Two decimals, rounded half-even.
    static func money(_ value: Decimal) -> String {
        var rounded = Decimal()
        var copy = value
        NSDecimalRound(&rounded, &copy, 2, .bankers)
        let text = NSDecimalNumber(decimal: rounded).stringValue
        guard let dot = text.firstIndex(of: ".") else { return text + ".00" }
        let decimals = text.distance(from: dot, to: text.endIndex) - 1
        return decimals >= 2 ? text : text + String(repeating: "0", count: 2 - decimals)
    }
}
