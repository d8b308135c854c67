import AppStoreModels
import Foundation

/// One figure the daily rollup keeps. The first group belongs to the day it happened on whenever it is asked;
/// the second (`isMoment`) is seen only once its instant has passed: who is active, MRR, trials ended, churn.
public enum MetricsField: Int, CaseIterable, Sendable {
    case newSubscriptions, trialsStarted, trialConversions, renewals, paidStarted, sales, refunds, grossMicros, netMicros
    case activeSubscriptions, activeTrials, mrrMicros, trialsEnded, churned, churnedVoluntary, churnedBilling

    public var isMoment: Bool { rawValue >= MetricsField.activeSubscriptions.rawValue }
    /// The column in `metrics_days` and `metrics_moments`.
    public var column: String { Self.columns[rawValue] }
    private static let columns: [String] = allCases.map { field in
        String(describing: field).reduce(into: "") { name, character in
            if character.isUppercase { name += "_" + character.lowercased() } else { name.append(character) }
        }
    }
    static let days = allCases.filter { !$0.isMoment }
    static let moments = allCases.filter(\.isMoment)
}

/// A value for every `MetricsField`: what one chain adds to one day and currency, or a day's total.
public struct MetricsTally: Sendable, Equatable {
    public private(set) var values = [Int64](repeating: 0, count: MetricsField.allCases.count)

    public init() {}

    public subscript(field: MetricsField) -> Int64 {
        get { values[field.rawValue] }
        set { values[field.rawValue] = newValue }
    }

    public var isZero: Bool { values.allSatisfy { $0 == 0 } }

    public static func += (left: inout MetricsTally, right: MetricsTally) {
        for index in left.values.indices { left.values[index] = left.values[index] &+ right.values[index] }
    }

    public static func -= (left: inout MetricsTally, right: MetricsTally) {
        for index in left.values.indices { left.values[index] = left.values[index] &- right.values[index] }
    }

    /// Only the fields of one group.
    func keeping(moments: Bool) -> MetricsTally {
        var kept = self
        for field in MetricsField.allCases where field.isMoment != moments { kept[field] = 0 }
        return kept
    }
}

/// A UTC day (its first millisecond) and a currency ("" for counts that have none).
public struct MetricsKey: Hashable, Sendable, Comparable {
    public var day: Int64
    public var currency: String

    public init(day: Int64, currency: String) {
        self.day = day
        self.currency = currency
    }

    public static func < (left: MetricsKey, right: MetricsKey) -> Bool { (left.day, left.currency) < (right.day, right.currency) }
}

/// A change that is true from an instant on: seen by a question asked at `now` when `visibleAt < now`.
public struct MetricsMoment: Sendable, Equatable {
    public var visibleAt: Int64
    public var key: MetricsKey
    public var tally: MetricsTally
}

/// What one subscription chain (all the ledger rows of one environment and original transaction) adds to the
/// rollup. It depends only on the rows and the chain's end reason, never on the time of asking.
public struct MetricsContribution: Sendable, Equatable {
    public var days: [MetricsKey: MetricsTally] = [:]
    public var moments: [MetricsMoment] = []

    /// Everything, moments included, by day and currency: what `metrics_days` holds.
    public var byDay: [MetricsKey: MetricsTally] {
        var all = days
        for moment in moments { all[moment.key, default: MetricsTally()] += moment.tally }
        return all
    }
}

/// The incremental form of `SubscriptionMetrics.compute`: each chain's contribution is kept per day, so a question
/// reads days (a few thousand rows for years) instead of the ledger (millions). `SubscriptionMetricsRollupTests`
/// checks that both give the same figures on random ledgers at random times.
public enum SubscriptionMetricsRollup {
    static let dayLength: Int64 = 86_400_000

    /// The first millisecond of the UTC day holding `time`.
    public static func day(of time: Int64) -> Int64 {
        let (quotient, remainder) = time.quotientAndRemainder(dividingBy: dayLength)
        return (remainder < 0 ? quotient - 1 : quotient) * dayLength
    }

    /// A price in millionths, rounded half-even and bounded (a hostile mapping cannot overflow a sum).
    public static func micros(_ amount: Decimal) -> Int64 {
        var scaled = amount * 1_000_000
        var rounded = Decimal()
        NSDecimalRound(&rounded, &scaled, 0, .bankers)
        let limit = Decimal(Int64(1) << 52)
        if rounded > limit { return 1 << 52 }
        if rounded < -limit { return -(1 << 52) }
        return NSDecimalNumber(decimal: rounded).int64Value
    }

    /// A row's amount in millionths: unit price × quantity, saturating.
    static func amountMicros(_ row: MetricsRow) -> Int64 {
        let (product, overflow) = micros(row.price ?? 0).multipliedReportingOverflow(by: max(0, min(row.quantity, 1 << 20)))
        return overflow ? 1 << 52 : product
    }

    /// What a refund of a row gives back in millionths: all of its amount, or the refunded share of a prorated
    /// refund, rounded down to the millionth.
    static func refundedMicros(_ row: MetricsRow) -> Int64 {
        let whole = amountMicros(row)
        guard let share = row.refundPercentage, (0..<100_000).contains(share) else { return whole }
        let (product, overflow) = whole.multipliedReportingOverflow(by: Int64(share))
        return overflow ? whole / 100_000 * Int64(share) : product / 100_000
    }

    /// What a chain's rows add. `rows` are every ledger row of one environment and original transaction.
    public static func contribution(of rows: [MetricsRow], churnReason: String?) -> MetricsContribution {
        var result = MetricsContribution()
        func add(_ field: MetricsField, _ value: Int64 = 1, at time: Int64, currency: String = "") {
            result.days[MetricsKey(day: day(of: time), currency: currency), default: MetricsTally()][field] &+= value
        }
        for row in rows {
            if let currency = row.currency, !row.isTrial {
                add(.sales, at: row.purchaseDate, currency: currency)
                add(.grossMicros, amountMicros(row), at: row.purchaseDate, currency: currency)
                add(.netMicros, amountMicros(row), at: row.purchaseDate, currency: currency)
            }
            if let refunded = row.cancellationDate {
                add(.refunds, at: refunded, currency: row.currency ?? "")
                if let currency = row.currency { add(.netMicros, -refundedMicros(row), at: refunded, currency: currency) }
            }
        }
        let periods = rows.filter { $0.productType == .autoRenewable }
            .sorted { ($0.purchaseDate, $0.transactionId) < ($1.purchaseDate, $1.transactionId) }
        guard !periods.isEmpty else { return result }
        var seenTrial = false, seenPaid = false
        for (position, period) in periods.enumerated() {
            if period.isTrial {
                if !seenTrial { add(.trialsStarted, at: period.purchaseDate) }
                seenTrial = true
                continue
            }
            add(.paidStarted, at: period.purchaseDate)
            if seenPaid {
                add(.renewals, at: period.purchaseDate)
            } else if position > 0, periods[position - 1].isTrial {
                add(.trialConversions, at: period.purchaseDate)
            } else {
                add(.newSubscriptions, at: period.purchaseDate)
            }
            seenPaid = true
        }

        func moment(_ field: MetricsField, _ value: Int64 = 1, visibleAt: Int64, day time: Int64, currency: String = "") {
            var tally = MetricsTally()
            tally[field] = value
            result.moments.append(MetricsMoment(visibleAt: visibleAt, key: MetricsKey(day: day(of: time), currency: currency), tally: tally))
        }
        let valid = periods.filter { $0.cancellationDate == nil }
        // Trials and churn count once their expiry has passed (`expires <= now`, so seen from `expires - 1`).
        for period in valid where period.isTrial {
            if let expires = period.expiresDate { moment(.trialsEnded, visibleAt: expires - 1, day: expires) }
        }
        if let final = valid.last, !final.isTrial, let expires = final.expiresDate {
            moment(.churned, visibleAt: expires - 1, day: expires)
            switch churnReason {
            case "1": moment(.churnedVoluntary, visibleAt: expires - 1, day: expires)
            case "2": moment(.churnedBilling, visibleAt: expires - 1, day: expires)
            default: break
            }
        }
        // Who is active changes only where a valid period starts or ends: a moment at each change of the chain's state.
        let instants = Set(valid.flatMap { [$0.purchaseDate] + ($0.expiresDate.map { [$0] } ?? []) }).sorted()
        var previous = ActiveState.none
        for instant in instants {
            let state = ActiveState(valid.last { $0.purchaseDate <= instant && ($0.expiresDate ?? .max) > instant })
            guard state != previous else { continue }
            for (currency, tally) in state.tallies(minus: previous) {
                result.moments.append(MetricsMoment(visibleAt: instant, key: MetricsKey(day: day(of: instant), currency: currency), tally: tally))
            }
            previous = state
        }
        return result
    }

    /// Millionths as money text with two decimals, rounded half-even: what `SubscriptionMetrics.money` makes of the
    /// same amount, in integer arithmetic (Decimal formatting was most of a year's answer by day).
    static func money(micros: Int64) -> String {
        let (whole, rest) = micros.quotientAndRemainder(dividingBy: 10_000)   // cents, and the millionths below a cent
        var cents = whole
        let half: Int64 = 5_000
        if rest.magnitude > UInt64(half) || (rest.magnitude == UInt64(half) && whole % 2 != 0) { cents += rest < 0 ? -1 : 1 }
        let sign = cents < 0 ? "-" : ""
        let units = cents.magnitude / 100, fraction = cents.magnitude % 100
        return sign + String(units) + "." + (fraction < 10 ? "0" : "") + String(fraction)
    }

    /// What a chain is at an instant: nothing, in a trial, or in a paid period (with its monthly share, when priced).
    enum ActiveState: Equatable {
        case none
        case trial
        /// `currency` is "" when the period has no price or no expiry (it counts, but adds no MRR).
        case paid(currency: String, mrrMicros: Int64)

        init(_ period: MetricsRow?) {
            guard let period else { self = .none; return }
            if period.isTrial { self = .trial; return }
            guard let currency = period.currency, let expires = period.expiresDate else { self = .paid(currency: "", mrrMicros: 0); return }
            self = .paid(currency: currency, mrrMicros: SubscriptionMetrics.monthlyShareMicros(amountMicros(period), length: expires - period.purchaseDate,
                                                                                                environment: period.environment))
        }

        private func tally(sign: Int64) -> (String, MetricsTally)? {
            var tally = MetricsTally()
            switch self {
            case .none: return nil
            case .trial:
                tally[.activeTrials] = sign
                return ("", tally)
            case .paid(let currency, let mrr):
                tally[.activeSubscriptions] = sign
                tally[.mrrMicros] = sign * mrr
                return (currency, tally)
            }
        }

        /// The change from `previous` to this state, per currency.
        func tallies(minus previous: ActiveState) -> [(String, MetricsTally)] {
            var changes: [String: MetricsTally] = [:]
            for (currency, tally) in [previous.tally(sign: -1), tally(sign: 1)].compactMap({ $0 }) {
                changes[currency, default: MetricsTally()] += tally
            }
            return changes.filter { !$0.value.isZero }.sorted { $0.key < $1.key }
        }
    }

    /// The figures of each interval from the rollup's days and today's moments, as `SubscriptionMetrics.compute`
    /// would give them from the rows at `now`.
    /// - Parameters:
    ///   - days: totals by day and currency (moments included), for every day before the last boundary.
    ///   - moments: the moments of the day holding `now` (only those already visible count).
    public static func intervals(days: [MetricsKey: MetricsTally], moments: [MetricsMoment], boundaries: [(Int64, Int64)], now: Int64) -> [MetricsInterval] {
        let today = day(of: now)
        var composed: [MetricsKey: MetricsTally] = [:]
        for (key, tally) in days {
            composed[key, default: MetricsTally()] += key.day < today ? tally : tally.keeping(moments: false)
        }
        for moment in moments where moment.key.day == today && moment.visibleAt < now {
            composed[moment.key, default: MetricsTally()] += moment.tally
        }
        let ordered = composed.sorted { $0.key < $1.key }
        var position = 0
        var running: [String: MetricsTally] = [:]   // moments summed over every day so far, per currency
        return boundaries.map { start, end in
            var counted: [String: MetricsTally] = [:]  // everything on the interval's days, per currency
            while position < ordered.count, ordered[position].key.day < end {
                let (key, tally) = ordered[position]
                running[key.currency, default: MetricsTally()] += tally.keeping(moments: true)
                if key.day >= start { counted[key.currency, default: MetricsTally()] += tally }
                position += 1
            }
            func total(_ field: MetricsField, _ source: [String: MetricsTally]) -> Int { Int(clamping: source.values.reduce(0) { $0 &+ $1[field] }) }
            func money(_ micros: Int64) -> String { SubscriptionMetricsRollup.money(micros: micros) }
            var interval = MetricsInterval(
                start: start, end: end, activeSubscriptions: total(.activeSubscriptions, running), activeTrials: total(.activeTrials, running),
                newSubscriptions: total(.newSubscriptions, counted), trialsStarted: total(.trialsStarted, counted),
                trialConversions: total(.trialConversions, counted), trialsEnded: total(.trialsEnded, counted), trialConversionRate: nil,
                renewals: total(.renewals, counted), churned: total(.churned, counted), churnedVoluntary: total(.churnedVoluntary, counted),
                churnedBilling: total(.churnedBilling, counted), refunds: total(.refunds, counted), refundRate: nil, mrr: [:], arr: [:],
                grossRevenue: [:], netRevenue: [:])
            interval.purchases = Int(clamping: counted.filter { !$0.key.isEmpty }.values.reduce(0) { $0 &+ $1[.sales] })
            interval.trialConversionRate = interval.trialsEnded == 0 ? nil : Double(interval.trialConversions) / Double(interval.trialsEnded)
            let paid = total(.paidStarted, counted)
            interval.refundRate = paid == 0 ? nil : Double(interval.refunds) / Double(paid)
            for (currency, tally) in running where !currency.isEmpty && tally[.activeSubscriptions] > 0 {
                interval.mrr[currency] = money(tally[.mrrMicros])
                interval.arr[currency] = money(tally[.mrrMicros].multipliedReportingOverflow(by: 12).partialValue)
            }
            for (currency, tally) in counted where !currency.isEmpty {
                if tally[.sales] > 0 { interval.grossRevenue[currency] = money(tally[.grossMicros]) }
                if tally[.sales] > 0 || tally[.refunds] > 0 { interval.netRevenue[currency] = money(tally[.netMicros]) }
            }
            return interval
        }
    }
}
