import AppStoreModels
import Foundation

/// The console's pages as pure functions of what they show: data in, HTML out. The responder
/// (`PurchaseServerResponder+Console`) fetches, checks roles and CSRF, and calls these.
enum ConsolePages {
    /// Everything a page needs from its request: who is signed in, and which app and environment are chosen.
    struct Context {
        var session: ConsoleSession
        var apps: [ServerApp]
        var appId: String
        var environment: String?
        var notice: String?
        var error: String?

        var csrf: String { session.csrf }
        var role: OperatorRole { session.operatorInfo.role }
    }

    // MARK: Layout

    static func layout(_ title: String, session: ConsoleSession?, active: ConsolePage?, notice: String? = nil, error: String? = nil,
                       _ body: HTML) -> HTML {
        var header: HTML = ""
        if let session {
            let links = session.pages.map { page -> HTML in
                "<li><a href=\"\(page.path)\"\(HTML(raw: page == active ? " aria-current=\"page\"" : ""))>\(page.title)</a></li>"
            }
            header = """
                <header><span class="brand">Storekeeper</span><nav aria-label="Console"><ul>\(links)</ul></nav>\
                <span>\(session.operatorInfo.email) (\(session.operatorInfo.role.rawValue))</span>\
                \(HTML.form(action: "/console/logout", csrf: session.csrf, submit: "Sign out"))</header>
                """
        } else {
            header = "<header><span class=\"brand\">Storekeeper</span></header>"
        }
        let banners: HTML = "\(notice.map { text -> HTML in "<p class=\"notice\" role=\"status\">\(text)</p>" } ?? "")\(error.map { text -> HTML in "<p class=\"error\" role=\"alert\">\(text)</p>" } ?? "")"
        return """
            <!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">\
            <title>\(title) · Storekeeper</title><link rel="stylesheet" href="/console/assets/console.css">\
            <script src="/console/assets/console.js" defer></script></head><body><a class="skip" href="#main">Skip to content</a>\(header)\
            <main id="main"><h1>\(title)</h1>\(banners)\(body)</main></body></html>
            """
    }

    /// A GET form choosing the app (and environment) a page shows.
    static func picker(_ context: Context, path: String, environment: Bool = true, extra: [HTML] = []) -> HTML {
        guard !context.apps.isEmpty else { return "<p class=\"empty\">No app is registered yet (<code>storekeeper server app add</code>).</p>" }
        let apps = HTML.select("App", name: "app", options: context.apps.map { ($0.id, $0.name.isEmpty ? $0.id : "\($0.name) (\($0.id))") },
                               selected: context.appId)
        let environments = environment
            ? HTML.select("Environment", name: "environment", options: [("", "Both"), ("Production", "Production"), ("Sandbox", "Sandbox")],
                          selected: context.environment ?? "")
            : ""
        return "<form method=\"get\" action=\"\(path)\" class=\"picker\">\(apps)\(environments)\(extra)<button type=\"submit\">Show</button></form>"
    }

    static func money(_ amounts: [String: String]) -> String {
        amounts.isEmpty ? "—" : amounts.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", ")
    }

    static func percent(_ rate: Double?) -> String { rate.map { String(format: "%.1f %%", $0 * 100) } ?? "—" }

    // MARK: Sign-in

    static func login(error: String?, email: String = "") -> HTML {
        layout("Sign in", session: nil, active: nil, error: error, """
            <section class="login"><form method="post" action="/console/login">\
            \(HTML.field("Email", name: "email", type: "email", value: email, required: true, attributes: "autocomplete=\"username\""))\
            \(HTML.field("Password", name: "password", type: "password", required: true, attributes: "autocomplete=\"current-password\""))\
            <button type="submit">Sign in</button></form></section>
            """)
    }

    static func link(token: String, error: String?) -> HTML {
        layout("Sign in with a link", session: nil, active: nil, error: error, """
            <section class="login"><p>This link signs you in once.</p><form method="post" action="/console/login/link">\
            <input type="hidden" name="token" value="\(token)"><button type="submit">Sign in</button></form></section>
            """)
    }

    static func password(_ session: ConsoleSession, notice: String?, error: String?) -> HTML {
        layout("Your password", session: session, active: nil, notice: notice, error: error, """
            <section><p>Set a password to sign in without a link next time (8 bytes or more).</p>\
            \(HTML.form(action: "/console/password", csrf: session.csrf, submit: "Set password", (session.operatorInfo.hasPassword ? [
                HTML.field("Current password", name: "current", type: "password", required: true, attributes: "autocomplete=\"current-password\""),
            ] : []) + [
                HTML.field("New password", name: "password", type: "password", required: true, attributes: "autocomplete=\"new-password\" minlength=\"8\""),
            ]))</section>
            """)
    }

    static func forbidden(_ session: ConsoleSession, page: ConsolePage) -> HTML {
        layout("Not for your role", session: session, active: nil, """
            <p>The \(page.title) page is for \(page.roles.map(\.rawValue).sorted().joined(separator: ", ")); you are \
            \(session.operatorInfo.role.rawValue). <a href="/console">Back to the overview</a>.</p>
            """)
    }

    // MARK: Overview

    struct Overview {
        var today: MetricsInterval?
        var month: MetricsInterval?
        var trend: [MetricsInterval]
        var jobCounts: [String: Int64]
        var oldestWaitingJob: Int64?
        var newestNotification: Int64?
        var webhookCounts: [String: Int64]
        var now: Int64
    }

    static func overview(_ context: Context, _ data: Overview) -> HTML {
        func card(_ label: String, _ value: String, _ note: String = "") -> HTML {
            "<div class=\"card\"><div class=\"muted\">\(label)</div><div class=\"figure\">\(value)</div>\(HTML(raw: note.isEmpty ? "" : "<div class=\"muted\">\(HTML.escape(note))</div>"))</div>"
        }
        let age = data.oldestWaitingJob.map { "\(max(0, (data.now - $0) / 1000)) s" } ?? "none waiting"
        let lag = data.newestNotification.map { "\(max(0, (data.now - $0) / 1000)) s ago" } ?? "none yet"
        let labels = data.trend.map { HTML.date($0.start).prefix(10).description }
        let currencies = Set(data.trend.flatMap { $0.mrr.keys }).sorted()
        let chart = currencies.isEmpty ? HTML("<p class=\"empty\">No paid subscriptions in the last 90 days.</p>")
            : Chart.line(id: "mrr", title: "MRR over the last 90 days", labels: labels,
                         series: currencies.map { currency in Chart.Series(name: "MRR \(currency)", values: data.trend.map { Double($0.mrr[currency] ?? "0") ?? 0 }) })
        return layout("Overview", session: context.session, active: .overview, notice: context.notice, error: context.error, """
            \(picker(context, path: "/console"))
            <h2>Sales</h2><div class="cards">\
            \(card("Revenue today", money(data.today?.grossRevenue ?? [:]), "\(data.today?.purchases ?? 0) purchases; net \(money(data.today?.netRevenue ?? [:]))"))\
            \(card("Revenue this month", money(data.month?.grossRevenue ?? [:]), "\(data.month?.purchases ?? 0) purchases; net \(money(data.month?.netRevenue ?? [:]))"))\
            \(card("New subscriptions this month", String((data.month?.newSubscriptions ?? 0) + (data.month?.trialConversions ?? 0))))\
            \(card("Refunds this month", String(data.month?.refunds ?? 0)))</div>
            <h2>Subscriptions</h2><div class="cards">\
            \(card("Active subscriptions", String(data.today?.activeSubscriptions ?? 0), "and \(data.today?.activeTrials ?? 0) in a trial"))\
            \(card("MRR", money(data.today?.mrr ?? [:])))\
            \(card("Trial conversion this month", percent(data.month?.trialConversionRate)))</div>
            <section>\(chart)</section>
            <h2>Health</h2><div class="cards">\
            \(card("Verifications waiting", String((data.jobCounts["pending"] ?? 0) + (data.jobCounts["timed_out"] ?? 0)), "oldest: \(age)"))\
            \(card("Retrying", String(data.jobCounts["timed_out"] ?? 0)))\
            \(card("Dead (need a replay)", String(data.jobCounts["dead"] ?? 0)))\
            \(card("Newest Apple notification", lag))\
            \(card("Webhook deliveries failed", String(data.webhookCounts["failed"] ?? 0), "pending \(data.webhookCounts["pending"] ?? 0)"))</div>
            """)
    }

    // MARK: Customers

    static func customers(_ context: Context, query: String, matches: [CustomerMatch]?) -> HTML {
        let search: HTML = """
            <form method="get" action="/console/customers" role="search">\
            \(HTML.select("App", name: "app", options: context.apps.map { ($0.id, $0.id) }, selected: context.appId))\
            \(HTML.field("App user id, transaction id, original transaction id or Apple order id", name: "query", type: "search", value: query, required: true))\
            <button type="submit">Search</button></form>
            """
        var results: HTML = ""
        if let matches {
            results = HTML.table(caption: "Customers matching “\(query)”", headers: ["App user id", "Matched by"], rows: matches.map { match in
                ["<a href=\"/console/customers/\(HTML.urlComponent(context.appId))/\(HTML.urlComponent(match.appUserId))\">\(match.appUserId)</a>",
                 "\(match.matchedBy)"]
            }, empty: "no customer found")
        }
        return layout("Customers", session: context.session, active: .customers, notice: context.notice, error: context.error, "\(search)\(results)")
    }

    static func customer(_ context: Context, user: UserView, timeline: TimelinePage, entitlementIds: [String]) -> HTML {
        let base = "/console/customers/\(HTML.urlComponent(context.appId))/\(HTML.urlComponent(user.appUserId))"
        let entitlements = HTML.table(caption: "Entitlements", headers: ["Entitlement", "Active", "Source", "Product", "Expires", "Action"],
                                      rows: user.entitlements.map { entitlement in
            let revoke: HTML = entitlement.source == "promotional" && entitlement.active
                ? HTML.form(action: base + "/revoke", csrf: context.csrf, submit: "Revoke", danger: true, [
                    "<input type=\"hidden\" name=\"entitlement\" value=\"\(entitlement.id)\">",
                    HTML.field("Reason", name: "reason", id: "f-reason-\(entitlement.id)", required: true),
                ]) : ""
            return ["\(entitlement.id)", "\(entitlement.active ? "yes" : "no")", "\(entitlement.source)", "\(entitlement.productId)",
                    "\(HTML.date(entitlement.expiresDate))", revoke]
        }, empty: "none")
        let balances = HTML.table(caption: "Balances", headers: ["Currency", "Amount"],
                                  rows: user.balances.sorted { $0.key < $1.key }.map { ["\($0.key)", "\($0.value)"] }, empty: "none")
        let subscriptions = HTML.table(caption: "Subscriptions", headers: ["Product", "State", "Renews", "Expires", "Environment"],
                                       rows: user.subscriptions.map { subscription in
            ["\(subscription.productId)", "\(subscription.state)", "\(subscription.autoRenewStatus.map { $0 ? "yes" : "no" } ?? "—")",
             "\(HTML.date(subscription.expiresDate))", "\(subscription.environment)"]
        }, empty: "none")
        let timelineRows = timeline.items.map { item -> [HTML] in
            var replay: HTML = ""
            if item.kind == "verification", ["dead", "rejected"].contains(item.detail["state"] ?? "") {
                replay = HTML.form(action: "/console/jobs/replay", csrf: context.csrf, submit: "Replay", ["<input type=\"hidden\" name=\"id\" value=\"\(item.id)\">"])
            } else if item.kind == "webhook" {
                replay = HTML.form(action: base + "/redeliver", csrf: context.csrf, submit: "Redeliver", ["<input type=\"hidden\" name=\"event\" value=\"\(item.id)\">"])
            }
            return ["\(HTML.date(item.at))", "\(item.kind)", "\(item.detail.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }.joined(separator: "; "))",
                    replay]
        }
        let more: HTML = timeline.next.map { next -> HTML in "<p><a href=\"\(base)?cursor=\(HTML.urlComponent(next))\">Older events</a></p>" } ?? ""
        let entitlementOptions = entitlementIds.map { ($0, $0) }
        let actions: HTML = """
            <section><h2>Grant a promotional entitlement</h2>\
            \(HTML.form(action: base + "/grant", csrf: context.csrf, submit: "Grant", [
                entitlementOptions.isEmpty ? HTML.field("Entitlement", name: "entitlement", required: true)
                    : HTML.select("Entitlement", name: "entitlement", options: entitlementOptions, selected: nil),
                HTML.field("Days", name: "durationDays", type: "number", value: "30", required: true, attributes: "min=\"1\" max=\"36500\""),
                HTML.field("Reason", name: "reason", id: "f-grant-reason", required: true),
            ]))</section>
            <section><h2>Adjust a balance</h2>\
            \(HTML.form(action: base + "/adjust", csrf: context.csrf, submit: "Adjust", [
                HTML.field("Currency", name: "currency", value: user.balances.keys.sorted().first ?? "", required: true),
                HTML.field("Amount (negative to take away)", name: "amount", type: "number", required: true),
                HTML.field("Reason", name: "reason", id: "f-adjust-reason", required: true),
            ]))</section>
            <section><h2>Delete this customer</h2><p>Replaces the user id everywhere by a tombstone and drops what is personal; \
            amounts stay in the ledger. This cannot be undone.</p>\
            <form method="post" action="\(base)/delete" data-confirm="Delete this customer for good?"><input type="hidden" name="csrf" value="\(context.csrf)">\
            <div class="field"><label for="f-confirm"><input id="f-confirm" type="checkbox" name="confirm" value="yes" required> I understand</label></div>\
            <button type="submit" class="danger">Delete customer</button></form></section>
            """
        return layout("Customer \(user.appUserId)", session: context.session, active: .customers, notice: context.notice, error: context.error, """
            <p><a href="/console/customers?app=\(HTML.urlComponent(context.appId))">All customers</a>\(HTML(raw: user.flagged ? " · <strong>Flagged</strong>: " + HTML.escape(user.flagReason ?? "") : ""))</p>
            \(entitlements)\(balances)\(subscriptions)\(actions)
            \(HTML.table(caption: "Timeline, newest first", headers: ["When", "What", "Detail", "Action"], rows: timelineRows, empty: "nothing yet"))\(more)
            """)
    }

    // MARK: Transactions

    static func transactions(_ context: Context, filter: TransactionFilter, query: [String: String], rows: [TransactionListing]) -> HTML {
        let types: [(String, String)] = [("", "Any")] + ProductType.allCases.map { ($0.rawValue, $0.rawValue) }
        let controls: [HTML] = [
            HTML.field("From", name: "from", type: "date", value: query["from"] ?? String(HTML.date(filter.from).prefix(10))),
            HTML.field("To (exclusive)", name: "to", type: "date", value: query["to"] ?? String(HTML.date(filter.to).prefix(10))),
            HTML.field("Product", name: "product", value: query["product"] ?? ""),
            HTML.select("Type", name: "type", options: types, selected: query["type"] ?? ""),
            HTML.select("Refunded", name: "refunded", options: [("", "Either"), ("yes", "Refunded"), ("no", "Not refunded")], selected: query["refunded"] ?? ""),
        ]
        var csv = query
        csv["format"] = "csv"
        let csvLink = "/console/transactions?" + csv.sorted { $0.key < $1.key }.map { "\(HTML.urlComponent($0.key))=\(HTML.urlComponent($0.value))" }
            .joined(separator: "&")
        let table = HTML.table(caption: "\(rows.count) transactions\(rows.count == filter.limit ? " (the newest \(filter.limit); narrow the filter or export)" : "")",
                               headers: ["Purchased", "Transaction", "User", "Product", "Type", "Price", "Refunded", "Environment"], rows: rows.map { row in
            ["\(HTML.date(row.transaction.purchaseDate))", "\(row.transaction.transactionId)",
             "<a href=\"/console/customers/\(HTML.urlComponent(context.appId))/\(HTML.urlComponent(row.appUserId))\">\(row.appUserId)</a>",
             "\(row.transaction.productId)", "\(row.transaction.productType)", "\([row.price, row.currency].compactMap { $0 }.joined(separator: " "))",
             "\(HTML.date(row.transaction.cancellationDate))", "\(row.transaction.environment)"]
        }, empty: "none in this range")
        return layout("Transactions", session: context.session, active: .transactions, notice: context.notice, error: context.error, """
            \(picker(context, path: "/console/transactions", extra: controls))<p><a href="\(csvLink)">Export these as CSV</a></p>\(table)
            """)
    }

    static func transactionsCSV(_ rows: [TransactionListing]) -> String {
        /// Every cell quoted (a comma or quote hidden in a grapheme cluster cannot end it early), and one that a
        /// spreadsheet would run as a formula (= + - @, tab, CR, judged on its first scalar) kept as text with a `'`.
        func cell(_ value: String?) -> String {
            var text = value ?? ""
            if let first = text.unicodeScalars.first, "=+-@\t\r".unicodeScalars.contains(first) { text = "'" + text }
            var quoted = "\""
            for scalar in text.unicodeScalars {
                if scalar == "\"" { quoted += "\"\"" } else { quoted.unicodeScalars.append(scalar) }
            }
            return quoted + "\""
        }
        var lines = ["purchase_date,transaction_id,original_transaction_id,app_user_id,product_id,product_type,quantity,price,currency,cancellation_date,environment"]
        for row in rows {
            let transaction = row.transaction
            lines.append([HTML.date(transaction.purchaseDate), transaction.transactionId, transaction.originalTransactionId, row.appUserId,
                          transaction.productId, transaction.productType, String(transaction.quantity), row.price ?? "", row.currency ?? "",
                          transaction.cancellationDate.map { HTML.date($0) } ?? "", transaction.environment].map(cell).joined(separator: ","))
        }
        return lines.joined(separator: "\r\n") + "\r\n"
    }

    // MARK: Metrics

    static func metrics(_ context: Context, interval: SubscriptionMetrics.Interval, query: [String: String], figures: [MetricsInterval]) -> HTML {
        let controls: [HTML] = [
            HTML.select("Interval", name: "interval", options: SubscriptionMetrics.Interval.allCases.map { ($0.rawValue, $0.rawValue) }, selected: interval.rawValue),
            HTML.field("From", name: "from", type: "date", value: query["from"] ?? String(HTML.date(figures.first?.start).prefix(10))),
            HTML.field("To (exclusive)", name: "to", type: "date", value: query["to"] ?? ""),
        ]
        let labels = figures.map { String(HTML.date($0.start).prefix(10)) }
        func section(_ id: String, _ title: String, _ series: [Chart.Series], _ headers: [String], _ cells: (MetricsInterval) -> [String]) -> HTML {
            let table = HTML.table(caption: title, headers: ["Interval"] + headers,
                                   rows: zip(labels, figures).map { label, figure in ["\(label)"] + cells(figure).map { "\($0)" } })
            return "<section><h2>\(title)</h2><div class=\"chart\">\(Chart.line(id: id, title: title, labels: labels, series: series))\(table)</div></section>"
        }
        let currencies = Set(figures.flatMap { Array($0.mrr.keys) + Array($0.grossRevenue.keys) }).sorted()
        func amount(_ text: String?) -> Double { Double(text ?? "0") ?? 0 }
        let sections: [HTML] = [
            section("mrr", "MRR", currencies.map { currency in Chart.Series(name: currency, values: figures.map { amount($0.mrr[currency]) }) },
                    currencies, { figure in currencies.map { figure.mrr[$0] ?? "0.00" } }),
            section("active", "Active subscriptions and trials", [Chart.Series(name: "Subscriptions", values: figures.map { Double($0.activeSubscriptions) }),
                                                                 Chart.Series(name: "Trials", values: figures.map { Double($0.activeTrials) })],
                    ["Subscriptions", "Trials"], { ["\($0.activeSubscriptions)", "\($0.activeTrials)"] }),
            section("movement", "New subscriptions, renewals and churn", [
                Chart.Series(name: "New", values: figures.map { Double($0.newSubscriptions + $0.trialConversions) }),
                Chart.Series(name: "Renewals", values: figures.map { Double($0.renewals) }),
                Chart.Series(name: "Churned", values: figures.map { Double($0.churned) }),
            ], ["New", "Renewals", "Churned", "Voluntary", "Billing"], {
                ["\($0.newSubscriptions + $0.trialConversions)", "\($0.renewals)", "\($0.churned)", "\($0.churnedVoluntary)", "\($0.churnedBilling)"]
            }),
            section("trials", "Trials and conversion", [Chart.Series(name: "Started", values: figures.map { Double($0.trialsStarted) }),
                                                        Chart.Series(name: "Converted", values: figures.map { Double($0.trialConversions) })],
                    ["Started", "Ended", "Converted", "Rate"], { ["\($0.trialsStarted)", "\($0.trialsEnded)", "\($0.trialConversions)", percent($0.trialConversionRate)] }),
            section("revenue", "Revenue, gross and net", currencies.flatMap { currency in
                [Chart.Series(name: "Gross \(currency)", values: figures.map { amount($0.grossRevenue[currency]) }),
                 Chart.Series(name: "Net \(currency)", values: figures.map { amount($0.netRevenue[currency]) })]
            }, currencies.flatMap { ["Gross \($0)", "Net \($0)"] }, { figure in
                currencies.flatMap { [figure.grossRevenue[$0] ?? "0.00", figure.netRevenue[$0] ?? "0.00"] }
            }),
        ]
        return layout("Metrics", session: context.session, active: .metrics, notice: context.notice, error: context.error,
                      "\(picker(context, path: "/console/metrics", extra: controls))\(sections)")
    }

    // MARK: Jobs

    static func jobs(_ context: Context, state: JobState?, jobs: [VerificationJob], counts: [String: Int64]) -> HTML {
        let states: [(String, String)] = [("", "Any")] + JobState.allCases.map { ($0.rawValue, "\($0.rawValue) (\(counts[$0.rawValue] ?? 0))") }
        let table = HTML.table(caption: "Verification jobs, by attempt time (the last, or the next for a waiting job), latest first", headers: ["Uploaded", "Id", "User", "State", "Attempts", "Reason", "Action"], rows: jobs.map { job in
            let replay: HTML = job.state.isReplayable
                ? HTML.form(action: "/console/jobs/replay", csrf: context.csrf, submit: "Replay", ["<input type=\"hidden\" name=\"id\" value=\"\(job.id)\">"]) : ""
            return ["\(HTML.date(job.createdAt.milliseconds))", "\(job.id)",
                    "<a href=\"/console/customers/\(HTML.urlComponent(job.appId))/\(HTML.urlComponent(job.appUserId))\">\(job.appUserId)</a>",
                    "\(job.state.rawValue)", "\(job.attempts)", "\(job.reason ?? "")", replay]
        }, empty: "none")
        let replayAll: HTML = (counts["dead"] ?? 0) > 0
            ? HTML.form(action: "/console/jobs/replay", csrf: context.csrf, submit: "Replay every dead job", ["<input type=\"hidden\" name=\"all\" value=\"dead\">"])
            : ""
        return layout("Verification jobs", session: context.session, active: .jobs, notice: context.notice, error: context.error, """
            \(picker(context, path: "/console/jobs", environment: false, extra: [HTML.select("State", name: "state", options: states, selected: state?.rawValue ?? "")]))\
            \(replayAll)\(table)
            """)
    }

    // MARK: Webhooks

    static func webhooks(_ context: Context, endpoints: [(WebhookEndpoint, [WebhookDelivery])], newSecret: String? = nil) -> HTML {
        let sections = endpoints.map { endpoint, deliveries -> HTML in
            let rows = deliveries.map { delivery -> [HTML] in
                ["\(HTML.date(delivery.createdAt))", "\(delivery.type)", "\(delivery.appUserId)", "\(delivery.state)", "\(delivery.attempts)",
                 "\(delivery.lastStatus.map(String.init) ?? delivery.lastError ?? "")",
                 HTML.form(action: "/console/webhooks/\(HTML.urlComponent(context.appId))/\(HTML.urlComponent(endpoint.id))/redeliver", csrf: context.csrf,
                           submit: "Redeliver", ["<input type=\"hidden\" name=\"event\" value=\"\(delivery.eventId)\">"])]
            }
            return """
                <section><h2>\(endpoint.url)</h2><p class="muted">\(endpoint.id) · \(endpoint.format.rawValue) · \
                \(endpoint.eventTypes.isEmpty ? "every event" : endpoint.eventTypes.map(\.rawValue).joined(separator: ", ")) · secret …\(endpoint.secretHint)</p>\
                \(HTML.table(caption: "Recent deliveries", headers: ["Created", "Event", "User", "State", "Attempts", "Last answer", "Action"], rows: rows, empty: "none"))</section>
                """
        }
        let add = HTML.form(action: "/console/webhooks/\(HTML.urlComponent(context.appId))", csrf: context.csrf, submit: "Add endpoint", [
            HTML.field("Endpoint URL", name: "url", type: "url", required: true),
            HTML.select("Sends", name: "format", options: [("events", "Storekeeper events"), ("apple", "Apple's signed notifications")], selected: "events"),
        ])
        let secret: HTML = newSecret.map { secret -> HTML in "<p class=\"notice\" role=\"status\">Signing secret, shown once: <code>\(secret)</code></p>" } ?? ""
        return layout("Webhooks", session: context.session, active: .webhooks, notice: context.notice, error: context.error, """
            \(picker(context, path: "/console/webhooks", environment: false))\(secret)<section><h2>Add an endpoint</h2>\(add)</section>\
            \(sections.isEmpty ? HTML("<p class=\"empty\">No endpoint yet (<code>storekeeper server webhook add</code>).</p>") : HTML(raw: sections.map(\.text).joined()))
            """)
    }

    // MARK: Settings

    static func settings(_ context: Context, app: ServerApp?, products: [ProductMapping], keys: [APIKeyRecord], newKey: String?) -> HTML {
        guard let app else {
            return layout("Settings", session: context.session, active: .settings, "\(picker(context, path: "/console/settings", environment: false))")
        }
        let base = "/console/settings/\(HTML.urlComponent(app.id))"
        let policies = HTML.table(caption: "Policies", headers: ["Setting", "Value"], rows: [
            ["Replay", "\(app.replayPolicy.rawValue)"], ["Sandbox", "\(app.sandboxPolicy.rawValue)"], ["Status 21002", "\(app.quirk21002Policy.rawValue)"],
            ["Consumption", "\(app.consumptionPolicy.rawValue)"], ["User tokens", "\(app.userAuth.rawValue)"],
            ["Bundle ids", "\(([app.id] + app.bundleIds).joined(separator: ", "))"],
        ])
        let mappings = HTML.table(caption: "Products", headers: ["Product", "Type", "Entitlement", "Credit", "Price"], rows: products.map { product in
            ["\(product.productId)", "\(product.type.rawValue)", "\(product.entitlement ?? "")",
             "\([product.amount.map(String.init), product.currency].compactMap { $0 }.joined(separator: " "))",
             "\([product.price, product.priceCurrency].compactMap { $0 }.joined(separator: " "))"]
        }, empty: "none")
        let keyRows = keys.map { key -> [HTML] in
            let revoke: HTML = key.revokedAt == nil
                ? "\(HTML.form(action: "\(base)/keys/\(HTML.urlComponent(key.id))/rotate", csrf: context.csrf, submit: "Rotate (old one works 1 hour)"))\(HTML.form(action: "\(base)/keys/\(HTML.urlComponent(key.id))/revoke", csrf: context.csrf, submit: "Revoke", danger: true))"
                : ""
            return ["\(key.id)", "\(key.kind.rawValue)", "\(key.label ?? "")", "…\(key.hint ?? "")", "\(HTML.date(key.createdAt))",
                    "\(HTML.date(key.revokedAt))", revoke]
        }
        let created: HTML = newKey.map { key -> HTML in
            "<p class=\"notice\" role=\"status\">New key, shown once: <code>\(key)</code></p>"
        } ?? ""
        let types = ProductType.allCases.map { ($0.rawValue, $0.rawValue) }
        let productForm = HTML.form(action: "\(base)/products", csrf: context.csrf, submit: "Save product", [
            HTML.field("Product id", name: "product", required: true),
            HTML.select("Type", name: "type", options: types, selected: ProductType.autoRenewable.rawValue),
            HTML.field("Entitlement", name: "entitlement"),
            HTML.field("Credits currency", name: "currency"),
            HTML.field("Credits per unit", name: "amount", type: "number"),
            HTML.field("Days (non-renewing)", name: "durationDays", type: "number"),
            HTML.field("Price", name: "price", attributes: "inputmode=\"decimal\""),
            HTML.field("Price currency", name: "priceCurrency", attributes: "maxlength=\"3\""),
        ])
        return layout("Settings", session: context.session, active: .settings, notice: context.notice, error: context.error, """
            \(picker(context, path: "/console/settings", environment: false))\(policies)\(mappings)
            <section><h2>Add or change a product</h2>\(productForm)</section>
            <section><h2>Keys</h2>\(created)\(HTML.table(caption: "API keys", headers: ["Id", "Kind", "Label", "Ends", "Created", "Revoked", "Action"], rows: keyRows, empty: "none"))\
            \(HTML.form(action: "\(base)/keys", csrf: context.csrf, submit: "Create key", [
                HTML.select("Kind", name: "kind", options: [("secret", "secret (server)"), ("public", "public (app)")], selected: "secret"),
                HTML.field("Label", name: "label"),
            ]))</section>
            """)
    }

    // MARK: Operators

    static func operators(_ context: Context, operators: [Operator], link: String?) -> HTML {
        let rows = operators.map { person -> [HTML] in
            let remove: HTML = person.email == context.session.operatorInfo.email ? "(you)"
                : HTML.form(action: "/console/operators/remove", csrf: context.csrf, submit: "Remove", danger: true,
                            ["<input type=\"hidden\" name=\"email\" value=\"\(person.email)\">"])
            return ["\(person.email)", "\(person.role.rawValue)", "\(person.hasPassword ? "yes" : "link only")", "\(HTML.date(person.createdAt))", remove]
        }
        let shown: HTML = link.map { link -> HTML in "<p class=\"notice\" role=\"status\">One-time login link (24 hours): <code>\(link)</code></p>" } ?? ""
        return layout("Operators", session: context.session, active: .operators, notice: context.notice, error: context.error, """
            \(shown)\(HTML.table(caption: "Operators", headers: ["Email", "Role", "Password", "Added", "Action"], rows: rows))
            <section><h2>Add an operator</h2>\(HTML.form(action: "/console/operators", csrf: context.csrf, submit: "Add and make a login link", [
                HTML.field("Email", name: "email", type: "email", required: true),
                HTML.select("Role", name: "role", options: OperatorRole.allCases.map { ($0.rawValue, $0.rawValue) }, selected: "support"),
            ]))</section>
            """)
    }

    // MARK: Emulator

    struct Emulator {
        var now: Date
        var faults: [String]
        var testers: [String]
        var products: [String]
    }

    static func emulator(_ context: Context, _ data: Emulator) -> HTML {
        let steps: [(String, String)] = [("60", "1 minute"), ("300", "5 minutes"), ("3600", "1 hour"), ("86400", "1 day"), ("604800", "7 days"),
                                         ("2592000", "30 days")]
        let faults = HTML.table(caption: "Faults in force", headers: ["Fault"], rows: data.faults.map { ["\($0)"] }, empty: "none: the App Store answers normally")
        let testers = HTML.table(caption: "Sandbox testers", headers: ["Email"], rows: data.testers.map { ["\($0)"] }, empty: "none")
        return layout("Emulator", session: context.session, active: .emulator, notice: context.notice, error: context.error, """
            <section><h2>Clock</h2><p>The App Store's time (and the server's, which follows it): <strong>\(HTML.date(data.now.milliseconds))</strong>. \
            Sandbox subscriptions renew every few minutes (a month is 5 minutes).</p>\
            \(HTML.form(action: "/console/emulator/advance", csrf: context.csrf, submit: "Advance", [
                HTML.select("Advance by", name: "seconds", options: steps, selected: "300"),
            ]))\
            \(HTML.form(action: "/console/emulator/set", csrf: context.csrf, submit: "Set the time", [
                HTML.field("Set to (UTC)", name: "date", type: "datetime-local", required: true),
            ]))</section>
            <section><h2>Faults on verifyReceipt</h2>\(faults)\
            \(HTML.form(action: "/console/emulator/faults", csrf: context.csrf, submit: "Add fault", [
                HTML.select("Fault", name: "fault", options: ConsoleFault.allCases.map { ($0.rawValue, $0.title) }, selected: nil),
                HTML.field("For (minutes)", name: "minutes", type: "number", value: "5", required: true, attributes: "min=\"1\" max=\"1440\""),
            ]))\
            \(HTML.form(action: "/console/emulator/faults/clear", csrf: context.csrf, submit: "Clear every fault", danger: true))</section>
            <section><h2>Testers</h2>\(testers)\
            \(HTML.form(action: "/console/emulator/testers", csrf: context.csrf, submit: "Add tester", [
                HTML.field("Tester email", name: "email", type: "email", required: true),
            ]))</section>
            <section><h2>Buy as a tester</h2><p>Buys on the emulator, then uploads the receipt to this server for the app user you name, \
            as the app would.</p>\(picker(context, path: "/console/emulator", environment: false))\
            \(HTML.form(action: "/console/emulator/buy", csrf: context.csrf, submit: "Buy and upload", [
                "<input type=\"hidden\" name=\"app\" value=\"\(context.appId)\">",
                HTML.select("Product", name: "product", options: data.products.map { ($0, $0) }, selected: nil),
                HTML.select("Tester", name: "tester", options: data.testers.map { ($0, $0) }, selected: nil),
                HTML.field("App user id", name: "user", required: true),
            ]))</section>
            """)
    }
}
