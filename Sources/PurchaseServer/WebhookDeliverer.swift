import Clocks
import Foundation
import HTTPClient
import Locking
import Storage
import Synchronization

/// When a failed delivery is tried again: exponential backoff from `baseDelay`, capped at `maxDelay`, with
/// jitter (each delay is 50–100 % of the nominal one, so receivers that failed together are not hit together),
/// until `maximumAge` after the event; then the delivery is failed. Pure: the jitter is a parameter.
public struct WebhookRetryPolicy: Sendable, Equatable {
    public var baseDelay: TimeInterval
    public var maxDelay: TimeInterval
    public var maximumAge: TimeInterval

    public init(baseDelay: TimeInterval = 5, maxDelay: TimeInterval = 3600, maximumAge: TimeInterval = 72 * 3600) {
        self.baseDelay = baseDelay
        self.maxDelay = maxDelay
        self.maximumAge = maximumAge
    }

    /// The next attempt (ms) after failed attempt number `attempt` (1-based) at `now`, or nil when the delivery has failed for good.
    public func nextAttempt(after attempt: Int64, now: Int64, createdAt: Int64, jitter: Double) -> Int64? {
        let nominal = min(baseDelay * pow(2, Double(min(max(attempt - 1, 0), 40))), maxDelay)
        let delay = nominal * (0.5 + 0.5 * min(max(jitter, 0), 1))
        let next = now + Int64(delay * 1000)
        return next - createdAt > Int64(maximumAge * 1000) ? nil : next
    }
}

/// Sends the outbox: claims due deliveries under a lease, POSTs each event's JSON with its signature,
/// thousands in flight on the project's HTTP client, and records every attempt. Settlement never waits
/// for it; an event survives any crash because it was written with the change (at least once: a
/// process killed after a 2xx but before recording it sends that event again; receivers de-duplicate on `id`).
public final class WebhookDeliverer: Sendable {
    public struct Configuration: Sendable {
        /// Deliveries in flight at most.
        public var concurrency: Int
        /// Deliveries claimed per database round trip.
        public var batchSize: Int
        /// How long one POST may take.
        public var timeout: TimeInterval
        public var retry: WebhookRetryPolicy
        /// How often to look for due deliveries when nothing wakes the deliverer.
        public var pollInterval: Duration

        public init(concurrency: Int = 2048, batchSize: Int = 256, timeout: TimeInterval = 10, retry: WebhookRetryPolicy = .init(),
                    pollInterval: Duration = .seconds(1)) {
            self.concurrency = concurrency
            self.batchSize = batchSize
            self.timeout = timeout
            self.retry = retry
            self.pollInterval = pollInterval
        }
    }

    let store: PurchaseStore
    let clock: any WallClock
    let configuration: Configuration
    let owner: String
    private let finished = Locked<[(DueDelivery, WebhookAttempt)]>([])
    private let inFlight = Atomic<Int>(0)

    let metrics: ServerMetrics

    public init(store: PurchaseStore, clock: any WallClock, configuration: Configuration = .init(), metrics: ServerMetrics = ServerMetrics()) {
        self.metrics = metrics
        self.store = store
        self.clock = clock
        self.configuration = configuration
        owner = "webhooks-\(ProcessInfo.processInfo.processIdentifier)-\(store.ids.nextString().prefix(8))"
    }

    /// Delivers until cancelled.
    public func run() async {
        let client = try? HTTPClient(configuration: .init(maxConnectionsPerHost: 512, maxResponseBytes: 1 << 20, userAgent: "Storekeeper-Webhooks/1"))
        await withDiscardingTaskGroup { group in
            while !Task.isCancelled {
                let claimed = await claim()
                for delivery in claimed {
                    group.addTask { await self.send(delivery, client: client) }
                }
                let recorded = await recordFinished()
                if claimed.isEmpty && recorded == 0 { await store.webhookSignal.wait(timeout: configuration.pollInterval) }
            }
        }
        // Cancelled: what was in flight has finished (the group waits, bounded by the timeout); record it.
        _ = await recordFinished()
        client?.shutdown()
    }

    /// Deliveries currently being sent.
    public var sending: Int { inFlight.load(ordering: .relaxed) }

    private func claim() async -> [(DueDelivery, WebhookTarget, String)] {
        let capacity = configuration.concurrency - inFlight.load(ordering: .relaxed)
        guard capacity > 0 else { return [] }
        let now = clock.now().milliseconds
        let lease = now + Int64((configuration.timeout * 2 + 30) * 1000)
        let claimed = (try? await store.database.transaction { db -> [(DueDelivery, WebhookTarget, String)] in
            let repository = self.store.webhooks(db)
            let due = try repository.claim(owner: self.owner, limit: min(capacity, self.configuration.batchSize), leaseUntil: lease, now: now)
            guard !due.isEmpty else { return [] }
            let targets = try repository.endpoints(ids: Array(Set(due.map(\.endpointId))))
            let bodies = try repository.bodies(Array(Set(due.map(\.eventId))))
            return due.compactMap { delivery in
                guard let target = targets[delivery.endpointId], let body = bodies[delivery.eventId] else { return nil }
                return (delivery, target, body)
            }
        }) ?? []
        inFlight.wrappingAdd(claimed.count, ordering: .relaxed)
        return claimed
    }

    private func send(_ item: (DueDelivery, WebhookTarget, String), client: HTTPClient?) async {
        let (delivery, target, body) = item
        let started = ContinuousClock.now
        let now = clock.now()
        let bytes = Array(body.utf8)
        var attempt = WebhookAttempt(attemptedAt: now.milliseconds, status: nil, latencyMs: 0, outcome: "connection_failed", responseExcerpt: nil)
        if target.secret.isEmpty {
            // Its secret does not open (another master key): never sign with an empty key.
            attempt.outcome = "secret_unavailable"
        } else if let client, let url = URL(string: target.endpoint.url) {
            // The signature's timestamp is the system clock's: receivers judge it by their own.
            let timestamp = Int64(SystemClock().now().timeIntervalSince1970)
            let headers = [("Content-Type", "application/json"), ("Storekeeper-Event-Id", delivery.eventId),
                           (WebhookSignature.header, WebhookSignature.header(body: bytes, timestamp: timestamp,
                                                                             secrets: target.signingSecrets(now: now.milliseconds)))]
            do {
                let response = try await client.send("POST", url, headers: headers, body: bytes, timeout: configuration.timeout)
                attempt.status = Int64(response.status)
                attempt.outcome = (200...299).contains(response.status) ? "delivered" : "http_status"
                attempt.responseExcerpt = String(decoding: response.body.prefix(512), as: UTF8.self)
            } catch {
                attempt.outcome = switch error.code {
                case .timedOut: "timed_out"
                case .malformedResponse, .connectionClosed: "invalid_response"
                default: "connection_failed"
                }
            }
        }
        let elapsed = ContinuousClock.now - started
        metrics.webhookAttempt(outcome: attempt.outcome, seconds: elapsed.seconds)
        attempt.latencyMs = elapsed.components.seconds * 1000 + elapsed.components.attoseconds / 1_000_000_000_000_000
        finished.withLock { $0.append((delivery, attempt)) }
        inFlight.wrappingSubtract(1, ordering: .relaxed)
        store.webhookSignal.wake()
    }

    /// Writes the outcomes of finished attempts in one transaction; returns how many.
    private func recordFinished() async -> Int {
        let batch = finished.withLock { batch -> [(DueDelivery, WebhookAttempt)] in
            defer { batch = [] }
            return batch
        }
        guard !batch.isEmpty else { return 0 }
        let now = clock.now().milliseconds
        let retry = configuration.retry
        do {
            try await store.database.transaction { db in
                let repository = self.store.webhooks(db)
                for (delivery, attempt) in batch {
                    var state = "delivered"
                    var next = now
                    if attempt.outcome != "delivered" {
                        if let later = retry.nextAttempt(after: delivery.attempts + 1, now: now, createdAt: delivery.createdAt, jitter: Double.random(in: 0...1)) {
                            state = "pending"
                            next = later
                        } else {
                            state = "failed"
                        }
                    }
                    try repository.finish(delivery, attempt: attempt, attemptId: self.store.ids.nextOrderedString(), state: state, nextAttemptAt: next, owner: self.owner)
                }
            }
        } catch {
            // The leases run out and the deliveries are sent again: at least once, never lost.
        }
        return batch.count
    }
}
