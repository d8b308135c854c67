import Clocks
import AppStoreCrypto
import AppStoreModels
import Foundation
import HTTPClient
import Locking
import HTTP
import Storage
import Synchronization

/// The developer's purchase server: accepts receipts durably, verifies them in the background, and
/// answers what each user owns.
public final class PurchaseServer: Sendable {
    public let store: PurchaseStore
    public let worker: VerificationWorker
    /// Sends webhook events to the developer's endpoints (started by `runWorker`).
    public let webhooks: WebhookDeliverer
    public let clock: any WallClock
    /// Counters and histograms for `GET /metrics`.
    public let metrics: ServerMetrics
    /// The last readiness answer and when it was made: `/readyz` is unauthenticated, so a flood of it asks the database once a second.
    let lastReadiness = Locked<(at: ContinuousClock.Instant, answer: Readiness)?>(nil)
    let waiters: SettlementWaiters
    let adminKeyHash: String
    let serverAPI: ServerAPIEndpoints
    /// For calls to the App Store Server API (nil if TLS could not be set up).
    let serverAPIClient: HTTPClient?
    let recorder: AppleTrafficRecorder?
    /// Uploads per app and second (checked by the HTTP edge before bodies are read).
    let uploadLimiter: UploadRateLimiter
    /// Requests waiting on `?wait=` now, and the most allowed.
    let longPolls = Atomic<Int>(0)
    let maximumLongPolls: Int
    /// Where notifications are parsed and their signatures checked: off the cooperative pool, one at a time
    /// (a flood of them takes at most one core from everything else), `notificationBacklog` waiting at most.
    let notificationChecks = BoundedWork(label: "storekeeper.notification-checks", width: 1, maximumPending: PurchaseServer.notificationBacklog,
                                         maximumWait: PurchaseServer.notificationCheckWait)
    /// Notifications that may wait for their check; past it a delivery is answered 503 at once. Apple sends a refused
    /// notification again an hour later at the earliest (in the sandbox never), so a burst is taken rather than turned
    /// away: with 256, 1,024 deliveries at once were 87% refused (17,355 of 20,000 answered 503; bench/README.md,
    /// thirty-fourth round). A check under a known chain took about 100 µs there, so a full backlog of genuine ones is
    /// about 0.2 s of work.
    static let notificationBacklog = 2_048
    /// How long a notification's check may wait for its turn before it is answered 503 instead. The sender chooses what
    /// a check costs: a chain not seen before is verified in full, far more work than a known chain's one P-256 check, so a
    /// flood of those fills the backlog with seconds of work, and a genuine notification behind it would wait past
    /// Apple's patience (Apple's developer support says a few seconds at most). Each of a notification's checks (its
    /// envelope, then the transaction and renewal info it carries) waits at most this long: a notification up to three
    /// times this in all.
    static let notificationCheckWait: Duration = .seconds(1)
    /// Notifications' writes that arrive together, committed in one transaction.
    let notificationWrites = GroupCommit<@Sendable (any SQLConnection) throws -> (NotificationReceipt.Outcome, VerificationJob?),
                                         (NotificationReceipt.Outcome, VerificationJob?)>()
    /// The verification engine (its inspectors check notifications too).
    var engine: VerificationEngine { worker.engine }
    var trust: TrustStore { worker.engine.inspector.trust }

    /// Everything the server needs.
    public struct Configuration: Sendable {
        public var trust: TrustStore
        public var endpoints: AppStoreEndpoints
        public var transport: any HTTPTransport
        public var adminKey: String
        public var worker: VerificationWorker.Configuration
        public var retry: VerificationEngine.RetryPolicy
        public var callTimeout: TimeInterval
        /// Where the App Store Server API lives (Apple's hosts, or the emulator's /production and /sandbox).
        public var serverAPI: ServerAPIEndpoints = .apple
        /// Seals secrets at rest (shared secrets, Server API private keys, user-token secrets); nil stores them as given.
        public var secrets: SecretBox?
        /// Uploads per second per app in each process (bursts of twice that); 0 is unlimited.
        public var uploadsPerSecond: Double = 5000
        /// Most requests waiting at once on `?wait=` (more answer at once with the current state).
        public var maximumLongPolls = 2048
        /// Webhook delivery: concurrency, timeout, retries.
        public var webhooks = WebhookDeliverer.Configuration()
        /// Records the Server API's answers (`--record`; verifyReceipt's are recorded by wrapping `transport`).
        public var recorder: AppleTrafficRecorder?

        public init(trust: TrustStore, endpoints: AppStoreEndpoints, transport: any HTTPTransport, adminKey: String,
                    worker: VerificationWorker.Configuration = .init(), retry: VerificationEngine.RetryPolicy = .init(), callTimeout: TimeInterval = 15) {
            self.trust = trust
            self.endpoints = endpoints
            self.transport = transport
            self.adminKey = adminKey
            self.worker = worker
            self.retry = retry
            self.callTimeout = callTimeout
        }
    }

    /// Migrates the database and builds the server (call `runWorker()` to start verifying).
    /// `clock` and `ids` are where every "now" and every new identifier of the server come from.
    public static func open(database: any SQLDatabase, configuration: Configuration, clock: any WallClock = SystemClock(),
                            ids: any IDGenerator = RandomIDs()) async throws -> PurchaseServer {
        let store = PurchaseStore(database: database, secrets: configuration.secrets, ids: ids)
        try await store.migrate()
        try await store.checkMasterKey()
        try await store.refreshKeys(now: clock.now())
        let waiters = SettlementWaiters()
        let metrics = ServerMetrics()
        let engine = VerificationEngine(store: store, inspector: ReceiptInspector(trust: configuration.trust),
                                        client: VerifyReceiptClient(endpoints: configuration.endpoints, transport: configuration.transport,
                                                                    timeout: configuration.callTimeout),
                                        clock: clock, retry: configuration.retry, metrics: metrics)
        let worker = VerificationWorker(engine: engine, configuration: configuration.worker, ids: store.ids) { waiters.settled($0) }
        return PurchaseServer(store: store, worker: worker, clock: clock, metrics: metrics, waiters: waiters, adminKeyHash: APIKey.hash(configuration.adminKey),
                              serverAPI: configuration.serverAPI, configuration: configuration)
    }

    private init(store: PurchaseStore, worker: VerificationWorker, clock: any WallClock, metrics: ServerMetrics, waiters: SettlementWaiters, adminKeyHash: String,
                 serverAPI: ServerAPIEndpoints, configuration: Configuration) {
        uploadLimiter = UploadRateLimiter(rate: configuration.uploadsPerSecond)
        webhooks = WebhookDeliverer(store: store, clock: clock, configuration: configuration.webhooks, metrics: metrics)
        self.metrics = metrics
        maximumLongPolls = configuration.maximumLongPolls
        self.store = store
        self.worker = worker
        self.clock = clock
        self.waiters = waiters
        self.adminKeyHash = adminKeyHash
        self.serverAPI = serverAPI
        serverAPIClient = try? HTTPClient(configuration: .init(maxConnectionsPerHost: 16))
        recorder = configuration.recorder
    }

    /// Starts the verification worker, webhook delivery, the key ring's refresh (every second, so a key revoked by
    /// any process sharing the database is refused here within a second), the metrics rollup and young tables'
    /// planner statistics (PostgreSQL), and the sweep of receipts settled jobs kept; cancel the task to stop them all.
    public func runWorker() -> Task<Void, Never> {
        Task { [worker, webhooks, store, clock] in
            await withDiscardingTaskGroup { group in
                group.addTask { await worker.run() }
                group.addTask { await webhooks.run() }
                group.addTask {
                    while !Task.isCancelled {
                        try? await Task.sleep(for: .seconds(1))
                        try? await store.refreshKeys(now: clock.now())
                    }
                }
                group.addTask {
                    // Young tables' planner statistics, which autovacuum leaves missing for their first minutes.
                    while !Task.isCancelled {
                        try? await Task.sleep(for: .seconds(5))
                        _ = try? await store.refreshPlannerStatistics()
                    }
                }
                group.addTask {
                    // Verified jobs' receipts: on SQLite all of them, seconds after settlement; elsewhere those that
                    // versions before dropping them at settlement kept (`ReceiptSweep`).
                    var sweep = ReceiptSweep(bounded: store.database.dialect == .sqlite)
                    var wait = sweep.firstWait
                    while !Task.isCancelled {
                        try? await Task.sleep(for: wait)
                        let pass = sweep.next(now: .now, bound: RandomIDs.orderedBound(Date().addingTimeInterval(-10)))
                        // A pass that failed (the database busy or gone) is tried again a second later from the same place.
                        guard let result = try? await store.dropSettledReceipts(after: pass.after, before: pass.before, limit: ReceiptSweep.limit) else {
                            wait = .seconds(1)
                            continue
                        }
                        wait = sweep.finished(pass, dropped: result.dropped, last: result.last)
                    }
                }
                group.addTask {
                    // The metrics rollup follows settlements within a second, in batches.
                    while !Task.isCancelled {
                        try? await Task.sleep(for: .seconds(1))
                        _ = try? await store.refreshMetrics()
                    }
                }
            }
        }
    }

    /// Accepts a receipt durably and has it verified. With a free place in this process's worker, the job is written
    /// already claimed by it and handed over once committed: no claim statement, and the receipt is not read back.
    /// Otherwise it is written pending and the worker is woken to claim it (or another process's worker, which
    /// claims it as it frees places or polls).
    public func submit(appId: String, appUserId: String, receiptData: String, kind: VerificationJob.Kind,
                       userAuthenticated: Bool = true, deliver: DeliveryHint? = nil) async throws -> VerificationJob {
        let rejection = kind == .signedTransaction ? ReceiptShape.rejection(ofSignedTransaction: receiptData) : ReceiptShape.rejection(of: receiptData)
        let now = clock.now()
        guard rejection == nil else {
            return try await store.enqueue(appId: appId, appUserId: appUserId, kind: kind, receiptData: receiptData, userAuthenticated: userAuthenticated,
                                           deliver: deliver, rejection: rejection, now: now)
        }
        // An app receipt whose certificates a verified receipt had is stored without them (under a third of its size).
        let stored = kind != .signedTransaction ? store.storedReceipt(receiptData) : nil
        var job = try await worker.takeUpload(now: now) { [store] lease in
            try await store.enqueue(appId: appId, appUserId: appUserId, kind: kind, receiptData: receiptData, userAuthenticated: userAuthenticated,
                                    deliver: deliver, lease: lease, storedReceipt: stored, now: now)
        }
        job.storedReceipt = nil  // written (and told to the worker): not held while the caller waits for the settlement
        return job
    }

    /// The job after waiting up to `timeout` for it to settle.
    /// Past `maximumLongPolls` waiters, answers at once: a flood of `?wait=` holds no more memory or tasks.
    public func awaitSettlement(_ id: String, appId: String?, timeout: Duration) async throws -> VerificationJob? {
        let waiting = longPolls.wrappingAdd(1, ordering: .relaxed).newValue
        defer { longPolls.wrappingSubtract(1, ordering: .relaxed) }
        let deadline = ContinuousClock.now.advanced(by: waiting > maximumLongPolls ? .zero : timeout)
        while true {
            guard let job = try await store.job(id, appId: appId) else { return nil }
            // Cancelled (the HTTP server stopping): the job as it stands now, as when the wait runs out.
            if job.state.isSettled || ContinuousClock.now >= deadline || Task.isCancelled { return job }
            // Woken by this process's worker; the short cap also catches jobs settled by other processes.
            let remaining = deadline - ContinuousClock.now
            await waiters.wait(for: id, timeout: min(remaining, .milliseconds(250)))
        }
    }

    /// Whether `key` is the admin key (compared by hash).
    func isAdmin(_ key: String) -> Bool { APIKey.hash(key) == adminKeyHash }
}
