import Foundation

/// `storekeeper server webhook add`
struct ServerWebhookAddCommand: Command {
    static let abstract = "Add a webhook endpoint to an app; its signing secret is printed once."
    static let help = """
    APP_ID URL [--events TYPE,TYPE…] [--secret SECRET] [--format events|apple] [--url URL] [--admin-key KEY]

      --events    Only these event types (INITIAL_PURCHASE, RENEWAL, REFUND, BALANCE_CHANGED, …); every type by default.
      --secret    Your own signing secret (16–512 bytes) instead of a generated whsec_… one.
      --format    apple: forward Apple's signed App Store Server Notifications instead (to another backend, while migrating).

    Deliveries are POSTs of the event's JSON with Storekeeper-Signature: t=UNIX_SECONDS,v1=HEX(HMAC-SHA256(secret, "t.BODY")).

    \(serverConnectionHelp)
    """
    let client: AdminClient
    let app: String
    let body: [String: Any]

    init(_ arguments: inout Arguments) throws {
        client = try serverClient(&arguments)
        var body: [String: Any] = [:]
        if let events = try arguments.option("events") { body["eventTypes"] = events.split(separator: ",").map(String.init) }
        if let secret = try arguments.option("secret") { body["secret"] = secret }
        if let format = try arguments.option("format") {
            guard ["events", "apple"].contains(format) else { throw UsageError(description: "--format is events or apple") }
            body["format"] = format
        }
        let words = try arguments.positionals(2, "APP_ID URL")
        app = words[0]
        body["url"] = words[1]
        self.body = body
    }

    func run() async throws { try await client.sendAndPrint("POST", "/admin/v1/apps/\(pathSegment(app))/webhooks", json: body) }
}

/// `storekeeper server webhook list`
struct ServerWebhookListCommand: Command {
    static let abstract = "List an app's webhook endpoints (never their secrets)."
    static let help = "APP_ID [--url URL] [--admin-key KEY]\n\n\(serverConnectionHelp)"
    let client: AdminClient
    let app: String

    init(_ arguments: inout Arguments) throws {
        client = try serverClient(&arguments)
        app = try arguments.single("APP_ID")
    }

    func run() async throws { try await client.sendAndPrint("GET", "/admin/v1/apps/\(pathSegment(app))/webhooks") }
}

/// The commands that act on one endpoint: `remove`, `test`, `deliveries`, `rotate`, `redeliver`.
struct ServerWebhookActionCommand {
    let client: AdminClient
    let path: String

    /// Reads APP_ID WEBHOOK_ID (and `extra` more positionals) and the connection options.
    init(_ arguments: inout Arguments, extra: [String] = []) throws {
        client = try serverClient(&arguments)
        let words = try arguments.positionals(2 + extra.count, (["APP_ID", "WEBHOOK_ID"] + extra).joined(separator: " "))
        path = "/admin/v1/apps/\(pathSegment(words[0]))/webhooks/\(pathSegment(words[1]))"
        rest = Array(words.dropFirst(2))
    }

    let rest: [String]
}

/// `storekeeper server webhook remove`
struct ServerWebhookRemoveCommand: Command {
    static let abstract = "Remove a webhook endpoint (deliveries still owed to it are dropped)."
    static let help = "APP_ID WEBHOOK_ID [--url URL] [--admin-key KEY]\n\n\(serverConnectionHelp)"
    let action: ServerWebhookActionCommand
    init(_ arguments: inout Arguments) throws { action = try ServerWebhookActionCommand(&arguments) }
    func run() async throws { try await action.client.sendAndPrint("DELETE", action.path) }
}

/// `storekeeper server webhook test`
struct ServerWebhookTestCommand: Command {
    static let abstract = "Send a TEST event to one endpoint."
    static let help = "APP_ID WEBHOOK_ID [--url URL] [--admin-key KEY]\n\n\(serverConnectionHelp)"
    let action: ServerWebhookActionCommand
    init(_ arguments: inout Arguments) throws { action = try ServerWebhookActionCommand(&arguments) }
    func run() async throws { try await action.client.sendAndPrint("POST", action.path + "/test") }
}

/// `storekeeper server webhook deliveries`
struct ServerWebhookDeliveriesCommand: Command {
    static let abstract = "An endpoint's deliveries, newest first, with every attempt (status, latency, the answer's first bytes)."
    static let help = "APP_ID WEBHOOK_ID [--state pending|delivered|failed] [--limit N] [--url URL] [--admin-key KEY]\n\n\(serverConnectionHelp)"
    let action: ServerWebhookActionCommand
    let query: String

    init(_ arguments: inout Arguments) throws {
        var parts: [String] = []
        if let state = try arguments.option("state") { parts.append("state=\(pathSegment(state))") }
        if let limit = try arguments.option("limit") {
            guard let number = Int(limit), (1...1000).contains(number) else { throw UsageError(description: "--limit is 1–1000") }
            parts.append("limit=\(number)")
        }
        query = parts.isEmpty ? "" : "?" + parts.joined(separator: "&")
        action = try ServerWebhookActionCommand(&arguments)
    }

    func run() async throws { try await action.client.sendAndPrint("GET", action.path + "/deliveries" + query) }
}

/// `storekeeper server webhook redeliver`
struct ServerWebhookRedeliverCommand: Command {
    static let abstract = "Send one event to an endpoint again now, whatever became of it."
    static let help = "APP_ID WEBHOOK_ID EVENT_ID [--url URL] [--admin-key KEY]\n\n\(serverConnectionHelp)"
    let action: ServerWebhookActionCommand
    init(_ arguments: inout Arguments) throws { action = try ServerWebhookActionCommand(&arguments, extra: ["EVENT_ID"]) }
    func run() async throws { try await action.client.sendAndPrint("POST", action.path + "/deliveries/\(pathSegment(action.rest[0]))/redeliver") }
}

/// `storekeeper server webhook rotate`
struct ServerWebhookRotateCommand: Command {
    static let abstract = "A new signing secret for an endpoint; the old one also signs for --grace seconds (default a day)."
    static let help = "APP_ID WEBHOOK_ID [--grace SECONDS] [--url URL] [--admin-key KEY]\n\n\(serverConnectionHelp)"
    let action: ServerWebhookActionCommand
    let grace: Double

    init(_ arguments: inout Arguments) throws {
        let text = try arguments.option("grace") ?? "86400"
        guard let grace = Double(text), grace.isFinite, (0...604_800).contains(grace) else { throw UsageError(description: "--grace is 0–604800 seconds") }
        self.grace = grace
        action = try ServerWebhookActionCommand(&arguments)
    }

    func run() async throws { try await action.client.sendAndPrint("POST", action.path + "/rotate", json: ["graceSeconds": grace]) }
}
