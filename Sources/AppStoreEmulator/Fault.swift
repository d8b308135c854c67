import AppStoreModels
import Foundation

/// A scripted misbehaviour of one endpoint, to test backends against Apple's bad days.
public struct Fault: Codable, Sendable, Equatable {
    /// What the endpoint does instead of answering normally.
    public enum Behavior: Codable, Sendable, Equatable {
        /// Answer normally (only the latency applies).
        case none
        /// verifyReceipt answers this status (21005, 21009, 211xx with `is_retryable`).
        case status(Int)
        /// Answer with this HTTP status and an empty JSON body.
        case http(Int)
        /// Answer an HTML error page with HTTP 200.
        case html
        /// Close the connection without answering.
        case drop
        /// Never answer (until the client gives up or the server stops).
        case hang
    }

    public var id: String
    /// Endpoint name (`verifyReceipt`, `products`, `payments`, `receipt`, `transactions`, `restore`) or `*`.
    public var endpoint: String
    /// Only this environment, or both when nil.
    public var environment: AppStoreEnvironment?
    public var behavior: Behavior
    /// Added latency in seconds, a fixed value or a uniform range.
    public var latencyMin: Double
    public var latencyMax: Double
    /// When the fault stops applying (emulator time), or never.
    public var expiresAt: Date?

    /// Whether the fault covers an endpoint call.
    public func applies(to endpoint: String, environment: AppStoreEnvironment?, at now: Date) -> Bool {
        if let expiresAt, now >= expiresAt { return false }
        guard self.endpoint == "*" || self.endpoint.caseInsensitiveCompare(endpoint) == .orderedSame else { return false }
        if let wanted = self.environment, let environment, wanted != environment { return false }
        return true
    }

    /// The endpoint names faults can target.
    public static let endpoints = ["verifyReceipt", "products", "payments", "transactions", "finish", "restore", "receipt", "*"]
}

/// Switches for Apple's documented quirks.
public struct Quirks: Codable, Sendable, Equatable {
    /// Seed 000: a sandbox receipt with a consumable sent to production answers 21002 instead of 21007.
    public var sandboxConsumableAnswers21002InProduction = false
    /// Renewals per sandbox subscription before auto-renew turns off (Apple: 12 today, 6 historically).
    public var sandboxMaxRenewals = 12
    /// One hourly request budget for every App Store Server API endpoint instead of Apple's (to test 429 handling).
    public var serverAPIHourlyLimit: Int?

    public init() {}
}
