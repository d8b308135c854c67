import Foundation
import Storage

/// The SQL of the webhook tables: endpoints, the event outbox, deliveries and their attempts.
struct WebhookRepository {
    let db: any SQLConnection
    let dialect: SQLDialect
    let secrets: SecretColumns

    // MARK: Endpoints

    func insert(_ endpoint: WebhookEndpoint, secret: String) throws {
        try db.query("""
            INSERT INTO webhook_endpoints (id, app_id, url, secret, event_types, created_at, format) VALUES (?, ?, ?, ?, ?, ?, ?)
            """, [endpoint.id, endpoint.appId, endpoint.url, try secrets.seal(secret), endpoint.eventTypes.map(\.rawValue).joined(separator: ","),
                  endpoint.createdAt, endpoint.format.rawValue])
    }

    /// An app's endpoints with their signing secrets (the current one, and the one a rotation keeps until its deadline).
    func endpoints(appId: String) throws -> [WebhookTarget] {
        try db.query("SELECT * FROM webhook_endpoints WHERE app_id = ? ORDER BY created_at, id", [appId]).map(target)
    }

    func endpoints(ids: [String]) throws -> [String: WebhookTarget] {
        var targets: [String: WebhookTarget] = [:]
        // In chunks, as every IN list here: a delivery batch may be configured larger than a statement's parameters.
        for chunk in ids.chunked(400) {
            let (marks, listed) = InList.padded(chunk)
            for target in try db.query("SELECT * FROM webhook_endpoints WHERE id IN (\(marks))", listed).map(target) {
                targets[target.endpoint.id] = target
            }
        }
        return targets
    }

    /// Removes an endpoint and the deliveries still owed to it; false when the app has no such endpoint.
    func delete(appId: String, id: String) throws -> Bool {
        guard try !db.query("DELETE FROM webhook_endpoints WHERE app_id = ? AND id = ? RETURNING id", [appId, id]).isEmpty else { return false }
        try db.query("DELETE FROM webhook_deliveries WHERE endpoint_id = ? AND state = 'pending'", [id])
        return true
    }

    /// A new signing secret; the current one stays valid until `previousUntil` (ms). False when there is no such endpoint.
    func rotate(appId: String, id: String, secret: String, previousUntil: Int64) throws -> Bool {
        try !db.query("""
            UPDATE webhook_endpoints SET previous_secret = secret, previous_secret_until = ?, secret = ? WHERE app_id = ? AND id = ? RETURNING id
            """, [previousUntil, try secrets.seal(secret), appId, id]).isEmpty
    }

    private func target(_ row: SQLRow) -> WebhookTarget {
        let secret = secrets.unseal(row.string("secret")) ?? ""
        let endpoint = WebhookEndpoint(id: row.string("id") ?? "", appId: row.string("app_id") ?? "", url: row.string("url") ?? "",
                                       eventTypes: (row.string("event_types") ?? "").split(separator: ",").compactMap { WebhookEventType(rawValue: String($0)) },
                                       createdAt: row.int("created_at") ?? 0, secretHint: String(secret.suffix(4)),
                                       previousSecretUntil: row.int("previous_secret_until"),
                                       format: WebhookFormat(rawValue: row.string("format") ?? "") ?? .events)
        return WebhookTarget(endpoint: endpoint, secret: secret, previousSecret: secrets.unseal(row.string("previous_secret")))
    }

    // MARK: The outbox

    /// Reserves the next `count` numbers of a user's event sequence (1, 2, …) and returns the last.
    func reserveSequence(appId: String, appUserId: String, count: Int64) throws -> Int64 {
        try db.query("""
            INSERT INTO webhook_sequences (app_id, app_user_id, sequence) VALUES (?, ?, ?)
            ON CONFLICT (app_id, app_user_id) DO UPDATE SET sequence = webhook_sequences.sequence + excluded.sequence RETURNING sequence
            """, [appId, appUserId, count]).first?.int("sequence") ?? count
    }

    /// Stores events and one delivery per endpoint each, all due now, in two statements (a settlement's events go in one round trip each).
    func insert(events: [(event: StoredWebhookEvent, endpointIds: [String])]) throws {
        for chunk in stride(from: 0, to: events.count, by: 100).map({ Array(events[$0..<min($0 + 100, events.count)]) }) {
            try db.query("INSERT INTO webhook_events (id, app_id, app_user_id, type, sequence, occurred_at, body) VALUES " +
                         Array(repeating: "(?, ?, ?, ?, ?, ?, ?)", count: chunk.count).joined(separator: ", "),
                         chunk.flatMap { item -> [any SQLBindable] in
                             let event = item.event
                             return [event.id, event.appId, event.appUserId, event.type.rawValue, event.sequence, event.occurredAt, event.body]
                         })
            let deliveries = chunk.flatMap { item in item.endpointIds.map { (item.event, $0) } }
            guard !deliveries.isEmpty else { continue }
            try db.query("INSERT INTO webhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, created_at) VALUES " +
                         Array(repeating: "(?, ?, 'pending', 0, ?, ?)", count: deliveries.count).joined(separator: ", "),
                         deliveries.flatMap { event, endpoint -> [any SQLBindable] in [event.id, endpoint, event.occurredAt, event.occurredAt] })
        }
    }

    /// Stores an event and one delivery per endpoint, all due now.
    func insert(event: StoredWebhookEvent, endpointIds: [String]) throws {
        try db.query("INSERT INTO webhook_events (id, app_id, app_user_id, type, sequence, occurred_at, body) VALUES (?, ?, ?, ?, ?, ?, ?)",
                     [event.id, event.appId, event.appUserId, event.type.rawValue, event.sequence, event.occurredAt, event.body])
        for endpoint in endpointIds {
            try db.query("""
                INSERT INTO webhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, created_at) VALUES (?, ?, 'pending', 0, ?, ?)
                """, [event.id, endpoint, event.occurredAt, event.occurredAt])
        }
    }

    func bodies(_ eventIds: [String]) throws -> [String: String] {
        var bodies: [String: String] = [:]
        for chunk in eventIds.chunked(400) {
            let (marks, listed) = InList.padded(chunk)
            for row in try db.query("SELECT id, body FROM webhook_events WHERE id IN (\(marks))", listed) {
                bodies[row.string("id") ?? ""] = row.string("body")
            }
        }
        return bodies
    }

    // MARK: Deliveries

    /// Takes up to `limit` due deliveries for `owner` until `leaseUntil` (a process that dies holding them lets them go then).
    func claim(owner: String, limit: Int, leaseUntil: Int64, now: Int64) throws -> [DueDelivery] {
        let lock = dialect == .postgres ? " FOR UPDATE SKIP LOCKED" : ""
        return try db.query("""
            UPDATE webhook_deliveries SET lease_owner = ?, lease_expires_at = ?
            WHERE (event_id, endpoint_id) IN (
                SELECT event_id, endpoint_id FROM webhook_deliveries
                WHERE state = 'pending' AND next_attempt_at <= ? AND (lease_expires_at IS NULL OR lease_expires_at <= ?)
                ORDER BY next_attempt_at LIMIT ?\(lock))
            RETURNING event_id, endpoint_id, attempts, created_at
            """, [owner, leaseUntil, now, now, limit]).map {
            DueDelivery(eventId: $0.string("event_id") ?? "", endpointId: $0.string("endpoint_id") ?? "", attempts: $0.int("attempts") ?? 0,
                        createdAt: $0.int("created_at") ?? 0)
        }
    }

    /// Logs an attempt and moves the delivery on: `delivered`, `failed`, or `pending` again at `nextAttemptAt`.
    func finish(_ delivery: DueDelivery, attempt: WebhookAttempt, attemptId: String, state: String, nextAttemptAt: Int64, owner: String) throws {
        try db.query("""
            INSERT INTO webhook_attempts (id, event_id, endpoint_id, attempted_at, status, latency_ms, outcome, response_excerpt)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?)
            """, [attemptId, delivery.eventId, delivery.endpointId, attempt.attemptedAt, attempt.status, attempt.latencyMs, attempt.outcome,
                  attempt.responseExcerpt])
        let moved = try db.query("""
            UPDATE webhook_deliveries SET state = ?, attempts = attempts + 1, next_attempt_at = ?, last_status = ?, last_error = ?,
            delivered_at = ?, lease_owner = NULL, lease_expires_at = NULL WHERE event_id = ? AND endpoint_id = ? AND lease_owner = ?
            RETURNING event_id
            """, [state, nextAttemptAt, attempt.status, attempt.outcome == "delivered" ? nil : attempt.outcome,
                  state == "delivered" ? attempt.attemptedAt : nil, delivery.eventId, delivery.endpointId, owner])
        if state == "delivered", !moved.isEmpty { try totals.add(state: "delivered") }
    }

    /// An endpoint's deliveries, newest first, with their attempts.
    func deliveries(endpointId: String, state: String?, limit: Int) throws -> [WebhookDelivery] {
        var sql = "SELECT d.*, e.type, e.app_user_id FROM webhook_deliveries d JOIN webhook_events e ON e.id = d.event_id WHERE d.endpoint_id = ?"
        var parameters: [any SQLBindable] = [endpointId]
        if let state {
            sql += " AND d.state = ?"
            parameters.append(state)
        }
        return try db.query(sql + " ORDER BY d.created_at DESC, d.event_id LIMIT ?", parameters + [limit]).map { row in
            let eventId = row.string("event_id") ?? ""
            let attempts = try db.query("""
                SELECT * FROM webhook_attempts WHERE event_id = ? AND endpoint_id = ? ORDER BY attempted_at, id
                """, [eventId, endpointId]).map {
                WebhookAttempt(attemptedAt: $0.int("attempted_at") ?? 0, status: $0.int("status"), latencyMs: $0.int("latency_ms") ?? 0,
                               outcome: $0.string("outcome") ?? "", responseExcerpt: $0.string("response_excerpt"))
            }
            return WebhookDelivery(eventId: eventId, endpointId: endpointId, type: row.string("type") ?? "", appUserId: row.string("app_user_id") ?? "",
                                   state: row.string("state") ?? "", attempts: row.int("attempts") ?? 0,
                                   nextAttemptAt: row.int("next_attempt_at"), createdAt: row.int("created_at") ?? 0,
                                   deliveredAt: row.int("delivered_at"), lastStatus: row.int("last_status"), lastError: row.string("last_error"),
                                   log: attempts)
        }
    }

    /// Sends a delivery again now, whatever became of it; false when there is no such delivery.
    func redeliver(eventId: String, endpointId: String, now: Int64) throws -> Bool {
        guard let was = try db.query("SELECT state FROM webhook_deliveries WHERE event_id = ? AND endpoint_id = ?" + (dialect == .postgres ? " FOR UPDATE" : ""),
                                     [eventId, endpointId]).first?.string("state") else { return false }
        try db.query("""
            UPDATE webhook_deliveries SET state = 'pending', next_attempt_at = ?, lease_owner = NULL, lease_expires_at = NULL
            WHERE event_id = ? AND endpoint_id = ?
            """, [now, eventId, endpointId])
        if was == "delivered" { try totals.add(-1, state: "delivered") }
        return true
    }

    /// Deliveries per state: `pending` and `failed` counted from their entries in the index on the state, `delivered` (every
    /// delivery that ever succeeded, but for those sent again or erased) from its running total.
    func counts() throws -> [String: Int64] {
        var counts: [String: Int64] = ["pending": 0, "delivered": 0, "failed": 0]
        counts.merge(try totals.totals()) { $1 }
        for row in try db.query("""
            SELECT 'pending' AS state, COUNT(*) AS n FROM webhook_deliveries WHERE state = 'pending'
            UNION ALL SELECT 'failed' AS state, COUNT(*) AS n FROM webhook_deliveries WHERE state = 'failed'
            """) {
            counts[row.string("state") ?? ""] = row.int("n") ?? 0
        }
        return counts
    }

    /// The running totals of deliveries (`delivered`).
    var totals: StateTotalsRepository { StateTotalsRepository(db: db, subject: "webhook_deliveries") }
}
