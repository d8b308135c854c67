import AppStoreModels
import Foundation
import HTTP

/// StoreKit Testing on the device API: the errors an app's settings simulate, applied to the route of each
/// StoreKit API, and the sheets an app presents (refund request, offer code redemption, manage subscriptions).
extension AppStoreResponder {
    /// The StoreKit API a device route is the App Store side of.
    static func storeKitAPI(_ method: HTTPMethod, _ path: String) -> StoreKitAPI? {
        switch (method, path) {
        case (.get, "/device/v1/products"): .loadProducts
        case (.post, "/device/v1/payments"): .purchase
        case (.post, "/device/v2/sync"), (.post, "/device/v1/restore"), (.post, "/device/v1/receipt/refresh"): .appStoreSync
        case (.get, "/device/v2/subscriptions/status"): .subscriptionStatus
        case (.get, "/device/v2/app-transaction"): .appTransaction
        case (.post, "/device/v2/refund-request"): .refundRequest
        case (.post, "/device/v2/offer-code/redeem"): .offerCodeRedeem
        case (.post, "/device/v2/manage-subscriptions"): .manageSubscriptions
        default: nil
        }
    }

    /// A device request under the app's simulated errors: a failing API answers its error before anything
    /// happens (a purchase fails inside the emulator, as a failed transaction); a verification error lets the
    /// request through and breaks the signature of every JWS in the answer, so the device's check fails as
    /// StoreKit's `VerificationResult.unverified` would.
    func respondAsDevice(to request: Request) async -> Response {
        guard let bundle = Self.appParameter(request), let settings = try? await emulator.testSettings(bundleId: bundle),
              !settings.storeKitErrors.isEmpty else {
            return await router.respond(to: request)
        }
        let api = Self.storeKitAPI(request.method, request.path)
        let failure = api.flatMap { settings.simulatedError(for: $0) }
        if let api, let failure, !failure.isVerification, api != .purchase {
            return errorResponse(StoreError.simulated(failure, api: api))
        }
        var response = await router.respond(to: request)
        if settings.simulatedError(for: .verification) != nil || failure?.isVerification == true, response.status.code < 300 {
            response.body = SignatureBreaker.breakSignatures(in: response.body)
        }
        return response
    }

    /// `app` where the route's handler reads it: the JSON body of a POST, the query otherwise.
    static func appParameter(_ request: Request) -> String? {
        guard request.method == .post else { return request.query["app"] }
        guard !request.body.isEmpty, let body = try? JSONSerialization.jsonObject(with: request.body) as? [String: Any] else { return nil }
        return body["app"] as? String
    }

    struct RefundRequestBody: Codable {
        var app: String
        var device: String
        var transactionId: String
        var reason: String?
    }

    struct OfferCodeBody: Codable {
        var app: String
        var device: String
        var product: String
        var offer: String
    }

    struct ManageSubscriptionsBody: Codable {
        var app: String
        var device: String
        var originalTransactionId: String?
        var autoRenew: Bool?
    }

    struct SimulatedErrorBody: Codable {
        var api: String
        var error: String?
        var enabled: Bool?
    }

    static func addStoreKitTestingRoutes(_ router: inout Router, _ emulator: AppStoreEmulator) {
        // Transaction.beginRefundRequest: the customer asks from inside the app; Apple asks the developer for
        // consumption data, then refunds or declines (`storekeeper appstore refund --reverse | --decline`).
        router.on(.post, "/device/v2/refund-request") { request in
            await handle {
                let body = try request.decode(RefundRequestBody.self)
                let record = try await emulator.ownedTransaction(body.transactionId, bundleId: body.app, deviceId: body.device)
                _ = try await emulator.requestRefund(transactionId: record.id, reason: body.reason ?? "OTHER")
                return .json(["status": "success", "transactionId": record.id])
            }
        }
        // AppStore.presentOfferCodeRedeemSheet: the customer types a code for one of the app's offer codes.
        router.on(.post, "/device/v2/offer-code/redeem") { request in
            await handle {
                let body = try request.decode(OfferCodeBody.self)
                let (account, _, _) = try await emulator.storeKitContext(bundleId: body.app, deviceId: body.device)
                let record = try await emulator.redeemOfferCode(bundleId: body.app, email: account.email, productId: body.product, offerId: body.offer)
                return .json(["signedTransaction": try emulator.signedTransaction(for: record, signedAt: emulator.clock.now())])
            }
        }
        // AppStore.showManageSubscriptions: the customer may turn auto-renew off or on in the sheet.
        router.on(.post, "/device/v2/manage-subscriptions") { request in
            await handle {
                let body = try request.decode(ManageSubscriptionsBody.self)
                _ = try await emulator.storeKitContext(bundleId: body.app, deviceId: body.device)
                guard let original = body.originalTransactionId, let autoRenew = body.autoRenew else { return .json(["status": "shown"]) }
                let record = try await emulator.ownedTransaction(original, bundleId: body.app, deviceId: body.device)
                _ = try await emulator.setAutoRenew(originalTransactionId: record.originalId, enabled: autoRenew)
                return .json(["status": autoRenew ? "autoRenewOn" : "autoRenewOff"])
            }
        }
        router.on(.get, "/admin/v1/apps/:bundle/test-session") { request in
            await handle { .json(testSessionBody(try await emulator.testSettings(bundleId: request.parameters["bundle"] ?? "") ?? StoreKitTestSettings())) }
        }
        router.on(.patch, "/admin/v1/apps/:bundle/test-session") { request in
            await handle {
                let change = try request.decode(AppStoreEmulator.TestSessionChange.self)
                return .json(testSessionBody(try await emulator.changeTestSession(bundleId: request.parameters["bundle"] ?? "", change)))
            }
        }
        router.on(.post, "/admin/v1/transactions/:id/resolve") { request in
            await handle { .json(DeviceTransaction(try await emulator.resolveInterruptedPurchase(transactionId: request.parameters["id"] ?? ""), receipt: nil)) }
        }
        router.on(.delete, "/admin/v1/apps/:bundle/transactions") { request in
            await handle {
                .json(["deleted": try await emulator.deleteTransactions(bundleId: request.parameters["bundle"] ?? "", transactionId: request.query["transaction"],
                                                                        account: request.query["account"])])
            }
        }
        router.on(.get, "/admin/v1/apps/:bundle/simulated-errors") { request in
            await handle { .json(simulatedErrorsBody(try await emulator.testSettings(bundleId: request.parameters["bundle"] ?? ""))) }
        }
        router.on(.put, "/admin/v1/apps/:bundle/simulated-errors") { request in
            await handle {
                let body = try request.decode(SimulatedErrorBody.self)
                guard let api = StoreKitAPI(rawValue: body.api) ?? StoreKitAPI(fileName: body.api) else {
                    throw StoreError.invalid("api is one of \(StoreKitAPI.allCases.map(\.rawValue).joined(separator: ", ")).", code: "invalid_simulated_error")
                }
                var error: StoreKitTestError?
                if let name = body.error {
                    guard let known = StoreKitTestError(rawValue: name) else {
                        throw StoreError.invalid("Unknown StoreKit error \(name).", code: "invalid_simulated_error")
                    }
                    error = known
                }
                let settings = try await emulator.setSimulatedError(bundleId: request.parameters["bundle"] ?? "", api: api, error: error,
                                                                    enabled: body.enabled ?? true)
                return .json(simulatedErrorsBody(settings))
            }
        }
        router.on(.delete, "/admin/v1/apps/:bundle/simulated-errors") { request in
            await handle { .json(simulatedErrorsBody(try await emulator.clearSimulatedErrors(bundleId: request.parameters["bundle"] ?? ""))) }
        }
    }

    /// Every API with its state: `{errors: [{api, name, enabled, error, allowed}]}`.
    static func simulatedErrorsBody(_ settings: StoreKitTestSettings?) -> [String: [SimulatedErrorState]] {
        ["errors": StoreKitAPI.allCases.map { api in
            let entry = settings?.storeKitErrors.first { $0.api == api }
            return SimulatedErrorState(api: api.rawValue, name: api.fileName, enabled: entry?.enabled ?? false,
                                       error: (entry?.error ?? (entry?.enabled == true ? api.defaultError : nil))?.rawValue,
                                       allowed: api.families.flatMap(\.errors).map(\.rawValue))
        }]
    }

    /// The switches as `GET …/test-session` shows them.
    static func testSessionBody(_ settings: StoreKitTestSettings) -> AppStoreEmulator.TestSessionChange {
        AppStoreEmulator.TestSessionChange(askToBuyEnabled: settings.askToBuyEnabled, failTransactionsEnabled: settings.failTransactionsEnabled,
                                           interruptedPurchasesEnabled: settings.interruptedPurchasesEnabled ?? false,
                                           billingIssuesEnabled: settings.billingIssuesEnabled, billingGracePeriodEnabled: settings.billingGracePeriodEnabled,
                                           timeRate: settings.timeRate ?? 0)
    }

    struct SimulatedErrorState: Codable {
        var api: String
        var name: String
        var enabled: Bool
        var error: String?
        var allowed: [String]
    }
}

/// Breaks JWS signatures in a JSON answer, as a failed `VerificationResult` would find them.
enum SignatureBreaker {
    /// Every string of the JSON that is a compact JWS gets its signature's first byte flipped; nothing else changes.
    static func breakSignatures(in body: Data) -> Data {
        guard let object = try? JSONSerialization.jsonObject(with: body) else { return body }
        let broken = transform(object)
        return (try? JSONSerialization.data(withJSONObject: broken, options: [.sortedKeys])) ?? body
    }

    private static func transform(_ value: Any) -> Any {
        switch value {
        case let object as [String: Any]: return object.mapValues(transform)
        case let array as [Any]: return array.map(transform)
        case let text as String: return breakJWS(text) ?? text
        default: return value
        }
    }

    static func breakJWS(_ text: String) -> String? {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0].hasPrefix("eyJ"), let signature = parts[2].first else { return nil }
        // Base64url: replacing the first character changes the first six bits of the signature.
        let replacement: Character = signature == "A" ? "B" : "A"
        return "\(parts[0]).\(parts[1]).\(replacement)\(parts[2].dropFirst())"
    }
}
