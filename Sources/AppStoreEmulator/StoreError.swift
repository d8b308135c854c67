import AppStoreModels
import HTTP

/// A failure of an emulator operation: a stable code, an HTTP status, and the SKError StoreKit would report.
public struct StoreError: Error, Sendable, CustomStringConvertible, Equatable {
    public let status: HTTPStatus
    public let code: String
    public let message: String
    public let skError: SKErrorCode?

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
}
