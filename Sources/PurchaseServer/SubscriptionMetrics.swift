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
    /// A refund of part of the price: the refunded share in milliunits of the whole; nil is all of it.
    public var refundPercentage: Int?
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
        // Dates within ±35,000 years: a saturated date (Int64.min or .max from a hostile or broken source) cannot
        // overflow the arithmetic on it.
        func bounded(_ time: Int64) -> Int64 { min(max(time, -(1 << 50)), 1 << 50) }
        self.purchaseDate = bounded(purchaseDate)
        self.expiresDate = expiresDate.map(bounded)
        self.cancellationDate = cancellationDate.map(bounded)
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
    /// Transactions with a price bought in the interval (trials excluded): what `grossRevenue` adds up.
    public var purchases: Int = 0
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

    /// A period's price as a monthly share, in millionths (rounded half-even): what it adds to MRR.
    public static func monthlyShareMicros(_ amountMicros: Int64, length: Int64, environment: String) -> Int64 {
        SubscriptionMetricsRollup.micros(Decimal(amountMicros) / 1_000_000 / monthsPerPeriod(length: length, environment: environment))
    }

    /// The metrics of each interval, in one pass over the rows: each row's dates are placed in their interval by
    /// binary search, and a chain is looked at only for the intervals it was alive in (rows × log intervals, not
    /// rows × intervals).
    /// - Parameter churnReasons: a subscription's `expirationIntent` by `environment|originalTransactionId` (`1` voluntary, `2` billing).
    public static func compute(rows: [MetricsRow], churnReasons: [String: String], boundaries: [(Int64, Int64)], now: Int64) -> [MetricsInterval] {
        guard let first = boundaries.first?.0, let last = boundaries.last?.1 else { return [] }
        /// The interval holding `time`, if any.
        func interval(of time: Int64) -> Int? {
            guard time >= first, time < last else { return nil }
            var low = 0, high = boundaries.count - 1
            while low < high {
                let middle = (low + high + 1) / 2
                if boundaries[middle].0 <= time { low = middle } else { high = middle - 1 }
            }
            return low
        }
        // "Active at the end": the last instant of each interval that has happened.
        let ends = boundaries.map { min($0.1, now) - 1 }
        var result = boundaries.map { start, end in
            MetricsInterval(start: start, end: end, activeSubscriptions: 0, activeTrials: 0, newSubscriptions: 0, trialsStarted: 0, trialConversions: 0,
                            trialsEnded: 0, trialConversionRate: nil, renewals: 0, churned: 0, churnedVoluntary: 0, churnedBilling: 0, refunds: 0,
                            refundRate: nil, mrr: [:], arr: [:], grossRevenue: [:], netRevenue: [:])
        }
        var mrr = Array(repeating: [String: Decimal](), count: boundaries.count)
        var gross = mrr, net = mrr
        var paidStarted = Array(repeating: 0, count: boundaries.count)
        // Amounts to the millionth, as the rollup keeps them.
        func amount(_ row: MetricsRow) -> Decimal { Decimal(SubscriptionMetricsRollup.amountMicros(row)) / 1_000_000 }

        for row in rows {
            guard let currency = row.currency else { continue }
            if let index = interval(of: row.purchaseDate), !row.isTrial {
                result[index].purchases += 1
                gross[index][currency, default: 0] += amount(row)
                net[index][currency, default: 0] += amount(row)
            }
            if let refunded = row.cancellationDate, let index = interval(of: refunded) {
                result[index].refunds += 1
                net[index][currency, default: 0] -= Decimal(SubscriptionMetricsRollup.refundedMicros(row)) / 1_000_000
            }
        }
        // Refunds of rows without a price count too.
        for row in rows where row.currency == nil {
            if let refunded = row.cancellationDate, let index = interval(of: refunded) { result[index].refunds += 1 }
        }

        var chains: [String: [MetricsRow]] = [:]
        for row in rows where row.productType == .autoRenewable {
            chains[row.environment + "|" + row.originalTransactionId, default: []].append(row)
        }
        for (key, unsorted) in chains {
            let periods = unsorted.sorted { ($0.purchaseDate, $0.transactionId) < ($1.purchaseDate, $1.transactionId) }
            var seenTrial = false, seenPaid = false
            for (position, period) in periods.enumerated() {
                let index = interval(of: period.purchaseDate)
                if period.isTrial {
                    if !seenTrial, let index { result[index].trialsStarted += 1 }
                    seenTrial = true
                    continue
                }
                if let index {
                    paidStarted[index] += 1
                    if seenPaid {
                        result[index].renewals += 1
                    } else if position > 0, periods[position - 1].isTrial {
                        result[index].trialConversions += 1
                    } else {
                        result[index].newSubscriptions += 1
                    }
                }
                seenPaid = true
            }
            let valid = periods.filter { $0.cancellationDate == nil }
            for period in valid where period.isTrial {
                if let expires = period.expiresDate, expires <= now, let index = interval(of: expires) { result[index].trialsEnded += 1 }
            }
            // Churn: the chain's last valid period was a paid one, ended, and nothing follows (an unconverted trial is in trialsEnded).
            if let final = valid.last, !final.isTrial, let expires = final.expiresDate, expires <= now, let index = interval(of: expires) {
                result[index].churned += 1
                switch churnReasons[key] {
                case "1": result[index].churnedVoluntary += 1
                case "2": result[index].churnedBilling += 1
                default: break
                }
            }
            // Active at each interval's end, only over the intervals the chain was alive in.
            guard let born = valid.first?.purchaseDate else { continue }
            let died = valid.map { $0.expiresDate ?? .max }.max() ?? .max
            var index = ends.partitionPoint { $0 < born }
            while index < ends.count, ends[index] < died {
                let at = ends[index]
                if let current = valid.last(where: { $0.purchaseDate <= at && ($0.expiresDate ?? .max) > at }) {
                    if current.isTrial {
                        result[index].activeTrials += 1
                    } else {
                        result[index].activeSubscriptions += 1
                        if let currency = current.currency, let expires = current.expiresDate {
                            let share = monthlyShareMicros(SubscriptionMetricsRollup.amountMicros(current), length: expires - current.purchaseDate,
                                                           environment: current.environment)
                            mrr[index][currency, default: 0] += Decimal(share) / 1_000_000
                        }
                    }
                }
                index += 1
            }
        }
        for index in result.indices {
            result[index].trialConversionRate = result[index].trialsEnded == 0 ? nil : Double(result[index].trialConversions) / Double(result[index].trialsEnded)
            result[index].refundRate = paidStarted[index] == 0 ? nil : Double(result[index].refunds) / Double(paidStarted[index])
            result[index].mrr = mrr[index].mapValues(money)
            result[index].arr = mrr[index].mapValues { money($0 * 12) }
            result[index].grossRevenue = gross[index].mapValues(money)
            result[index].netRevenue = net[index].mapValues(money)
        }
        return result
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

extension Array {
    /// The index of the first element for which `isBefore` is false (the array is partitioned by it).
    func partitionPoint(_ isBefore: (Element) -> Bool) -> Int {
        var low = 0, high = count
        while low < high {
            let middle = (low + high) / 2
            if isBefore(self[middle]) { low = middle + 1 } else { high = middle }
        }
        return low
    }
}
