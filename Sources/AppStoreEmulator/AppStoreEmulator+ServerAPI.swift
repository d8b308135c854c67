import Clocks
import AppStoreCrypto
import AppStoreModels
import Foundation

/// An App Store Server API key (App Store Connect's "In-App Purchase" key): the developer keeps the
/// private half and signs bearer tokens with it; the emulator keeps the public half.
public struct ServerAPIKey: Codable, Sendable, Equatable {
    public var keyId: String
    public var issuerId: String
    public var bundleId: String
    /// SubjectPublicKeyInfo PEM.
    public var publicKey: String
    public var createdAt: Date
}

/// An App Store Server API failure, answered as Apple does: `{"errorCode", "errorMessage"}` with the
/// HTTP status of the code's prefix (401 carries no body).
public struct ServerAPIError: Error, Sendable, Equatable {
    public let status: Int
    public let code: Int64
    public let message: String

    init(_ status: Int, _ code: Int64, _ message: String) {
        self.status = status
        self.code = code
        self.message = message
    }

    static let unauthorized = ServerAPIError(401, 0, "Unauthenticated")
    static let generalBadRequest = ServerAPIError(400, 4_000_000, "Bad request.")
    static let invalidRevision = ServerAPIError(400, 4_000_005, "Invalid request revision.")
    static let invalidTransactionId = ServerAPIError(400, 4_000_006, "Invalid transaction id.")
    static let invalidStartDate = ServerAPIError(400, 4_000_015, "Invalid start date.")
    static let invalidEndDate = ServerAPIError(400, 4_000_016, "Invalid end date.")
    static let startDateAfterEndDate = ServerAPIError(400, 4_000_013, "Start date after end date.")
    static let invalidSort = ServerAPIError(400, 4_000_021, "Invalid sort.")
    static let invalidProductType = ServerAPIError(400, 4_000_022, "Invalid product type.")
    static let invalidInAppOwnershipType = ServerAPIError(400, 4_000_026, "Invalid in-app ownership type.")
    static let invalidRevoked = ServerAPIError(400, 4_000_030, "Invalid request revoked.")
    static let invalidStatus = ServerAPIError(400, 4_000_031, "Invalid request status.")
    static let transactionIdNotFound = ServerAPIError(404, 4_040_010, "Transaction id not found.")
    static let rateLimitExceeded = ServerAPIError(429, 4_290_000, "Rate limit exceeded.")
    /// What Apple answers when the failure is not the caller's.
    static let generalInternal = ServerAPIError(500, 5_000_000, "An unknown error occurred.")
}

/// Filters and paging of Get Transaction History.
public struct HistoryQuery: Sendable {
    public var revision: String?
    public var startDate: Int64?
    public var endDate: Int64?
    public var productIds: [String] = []
    public var productTypes: [String] = []
    public var descending = false
    public var subscriptionGroups: [String] = []
    public var ownershipType: String?
    public var revoked: Bool?
    /// v1 leaves finished consumables out; v2 keeps them.
    public var includeFinishedConsumables = true

    public init() {}
}

extension AppStoreEmulator {
    /// Creates a Server API key for `bundleId`; the private key (PKCS#8 PEM) is returned once, never stored.
    public func createServerAPIKey(bundleId: String) async throws -> (key: ServerAPIKey, privateKeyPEM: String) {
        let privateKey = try PrivateKey.generateEC(curve: "P-256")
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
        let keyId = String((0..<10).map { _ in alphabet.randomElement()! })
        let publicKey = privateKey.publicKey.pem
        let key = try await mutate { state, changes, now -> ServerAPIKey in
            guard state.apps[bundleId] != nil else { throw StoreError.notFound("App \(bundleId)") }
            // One issuer per app, as one App Store Connect team would have.
            let issuer = state.apiKeys.values.first { $0.bundleId == bundleId }?.issuerId ?? ids.nextString()
            let key = ServerAPIKey(keyId: keyId, issuerId: issuer, bundleId: bundleId, publicKey: publicKey, createdAt: now)
            state.apiKeys[keyId] = key
            changes.apiKeys.insert(keyId)
            return key
        }
        return (key, privateKey.pem)
    }

    /// Checks a bearer token the way Apple does: ES256 with the `kid` of a key we issued, `iss` its
    /// issuer, `aud` `appstoreconnect-v1`, `bid` an app, `exp` in the future and at most 60 minutes
    /// ahead of `iat` (or of now when `iat` is absent). Returns the bundle id the token is for.
    /// Token times are wall-clock times, whatever the emulator's accelerated clock says.
    public func authorizeServerAPI(authorization: String?, wallClock: Date = Date()) async -> Result<String, ServerAPIError> {
        guard let authorization, authorization.hasPrefix("Bearer "), let jwt = try? JWS(compact: String(authorization.dropFirst(7))),
              jwt.header["alg"]?.text == "ES256", let keyId = jwt.header["kid"]?.text, let claims = try? jwt.payloadJSON() else {
            return .failure(.unauthorized)
        }
        guard let key = try? await read({ state, _ in state.apiKeys[keyId] }), let publicKey = try? PublicKey(pem: key.publicKey),
              publicKey.isValidES256(jwt.signature, for: jwt.signingInput) else {
            return .failure(.unauthorized)
        }
        let now = Int64(wallClock.timeIntervalSince1970)
        let issuedAt = claims["iat"]?.int64
        guard claims["iss"]?.text == key.issuerId, claims["aud"]?.text == "appstoreconnect-v1", claims["bid"]?.text == key.bundleId,
              let expires = claims["exp"]?.int64, expires > now, (issuedAt ?? now) <= now + 60, (issuedAt ?? now) >= now - 86_400,
              expires <= (issuedAt ?? now) + 3600 else {
            return .failure(.unauthorized)
        }
        return .success(key.bundleId)
    }

    /// Get Transaction Info: the signed transaction of any of the app's transactions in `environment`.
    public func serverAPITransaction(bundleId: String, environment: AppStoreEnvironment, transactionId: String) async throws(ServerAPIError) -> String {
        let record = try await serverAPIRecord(bundleId: bundleId, environment: environment, transactionId: transactionId)
        do { return try signedTransaction(for: record, signedAt: clock.now()) } catch { throw ServerAPIError.generalInternal }
    }

    /// Get Transaction History: the customer's transactions in this app, filtered, sorted, 20 per page.
    /// `revision` is the opaque position to continue from.
    public func serverAPIHistory(bundleId: String, environment: AppStoreEnvironment, transactionId: String,
                                 query: HistoryQuery) async throws(ServerAPIError) -> (signed: [String], revision: String, hasMore: Bool, appAppleId: Int64?) {
        let anchor = try await serverAPIRecord(bundleId: bundleId, environment: environment, transactionId: transactionId)
        var start = 0
        if let revision = query.revision {
            guard revision.hasPrefix("r"), let offset = Int(revision.dropFirst()), offset >= 0 else { throw .invalidRevision }
            start = offset
        }
        if let from = query.startDate, let to = query.endDate, from > to { throw .startDateAfterEndDate }
        let typeNames = ["AUTO_RENEWABLE": "Auto-Renewable Subscription", "NON_RENEWABLE": "Non-Renewing Subscription",
                         "CONSUMABLE": "Consumable", "NON_CONSUMABLE": "Non-Consumable"]
        var wantedTypes: Set<String> = []
        for type in query.productTypes {
            guard let name = typeNames[type] else { throw .invalidProductType }
            wantedTypes.insert(name)
        }
        if let ownership = query.ownershipType, !["PURCHASED", "FAMILY_SHARED"].contains(ownership) { throw .invalidInAppOwnershipType }
        let (records, appAppleId) = (try? await read { state, _ in
            (state.transactions(account: anchor.accountEmail, bundle: bundleId, environment: environment), state.apps[bundleId]?.appAppleId)
        }) ?? ([], nil)
        var matching = records.filter { record in
            guard record.state == .purchased, !record.isRedelivery else { return false }
            if !query.includeFinishedConsumables, record.productType == .consumable, record.finished { return false }
            let purchased = ReceiptDate.milliseconds(record.purchaseDate)
            if let from = query.startDate, purchased < from { return false }
            if let to = query.endDate, purchased >= to { return false }
            if !query.productIds.isEmpty, !query.productIds.contains(record.productId) { return false }
            if !wantedTypes.isEmpty, !wantedTypes.contains(record.productType.jwsTypeName) { return false }
            if !query.subscriptionGroups.isEmpty, !query.subscriptionGroups.contains(record.subscriptionGroupId ?? "") { return false }
            if let ownership = query.ownershipType, ownership != (record.sharedFromTransactionId == nil ? "PURCHASED" : "FAMILY_SHARED") { return false }
            if let revoked = query.revoked, revoked != (record.cancellationDate != nil) { return false }
            return true
        }
        matching.sort { ($0.purchaseDate, $0.id) < ($1.purchaseDate, $1.id) }
        if query.descending { matching.reverse() }
        let page = Array(matching.dropFirst(start).prefix(20))
        let now = clock.now()
        let signed: [String]
        do { signed = try page.map { try signedTransaction(for: $0, signedAt: now) } } catch {
            throw ServerAPIError.generalInternal
        }
        let next = start + page.count
        return (signed, "r\(next)", next < matching.count, appAppleId)
    }

    /// Get All Subscription Statuses: each subscription group of the customer with its latest
    /// transaction, renewal info and status (1 active, 2 expired, 5 revoked).
    public func serverAPISubscriptionStatuses(bundleId: String, environment: AppStoreEnvironment, transactionId: String,
                                              statuses: [Int]) async throws(ServerAPIError) -> (groups: [(group: String, last: [(status: Int, originalTransactionId: String, signedTransaction: String, signedRenewal: String)])], appAppleId: Int64?) {
        let anchor = try await serverAPIRecord(bundleId: bundleId, environment: environment, transactionId: transactionId)
        guard statuses.allSatisfy({ (1...5).contains($0) }) else { throw .invalidStatus }
        do {
            return try await subscriptionStatuses(accountEmail: anchor.accountEmail, bundleId: bundleId, environment: environment, statuses: statuses)
        } catch {
            throw ServerAPIError.generalInternal
        }
    }

    /// Each subscription group of a customer with the latest transaction of each subscription, its signed
    /// renewal info and status (1 active, 2 expired, 5 revoked), optionally only some statuses.
    func subscriptionStatuses(accountEmail: String, bundleId: String, environment: AppStoreEnvironment,
                              statuses: [Int]) async throws -> (groups: [(group: String, last: [(status: Int, originalTransactionId: String, signedTransaction: String, signedRenewal: String)])], appAppleId: Int64?) {
        let (chains, records, appAppleId) = try await read { state, _ in
            (state.chains.values.filter { $0.accountEmail.lowercased() == accountEmail.lowercased() && $0.bundleId == bundleId && $0.environment == environment },
             state.transactions, state.apps[bundleId]?.appAppleId)
        }
        let now = clock.now()
        var groups: [String: [(status: Int, originalTransactionId: String, signedTransaction: String, signedRenewal: String)]] = [:]
        for chain in chains.sorted(by: { $0.originalTransactionId < $1.originalTransactionId }) {
            guard let latest = records[chain.latestTransactionId] else { continue }
            let status = AppStoreEmulator.subscriptionStatus(chain, latest: latest, now: now)
            if !statuses.isEmpty, !statuses.contains(status) { continue }
            groups[chain.subscriptionGroupId, default: []].append((status, chain.originalTransactionId,
                                                                    try signedTransaction(for: latest, signedAt: now),
                                                                    try signedRenewalInfo(chain, latest: latest, signedAt: now)))
        }
        return (groups.keys.sorted().map { ($0, groups[$0]!) }, appAppleId)
    }

    /// Apple's subscription status: 1 active, 2 expired, 3 billing retry, 4 billing grace period, 5 revoked.
    static func subscriptionStatus(_ chain: SubscriptionChain, latest: TransactionRecord, now: Date) -> Int {
        if latest.cancellationDate != nil { return 5 }
        if (latest.expiresDate ?? .distantPast) > now { return 1 }
        if chain.billingRetryStart != nil { return (chain.gracePeriodEnd.map { now < $0 } ?? false) ? 4 : 3 }
        return 2
    }

    /// `JWSRenewalInfoDecodedPayload` of a subscription chain (reference §3.5).
    func signedRenewalInfo(_ chain: SubscriptionChain, latest: TransactionRecord, signedAt: Date) throws -> String {
        var json = JSONBuffer(capacity: 512)
        json.object { json in
            if let intent = chain.expirationIntent, !chain.autoRenewEnabled || chain.billingRetryStart != nil {
                json.field("expirationIntent", Int64(intent))
            }
            json.field("originalTransactionId", chain.originalTransactionId)
            json.field("autoRenewProductId", chain.autoRenewProductId)
            json.field("productId", chain.productId)
            json.field("autoRenewStatus", Int64(chain.autoRenewEnabled ? 1 : 0))
            json.field("isInBillingRetryPeriod", chain.billingRetryStart != nil)
            if let grace = chain.gracePeriodEnd { json.field("gracePeriodExpiresDate", ReceiptDate.milliseconds(grace)) }
            json.field("signedDate", ReceiptDate.milliseconds(signedAt))
            json.field("environment", isXcodeTester(chain.accountEmail) ? "Xcode" : chain.environment == .production ? "Production" : "Sandbox")
            if chain.priceIncreaseAmount != nil { json.field("priceIncreaseStatus", Int64(chain.priceIncreaseConsented == true ? 1 : 0)) }
            json.field("recentSubscriptionStartDate", ReceiptDate.milliseconds(latest.originalPurchaseDate))
            if let expires = latest.expiresDate { json.field("renewalDate", ReceiptDate.milliseconds(expires)) }
            if let price = latest.price {
                json.field("currency", price.currency)
                if let milliunits = Milliunits.from(chain.priceIncreaseAmount ?? price.amount) { json.field("renewalPrice", milliunits) }
            }
            json.field("appAccountToken", latest.appAccountToken ?? latest.applicationUsername.flatMap(UUIDText.parse)?.uuidString.lowercased())
            json.field("appTransactionId", appTransactionId(account: latest.accountEmail, bundleId: latest.bundleId))
            if let pending = chain.pendingOffer {
                // The offer the next renewal starts with.
                json.field("offerType", Int64(pending.offerType))
                json.field("offerIdentifier", pending.offer.offerId)
                json.field("offerPeriod", pending.offer.period.times(pending.offer.numberOfPeriods))
                json.field("offerDiscountType", pending.offer.paymentMode.discountType)
            }
            if let plan = chain.renewalBillingPlanType {
                // What the next charge is billed as: the current commitment's next installment, else the customer's choice.
                let midCommitment = latest.commitment?.continues == true
                json.field("renewalBillingPlanType", midCommitment ? BillingPlan.Kind.monthly.rawValue : plan.rawValue)
                if let commitment = latest.commitment {
                    json.key("commitmentInfo")
                    json.object { json in
                        json.field("commitmentAutoRenewProductId", chain.autoRenewProductId)
                        json.field("commitmentAutoRenewStatus", Int64(chain.autoRenewEnabled && chain.commitmentAutoRenew != false ? 1 : 0))
                        json.field("commitmentRenewalBillingPlanType", plan.rawValue)
                        json.field("commitmentRenewalDate", ReceiptDate.milliseconds(commitment.expiresDate))
                        if let amount = renewalCommitmentPrice(chain, plan: plan) { json.field("commitmentRenewalPrice", amount) }
                    }
                }
            }
            let winBack = eligibleWinBackOfferIds(chain, now: clock.now())
            if !winBack.isEmpty, let list = try? JSONSerialization.data(withJSONObject: winBack) {
                json.field("eligibleWinBackOfferIds", rawJSON: String(decoding: list, as: UTF8.self))
            }
        }
        return try signStoreKitData(json.bytes, account: chain.accountEmail)
    }

    /// What the subscription's next commitment (or up-front period) costs, in milliunits.
    func renewalCommitmentPrice(_ chain: SubscriptionChain, plan: BillingPlan.Kind) -> Int64? {
        state.withLock { state in
            guard let product = state.product(chain.bundleId, chain.autoRenewProductId),
                  let account = state.accounts[chain.accountEmail.lowercased()] else { return nil }
            let amount = plan == .monthly ? product.billingPlan(.monthly)?.commitmentAmount : product.price(for: account.storefront)?.amount
            return amount.flatMap(Milliunits.from)
        }
    }

    /// The app's transaction `transactionId` in `environment` (any id of the customer's, as Apple accepts since 2023).
    /// An `appTransactionId` (since 2025) names the customer's download of the app: it stands for their most
    /// recent transaction of the app.
    func serverAPIRecord(bundleId: String, environment: AppStoreEnvironment, transactionId: String) async throws(ServerAPIError) -> TransactionRecord {
        guard !transactionId.isEmpty, transactionId.count <= 20, transactionId.allSatisfy(\.isASCII), transactionId.allSatisfy(\.isNumber) else {
            throw .invalidTransactionId
        }
        let record = try? await read { state, _ -> TransactionRecord? in
            if let record = state.transactions[transactionId] { return record }
            guard let app = state.apps[bundleId],
                  let account = state.accounts.values.first(where: { String(AppStoreEmulator.downloadId($0, app)) == transactionId }) else { return nil }
            return state.transactions(account: account.email, bundle: bundleId, environment: environment)
                .filter { !$0.isRedelivery && ($0.state == .purchased || $0.state == .restored) }
                .max { $0.purchaseDate < $1.purchaseDate }
        }
        // Apple's servers never see what Xcode's StoreKit Testing sells.
        guard let record = record ?? nil, record.bundleId == bundleId, record.environment == environment, !isXcodeTester(record.accountEmail) else {
            throw .transactionIdNotFound
        }
        return record
    }
}
