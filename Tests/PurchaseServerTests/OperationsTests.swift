@testable import AppStoreEmulator
import Foundation
import HTTP
@testable import PurchaseServer
import StorekeeperTesting
import Testing

/// What operators run on: health, readiness, metrics (each definition checked against what happened), request ids.
@Suite("Operations", .serialized)
struct OperationsTests {
    static let admin = ["Authorization": "Bearer \(ServerWorld.adminKey)"]

    /// The samples of a Prometheus text exposition, `name{labels}` → value; every line must parse.
    static func samples(_ text: String) -> [String: Double] {
        var samples: [String: Double] = [:]
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else {
                Issue.record("not a sample line: \(line)")
                continue
            }
            samples[String(line[..<space])] = value
        }
        return samples
    }

    static func metrics(_ world: ServerWorld) async throws -> [String: Double] {
        let response = try await world.client.send(.get, "/metrics", headers: admin)
        #expect(response.status == .ok)
        #expect(response.headers["Content-Type"]?.hasPrefix("text/plain; version=0.0.4") == true)
        return samples(String(decoding: response.body, as: UTF8.self))
    }

    @Test("Each metric counts what happened: requests by route template, Apple's answers, jobs by state, notifications, webhooks")
    func metricDefinitions() async throws {
        let world = try await ServerWorld.make(.sqlite)
        defer { Task { await world.stop() } }
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        _ = try await world.upload("com.example.coins", user: "alice", receipt: receipt)
        _ = try await world.user("com.example.coins", "alice")
        _ = try await world.user("com.example.coins", "bob")
        let (unknown, _) = try await world.client.json(.get, "/nowhere/at/all")
        #expect(unknown == 404)
        let (refused, _) = try await world.client.json(.post, "/v1/notifications/apple", json: ["signedPayload": "not.a.jws"])
        #expect(refused == 400)
        for invented in ["XYZ1", "XYZ2", "XYZ3"] { _ = try await world.client.send(HTTPMethod(rawValue: invented), "/healthz") }
        // Refused at the edge, before any handler: counted under the route that would have answered.
        let (unknownKey, _) = try await world.client.json(.get, "/v1/users/alice", headers: ["Authorization": "Bearer sk_not_a_key"])
        #expect(unknownKey == 401)
        let (tooLarge, _) = try await world.client.json(.post, "/v1/notifications/apple", json: ["signedPayload": String(repeating: "a", count: 70_000)])
        #expect(tooLarge == 413)

        let samples = try await Self.metrics(world)
        // Route templates, not paths: two users are one series.
        #expect(samples[#"storekeeper_http_requests_total{route="/v1/users/:user",method="GET",status="200"}"#] == 2)
        #expect(samples[#"storekeeper_http_requests_total{route="/v1/receipts",method="POST",status="200"}"#] == 1)
        #expect(samples[#"storekeeper_http_requests_total{route="unmatched",method="GET",status="404"}"#] == 1)
        #expect(samples[#"storekeeper_http_requests_total{route="/v1/users/:user",method="GET",status="401"}"#] == 1)
        #expect(samples[#"storekeeper_http_requests_total{route="/v1/notifications/apple",method="POST",status="413"}"#] == 1)
        // Methods a client invents are one series, not one each.
        #expect(samples[#"storekeeper_http_requests_total{route="unmatched",method="OTHER",status="405"}"#] == 3)
        #expect(!samples.keys.contains { $0.contains("XYZ") })
        // Answers the route gave are timed; the refusal at the edge is not.
        #expect(samples[#"storekeeper_http_request_duration_seconds_count{route="/v1/users/:user",method="GET"}"#] == 2)
        #expect(samples[#"storekeeper_http_request_duration_seconds_bucket{route="/v1/users/:user",method="GET",le="+Inf"}"#] == 2)
        // The receipt says it is a sandbox one, so the sandbox is asked first, once.
        #expect(samples[#"storekeeper_apple_calls_total{endpoint="verifyReceipt",environment="Sandbox",outcome="status_0"}"#] == 1)
        #expect(samples.keys.filter { $0.hasPrefix("storekeeper_apple_calls_total") }.count == 1)
        #expect(samples[#"storekeeper_apple_call_duration_seconds_count{endpoint="verifyReceipt",environment="Sandbox"}"#] == 1)
        #expect(samples[#"storekeeper_verification_jobs{state="verified"}"#] == 1)
        #expect(samples[#"storekeeper_verification_jobs{state="pending"}"#] == 0)
        #expect(samples["storekeeper_verification_oldest_waiting_seconds"] == 0)
        #expect(samples[#"storekeeper_notifications_total{outcome="refused"}"#] == 1)
        #expect(samples[#"storekeeper_webhook_deliveries{state="pending"}"#] == 0)
        #expect(samples["storekeeper_verifications_in_flight"] == 0)
        // SQLite's writer was in transactions for the upload and its settlement: a positive total, which only grows.
        let busy = try #require(samples["storekeeper_database_writer_busy_seconds_total"])
        #expect(busy > 0 && busy < 60)
        _ = try await world.upload("com.example.coins", user: "carol", receipt: receipt)
        #expect(try await Self.metrics(world)["storekeeper_database_writer_busy_seconds_total"].map { $0 > busy } == true)
        let text = String(decoding: try await world.client.send(.get, "/metrics", headers: Self.admin).body, as: UTF8.self)
        #expect(text.contains("# TYPE storekeeper_database_writer_busy_seconds_total counter\n"))
    }

    @Test("A waiting verification shows in the backlog gauges; webhook attempts are counted by outcome")
    func backlogAndWebhooks() async throws {
        let world = try await ServerWorld.make(.sqlite, startWorker: false)
        defer { Task { await world.stop() } }
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        let (status, _) = try await world.client.json(.post, "/v1/receipts", json: ["appUserId": "alice", "receiptData": receipt],
                                                      headers: ["Authorization": "Bearer \(world.keys["com.example.coins"]!)"])
        #expect(status == 202)
        try await Task.sleep(for: .milliseconds(1100))
        var samples = try await Self.metrics(world)
        #expect(samples[#"storekeeper_verification_jobs{state="pending"}"#] == 1)
        #expect((samples["storekeeper_verification_oldest_waiting_seconds"] ?? 0) >= 1)

        let receiver = try WebhookReceiver(failures: 1)
        defer { Task { await receiver.server.shutdown(grace: .zero) } }
        _ = try await WebhookTests.addEndpoint(world, "com.example.coins", url: receiver.url)
        let worker = world.server.runWorker()
        defer { worker.cancel() }
        try await receiver.wait(for: 2)
        try await TestSupport.eventually {
            samples = try await Self.metrics(world)
            return samples[#"storekeeper_webhook_deliveries{state="delivered"}"#] == 2
        }
        #expect(samples[#"storekeeper_webhook_attempts_total{outcome="http_status"}"#] == 1)
        #expect(samples[#"storekeeper_webhook_attempts_total{outcome="delivered"}"#] == 2)
        #expect(samples[#"storekeeper_webhook_deliveries{state="delivered"}"#] == 2)
    }

    @Test("/healthz always, /readyz only with the worker running, /metrics only with the admin key")
    func healthAndReadiness() async throws {
        let world = try await ServerWorld.make(.sqlite, startWorker: false)
        defer { Task { await world.stop() } }
        #expect(try await world.client.json(.get, "/healthz").0 == 200)
        let (notReady, body) = try await world.client.json(.get, "/readyz")
        #expect(notReady == 503 && body["ready"] as? Bool == false && body["database"] as? String == "ok")
        let worker = world.server.runWorker()
        defer { worker.cancel() }
        // The worker starts a few task hops later; then the cached answer (a second) must age out.
        try await TestSupport.eventually { world.server.worker.isRunning }
        try await Task.sleep(for: .milliseconds(1100))
        let (ready, readyBody) = try await world.client.json(.get, "/readyz")
        #expect(ready == 200 && readyBody["schemaVersion"] as? Int == readyBody["expectedSchemaVersion"] as? Int)
        #expect(try await world.client.send(.get, "/metrics").status.code == 401)
        #expect(try await world.client.send(.get, "/metrics", headers: ["Authorization": "Bearer \(world.keys["com.example.coins"]!)"]).status.code == 401)
        let operations = InProcessClient(PurchaseServerResponder.operations(world.server))
        #expect(try await operations.send(.get, "/metrics").status == .ok)
    }

    @Test("X-Request-Id is echoed when it is sane and made up otherwise")
    func requestIds() async throws {
        let world = try await ServerWorld.make(.sqlite, startWorker: false)
        defer { Task { await world.stop() } }
        let echoed = try await world.client.send(.get, "/healthz", headers: ["X-Request-Id": "req-42.a:b_c"])
        #expect(echoed.headers["X-Request-Id"] == "req-42.a:b_c")
        for bad in ["", String(repeating: "a", count: 129), "two words", "new\nline", "é"] {
            let made = try await world.client.send(.get, "/healthz", headers: ["X-Request-Id": bad])
            #expect(made.headers["X-Request-Id"] != bad && UUID(uuidString: made.headers["X-Request-Id"] ?? "") != nil)
        }
    }
}
