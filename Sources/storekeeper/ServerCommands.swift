import Foundation

/// `--url` and `--admin-key` of commands that act on a running purchase server.
func serverClient(_ arguments: inout Arguments) throws -> AdminClient {
    let url = try arguments.option("url") ?? ProcessInfo.processInfo.environment["STOREKEEPER_SERVER_URL"] ?? "http://127.0.0.1:8020"
    var key = try arguments.option("admin-key") ?? ProcessInfo.processInfo.environment["STOREKEEPER_ADMIN_KEY"]
    if key == nil {
        for path in ["./.storekeeper/server/admin-key", "./.storekeeper/admin-key"] {
            if let text = try? String(contentsOfFile: path, encoding: .utf8) {
                key = text.trimmingCharacters(in: .whitespacesAndNewlines)
                break
            }
        }
    }
    guard let key else { throw UsageError(description: "give --admin-key (or set STOREKEEPER_ADMIN_KEY)") }
    return try AdminClient(url: url, bearer: key)
}

let serverConnectionHelp = """
      --url URL          The purchase server (default http://127.0.0.1:8020, or $STOREKEEPER_SERVER_URL).
      --admin-key KEY    The admin key (default $STOREKEEPER_ADMIN_KEY, else ./.storekeeper/server/admin-key).
"""

/// `storekeeper server app add`
struct ServerAppAddCommand: Command {
    static let abstract = "Register an app with the purchase server."
    static let help = """
    BUNDLE_ID [--name NAME] [--shared-secret SECRET] [--bundle-id ID]... [--replay-policy reject|transfer|share]
      [--sandbox-policy allow|allow_list|deny] [--sandbox-user ID]... [--app-apple-id N]
      [--server-api-key-id ID --server-api-issuer UUID --server-api-private-key FILE] [--consumption-policy ignore|send]
      [--url URL] [--admin-key KEY]

      --app-apple-id N         Production notifications must name this app Apple id.
      --server-api-*           An App Store Connect In-App Purchase key (.p8), to answer Apple through the Server API.
      --consumption-policy     send: answer CONSUMPTION_REQUEST notifications with Send Consumption Information.

    \(serverConnectionHelp)
    """
    let client: AdminClient
    let body: [String: Any]

    init(_ arguments: inout Arguments) throws {
        client = try serverClient(&arguments)
        var body: [String: Any] = [:]
        if let name = try arguments.option("name") { body["name"] = name }
        if let secret = try arguments.option("shared-secret") { body["sharedSecret"] = secret }
        if let policy = try arguments.option("replay-policy") { body["replayPolicy"] = policy }
        if let policy = try arguments.option("sandbox-policy") { body["sandboxPolicy"] = policy }
        let users = try arguments.options("sandbox-user")
        if !users.isEmpty { body["sandboxAllowList"] = users }
        if let text = try arguments.option("app-apple-id") {
            guard let id = Int64(text) else { throw UsageError(description: "--app-apple-id is a number") }
            body["appAppleId"] = id
        }
        if let policy = try arguments.option("consumption-policy") { body["consumptionPolicy"] = policy }
        let keyId = try arguments.option("server-api-key-id"), issuer = try arguments.option("server-api-issuer")
        let keyFile = try arguments.option("server-api-private-key")
        if keyId != nil || issuer != nil || keyFile != nil {
            guard let keyId, let issuer, let keyFile else {
                throw UsageError(description: "--server-api-key-id, --server-api-issuer and --server-api-private-key go together")
            }
            guard let pem = FileManager.default.contents(atPath: keyFile) else { throw CommandFailure(description: "cannot read \(keyFile)") }
            body["serverAPIKey"] = ["keyId": keyId, "issuerId": issuer, "privateKey": String(decoding: pem, as: UTF8.self)]
        }
        let extra = try arguments.options("bundle-id")
        let id = try arguments.single("BUNDLE_ID")
        body["id"] = id
        if !extra.isEmpty { body["bundleIds"] = [id] + extra }
        self.body = body
    }

    func run() async throws { try await client.sendAndPrint("POST", "/admin/v1/apps", json: body) }
}

/// `storekeeper server key create`
struct ServerKeyCreateCommand: Command {
    static let abstract = "Create an API key for an app (printed once; only its hash is stored)."
    static let help = """
    APP_ID [--public] [--label TEXT] [--url URL] [--admin-key KEY]

      --public    A public key (pk_…) to ship inside the app: it uploads, and reads only the user of a user token.
                  Without it, a secret key (sk_…) for your backend, which acts for any user.

    \(serverConnectionHelp)
    """
    let client: AdminClient
    let app: String
    let body: [String: Any]

    init(_ arguments: inout Arguments) throws {
        client = try serverClient(&arguments)
        var body: [String: Any] = ["kind": arguments.flag("public") ? "public" : "secret"]
        if let label = try arguments.option("label") { body["label"] = label }
        self.body = body
        app = try arguments.single("APP_ID")
    }

    func run() async throws { try await client.sendAndPrint("POST", "/admin/v1/apps/\(pathSegment(app))/keys", json: body) }
}

/// `storekeeper server key list`
struct ServerKeyListCommand: Command {
    static let abstract = "List an app's API keys (ids, kinds, labels, last four characters, revocations), never the keys."
    static let help = "APP_ID [--url URL] [--admin-key KEY]\n\n\(serverConnectionHelp)"
    let client: AdminClient
    let app: String

    init(_ arguments: inout Arguments) throws {
        client = try serverClient(&arguments)
        app = try arguments.single("APP_ID")
    }

    func run() async throws { try await client.sendAndPrint("GET", "/admin/v1/apps/\(pathSegment(app))/keys") }
}

/// `storekeeper server key revoke`
struct ServerKeyRevokeCommand: Command {
    static let abstract = "Revoke an API key: every server process sharing the database refuses it within a second."
    static let help = "APP_ID KEY_ID [--url URL] [--admin-key KEY]\n\n\(serverConnectionHelp)"
    let client: AdminClient
    let app: String
    let id: String

    init(_ arguments: inout Arguments) throws {
        client = try serverClient(&arguments)
        let words = try arguments.positionals(2, "APP_ID KEY_ID")
        app = words[0]
        id = words[1]
    }

    func run() async throws { try await client.sendAndPrint("DELETE", "/admin/v1/apps/\(pathSegment(app))/keys/\(pathSegment(id))") }
}

/// `storekeeper server key rotate`
struct ServerKeyRotateCommand: Command {
    static let abstract = "Replace an API key with a new one of the same kind; the old one works for --grace seconds more."
    static let help = """
    APP_ID KEY_ID [--grace SECONDS] [--url URL] [--admin-key KEY]

      --grace SECONDS   How long the old key keeps working, so deployed copies can switch (default 0, at most 604800).

    \(serverConnectionHelp)
    """
    let client: AdminClient
    let app: String
    let id: String
    let grace: Double

    init(_ arguments: inout Arguments) throws {
        client = try serverClient(&arguments)
        let text = try arguments.option("grace") ?? "0"
        guard let grace = Double(text), grace.isFinite, (0...604_800).contains(grace) else { throw UsageError(description: "--grace is 0–604800 seconds") }
        self.grace = grace
        let words = try arguments.positionals(2, "APP_ID KEY_ID")
        app = words[0]
        id = words[1]
    }

    func run() async throws {
        try await client.sendAndPrint("POST", "/admin/v1/apps/\(pathSegment(app))/keys/\(pathSegment(id))/rotate", json: ["graceSeconds": grace])
    }
}

/// A value as one URL path segment.
func pathSegment(_ text: String) -> String {
    text.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed.subtracting(CharacterSet(charactersIn: "/"))) ?? text
}

/// `storekeeper server product set`
struct ServerProductSetCommand: Command {
    static let abstract = "Say what a product grants: an entitlement, or credit to a balance."
    static let help = """
    APP_ID PRODUCT_ID --type TYPE [--entitlement ID] [--currency NAME --amount N] [--duration-days N] [--price 0.99 --price-currency USD]

      TYPE is consumable, non-consumable, auto-renewable, non-renewing or free-subscription.
    \(serverConnectionHelp)
    """
    let client: AdminClient
    let app: String
    let product: String
    let body: [String: Any]

    init(_ arguments: inout Arguments) throws {
        client = try serverClient(&arguments)
        guard let type = try arguments.option("type") else { throw UsageError(description: "--type is required") }
        var body: [String: Any] = ["type": type]
        for (option, key) in [("entitlement", "entitlement"), ("currency", "currency"), ("price", "price"), ("price-currency", "priceCurrency")] {
            if let value = try arguments.option(option) { body[key] = value }
        }
        for (option, key) in [("amount", "amount"), ("duration-days", "durationDays")] {
            if let value = try arguments.option(option) {
                guard let number = Int(value) else { throw UsageError(description: "--\(option) must be a number") }
                body[key] = number
            }
        }
        let rest = try arguments.positionals()
        guard rest.count == 2 else { throw UsageError(description: "give APP_ID and PRODUCT_ID") }
        app = rest[0]
        product = rest[1]
        self.body = body
    }

    func run() async throws { try await client.sendAndPrint("PUT", "/admin/v1/apps/\(app)/products/\(product)", json: body) }
}

/// `storekeeper server user show`
struct ServerUserShowCommand: Command {
    static let abstract = "Show what a user owns: entitlements, balances, subscriptions, transactions, audit events."
    static let help = "APP_USER_ID --app APP_ID [--url URL] [--admin-key KEY]\n\n\(serverConnectionHelp)"
    let client: AdminClient
    let app: String
    let user: String

    init(_ arguments: inout Arguments) throws {
        client = try serverClient(&arguments)
        guard let app = try arguments.option("app") else { throw UsageError(description: "--app is required") }
        self.app = app
        user = try arguments.single("APP_USER_ID")
    }

    func run() async throws {
        let encoded = user.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed.subtracting(CharacterSet(charactersIn: "/"))) ?? user
        try await client.sendAndPrint("GET", "/admin/v1/apps/\(app)/users/\(encoded)")
    }
}

/// `storekeeper server jobs list`
struct ServerJobsListCommand: Command {
    static let abstract = "List verification jobs (e.g. --state dead for the dead-letter queue) with counts per state."
    static let help = "[--state pending|verifying|timed_out|verified|rejected|dead] [--app APP_ID] [--limit N] [--url URL] [--admin-key KEY]\n\n\(serverConnectionHelp)"
    let client: AdminClient
    let query: String

    init(_ arguments: inout Arguments) throws {
        client = try serverClient(&arguments)
        var parts: [String] = []
        for name in ["state", "app", "limit"] {
            if let value = try arguments.option(name) { parts.append("\(name)=\(value.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? value)") }
        }
        query = parts.isEmpty ? "" : "?" + parts.joined(separator: "&")
    }

    func run() async throws { try await client.sendAndPrint("GET", "/admin/v1/jobs" + query) }
}

/// `storekeeper server jobs recount`
struct ServerJobsRecountCommand: Command {
    static let abstract = "Count settled jobs and delivered webhooks again from their rows (after processes of an older version settled some)."
    static let help = "[--url URL] [--admin-key KEY]\n\n\(serverConnectionHelp)"
    let client: AdminClient

    init(_ arguments: inout Arguments) throws {
        client = try serverClient(&arguments)
    }

    func run() async throws { try await client.sendAndPrint("POST", "/admin/v1/jobs/recount", json: [:]) }
}

/// `storekeeper server jobs replay`
struct ServerJobsReplayCommand: Command {
    static let abstract = "Put dead-lettered (or timed-out) jobs back in the queue: the given ids, or every dead job."
    static let help = "[VERIFICATION_ID...] [--url URL] [--admin-key KEY]\n\n\(serverConnectionHelp)"
    let client: AdminClient
    let ids: [String]

    init(_ arguments: inout Arguments) throws {
        client = try serverClient(&arguments)
        ids = try arguments.positionals()
    }

    func run() async throws {
        try await client.sendAndPrint("POST", "/admin/v1/jobs/replay", json: ids.isEmpty ? [:] : ["ids": ids])
    }
}

/// `storekeeper server reconcile`
struct ServerReconcileCommand: Command {
    static let abstract = "Catch up with Apple now: missed notifications (Notification History) and new transactions (Transaction History)."
    static let help = "[--url URL] [--admin-key KEY]\n\n\(serverConnectionHelp)"
    let client: AdminClient

    init(_ arguments: inout Arguments) throws { client = try serverClient(&arguments) }

    func run() async throws { try await client.sendAndPrint("POST", "/admin/v1/reconcile") }
}

/// `storekeeper server report`
struct ServerReportCommand: Command {
    static let abstract = "Revenue from the ledger: transactions, units, gross, refunds and net per day, product, currency and environment."
    static let help = "[--app APP_ID] [--from DATE] [--to DATE] [--group day,product,currency,environment] [--format table|csv|json] [--url URL] [--admin-key KEY]\n\n\(serverConnectionHelp)"
    let client: AdminClient
    let query: String
    let format: String

    init(_ arguments: inout Arguments) throws {
        client = try serverClient(&arguments)
        query = try queryString(&arguments, ["app", "from", "to", "group"])
        format = try arguments.option("format") ?? "table"
        guard ["table", "csv", "json"].contains(format) else { throw UsageError(description: "--format is table, csv or json") }
    }

    func run() async throws {
        let data = try await client.send("GET", "/admin/v1/reports/revenue" + query)
        guard format != "json" else {
            try printJSON(try JSONSerialization.jsonObject(with: data))
            return
        }
        guard let report = try JSONSerialization.jsonObject(with: data) as? [String: Any], let rows = report["rows"] as? [[String: Any]] else {
            throw CommandFailure(description: "unexpected report shape")
        }
        let columns = ["day", "productId", "currency", "environment", "transactions", "units", "gross", "refunds", "refunded", "net"]
        let present = columns.filter { column in rows.contains { $0[column] != nil } || ["transactions", "units", "gross", "refunds", "refunded", "net"].contains(column) }
        printTable(columns: present, rows: rows.map { row in present.map { row[$0].map { "\($0)" } ?? "" } }, csv: format == "csv")
        if format != "csv" {
            if let totals = report["totals"] as? [String: String], !totals.isEmpty {
                print("net total: " + totals.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", "))
            }
        }
    }
}

/// Prints rows as aligned columns, or as CSV (cells with commas or quotes quoted).
func printTable(columns: [String], rows: [[String]], csv: Bool) {
    if csv {
        func cell(_ text: String) -> String { text.contains(",") || text.contains("\"") ? "\"" + text.replacingOccurrences(of: "\"", with: "\"\"") + "\"" : text }
        print(columns.map(cell).joined(separator: ","))
        for row in rows { print(row.map(cell).joined(separator: ",")) }
        return
    }
    let widths = columns.indices.map { index in max(columns[index].count, rows.map { $0[index].count }.max() ?? 0) }
    func render(_ cells: [String]) -> String { zip(cells, widths).map { $0.padding(toLength: $1, withPad: " ", startingAt: 0) }.joined(separator: "  ") }
    print(render(columns))
    for row in rows { print(render(row)) }
}

/// `storekeeper server metrics`
struct ServerMetricsCommand: Command {
    static let abstract = "Subscription metrics of an app per day, week or month: active, new, trials, conversions, renewals, churn, refunds, MRR, revenue."
    static let help = """
    APP_ID [--from DATE] [--to DATE] [--interval day|week|month] [--environment Sandbox|Production] [--format table|csv|json] [--url URL] [--admin-key KEY]
    --rebuild [--url URL] [--admin-key KEY]

      --rebuild   Compute the daily rollup again from the whole ledger (after restoring a backup, or once every process
                  runs a build with the rollup); metrics answer 503 metrics_rebuilding until the workers have caught up.

    \(serverConnectionHelp)
    """
    let client: AdminClient
    let path: String
    let format: String
    let rebuild: Bool

    init(_ arguments: inout Arguments) throws {
        client = try serverClient(&arguments)
        rebuild = arguments.flag("rebuild")
        if rebuild {
            path = "/admin/v1/metrics/rebuild"
            format = "json"
            return
        }
        let query = try queryString(&arguments, ["from", "to", "interval", "environment"])
        format = try arguments.option("format") ?? "table"
        guard ["table", "csv", "json"].contains(format) else { throw UsageError(description: "--format is table, csv or json") }
        path = "/admin/v1/apps/\(pathSegment(try arguments.single("APP_ID")))/metrics" + query
    }

    func run() async throws {
        if rebuild { return try await client.sendAndPrint("POST", path) }
        let data = try await client.send("GET", path)
        guard format != "json" else {
            try printJSON(try JSONSerialization.jsonObject(with: data))
            return
        }
        guard let intervals = try JSONSerialization.jsonObject(with: data) as? [[String: Any]] else { throw CommandFailure(description: "unexpected metrics shape") }
        let columns = ["start", "active", "trials", "new", "trialsStarted", "conversions", "renewals", "churned", "refunds", "mrr", "gross", "net"]
        func money(_ value: Any?) -> String {
            ((value as? [String: String]) ?? [:]).sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: " ")
        }
        let rows = intervals.map { interval -> [String] in
            let start = (interval["start"] as? NSNumber).map { ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: $0.doubleValue / 1000)) } ?? ""
            let numbers = ["activeSubscriptions", "activeTrials", "newSubscriptions", "trialsStarted", "trialConversions", "renewals", "churned", "refunds"]
                .map { "\(interval[$0] ?? 0)" }
            return [String(start.prefix(10))] + numbers + [money(interval["mrr"]), money(interval["grossRevenue"]), money(interval["netRevenue"])]
        }
        printTable(columns: columns, rows: rows, csv: format == "csv")
    }
}

/// `?name=value&…` from the options given (percent-encoded; commas, hyphens and colons kept), or "" when none is.
func queryString(_ arguments: inout Arguments, _ names: [String]) throws -> String {
    var parts: [String] = []
    for name in names {
        if let value = try arguments.option(name) {
            parts.append("\(name)=\(value.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: ",-:"))) ?? value)")
        }
    }
    return parts.isEmpty ? "" : "?" + parts.joined(separator: "&")
}
