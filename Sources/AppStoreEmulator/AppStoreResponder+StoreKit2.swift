import AppStoreModels
import Foundation
import HTTP

/// The device API's StoreKit 2 calls: what `Transaction`, `AppTransaction`, `Product.SubscriptionInfo`
/// and `AppStore.sync()` ask the App Store for. Every transaction comes back signed (JWS).
extension AppStoreResponder {
    static func addStoreKit2Routes(_ router: inout Router, _ emulator: AppStoreEmulator) {
        router.on(.get, "/device/v2/entitlements") { request in
            await handle {
                let records = try await emulator.currentEntitlements(bundleId: try request.required("app"), deviceId: try request.required("device"))
                return .json(["signedTransactions": try sign(records, emulator)])
            }
        }
        router.on(.get, "/device/v2/transactions/unfinished") { request in
            await handle {
                let records = try await emulator.pendingTransactions(bundleId: try request.required("app"), deviceId: try request.required("device"))
                    .filter { $0.state == .purchased || $0.state == .restored }
                return .json(["signedTransactions": try sign(records, emulator)])
            }
        }
        router.on(.get, "/device/v2/transactions/updates") { request in
            await handle {
                var since = Date.distantPast
                if let text = request.query["since"] {
                    guard let milliseconds = Int64(text) else { throw StoreError.invalid("since is Unix milliseconds.") }
                    since = ReceiptDate.date(milliseconds: milliseconds)
                }
                let (records, now) = try await emulator.transactionUpdates(bundleId: try request.required("app"), deviceId: try request.required("device"),
                                                                           since: since)
                // `next` is the `since` of the following poll. The App Store keeps whole seconds, so a change in the
                // second of the poll shows again next time: devices de-duplicate by transaction id (and revocation).
                let body: [String: Any] = ["signedTransactions": try sign(records, emulator), "next": String(ReceiptDate.milliseconds(now))]
                return .rawJSON(try JSONSerialization.data(withJSONObject: body, options: [.sortedKeys]))
            }
        }
        router.on(.get, "/device/v2/app-transaction") { request in
            await handle {
                let nonce = request.query["nonce"].flatMap(UUIDText.parse) ?? emulator.ids.next()
                let signed = try await emulator.signedAppTransaction(bundleId: try request.required("app"), deviceId: try request.required("device"),
                                                                     nonce: nonce)
                return .json(["signedAppTransaction": signed])
            }
        }
        router.on(.get, "/device/v2/subscriptions/status") { request in
            await handle {
                let app = try request.required("app")
                let (account, _, _) = try await emulator.storeKitContext(bundleId: app, deviceId: try request.required("device"))
                let result = try await emulator.subscriptionStatuses(accountEmail: account.email, bundleId: app, environment: account.environment, statuses: [])
                let group = request.query["group"]
                let statuses = result.groups.filter { group == nil || $0.group == group }.flatMap { entry in
                    entry.last.map { ["subscriptionGroupIdentifier": entry.group, "state": $0.status, "originalTransactionId": $0.originalTransactionId,
                                      "signedTransaction": $0.signedTransaction, "signedRenewalInfo": $0.signedRenewal] as [String: Any] }
                }
                return .rawJSON(try JSONSerialization.data(withJSONObject: ["statuses": statuses], options: [.sortedKeys]))
            }
        }
        router.on(.post, "/device/v2/sync") { request in
            await handle {
                let body = try request.decode(AppDeviceBody.self)
                // AppStore.sync(): the customer signs in again; the receipt is refreshed and entitlements re-read.
                let receipt = try await emulator.appReceipt(bundleId: body.app, deviceId: body.device, refresh: true)
                let records = try await emulator.currentEntitlements(bundleId: body.app, deviceId: body.device)
                return .rawJSON(try JSONSerialization.data(withJSONObject: ["receipt": receipt?.base64EncodedString() as Any,
                                                                            "signedTransactions": try sign(records, emulator)], options: [.sortedKeys]))
            }
        }
    }

    static func sign(_ records: [TransactionRecord], _ emulator: AppStoreEmulator) throws -> [String] {
        let now = emulator.clock.now()
        return try records.map { try emulator.signedTransaction(for: $0, signedAt: now) }
    }
}
