/// How fast subscriptions renew: real time (production) or one of the sandbox accelerated rates.
public enum RenewalRate: String, Codable, Sendable, CaseIterable {
    case realTime = "REAL_TIME"
    case monthlyEveryHour = "MONTHLY_RENEWAL_EVERY_ONE_HOUR"
    case monthlyEveryThirtyMinutes = "MONTHLY_RENEWAL_EVERY_THIRTY_MINUTES"
    case monthlyEveryFifteenMinutes = "MONTHLY_RENEWAL_EVERY_FIFTEEN_MINUTES"
    case monthlyEveryFiveMinutes = "MONTHLY_RENEWAL_EVERY_FIVE_MINUTES"
    case monthlyEveryThreeMinutes = "MONTHLY_RENEWAL_EVERY_THREE_MINUTES"
    /// TestFlight builds: every subscription renews daily, whatever its duration, six times at most.
    case testFlight = "TESTFLIGHT_DAILY"
    // Xcode-only rates (SKTestSession.TimeRate): a day compressed to a span of seconds, a month in thirty
    // seconds, or every period of any length renewing after a fixed span.
    case oneHourIsOneDay = "XCODE_ONE_HOUR_IS_ONE_DAY"
    case thirtyMinutesIsOneDay = "XCODE_THIRTY_MINUTES_IS_ONE_DAY"
    case fiveMinutesIsOneDay = "XCODE_FIVE_MINUTES_IS_ONE_DAY"
    case oneMinuteIsOneDay = "XCODE_ONE_MINUTE_IS_ONE_DAY"
    case thirtySecondsIsOneDay = "XCODE_THIRTY_SECONDS_IS_ONE_DAY"
    case oneSecondIsOneDay = "XCODE_ONE_SECOND_IS_ONE_DAY"
    case monthlyEveryThirtySeconds = "XCODE_MONTHLY_RENEWAL_EVERY_THIRTY_SECONDS"
    case oneRenewalEveryFifteenMinutes = "XCODE_ONE_RENEWAL_EVERY_FIFTEEN_MINUTES"
    case oneRenewalEveryFiveMinutes = "XCODE_ONE_RENEWAL_EVERY_FIVE_MINUTES"
    case oneRenewalEveryMinute = "XCODE_ONE_RENEWAL_EVERY_MINUTE"
    case oneRenewalEveryThirtySeconds = "XCODE_ONE_RENEWAL_EVERY_THIRTY_SECONDS"
    case oneRenewalEveryTenSeconds = "XCODE_ONE_RENEWAL_EVERY_TEN_SECONDS"
    case oneRenewalEveryTwoSeconds = "XCODE_ONE_RENEWAL_EVERY_TWO_SECONDS"

    /// How many times TestFlight renews a subscription before turning auto-renew off.
    public static let testFlightRenewals = 6

    /// The sandbox default: a month is five minutes.
    public static let sandboxDefault = RenewalRate.monthlyEveryFiveMinutes

    /// Maps a `.storekit` `_timeRate` value (SKTestSession.TimeRate) to a rate.
    public init?(storeKitTimeRate: Int) {
        // SKTestTimeRate's raw values: 1–6 (deprecated day compressions), 10–13 and 15, 1000–1005. 14 is not
        // Apple's; it is read as App Store Connect's three-minute sandbox rate, which SKTestSession lacks.
        switch storeKitTimeRate {
        case 0: self = .realTime
        case 1: self = .oneHourIsOneDay
        case 2: self = .thirtyMinutesIsOneDay
        case 3: self = .fiveMinutesIsOneDay
        case 4: self = .oneMinuteIsOneDay
        case 5: self = .thirtySecondsIsOneDay
        case 6: self = .oneSecondIsOneDay
        case 10: self = .monthlyEveryHour
        case 11: self = .monthlyEveryThirtyMinutes
        case 12: self = .monthlyEveryFifteenMinutes
        case 13: self = .monthlyEveryFiveMinutes
        case 14: self = .monthlyEveryThreeMinutes
        case 15: self = .monthlyEveryThirtySeconds
        case 1000: self = .oneRenewalEveryFifteenMinutes
        case 1001: self = .oneRenewalEveryFiveMinutes
        case 1002: self = .oneRenewalEveryMinute
        case 1003: self = .oneRenewalEveryThirtySeconds
        case 1004: self = .oneRenewalEveryTenSeconds
        case 1005: self = .oneRenewalEveryTwoSeconds
        default: return nil
        }
    }

    /// The SKTestSession.TimeRate raw value of the rate (what a `.storekit` file's `_timeRate` holds); nil for TestFlight's.
    public var storeKitTimeRate: Int? {
        let values: [RenewalRate: Int] = [.realTime: 0, .oneHourIsOneDay: 1, .thirtyMinutesIsOneDay: 2, .fiveMinutesIsOneDay: 3, .oneMinuteIsOneDay: 4,
                                          .thirtySecondsIsOneDay: 5, .oneSecondIsOneDay: 6, .monthlyEveryHour: 10, .monthlyEveryThirtyMinutes: 11,
                                          .monthlyEveryFifteenMinutes: 12, .monthlyEveryFiveMinutes: 13, .monthlyEveryThreeMinutes: 14,
                                          .monthlyEveryThirtySeconds: 15, .oneRenewalEveryFifteenMinutes: 1000, .oneRenewalEveryFiveMinutes: 1001,
                                          .oneRenewalEveryMinute: 1002, .oneRenewalEveryThirtySeconds: 1003, .oneRenewalEveryTenSeconds: 1004,
                                          .oneRenewalEveryTwoSeconds: 1005]
        return values[self]
    }

    /// Days in a period, for the rates that compress days.
    static func days(_ period: SubscriptionPeriod) -> Int {
        switch period {
        case .oneWeek: 7
        case .oneMonth: 30
        case .twoMonths: 60
        case .threeMonths: 90
        case .sixMonths: 180
        case .oneYear: 365
        }
    }

    /// Accelerated length in seconds of one period, or nil in real time (use the calendar).
    public func acceleratedSeconds(for period: SubscriptionPeriod) -> Int? {
        let minute = 60
        let table: [SubscriptionPeriod: Int]
        switch self {
        case .realTime: return nil
        case .testFlight: return 86_400
        case .oneHourIsOneDay: return Self.days(period) * 3600
        case .thirtyMinutesIsOneDay: return Self.days(period) * 1800
        case .fiveMinutesIsOneDay: return Self.days(period) * 300
        case .oneMinuteIsOneDay: return Self.days(period) * 60
        case .thirtySecondsIsOneDay: return Self.days(period) * 30
        case .oneSecondIsOneDay: return Self.days(period)
        case .oneRenewalEveryFifteenMinutes: return 15 * minute
        case .oneRenewalEveryFiveMinutes: return 5 * minute
        case .oneRenewalEveryMinute: return minute
        case .oneRenewalEveryThirtySeconds: return 30
        case .oneRenewalEveryTenSeconds: return 10
        case .oneRenewalEveryTwoSeconds: return 2
        case .monthlyEveryThirtySeconds:
            let seconds: [SubscriptionPeriod: Int] = [.oneWeek: 10, .oneMonth: 30, .twoMonths: 60, .threeMonths: 90, .sixMonths: 180, .oneYear: 360]
            return seconds[period]
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
