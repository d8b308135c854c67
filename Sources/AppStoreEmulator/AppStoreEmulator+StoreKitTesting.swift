import AppStoreModels
import Foundation

/// StoreKit Testing's switches for one app (`SKTestSession`'s, a `.storekit` file's `settings`), set at run time.
extension AppStoreEmulator {
    /// The app's StoreKit Testing settings (none when it was registered without a `.storekit` file and never changed).
    public func testSettings(bundleId: String) async throws -> StoreKitTestSettings? {
        try await read { state, _ in
            guard let app = state.apps[bundleId] else { throw StoreError.notFound("App \(bundleId)") }
            return app.testSettings
        }
    }

    /// `SKTestSession.setSimulatedError(_:forAPI:)`: makes `api` fail with `error` (nil: the API's default), or not.
    @discardableResult
    public func setSimulatedError(bundleId: String, api: StoreKitAPI, error: StoreKitTestError?, enabled: Bool) async throws -> StoreKitTestSettings {
        if let error, !api.allows(error) {
            let allowed = api.families.flatMap(\.errors).map(\.rawValue).joined(separator: ", ")
            throw StoreError.invalid("\(api.fileName) cannot fail with \(error.rawValue); it can with \(allowed).", code: "invalid_simulated_error")
        }
        return try await mutate { state, changes, _ in
            guard var app = state.apps[bundleId] else { throw StoreError.notFound("App \(bundleId)") }
            var settings = app.testSettings ?? StoreKitTestSettings()
            settings.setSimulatedError(error, enabled: enabled, for: api)
            app.testSettings = settings
            state.apps[bundleId] = app
            changes.apps.insert(bundleId)
            return settings
        }
    }

    /// Switches every simulated error of the app off.
    @discardableResult
    public func clearSimulatedErrors(bundleId: String) async throws -> StoreKitTestSettings? {
        try await mutate { state, changes, _ in
            guard var app = state.apps[bundleId] else { throw StoreError.notFound("App \(bundleId)") }
            app.testSettings?.storeKitErrors.removeAll()
            state.apps[bundleId] = app
            changes.apps.insert(bundleId)
            return app.testSettings
        }
    }

    /// A transaction of the device's account in this app (what a sheet the app shows may act on).
    func ownedTransaction(_ id: String, bundleId: String, deviceId: String) async throws -> TransactionRecord {
        let (account, _, _) = try await storeKitContext(bundleId: bundleId, deviceId: deviceId)
        let record = try await transaction(id)
        guard record.bundleId == bundleId, record.accountEmail.lowercased() == account.email.lowercased() else {
            throw StoreError.notFound("Transaction \(id) of this account")
        }
        return record
    }
}
