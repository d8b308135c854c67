import AppStoreCrypto
import AppStoreModels
import Foundation

/// The outcome of one mass renewal-date extension (Get Status of Renewal Date Extensions).
public struct MassExtension: Codable, Sendable, Equatable {
    public var requestIdentifier: String
    public var productId: String
    public var bundleId: String
    public var environment: AppStoreEnvironment
    public var complete: Bool
    public var completeDate: Date?
    public var succeededCount: Int
    public var failedCount: Int
}

extension AppStoreEmulator {
    /// The order id printed on the customer's email receipt: stable per transaction, 10 characters.
    public static func orderId(for transactionId: String) -> String {
        let digest = Digest.sha256.hash(Array(("order:" + transactionId).utf8))
        let alphabet = Array("ABCDEFGHJKLMNPQRSTUVWXYZ23456789")
        return "M" + String(digest.prefix(9).map { alphabet[Int($0) % alphabet.count] })
    }

    /// Look Up Order ID: the transactions of an order (production only, as at Apple).
    public func serverAPILookUpOrder(bundleId: String, environment: AppStoreEnvironment, orderId: String) async throws(ServerAPIError) -> [String] {
        guard environment == .production else { return [] }
        let records = (try? await read { state, _ in
            state.transactions.values.filter { $0.bundleId == bundleId && $0.environment == environment && $0.state == .purchased && !$0.isRedelivery }
        }) ?? []
        let now = clock.now()
        do {
            return try records.filter { Self.orderId(for: $0.id) == orderId }.map { try signedTransaction(for: $0, signedAt: now) }
        } catch {
            throw ServerAPIError.generalInternal
        }
    }

    /// Get App Transaction Info: the signed app transaction of the customer who made `transactionId`.
    public func serverAPIAppTransaction(bundleId: String, environment: AppStoreEnvironment, transactionId: String) async throws(ServerAPIError) -> String {
        let record = try await serverAPIRecord(bundleId: bundleId, environment: environment, transactionId: transactionId)
        do {
            let (account, app) = try await read { state, _ -> (Account, CatalogApp) in
                guard let account = state.accounts[record.accountEmail.lowercased()], let app = state.apps[bundleId] else {
                    throw StoreError.notFound("Account")
                }
                return (account, app)
            }
            return try await signedAppTransaction(account: account, app: app, deviceVerification: nil)
        } catch {
            throw ServerAPIError(404, 4_040_019, "App transaction does not exist.")
        }
    }

    /// Finish Transaction: marks a transaction finished, as the device's finish would.
    public func serverAPIFinish(bundleId: String, environment: AppStoreEnvironment, transactionId: String) async throws(ServerAPIError) {
        _ = try await serverAPIRecord(bundleId: bundleId, environment: environment, transactionId: transactionId)
        do {
            try await mutate { state, changes, _ in
                state.update(transactionId) { $0.finished = true }
                changes.transactions.insert(transactionId)
            }
        } catch {
            throw ServerAPIError.generalInternal
        }
    }

    /// Get Refund History: the customer's refunded transactions, oldest refund first, 20 per page.
    public func serverAPIRefunds(bundleId: String, environment: AppStoreEnvironment, transactionId: String,
                                 revision: String?) async throws(ServerAPIError) -> (signed: [String], revision: String, hasMore: Bool) {
        let anchor = try await serverAPIRecord(bundleId: bundleId, environment: environment, transactionId: transactionId)
        var start = 0
        if let revision {
            guard revision.hasPrefix("r"), let offset = Int(revision.dropFirst()), offset >= 0 else { throw .invalidRevision }
            start = offset
        }
        let refunded = ((try? await read { state, _ in state.transactions(account: anchor.accountEmail, bundle: bundleId, environment: environment) }) ?? [])
            .filter { $0.cancellationDate != nil && !$0.isRedelivery }
            .sorted { ($0.cancellationDate!, $0.id) < ($1.cancellationDate!, $1.id) }
        let page = Array(refunded.dropFirst(start).prefix(20))
        let now = clock.now()
        do {
            let signed = try page.map { try signedTransaction(for: $0, signedAt: now) }
            return (signed, "r\(start + page.count)", start + page.count < refunded.count)
        } catch {
            throw ServerAPIError.generalInternal
        }
    }

    /// Send Consumption Information: validated as Apple does, kept on the transaction.
    public func serverAPIConsumption(bundleId: String, environment: AppStoreEnvironment, transactionId: String, body: JSONValue,
                                     version: Int) async throws(ServerAPIError) {
        _ = try await serverAPIRecord(bundleId: bundleId, environment: environment, transactionId: transactionId)
        guard body.isObject, body["customerConsented"]?.bool == true else { throw ServerAPIError(400, 4_000_035, "Invalid customer consented.") }
        var info: [String: String] = ["version": String(version)]
        if version == 2 {
            let statuses = ["DELIVERED", "UNDELIVERED_QUALITY_ISSUE", "UNDELIVERED_WRONG_ITEM", "UNDELIVERED_SERVER_OUTAGE", "UNDELIVERED_OTHER"]
            guard let delivery = body["deliveryStatus"]?.text, statuses.contains(delivery) else { throw ServerAPIError(400, 4_000_036, "Invalid delivery status.") }
            if let preference = body["refundPreference"]?.text, !["DECLINE", "GRANT_FULL", "GRANT_PRORATED"].contains(preference) {
                throw ServerAPIError(400, 4_000_000, "Invalid refund preference.")
            }
            if let percentage = body["consumptionPercentage"]?.int64, !(0...100_000).contains(percentage) {
                throw ServerAPIError(400, 4_000_000, "Invalid consumption percentage.")
            }
        } else {
            guard let delivery = body["deliveryStatus"]?.int64, (0...5).contains(delivery) else { throw ServerAPIError(400, 4_000_036, "Invalid delivery status.") }
        }
        if case .object(let fields) = body { for (key, value) in fields { info[key] = value.text ?? value.bool.map { String($0) } ?? "" } }
        let recorded = info
        do {
            try await mutate { state, changes, _ in
                state.update(transactionId) { $0.consumptionInfo = recorded }
                changes.transactions.insert(transactionId)
            }
        } catch {
            throw ServerAPIError.generalInternal
        }
    }

    /// Set App Account Token: binds every transaction of an original transaction to `token`.
    public func serverAPISetAppAccountToken(bundleId: String, environment: AppStoreEnvironment, originalTransactionId: String,
                                            body: JSONValue) async throws(ServerAPIError) {
        let record = try await serverAPIRecord(bundleId: bundleId, environment: environment, transactionId: originalTransactionId)
        guard record.originalId == record.id else { throw ServerAPIError(400, 4_000_187, "Transaction id is not an original transaction id.") }
        guard let text = body["appAccountToken"]?.text, let token = UUIDText.parse(text) else {
            throw ServerAPIError(400, 4_000_183, "Invalid app account token UUID.")
        }
        do {
            try await mutate { state, changes, _ in
                for (id, candidate) in state.transactions where candidate.originalId == originalTransactionId {
                    state.update(id) { $0.appAccountToken = token.uuidString.lowercased() }
                    changes.transactions.insert(id)
                    _ = candidate
                }
            }
        } catch {
            throw ServerAPIError.generalInternal
        }
    }

    /// Extend a Subscription Renewal Date: 1–90 days (scaled like every sandbox period), at most twice
    /// in 365 days, active paid periods only; sends RENEWAL_EXTENDED.
    public func serverAPIExtend(bundleId: String, environment: AppStoreEnvironment, originalTransactionId: String,
                                body: JSONValue) async throws(ServerAPIError) -> (webOrderLineItemId: String?, effectiveDate: Date) {
        let record = try await serverAPIRecord(bundleId: bundleId, environment: environment, transactionId: originalTransactionId)
        guard record.originalId == record.id else { throw ServerAPIError(400, 4_000_008, "Invalid original transaction id.") }
        guard let days = body["extendByDays"]?.int64, (1...90).contains(days) else { throw ServerAPIError(400, 4_000_009, "Invalid extend by days value.") }
        guard let reason = body["extendReasonCode"]?.int64, (0...3).contains(reason) else { throw ServerAPIError(400, 4_000_010, "Invalid extend reason code.") }
        guard let request = body["requestIdentifier"]?.text, !request.isEmpty, request.count <= 128 else {
            throw ServerAPIError(400, 4_000_011, "Invalid request identifier.")
        }
        let outcome: Result<(String?, Date), ServerAPIError>
        do {
            outcome = try await mutate { state, changes, now in
                Self.extend(&state, &changes, originalTransactionId: originalTransactionId, days: Int(days), now: now)
            }
        } catch {
            throw ServerAPIError.generalInternal
        }
        return try outcome.get()
    }

    /// Extends one subscription chain in place (shared by single and mass extensions).
    static func extend(_ state: inout EmulatorState, _ changes: inout Changes, originalTransactionId: String, days: Int,
                       now: Date) -> Result<(String?, Date), ServerAPIError> {
        guard var chain = state.chains[originalTransactionId], var latest = state.transactions[chain.latestTransactionId],
              let expires = latest.expiresDate, expires > now, latest.cancellationDate == nil, !latest.isTrialPeriod else {
            return .failure(ServerAPIError(403, 4_030_004, "Subscription extension ineligible."))
        }
        let recent = (chain.extensions ?? []).filter { now.timeIntervalSince($0) < 365 * 86_400 }
        guard recent.count < 2 else { return .failure(ServerAPIError(403, 4_030_005, "Subscription max extension.")) }
        let rate = state.accounts[chain.accountEmail.lowercased()]?.renewalRate ?? .realTime
        let seconds = rate.acceleratedSeconds(for: .oneMonth).map { Double($0) * Double(days) / 30 } ?? Double(days) * 86_400
        latest.expiresDate = expires.addingTimeInterval(seconds)
        state.update(latest)
        changes.transactions.insert(latest.id)
        chain.extensions = recent + [now]
        state.chains[originalTransactionId] = chain
        changes.chains.insert(originalTransactionId)
        changes.notify(.renewalExtended, nil, latest)
        return .success((latest.webOrderLineItemId.map(String.init), latest.expiresDate!))
    }

    /// Extend Renewal Dates for All Active Subscribers of a product (optionally in some storefronts).
    public func serverAPIMassExtend(bundleId: String, environment: AppStoreEnvironment, body: JSONValue) async throws(ServerAPIError) -> String {
        guard let days = body["extendByDays"]?.int64, (1...90).contains(days) else { throw ServerAPIError(400, 4_000_009, "Invalid extend by days value.") }
        guard let reason = body["extendReasonCode"]?.int64, (0...3).contains(reason) else { throw ServerAPIError(400, 4_000_010, "Invalid extend reason code.") }
        guard let request = body["requestIdentifier"]?.text, !request.isEmpty else { throw ServerAPIError(400, 4_000_011, "Invalid request identifier.") }
        guard let product = body["productId"]?.text, !product.isEmpty else { throw ServerAPIError(400, 4_000_023, "Invalid product id.") }
        let storefronts = body["storefrontCountryCodes"]?.array?.compactMap(\.text)
        if let storefronts, storefronts.isEmpty { throw ServerAPIError(400, 4_000_027, "Invalid empty storefront country code list.") }
        do {
            try await mutate { state, changes, now in
                var succeeded = 0, failed = 0
                let chains = state.chains.values.filter { $0.bundleId == bundleId && $0.environment == environment && $0.productId == product }
                for chain in chains.sorted(by: { $0.originalTransactionId < $1.originalTransactionId }) {
                    if let storefronts, let storefront = state.accounts[chain.accountEmail.lowercased()]?.storefront, !storefronts.contains(storefront) { continue }
                    switch Self.extend(&state, &changes, originalTransactionId: chain.originalTransactionId, days: Int(days), now: now) {
                    case .success: succeeded += 1
                    case .failure:
                        failed += 1
                        // Each subscription the mass extension could not extend is reported on its own (RENEWAL_EXTENSION / FAILURE).
                        if let latest = state.transactions[chain.latestTransactionId] { changes.notify(.renewalExtension, .failure, latest) }
                    }
                }
                state.massExtensions[product + "|" + request] = MassExtension(
                    requestIdentifier: request, productId: product, bundleId: bundleId, environment: environment, complete: true,
                    completeDate: now, succeededCount: succeeded, failedCount: failed)
                changes.settings = true
                var summary = NotificationEvent(type: .renewalExtension, subtype: .summary, transactionId: nil, bundleId: bundleId, environment: environment)
                summary.summary = NotificationSummary(productId: product, requestIdentifier: request, storefrontCountryCodes: storefronts ?? [],
                                                      succeededCount: succeeded, failedCount: failed)
                changes.notifications.append(summary)
            }
        } catch {
            throw ServerAPIError.generalInternal
        }
        return request
    }

    /// Get Status of Renewal Date Extensions.
    public func serverAPIMassExtension(bundleId: String, environment: AppStoreEnvironment, productId: String,
                                       requestIdentifier: String) async throws(ServerAPIError) -> MassExtension {
        let found = try? await read { state, _ in state.massExtensions[productId + "|" + requestIdentifier] }
        guard let status = found ?? nil, status.bundleId == bundleId, status.environment == environment else {
            throw ServerAPIError(404, 4_040_009, "Status request not found.")
        }
        return status
    }
}
