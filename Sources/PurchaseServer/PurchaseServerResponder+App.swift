import AppStoreModels
import Clocks
import Foundation
import HTTP
import Storage

extension PurchaseServerResponder {
    /// A transaction id or appTransactionId as Apple writes them: 1–20 ASCII digits.
    static func transactionIdentifier(_ text: String) throws -> String {
        guard text.utf8.count <= 20, text.isASCIIDigits else {
            throw HTTPError.badRequest("transactionId is a transaction id or an appTransactionId: 1–20 digits.", code: "invalid_transaction_id")
        }
        return text
    }

    /// `{"appUserId", "receiptData", "transactionId", "productId"}`, read without JSONDecoder: every upload carries kilobytes of Base64.
    struct ReceiptBody {
        var appUserId: String?
        var receiptData: String?
        var signedTransaction: String?
        var deliver: DeliveryHint?

        init(_ request: Request) throws {
            let json: JSONValue
            do { json = try JSONValue.parse(request.body) } catch {
                throw HTTPError.badRequest("The request body is not valid JSON: \(error)", code: "invalid_json")
            }
            func string(_ name: String) throws -> String? {
                switch json[name] {
                case nil, .null?: return nil
                case .string(let value)?: return value
                default: throw HTTPError.badRequest("\(name) must be a string.", code: "invalid_json")
                }
            }
            guard json.isObject else { throw HTTPError.badRequest("The request body must be a JSON object.", code: "invalid_json") }
            appUserId = try string("appUserId")
            receiptData = try string("receiptData")
            signedTransaction = try string("signedTransaction")
            // Base64 and JWS hold no NUL; PostgreSQL's text cannot hold one (SQLite keeps it), so one is refused here.
            if receiptData?.containsNUL == true {
                throw HTTPError.badRequest("receiptData holds a NUL character; it is Base64.", code: "invalid_receipt")
            }
            if signedTransaction?.containsNUL == true {
                throw HTTPError.badRequest("signedTransaction holds a NUL character; it is a compact JWS.", code: "invalid_transaction")
            }
            let transactionId = try string("transactionId")
            if let transactionId, transactionId.utf8.count > 32 || !transactionId.isASCIIDigits {
                throw HTTPError.badRequest("transactionId must be an App Store transaction id (digits).", code: "invalid_transaction_id")
            }
            let productId = try string("productId").map { try ClientIdentifier($0, .productId).value }
            deliver = DeliveryHint(transactionId: transactionId, productId: productId)
        }
    }

    static func addAppRoutes(_ router: inout Router, _ server: PurchaseServer) {
        router.on(.post, "/v1/receipts") { request in
            await guarded { try await submit(request, server, pathUser: nil, kind: .purchase) }
        }
        router.on(.post, "/v1/transactions") { request in
            await guarded {
                let key = try authenticate(request, server)
                let appId = key.appId
                let body = try ReceiptBody(request)
                let (user, authenticated) = try await authorize(request, server, key: key, naming: body.appUserId)
                guard let signed = body.signedTransaction, !signed.isEmpty else {
                    throw HTTPError.badRequest("signedTransaction is required (the JWS StoreKit 2 returned for the purchase).", code: "missing_transaction")
                }
                // Checked locally, so the answer is usually ready at once: wait for it unless told otherwise.
                let wait = request.query["wait"] == nil ? 10 : try waitSeconds(request)
                var job = try await server.submit(appId: appId, appUserId: user, receiptData: signed, kind: .signedTransaction,
                                                  userAuthenticated: authenticated)
                if wait > 0 { job = try await server.awaitSettlement(job.id, appId: appId, timeout: .milliseconds(Int(wait * 1000))) ?? job }
                return verificationResponse(job)
            }
        }
        // An anonymous id merged into a logged-in one: the secret key, or with a public key a user token for each
        // (Storekeeper-User-Token for the user, Storekeeper-Alias-Token for the alias), so neither can be claimed by someone else.
        router.on(.post, "/v1/users/:user/alias") { request in
            await guarded {
                let key = try authenticate(request, server)
                let (user, authenticated) = try await authorize(request, server, key: key, naming: request.parameters["user"])
                struct AliasBody: Decodable { var alias: String }
                let alias = try userId(try request.decode(AliasBody.self).alias)
                if key.kind == .public {
                    guard authenticated, let app = try await server.store.cachedApp(key.appId), let token = request.header("storekeeper-alias-token"),
                          try UserToken(token, app: app, now: server.clock.now()).subject == alias else {
                        throw ServerError(.userMismatch, "With a public key, send user tokens for both: Storekeeper-User-Token and Storekeeper-Alias-Token.")
                    }
                }
                return .json(try await server.store.alias(appId: key.appId, appUserId: user, alias: alias, now: server.clock.now()))
            }
        }
        // A promotional offer signed with the app's In-App Purchase key, so the app never holds the key. With a public
        // key the user's token is required: an offer is signed for the user who asks, never for a name alone.
        router.on(.post, "/v1/offers/sign") { request in
            await guarded {
                let key = try authenticate(request, server)
                struct OfferBody: Decodable {
                    var appUserId: String?
                    var productId: String
                    var offerId: String
                    var appAccountToken: String?
                    /// `v1` (the signature of SKPaymentDiscount, the default) or `jws` (the 2025 compact JWS).
                    var format: String?
                    /// For `jws`: any transaction id of the customer, or their appTransactionId (recommended by Apple).
                    var transactionId: String?
                }
                let body = try request.decode(OfferBody.self)
                let (user, authenticated) = try await authorize(request, server, key: key, naming: body.appUserId)
                guard key.kind == .secret || authenticated else {
                    throw ServerError(.userTokenRequired, "Signing an offer with a public key needs the user's token (Storekeeper-User-Token).")
                }
                let productId = try ClientIdentifier(body.productId, .productId).value
                guard (1...64).contains(body.offerId.utf8.count),
                      body.offerId.unicodeScalars.allSatisfy({ $0.isASCII && $0.properties.generalCategory != .control && $0 != "\u{2063}" }) else {
                    throw HTTPError.badRequest("offerId is the offer's identifier: 1–64 ASCII characters.", code: "invalid_offer")
                }
                if let token = body.appAccountToken, UUIDText.parse(token) == nil {
                    throw HTTPError.badRequest("appAccountToken is a UUID.", code: "invalid_app_account_token")
                }
                guard let app = try await server.store.cachedApp(key.appId), let credentials = app.serverAPIKey else {
                    throw ServerError(.offerKeyMissing, "The app has no In-App Purchase key (server app add --server-api-key-id …) to sign offers with.")
                }
                let transactionId = try body.transactionId.map { try Self.transactionIdentifier($0) }
                // Inside the app (a public key) the offer may only be bound to one of the signed-in user's own transactions.
                if let transactionId, key.kind != .secret, try await !server.store.userOwns(appId: key.appId, userId: user, transactionId: transactionId) {
                    throw HTTPError(.forbidden, code: "transaction_not_owned", message: "transactionId is not one of this user's transactions.")
                }
                // Real time, not an emulated clock the server may follow: StoreKit judges the 24 hours on its own.
                let now = SystemClock().now().timeIntervalSince1970
                switch body.format ?? "v1" {
                case "v1":
                    let signed = try PromotionalOfferSigner.sign(bundleId: app.id, credentials: credentials, productId: productId, offerId: body.offerId,
                                                                 appAccountToken: body.appAccountToken, nonce: UUID().uuidString, timestamp: Int64(now * 1000))
                    try await server.store.auditOffer(appId: app.id, userId: user, productId: productId, offerId: body.offerId, now: server.clock.now())
                    return .json(signed)
                case "jws":
                    let jws = try PromotionalOfferSigner.signJWS(audience: "promotional-offer", bundleId: app.id, credentials: credentials, productId: productId,
                                                                 offerIdentifier: body.offerId, transactionId: transactionId, nonce: UUID().uuidString,
                                                                 issuedAt: Int64(now))
                    try await server.store.auditOffer(appId: app.id, userId: user, productId: productId, offerId: body.offerId, now: server.clock.now(),
                                                      detail: ["format": "jws", "transactionId": transactionId ?? ""])
                    return .json(["productId": productId, "offerId": body.offerId, "jws": jws])
                default:
                    throw HTTPError.badRequest("format is v1 or jws.", code: "invalid_format")
                }
            }
        }
        // The developer's word on introductory-offer eligibility: a secret key only, for it gives discounts away.
        router.on(.post, "/v1/offers/introductory-eligibility") { request in
            await guarded {
                let key = try authenticate(request, server)
                guard key.kind == .secret else {
                    throw HTTPError(.forbidden, code: "secret_key_required",
                                    message: "Introductory-offer eligibility is signed for your backend's secret key only: an app could otherwise grant itself trials.")
                }
                struct EligibilityBody: Decodable {
                    var productId: String
                    var allowIntroductoryOffer: Bool
                    var transactionId: String
                }
                let body = try request.decode(EligibilityBody.self)
                let productId = try ClientIdentifier(body.productId, .productId).value
                let transactionId = try Self.transactionIdentifier(body.transactionId)
                guard let app = try await server.store.cachedApp(key.appId), let credentials = app.serverAPIKey else {
                    throw ServerError(.offerKeyMissing, "The app has no In-App Purchase key (server app add --server-api-key-id …) to sign with.")
                }
                let jws = try PromotionalOfferSigner.signJWS(audience: "introductory-offer-eligibility", bundleId: app.id, credentials: credentials,
                                                             productId: productId, transactionId: transactionId,
                                                             allowIntroductoryOffer: body.allowIntroductoryOffer, nonce: UUID().uuidString,
                                                             issuedAt: Int64(SystemClock().now().timeIntervalSince1970))
                try await server.store.auditOffer(appId: app.id, userId: nil, productId: productId, offerId: "", now: server.clock.now(),
                                                  kind: "introductory_eligibility_signed",
                                                  detail: ["allowIntroductoryOffer": String(body.allowIntroductoryOffer), "transactionId": transactionId])
                return .json(["productId": productId, "jws": jws])
            }
        }
        // Apple calls this one: no API key, the signatures are the authentication.
        router.on(.post, "/v1/notifications/apple") { request in
            await guarded {
                let receipt: NotificationReceipt
                do { receipt = try await server.receiveNotification(request.body) } catch {
                    server.metrics.notification(outcome: (error as? ServerError)?.kind == .unavailable ? "retry_later" : "refused")
                    throw error
                }
                server.metrics.notification(outcome: receipt.outcome.rawValue)
                return notificationResponse(receipt)
            }
        }
        router.on(.get, "/v1/verifications/:id") { request in
            await guarded {
                let key = try authenticate(request, server)
                let wait = try waitSeconds(request)
                let id = request.parameters["id"] ?? ""
                // A public key sees only its user's verifications (under optional user auth, any it names).
                guard var job = try await server.store.job(id, appId: key.appId) else { throw HTTPError.notFound("Verification \(id)") }
                // Authorized as its own user; a token for someone else sees no such verification.
                do { _ = try await authorize(request, server, key: key, naming: job.appUserId) } catch let error as ServerError where error.code == .userMismatch {
                    throw HTTPError.notFound("Verification \(id)")
                }
                job = try await server.awaitSettlement(id, appId: key.appId, timeout: .milliseconds(Int(wait * 1000))) ?? job
                return verificationResponse(job)
            }
        }
        router.on(.get, "/v1/users/:user") { request in
            await guarded {
                let key = try authenticate(request, server)
                let (user, _) = try await authorize(request, server, key: key, naming: request.parameters["user"])
                let view = try await server.store.user(appId: key.appId, appUserId: user, now: server.clock.now())
                return .rawJSON(Data(view.json()))
            }
        }
        router.on(.post, "/v1/users/:user/balances/:currency/spend") { request in
            await guarded {
                let key = try authenticate(request, server)
                let (user, _) = try await authorize(request, server, key: key, naming: request.parameters["user"])
                struct SpendBody: Decodable { var amount: Int64?; var idempotencyKey: String? }
                let body = try request.decode(SpendBody.self)
                guard let amount = body.amount else { throw HTTPError.badRequest("amount is required.", code: "missing_amount") }
                let idempotencyKey = request.header("idempotency-key") ?? body.idempotencyKey ?? ""
                let result = try await server.store.spend(appId: key.appId, appUserId: user,
                                                          currency: request.parameters["currency"] ?? "", amount: amount, idempotencyKey: idempotencyKey,
                                                          now: server.clock.now())
                return .json(result)
            }
        }
        router.on(.post, "/v1/users/:user/restore") { request in
            await guarded { try await submit(request, server, pathUser: request.parameters["user"], kind: .restore) }
        }
        router.on(.get, "/v1/reports/revenue") { request in
            await guarded {
                let key = try authenticate(request, server)
                try requireSecret(key)
                return .json(try await revenue(request, server, appId: key.appId))
            }
        }
    }

    /// Accepts a receipt upload (purchase or restore) and answers, after `?wait=` if asked.
    static func submit(_ request: Request, _ server: PurchaseServer, pathUser: String?, kind: VerificationJob.Kind) async throws -> Response {
        let key = try authenticate(request, server)
        let appId = key.appId
        let body = try ReceiptBody(request)
        let (user, authenticated) = try await authorize(request, server, key: key, naming: pathUser ?? body.appUserId)
        guard let receipt = body.receiptData, !receipt.isEmpty else {
            throw HTTPError.badRequest("receiptData is required (the Base64 app receipt or transaction receipt).", code: "missing_receipt")
        }
        let wait = try waitSeconds(request)
        var job = try await server.submit(appId: appId, appUserId: user, receiptData: receipt, kind: kind, userAuthenticated: authenticated,
                                          deliver: body.deliver)
        if wait > 0 { job = try await server.awaitSettlement(job.id, appId: appId, timeout: .milliseconds(Int(wait * 1000))) ?? job }
        return verificationResponse(job)
    }

    /// A `from`/`to` query value: a date (2026-01-31), an RFC 3339 time or Unix milliseconds, in 1970–9999.
    static func queryDate(_ request: Request, _ name: String, _ fallback: Date) throws -> Date {
        guard let text = request.query[name] else { return fallback }
        if let date = ReceiptDate.parseRFC3339(text) ?? ReceiptDate.parseRFC3339(text + "T00:00:00Z") ?? Int64(text).map(ReceiptDate.date(milliseconds:)),
           ReceiptDate.isAccepted(date) {
            return date
        }
        throw HTTPError.badRequest("\(name) must be a date (2026-01-31), an RFC 3339 time or Unix milliseconds, in 1970–9999.", code: "invalid_date")
    }

    static func revenue(_ request: Request, _ server: PurchaseServer, appId: String?) async throws -> RevenueReport {
        func date(_ name: String, _ fallback: Date) throws -> Date { try queryDate(request, name, fallback) }
        let now = server.clock.now()
        let from = try date("from", now.addingTimeInterval(-30 * 86400))
        let to = try date("to", now.addingTimeInterval(1))
        var group: [RevenueReport.Dimension] = []
        for name in (request.query["group"] ?? "day,product,currency,environment").split(separator: ",") {
            guard let dimension = RevenueReport.Dimension(rawValue: String(name)) else {
                throw HTTPError.badRequest("group takes day, product, currency, environment.", code: "invalid_group")
            }
            group.append(dimension)
        }
        return try await server.store.revenue(appId: appId, from: from, to: to, group: group)
    }
}
