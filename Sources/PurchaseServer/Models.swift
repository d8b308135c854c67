import AppStoreModels
import Foundation

/// What happens when a transaction already bound to one user is submitted by another.
public enum ReplayPolicy: String, Codable, Sendable, CaseIterable {
    /// Refuse it (the default): the first user keeps it.
    case reject
    /// Move it to the newest user.
    case transfer
    /// Both users own it.
    case share
}

/// Who may be granted sandbox purchases.
public enum SandboxPolicy: String, Codable, Sendable, CaseIterable {
    /// Everyone (development and TestFlight backends).
    case allow
    /// Only users on the app's sandbox allow-list (production backends: App Review's accounts).
    case allowList = "allow_list"
    /// Nobody.
    case deny
}

/// What to do when production answers 21002 for a receipt that may be a sandbox consumable (seed 000).
public enum Quirk21002Policy: String, Codable, Sendable, CaseIterable {
    /// Ask the sandbox once more before rejecting.
    case retrySandbox = "retry_sandbox"
    /// Reject as malformed.
    case reject
}

/// Whether the app's public key needs a user token to act for a user.
public enum UserAuthPolicy: String, Codable, Sendable, CaseIterable {
    /// A public key acts only for the user named by a valid `Storekeeper-User-Token` (new apps).
    case required
    /// A public key may name any user, as before user tokens existed (migration only; logged at start).
    case optional
}

/// An app registered with the purchase server.
public struct ServerApp: Codable, Sendable, Equatable {
    public var id: String
    public var name: String
    public var sharedSecret: String?
    /// Bundle ids whose receipts this app accepts (the app's own first).
    public var bundleIds: [String]
    public var replayPolicy: ReplayPolicy
    public var sandboxPolicy: SandboxPolicy
    public var sandboxAllowList: [String]
    public var quirk21002Policy: Quirk21002Policy
    /// The app's Apple id: production notifications must name it.
    public var appAppleId: Int64?
    /// App Store Server API key, to answer Apple (Send Consumption Information).
    public var serverAPIKey: ServerAPICredentials?
    /// What to do with CONSUMPTION_REQUEST notifications: `ignore` (default) or `send` consumption information.
    public var consumptionPolicy: ConsumptionPolicy
    /// Whether public keys need user tokens (`required` for new apps).
    public var userAuth: UserAuthPolicy
    /// The HS256 secret the developer's backend signs user tokens with (Base64url of 32 random bytes).
    public var userTokenSecret: String?
    /// An ES256 public key (PEM) the developer's backend signs user tokens with, instead of or beside the secret.
    public var userTokenPublicKey: String?

    public init(id: String, name: String? = nil, sharedSecret: String? = nil, bundleIds: [String]? = nil, replayPolicy: ReplayPolicy = .reject,
                sandboxPolicy: SandboxPolicy = .allow, sandboxAllowList: [String] = [], quirk21002Policy: Quirk21002Policy = .retrySandbox,
                appAppleId: Int64? = nil, serverAPIKey: ServerAPICredentials? = nil, consumptionPolicy: ConsumptionPolicy = .ignore,
                userAuth: UserAuthPolicy = .required, userTokenSecret: String? = nil, userTokenPublicKey: String? = nil) {
        self.id = id
        self.name = name ?? id
        self.sharedSecret = sharedSecret
        self.bundleIds = bundleIds ?? [id]
        self.replayPolicy = replayPolicy
        self.sandboxPolicy = sandboxPolicy
        self.sandboxAllowList = sandboxAllowList
        self.quirk21002Policy = quirk21002Policy
        self.appAppleId = appAppleId
        self.serverAPIKey = serverAPIKey
        self.consumptionPolicy = consumptionPolicy
        self.userAuth = userAuth
        self.userTokenSecret = userTokenSecret
        self.userTokenPublicKey = userTokenPublicKey
    }
}

/// Whether the server answers Apple's consumption requests (the customer's consent is the app's to collect).
public enum ConsumptionPolicy: String, Codable, Sendable {
    case ignore
    case send
}

/// An App Store Connect In-App Purchase key for the App Store Server API. The private key is never
/// shown back: encoding writes only the ids.
public struct ServerAPICredentials: Codable, Sendable, Equatable {
    public var issuerId: String
    public var keyId: String
    public var privateKey: String

    public init(issuerId: String, keyId: String, privateKey: String) {
        self.issuerId = issuerId
        self.keyId = keyId
        self.privateKey = privateKey
    }

    enum CodingKeys: String, CodingKey { case issuerId, keyId, privateKey }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(issuerId, forKey: .issuerId)
        try c.encode(keyId, forKey: .keyId)
    }
}

/// What a product grants.
public struct ProductMapping: Codable, Sendable, Equatable {
    public var productId: String
    public var type: ProductType
    /// The entitlement a non-consumable or subscription unlocks.
    public var entitlement: String?
    /// The balance a consumable credits, and by how much per unit.
    public var currency: String?
    public var amount: Int64?
    /// Length of a non-renewing subscription.
    public var durationDays: Int64?
    /// List price and currency, for revenue reports (verifyReceipt does not carry prices).
    public var price: String?
    public var priceCurrency: String?

    public init(productId: String, type: ProductType, entitlement: String? = nil, currency: String? = nil, amount: Int64? = nil,
                durationDays: Int64? = nil, price: String? = nil, priceCurrency: String? = nil) {
        self.productId = productId
        self.type = type
        self.entitlement = entitlement
        self.currency = currency
        self.amount = amount
        self.durationDays = durationDays
        self.price = price
        self.priceCurrency = priceCurrency
    }
}

extension ProductMapping {
    /// The quantities a transaction may carry: StoreKit sells 1…10 units, this allows some room.
    public static let acceptedQuantities: ClosedRange<Int64> = 1...100
    /// Whether a list price is a plain decimal (`9.99`) from 0 to a billion with at most 6 decimals: what
    /// reports and metrics add to the millionth.
    public static func isValidPrice(_ text: String) -> Bool {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard (1...2).contains(parts.count), let whole = parts.first, (1...10).contains(whole.count), whole.allSatisfy(\.isWholeNumber) && whole.allSatisfy(\.isASCII) else { return false }
        if parts.count == 2 { guard (1...6).contains(parts[1].count), parts[1].allSatisfy({ $0.isASCII && $0.isWholeNumber }) else { return false } }
        return (Decimal(string: text) ?? -1) >= 0 && (Decimal(string: text) ?? .greatestFiniteMagnitude) <= 1_000_000_000
    }

    /// The credit a consumable may give per unit (`amount`).
    public static let acceptedAmounts: ClosedRange<Int64> = 1...1_000_000_000
    /// The length a non-renewing subscription may have (`durationDays`), up to a century.
    public static let acceptedDurationDays: ClosedRange<Int64> = 1...36_500

    /// `amount × quantity`, saturating (the bounds above keep it far from overflow; this keeps a
    /// row written before the bounds existed from trapping).
    static func credit(_ amount: Int64, times quantity: Int64) -> Int64 {
        let (product, overflow) = amount.multipliedReportingOverflow(by: quantity)
        return overflow ? (amount.signum() == quantity.signum() ? .max : .min) : product
    }

    /// When a non-renewing pass bought at `start` (Unix ms) for `quantity` units ends, saturating.
    func passEnd(from start: Int64, quantity: Int64) -> Int64 {
        let days = ProductMapping.credit(durationDays ?? 0, times: max(quantity, 0))
        let length = ProductMapping.credit(days, times: 86_400_000)
        let (end, overflow) = start.addingReportingOverflow(length)
        return overflow ? .max : end
    }
}

/// The lifecycle of a verification job.
public enum JobState: String, Codable, Sendable, CaseIterable {
    /// Waiting to be verified (first time or after a retryable failure).
    case pending
    /// Claimed by a worker under a lease.
    case verifying
    /// Apple could not be reached in time; the scheduler retries it.
    case timedOut = "timed_out"
    /// Settled: purchases recorded and granted.
    case verified
    /// Settled: refused, with a reason.
    case rejected
    /// Gave up after the maximum age; an operator can replay it.
    case dead

    /// Whether the job will not change again by itself.
    public var isSettled: Bool { self == .verified || self == .rejected || self == .dead }

    /// Whether a job in this state stays in it for good (a dead job can be replayed). Jobs in these states are
    /// counted by running totals (`state_totals`) as they settle; the others, the queue and its dead letters, by
    /// reading their entries in the index on the state.
    var isFinal: Bool { self == .verified || self == .rejected }

    /// Whether an operator's replay puts a job in this state back in the queue: one that gave up (dead) or waits after
    /// Apple did not answer in time. A rejected job is final (Apple or the look before storage refused it, and its bytes
    /// are dropped); a verified one is granted.
    public var isReplayable: Bool { self == .dead || self == .timedOut }

    /// The replayable states, as SQL's `IN` list.
    static let replayableSQL = allCases.filter(\.isReplayable).map { "'\($0.rawValue)'" }.joined(separator: ", ")
}

/// A failure with a stable code, mapped to HTTP by the routes.
/// Why the purchase server refused a request or could not do it: a stable code (with the kind of
/// problem it is) and a message safe to log. The HTTP status is chosen from the kind at the HTTP edge
/// (`PurchaseServerResponder`), never here.
public struct ServerError: Error, Sendable, CustomStringConvertible, Equatable {
    /// The kind of problem, which the HTTP edge turns into a status.
    public enum Kind: Sendable, Equatable {
        /// The request is malformed or breaks a rule (400).
        case invalidRequest
        /// No or bad credentials (401).
        case unauthenticated
        /// The credentials do not allow this (403).
        case forbidden
        /// The thing named does not exist (404).
        case notFound
        /// The request conflicts with what is stored (409).
        case conflict
        /// A dependency is down or the server is saturated; retry later (503).
        case unavailable
        /// A fault of this server (500).
        case internalFailure
    }

    /// A stable error code, as the JSON error body spells it, with its kind.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        public let rawValue: String
        public let kind: Kind
        public init(_ rawValue: String, _ kind: Kind) {
            self.rawValue = rawValue
            self.kind = kind
        }
        public var description: String { rawValue }
        public static func == (lhs: Code, rhs: Code) -> Bool { lhs.rawValue == rhs.rawValue }
        public func hash(into hasher: inout Hasher) { hasher.combine(rawValue) }

        public static let appExists = Code("app_exists", .conflict)
        public static let appNotFound = Code("app_not_found", .notFound)
        public static let busy = Code("busy", .unavailable)
        public static let grantNotFound = Code("grant_not_found", .notFound)
        public static let idempotencyKeyReused = Code("idempotency_key_reused", .conflict)
        public static let insufficientBalance = Code("insufficient_balance", .conflict)
        public static let internalError = Code("internal_error", .internalFailure)
        public static let invalidAlias = Code("invalid_alias", .invalidRequest)
        public static let invalidAmount = Code("invalid_amount", .invalidRequest)
        public static let invalidApp = Code("invalid_app", .invalidRequest)
        public static let invalidCurrency = Code("invalid_currency", .invalidRequest)
        public static let invalidCursor = Code("invalid_cursor", .invalidRequest)
        public static let invalidDate = Code("invalid_date", .invalidRequest)
        public static let invalidDuration = Code("invalid_duration", .invalidRequest)
        public static let invalidEntitlement = Code("invalid_entitlement", .invalidRequest)
        public static let invalidIdempotencyKey = Code("invalid_idempotency_key", .invalidRequest)
        public static let invalidNotification = Code("invalid_notification", .invalidRequest)
        public static let invalidPrice = Code("invalid_price", .invalidRequest)
        public static let invalidProduct = Code("invalid_product", .invalidRequest)
        public static let invalidProductId = Code("invalid_product_id", .invalidRequest)
        public static let invalidQuery = Code("invalid_query", .invalidRequest)
        public static let invalidReason = Code("invalid_reason", .invalidRequest)
        public static let invalidServerApiKey = Code("invalid_server_api_key", .invalidRequest)
        public static let invalidSignature = Code("invalid_signature", .invalidRequest)
        public static let invalidUrl = Code("invalid_url", .internalFailure)
        public static let invalidUserId = Code("invalid_user_id", .invalidRequest)
        public static let invalidUserToken = Code("invalid_user_token", .unauthenticated)
        public static let invalidUserTokenKey = Code("invalid_user_token_key", .invalidRequest)
        public static let invalidUserTokenSecret = Code("invalid_user_token_secret", .invalidRequest)
        public static let invalidWebhookSecret = Code("invalid_webhook_secret", .invalidRequest)
        public static let invalidWebhookUrl = Code("invalid_webhook_url", .invalidRequest)
        public static let keyNotFound = Code("key_not_found", .notFound)
        public static let masterKeyMismatch = Code("master_key_mismatch", .internalFailure)
        public static let metricsRebuilding = Code("metrics_rebuilding", .unavailable)
        public static let invalidOperator = Code("invalid_operator", .invalidRequest)
        public static let invalidPassword = Code("invalid_password", .invalidRequest)
        public static let operatorNotFound = Code("operator_not_found", .notFound)
        public static let operatorExists = Code("operator_exists", .conflict)
        public static let notificationNotFound = Code("notification_not_found", .notFound)
        public static let offerKeyMissing = Code("offer_key_missing", .conflict)
        public static let userTokenRequired = Code("user_token_required", .unauthenticated)
        public static let missingIdempotencyKey = Code("missing_idempotency_key", .invalidRequest)
        public static let missingUserToken = Code("missing_user_token", .unauthenticated)
        public static let nestedUnverifiable = Code("nested_unverifiable", .unavailable)
        public static let secretKeyRequired = Code("secret_key_required", .forbidden)
        public static let tooManyIds = Code("too_many_ids", .invalidRequest)
        public static let tooManyWebhooks = Code("too_many_webhooks", .conflict)
        public static let trustFileUnreadable = Code("trust_file_unreadable", .internalFailure)
        public static let userMismatch = Code("user_mismatch", .forbidden)
        public static let userNotFound = Code("user_not_found", .notFound)
        public static let userTokenExpired = Code("user_token_expired", .unauthenticated)
        public static let webhookDeliveryNotFound = Code("webhook_delivery_not_found", .notFound)
        public static let webhookNotFound = Code("webhook_not_found", .notFound)
    }

    public let code: Code
    public let message: String
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }
    public var kind: Kind { code.kind }
    public var description: String { "\(code): \(message)" }
}
