import AppStoreModels
import Foundation
import HTTP

extension AppStoreResponder {
    struct SignInBody: Codable {
        var deviceId: String?
        var account: String
        var canMakePayments: Bool?
        /// The installed build's environment: `sandbox` (development, TestFlight) or `production`.
        var environment: String?
    }

    struct AppDeviceBody: Codable {
        var app: String
        var device: String
    }

    struct PaymentBody: Codable {
        var app: String
        var device: String
        var productId: String
        var quantity: Int?
        var applicationUsername: String?
        var simulate: String?
        /// StoreKit 2's `Product.PurchaseOption.appAccountToken(UUID)`.
        var appAccountToken: String?
        /// A promotional offer signed by the developer's server.
        var promotionalOffer: PaymentRequest.SignedOffer?
        /// One of the product's win-back offers (StoreKit 2's `.winBackOffer`).
        var winBackOfferId: String?
        /// The 2025 JWS forms: a signed promotional offer, and signed introductory-offer eligibility.
        var promotionalOfferJWS: String?
        var introductoryOfferEligibilityJWS: String?
        /// StoreKit's billing plan choice (2026): `MONTHLY` pays a yearly subscription monthly over a 12-month commitment.
        var billingPlanType: String?
    }

    static func deviceTransaction(_ emulator: AppStoreEmulator, _ record: TransactionRecord) async throws -> DeviceTransaction {
        let hasReceipt = record.state == .purchased || record.state == .restored
        var transaction = DeviceTransaction(record, receipt: hasReceipt ? try await emulator.transactionReceipt(transactionId: record.id) : nil)
        if hasReceipt { transaction.signedTransaction = try emulator.signedTransaction(for: record, signedAt: emulator.clock.now()) }
        return transaction
    }

    static func environmentOf(_ emulator: AppStoreEmulator, device: String) async -> AppStoreEnvironment? {
        emulator.environment(ofDevice: device)
    }

    /// The `device` field of a JSON body, read leniently so faults apply even to bad bodies.
    static func bodyDevice(_ request: Request) -> String {
        ((try? JSONSerialization.jsonObject(with: request.body)) as? [String: Any])?["device"] as? String ?? ""
    }

    static func addDeviceRoutes(_ router: inout Router, _ emulator: AppStoreEmulator) {
        router.on(.post, "/device/v1/devices") { request in
            await handle {
                let body = try request.decode(SignInBody.self)
                var build: AppStoreEnvironment?
                if let text = body.environment {
                    guard let parsed = AppStoreEnvironment(loose: text) else { throw StoreError.invalid("Environment is sandbox or production.", code: "invalid_environment") }
                    build = parsed
                }
                let device = try await emulator.signIn(deviceId: body.deviceId, email: body.account, canMakePayments: body.canMakePayments ?? true,
                                                       buildEnvironment: build)
                return .json(device, status: .created)
            }
        }
        router.on(.get, "/device/v1/devices/:id") { request in
            await handle { .json(try await emulator.device(request.parameters["id"] ?? "")) }
        }
        router.on(.get, "/device/v1/products") { request in
            await handle {
                let device = try request.required("device")
                if let faulted = await applyFault(emulator, endpoint: "products", environment: await environmentOf(emulator, device: device)) { return faulted }
                let ids = try request.required("ids").split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
                return .json(try await emulator.products(bundleId: try request.required("app"), deviceId: device, ids: ids))
            }
        }
        router.on(.post, "/device/v1/payments") { request in
            await handle {
                if let faulted = await applyFault(emulator, endpoint: "payments", environment: await environmentOf(emulator, device: bodyDevice(request))) { return faulted }
                let body = try request.decode(PaymentBody.self)
                var payment = PaymentRequest(productId: body.productId, quantity: body.quantity, applicationUsername: body.applicationUsername,
                                             simulate: body.simulate)
                payment.promotionalOffer = body.promotionalOffer
                payment.winBackOfferId = body.winBackOfferId
                payment.promotionalOfferJWS = body.promotionalOfferJWS
                payment.introductoryOfferEligibilityJWS = body.introductoryOfferEligibilityJWS
                payment.billingPlanType = body.billingPlanType
                if let token = body.appAccountToken {
                    guard let uuid = UUIDText.parse(token) else {
                        throw StoreError.storeKit(.paymentInvalid, "appAccountToken must be a UUID.", status: .badRequest)
                    }
                    payment.appAccountToken = uuid.uuidString.lowercased()
                }
                let record = try await emulator.addPayment(bundleId: body.app, deviceId: body.device, request: payment)
                return .json(try await deviceTransaction(emulator, record), status: .created)
            }
        }
        router.on(.get, "/device/v1/transactions") { request in
            await handle {
                let device = try request.required("device")
                if let faulted = await applyFault(emulator, endpoint: "transactions", environment: await environmentOf(emulator, device: device)) { return faulted }
                let records = try await emulator.pendingTransactions(bundleId: try request.required("app"), deviceId: device)
                var result: [DeviceTransaction] = []
                for record in records { result.append(try await deviceTransaction(emulator, record)) }
                return .json(["transactions": result])
            }
        }
        router.on(.post, "/device/v1/transactions/:id/finish") { request in
            await handle {
                let device = try request.required("device")
                if let faulted = await applyFault(emulator, endpoint: "finish", environment: await environmentOf(emulator, device: device)) { return faulted }
                let record = try await emulator.finish(transactionId: request.parameters["id"] ?? "", deviceId: device)
                return .json(DeviceTransaction(record, receipt: nil))
            }
        }
        router.on(.get, "/device/v1/transactions/:id/receipt") { request in
            await handle {
                let receipt = try await emulator.transactionReceipt(transactionId: request.parameters["id"] ?? "")
                return .json(["transactionReceipt": receipt.base64EncodedString()])
            }
        }
        router.on(.post, "/device/v1/restore") { request in
            await handle {
                if let faulted = await applyFault(emulator, endpoint: "restore", environment: await environmentOf(emulator, device: bodyDevice(request))) { return faulted }
                let body = try request.decode(AppDeviceBody.self)
                var result: [DeviceTransaction] = []
                for record in try await emulator.restore(bundleId: body.app, deviceId: body.device) {
                    result.append(try await deviceTransaction(emulator, record))
                }
                return .json(["transactions": result])
            }
        }
        router.on(.get, "/device/v1/receipt") { request in
            await handle {
                let device = try request.required("device")
                if let faulted = await applyFault(emulator, endpoint: "receipt", environment: await environmentOf(emulator, device: device)) { return faulted }
                let receipt = try await emulator.appReceipt(bundleId: try request.required("app"), deviceId: device)
                return .json(["receipt": receipt?.base64EncodedString()])
            }
        }
        router.on(.post, "/device/v1/receipt/refresh") { request in
            await handle {
                if let faulted = await applyFault(emulator, endpoint: "receipt", environment: await environmentOf(emulator, device: bodyDevice(request))) { return faulted }
                let body = try request.decode(AppDeviceBody.self)
                let receipt = try await emulator.appReceipt(bundleId: body.app, deviceId: body.device, refresh: true)
                return .json(["receipt": receipt?.base64EncodedString()])
            }
        }
    }
}
