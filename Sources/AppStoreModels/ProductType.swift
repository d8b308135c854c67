/// The five kinds of in-app purchase of the seeds.
public enum ProductType: String, Codable, Sendable, CaseIterable {
    case consumable
    case nonConsumable = "non-consumable"
    case autoRenewable = "auto-renewable"
    case nonRenewing = "non-renewing"
    case freeSubscription = "free-subscription"

    /// Parses our names, App Store Connect wording and `.storekit` type names.
    public init?(loose value: String) {
        let key = value.lowercased().replacingOccurrences(of: "_", with: "").replacingOccurrences(of: "-", with: "").replacingOccurrences(of: " ", with: "")
        switch key {
        case "consumable": self = .consumable
        case "nonconsumable": self = .nonConsumable
        case "autorenewable", "autorenewablesubscription", "recurringsubscription", "autorenewingsubscription": self = .autoRenewable
        case "nonrenewing", "nonrenewingsubscription": self = .nonRenewing
        case "freesubscription", "free": self = .freeSubscription
        default: return nil
        }
    }

    /// The value of receipt attribute 1707 as third-party parsers read it.
    public var receiptProductTypeCode: Int {
        switch self {
        case .nonConsumable, .freeSubscription: return 0
        case .consumable: return 1
        case .nonRenewing: return 2
        case .autoRenewable: return 3
        }
    }

    /// The `type` string of StoreKit 2 transactions.
    public var transactionTypeName: String {
        switch self {
        case .consumable: return "Consumable"
        case .nonConsumable, .freeSubscription: return "Non-Consumable"
        case .nonRenewing: return "Non-Renewing Subscription"
        case .autoRenewable: return "Auto-Renewable Subscription"
        }
    }

    /// Whether restoring completed transactions brings this type back (Apple restores these only).
    public var isRestorable: Bool { self == .nonConsumable || self == .autoRenewable || self == .freeSubscription }

    /// Whether a finished transaction of this type leaves the app receipt.
    public var leavesReceiptWhenFinished: Bool { self == .consumable }
}
