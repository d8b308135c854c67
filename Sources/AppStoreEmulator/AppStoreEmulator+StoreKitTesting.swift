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

    /// The SKTestSession switches an app's tests change while the emulator runs; nil leaves one as it is.
    public struct TestSessionChange: Codable, Sendable {
        public var askToBuyEnabled: Bool?
        public var failTransactionsEnabled: Bool?
        public var interruptedPurchasesEnabled: Bool?
        /// `shouldEnterBillingRetryOnRenewal`.
        public var billingIssuesEnabled: Bool?
        public var billingGracePeriodEnabled: Bool?
        /// An SKTestSession.TimeRate raw value (0, 1–6, 10–15, 1000–1005).
        public var timeRate: Int?

        public init(askToBuyEnabled: Bool? = nil, failTransactionsEnabled: Bool? = nil, interruptedPurchasesEnabled: Bool? = nil,
                    billingIssuesEnabled: Bool? = nil, billingGracePeriodEnabled: Bool? = nil, timeRate: Int? = nil) {
            self.askToBuyEnabled = askToBuyEnabled
            self.failTransactionsEnabled = failTransactionsEnabled
            self.interruptedPurchasesEnabled = interruptedPurchasesEnabled
            self.billingIssuesEnabled = billingIssuesEnabled
            self.billingGracePeriodEnabled = billingGracePeriodEnabled
            self.timeRate = timeRate
        }
    }

    /// Changes the app's StoreKit Testing switches, as an `SKTestSession` does between test steps.
    @discardableResult
    public func changeTestSession(bundleId: String, _ change: TestSessionChange) async throws -> StoreKitTestSettings {
        var rate: RenewalRate?
        if let timeRate = change.timeRate {
            guard let known = RenewalRate(storeKitTimeRate: timeRate) else {
                throw StoreError.invalid("timeRate \(timeRate) is not an SKTestSession.TimeRate (0, 1–6, 10–15, 1000–1005).", code: "invalid_time_rate")
            }
            rate = known
        }
        let settings = try await mutate { state, changes, _ in
            guard var app = state.apps[bundleId] else { throw StoreError.notFound("App \(bundleId)") }
            var settings = app.testSettings ?? StoreKitTestSettings()
            if let value = change.askToBuyEnabled { settings.askToBuyEnabled = value }
            if let value = change.failTransactionsEnabled { settings.failTransactionsEnabled = value }
            if let value = change.interruptedPurchasesEnabled { settings.interruptedPurchasesEnabled = value }
            if let value = change.billingIssuesEnabled { settings.billingIssuesEnabled = value }
            if let value = change.billingGracePeriodEnabled { settings.billingGracePeriodEnabled = value }
            if let timeRate = change.timeRate {
                settings.timeRate = timeRate
                settings.renewalRate = rate
            }
            app.testSettings = settings
            state.apps[bundleId] = app
            changes.apps.insert(bundleId)
            return settings
        }
        // Xcode's billing grace period is 16 days, as when a file switches it on.
        if let grace = change.billingGracePeriodEnabled, grace != (try await read { state, _ in state.gracePeriodDays[bundleId] != nil }) {
            try await setGracePeriod(bundleId: bundleId, days: grace ? 16 : nil)
        }
        return settings
    }

    /// `SKTestSession.resolveIssueForTransaction(identifier:)`: the customer deals with what interrupted the
    /// purchase; it completes now and reaches the device as a transaction update.
    public func resolveInterruptedPurchase(transactionId: String) async throws -> TransactionRecord {
        let record = try await transaction(transactionId)
        guard record.interrupted == true, record.state == .deferred else {
            throw StoreError(.conflict, "not_interrupted", "Transaction \(transactionId) is not an interrupted purchase waiting for the customer.")
        }
        return try await answerAskToBuy(transactionId: transactionId, approve: true)
    }

    /// `SKTestSession.deleteTransaction(identifier:)` / `clearTransactions()`: forgets transactions as if never
    /// made (the device's history, receipts and entitlements lose them). A subscription's original id takes its
    /// chain; a renewal's id only that renewal (the chain falls back to the period before). With no id, the app's
    /// sandbox transactions (of one account when given): production's are never cleared. Family members' copies
    /// go with what they copy.
    @discardableResult
    public func deleteTransactions(bundleId: String, transactionId: String?, account email: String? = nil) async throws -> Int {
        try await mutate { state, changes, _ in
            guard state.apps[bundleId] != nil else { throw StoreError.notFound("App \(bundleId)") }
            var doomed: [TransactionRecord]
            if let transactionId {
                guard let record = state.transactions[transactionId], record.bundleId == bundleId else {
                    throw StoreError.notFound("Transaction \(transactionId) of \(bundleId)")
                }
                doomed = record.productType == .autoRenewable && record.id == record.originalId
                    ? state.transactions.values.filter { $0.bundleId == bundleId && $0.originalId == record.originalId }
                    : [record]
            } else {
                doomed = state.transactions.values.filter { record in
                    record.bundleId == bundleId && record.environment == .sandbox && (email.map { record.accountEmail.lowercased() == $0.lowercased() } ?? true)
                }
            }
            let named = Set(doomed.map(\.id))
            doomed += state.transactions.values.filter { copy in copy.sharedFromTransactionId.map(named.contains) == true && !named.contains(copy.id) }
            let removed = Set(doomed.map(\.id))
            for id in removed {
                state.remove(id)
                changes.transactions.insert(id)
            }
            for (original, var chain) in state.chains where removed.contains(original) || removed.contains(chain.latestTransactionId) {
                let left = state.transactions.values.filter { $0.originalId == original && !$0.isRedelivery }.max { $0.purchaseDate < $1.purchaseDate }
                if removed.contains(original) || left == nil {
                    state.chains[original] = nil
                } else if let left {
                    chain.latestTransactionId = left.id
                    state.chains[original] = chain
                }
                changes.chains.insert(original)
            }
            // A family member's chain goes with the purchaser's.
            for (original, chain) in state.chains where chain.sharedFromOriginalId.map({ state.chains[$0] == nil }) == true {
                state.chains[original] = nil
                changes.chains.insert(original)
            }
            return removed.count
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
