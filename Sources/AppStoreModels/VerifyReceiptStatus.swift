/// The `status` codes of verifyReceipt (reference §1.9).
public enum VerifyReceiptStatus {
    /// The receipt is valid.
    public static let valid = 0
    /// The request was not a POST or its JSON could not be read.
    public static let unreadableRequest = 21000
    /// `receipt-data` was malformed or missing.
    public static let malformedReceipt = 21002
    /// The receipt could not be authenticated.
    public static let notAuthenticated = 21003
    /// The shared secret does not match.
    public static let sharedSecretMismatch = 21004
    /// The receipt server was temporarily unavailable.
    public static let serverUnavailable = 21005
    /// Valid, but the (iOS 6 style) subscription has expired.
    public static let subscriptionExpired = 21006
    /// A sandbox receipt was sent to production.
    public static let sandboxReceiptInProduction = 21007
    /// A production receipt was sent to the sandbox.
    public static let productionReceiptInSandbox = 21008
    /// Internal data access error.
    public static let internalDataAccessError = 21009
    /// The account was not found or was deleted.
    public static let accountNotFound = 21010

    /// Whether a status is one of the retryable 211xx internal errors.
    public static func isInternalRange(_ status: Int) -> Bool { (21100...21199).contains(status) }
}
