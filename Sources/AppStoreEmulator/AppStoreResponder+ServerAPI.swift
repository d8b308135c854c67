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
    static func serverAPI(_ request: Request, _ emulator: AppStoreEmulator,
                          _ body: (String, AppStoreEnvironment) async throws -> [String: Any]) async -> Response {
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
        do {
            let object = try await body(bundle, environment)
            return .rawJSON(try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]))
        } catch let error as ServerAPIError {
            return serverAPIError(error)
        } catch {
            return serverAPIError(ServerAPIError(500, 5_000_000, "An unknown error occurred."))
        }
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
