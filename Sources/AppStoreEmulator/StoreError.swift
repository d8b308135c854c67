import AppStoreModels
import HTTP

/// A failure of an emulator operation: a stable code, an HTTP status, and the SKError StoreKit would report.
public struct StoreError: Error, Sendable, CustomStringConvertible, Equatable {
    public let status: HTTPStatus
    public let code: String
    public let message: String
    public let skError: SKErrorCode?
    /// The StoreKit 2 error when StoreKit Testing simulates one (`networkError`, `productUnavailable`, …).
    public var storeKitError: StoreKitTestError?

    public init(_ status: HTTPStatus, _ code: String, _ message: String, skError: SKErrorCode? = nil) {
        self.status = status
        self.code = code
        self.message = message
        self.skError = skError
    }

    public var description: String { "\(code): \(message)" }

    static func notFound(_ what: String) -> StoreError { StoreError(.notFound, "not_found", "\(what) was not found.") }
    static func invalid(_ message: String, code: String = "invalid_request") -> StoreError { StoreError(.badRequest, code, message) }
    static func storeKit(_ error: SKErrorCode, _ message: String, status: HTTPStatus = .unprocessable) -> StoreError {
        StoreError(status, "sk_\(error.name)", message, skError: error)
    }

    /// The failure StoreKit Testing simulates for an API: 503 for StoreKit's generic errors (the App Store did
    /// not answer), 422 for the errors of a purchase or a refund request.
    static func simulated(_ error: StoreKitTestError, api: StoreKitAPI) -> StoreError {
        var failure = StoreError(error.family == .generic ? .serviceUnavailable : .unprocessable, "simulated_\(error.rawValue)",
                                 "\(api.fileName) fails with \(error.family.typeName).\(error.rawValue) (StoreKit Testing simulates this error).",
                                 skError: error.skError)
        failure.storeKitError = error
        return failure
    }
}
