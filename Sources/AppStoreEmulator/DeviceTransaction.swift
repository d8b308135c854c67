import AppStoreModels
import Foundation

/// A transaction as the device API sends it (an `SKPaymentTransaction`).
public struct DeviceTransaction: Codable, Sendable, Equatable {
    /// An SKError carried by a failed transaction.
    public struct TransactionError: Codable, Sendable, Equatable {
        public var code: Int
        public var name: String
        public var message: String
    }

    public var transactionIdentifier: String
    public var originalTransactionIdentifier: String?
    public var productIdentifier: String
    public var quantity: Int
    public var transactionState: TransactionState
    /// Unix milliseconds.
    public var transactionDate: Int64
    public var expiresDate: Int64?
    public var environment: AppStoreEnvironment
    public var applicationUsername: String?
    public var error: TransactionError?
    /// The iOS 6 style transaction receipt, Base64 (purchased and restored transactions).
    public var transactionReceipt: String?
    /// The StoreKit 2 signed transaction (JWS) of purchased and restored transactions.
    public var signedTransaction: String?

    /// Renders a record; `receipt` is its iOS 6 receipt.
    public init(_ record: TransactionRecord, receipt: Data?) {
        transactionIdentifier = record.id
        originalTransactionIdentifier = record.state == .restored || record.isRedelivery || record.originalId != record.id ? record.originalId : nil
        productIdentifier = record.productId
        quantity = record.quantity
        transactionState = record.state
        transactionDate = ReceiptDate.milliseconds(record.purchaseDate)
        expiresDate = record.expiresDate.map(ReceiptDate.milliseconds)
        environment = record.environment
        applicationUsername = record.applicationUsername
        error = record.error.map { TransactionError(code: $0.rawValue, name: $0.name, message: DeviceTransaction.message(for: $0)) }
        transactionReceipt = receipt?.base64EncodedString()
    }

    static func message(for code: SKErrorCode) -> String {
        switch code {
        case .paymentCancelled: return "The user cancelled the payment."
        case .paymentNotAllowed: return "The device is not allowed to make payments."
        case .paymentInvalid: return "The payment is invalid."
        case .storeProductNotAvailable: return "The product is not available in this storefront."
        case .clientInvalid: return "The client is not allowed to make this request."
        default: return "The payment failed."
        }
    }
}
