import AppStoreCrypto
@testable import AppStoreEmulator
import AppStoreModels
import Foundation
import HTTP
@testable import PurchaseServer
import Storage
import StorekeeperTesting
import Testing

@Suite("Verification survives Apple", .serialized)
struct ReliabilityTests {
    @Test("Timeouts, connection errors, 5xx, HTML-with-200, 21005 and retryable 211xx are retried until the purchase is granted",
          arguments: Engine.available)
    func retries(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        world.transport.failures.withLock { $0 = [.timeout, .connection, .http(503), .html] }
        try await world.emulator.addFault(endpoint: "verifyReceipt", environment: .sandbox, behavior: .status(21005), duration: 0.3)
        let (bought, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        let answer = try await world.upload("com.example.coins", user: "alice", receipt: receipt)
        #expect(answer.state == "verified")
        #expect(answer.granted == [bought.id])
        #expect((answer["attempts"] as? Int ?? 0) >= 5)
        #expect(try await world.user("com.example.coins", "alice").balances == ["coins": 100])
    }

    @Test("An Apple answer that does not fit the receipt is rejected at once, not left to wait for its lease")
    func mismatchedAnswerIsRejected() async throws {
        let world = try await ServerWorld.make(.sqlite)
        defer { Task { await world.stop() } }
        world.transport.failures.withLock { $0 = [.rewrite("\"bundle_id\":\"com.example.coins\"", "\"bundle_id\":\"com.example.other\"")] }
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        let answer = try await world.upload("com.example.coins", user: "alice", receipt: receipt)
        #expect(answer.state == "rejected")
        #expect(answer["reason"] as? String == "the App Store's answer is for another bundle id")
        #expect(try await world.user("com.example.coins", "alice").balances.isEmpty)
    }

    @Test("The receipt's text is let go once sent to Apple: asking the other environment reads it again from the job; settling drops it and records its SHA-256",
          arguments: Engine.available)
    func receiptReadAgainForTheOtherEnvironment(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        // The sandbox says "a production receipt" once: the engine asks production with the text read again. The real
        // emulator's production answer (21007, a sandbox receipt) shows the whole receipt arrived (an empty or cut one is 21002).
        world.transport.failures.withLock { $0 = [.rewrite("\"status\":0", "\"status\":21008")] }
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        let redirected = try await world.upload("com.example.coins", user: "alice", receipt: receipt)
        #expect(redirected.state == "rejected")
        #expect((redirected["reason"] as? String ?? "").contains("21007"))
        #expect(world.transport.calls.withLock { $0 } == 2)
        // Settled, verified or rejected, a job keeps its receipt's hash, not its text.
        let (bought, again) = try await world.buy("com.example.coins", "Nada.JPYF01")
        let verified = try await world.upload("com.example.coins", user: "bob", receipt: again)
        #expect(verified.state == "verified")
        #expect(verified.granted.contains(bought.id))
        func row(_ answer: [String: Any]) async throws -> SQLRow? {
            let id = answer["verificationId"] as? String ?? ""
            return try await world.server.store.database.transaction { db in
                try db.query("SELECT r.receipt_data AS receipt_data, receipt_sha256 FROM verification_jobs j LEFT JOIN verification_receipts r ON r.job_id = j.id WHERE j.id = ?", [id]).first
            }
        }
        _ = try await world.server.store.dropSettledReceipts(limit: 100)  // on SQLite, the sweep's next pass
        let rejectedRow = try await row(redirected), verifiedRow = try await row(verified)
        #expect(rejectedRow?.string("receipt_sha256") == Digest.sha256.hash(Array(receipt.utf8)).hexString)
        #expect(rejectedRow != nil && rejectedRow?.string("receipt_data") == nil)
        #expect(verifiedRow?.string("receipt_sha256") == Digest.sha256.hash(Array(again.utf8)).hexString)
        #expect(verifiedRow != nil && verifiedRow?.string("receipt_data") == nil)
    }

    @Test("A retry's kind decides timed_out, never its text", arguments: [(ServerWorldFailure.timeout, "timed_out"), (.connection, "pending"), (.http(503), "pending")])
    func retryKinds(failure: ServerWorldFailure, state: String) async throws {
        let world = try await ServerWorld.make(.sqlite, retry: .init(baseDelay: 600, maxDelay: 600, maxAge: 3600))
        defer { Task { await world.stop() } }
        world.transport.failures.withLock { $0 = [failure.failure] }
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        let job = try await world.server.submit(appId: "com.example.coins", appUserId: "alice", receiptData: receipt, kind: .purchase)
        var seen = job
        try await TestSupport.eventually {
            seen = try #require(try await world.server.store.job(job.id))
            return seen.attempts > 0 && seen.state != .verifying
        }
        #expect(seen.state.rawValue == state)
    }

    @Test("A verification that cannot settle is dead-lettered after its maximum age, and a replay grants it once", arguments: Engine.available)
    func deadLetter(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine, retry: .init(baseDelay: 0.01, maxDelay: 0.02, maxAge: 0.3))
        defer { Task { await world.stop() } }
        try await world.emulator.addFault(endpoint: "verifyReceipt", environment: nil, behavior: .http(503))
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF01")
        var job = try await world.upload("com.example.coins", user: "alice", receipt: receipt)
        #expect(job.state == "dead")
        #expect((job["reason"] as? String)?.contains("gave up") == true)
        let dead = try await world.server.store.jobs(state: .dead, limit: 10)
        #expect(dead.count == 1)
        try await world.emulator.clearFaults()
        let (status, replayed) = try await world.client.json(.post, "/admin/v1/jobs/replay", json: [:], headers: ["Authorization": "Bearer \(ServerWorld.adminKey)"])
        #expect(status == 200 && replayed["replayed"] as? Int == 1)
        let settled = try await world.server.awaitSettlement(dead[0].id, appId: nil, timeout: .seconds(10))
        #expect(settled?.state == .verified)
        job = try await world.user("com.example.coins", "alice")
        #expect(job.balances == ["coins": 20])
    }

    @Test("A worker that lost its lease cannot settle; the job is settled once by the new owner", arguments: Engine.available)
    func leaseTakeover(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine, startWorker: false)
        defer { Task { await world.stop() } }
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        let job = try await world.server.submit(appId: "com.example.coins", appUserId: "alice", receiptData: receipt, kind: .purchase)
        let now = world.server.clock.now()
        let first = try await world.server.store.claim(owner: "crashed", limit: 10, lease: 0.05, now: now)
        #expect(first.map(\.id) == [job.id])
        #expect(try await world.server.store.claim(owner: "other", limit: 10, lease: 30, now: now).isEmpty)
        let taken = try await world.server.store.claim(owner: "survivor", limit: 10, lease: 30, now: now.addingTimeInterval(1))
        #expect(taken.map(\.id) == [job.id])
        let engine = world.server.worker.engine
        #expect(await engine.process(first[0], owner: "crashed") == nil)
        #expect(await engine.process(taken[0], owner: "survivor") == .verified)
        #expect(try await world.user("com.example.coins", "alice").balances == ["coins": 100])
    }

    @Test("A job written claimed by an upload whose process died before verifying it is taken over when the lease lapses, and granted once", arguments: Engine.available)
    func handedJobTakeover(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine, startWorker: false)
        defer { Task { await world.stop() } }
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        let now = world.server.clock.now()
        let job = try await world.server.store.enqueue(appId: "com.example.coins", appUserId: "alice", kind: .purchase, receiptData: receipt,
                                                       lease: .init(owner: "crashed", expiresAt: now.addingTimeInterval(30)), now: now)
        #expect(job.state == .verifying)
        #expect(try await world.server.store.claim(owner: "other", limit: 10, lease: 30, now: now.addingTimeInterval(29)).isEmpty)
        let taken = try await world.server.store.claim(owner: "survivor", limit: 10, lease: 30, now: now.addingTimeInterval(31))
        #expect(taken.map(\.id) == [job.id])
        #expect(taken.first?.receiptData == receipt)
        #expect(taken.first?.attempts == 2)
        let engine = world.server.worker.engine
        #expect(await engine.process(job, owner: "crashed") == nil)
        #expect(await engine.process(taken[0], owner: "survivor") == .verified)
        #expect(try await world.user("com.example.coins", "alice").balances == ["coins": 100])
    }

    @Test("A job whose claims end without an outcome three times is poison: dead, not run again until replayed", arguments: Engine.available)
    func poisonJob(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine, startWorker: false)
        defer { Task { await world.stop() } }
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        let job = try await world.server.submit(appId: "com.example.coins", appUserId: "alice", receiptData: receipt, kind: .purchase)
        var now = world.server.clock.now()
        // Three workers die holding the job (their leases lapse); each claim is counted.
        for crash in 1...3 {
            let claimed = try await world.server.store.claim(owner: "crashed-\(crash)", limit: 10, lease: 1, now: now)
            #expect(claimed.map(\.id) == [job.id])
            now = now.addingTimeInterval(2)
        }
        // The fourth claim finds it poison: nothing to run, the job is dead with the reason.
        #expect(try await world.server.store.claim(owner: "fourth", limit: 10, lease: 30, now: now).isEmpty)
        let dead = try await world.server.store.job(job.id, appId: nil)
        #expect(dead?.state == .dead)
        #expect(dead?.reason?.hasPrefix("poison") == true)
        #expect(try await world.server.store.claim(owner: "fifth", limit: 10, lease: 30, now: now.addingTimeInterval(3600)).isEmpty)
        // An operator's replay runs it again, with a fresh count; it settles once.
        #expect(try await world.server.store.replay(ids: [job.id], now: now) == 1)
        let again = try await world.server.store.claim(owner: "operator", limit: 10, lease: 30, now: now)
        #expect(again.map(\.id) == [job.id])
        #expect(await world.server.worker.engine.process(again[0], owner: "operator") == .verified)
        #expect(try await world.user("com.example.coins", "alice").balances == ["coins": 100])
    }

    @Test("A retried job is not poison: an outcome resets the count", arguments: Engine.available)
    func retriesAreNotPoison(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine, startWorker: false)
        defer { Task { await world.stop() } }
        try await world.emulator.addFault(endpoint: "verifyReceipt", environment: nil, behavior: .http(503))
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF01")
        let job = try await world.server.submit(appId: "com.example.coins", appUserId: "alice", receiptData: receipt, kind: .purchase)
        var now = world.server.clock.now()
        for attempt in 1...5 {
            let claimed = try await world.server.store.claim(owner: "worker", limit: 10, lease: 30, now: now)
            #expect(claimed.map(\.id) == [job.id], "attempt \(attempt)")
            guard let claim = claimed.first else { return }
            #expect(await world.server.worker.engine.process(claim, owner: "worker") != .dead)
            now = now.addingTimeInterval(3600)
        }
    }

    @Test("Apple's final answers are rejections with reasons: wrong shared secret (21004), deleted account (21010)", arguments: Engine.available)
    func finalAnswers(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine) { app in if app.id == "com.example.magazine" { app.sharedSecret = "wrong" } }
        defer { Task { await world.stop() } }
        let (_, magazine) = try await world.buy("com.example.magazine", "com.example.magazine.monthly")
        let secret = try await world.upload("com.example.magazine", user: "u", receipt: magazine)
        #expect(secret.state == "rejected")
        #expect((secret["reason"] as? String)?.contains("21004") == true)
        let (_, coins) = try await world.buy("com.example.coins", "Nada.JPYF01")
        try await world.emulator.deleteAccount(email: ServerWorld.tester)
        let deleted = try await world.upload("com.example.coins", user: "u", receipt: coins)
        #expect(deleted.state == "rejected")
        #expect((deleted["reason"] as? String)?.contains("21010") == true)
    }

    @Test("The backoff doubles with jitter and is capped")
    func backoff() {
        let policy = VerificationEngine.RetryPolicy(baseDelay: 1, maxDelay: 10, maxAge: 100)
        for attempt in Int64(1)...8 {
            let delay = policy.delay(afterAttempt: attempt)
            let nominal = min(pow(2, Double(attempt - 1)), 10)
            #expect(delay >= nominal * 0.5 && delay <= nominal * 1.5)
        }
    }

    @Test("The app API needs a valid key; bad bodies get clear errors", arguments: Engine.available)
    func apiErrors(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let (missing, _) = try await world.client.json(.get, "/v1/users/alice")
        #expect(missing == 401)
        let (wrong, body) = try await world.client.json(.get, "/v1/users/alice", headers: ["Authorization": "Bearer sk_nope"])
        #expect(wrong == 401 && (body["error"] as? [String: Any])?["code"] as? String == "invalid_api_key")
        let auth = ["Authorization": "Bearer \(world.keys["com.example.coins"]!)"]
        let (noReceipt, _) = try await world.client.json(.post, "/v1/receipts", json: ["appUserId": "a"], headers: auth)
        #expect(noReceipt == 400)
        let (noUser, _) = try await world.client.json(.post, "/v1/receipts", json: ["receiptData": "x"], headers: auth)
        #expect(noUser == 400)
        let (notJSON, _) = try await world.client.json(.post, "/v1/receipts", body: Data("{".utf8), headers: auth)
        #expect(notJSON == 400)
        let (adminDenied, _) = try await world.client.json(.get, "/admin/v1/apps", headers: auth)
        #expect(adminDenied == 401)
        let (unknown, _) = try await world.client.json(.get, "/v1/verifications/nope", headers: auth)
        #expect(unknown == 404)
        // Another app's verification is not visible with this key.
        let (_, receipt) = try await world.buy("com.example.football", "GoldenGlobe")
        let other = try await world.upload("com.example.football", user: "p", receipt: receipt)
        let (hidden, _) = try await world.client.json(.get, "/v1/verifications/\(other["verificationId"] as? String ?? "")", headers: auth)
        #expect(hidden == 404)
    }
}

/// The transport failures a test can name as an argument.
enum ServerWorldFailure: Sendable, CustomTestStringConvertible {
    case timeout, connection, http(Int)
    var failure: EmulatorTransport.Failure {
        switch self {
        case .timeout: return .timeout
        case .connection: return .connection
        case .http(let code): return .http(code)
        }
    }
    var testDescription: String { "\(self)" }
}
