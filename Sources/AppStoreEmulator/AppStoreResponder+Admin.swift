import AppStoreModels
import Foundation
import HTTP

extension AppStoreResponder {
    struct AccountBody: Codable {
        var email: String
        var environment: String?
        var storefront: String?
        var locale: String?
        var renewalRate: RenewalRate?
        var askToBuy: Bool?
        /// A tester of Xcode's StoreKit Testing (sandbox only).
        var xcode: Bool?
    }

    struct BuyBody: Codable {
        var app: String
        var product: String
        var account: String
        var device: String?
        var quantity: Int?
        var applicationUsername: String?
        var simulate: String?
    }

    struct RestoreBody: Codable {
        var app: String
        var account: String
        var device: String?
    }

    struct TimeBody: Codable {
        var advance: String?
        var set: String?
    }

    struct FaultBody: Codable {
        var endpoint: String
        var environment: String?
        var status: Int?
        var http: Int?
        var html: Bool?
        var drop: Bool?
        var hang: Bool?
        var latency: String?
        var duration: String?
    }

    struct ReviewBody: Codable {
        var reviewState: String?
        var clearedForSale: Bool?
    }

    /// The JSON `appstore buy` prints.
    struct PurchaseSummary: Codable {
        var transaction_id: String
        var original_transaction_id: String
        var product_id: String
        var environment: AppStoreEnvironment
        var state: TransactionState
        var device: String
        var receipt: String?
        var transaction_receipt: String?
        var error: DeviceTransaction.TransactionError?
        var expires_date_ms: String?
        /// The StoreKit 2 signed transaction (JWS), for purchased transactions.
        var signedTransaction: String?
    }

    /// A device of the account: the named one (signed in if new), else its first, else a new one.
    /// The device a tester buys on: the named one, else one already signed in to the account, else a new one.
    public static func device(for account: String, named: String?, _ emulator: AppStoreEmulator) async throws -> String {
        if let named {
            if let existing = try? await emulator.device(named), existing.accountEmail.lowercased() == account.lowercased() { return existing.id }
            return try await emulator.signIn(deviceId: named, email: account).id
        }
        let known = try await emulator.read { state, _ in
            (state.devicesByAccount[account.lowercased()] ?? []).sorted().first
        }
        if let known { return known }
        return try await emulator.signIn(deviceId: nil, email: account).id
    }

    static func parseLatency(_ text: String?) throws -> ClosedRange<Double>? {
        guard let text else { return nil }
        let parts = text.split(separator: "-", maxSplits: 1).map(String.init)
        guard let first = parts.first, let low = DurationText.seconds(first), let high = parts.count > 1 ? DurationText.seconds(parts[1]) : low, low <= high else {
            throw StoreError.invalid("Latency '\(text)' is not a duration or a range like 3s-6s.", code: "invalid_latency")
        }
        return low...high
    }

    static func addAdminRoutes(_ router: inout Router, _ emulator: AppStoreEmulator) {
        router.on(.get, "/admin/v1/apps") { _ in await handle { .json(try await emulator.apps()) } }
        router.on(.get, "/admin/v1/apps/:bundle") { request in await handle { .json(try await emulator.app(request.parameters["bundle"] ?? "")) } }
        router.on(.post, "/admin/v1/apps") { request in
            await handle {
                if let file = try? JSONDecoder().decode(CatalogFile.self, from: request.body) {
                    var apps: [CatalogApp] = []
                    for app in file.apps { apps.append(try await emulator.register(app: app)) }
                    return .json(apps, status: .created)
                }
                return .json(try await emulator.register(app: try request.decode(CatalogApp.self)), status: .created)
            }
        }
        router.on(.get, "/admin/v1/apps/:bundle/storekit") { request in
            await handle {
                let app = try await emulator.app(request.parameters["bundle"] ?? "")
                return Response(status: .ok, headers: ["Content-Type": "application/json",
                                                       "Content-Disposition": "attachment; filename=\"\(app.bundleId).storekit\""],
                                body: try StoreKitConfiguration.export(app))
            }
        }
        router.on(.put, "/admin/v1/apps/:bundle/storekit") { request in
            await handle {
                let configuration: StoreKitConfiguration
                do { configuration = try StoreKitConfiguration(data: request.body) } catch {
                    throw StoreError.invalid("The body is not a .storekit file: \(error)", code: "invalid_storekit")
                }
                return .json(try await emulator.register(storeKit: configuration, bundleId: request.parameters["bundle"] ?? ""), status: .created)
            }
        }
        router.on(.put, "/admin/v1/apps/:bundle/products/:product/review") { request in
            await handle {
                let body = try request.decode(ReviewBody.self)
                var state: ReviewState?
                if let text = body.reviewState {
                    guard let parsed = ReviewState(loose: text) else { throw StoreError.invalid("Unknown review state '\(text)'.", code: "invalid_review_state") }
                    state = parsed
                }
                return .json(try await emulator.setReviewState(bundleId: request.parameters["bundle"] ?? "", productId: request.parameters["product"] ?? "",
                                                              reviewState: state, clearedForSale: body.clearedForSale))
            }
        }
        router.on(.delete, "/admin/v1/apps/:bundle/products/:product") { request in
            await handle {
                try await emulator.deleteProduct(bundleId: request.parameters["bundle"] ?? "", productId: request.parameters["product"] ?? "")
                return Response(status: .noContent)
            }
        }
        router.on(.get, "/admin/v1/accounts") { _ in await handle { .json(try await emulator.accounts()) } }
        router.on(.post, "/admin/v1/accounts") { request in
            await handle {
                let body = try request.decode(AccountBody.self)
                var environment = AppStoreEnvironment.sandbox
                if let text = body.environment {
                    guard let parsed = AppStoreEnvironment(loose: text) else { throw StoreError.invalid("Environment is sandbox or production.", code: "invalid_environment") }
                    environment = parsed
                }
                if body.xcode == true && environment != .sandbox {
                    throw StoreError.invalid("Xcode testers are sandbox accounts.", code: "invalid_environment")
                }
                return .json(try await emulator.addAccount(email: body.email, environment: environment, storefront: body.storefront ?? "USA",
                                                           locale: body.locale ?? "en_US", renewalRate: body.renewalRate, askToBuy: body.askToBuy ?? false,
                                                           xcode: body.xcode ?? false),
                             status: .created)
            }
        }
        router.on(.put, "/admin/v1/accounts/:email/family") { request in
            await handle {
                struct Body: Decodable { var family: String? }
                let body = try request.decode(Body.self)
                return .json(try await emulator.setFamily(email: request.parameters["email"] ?? "", family: body.family))
            }
        }
        router.on(.delete, "/admin/v1/accounts/:email") { request in
            await handle {
                try await emulator.deleteAccount(email: request.parameters["email"] ?? "")
                return Response(status: .noContent)
            }
        }
        router.on(.post, "/admin/v1/purchases") { request in
            await handle {
                let body = try request.decode(BuyBody.self)
                let deviceId = try await device(for: body.account, named: body.device, emulator)
                let record = try await emulator.addPayment(bundleId: body.app, deviceId: deviceId, request: PaymentRequest(
                    productId: body.product, quantity: body.quantity, applicationUsername: body.applicationUsername, simulate: body.simulate))
                let transaction = try await deviceTransaction(emulator, record)
                let receipt = try await emulator.appReceipt(bundleId: body.app, deviceId: deviceId)
                return .json(PurchaseSummary(transaction_id: record.id, original_transaction_id: record.originalId, product_id: record.productId,
                                             environment: record.environment, state: record.state, device: deviceId,
                                             receipt: receipt?.base64EncodedString(), transaction_receipt: transaction.transactionReceipt,
                                             error: transaction.error, expires_date_ms: record.expiresDate.map { String(ReceiptDate.milliseconds($0)) },
                                             signedTransaction: record.state == .purchased ? try emulator.signedTransaction(for: record, signedAt: emulator.clock.now()) : nil),
                             status: .created)
            }
        }
        router.on(.get, "/admin/v1/transactions/:id") { request in
            await handle { .json(try await emulator.transaction(request.parameters["id"] ?? "")) }
        }
        router.on(.get, "/admin/v1/transactions/:id/order") { request in
            await handle {
                let record = try await emulator.transaction(request.parameters["id"] ?? "")
                return .json(["transactionId": record.id, "orderId": AppStoreEmulator.orderId(for: record.id)])
            }
        }
        router.on(.post, "/admin/v1/transactions/:id/finish") { request in
            await handle {
                let record = try await emulator.transaction(request.parameters["id"] ?? "")
                let finished = try await emulator.finish(transactionId: record.id, deviceId: record.deviceId)
                return .json(DeviceTransaction(finished, receipt: nil))
            }
        }
        router.on(.post, "/admin/v1/transactions/:id/approve") { request in
            await handle { .json(DeviceTransaction(try await emulator.answerAskToBuy(transactionId: request.parameters["id"] ?? "", approve: true), receipt: nil)) }
        }
        router.on(.post, "/admin/v1/transactions/:id/decline") { request in
            await handle { .json(DeviceTransaction(try await emulator.answerAskToBuy(transactionId: request.parameters["id"] ?? "", approve: false), receipt: nil)) }
        }
        router.on(.post, "/admin/v1/transactions/:id/refund") { request in
            await handle {
                // Apple's cancellation_reason: 0 (other) or 1 (an issue in the app).
                guard let reason = Int(request.query["reason"] ?? "0"), reason == 0 || reason == 1 else {
                    throw StoreError.invalid("reason is 0 (other) or 1 (an issue in the app).", code: "invalid_reason")
                }
                var percentage: Int?
                if let text = request.query["percentage"] {
                    guard let value = Int(text), (1...100_000).contains(value) else {
                        throw StoreError.invalid("percentage is 1…100000 milliunits of the price (100000 is all of it).", code: "invalid_percentage")
                    }
                    percentage = value
                }
                return .json(DeviceTransaction(try await emulator.refund(transactionId: request.parameters["id"] ?? "", reason: reason, percentage: percentage),
                                               receipt: nil))
            }
        }
        router.on(.post, "/admin/v1/subscriptions/:id/billing-issue") { request in
            await handle {
                let failing = (request.query["enabled"] ?? "true") != "false"
                return .json(try await emulator.setBillingIssue(originalTransactionId: request.parameters["id"] ?? "", failing: failing))
            }
        }
        router.on(.post, "/admin/v1/subscriptions/:id/price-increase") { request in
            await handle {
                .json(try await emulator.priceIncrease(originalTransactionId: request.parameters["id"] ?? "", amount: request.query["price"], consent: false,
                                                       needsConsent: request.query["consent"] != "none"))
            }
        }
        router.on(.post, "/admin/v1/subscriptions/:id/price-increase/consent") { request in
            await handle {
                .json(try await emulator.priceIncrease(originalTransactionId: request.parameters["id"] ?? "", amount: nil, consent: true))
            }
        }
        router.on(.post, "/admin/v1/subscriptions/:id/renew") { request in
            await handle { .json(try await emulator.forceSubscription(originalTransactionId: request.parameters["id"] ?? "", expire: false)) }
        }
        router.on(.post, "/admin/v1/subscriptions/:id/expire") { request in
            await handle { .json(try await emulator.forceSubscription(originalTransactionId: request.parameters["id"] ?? "", expire: true)) }
        }
        // Offer codes and win-back offers redeemed in the App Store, outside the app.
        for (path, winBack) in [("/admin/v1/offer-codes/redeem", false), ("/admin/v1/win-back-offers/redeem", true)] {
            router.on(.post, path) { request in
                await handle {
                    struct Body: Decodable { var app: String; var account: String; var product: String; var offer: String }
                    let body = try request.decode(Body.self)
                    let record = winBack
                        ? try await emulator.redeemWinBackOffer(bundleId: body.app, email: body.account, productId: body.product, offerId: body.offer)
                        : try await emulator.redeemOfferCode(bundleId: body.app, email: body.account, productId: body.product, offerId: body.offer)
                    var transaction = DeviceTransaction(record, receipt: nil)
                    transaction.signedTransaction = try emulator.signedTransaction(for: record, signedAt: emulator.clock.now())
                    return .json(transaction, status: .created)
                }
            }
        }
        router.on(.post, "/admin/v1/transactions/:id/refund-request") { request in
            await handle {
                .json(DeviceTransaction(try await emulator.requestRefund(transactionId: request.parameters["id"] ?? "",
                                                                         reason: request.query["reason"] ?? "UNINTENDED_PURCHASE"), receipt: nil))
            }
        }
        router.on(.post, "/admin/v1/transactions/:id/decline-refund") { request in
            await handle { .json(DeviceTransaction(try await emulator.declineRefund(transactionId: request.parameters["id"] ?? ""), receipt: nil)) }
        }
        router.on(.post, "/admin/v1/transactions/:id/reverse-refund") { request in
            await handle { .json(DeviceTransaction(try await emulator.reverseRefund(transactionId: request.parameters["id"] ?? ""), receipt: nil)) }
        }
        router.on(.put, "/admin/v1/apps/:bundle/grace-period") { request in
            await handle {
                struct Body: Decodable { var days: Int? }
                let body = try request.decode(Body.self)
                try await emulator.setGracePeriod(bundleId: request.parameters["bundle"] ?? "", days: body.days)
                return .json(["days": body.days])
            }
        }
        router.on(.post, "/admin/v1/subscriptions/:id/billing-plan") { request in
            await handle {
                guard let plan = request.query["plan"].flatMap(BillingPlan.Kind.init(loose:)) else {
                    throw StoreError.invalid("plan is MONTHLY or BILLED_UPFRONT.", code: "invalid_billing_plan")
                }
                return .json(try await emulator.setRenewalBillingPlan(originalTransactionId: request.parameters["id"] ?? "", plan: plan))
            }
        }
        router.on(.post, "/admin/v1/subscriptions/:id/auto-renew") { request in
            await handle {
                let enabled = (request.query["enabled"] ?? "true") != "false"
                return .json(try await emulator.setAutoRenew(originalTransactionId: request.parameters["id"] ?? "", enabled: enabled))
            }
        }
        router.on(.post, "/admin/v1/restore") { request in
            await handle {
                let body = try request.decode(RestoreBody.self)
                let deviceId = try await device(for: body.account, named: body.device, emulator)
                var result: [DeviceTransaction] = []
                for record in try await emulator.restore(bundleId: body.app, deviceId: deviceId) {
                    result.append(try await deviceTransaction(emulator, record))
                }
                return .json(["device": AnyCodableString(deviceId), "transactions": AnyCodableString(result)])
            }
        }
        router.on(.get, "/admin/v1/time") { _ in
            await handle {
                let now = try await emulator.read { _, now in now }
                return .json(["now": ReceiptDate.rfc3339(now), "now_ms": String(ReceiptDate.milliseconds(now)),
                              "offset_seconds": String(emulator.clock.currentOffset)])
            }
        }
        router.on(.post, "/admin/v1/time") { request in
            await handle {
                let body = try request.decode(TimeBody.self)
                let now: Date
                if let text = body.advance {
                    guard let seconds = DurationText.seconds(text) else { throw StoreError.invalid("'\(text)' is not a duration like 5m or 1h30m.", code: "invalid_duration") }
                    now = try await emulator.advanceTime(by: seconds)
                } else if let text = body.set {
                    guard let date = ReceiptDate.parseRFC3339(text) ?? Int64(text).map(ReceiptDate.date(milliseconds:)) else {
                        throw StoreError.invalid("'\(text)' is not an RFC 3339 date or Unix milliseconds.", code: "invalid_date")
                    }
                    now = try await emulator.setTime(date)
                } else {
                    throw StoreError.invalid("Give advance or set.", code: "missing_parameter")
                }
                return .json(["now": ReceiptDate.rfc3339(now), "now_ms": String(ReceiptDate.milliseconds(now))])
            }
        }
        router.on(.get, "/admin/v1/faults") { _ in await handle { .json(try await emulator.faults()) } }
        router.on(.post, "/admin/v1/faults") { request in
            await handle {
                let body = try request.decode(FaultBody.self)
                var environment: AppStoreEnvironment?
                if let text = body.environment {
                    guard let parsed = AppStoreEnvironment(loose: text) else { throw StoreError.invalid("Environment is sandbox or production.", code: "invalid_environment") }
                    environment = parsed
                }
                let chosen = [body.status != nil, body.http != nil, body.html == true, body.drop == true, body.hang == true].filter { $0 }.count
                guard chosen <= 1 else { throw StoreError.invalid("Choose one of status, http, html, drop, hang.", code: "conflicting_fault") }
                let behavior: Fault.Behavior
                if let status = body.status { behavior = .status(status) }
                else if let http = body.http { behavior = .http(http) }
                else if body.html == true { behavior = .html }
                else if body.drop == true { behavior = .drop }
                else if body.hang == true { behavior = .hang }
                else { behavior = .none }
                let latency = try parseLatency(body.latency)
                if case .none = behavior, latency == nil { throw StoreError.invalid("A fault needs a behaviour or a latency.", code: "empty_fault") }
                var duration: TimeInterval?
                if let text = body.duration {
                    guard let seconds = DurationText.seconds(text), seconds > 0 else { throw StoreError.invalid("'\(text)' is not a duration.", code: "invalid_duration") }
                    duration = seconds
                }
                return .json(try await emulator.addFault(endpoint: body.endpoint, environment: environment, behavior: behavior,
                                                         latency: latency, duration: duration), status: .created)
            }
        }
        router.on(.delete, "/admin/v1/faults") { request in
            await handle { .json(["removed": try await emulator.clearFaults(endpoint: request.query["endpoint"])]) }
        }
        router.on(.get, "/admin/v1/quirks") { _ in await handle { .json(try await emulator.quirks()) } }
        router.on(.put, "/admin/v1/quirks") { request in
            await handle {
                let quirks = try request.decode(Quirks.self)
                try await emulator.setQuirks(quirks)
                return .json(quirks)
            }
        }
    }
}

/// Wraps a value so differently typed values can share a dictionary for encoding.
struct AnyCodableString: Encodable {
    let encodeValue: (any Encoder) throws -> Void
    init<T: Encodable>(_ value: T) { encodeValue = value.encode }
    func encode(to encoder: any Encoder) throws { try encodeValue(encoder) }
}
