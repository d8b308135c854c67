import AppStoreCrypto
@testable import AppStoreEmulator
import AppStoreModels
import Foundation
import StorekeeperTesting
import Testing

/// StoreKit Testing's per-API simulated errors (`SKTestSession.setSimulatedError(_:forAPI:)`, a `.storekit`
/// file's `_storeKitErrors`), seen from the device API as an app would see them.
@Suite("Simulated StoreKit errors")
struct SimulatedErrorTests {
    static let app = "com.example.magazine"

    func setError(_ world: World, _ api: String, _ error: String? = nil, enabled: Bool = true, app: String = Self.app) async throws -> (Int, [String: Any]) {
        var body: [String: Any] = ["api": api, "enabled": enabled]
        if let error { body["error"] = error }
        return try await world.client.json(.put, "/admin/v1/apps/\(app)/simulated-errors", json: body, headers: ["Content-Type": "application/json"])
    }

    /// The error body of a failed device call.
    func error(_ object: [String: Any]) -> [String: Any] { object["error"] as? [String: Any] ?? [:] }

    /// Whether every JWS in the answer verifies under the emulator's JWS chain.
    func signaturesVerify(_ object: [String: Any], _ world: World) throws -> Bool {
        let data = try JSONSerialization.data(withJSONObject: object)
        let texts = String(decoding: data, as: UTF8.self).split(separator: "\"").filter { $0.hasPrefix("eyJ") && $0.split(separator: ".").count == 3 }
        #expect(!texts.isEmpty, "the answer carries signed data")
        let key = world.emulator.jwsAuthority.leafPublicKey
        return try texts.allSatisfy { text in
            let jws = try JWS(compact: String(text))
            return key.isValidES256(jws.signature, for: jws.signingInput)
        }
    }

    @Test("Xcode's _storeKitErrors entries are read with their chosen error, written back the same, and refused when the API cannot have it")
    func fileFormat() throws {
        let configuration = try StoreKitConfiguration(data: StoreKitSettingsTests.file(settings: """
            "_storeKitErrors" : [ { "current" : { "index" : 1, "type" : "purchase" }, "enabled" : true, "name" : "Purchase" },
                                  { "current" : { "index" : 1, "type" : "purchase" }, "enabled" : true, "name" : "Load Products" },
                                  { "current" : { "index" : 99, "type" : "generic" }, "enabled" : true, "name" : "App Store Sync" },
                                  { "current" : null, "enabled" : true, "name" : "Verification" },
                                  { "current" : { "index" : 0, "type" : "refundRequest" }, "enabled" : false, "name" : "Refund Request Sheet" } ]
            """))
        let settings = configuration.settings
        #expect(settings.simulatedError(for: .purchase) == .productUnavailable)
        #expect(settings.simulatedError(for: .loadProducts) == .unknown, "a purchase error cannot fail Load Products: the default applies")
        #expect(settings.simulatedError(for: .appStoreSync) == .unknown)
        #expect(settings.simulatedError(for: .verification) == .invalidSignature)
        #expect(settings.simulatedError(for: .refundRequest) == nil, "switched off")
        var app = CatalogApp(bundleId: "b", appAppleId: 1, name: "b", sharedSecret: "s", products: configuration.products)
        app.testSettings = settings
        let again = try StoreKitConfiguration(data: StoreKitConfiguration.export(app)).settings
        for api in StoreKitAPI.allCases { #expect(again.simulatedError(for: api) == settings.simulatedError(for: api), "\(api)") }
        for api in StoreKitAPI.allCases { #expect(StoreKitAPI(fileName: api.fileName) == api && api.allows(api.defaultError)) }
    }

    @Test("Each API's route fails with its StoreKit error and SKError code while switched on, and works again when off")
    func routes() async throws {
        let world = try await World.make()
        let device = world.device
        let bought = try await world.buy(Self.app, "com.example.magazine.monthly")
        let calls: [(api: String, error: String, code: Int, call: () async throws -> (Int, [String: Any]))] = [
            ("loadProducts", "networkError", 7, { try await world.client.json(.get, "/device/v1/products?app=\(Self.app)&device=\(device)&ids=com.example.magazine.monthly") }),
            ("appStoreSync", "systemError", 0, { try await world.client.json(.post, "/device/v2/sync", json: ["app": Self.app, "device": device]) }),
            ("appStoreSync", "userCancelled", 2, { try await world.client.json(.post, "/device/v1/restore", json: ["app": Self.app, "device": device]) }),
            ("subscriptionStatus", "notEntitled", 1, { try await world.client.json(.get, "/device/v2/subscriptions/status?app=\(Self.app)&device=\(device)") }),
            ("appTransaction", "unknown", 0, { try await world.client.json(.get, "/device/v2/app-transaction?app=\(Self.app)&device=\(device)") }),
            ("refundRequest", "duplicateRequest", 0, {
                try await world.client.json(.post, "/device/v2/refund-request", json: ["app": Self.app, "device": device, "transactionId": bought.id])
            }),
            ("manageSubscriptions", "unknown", 0, { try await world.client.json(.post, "/device/v2/manage-subscriptions", json: ["app": Self.app, "device": device]) }),
        ]
        for (api, name, code, call) in calls {
            let (setStatus, _) = try await setError(world, api, name)
            #expect(setStatus == 200)
            let (status, body) = try await call()
            #expect(status == 503 || status == 422, "\(api)")
            #expect(error(body)["storeKitError"] as? String == name && error(body)["skErrorCode"] as? Int == code, "\(api): \(body)")
            _ = try await setError(world, api, enabled: false)
            let (again, _) = try await call()
            #expect(again < 300, "\(api) works once its error is off")
        }
    }

    @Test("A purchase fails as a failed transaction with the chosen error's SKError; userCancelled is a cancellation")
    func purchases() async throws {
        let world = try await World.make()
        let payment: [String: Any] = ["app": "com.example.coins", "device": world.device, "productId": "Nada.JPYF01"]
        _ = try await setError(world, "purchase", "productUnavailable", app: "com.example.coins")
        let (_, failed) = try await world.client.json(.post, "/device/v1/payments", json: payment)
        #expect(failed["transactionState"] as? String == "failed")
        #expect((failed["error"] as? [String: Any])?["code"] as? Int == SKErrorCode.storeProductNotAvailable.rawValue)
        _ = try await setError(world, "purchase", "userCancelled", app: "com.example.coins")
        let (_, cancelled) = try await world.client.json(.post, "/device/v1/payments", json: payment)
        #expect((cancelled["error"] as? [String: Any])?["code"] as? Int == SKErrorCode.paymentCancelled.rawValue)
        // A verification error lets the purchase through; its signed data does not verify.
        _ = try await setError(world, "purchase", "invalidSignature", app: "com.example.coins")
        let (_, through) = try await world.client.json(.post, "/device/v1/payments", json: payment)
        #expect(through["transactionState"] as? String == "purchased")
        #expect(try !signaturesVerify(["signedTransaction": through["signedTransaction"] ?? ""], world), "the purchase's own JWS does not verify")
        let (_, entitlements) = try await world.client.json(.get, "/device/v2/transactions/unfinished?app=com.example.coins&device=\(world.device)")
        #expect(try signaturesVerify(entitlements, world), "only the purchase's answer is broken, not every later read")
    }

    @Test("A verification error breaks the signature of every JWS the device is handed, and only while on")
    func verification() async throws {
        let world = try await World.make()
        _ = try await world.buy(Self.app, "com.example.magazine.monthly")
        let path = "/device/v2/entitlements?app=\(Self.app)&device=\(world.device)"
        #expect(try signaturesVerify(try await world.client.json(.get, path).1, world))
        _ = try await setError(world, "Verification")
        let (status, broken) = try await world.client.json(.get, path)
        #expect(status == 200)
        #expect(try !signaturesVerify(broken, world))
        let (_, statusBody) = try await world.client.json(.get, "/device/v2/subscriptions/status?app=\(Self.app)&device=\(world.device)")
        #expect(try !signaturesVerify(statusBody, world), "the renewal info too")
        // Other apps are untouched.
        _ = try await world.buy("com.example.football", "GoldenGlobe")
        #expect(try signaturesVerify(try await world.client.json(.get, "/device/v2/entitlements?app=com.example.football&device=\(world.device)").1, world))
        let (_, cleared) = try await world.client.json(.delete, "/admin/v1/apps/\(Self.app)/simulated-errors")
        #expect((cleared["errors"] as? [[String: Any]])?.allSatisfy { $0["enabled"] as? Bool == false } == true)
        #expect(try signaturesVerify(try await world.client.json(.get, path).1, world))
    }

    @Test("Bad requests are refused with a reason: an unknown API or error, an error the API cannot have, an unknown app")
    func refusals() async throws {
        let world = try await World.make()
        for (api, error) in [("teleport", "unknown"), ("purchase", "noSuchError"), ("loadProducts", "productUnavailable"), ("refundRequest", "invalidSignature")] {
            let (status, body) = try await setError(world, api, error)
            #expect(status == 400 && self.error(body)["code"] as? String == "invalid_simulated_error", "\(api) \(error)")
        }
        #expect(try await setError(world, "purchase", app: "com.example.none").0 == 404)
        let (_, listed) = try await world.client.json(.get, "/admin/v1/apps/\(Self.app)/simulated-errors")
        #expect((listed["errors"] as? [[String: Any]])?.count == StoreKitAPI.allCases.count)
    }

    @Test("The sheets: a refund request from the app asks for consumption data; an offer code redeems; manage subscriptions turns auto-renew off")
    func sheets() async throws {
        let world = try await World.make()
        let bought = try await world.buy(Self.app, "com.example.magazine.monthly")
        let (refundStatus, refund) = try await world.client.json(.post, "/device/v2/refund-request",
                                                                  json: ["app": Self.app, "device": world.device, "transactionId": bought.id, "reason": "UNINTENDED_PURCHASE"])
        #expect(refundStatus == 200 && refund["status"] as? String == "success")
        // Another account's transaction is not this device's to act on.
        try await world.emulator.addAccount(email: "other@example.com", environment: .sandbox)
        let other = try await world.emulator.signIn(deviceId: nil, email: "other@example.com")
        let (foreign, _) = try await world.client.json(.post, "/device/v2/refund-request", json: ["app": Self.app, "device": other.id, "transactionId": bought.id])
        #expect(foreign == 404)
        let (manageStatus, manage) = try await world.client.json(.post, "/device/v2/manage-subscriptions",
                                                                  json: ["app": Self.app, "device": world.device, "originalTransactionId": bought.originalId, "autoRenew": false])
        #expect(manageStatus == 200 && manage["status"] as? String == "autoRenewOff")
        let chain = try #require(try await world.emulator.read { state, _ in state.chains[bought.originalId] })
        #expect(chain.autoRenewEnabled == false)
    }
}
