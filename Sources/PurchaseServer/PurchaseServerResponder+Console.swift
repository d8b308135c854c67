import AppStoreCrypto
import AppStoreModels
import Clocks
import Foundation
import HTTP
import Locking

/// The console at `/console`: server-rendered pages for operators signed in with a session cookie. Every
/// POST carries the session's CSRF token; every page is checked against the operator's role; every action
/// is audited with the operator's email. Pages are drawn by `ConsolePages` from what the store answers.
extension PurchaseServerResponder {
    static let sessionCookie = "storekeeper_console"
    /// Content-Security-Policy of every console answer: nothing from elsewhere, no inline script or style.
    static let contentSecurityPolicy =
        "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

    /// What console routes share: the server, and the emulator beside it when there is one.
    struct Console: Sendable {
        let server: PurchaseServer
        let emulator: (any ConsoleEmulatorControl)?
        /// Sessions, login links and the sign-in throttle run on real time, never on an emulated clock the server
        /// may follow (advancing the App Store a day must not sign everyone out, nor make a link live longer).
        let realTime: any WallClock
    }

    static func addConsoleRoutes(_ router: inout Router, _ server: PurchaseServer, throttle: LoginThrottle, emulator: (any ConsoleEmulatorControl)?) {
        let console = Console(server: server, emulator: emulator, realTime: SystemClock())
        let realTime = console.realTime
        router.on(.get, "/console/assets/console.css") { _ in
            var response = Response.text(ConsoleAssets.stylesheet, contentType: "text/css; charset=utf-8")
            response.headers["Cache-Control"] = "max-age=3600"
            return secured(response)
        }
        router.on(.get, "/console/assets/console.js") { _ in
            var response = Response.text(ConsoleAssets.script, contentType: "text/javascript; charset=utf-8")
            response.headers["Cache-Control"] = "max-age=3600"
            return secured(response)
        }

        // Signing in and out.
        router.on(.get, "/console/login") { _ in page(ConsolePages.login(error: nil)) }
        router.on(.post, "/console/login") { request in
            await consoleGuarded {
                guard sameOrigin(request) else { return page(ConsolePages.login(error: "This form must be sent from the console itself."), status: .forbidden) }
                let form = try Form(request)
                let email = form["email"] ?? ""
                let now = realTime.now()
                // The attempt counts from its start (a burst cannot all pass the check before any fails), and under
                // the address as sign-in reads it (spaces and case make no new address).
                guard throttle.begin(Operator.normalizedEmail(email) ?? email, now: now) else {
                    return page(ConsolePages.login(error: "Too many failed sign-ins for this address; wait 15 minutes.", email: email), status: HTTPStatus(429))
                }
                guard let token = try await server.store.logIn(email: email, password: form["password"] ?? "", now: now) else {
                    return page(ConsolePages.login(error: "The email or the password is wrong.", email: email), status: .unauthorized)
                }
                throttle.succeeded(Operator.normalizedEmail(email) ?? email)
                return signedIn(token, request: request, to: "/console")
            }
        }
        router.on(.get, "/console/login/link") { request in
            page(ConsolePages.link(token: bounded(request.query["token"], bytes: 64), error: nil))
        }
        router.on(.post, "/console/login/link") { request in
            await consoleGuarded {
                guard sameOrigin(request) else { return page(ConsolePages.login(error: "This form must be sent from the console itself."), status: .forbidden) }
                let token = try Form(request)["token"] ?? ""
                guard let session = try await server.store.logIn(linkToken: token, now: realTime.now()) else {
                    return page(ConsolePages.link(token: "", error: "This link is unknown, used or expired; ask an admin for a new one."), status: .unauthorized)
                }
                return signedIn(session, request: request, to: "/console/password")
            }
        }
        router.on(.post, "/console/logout") { request in
            await consoleGuarded {
                let (session, token) = try await authenticated(request, console)
                try checkCSRF(request, session)
                try await server.store.logOut(token: token)
                var response = redirect("/console/login")
                response.headers["Set-Cookie"] = cookie("", request: request, maxAge: 0)
                return response
            }
        }
        consoleGet(&router, "/console/password", nil, console) { _, context in
            ConsolePages.password(context.session, notice: context.notice, error: context.error)
        }
        consolePost(&router, "/console/password", nil, console) { request, form, context in
            try await server.store.setOperatorPassword(email: context.session.operatorInfo.email, current: form["current"], password: form["password"] ?? "",
                                                       keeping: cookieValue(request, sessionCookie) ?? "", now: server.clock.now())
            return .redirect("/console?notice=" + HTML.urlComponent("Your password is set."))
        }

        // Overview.
        consoleGet(&router, "/console", .overview, console) { _, context in
            let now = server.clock.now()
            var calendar = Calendar(identifier: .gregorian)
            calendar.timeZone = TimeZone(identifier: "UTC")!
            let today = calendar.startOfDay(for: now)
            let month = calendar.dateInterval(of: .month, for: now)?.start ?? today
            var trend: [MetricsInterval] = [], monthFigures: [MetricsInterval] = []
            if !context.appId.isEmpty {
                let figures = try await server.subscriptionMetrics(appId: context.appId, ranges: [
                    (today.addingTimeInterval(-89 * 86400), now.addingTimeInterval(1), .day), (month, now.addingTimeInterval(1), .month),
                ], environment: context.environment)
                (trend, monthFigures) = (figures[0], figures[1])
            }
            let health = try await server.store.queueHealth()
            return ConsolePages.overview(context, .init(today: trend.last, month: monthFigures.last, trend: trend, jobCounts: try await server.store.jobCounts(),
                                                        oldestWaitingJob: health.oldestWaitingJob, newestNotification: health.newestNotification,
                                                        webhookCounts: try await server.store.webhookDeliveryCounts(), now: now.milliseconds))
        }

        // Customers.
        consoleGet(&router, "/console/customers", .customers, console) { request, context in
            let query = (request.query["query"] ?? "").trimmingCharacters(in: .whitespaces)
            let matches = query.isEmpty || context.appId.isEmpty ? nil : try await server.customers(appId: context.appId, query: query)
            return ConsolePages.customers(context, query: query, matches: matches)
        }
        consoleGet(&router, "/console/customers/:app/:user", .customers, console) { request, context in
            let appId = request.parameters["app"] ?? ""
            let user = try userId(request.parameters["user"])
            let view = try await server.store.user(appId: appId, appUserId: user, now: server.clock.now())
            let timeline = try await server.timeline(appId: appId, appUserId: user, limit: 50, cursor: request.query["cursor"])
            let entitlements = Set(try await server.store.products(appId: appId).compactMap(\.entitlement)).sorted()
            var scoped = context
            scoped.appId = appId
            return ConsolePages.customer(scoped, user: view, timeline: timeline, entitlementIds: entitlements)
        }
        consolePost(&router, "/console/customers/:app/:user/grant", .customers, console) { request, form, context in
            let (appId, user) = (request.parameters["app"] ?? "", try userId(request.parameters["user"]))
            let entitlement = try ClientIdentifier(form["entitlement"] ?? "", .entitlement).value
            guard let days = Int64(form["durationDays"] ?? ""), (1...36_500).contains(days) else {
                throw HTTPError.badRequest("Days is a whole number from 1 to 36500.", code: "invalid_duration")
            }
            let now = server.clock.now()
            let reason = try reasonText(form)
            _ = try await server.store.grantPromotional(appId: appId, appUserId: user, entitlement: entitlement,
                                                        expiresDate: now.addingTimeInterval(Double(days) * 86400).milliseconds, reason: reason, now: now)
            try await server.store.auditConsole(context.session, appId: appId, userId: user, action: "entitlement_granted",
                                                detail: ["entitlement": entitlement, "durationDays": String(days), "reason": reason], now: now)
            return customerPath(appId, user, notice: "Granted \(entitlement) for \(days) days.")
        }
        consolePost(&router, "/console/customers/:app/:user/revoke", .customers, console) { request, form, context in
            let (appId, user) = (request.parameters["app"] ?? "", try userId(request.parameters["user"]))
            let entitlement = try ClientIdentifier(form["entitlement"] ?? "", .entitlement).value
            let now = server.clock.now()
            let reason = try reasonText(form)
            _ = try await server.store.revokePromotional(appId: appId, appUserId: user, entitlement: entitlement, reason: reason, now: now)
            try await server.store.auditConsole(context.session, appId: appId, userId: user, action: "entitlement_revoked",
                                                detail: ["entitlement": entitlement, "reason": reason], now: now)
            return customerPath(appId, user, notice: "Revoked \(entitlement).")
        }
        consolePost(&router, "/console/customers/:app/:user/adjust", .customers, console) { request, form, context in
            let (appId, user) = (request.parameters["app"] ?? "", try userId(request.parameters["user"]))
            let currency = try ClientIdentifier(form["currency"] ?? "", .currency).value
            guard let amount = Int64(form["amount"] ?? ""), amount != 0, amount.magnitude <= 1_000_000_000 else {
                throw HTTPError.badRequest("Amount is a whole number, not 0, at most a billion either way.", code: "invalid_amount")
            }
            let now = server.clock.now()
            let reason = try reasonText(form)
            // A console form is sent once per click: the CSRF token and the time make the idempotency key.
            _ = try await server.store.adjustBalance(appId: appId, appUserId: user, currency: currency, amount: amount, reason: reason,
                                                     idempotencyKey: "console-\(now.milliseconds)-\(context.csrf.prefix(8))", now: now)
            try await server.store.auditConsole(context.session, appId: appId, userId: user, action: "balance_adjusted",
                                                detail: ["currency": currency, "amount": String(amount), "reason": reason], now: now)
            return customerPath(appId, user, notice: "Adjusted \(currency) by \(amount).")
        }
        consolePost(&router, "/console/customers/:app/:user/redeliver", .customers, console) { request, form, context in
            let (appId, user) = (request.parameters["app"] ?? "", try userId(request.parameters["user"]))
            let event = bounded(form["event"], bytes: 128)
            let now = server.clock.now()
            // Again to every endpoint that had it (support sees events, not endpoints).
            var queued = 0
            for endpoint in try await server.store.webhooks(appId: appId) {
                do {
                    try await server.store.redeliverWebhook(appId: appId, id: endpoint.id, eventId: event, now: now)
                    queued += 1
                } catch let error as ServerError where error.code == .webhookDeliveryNotFound {
                    continue
                }
            }
            guard queued > 0 else { throw ServerError(.webhookDeliveryNotFound, "No endpoint had event \(event).") }
            try await server.store.auditConsole(context.session, appId: appId, userId: user, action: "webhook_redelivered",
                                                detail: ["event": event, "endpoints": String(queued)], now: now)
            return customerPath(appId, user, notice: "Event \(event) is queued again for \(queued) endpoint\(queued == 1 ? "" : "s").")
        }
        consolePost(&router, "/console/customers/:app/:user/delete", .customers, console) { request, form, context in
            let (appId, user) = (request.parameters["app"] ?? "", try userId(request.parameters["user"]))
            guard form["confirm"] == "yes" else { throw HTTPError.badRequest("Tick the confirmation to delete a customer.", code: "confirmation_required") }
            let now = server.clock.now()
            _ = try await server.store.deleteCustomer(appId: appId, appUserId: user, now: now)
            // Recorded once done, without the user id (which the deletion has just replaced).
            try await server.store.auditConsole(context.session, appId: appId, userId: nil, action: "customer_deleted", detail: [:], now: now)
            return .redirect("/console/customers?app=\(HTML.urlComponent(appId))&notice=" + HTML.urlComponent("The customer was deleted."))
        }

        // Transactions.
        consoleGet(&router, "/console/transactions", .transactions, console) { request, context in
            let now = server.clock.now()
            let from = try queryDate(request, "from", now.addingTimeInterval(-30 * 86400))
            let to = try queryDate(request, "to", now.addingTimeInterval(86400))
            var filter = TransactionFilter(appId: context.appId, from: from.milliseconds, to: to.milliseconds,
                                           productId: request.query["product"].flatMap { $0.isEmpty ? nil : $0 },
                                           productType: request.query["type"].flatMap(ProductType.init(rawValue:)), environment: context.environment,
                                           refunded: request.query["refunded"].flatMap { ["yes": true, "no": false][$0] })
            if request.query["format"] == "csv" { filter.limit = 100_000 }
            let rows = context.appId.isEmpty ? [] : try await server.store.transactions(filter)
            if request.query["format"] == "csv" {
                var response = Response.text(ConsolePages.transactionsCSV(rows), contentType: "text/csv; charset=utf-8")
                response.headers["Content-Disposition"] = "attachment; filename=\"transactions.csv\""
                return .response(response)
            }
            return .page(ConsolePages.transactions(context, filter: filter, query: request.query, rows: rows))
        }

        // Metrics.
        consoleGet(&router, "/console/metrics", .metrics, console) { request, context in
            let now = server.clock.now()
            guard let interval = SubscriptionMetrics.Interval(rawValue: request.query["interval"] ?? "day") else {
                throw HTTPError.badRequest("interval is day, week or month.", code: "invalid_interval")
            }
            let span: Double = switch interval { case .day: 30 * 86400; case .week: 26 * 7 * 86400; case .month: 365 * 86400 }
            let from = try queryDate(request, "from", now.addingTimeInterval(-span))
            let to = try queryDate(request, "to", now.addingTimeInterval(1))
            let figures = context.appId.isEmpty ? [] : try await server.subscriptionMetrics(appId: context.appId, from: from, to: to, interval: interval,
                                                                                             environment: context.environment)
            return ConsolePages.metrics(context, interval: interval, query: request.query, figures: figures)
        }

        // Verification jobs.
        consoleGet(&router, "/console/jobs", .jobs, console) { request, context in
            let state = request.query["state"].flatMap(JobState.init(rawValue:))
            let jobs = try await server.store.jobs(appId: context.appId.isEmpty ? nil : context.appId, state: state, limit: 200)
            return ConsolePages.jobs(context, state: state, jobs: jobs, counts: try await server.store.jobCounts())
        }
        consolePost(&router, "/console/jobs/replay", .jobs, console) { _, form, context in
            let now = server.clock.now()
            let ids: [String]? = form["all"] == "dead" ? nil : [bounded(form["id"], bytes: 128)]
            let replayed = try await server.store.replay(ids: ids, now: now)
            server.worker.wake()
            // Replays act on every app, so the record names none.
            try await server.store.auditConsole(context.session, appId: "", userId: nil, action: "jobs_replayed",
                                                detail: ["jobs": ids?.joined(separator: ",") ?? "every dead job", "count": String(replayed)], now: now)
            return .redirect("/console/jobs?notice=" + HTML.urlComponent("Replayed \(replayed) job\(replayed == 1 ? "" : "s")."))
        }

        // Webhooks.
        consoleGet(&router, "/console/webhooks", .webhooks, console) { _, context in
            var endpoints: [(WebhookEndpoint, [WebhookDelivery])] = []
            if !context.appId.isEmpty {
                for endpoint in try await server.store.webhooks(appId: context.appId) {
                    endpoints.append((endpoint, try await server.store.webhookDeliveries(appId: context.appId, id: endpoint.id, state: nil, limit: 25)))
                }
            }
            return ConsolePages.webhooks(context, endpoints: endpoints)
        }
        consolePost(&router, "/console/webhooks/:app", .webhooks, console) { request, form, context in
            let appId = request.parameters["app"] ?? ""
            let format: WebhookFormat = form["format"] == "apple" ? .apple : .events
            let now = server.clock.now()
            let (endpoint, secret) = try await server.store.createWebhook(appId: appId, url: bounded(form["url"], bytes: 4096), eventTypes: [], secret: nil,
                                                                          format: format, now: now)
            try await server.store.auditConsole(context.session, appId: appId, userId: nil, action: "webhook_added",
                                                detail: ["endpoint": endpoint.id, "url": endpoint.url], now: now)
            var endpoints: [(WebhookEndpoint, [WebhookDelivery])] = []
            for endpoint in try await server.store.webhooks(appId: appId) {
                endpoints.append((endpoint, try await server.store.webhookDeliveries(appId: appId, id: endpoint.id, state: nil, limit: 25)))
            }
            // The secret is shown once, on the answer to this POST.
            return .page(ConsolePages.webhooks(context.with(appId: appId), endpoints: endpoints, newSecret: secret))
        }
        consolePost(&router, "/console/webhooks/:app/:id/redeliver", .webhooks, console) { request, form, context in
            let (appId, id) = (request.parameters["app"] ?? "", request.parameters["id"] ?? "")
            let event = bounded(form["event"], bytes: 128)
            let now = server.clock.now()
            try await server.store.redeliverWebhook(appId: appId, id: id, eventId: event, now: now)
            try await server.store.auditConsole(context.session, appId: appId, userId: nil, action: "webhook_redelivered",
                                                detail: ["endpoint": id, "event": event], now: now)
            return .redirect("/console/webhooks?app=\(HTML.urlComponent(appId))&notice=" + HTML.urlComponent("Event \(event) is queued again."))
        }

        // Settings.
        consoleGet(&router, "/console/settings", .settings, console) { request, context in
            let app = context.apps.first { $0.id == context.appId }
            let products = app == nil ? [] : try await server.store.products(appId: context.appId)
            let keys = app == nil ? [] : try await server.store.keys(appId: context.appId)
            return ConsolePages.settings(context, app: app, products: products, keys: keys, newKey: nil)
        }
        consolePost(&router, "/console/settings/:app/keys", .settings, console) { request, form, context in
            let appId = request.parameters["app"] ?? ""
            guard try await server.store.app(appId) != nil else { throw ServerError(.appNotFound, "App \(appId) is not registered.") }
            let kind: APIKeyKind = form["kind"] == "public" ? .public : .secret
            let label = form["label"].flatMap { $0.isEmpty ? nil : bounded($0, bytes: 128) }
            let now = server.clock.now()
            let key = try await server.store.createKey(appId: appId, label: label, kind: kind, now: now)
            try await server.store.auditConsole(context.session, appId: appId, userId: nil, action: "key_created",
                                                detail: ["kind": kind.rawValue, "hint": String(key.suffix(4))], now: now)
            // The key is shown once, on the answer to this POST (never in a URL).
            let app = try await server.store.app(appId)
            return .page(ConsolePages.settings(context.with(appId: appId), app: app, products: try await server.store.products(appId: appId),
                                               keys: try await server.store.keys(appId: appId), newKey: key))
        }
        consolePost(&router, "/console/settings/:app/keys/:id/rotate", .settings, console) { request, _, context in
            let (appId, id) = (request.parameters["app"] ?? "", request.parameters["id"] ?? "")
            let now = server.clock.now()
            let (key, record) = try await server.store.rotateKey(appId: appId, id: id, grace: 3600, now: now)
            try await server.store.auditConsole(context.session, appId: appId, userId: nil, action: "key_rotated", detail: ["key": id, "replacement": record.id],
                                                now: now)
            return .page(ConsolePages.settings(context.with(appId: appId), app: try await server.store.app(appId),
                                               products: try await server.store.products(appId: appId), keys: try await server.store.keys(appId: appId),
                                               newKey: key))
        }
        consolePost(&router, "/console/settings/:app/products", .settings, console) { request, form, context in
            let appId = request.parameters["app"] ?? ""
            guard try await server.store.app(appId) != nil else { throw ServerError(.appNotFound, "App \(appId) is not registered.") }
            func text(_ name: String) -> String? { form[name].flatMap { $0.isEmpty ? nil : bounded($0, bytes: 256) } }
            func number(_ name: String) throws -> Int64? {
                guard let value = text(name) else { return nil }
                guard let number = Int64(value) else { throw HTTPError.badRequest("\(name) is a whole number.", code: "invalid_\(name)") }
                return number
            }
            let product = try ClientIdentifier(form["product"] ?? "", .productId).value
            let mapping = try productMapping(product, ProductBody(type: text("type") ?? "", entitlement: text("entitlement"), currency: text("currency"),
                                                                  amount: try number("amount"), durationDays: try number("durationDays"),
                                                                  price: text("price"), priceCurrency: text("priceCurrency")))
            try await server.store.setProduct(appId: appId, mapping)
            try await server.store.auditConsole(context.session, appId: appId, userId: nil, action: "product_set",
                                                detail: ["product": product, "type": mapping.type.rawValue], now: server.clock.now())
            return .redirect("/console/settings?app=\(HTML.urlComponent(appId))&notice=" + HTML.urlComponent("\(product) is saved."))
        }
        consolePost(&router, "/console/settings/:app/keys/:id/revoke", .settings, console) { request, _, context in
            let (appId, id) = (request.parameters["app"] ?? "", request.parameters["id"] ?? "")
            let now = server.clock.now()
            _ = try await server.store.revokeKey(appId: appId, id: id, effective: now, now: now)
            try await server.store.auditConsole(context.session, appId: appId, userId: nil, action: "key_revoked", detail: ["key": id], now: now)
            return .redirect("/console/settings?app=\(HTML.urlComponent(appId))&notice=" + HTML.urlComponent("Key \(id) is revoked."))
        }

        // Operators.
        consoleGet(&router, "/console/operators", .operators, console) { _, context in
            ConsolePages.operators(context, operators: try await server.store.operators(), link: nil)
        }
        consolePost(&router, "/console/operators", .operators, console) { request, form, context in
            guard let role = OperatorRole(rawValue: form["role"] ?? "") else {
                throw HTTPError.badRequest("role is admin, support, finance or developer.", code: "invalid_role")
            }
            let now = realTime.now()
            let (person, token) = try await server.store.addOperator(email: form["email"] ?? "", role: role, password: nil, replacing: false, now: now)
            try await server.store.auditConsole(context.session, appId: "", userId: nil, action: "operator_added",
                                                detail: ["email": person.email, "role": role.rawValue], now: now)
            return .page(ConsolePages.operators(context, operators: try await server.store.operators(), link: loginLink(request, token: token)))
        }
        consolePost(&router, "/console/operators/remove", .operators, console) { _, form, context in
            let email = form["email"] ?? ""
            guard email != context.session.operatorInfo.email else { throw HTTPError.badRequest("You cannot remove yourself.", code: "invalid_operator") }
            try await server.store.removeOperator(email: email, by: context.session.operatorInfo.email, now: server.clock.now())
            return .redirect("/console/operators?notice=" + HTML.urlComponent("\(email) is removed."))
        }
        addEmulatorRoutes(&router, console)
    }

    /// The Emulator page (only beside `storekeeper up`'s emulator): clock, faults, testers, a purchase as a tester.
    static func addEmulatorRoutes(_ router: inout Router, _ console: Console) {
        let server = console.server
        @Sendable func control() throws -> any ConsoleEmulatorControl {
            guard let emulator = console.emulator else { throw HTTPError(.notFound, code: "no_emulator", message: "No emulator runs beside this server.") }
            return emulator
        }
        consoleGet(&router, "/console/emulator", .emulator, console) { _, context in
            let emulator = try control()
            let products = context.appId.isEmpty ? [] : (try? await emulator.products(app: context.appId)) ?? []
            return ConsolePages.emulator(context, .init(now: try await emulator.now(), faults: try await emulator.faults(),
                                                        testers: try await emulator.testers(), products: products))
        }
        consolePost(&router, "/console/emulator/advance", .emulator, console) { _, form, context in
            guard let seconds = Double(form["seconds"] ?? ""), (1...31_536_000).contains(seconds) else {
                throw HTTPError.badRequest("Advance by 1 second to a year.", code: "invalid_duration")
            }
            let now = try await control().advanceTime(seconds: seconds)
            try await server.store.auditConsole(context.session, appId: "", userId: nil, action: "emulator_time_advanced",
                                                detail: ["seconds": String(Int(seconds))], now: now)
            return .redirect("/console/emulator?notice=" + HTML.urlComponent("The time is now \(HTML.date(now.milliseconds))."))
        }
        consolePost(&router, "/console/emulator/set", .emulator, console) { _, form, context in
            // datetime-local: 2026-12-01T18:30 (read as UTC).
            let text = form["date"] ?? ""
            guard let date = ReceiptDate.parseRFC3339(text + ":00Z") ?? ReceiptDate.parseRFC3339(text + "Z"), ReceiptDate.isAccepted(date) else {
                throw HTTPError.badRequest("The date is YYYY-MM-DDTHH:MM (UTC).", code: "invalid_date")
            }
            let now = try await control().setTime(date)
            try await server.store.auditConsole(context.session, appId: "", userId: nil, action: "emulator_time_set", detail: ["date": text], now: now)
            return .redirect("/console/emulator?notice=" + HTML.urlComponent("The time is now \(HTML.date(now.milliseconds))."))
        }
        consolePost(&router, "/console/emulator/faults", .emulator, console) { _, form, context in
            guard let fault = ConsoleFault(rawValue: form["fault"] ?? "") else { throw HTTPError.badRequest("Choose a fault.", code: "invalid_fault") }
            try await control().addFault(fault, minutes: min(max(Int(form["minutes"] ?? "") ?? 5, 1), 1440))
            try await server.store.auditConsole(context.session, appId: "", userId: nil, action: "emulator_fault_added", detail: ["fault": fault.rawValue],
                                                now: server.clock.now())
            return .redirect("/console/emulator?notice=" + HTML.urlComponent("verifyReceipt now answers with \(fault.title)."))
        }
        consolePost(&router, "/console/emulator/faults/clear", .emulator, console) { _, _, context in
            let cleared = try await control().clearFaults()
            try await server.store.auditConsole(context.session, appId: "", userId: nil, action: "emulator_faults_cleared", detail: [:], now: server.clock.now())
            return .redirect("/console/emulator?notice=" + HTML.urlComponent("Cleared \(cleared) fault\(cleared == 1 ? "" : "s")."))
        }
        consolePost(&router, "/console/emulator/testers", .emulator, console) { _, form, context in
            guard let email = Operator.normalizedEmail(form["email"] ?? "") else { throw HTTPError.badRequest("The email is not valid.", code: "invalid_email") }
            try await control().addTester(email: email)
            try await server.store.auditConsole(context.session, appId: "", userId: nil, action: "emulator_tester_added", detail: ["email": email],
                                                now: server.clock.now())
            return .redirect("/console/emulator?notice=" + HTML.urlComponent("\(email) is a sandbox tester."))
        }
        consolePost(&router, "/console/emulator/buy", .emulator, console) { _, form, context in
            let user = try userId(form["user"])
            let (app, product, tester) = (context.appId, bounded(form["product"], bytes: 256), bounded(form["tester"], bytes: 254))
            let receipt = try await control().buy(app: app, product: product, tester: tester)
            let job = try await server.submit(appId: app, appUserId: user, receiptData: receipt, kind: .purchase)
            let settled = try await server.awaitSettlement(job.id, appId: app, timeout: .seconds(10))
            try await server.store.auditConsole(context.session, appId: app, userId: user, action: "emulator_purchase",
                                                detail: ["product": product, "tester": tester, "verificationId": job.id], now: server.clock.now())
            return .redirect("/console/emulator?app=\(HTML.urlComponent(app))&notice="
                             + HTML.urlComponent("\(tester) bought \(product) for \(user): verification \(job.id) is \(settled?.state.rawValue ?? "pending")."))
        }
    }

    // MARK: Plumbing

    /// What a console GET handler answers: a page, or another response (a CSV download).
    enum ConsoleAnswer {
        case page(HTML)
        case response(Response)
    }

    /// What a console POST handler answers: where to go next (303), or a page to show at once.
    enum ConsoleOutcome {
        case redirect(String)
        case page(HTML)
    }

    static func consoleGet(_ router: inout Router, _ path: String, _ page: ConsolePage?, _ console: Console,
                           _ handler: @escaping @Sendable (Request, ConsolePages.Context) async throws -> ConsoleAnswer) {
        let server = console.server
        router.on(.get, path) { request in
            await consoleGuarded {
                guard let (session, _) = try? await authenticated(request, console) else { return redirect("/console/login") }
                if let page, !session.pages.contains(page) { return Self.page(ConsolePages.forbidden(session, page: page), status: .forbidden) }
                let context = try await context(request, session, server)
                do {
                    switch try await handler(request, context) {
                    case .page(let html): return Self.page(html)
                    case .response(let response): return secured(response)
                    }
                } catch let error as HTTPError {
                    return Self.page(ConsolePages.layout("Not shown", session: session, active: page, error: error.message, ""), status: error.status)
                } catch let error as ServerError {
                    return Self.page(ConsolePages.layout("Not shown", session: session, active: page, error: error.message, ""),
                                     status: HTTPStatus(error.kind.httpStatus))
                }
            }
        }
    }

    static func consoleGet(_ router: inout Router, _ path: String, _ page: ConsolePage?, _ console: Console,
                           _ handler: @escaping @Sendable (Request, ConsolePages.Context) async throws -> HTML) {
        consoleGet(&router, path, page, console) { request, context in .page(try await handler(request, context)) }
    }

    /// A console action: signed in, allowed for the role, with the session's CSRF token; its refusals are shown
    /// on the page it came from, as an error banner.
    static func consolePost(_ router: inout Router, _ path: String, _ page: ConsolePage?, _ console: Console,
                            _ handler: @escaping @Sendable (Request, Form, ConsolePages.Context) async throws -> ConsoleOutcome) {
        let server = console.server
        router.on(.post, path) { request in
            await consoleGuarded {
                let (session, _) = try await authenticated(request, console)
                if let page, !session.pages.contains(page) { return Self.page(ConsolePages.forbidden(session, page: page), status: .forbidden) }
                try checkCSRF(request, session)
                let form = try Form(request)
                let context = try await context(request, session, server, form: form)
                let back = request.header("referer").flatMap { URL(string: $0)?.path }.flatMap { $0.hasPrefix("/console") ? $0 : nil } ?? "/console"
                do {
                    switch try await handler(request, form, context) {
                    case .redirect(let location): return redirect(location)
                    case .page(let html): return Self.page(html)
                    }
                } catch let error as HTTPError {
                    return redirect(back + "?error=" + HTML.urlComponent(error.message) + "&app=" + HTML.urlComponent(context.appId))
                } catch let error as ServerError {
                    return redirect(back + "?error=" + HTML.urlComponent(error.message) + "&app=" + HTML.urlComponent(context.appId))
                }
            }
        }
    }

    static func context(_ request: Request, _ session: ConsoleSession, _ server: PurchaseServer, form: Form? = nil) async throws -> ConsolePages.Context {
        let apps = try await server.store.apps()
        let asked = form?["app"] ?? request.query["app"]
        let appId = apps.first { $0.id == asked }?.id ?? apps.first?.id ?? ""
        let environment = request.query["environment"].flatMap { ["Production", "Sandbox"].contains($0) ? $0 : nil }
        func banner(_ name: String) -> String? { request.query[name].map { bounded($0, bytes: 300) } }
        return ConsolePages.Context(session: session, apps: apps, appId: appId, environment: environment, notice: banner("notice"), error: banner("error"))
    }

    /// The session of the request's cookie, and the cookie's token.
    static func authenticated(_ request: Request, _ console: Console) async throws -> (ConsoleSession, String) {
        guard let token = cookieValue(request, sessionCookie),
              var session = try await console.server.store.consoleSession(token: token, now: console.realTime.now()) else {
            throw HTTPError(.unauthorized, code: "not_signed_in", message: "Sign in to the console first.")
        }
        session.emulatorAttached = console.emulator != nil
        return (session, token)
    }

    static func checkCSRF(_ request: Request, _ session: ConsoleSession) throws {
        let sent = (try? Form(request))?["csrf"] ?? request.header("x-csrf-token") ?? ""
        guard HMAC.constantTimeEqual(Array(sent.utf8), Array(session.csrf.utf8)) else {
            throw HTTPError(.forbidden, code: "invalid_csrf", message: "This form is stale or was not sent by the console; reload the page.")
        }
    }

    /// A browser's `Origin` (sent on every POST by current browsers), when present, names exactly this host and port.
    static func sameOrigin(_ request: Request) -> Bool {
        guard let origin = request.header("origin") else { return true }
        guard let host = request.header("host"), let url = URL(string: origin), let originHost = url.host else { return false }
        return originHost + (url.port.map { ":\($0)" } ?? "") == host
    }

    /// A form value cut to at most `bytes` bytes of UTF-8 (never inside a scalar): a length limit that combining
    /// marks cannot stretch.
    static func bounded(_ value: String?, bytes: Int) -> String {
        var result = String.UnicodeScalarView()
        var used = 0
        for scalar in (value ?? "").unicodeScalars {
            used += String(scalar).utf8.count
            if used > bytes { break }
            result.append(scalar)
        }
        return String(result)
    }

    static func cookieValue(_ request: Request, _ name: String) -> String? {
        for part in (request.header("cookie") ?? "").split(separator: ";") {
            let pair = part.trimmingCharacters(in: .whitespaces)
            if pair.hasPrefix(name + "=") { return String(pair.dropFirst(name.count + 1)) }
        }
        return nil
    }

    /// Behind TLS (directly, or a proxy saying so), the cookie is `Secure`.
    static func cookie(_ value: String, request: Request, maxAge: Int) -> String {
        let secure = request.header("x-forwarded-proto") == "https" ? "; Secure" : ""
        return "\(sessionCookie)=\(value); Path=/console; HttpOnly; SameSite=Strict; Max-Age=\(maxAge)\(secure)"
    }

    static func signedIn(_ token: String, request: Request, to location: String) -> Response {
        var response = redirect(location)
        response.headers["Set-Cookie"] = cookie(token, request: request, maxAge: Int(PurchaseStore.sessionLifetime))
        return response
    }

    static func loginLink(_ request: Request, token: String) -> String {
        let scheme = request.header("x-forwarded-proto") == "https" ? "https" : "http"
        return "\(scheme)://\(request.header("host") ?? "127.0.0.1")/console/login/link?token=\(token)"
    }

    static func customerPath(_ appId: String, _ user: String, notice: String) -> ConsoleOutcome {
        .redirect("/console/customers/\(HTML.urlComponent(appId))/\(HTML.urlComponent(user))?notice=" + HTML.urlComponent(notice))
    }

    static func reasonText(_ form: Form) throws -> String {
        let reason = (form["reason"] ?? "").trimmingCharacters(in: .whitespacesAndNewlines)
        guard (1...500).contains(reason.utf8.count), !reason.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) else {
            throw HTTPError.badRequest("A reason of 1 to 500 bytes is required.", code: "invalid_reason")
        }
        return reason
    }

    static func page(_ html: HTML, status: HTTPStatus = .ok) -> Response {
        secured(Response(status: status, headers: ["Content-Type": "text/html; charset=utf-8"], body: Data(html.text.utf8)))
    }

    static func redirect(_ location: String) -> Response {
        secured(Response(status: HTTPStatus(303), headers: ["Location": location], body: Data()))
    }

    static func secured(_ response: Response) -> Response {
        var response = response
        response.headers["Content-Security-Policy"] = contentSecurityPolicy
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Referrer-Policy"] = "same-origin"
        if response.headers["Cache-Control"] == nil { response.headers["Cache-Control"] = "no-store" }
        return response
    }

    /// Console errors as pages (never a JSON body in a browser): not signed in → the login page.
    static func consoleGuarded(_ body: () async throws -> Response) async -> Response {
        do {
            return try await body()
        } catch let error as HTTPError where error.status == .unauthorized {
            return redirect("/console/login")
        } catch let error as HTTPError {
            return page(ConsolePages.layout("Refused", session: nil, active: nil, error: error.message, "<p><a href=\"/console\">Back</a></p>"),
                        status: error.status)
        } catch {
            let response = await guarded { throw error }
            return page(ConsolePages.layout("Something went wrong", session: nil, active: nil,
                                            error: "The server could not answer (\(response.status.code)); try again.", ""), status: response.status)
        }
    }

    /// An `application/x-www-form-urlencoded` body: at most 64 KB and 64 fields, else 413/400.
    struct Form: Sendable {
        let fields: [String: String]

        init(_ request: Request) throws {
            guard request.body.count <= 65_536 else { throw HTTPError(.payloadTooLarge, code: "form_too_large", message: "The form is larger than 64 KB.") }
            let items = Request.parseQueryItems(String(decoding: request.body, as: UTF8.self).replacingOccurrences(of: "+", with: " "))
            guard items.count <= 64 else { throw HTTPError.badRequest("The form has more than 64 fields.", code: "form_too_large") }
            fields = Dictionary(items.map { ($0.name, $0.value) }, uniquingKeysWith: { first, _ in first })
        }

        subscript(name: String) -> String? { fields[name] }
    }
}

extension ConsolePages.Context {
    func with(appId: String) -> ConsolePages.Context {
        var copy = self
        copy.appId = appId
        return copy
    }
}

/// Sign-in attempts per email: five failures in 15 minutes lock that address out for the rest of the window;
/// more than 100 attempts a minute across all addresses lock every address (a spray). An attempt counts from its
/// start and is forgiven when it succeeds. In memory, per process.
final class LoginThrottle: Sendable {
    private let failures = Locked<[String: [Date]]>([:])
    private let recent = Locked<[Date]>([])
    static let window: TimeInterval = 15 * 60

    /// Whether an attempt for `email` may go ahead now; if so it is counted.
    func begin(_ email: String, now: Date) -> Bool {
        let key = email.lowercased()
        let everywhere = recent.withLock { list in
            list = list.filter { now.timeIntervalSince($0) < 60 }
            return list.count
        }
        guard everywhere < 100 else { return false }
        let allowed = failures.withLock { table -> Bool in
            if table.count > 100_000 { table.removeAll() }   // bounded: a flood of addresses cannot grow it without end
            let live = (table[key] ?? []).filter { now.timeIntervalSince($0) < Self.window }
            guard live.count < 5 else {
                table[key] = live
                return false
            }
            table[key] = live + [now]
            return true
        }
        if allowed { recent.withLock { $0.append(now) } }
        return allowed
    }

    /// The attempt succeeded: it does not count against the address.
    func succeeded(_ email: String) {
        let key = email.lowercased()
        failures.withLock { table in
            _ = table[key]?.popLast()
            if table[key]?.isEmpty == true { table[key] = nil }
        }
    }
}
