import Foundation

/// What an operator may see and do in the console. Rules as a value: each page names the roles that open it.
public enum OperatorRole: String, Codable, Sendable, CaseIterable {
    /// Everything, operators included.
    case admin
    /// Customers and their actions (grant, revoke, adjust, delete), transactions.
    case support
    /// Reports, transactions and metrics.
    case finance
    /// Keys, webhooks, product mappings, verification jobs, the emulator.
    case developer

    public func may(_ page: ConsolePage) -> Bool { page.roles.contains(self) }
}

/// The console's pages, each with the roles that may open it (and use its actions).
public enum ConsolePage: String, Sendable, CaseIterable {
    case overview, customers, transactions, metrics, jobs, webhooks, settings, operators, emulator

    public var roles: Set<OperatorRole> {
        switch self {
        case .overview: [.admin, .support, .finance, .developer]
        case .customers: [.admin, .support]
        case .transactions: [.admin, .support, .finance]
        case .metrics: [.admin, .finance]
        case .jobs: [.admin, .developer, .support]
        case .webhooks: [.admin, .developer]
        case .settings: [.admin, .developer]
        case .operators: [.admin]
        case .emulator: [.admin, .developer]
        }
    }

    public var title: String {
        switch self {
        case .overview: "Overview"
        case .customers: "Customers"
        case .transactions: "Transactions"
        case .metrics: "Metrics"
        case .jobs: "Verification jobs"
        case .webhooks: "Webhooks"
        case .settings: "Settings"
        case .operators: "Operators"
        case .emulator: "Emulator"
        }
    }

    public var path: String { self == .overview ? "/console" : "/console/\(rawValue)" }
}

/// A person who uses the console.
public struct Operator: Codable, Sendable, Equatable {
    public var email: String
    public var role: OperatorRole
    /// Whether a password is set (else only a login link lets them in).
    public var hasPassword: Bool
    public var createdAt: Int64

    /// An email address as the console accepts it: 3–254 bytes, one `@`, no spaces or control characters; lowercased.
    public static func normalizedEmail(_ text: String) -> String? {
        let email = text.trimmingCharacters(in: .whitespaces).lowercased()
        guard (3...254).contains(email.utf8.count), email.split(separator: "@", omittingEmptySubsequences: false).count == 2,
              !email.hasPrefix("@"), !email.hasSuffix("@"),
              email.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value != 0x7F && $0.value < 0x80 }) else { return nil }
        return email
    }
}

/// A signed-in operator: who, and the session's CSRF token that every form must carry back.
public struct ConsoleSession: Sendable, Equatable {
    public var operatorInfo: Operator
    public var csrf: String
    public var expiresAt: Int64
    /// Whether this server runs beside the App Store emulator (`storekeeper up`): the Emulator page exists.
    public var emulatorAttached = false

    /// The pages this operator may open here, in menu order.
    public var pages: [ConsolePage] {
        ConsolePage.allCases.filter { operatorInfo.role.may($0) && ($0 != .emulator || emulatorAttached) }
    }
}
