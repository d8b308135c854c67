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
    /// `SKTestSession.interruptedPurchasesEnabled`: purchases need the customer to act first (accept terms,
    /// update a payment method); they wait, as pending, until the issue is resolved. Not a `.storekit` key.
    public var interruptedPurchasesEnabled: Bool?
    public var disableDialogs = false
    /// `_storeKitErrors`: each StoreKit API Xcode lets you break ("Load Products", "Purchase", …), whether its error is on.
    public var storeKitErrors: [SimulatedError] = []
    public var applicationInternalID: String?
    public var developerTeamID: String?

    /// One `_storeKitErrors` entry: an API by Xcode's name, whether its error is on, and which error
    /// (nil: the API's default, `unknown` or for verification `invalidSignature`).
    public struct SimulatedError: Codable, Sendable, Equatable {
        public var name: String
        public var enabled: Bool
        public var error: StoreKitTestError?
        public init(name: String, enabled: Bool, error: StoreKitTestError? = nil) {
            self.name = name
            self.enabled = enabled
            self.error = error
        }

        /// The API it names, when it names one we know.
        public var api: StoreKitAPI? { StoreKitAPI(fileName: name) }

        /// Xcode's `current`: the chosen error as `{"type": family, "index": position in the family}`, or null.
        public var current: Any {
            guard let error else { return NSNull() }
            return ["type": error.family.rawValue, "index": error.family.errors.firstIndex(of: error) ?? 0] as [String: Any]
        }

        /// Reads `current` as `current` writes it; anything else (or an error the API cannot have) is the default.
        static func error(fromCurrent current: Any?, api: StoreKitAPI?) -> StoreKitTestError? {
            guard let current = current as? [String: Any], let type = current["type"] as? String,
                  let family = StoreKitTestError.Family(rawValue: type) else { return nil }
            let index = (current["index"] as? Int) ?? (current["index"] as? NSNumber)?.intValue ?? 0
            guard family.errors.indices.contains(index) else { return nil }
            let error = family.errors[index]
            return api.map { $0.allows(error) } == false ? nil : error
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
            return SimulatedError(name: name, enabled: (entry["enabled"] as? Bool) ?? false,
                                  error: SimulatedError.error(fromCurrent: entry["current"], api: StoreKitAPI(fileName: name)))
        }
        applicationInternalID = (settings["_applicationInternalID"] as? String) ?? (settings["_applicationInternalID"] as? NSNumber)?.stringValue
        developerTeamID = settings["_developerTeamID"] as? String
    }

    /// The error an API fails with now, if its error is switched on.
    public func simulatedError(for api: StoreKitAPI) -> StoreKitTestError? {
        guard let entry = storeKitErrors.first(where: { $0.enabled && $0.api == api }) else { return nil }
        return entry.error ?? api.defaultError
    }

    /// Switches an API's error on (with `error`, or the API's default) or off, keeping the list in Xcode's order.
    public mutating func setSimulatedError(_ error: StoreKitTestError?, enabled: Bool, for api: StoreKitAPI) {
        storeKitErrors.removeAll { $0.api == api }
        storeKitErrors.append(SimulatedError(name: api.fileName, enabled: enabled, error: error))
        storeKitErrors.sort { ($0.api.flatMap { StoreKitAPI.allCases.firstIndex(of: $0) } ?? .max) < ($1.api.flatMap { StoreKitAPI.allCases.firstIndex(of: $0) } ?? .max) }
    }
}
