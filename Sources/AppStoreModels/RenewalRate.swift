/// How fast subscriptions renew: real time (production) or one of the sandbox accelerated rates.
public enum RenewalRate: String, Codable, Sendable, CaseIterable {
    case realTime = "REAL_TIME"
    case monthlyEveryHour = "MONTHLY_RENEWAL_EVERY_ONE_HOUR"
    case monthlyEveryThirtyMinutes = "MONTHLY_RENEWAL_EVERY_THIRTY_MINUTES"
    case monthlyEveryFifteenMinutes = "MONTHLY_RENEWAL_EVERY_FIFTEEN_MINUTES"
    case monthlyEveryFiveMinutes = "MONTHLY_RENEWAL_EVERY_FIVE_MINUTES"
    case monthlyEveryThreeMinutes = "MONTHLY_RENEWAL_EVERY_THREE_MINUTES"

    /// The sandbox default: a month is five minutes.
    public static let sandboxDefault = RenewalRate.monthlyEveryFiveMinutes

    /// Maps a `.storekit` `_timeRate` value (SKTestSession.TimeRate) to a rate.
    public init?(storeKitTimeRate: Int) {
        switch storeKitTimeRate {
        case 0: self = .realTime
        case 10: self = .monthlyEveryHour
        case 11: self = .monthlyEveryThirtyMinutes
        case 12: self = .monthlyEveryFifteenMinutes
        case 13: self = .monthlyEveryFiveMinutes
        case 14: self = .monthlyEveryThreeMinutes
        default: return nil
        }
    }

    /// Accelerated length in seconds of one period, or nil in real time (use the calendar).
    public func acceleratedSeconds(for period: SubscriptionPeriod) -> Int? {
        let minute = 60
        let table: [SubscriptionPeriod: Int]
        switch self {
        case .realTime: return nil
        case .monthlyEveryThreeMinutes:
            table = [.oneWeek: 3, .oneMonth: 3, .twoMonths: 6, .threeMonths: 9, .sixMonths: 18, .oneYear: 36]
        case .monthlyEveryFiveMinutes:
            table = [.oneWeek: 3, .oneMonth: 5, .twoMonths: 10, .threeMonths: 15, .sixMonths: 30, .oneYear: 60]
        case .monthlyEveryFifteenMinutes:
            table = [.oneWeek: 5, .oneMonth: 15, .twoMonths: 30, .threeMonths: 45, .sixMonths: 90, .oneYear: 180]
        case .monthlyEveryThirtyMinutes:
            table = [.oneWeek: 10, .oneMonth: 30, .twoMonths: 60, .threeMonths: 90, .sixMonths: 180, .oneYear: 360]
        case .monthlyEveryHour:
            table = [.oneWeek: 15, .oneMonth: 60, .twoMonths: 120, .threeMonths: 180, .sixMonths: 360, .oneYear: 720]
        }
        return table[period].map { $0 * minute }
    }
}
