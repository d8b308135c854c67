import Foundation

/// A product as the App Store describes it to the device (SKProduct / Product).
public struct StoreProduct: Codable, Sendable, Equatable, Identifiable {
    public var productIdentifier: String
    /// `consumable`, `non-consumable`, `auto-renewable`, `non-renewing`, `free-subscription`.
    public var type: String
    public var localizedTitle: String
    public var localizedDescription: String
    /// The price as a decimal string in `currencyCode` ("0.99", "120").
    public var price: String
    public var currencyCode: String
    public var storefront: String
    /// ISO 8601 period of a subscription (`P1M`).
    public var subscriptionPeriod: String?
    public var subscriptionGroupIdentifier: String?
    public var isFamilyShareable: Bool

    public var id: String { productIdentifier }

    /// The price formatted for `locale` with the product's currency ("$0.99", "¥120", "0,99 €").
    public func displayPrice(locale: Locale = Locale(identifier: "en_US")) -> String {
        let formatter = NumberFormatter()
        formatter.numberStyle = .currency
        formatter.locale = locale
        formatter.currencyCode = currencyCode
        let amount = Decimal(string: price, locale: Locale(identifier: "en_US_POSIX")) ?? 0
        return formatter.string(from: amount as NSDecimalNumber) ?? "\(price) \(currencyCode)"
    }

    /// Whether one purchase is kept forever (non-consumables, free subscriptions) rather than counted.
    public var isConsumable: Bool { type == "consumable" }
}

/// What the App Store answered a products request with: products for sale and identifiers that are not.
public struct ProductsResponse: Codable, Sendable, Equatable {
    public var products: [StoreProduct]
    public var invalidProductIdentifiers: [String]
}

/// A payment's state in the queue (SKPaymentTransactionState).
public enum TransactionState: String, Codable, Sendable {
    case purchasing, purchased, failed, restored, deferred
}

/// A StoreKit error (SKError): a code and the name StoreKit gives it.
public struct StoreKitError: Error, Sendable, Equatable, Codable, CustomStringConvertible {
    public var code: Int
    public var name: String
    public var message: String

    public init(code: Int, name: String, message: String) {
        self.code = code
        self.name = name
        self.message = message
    }

    /// The customer cancelled: not an error to show.
    public var isCancellation: Bool { code == 2 }

    public var description: String { "\(name) (\(code)): \(message)" }

    static func network(_ message: String) -> StoreKitError { StoreKitError(code: 0, name: "unknown", message: message) }
}

/// One transaction as the device's payment queue sees it (SKPaymentTransaction + its StoreKit 2 JWS).
public struct PaymentTransaction: Codable, Sendable, Equatable, Identifiable {
    public var transactionIdentifier: String
    public var originalTransactionIdentifier: String?
    public var productIdentifier: String
    public var quantity: Int
    public var transactionState: TransactionState
    /// Unix milliseconds.
    public var transactionDate: Int64
    public var expiresDate: Int64?
    public var applicationUsername: String?
    public var error: StoreKitError?
    /// iOS 6 style transaction receipt (Base64), for purchased and restored transactions.
    public var transactionReceipt: String?
    /// The StoreKit 2 signed transaction (JWS).
    public var signedTransaction: String?

    public var id: String { transactionIdentifier }
}

/// A payment to add to the queue (SKPayment / SKMutablePayment).
public struct Payment: Sendable, Equatable {
    public var productIdentifier: String
    public var quantity: Int
    public var applicationUsername: String?
    /// For tests: `cancel` (the customer taps Cancel) or `fail`.
    public var simulate: String?

    public init(productIdentifier: String, quantity: Int = 1, applicationUsername: String? = nil, simulate: String? = nil) {
        self.productIdentifier = productIdentifier
        self.quantity = quantity
        self.applicationUsername = applicationUsername
        self.simulate = simulate
    }
}
