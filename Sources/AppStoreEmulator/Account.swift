import AppStoreModels
import Foundation

/// An Apple ID: a sandbox tester or a production customer.
public struct Account: Codable, Sendable, Equatable {
    public var email: String
    public var environment: AppStoreEnvironment
    /// ISO alpha-3 storefront (`USA`, `JPN`, `CHN`).
    public var storefront: String
    /// Locale for product names (`en_US`).
    public var locale: String
    /// Sandbox renewal rate; production accounts renew in real time.
    public var renewalRate: RenewalRate
    /// When true every purchase waits for a parent (Ask to Buy).
    public var askToBuy: Bool
    /// Deleted accounts stay known so their receipts answer 21010.
    public var deleted: Bool
    /// A stable numeric id (DSID-like).
    public var identifier: String
    /// The Family Sharing group this account belongs to, if any.
    public var family: String?
    /// A tester of Xcode's StoreKit Testing: its StoreKit 2 data is signed by the Xcode certificate, says
    /// `environment` `Xcode`, and is unknown to the App Store Server API (as Apple's servers never see it).
    public var xcode: Bool?

    /// Creates an account.
    public init(email: String, environment: AppStoreEnvironment, storefront: String = "USA", locale: String = "en_US",
                renewalRate: RenewalRate? = nil, askToBuy: Bool = false, identifier: String) {
        self.email = email
        self.environment = environment
        self.storefront = storefront
        self.locale = locale
        self.renewalRate = renewalRate ?? (environment == .sandbox ? .sandboxDefault : .realTime)
        self.askToBuy = askToBuy
        self.deleted = false
        self.identifier = identifier
    }
}

/// A device signed in to an account.
public struct Device: Codable, Sendable, Equatable {
    /// The device identifier (identifierForVendor), a UUID string.
    public var id: String
    public var accountEmail: String
    /// Restrictions: false means `SKPaymentQueue.canMakePayments()` is false.
    public var canMakePayments: Bool
    /// The environment of the installed build (a development or TestFlight build talks to the
    /// sandbox, an App Store build to production); nil means "whatever the account is".
    public var buildEnvironment: AppStoreEnvironment?

    /// Creates a device.
    public init(id: String, accountEmail: String, canMakePayments: Bool = true, buildEnvironment: AppStoreEnvironment? = nil) {
        self.id = id
        self.accountEmail = accountEmail
        self.canMakePayments = canMakePayments
        self.buildEnvironment = buildEnvironment
    }

    /// The 16 UUID bytes that go into the receipt's device hash.
    public var identifierBytes: [UInt8] {
        guard let uuid = UUIDText.parse(id) else { return Array(id.utf8) }
        return withUnsafeBytes(of: uuid.uuid) { Array($0) }
    }
}
