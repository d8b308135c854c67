import AppStoreModels
import Foundation
import HTTP

/// The App Store Server API (`/{sandbox|production}/inApps/...`), authenticated as Apple's is.
extension AppStoreResponder {
    static func addServerAPIRoutes(_ router: inout Router, _ emulator: AppStoreEmulator) {
        router.on(.get, "/:environment/inApps/v1/transactions/:id") { request in
            await serverAPI(request, emulator) { bundle, environment in
                let signed = try await emulator.serverAPITransaction(bundleId: bundle, environment: environment, transactionId: request.parameters["id"] ?? "")
                return ["signedTransactionInfo": signed]
            }
        }
        for version in ["v1", "v2"] {
            router.on(.get, "/:environment/inApps/\(version)/history/:id") { request in
                await serverAPI(request, emulator) { bundle, environment in
                    var query = try historyQuery(request)
                    query.includeFinishedConsumables = version == "v2"
                    let page = try await emulator.serverAPIHistory(bundleId: bundle, environment: environment,
                                                                   transactionId: request.parameters["id"] ?? "", query: query)
                    var body: [String: Any] = ["revision": page.revision, "hasMore": page.hasMore, "bundleId": bundle,
                                               "environment": environment.rawValue, "signedTransactions": page.signed]
                    if let appAppleId = page.appAppleId, environment == .production { body["appAppleId"] = appAppleId }
                    return body
                }
            }
        }
        router.on(.get, "/:environment/inApps/v1/subscriptions/:id") { request in
            await serverAPI(request, emulator) { bundle, environment in
                var statuses: [Int] = []
                for text in request.queryValues("status") {
                    guard let status = Int(text) else { throw ServerAPIError.invalidStatus }
                    statuses.append(status)
                }
                let result = try await emulator.serverAPISubscriptionStatuses(bundleId: bundle, environment: environment,
                                                                              transactionId: request.parameters["id"] ?? "", statuses: statuses)
                var body: [String: Any] = [
                    "environment": environment.rawValue, "bundleId": bundle,
                    "data": result.groups.map { group in
                        ["subscriptionGroupIdentifier": group.group,
                         "lastTransactions": group.last.map { ["status": $0.status, "originalTransactionId": $0.originalTransactionId,
                                                               "signedTransactionInfo": $0.signedTransaction, "signedRenewalInfo": $0.signedRenewal] }]
                    },
                ]
                if let appAppleId = result.appAppleId, environment == .production { body["appAppleId"] = appAppleId }
                return body
            }
        }
        router.on(.get, "/:environment/inApps/v1/transactions/appTransactions/:id") { request in
            await serverAPI(request, emulator) { bundle, environment in
                ["signedAppTransactionInfo": try await emulator.serverAPIAppTransaction(bundleId: bundle, environment: environment,
                                                                                         transactionId: request.parameters["id"] ?? "")]
            }
        }
        router.on(.post, "/:environment/inApps/v1/transactions/:id/finish") { request in
            await serverAPI(request, emulator) { bundle, environment in
                try await emulator.serverAPIFinish(bundleId: bundle, environment: environment, transactionId: request.parameters["id"] ?? "")
                return nil
            }
        }
        router.on(.get, "/:environment/inApps/v1/lookup/:orderId") { request in
            await serverAPI(request, emulator, rate: 10) { bundle, environment in
                let signed = try await emulator.serverAPILookUpOrder(bundleId: bundle, environment: environment, orderId: request.parameters["orderId"] ?? "")
                return signed.isEmpty ? ["status": 1] : ["status": 0, "signedTransactions": signed]
            }
        }
        // Refund History v1 (deprecated by Apple, still answered): every refunded transaction at once, no revision.
        router.on(.get, "/:environment/inApps/v1/refund/lookup/:id") { request in
            await serverAPI(request, emulator, rate: 10) { bundle, environment in
                var signed: [String] = []
                var revision: String?
                repeat {
                    let page = try await emulator.serverAPIRefunds(bundleId: bundle, environment: environment, transactionId: request.parameters["id"] ?? "",
                                                                   revision: revision)
                    signed += page.signed
                    revision = page.hasMore ? page.revision : nil
                } while revision != nil && signed.count < 1000
                return ["signedTransactions": signed]
            }
        }
        router.on(.get, "/:environment/inApps/v2/refund/lookup/:id") { request in
            await serverAPI(request, emulator, rate: 10) { bundle, environment in
                let page = try await emulator.serverAPIRefunds(bundleId: bundle, environment: environment, transactionId: request.parameters["id"] ?? "",
                                                               revision: request.query["revision"])
                return ["signedTransactions": page.signed, "revision": page.revision, "hasMore": page.hasMore]
            }
        }
        for version in [1, 2] {
            router.on(.put, "/:environment/inApps/v\(version)/transactions/consumption/:id") { request in
                await serverAPI(request, emulator, status: HTTPStatus(202)) { bundle, environment in
                    guard let body = try? JSONValue.parse(request.body) else { throw ServerAPIError.generalBadRequest }
                    try await emulator.serverAPIConsumption(bundleId: bundle, environment: environment, transactionId: request.parameters["id"] ?? "",
                                                            body: body, version: version)
                    return nil
                }
            }
        }
        router.on(.put, "/:environment/inApps/v1/transactions/:id/appAccountToken") { request in
            await serverAPI(request, emulator, rate: 20) { bundle, environment in
                guard let body = try? JSONValue.parse(request.body) else { throw ServerAPIError.generalBadRequest }
                try await emulator.serverAPISetAppAccountToken(bundleId: bundle, environment: environment,
                                                               originalTransactionId: request.parameters["id"] ?? "", body: body)
                return nil
            }
        }
        router.on(.put, "/:environment/inApps/v1/subscriptions/extend/:id") { request in
            await serverAPI(request, emulator, rate: 20) { bundle, environment in
                guard let body = try? JSONValue.parse(request.body) else { throw ServerAPIError.generalBadRequest }
                let original = request.parameters["id"] ?? ""
                let result = try await emulator.serverAPIExtend(bundleId: bundle, environment: environment, originalTransactionId: original, body: body)
                var answer: [String: Any] = ["originalTransactionId": original, "success": true,
                                             "effectiveDate": ReceiptDate.milliseconds(result.effectiveDate)]
                if let line = result.webOrderLineItemId { answer["webOrderLineItemId"] = line }
                return answer
            }
        }
        router.on(.post, "/:environment/inApps/v1/subscriptions/extend/mass") { request in
            await serverAPI(request, emulator, rate: 1) { bundle, environment in
                guard let body = try? JSONValue.parse(request.body) else { throw ServerAPIError.generalBadRequest }
                return ["requestIdentifier": try await emulator.serverAPIMassExtend(bundleId: bundle, environment: environment, body: body)]
            }
        }
        router.on(.get, "/:environment/inApps/v1/subscriptions/extend/mass/:productId/:requestIdentifier") { request in
            await serverAPI(request, emulator, rate: 1) { bundle, environment in
                let status = try await emulator.serverAPIMassExtension(bundleId: bundle, environment: environment,
                                                                       productId: request.parameters["productId"] ?? "",
                                                                       requestIdentifier: request.parameters["requestIdentifier"] ?? "")
                var answer: [String: Any] = ["requestIdentifier": status.requestIdentifier, "complete": status.complete,
                                             "succeededCount": status.succeededCount, "failedCount": status.failedCount]
                if let date = status.completeDate { answer["completeDate"] = ReceiptDate.milliseconds(date) }
                return answer
            }
        }
        router.on(.post, "/:environment/inApps/v1/notifications/test") { request in
            await serverAPI(request, emulator, rate: 1) { bundle, environment in
                ["testNotificationToken": try await emulator.requestTestNotification(bundleId: bundle, environment: environment)]
            }
        }
        router.on(.get, "/:environment/inApps/v1/notifications/test/:token") { request in
            await serverAPI(request, emulator, rate: 1) { bundle, environment in
                let uuid = String((request.parameters["token"] ?? "").split(separator: "_").first ?? "")
                guard let record = try await emulator.notification(uuid), record.bundleId == bundle, record.environment == environment,
                      record.notificationType == .test else {
                    throw ServerAPIError(404, 4_040_008, "Test notification not found.")
                }
                var body = notificationHistoryItem(record)
                body["firstSendAttemptResult"] = record.attempts.first?.sendAttemptResult
                return body
            }
        }
        router.on(.post, "/:environment/inApps/v1/notifications/history") { request in
            await serverAPI(request, emulator) { bundle, environment in
                guard let json = try? JSONValue.parse(request.body), json.isObject else { throw ServerAPIError.generalBadRequest }
                guard let start = json["startDate"]?.int64 else { throw ServerAPIError.invalidStartDate }
                guard let end = json["endDate"]?.int64 else { throw ServerAPIError.invalidEndDate }
                guard start <= end else { throw ServerAPIError.startDateAfterEndDate }
                let now = ReceiptDate.milliseconds(emulator.clock.now())
                guard start >= now - 180 * 86_400_000 else { throw ServerAPIError(400, 4_000_012, "Start date too far in past.") }
                let type = json["notificationType"]?.text
                let subtype = json["notificationSubtype"]?.text
                let transactionId = json["transactionId"]?.text
                let onlyFailures = json["onlyFailures"]?.bool ?? false
                var offset = 0
                if let token = request.query["paginationToken"] {
                    guard token.hasPrefix("p"), let value = Int(token.dropFirst()), value >= 0 else { throw ServerAPIError(400, 4_000_014, "Invalid pagination token.") }
                    offset = value
                }
                let all = try await emulator.notificationHistory(bundleId: bundle, environment: environment,
                                                                 from: ReceiptDate.date(milliseconds: start),
                                                                 to: ReceiptDate.date(milliseconds: min(end, now.addingReportingOverflow(1).overflow ? now : now + 1)))
                let matching = all.filter { record in
                    (type == nil || record.notificationType.rawValue == type) && (subtype == nil || record.subtype?.rawValue == subtype)
                        && (transactionId == nil || record.transactionId == transactionId || record.originalTransactionId == transactionId)
                        && (!onlyFailures || !record.delivered)
                }
                let page = matching.dropFirst(offset).prefix(20)
                let next = offset + page.count
                var body: [String: Any] = ["notificationHistory": page.map(notificationHistoryItem), "hasMore": next < matching.count]
                if next < matching.count { body["paginationToken"] = "p\(next)" }
                return body
            }
        }
        router.on(.put, "/admin/v1/apps/:bundle/notifications") { request in
            await handle {
                struct URLs: Decodable { var production: String?; var sandbox: String? }
                let body = try request.decode(URLs.self)
                for url in [body.production, body.sandbox].compactMap({ $0 }) {
                    guard let parsed = URL(string: url), ["http", "https"].contains(parsed.scheme ?? "") else {
                        throw StoreError.invalid("Notification URLs must be http(s) URLs: \(url)")
                    }
                }
                let bundle = request.parameters["bundle"] ?? ""
                try await emulator.setNotificationURLs(bundleId: bundle, NotificationURLs(production: body.production, sandbox: body.sandbox))
                return .json(try await emulator.notificationURLs(bundleId: bundle))
            }
        }
        router.on(.get, "/admin/v1/apps/:bundle/notifications") { request in
            await handle { .json(try await emulator.notificationURLs(bundleId: request.parameters["bundle"] ?? "")) }
        }
        router.on(.post, "/admin/v1/apps/:bundle/api-keys") { request in
            await handle {
                let (key, privateKey) = try await emulator.createServerAPIKey(bundleId: request.parameters["bundle"] ?? "")
                let body = try JSONSerialization.data(withJSONObject: ["keyId": key.keyId, "issuerId": key.issuerId, "bundleId": key.bundleId,
                                                                       "privateKey": privateKey], options: [.sortedKeys])
                return .rawJSON(body, status: .created)
            }
        }
    }

    /// Runs a Server API handler for the environment in the path and the app the bearer token names;
    /// failures become Apple's `{"errorCode", "errorMessage"}` bodies (401 without one).
    static func serverAPI(_ request: Request, _ emulator: AppStoreEmulator, rate: Double = 50, status: HTTPStatus = .ok,
                          _ body: (String, AppStoreEnvironment) async throws -> [String: Any]?) async -> Response {
        let environment: AppStoreEnvironment
        switch request.parameters["environment"] {
        case "sandbox": environment = .sandbox
        case "production": environment = .production
        default: return HTTPError.notFound("Environment \(request.parameters["environment"] ?? "") (use sandbox or production)").response
        }
        let bundle: String
        switch await emulator.authorizeServerAPI(authorization: request.header("authorization")) {
        case .success(let value): bundle = value
        case .failure(let error): return serverAPIError(error)
        }
        // Apple's limits are per app and endpoint, enforced hourly; the sandbox gets 10% of production's.
        let hourly = Int((rate * 3600 * (environment == .sandbox ? 0.1 : 1)).rounded())
        if let retryAt = emulator.rateLimiter.take("\(bundle)|\(environment.rawValue)|\(request.method)|\(rate)|\(request.path.split(separator: "/").dropFirst().prefix(4).joined(separator: "/"))",
                                                   limit: (try? await emulator.quirks())?.serverAPIHourlyLimit ?? hourly) {
            var response = serverAPIError(.rateLimitExceeded)
            response.headers["Retry-After"] = String(ReceiptDate.milliseconds(retryAt))
            return response
        }
        do {
            guard let object = try await body(bundle, environment) else { return Response(status: status) }
            return .rawJSON(try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]), status: status)
        } catch let error as ServerAPIError {
            return serverAPIError(error)
        } catch {
            return serverAPIError(ServerAPIError.generalInternal)
        }
    }

    /// `{signedPayload, sendAttempts: [{attemptDate, sendAttemptResult}]}` of Get Notification History.
    static func notificationHistoryItem(_ record: NotificationRecord) -> [String: Any] {
        ["signedPayload": record.signedPayload,
         "sendAttempts": record.attempts.map { ["attemptDate": ReceiptDate.milliseconds($0.attemptDate), "sendAttemptResult": $0.sendAttemptResult] }]
    }

    static func serverAPIError(_ error: ServerAPIError) -> Response {
        guard error.status != 401 else { return Response(status: HTTPStatus(401), headers: ["Content-Type": "text/plain"], body: Data("Unauthenticated\n".utf8)) }
        let body = (try? JSONSerialization.data(withJSONObject: ["errorCode": error.code, "errorMessage": error.message], options: [.sortedKeys])) ?? Data()
        return .rawJSON(body, status: HTTPStatus(error.status))
    }

    /// The filters of Get Transaction History from the query string (repeatable keys kept).
    static func historyQuery(_ request: Request) throws -> HistoryQuery {
        var query = HistoryQuery()
        query.revision = request.query["revision"]
        if let text = request.query["startDate"] {
            guard let value = Int64(text), value >= 0 else { throw ServerAPIError.invalidStartDate }
            query.startDate = value
        }
        if let text = request.query["endDate"] {
            guard let value = Int64(text), value >= 0 else { throw ServerAPIError.invalidEndDate }
            query.endDate = value
        }
        query.productIds = request.queryValues("productId")
        query.productTypes = request.queryValues("productType")
        query.subscriptionGroups = request.queryValues("subscriptionGroupIdentifier")
        query.ownershipType = request.query["inAppOwnershipType"]
        switch request.query["sort"] {
        case nil, "ASCENDING": query.descending = false
        case "DESCENDING": query.descending = true
        default: throw ServerAPIError.invalidSort
        }
        switch request.query["revoked"] ?? request.query["excludeRevoked"].map({ $0 == "true" ? "false" : "any" }) {
        case nil, "any": query.revoked = nil
        case "true": query.revoked = true
        case "false": query.revoked = false
        default: throw ServerAPIError.invalidRevoked
        }
        return query
    }
}
