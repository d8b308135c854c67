import Clocks
import AppStoreCrypto
import AppStoreModels
import Foundation

/// Verifies one claimed job end to end: local checks, Apple (production first, 21007 → sandbox,
/// 21008 → production, the 21002 quirk), then settlement. Retryable failures are rescheduled with
/// exponential backoff and jitter until the job's maximum age, then dead-lettered.
public struct VerificationEngine: Sendable {
    /// Retry timing.
    public struct RetryPolicy: Sendable {
        public var baseDelay: TimeInterval
        public var maxDelay: TimeInterval
        /// After this long since the job was created, a job that still cannot settle goes to the dead-letter state.
        public var maxAge: TimeInterval

        public init(baseDelay: TimeInterval = 1, maxDelay: TimeInterval = 300, maxAge: TimeInterval = 24 * 3600) {
            self.baseDelay = baseDelay
            self.maxDelay = maxDelay
            self.maxAge = maxAge
        }

        /// The delay before attempt `attempts + 1`: exponential, capped, with ±50% jitter.
        public func delay(afterAttempt attempts: Int64) -> TimeInterval {
            let exponential = baseDelay * pow(2, Double(max(0, attempts - 1)))
            return min(exponential, maxDelay) * Double.random(in: 0.5...1.5)
        }
    }

    public let store: PurchaseStore
    public let inspector: ReceiptInspector
    public let transactionInspector: SignedTransactionInspector
    public let client: VerifyReceiptClient
    public let clock: any WallClock
    let metrics: ServerMetrics
    public let retry: RetryPolicy

    public init(store: PurchaseStore, inspector: ReceiptInspector, client: VerifyReceiptClient, clock: any WallClock, retry: RetryPolicy,
                metrics: ServerMetrics = ServerMetrics()) {
        self.metrics = metrics
        self.store = store
        self.inspector = inspector
        transactionInspector = SignedTransactionInspector(trust: inspector.trust)
        self.client = client
        self.clock = clock
        self.retry = retry
    }

    /// Processes a job claimed by `owner`; returns the state it was left in (nil if the lease was lost).
    ///
    /// The job is taken over (`consuming`) and its receipt's text split from it: the text goes into the request to
    /// Apple and is let go there, so the thousands of calls waiting on Apple do not each hold a copy. The job keeps
    /// the text's SHA-256, which its settlement records.
    @discardableResult
    public func process(_ job: consuming VerificationJob, owner: String) async -> JobState? {
        let receipt = job.receiptData
        job.receiptDigest = job.receiptSHA256
        job.receiptData = ""
        switch await outcome(job, receipt: receipt, owner: owner) {
        case .settled(let state): return state
        case .leaseLost, .infrastructure: return nil
        }
    }

    /// How processing a job ended, by the type of what happened (never by an error's text).
    enum Outcome: Equatable {
        /// The job reached a state (verified, rejected, rescheduled, dead).
        case settled(JobState)
        /// Another worker holds the job now.
        case leaseLost
        /// The database failed: the job is left to be retried when its lease expires.
        case infrastructure
    }

    func outcome(_ job: VerificationJob, receipt: consuming String, owner: String) async -> Outcome {
        do {
            guard let state = try await run(job, receipt: receipt, owner: owner) else { return .leaseLost }
            return .settled(state)
        } catch let rejection as ReceiptRejection {
            // Apple's answer does not fit the receipt (another bundle id): final, not a database failure.
            return await settleOrLeave { try await self.store.reject(job, owner: owner, code: rejection.code, reason: rejection.reason,
                                                                      environment: nil, now: self.clock.now()) } ?? .settled(.rejected)
        } catch let conflict as LedgerRepository.Conflict {
            // Another process recorded the same transaction at the same moment: settle again soon, seeing its row.
            let retry = AppleAnswer.Retry(kind: .unavailable, reason: "transaction \(conflict.transactionId) was being recorded by another process")
            return await settleOrLeave { try await self.reschedule(job, owner: owner, retry: retry) } ?? .settled(.pending)
        } catch {
            return .infrastructure
        }
    }

    /// Runs a follow-up write; nil when it succeeded, `.infrastructure` when the database failed.
    private func settleOrLeave(_ write: () async throws -> Void) async -> Outcome? {
        do { try await write() } catch { return .infrastructure }
        return nil
    }

    /// The receipt path, split so that the async frames alive while Apple answers stay small: thousands of calls
    /// wait at once, and each frame on the way down to the socket reserves room for every local of its function
    /// (this one was 7.8 KB when it held the answer and the settlement too).
    func run(_ job: VerificationJob, receipt: consuming String, owner: String) async throws -> JobState? {
        guard let app = try await store.cachedApp(job.appId) else {
            return try await reject(job, owner: owner, ReceiptRejection(code: "app_not_found", reason: "the app is no longer registered"), environment: nil)
        }
        if job.kind == .signedTransaction { return try await runSignedTransaction(job, jws: receipt, app: app, owner: owner) }
        let inspected: InspectedReceipt
        switch inspectLocally(job, receipt: receipt, app: app) {
        case .success(let receipt): inspected = receipt
        case .failure(let rejection): return try await reject(job, owner: owner, rejection, environment: nil)
        }
        switch await askApple(job, receipt: consume receipt, app: app, first: inspected.environment) {
        case .retryable(let retry):
            try await reschedule(job, owner: owner, retry: retry)
            return job.state
        case .answered(let answer):
            return try await settle(answer, of: job, app: app, inspected: inspected, owner: owner)
        }
    }

    /// The local checks: the receipt's form and signature, then the app's sandbox policy.
    @inline(never)
    func inspectLocally(_ job: VerificationJob, receipt: String, app: ServerApp) -> Result<InspectedReceipt, ReceiptRejection> {
        do throws(ReceiptRejection) {
            let inspected = try inspector.inspect(receipt, bundleIds: app.bundleIds)
            try Self.checkSandboxPolicy(app, environment: inspected.environment, user: job.appUserId, authenticated: job.userAuthenticated)
            return .success(inspected)
        } catch {
            return .failure(error)
        }
    }

    /// Settles a job as rejected for `rejection`.
    @inline(never)
    func reject(_ job: VerificationJob, owner: String, _ rejection: ReceiptRejection, environment: AppStoreEnvironment?) async throws -> JobState {
        try await store.reject(job, owner: owner, code: rejection.code, reason: rejection.reason, environment: environment, now: clock.now())
        return .rejected
    }

    /// Apple's final answer and the environment that gave it (a class: frames hold a pointer).
    final class FinalAnswer: Sendable {
        let environment: AppStoreEnvironment
        let response: VerifyReceiptResponse
        let raw: Data

        init(environment: AppStoreEnvironment, response: VerifyReceiptResponse, raw: Data) {
            self.environment = environment
            self.response = response
            self.raw = raw
        }
    }

    /// What asking Apple ended in.
    enum AppleOutcome {
        case answered(FinalAnswer)
        case retryable(AppleAnswer.Retry)
    }

    /// seed 003: the receipt's own type says where it belongs; production receipts go to production first,
    /// then 21007 → sandbox, 21008 → production, and 21002 → sandbox when the app asks for it.
    /// The receipt's text goes into the first request and is let go with it; asking another environment (rare: a
    /// sandbox receipt sent to production first) reads it again from the job's row.
    func askApple(_ job: VerificationJob, receipt: consuming String, app: ServerApp, first: AppStoreEnvironment) async -> AppleOutcome {
        var environment = first
        var tried: Set<AppStoreEnvironment> = []
        var unsent: String? = consume receipt
        while true {
            tried.insert(environment)
            let text: String
            if let first = unsent.take() {
                text = first
            } else if let again = await receiptAgain(of: job) {
                text = again
            } else {
                return .retryable(AppleAnswer.Retry(kind: .unavailable, reason: "the receipt could not be read again to ask \(environment.rawValue)"))
            }
            let started = ContinuousClock.now
            let reply = await client.verify(consume text, password: app.sharedSecret, environment: environment)
            switch next(after: reply, from: environment, tried: tried, app: app, took: ContinuousClock.now - started) {
            case .ask(let other): environment = other
            case .done(let outcome): return outcome
            }
        }
    }

    /// After one call: ask another environment, or stop with what Apple said. Counts the call.
    @inline(never)
    func next(after reply: AppleAnswer, from environment: AppStoreEnvironment, tried: Set<AppStoreEnvironment>, app: ServerApp,
              took: Duration) -> AppleStep {
        metrics.appleCall(endpoint: "verifyReceipt", environment: environment.rawValue, outcome: reply.metricOutcome, seconds: took.seconds)
        switch reply {
        case .retryable(let retry):
            return .done(.retryable(retry))
        case .answered(let response, let raw):
            let status = response.status
            if status == VerifyReceiptStatus.sandboxReceiptInProduction, !tried.contains(.sandbox) { return .ask(.sandbox) }
            if status == VerifyReceiptStatus.productionReceiptInSandbox, !tried.contains(.production) { return .ask(.production) }
            if status == VerifyReceiptStatus.malformedReceipt, environment == .production, !tried.contains(.sandbox),
               app.quirk21002Policy == .retrySandbox {
                return .ask(.sandbox)
            }
            return .done(.answered(FinalAnswer(environment: environment, response: response, raw: raw)))
        }
    }

    /// The receipt's text read again from the job's row, for a call to the other environment.
    @inline(never)
    private func receiptAgain(of job: VerificationJob) async -> String? {
        guard let text = try? await store.job(job.id)?.receiptData, !text.isEmpty else { return nil }
        return text
    }

    enum AppleStep {
        case ask(AppStoreEnvironment)
        case done(AppleOutcome)
    }

    /// Apple's final answer into the ledger, or a rejection.
    @inline(never)
    func settle(_ answer: FinalAnswer, of job: VerificationJob, app: ServerApp, inspected: InspectedReceipt, owner: String) async throws -> JobState? {
        let (environment, response, raw) = (answer.environment, answer.response, answer.raw)
        guard response.status == VerifyReceiptStatus.valid || response.status == VerifyReceiptStatus.subscriptionExpired else {
            return try await reject(job, owner: owner, ReceiptRejection(code: "apple_status_\(response.status)", reason: Self.explain(response.status)),
                                    environment: environment)
        }
        if environment == .sandbox, inspected.environment == .production {
            return try await reject(job, owner: owner, ReceiptRejection(code: "environment_mismatch",
                                                                       reason: "the App Store confirmed the receipt only in the sandbox"),
                                    environment: environment)
        }
        let confirmed = try Self.confirmed(response, raw: raw, legacy: inspected.isTransactionReceipt, bundleIds: app.bundleIds, answeredAt: clock.now())
        let settlement = Settlement(job: job, owner: owner, environment: environment, transactions: confirmed.transactions,
                                    subscriptions: confirmed.subscriptions, now: clock.now())
        return try await store.settle(settlement, clock: clock)?.0
    }

    /// A StoreKit 2 signed transaction: everything is checked locally (Apple signed it), then settled
    /// through the same ledger as receipts.
    @inline(never)
    func runSignedTransaction(_ job: VerificationJob, jws: String, app: ServerApp, owner: String) async throws -> JobState? {
        let transaction: JWSTransaction
        let environment: AppStoreEnvironment
        do throws(ReceiptRejection) {
            (transaction, environment) = try transactionInspector.inspect(jws, bundleIds: app.bundleIds)
            try Self.checkSandboxPolicy(app, environment: environment, user: job.appUserId, authenticated: job.userAuthenticated)
            // An appAccountToken binds the purchase to the app's user it was made for: the user's own UUID,
            // or the version-5 token of any other user id (AppAccountToken). Present and not this user's: refused.
            if let token = transaction.appAccountToken, !AppAccountToken.matches(token, user: job.appUserId) {
                throw ReceiptRejection(code: "app_account_token_mismatch",
                                       reason: "the transaction was bought for app account \(token), not for user \(job.appUserId)")
            }
        } catch {
            return try await reject(job, owner: owner, error, environment: nil)
        }
        let settlement = Settlement(job: job, owner: owner, environment: environment,
                                    transactions: [ConfirmedTransaction(transaction, source: "signed_transaction")], subscriptions: [], now: clock.now())
        return try await store.settle(settlement, clock: clock)?.0
    }

    /// The app's sandbox policy (App Review buys in the sandbox; production apps may allow-list those accounts).
    /// The allow-list matches authenticated users only: a public key alone cannot name itself App Review.
    static func checkSandboxPolicy(_ app: ServerApp, environment: AppStoreEnvironment, user: String, authenticated: Bool) throws(ReceiptRejection) {
        guard environment == .sandbox else { return }
        switch app.sandboxPolicy {
        case .allow: return
        case .deny: throw ReceiptRejection(code: "sandbox_not_allowed", reason: "this app does not accept sandbox purchases")
        case .allowList where !authenticated || !app.sandboxAllowList.contains(user):
            throw ReceiptRejection(code: "sandbox_not_allowed", reason: "sandbox purchases are granted only to users on the app's sandbox allow-list")
        case .allowList: return
        }
    }

    @inline(never)
    func reschedule(_ job: VerificationJob, owner: String, retry reason: AppleAnswer.Retry) async throws {
        let now = clock.now()
        let dead = now.timeIntervalSince(job.createdAt) >= retry.maxAge
        try await store.reschedule(job, owner: owner,
                                   reason: dead ? "verification timed out: gave up after \(job.attempts) attempts (\(reason.reason))" : reason.reason,
                                   timedOut: reason.kind == .timedOut, nextAttempt: now.addingTimeInterval(retry.delay(afterAttempt: job.attempts)),
                                   dead: dead, now: now)
    }

    /// Apple's statuses in words.
    static func explain(_ status: Int) -> String {
        switch status {
        case VerifyReceiptStatus.unreadableRequest: return "the App Store could not read the request (21000)"
        case VerifyReceiptStatus.malformedReceipt: return "the App Store found the receipt malformed (21002)"
        case VerifyReceiptStatus.notAuthenticated: return "the App Store could not authenticate the receipt (21003)"
        case VerifyReceiptStatus.sharedSecretMismatch: return "the shared secret does not match (21004)"
        case VerifyReceiptStatus.sandboxReceiptInProduction: return "sandbox receipt, but the sandbox did not confirm it (21007)"
        case VerifyReceiptStatus.productionReceiptInSandbox: return "production receipt, but production did not confirm it (21008)"
        case VerifyReceiptStatus.accountNotFound: return "the App Store account was not found or was deleted (21010)"
        default: return "the App Store answered status \(status)"
        }
    }

    /// The transactions and subscription states of a successful answer.
    static func confirmed(_ response: VerifyReceiptResponse, raw: Data, legacy: Bool, bundleIds: [String], answeredAt: Date) throws
        -> (transactions: [ConfirmedTransaction], subscriptions: [ConfirmedSubscription]) {
        if legacy {
            let object = (try? JSONSerialization.jsonObject(with: raw)) as? [String: Any] ?? [:]
            var transactions: [ConfirmedTransaction] = []
            for key in ["receipt", "latest_receipt_info", "latest_expired_receipt_info"] {
                if let fields = object[key] as? [String: Any], let transaction = ConfirmedTransaction(legacy: fields, source: "transaction_receipt") {
                    if let bundle = fields["bid"] as? String, !bundleIds.contains(bundle) { continue }
                    transactions.append(transaction)
                }
            }
            return (transactions, [])
        }
        guard let receipt = response.receipt, bundleIds.contains(receipt.bundleId) else {
            throw ReceiptRejection(code: "apple_answer_mismatch", reason: "the App Store's answer is for another bundle id")
        }
        var transactions = receipt.inApp.compactMap { ConfirmedTransaction($0, source: "receipt") }
        // latest_receipt_info is Apple's state at the time of the answer; the receipt's own list is history.
        transactions += (response.latestReceiptInfo ?? []).compactMap { info in
            var transaction = ConfirmedTransaction(info, source: "latest_receipt_info")
            transaction?.observedAt = answeredAt
            return transaction
        }
        let subscriptions = (response.pendingRenewalInfo ?? []).map { info in
            ConfirmedSubscription(originalTransactionId: info.originalTransactionId, productId: info.productId,
                                  autoRenewProductId: info.autoRenewProductId, autoRenewStatus: info.autoRenewStatus == "1",
                                  expirationIntent: info.expirationIntent, isInBillingRetry: info.isInBillingRetryPeriod == "1",
                                  gracePeriodExpiresDate: info.gracePeriodExpiresDate?.date, priceIncreaseStatus: info.priceConsentStatus.flatMap { Int64($0) })
        }
        return (transactions, subscriptions)
    }
}
