import Foundation

/// One of an app's webhook endpoints, as the admin API shows it (never its secret).
public struct WebhookEndpoint: Codable, Sendable, Equatable {
    public var id: String
    public var appId: String
    public var url: String
    /// The event types sent to it; empty means every type.
    public var eventTypes: [WebhookEventType]
    public var createdAt: Int64
    /// The secret's last four characters, to tell secrets apart.
    public var secretHint: String
    /// While a rotation's grace lasts, the previous secret also signs, until this time (ms).
    public var previousSecretUntil: Int64?
    /// `events`, or `apple` (Apple's signed notifications forwarded).
    public var format: WebhookFormat = .events

    /// Whether events of `type` go to this endpoint (`TEST` is sent only when asked for, to one endpoint).
    public func accepts(_ type: WebhookEventType) -> Bool {
        switch format {
        case .apple: type == .appleNotification
        case .events: type != .test && type != .appleNotification && (eventTypes.isEmpty || eventTypes.contains(type))
        }
    }
}

/// An endpoint with what signs its deliveries.
struct WebhookTarget: Sendable {
    var endpoint: WebhookEndpoint
    var secret: String
    var previousSecret: String?

    /// The secrets that sign a delivery at `now` (ms): the current one, and the previous during a rotation's grace.
    func signingSecrets(now: Int64) -> [String] {
        guard let previousSecret, let until = endpoint.previousSecretUntil, now < until else { return [secret] }
        return [secret, previousSecret]
    }
}

/// An event as stored in the outbox: its JSON body is exactly what is POSTed.
struct StoredWebhookEvent: Sendable {
    var id: String
    var appId: String
    var appUserId: String
    var type: WebhookEventType
    var sequence: Int64
    var occurredAt: Int64
    var body: String
}

/// A delivery claimed for sending.
struct DueDelivery: Sendable, Equatable {
    var eventId: String
    var endpointId: String
    var attempts: Int64
    var createdAt: Int64
}

/// One attempt to deliver an event to an endpoint.
public struct WebhookAttempt: Codable, Sendable, Equatable {
    public var attemptedAt: Int64
    /// The HTTP status answered, or nil when none came (a timeout, a refused connection).
    public var status: Int64?
    public var latencyMs: Int64
    /// `delivered`, `http_status`, `timed_out`, `connection_failed`, `invalid_response`.
    public var outcome: String
    /// The first 512 bytes of the answer.
    public var responseExcerpt: String?
}

/// An event's delivery to one endpoint, with every attempt.
public struct WebhookDelivery: Codable, Sendable, Equatable {
    public var eventId: String
    public var endpointId: String
    public var type: String
    public var appUserId: String
    /// `pending` (waiting for its next attempt), `delivered`, or `failed` (retried for `maximumAge` without a 2xx).
    public var state: String
    public var attempts: Int64
    public var nextAttemptAt: Int64?
    public var createdAt: Int64
    public var deliveredAt: Int64?
    public var lastStatus: Int64?
    public var lastError: String?
    public var log: [WebhookAttempt]
}
