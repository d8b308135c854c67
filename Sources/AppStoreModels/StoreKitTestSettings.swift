import Foundation

/// The `settings` block of an Xcode `.storekit` file: StoreKit Testing's switches for one app, kept with the
/// app in the emulator's catalog and applied to its purchases and renewals (`AppStoreEmulator`).
public struct StoreKitTestSettings: Codable, Sendable, Equatable {
    /// `_timeRate` as Xcode wrote it (SKTestSession.TimeRate), and the renewal rate it maps to when the emulator has one.
    public var timeRate: Int?
    public var renewalRate: RenewalRate?
    public var storefront: String?
    public var locale: String?
    /// Purchases wait for a parent's approval (StoreKit's deferred / `.pending`).
    public var askToBuyEnabled = false
    /// Subscriptions that fail to renew get a grace period (16 days; 6 for weekly ones).
    public var billingGracePeriodEnabled = false
    /// Renewals fail to bill: subscriptions enter billing retry (`_billingIssuesEnabled`, or Xcode 15's `_renewalBillingIssuesEnabled`).
    public var billingIssuesEnabled = false
    /// Every purchase fails (`_failTransactionsEnabled`).
    public var failTransactionsEnabled = false
    public var disableDialogs = false
    /// `_storeKitErrors`: each StoreKit API Xcode lets you break ("Load Products", "Purchase", …), whether its error is on.
    public var storeKitErrors: [SimulatedError] = []
    public var applicationInternalID: String?
    public var developerTeamID: String?

    public struct SimulatedError: Codable, Sendable, Equatable {
        public var name: String
        public var enabled: Bool
        public init(name: String, enabled: Bool) {
            self.name = name
            self.enabled = enabled
        }
    }

    public init() {}

    /// Reads a `settings` object; every key is optional and unknown keys are ignored.
    public init(storeKit settings: [String: Any]) {
        func flag(_ key: String) -> Bool { (settings[key] as? Bool) ?? ((settings[key] as? NSNumber)?.boolValue ?? false) }
        timeRate = settings["_timeRate"] as? Int
        renewalRate = timeRate.flatMap(RenewalRate.init(storeKitTimeRate:))
        storefront = settings["_storefront"] as? String
        locale = settings["_locale"] as? String
        askToBuyEnabled = flag("_askToBuyEnabled")
        billingGracePeriodEnabled = flag("_billingGracePeriodEnabled")
        billingIssuesEnabled = flag("_billingIssuesEnabled") || flag("_renewalBillingIssuesEnabled")
        failTransactionsEnabled = flag("_failTransactionsEnabled")
        disableDialogs = flag("_disableDialogs")
        storeKitErrors = (settings["_storeKitErrors"] as? [[String: Any]] ?? []).compactMap { entry in
            guard let name = entry["name"] as? String else { return nil }
            return SimulatedError(name: name, enabled: (entry["enabled"] as? Bool) ?? false)
        }
        applicationInternalID = (settings["_applicationInternalID"] as? String) ?? (settings["_applicationInternalID"] as? NSNumber)?.stringValue
        developerTeamID = settings["_developerTeamID"] as? String
    }

    /// Whether the error of a named API (`Purchase`, `Load Products`, …) is switched on.
    public func simulatesError(_ name: String) -> Bool {
        storeKitErrors.contains { $0.enabled && $0.name.caseInsensitiveCompare(name) == .orderedSame }
    }
}
