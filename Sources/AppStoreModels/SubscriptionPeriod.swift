/// A subscription period of App Store Connect: 1 week, 1, 2, 3, 6 months or 1 year (ISO 8601 form).
public enum SubscriptionPeriod: String, Codable, Sendable, CaseIterable {
    case oneWeek = "P1W"
    case oneMonth = "P1M"
    case twoMonths = "P2M"
    case threeMonths = "P3M"
    case sixMonths = "P6M"
    case oneYear = "P1Y"

    /// Parses ISO forms (`P1M`), and loose forms (`1m`, `1w`, `1y`, `7D`).
    public init?(loose value: String) {
        let upper = value.uppercased()
        if let period = SubscriptionPeriod(rawValue: upper) { self = period; return }
        switch upper {
        case "1W", "P7D", "7D", "WEEK": self = .oneWeek
        case "1M", "MONTH": self = .oneMonth
        case "2M": self = .twoMonths
        case "3M": self = .threeMonths
        case "6M": self = .sixMonths
        case "1Y", "12M", "P12M", "YEAR": self = .oneYear
        default: return nil
        }
    }

    /// Calendar length: months (0 for the week).
    public var months: Int {
        switch self {
        case .oneWeek: return 0
        case .oneMonth: return 1
        case .twoMonths: return 2
        case .threeMonths: return 3
        case .sixMonths: return 6
        case .oneYear: return 12
        }
    }

    /// `count` periods as one ISO 8601 duration (`P1M` × 3 is `P3M`), as `offerPeriod` states an offer's length.
    public func times(_ count: Int) -> String {
        let body = rawValue.dropFirst()  // "1M"
        guard let unit = body.last, let amount = Int(body.dropLast()) else { return rawValue }
        return "P\(amount * max(1, count))\(unit)"
    }
}
