import Foundation

/// How a customer pays for an auto-renewable subscription (App Store Connect's billing plans, 2026): the whole
/// period up front, or a yearly subscription paid in monthly installments over a 12-month commitment.
public struct BillingPlan: Codable, Sendable, Equatable {
    /// Apple's `billingPlanType` (transactions) and `renewalBillingPlanType` (renewal info).
    public enum Kind: String, Codable, Sendable, CaseIterable {
        case billedUpfront = "BILLED_UPFRONT"
        case monthly = "MONTHLY"

        /// Reads Apple's spelling and the camel-case one some tools write (`billedUpfront`, `monthly`).
        public init?(loose text: String) {
            switch text.uppercased().replacingOccurrences(of: "_", with: "") {
            case "BILLEDUPFRONT": self = .billedUpfront
            case "MONTHLY": self = .monthly
            default: return nil
            }
        }
    }

    public var type: Kind
    /// The price of each charge: the period's price (up front), or one month's installment (monthly).
    public var amount: String
    /// The whole commitment's price (monthly plans): what the customer agrees to pay over `commitmentMonths`.
    public var commitmentAmount: String?
    /// Whether the plan is offered (`isEnabled` in a .storekit file).
    public var isEnabled: Bool

    /// Creates a plan.
    public init(type: Kind, amount: String, commitmentAmount: String? = nil, isEnabled: Bool = true) {
        self.type = type
        self.amount = amount
        self.commitmentAmount = commitmentAmount
        self.isEnabled = isEnabled
    }

    /// The plan every subscription has: the whole period up front, at the product's price.
    public static func upFront(_ product: CatalogProduct) -> BillingPlan {
        BillingPlan(type: .billedUpfront, amount: product.prices.first?.amount ?? "0")
    }

    /// How many monthly installments one commitment has (Apple's only commitment: 12 months).
    public static let commitmentMonths = 12
}

/// `commitmentInfo` of a signed transaction paid on a monthly plan (App Store Server API 1.21, 2026).
public struct TransactionCommitmentInfo: Codable, Sendable, Equatable {
    /// Which installment this transaction is, 1…`totalBillingPeriods`.
    public var billingPeriodNumber: Int
    /// When the commitment ends (Unix milliseconds).
    public var commitmentExpiresDate: Int64
    /// The whole commitment's price in milliunits.
    public var commitmentPrice: Int64?
    public var totalBillingPeriods: Int

    /// Creates the info.
    public init(billingPeriodNumber: Int, commitmentExpiresDate: Int64, commitmentPrice: Int64?, totalBillingPeriods: Int) {
        self.billingPeriodNumber = billingPeriodNumber
        self.commitmentExpiresDate = commitmentExpiresDate
        self.commitmentPrice = commitmentPrice
        self.totalBillingPeriods = totalBillingPeriods
    }

    /// Reads it from a decoded payload; nil when a field every commitment has is missing.
    public init?(json: JSONValue?) {
        guard let json, let number = json["billingPeriodNumber"]?.int64, let total = json["totalBillingPeriods"]?.int64,
              let expires = json["commitmentExpiresDate"]?.int64,
              (1...1_000).contains(number), (1...1_000).contains(total) else { return nil }
        self.init(billingPeriodNumber: Int(number), commitmentExpiresDate: expires, commitmentPrice: json["commitmentPrice"]?.int64,
                  totalBillingPeriods: Int(total))
    }

    func write(into json: inout JSONBuffer) {
        json.object { json in
            json.field("billingPeriodNumber", Int64(billingPeriodNumber))
            json.field("commitmentExpiresDate", commitmentExpiresDate)
            if let commitmentPrice { json.field("commitmentPrice", commitmentPrice) }
            json.field("totalBillingPeriods", Int64(totalBillingPeriods))
        }
    }
}
