import Clocks
import AppStoreCrypto
import AppStoreModels
import Foundation
import Synchronization

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
    @discardableResult
    public func process(_ job: VerificationJob, owner: String) async -> JobState? {
        await process(ClaimedJob(job), owner: owner)
    }

    /// Processes a claimed job handed over by reference (see `ClaimedJob`).
    @discardableResult
    public func process(_ claimed: ClaimedJob, owner: String) async -> JobState? {
        switch await outcome(claimed, owner: owner) {
        case .settled(let state): return state
        case .leaseLost, .infrastructure: return nil
        }
    }

    /// A claimed job as the engine holds it while Apple answers, with its receipt's text split from it.
    ///
    /// Thousands of calls wait on Apple at once. Each async frame on the way down to the socket keeps room for what
    /// its function holds across the wait, so the frames hold this reference (8 bytes) rather than the job by value
    /// (about 240), and the text goes into the request to Apple and is let go there, not kept by every call. The job
    /// keeps the text's SHA-256, which its settlement records.
    public final class ClaimedJob: Sendable {
        let job: VerificationJob
        private let unsent: Mutex<String?>
        /// A signed transaction's decoding, when this process verified it before writing the job (a notification's).
        let inspected: InspectedTransaction?
        /// Whether the upload was stored without its certificates (`StoredReceipt`): they are known already.
        let storedCompacted: Bool

        public convenience init(_ claimed: consuming VerificationJob) {
            self.init(claimed, inspected: nil)
        }

        init(_ claimed: consuming VerificationJob, inspected: InspectedTransaction?) {
            let text = claimed.receiptData
            claimed.receiptDigest = claimed.receiptSHA256
            claimed.receiptData = ""
            storedCompacted = claimed.storedReceipt != nil
            claimed.storedReceipt = nil
            job = claimed
            unsent = Mutex(text)
            self.inspected = inspected
        }

        /// The receipt's text, for the checks before it is sent.
        var receipt: String { unsent.withLock { $0 ?? "" } }

        /// The text for the first call to Apple, given up by the job (nil once taken).
        func takeReceipt() -> String? { unsent.withLock { $0.take() } }

        public var id: String { job.id }
    }

    /// A signed transaction as `SignedTransactionInspector.inspect` returned it (chain, signature, bundle id and form
    /// checked), for a job this process writes right after checking its JWS and hands to its own worker.
    struct InspectedTransaction: Sendable {
        let transaction: JWSTransaction
        let environment: AppStoreEnvironment
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

    // The functions on the way down to the socket (`outcome`, `run`, `askApple`) are kept apart (`@inline(never)`)
    // and hold only references across the wait: an async frame keeps room for everything its function holds across
    // any of its waits, for as long as the call lasts, and thousands of calls wait on Apple at once.

    @inline(never)
    func outcome(_ claimed: ClaimedJob, owner: String) async -> Outcome {
        do {
            guard let state = try await run(claimed, owner: owner) else { return .leaseLost }
            return .settled(state)
        } catch {
            return await outcome(of: error, claimed, owner: owner)
        }
    }

    /// What an error thrown on the receipt's way ends in.
    @inline(never)
    private func outcome(of error: any Error, _ claimed: ClaimedJob, owner: String) async -> Outcome {
        switch error {
        case let rejection as ReceiptRejection:
            // Apple's answer does not fit the receipt (another bundle id): final, not a database failure.
            return await settleOrLeave { try await self.store.reject(claimed.job, owner: owner, code: rejection.code, reason: rejection.reason,
                                                                      environment: nil, now: self.clock.now()) } ?? .settled(.rejected)
        case let conflict as LedgerRepository.Conflict:
            // Another process recorded the same transaction at the same moment: settle again soon, seeing its row.
            let retry = AppleAnswer.Retry(kind: .unavailable, reason: "transaction \(conflict.transactionId) was being recorded by another process")
            return await settleOrLeave { try await self.reschedule(claimed, owner: owner, retry: retry) } ?? .settled(.pending)
        default:
            return .infrastructure
        }
    }

    /// Runs a follow-up write; nil when it succeeded, `.infrastructure` when the database failed.
    private func settleOrLeave(_ write: () async throws -> Void) async -> Outcome? {
        do { try await write() } catch { return .infrastructure }
        return nil
    }

    /// The receipt path: the local checks, Apple, the settlement.
    @inline(never)
    func run(_ claimed: ClaimedJob, owner: String) async throws -> JobState? {
        let checked: ReceiptInFlight
        switch try await check(claimed, owner: owner) {
        case .done(let state): return state
        case .ask(let inFlight): checked = inFlight
        }
        // Measured as the calls' metric is, not on the wall clock: the emulator's clock moved on (`appstore time advance`)
        // is not Apple taking long.
        let asked = ContinuousClock.now
        switch try await askApple(claimed, checked) {
        case .retryable(let retry):
            try await reschedule(claimed, owner: owner, retry: retry)
            return claimed.job.state
        case .answered(let answer):
            return try await settle(answer, of: claimed, checked, owner: owner, appleTook: ContinuousClock.now - asked)
        }
    }

    /// The app and the locally inspected receipt, held by reference while Apple answers.
    final class ReceiptInFlight: Sendable {
        let app: ServerApp
        let inspected: InspectedReceipt

        init(app: ServerApp, inspected: InspectedReceipt) {
            self.app = app
            self.inspected = inspected
        }
    }

    /// What the checks before Apple decided: an outcome already (rejected, or a signed transaction settled), or a receipt to ask about.
    enum Checked {
        case done(JobState?)
        case ask(ReceiptInFlight)
    }

    @inline(never)
    func check(_ claimed: ClaimedJob, owner: String) async throws -> Checked {
        let job = claimed.job
        guard let app = try await store.cachedApp(job.appId) else {
            return .done(try await reject(job, owner: owner, ReceiptRejection(code: "app_not_found", reason: "the app is no longer registered"),
                                          environment: nil))
        }
        if job.kind == .signedTransaction {
            return .done(try await runSignedTransaction(job, jws: claimed.receipt, inspected: claimed.inspected, app: app, owner: owner))
        }
        // Stored without its certificates, which the database no longer holds (`StoredReceipt`): not the receipt's fault.
        // The job is left to be claimed again, and after its open claims it waits among the dead with its receipt.
        if StoredReceipt.isCompacted(claimed.receipt) { throw StoredReceipt.PartMissing() }
        switch inspectLocally(job, receipt: claimed.receipt, app: app) {
        case .success(let inspected):
            // Its chain verified, the certificates as the App Store writes them: later uploads with the same ones are
            // stored without them.
            if inspected.certificatesAreChain, !claimed.storedCompacted { store.learnCertificates(of: claimed.receipt) }
            return .ask(ReceiptInFlight(app: app, inspected: inspected))
        case .failure(let rejection): return .done(try await reject(job, owner: owner, rejection, environment: nil))
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
    @inline(never)
    func askApple(_ claimed: ClaimedJob, _ checked: ReceiptInFlight) async throws -> AppleOutcome {
        var environment = checked.inspected.environment
        var tried: Set<AppStoreEnvironment> = []
        while true {
            tried.insert(environment)
            let text: String
            if let first = claimed.takeReceipt() {
                text = first
            } else if let again = try await receiptAgain(of: claimed.id) {
                text = again
            } else {
                return .retryable(AppleAnswer.Retry(kind: .unavailable, reason: "the receipt could not be read again to ask \(environment.rawValue)"))
            }
            let started = ContinuousClock.now
            let reply = await client.verify(consume text, password: checked.app.sharedSecret, environment: environment)
            switch next(after: reply, from: environment, tried: tried, app: checked.app, took: ContinuousClock.now - started) {
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

    /// The job's receipt read again, for a call to the other environment; nil when it is gone (the customer was erased
    /// meanwhile, or another worker took the job over after this one's lease lapsed and settled it). A database error is
    /// thrown: it is this server's failure, not Apple's, and the claim ends without an outcome.
    @inline(never)
    private func receiptAgain(of id: String) async throws -> String? {
        guard let text = try await store.receipt(of: id), !text.isEmpty else { return nil }
        // Stored without its certificates, which the database no longer holds: not sent to Apple as it stands.
        if StoredReceipt.isCompacted(text) { throw StoredReceipt.PartMissing() }
        return text
    }

    enum AppleStep {
        case ask(AppStoreEnvironment)
        case done(AppleOutcome)
    }

    /// Apple's final answer into the ledger, or a rejection.
    @inline(never)
    func settle(_ answer: FinalAnswer, of claimed: ClaimedJob, _ checked: ReceiptInFlight, owner: String,
                appleTook: Duration = .zero) async throws -> JobState? {
        let (job, app, inspected) = (claimed.job, checked.app, checked.inspected)
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
                                    subscriptions: confirmed.subscriptions, now: clock.now(), appleTook: appleTook)
        return try await store.settle(settlement, clock: clock)?.0
    }

    /// A StoreKit 2 signed transaction: everything is checked locally (Apple signed it), then settled
    /// through the same ledger as receipts.
    @inline(never)
    func runSignedTransaction(_ job: VerificationJob, jws: String, inspected: InspectedTransaction? = nil, app: ServerApp,
                              owner: String) async throws -> JobState? {
        let transaction: JWSTransaction
        let environment: AppStoreEnvironment
        do throws(ReceiptRejection) {
            if let inspected {
                (transaction, environment) = (inspected.transaction, inspected.environment)
            } else {
                (transaction, environment) = try transactionInspector.inspect(jws, bundleIds: app.bundleIds)
            }
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
    func reschedule(_ claimed: ClaimedJob, owner: String, retry reason: AppleAnswer.Retry) async throws {
        let (job, now) = (claimed.job, clock.now())
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
