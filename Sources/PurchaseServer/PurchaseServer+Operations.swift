import Foundation
import Storage

/// What `GET /readyz` answers.
public struct Readiness: Codable, Sendable, Equatable {
    public var ready: Bool
    public var database: String
    public var schemaVersion: Int64?
    public var expectedSchemaVersion: Int64
    public var worker: String
    public var problems: [String]
}

extension PurchaseServer {
    /// Ready to take traffic: the database answers, every migration this build knows is applied, and the
    /// verification worker runs. A load balancer stops routing to a process that is not.
    public func readiness() async -> Readiness {
        if let cached = lastReadiness.withLock({ $0 }), ContinuousClock.now - cached.at < .seconds(1) { return cached.answer }
        let answer = await checkReadiness()
        lastReadiness.withLock { $0 = (ContinuousClock.now, answer) }
        return answer
    }

    private func checkReadiness() async -> Readiness {
        let expected = Int64(Schema.migrations.map(\.version).max() ?? 0)
        var problems: [String] = []
        var version: Int64?
        do {
            version = try await store.database.transaction { db in try HealthRepository(db: db).schemaVersion() }
        } catch {
            // The detail (hosts, users) goes to the log, not to an unauthenticated answer.
            FileHandle.standardError.write(Data("readyz: database: \(error)\n".utf8))
            problems.append("database unreachable")
        }
        if let version, version < expected { problems.append("schema version \(version), this build needs \(expected)") }
        if !worker.isRunning { problems.append("the verification worker is not running") }
        return Readiness(ready: problems.isEmpty, database: version == nil ? "unreachable" : "ok", schemaVersion: version,
                         expectedSchemaVersion: expected, worker: worker.isRunning ? "running" : "stopped", problems: problems)
    }

    /// `GET /metrics`: the in-memory counters, and gauges read from the database now.
    public func metricsText() async -> String {
        let now = clock.now().milliseconds
        var gauges: [ServerMetrics.Gauge] = []
        let jobs = (try? await store.jobCounts()) ?? [:]
        gauges.append(.init(name: "storekeeper_verification_jobs", help: "Verification jobs by state.", labels: ["state"],
                            samples: JobState.allCases.map { ([$0.rawValue], Double(jobs[$0.rawValue] ?? 0)) }))
        let deliveries = (try? await store.webhookDeliveryCounts()) ?? [:]
        gauges.append(.init(name: "storekeeper_webhook_deliveries", help: "Webhook deliveries by state (pending is the backlog).", labels: ["state"],
                            samples: ["pending", "delivered", "failed"].map { ([$0], Double(deliveries[$0] ?? 0)) }))
        let ages = try? await store.database.read { db -> (Int64?, Int64?, Int64?) in
            let health = HealthRepository(db: db)
            return (try health.oldestWaitingJob(), try health.oldestPendingDelivery(), try health.newestNotification())
        }
        func age(_ since: Int64?) -> Double { since.map { max(0, Double(now - $0) / 1000) } ?? 0 }
        gauges.append(.init(name: "storekeeper_verification_oldest_waiting_seconds",
                            help: "Age of the oldest verification not yet settled (0 when none waits).", samples: [([], age(ages?.0))]))
        gauges.append(.init(name: "storekeeper_webhook_oldest_pending_seconds",
                            help: "Age of the oldest webhook delivery still owed (0 when none).", samples: [([], age(ages?.1))]))
        gauges.append(.init(name: "storekeeper_notification_last_received_seconds",
                            help: "Seconds since the last App Store Server Notification arrived (0 when none ever did).",
                            samples: [([], ages?.2 == nil ? 0 : age(ages?.2))]))
        gauges.append(.init(name: "storekeeper_verifications_in_flight", help: "Verifications this process is working on.",
                            samples: [([], Double(worker.inFlight))]))
        gauges.append(.init(name: "storekeeper_verifications_in_flight_limit",
                            help: "Verifications this process keeps in flight at most now (--concurrency; by default what its open-file limit allows beside the clients connected now).",
                            samples: [([], Double(worker.capacity))]))
        gauges.append(.init(name: "storekeeper_webhooks_sending", help: "Webhook deliveries this process is sending.",
                            samples: [([], Double(webhooks.sending))]))
        gauges.append(.init(name: "storekeeper_long_polls", help: "Requests waiting on ?wait= now.",
                            samples: [([], Double(longPolls.load(ordering: .relaxed)))]))
        if let pool = store.database.poolStatistics {
            gauges.append(.init(name: "storekeeper_database_connections", help: "Database connections by use.", labels: ["state"],
                                samples: [(["in_use"], Double(pool.inUse)), (["idle"], Double(pool.idle)), (["waiting"], Double(pool.waiting))]))
        }
        if let busy = store.database.writerBusySeconds {
            gauges.append(.init(name: "storekeeper_database_writer_busy_seconds_total",
                                help: "Seconds SQLite's only writer spent in transactions: its rate near 1 means writes wait for it.",
                                samples: [([], busy)], type: "counter"))
        }
        return metrics.render(gauges: gauges)
    }
}

extension PurchaseServer {
    /// Subscription metrics of an app per interval in [from, to) (`SubscriptionMetrics` has the definitions).
    public func subscriptionMetrics(appId: String, from: Date, to: Date, interval: SubscriptionMetrics.Interval, environment: String?) async throws
        -> [MetricsInterval] {
        try await subscriptionMetrics(appId: appId, ranges: [(from, to, interval)], environment: environment)[0]
    }

    /// Several ranges' metrics from one read of the rollup (the console's overview asks for days and the month at once).
    public func subscriptionMetrics(appId: String, ranges: [(from: Date, to: Date, interval: SubscriptionMetrics.Interval)], environment: String?)
        async throws -> [[MetricsInterval]] {
        let boundaries = try ranges.map { from, to, interval in
            guard from < to else { throw ServerError(.invalidDate, "from must be before to.") }
            let boundaries = SubscriptionMetrics.boundaries(from: from.milliseconds, to: to.milliseconds, interval: interval)
            guard boundaries.count <= 400 else { throw ServerError(.invalidDate, "At most 400 intervals: choose a longer interval or a shorter range.") }
            return boundaries
        }
        // The worker keeps the rollup current; what it has not reached yet is done here. What is left after that is
        // what other processes are refreshing this instant (or marked since); a rebuild in progress is not waited for.
        let backlog = try await store.refreshMetrics(limit: 50_000)
        guard backlog < 10_000 else {
            throw ServerError(.metricsRebuilding, "The metrics are being computed again (\(backlog) subscriptions left); ask again shortly.")
        }
        let now = clock.now().milliseconds
        let end = boundaries.compactMap { $0.last?.1 }.max() ?? 0
        let (days, moments) = try await store.metricsRollup(appId: appId, environment: environment, before: end, now: now)
        return boundaries.map { SubscriptionMetricsRollup.intervals(days: days, moments: moments, boundaries: $0, now: now) }
    }

    /// The same figures computed from every ledger row (`SubscriptionMetrics.compute`): the rollup's oracle, for tests.
    func subscriptionMetricsFromLedger(appId: String, from: Date, to: Date, interval: SubscriptionMetrics.Interval, environment: String?) async throws
        -> [MetricsInterval] {
        let boundaries = SubscriptionMetrics.boundaries(from: from.milliseconds, to: to.milliseconds, interval: interval)
        let (rows, reasons) = try await store.database.longRead { db in
            let reader = LedgerReader(db: db)
            return (try reader.metricsRows(appId: appId, environment: environment), try reader.expirationIntents(appId: appId))
        }
        return SubscriptionMetrics.compute(rows: rows, churnReasons: reasons, boundaries: boundaries, now: clock.now().milliseconds)
    }
}
