import AppStoreCrypto
import Foundation
import HTTP
@testable import PurchaseServer
import SQLiteStorage
import Testing

/// Keys and users as Stripe and RevenueCat have them: the public key ships in the app, the secret key stays
/// on the backend, and a user token names the one user a public key may act for.
@Suite("Keys and user tokens")
struct AuthorizationTests {
    static let secret = "user-token-secret-of-the-backend-0123456789"

    /// A world whose coins app requires user tokens, with a public key.
    static func world(_ engine: Engine, userAuth: UserAuthPolicy = .required, startWorker: Bool = true,
                      policies: @escaping (inout ServerApp) -> Void = { _ in }) async throws -> (ServerWorld, publicKey: String) {
        let world = try await ServerWorld.make(engine, policies: { app in
            app.userAuth = userAuth
            app.userTokenSecret = secret
            policies(&app)
        }, startWorker: startWorker)
        let key = try await world.server.store.createKey(appId: "com.example.coins", label: "app", kind: .public, now: Date())
        return (world, key)
    }


    static func code(_ body: [String: Any]) -> String? { (body["error"] as? [String: Any])?["code"] as? String }

    @Test("A public key acts only for the user of its token", arguments: Engine.available)
    func publicKeyNeedsToken(engine: Engine) async throws {
        let (world, publicKey) = try await Self.world(engine)
        defer { Task { await world.stop() } }
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        func upload(_ user: String, token: String?) async throws -> (Int, [String: Any]) {
            var headers = ["Authorization": "Bearer \(publicKey)"]
            if let token { headers["Storekeeper-User-Token"] = token }
            return try await world.client.json(.post, "/v1/receipts?wait=10", json: ["appUserId": user, "receiptData": receipt], headers: headers)
        }
        let (missing, missingBody) = try await upload("alice", token: nil)
        #expect(missing == 401 && Self.code(missingBody) == "missing_user_token")
        let (mismatch, mismatchBody) = try await upload("alice", token: world.token("mallory"))
        #expect(mismatch == 403 && Self.code(mismatchBody) == "user_mismatch")
        let (ok, job) = try await upload("alice", token: world.token("alice"))
        #expect(ok == 200 && job.state == "verified")

        // Reads: alice's token reads alice, not bob; the secret key reads anyone.
        let read = { (user: String, headers: [String: String]) in try await world.client.json(.get, "/v1/users/\(user)", headers: headers) }
        let (own, view) = try await read("alice", ["Authorization": "Bearer \(publicKey)", "Storekeeper-User-Token": world.token("alice")])
        #expect(own == 200 && view.balances == ["coins": 100])
        let (other, _) = try await read("bob", ["Authorization": "Bearer \(publicKey)", "Storekeeper-User-Token": world.token("alice")])
        #expect(other == 403)
        let (bare, _) = try await read("alice", ["Authorization": "Bearer \(publicKey)"])
        #expect(bare == 401)
        let (backend, _) = try await read("alice", ["Authorization": "Bearer \(world.keys["com.example.coins"]!)"])
        #expect(backend == 200)

        // Spending: the user's own, with its token; reports need the secret key.
        let spendHeaders = ["Authorization": "Bearer \(publicKey)", "Storekeeper-User-Token": world.token("alice"), "Idempotency-Key": "s1"]
        let (spent, spend) = try await world.client.json(.post, "/v1/users/alice/balances/coins/spend", json: ["amount": 30], headers: spendHeaders)
        #expect(spent == 200 && spend["balance"] as? Int == 70)
        let (othersSpend, _) = try await world.client.json(.post, "/v1/users/bob/balances/coins/spend", json: ["amount": 1], headers: spendHeaders)
        #expect(othersSpend == 403)
        let (report, reportBody) = try await world.client.json(.get, "/v1/reports/revenue", headers: ["Authorization": "Bearer \(publicKey)"])
        #expect(report == 403 && Self.code(reportBody) == "secret_key_required")
    }

    @Test("Bad tokens are refused with the rule they break", arguments: [
        ("expired", "user_token_expired"), ("too long-lived", "invalid_user_token"), ("other secret", "invalid_user_token"),
        ("alg none", "invalid_user_token"), ("tampered", "invalid_user_token"), ("junk", "invalid_user_token"), ("NUL in sub", "invalid_user_token"),
        ("huge", "invalid_user_token"),
    ])
    func badTokens(kind: String, expected: String) async throws {
        let (world, publicKey) = try await Self.world(.sqlite)
        defer { Task { await world.stop() } }
        let good = world.token("alice")
        let parts = good.split(separator: ".").map(String.init)
        let token: String
        switch kind {
        case "expired": token = world.token("alice", expiresIn: -120)
        case "too long-lived": token = world.token("alice", expiresIn: 3 * 86400)
        case "other secret": token = world.token("alice", secret: "not-the-backend-secret-at-all-000")
        case "alg none": token = Base64URL.encode(Array(#"{"alg":"none"}"#.utf8)) + "." + parts[1] + "."
        case "tampered": token = parts[0] + "." + Base64URL.encode(Array(#"{"sub":"bob","exp":9999999999}"#.utf8)) + "." + parts[2]
        case "NUL in sub": token = world.token("alice\u{0}bob")
        case "huge": token = String(repeating: "a", count: 100_000)
        default: token = "not.a.jwt"
        }
        let (status, body) = try await world.client.json(.get, "/v1/users/alice",
                                                         headers: ["Authorization": "Bearer \(publicKey)", "Storekeeper-User-Token": token])
        #expect(status == 401, "\(kind)")
        #expect(Self.code(body) == expected, "\(kind)")
    }

    @Test("An ES256 token signed with the registered public key is accepted")
    func es256() async throws {
        let signer = try PrivateKey.generateEC()
        let (world, publicKey) = try await Self.world(.sqlite) { app in app.userTokenPublicKey = signer.publicKey.pem }
        defer { Task { await world.stop() } }
        let claims = Array(#"{"sub":"alice","exp":\#(Int(world.server.clock.now().timeIntervalSince1970) + 600)}"#.utf8)
        let token = try JWS.sign(payload: claims, key: signer)
        let (status, _) = try await world.client.json(.get, "/v1/users/alice", headers: ["Authorization": "Bearer \(publicKey)", "Storekeeper-User-Token": token])
        #expect(status == 200)
    }

    @Test("Under optional user auth a public key alone still works, but never matches the sandbox allow-list", arguments: Engine.available)
    func optionalAndAllowList(engine: Engine) async throws {
        let (world, publicKey) = try await Self.world(engine, userAuth: .optional) { app in
            app.sandboxPolicy = .allowList
            app.sandboxAllowList = ["app-review"]
        }
        defer { Task { await world.stop() } }
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF01")
        let (status, claimed) = try await world.client.json(.post, "/v1/receipts?wait=10", json: ["appUserId": "app-review", "receiptData": receipt],
                                                           headers: ["Authorization": "Bearer \(publicKey)"])
        #expect(status == 200 && claimed.state == "rejected")
        #expect((claimed["reason"] as? String)?.contains("allow-list") == true)
        // The backend (secret key) or the user's token vouch for the user: then the allow-list applies.
        let (_, again) = try await world.buy("com.example.coins", "Nada.JPYF02")
        let (_, vouched) = try await world.client.json(.post, "/v1/receipts?wait=10", json: ["appUserId": "app-review", "receiptData": again],
                                                       headers: ["Authorization": "Bearer \(publicKey)", "Storekeeper-User-Token": world.token("app-review")])
        #expect(vouched.state == "verified")
    }

    @Test("Revoked keys are refused; a revocation by another process is seen on the next refresh; rotation keeps the old key for its grace",
          arguments: Engine.available)
    func revocation(engine: Engine) async throws {
        // No worker: its reload of the keys every second would make "not refused before the refresh" a race.
        let (world, publicKey) = try await Self.world(engine, startWorker: false)
        defer { Task { await world.stop() } }
        let admin = ["Authorization": "Bearer \(ServerWorld.adminKey)"]
        let store = world.server.store
        let (_, listed) = try await world.client.send(.get, "/admin/v1/apps/com.example.coins/keys", headers: admin).jsonArray()
        #expect(listed.count == 2)
        #expect(listed.allSatisfy { ($0["hint"] as? String)?.count == 4 })
        let publicId = try #require(store.liveKey(publicKey, now: world.server.clock.now())?.id)

        // Rotation with a grace period: both work, then only the new one.
        let (rotated, rotation) = try await world.client.json(.post, "/admin/v1/apps/com.example.coins/keys/\(publicId)/rotate",
                                                              json: ["graceSeconds": 60], headers: admin)
        #expect(rotated == 201)
        let newKey = try #require(rotation["apiKey"] as? String)
        #expect(newKey.hasPrefix("pk_"))
        #expect(store.liveKey(publicKey, now: world.server.clock.now()) != nil)
        #expect(store.liveKey(publicKey, now: world.server.clock.now().addingTimeInterval(61)) == nil)
        #expect(store.liveKey(newKey, now: world.server.clock.now().addingTimeInterval(61)) != nil)

        // Revoked now, over the admin API: refused at once.
        let (revoked, _) = try await world.client.json(.delete, "/admin/v1/apps/com.example.coins/keys/\(publicId)", headers: admin)
        #expect(revoked == 200)
        let (refused, body) = try await world.client.json(.get, "/v1/users/alice", headers: ["Authorization": "Bearer \(publicKey)"])
        #expect(refused == 401 && Self.code(body) == "invalid_api_key")

        // Another process revokes the secret key in the shared database: this one refuses it after its refresh.
        let secretKey = world.keys["com.example.coins"]!
        _ = try await store.database.transaction { db in
            try db.query("UPDATE api_keys SET revoked_at = ? WHERE key_hash = ?", [ReceiptDateNow.ms(world), APIKey.hash(secretKey)])
        }
        #expect(store.liveKey(secretKey, now: world.server.clock.now()) != nil)
        try await store.refreshKeys(now: world.server.clock.now())
        #expect(store.liveKey(secretKey, now: world.server.clock.now()) == nil)
    }

    @Test("A key made or revoked while the keys are reloaded works, or is refused, at once: the reload does not put back what it read before",
          arguments: Engine.available)
    func reloadDuringChange(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine, startWorker: false)
        defer { Task { await world.stop() } }
        let store = world.server.store
        var missing = 0, revived = 0
        for _ in 0..<40 {
            let now = world.server.clock.now()
            async let reloaded: Void = store.refreshKeys(now: now)
            let key = try await store.createKey(appId: "com.example.coins", label: nil, now: now)
            try await reloaded
            guard let id = store.liveKey(key, now: now)?.id else {
                missing += 1
                continue
            }
            async let reloadedAgain: Void = store.refreshKeys(now: now)
            _ = try await store.revokeKey(appId: "com.example.coins", id: id, effective: now, now: now)
            try await reloadedAgain
            if store.liveKey(key, now: now) != nil { revived += 1 }
        }
        #expect(missing == 0, "new keys refused until the next reload")
        #expect(revived == 0, "revoked keys working until the next reload")
    }
}

extension ServerWorld {
    /// A user token minted by the backend, judged by the server's clock (the emulator's, which tests move).
    func token(_ user: String, expiresIn: TimeInterval = 3600, secret: String = AuthorizationTests.secret) -> String {
        UserToken.mint(subject: user, expiresIn: expiresIn, secret: secret, now: server.clock.now())
    }
}

enum ReceiptDateNow {
    static func ms(_ world: ServerWorld) -> Int64 { Int64(world.server.clock.now().timeIntervalSince1970 * 1000) }
}

extension Response {
    /// The status and the JSON array answered.
    func jsonArray() throws -> (Int, [[String: Any]]) {
        (status.code, (try JSONSerialization.jsonObject(with: body)) as? [[String: Any]] ?? [])
    }
}

@Suite("Review findings stay fixed")
struct ReviewFindingTests {
    @Test("Slashes cannot sidestep a prefix check: //admin, trailing slashes", arguments: [
        ("//admin/v1/apps", "/admin/v1/apps"), ("/v1/receipts/", "/v1/receipts"), ("///v1//users//alice/", "/v1/users/alice"), ("/", "/"),
        ("/health", "/health"),
    ])
    func canonicalPaths(raw: String, canonical: String) {
        #expect(Request(method: .get, target: raw + "?a=b").path == canonical)
        #expect(Request.canonical(raw) == canonical)
    }

    @Test("An upload spelled with extra slashes meets the same admission", arguments: Engine.available)
    func admissionSeesCanonicalPaths(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let (status, body) = try await world.client.json(.get, "//admin/v1/apps", headers: ["Authorization": "Bearer "])
        #expect(status == 401 && AuthorizationTests.code(body) == "invalid_admin_key")
        let (wrong, _) = try await world.client.json(.post, "/v1/receipts/", json: ["appUserId": "a", "receiptData": "AAAA"])
        #expect(wrong == 401)
    }

    @Test("aud must be, or list only strings including, the app id")
    func audience() throws {
        let app = ServerApp(id: "com.example.a", userTokenSecret: AuthorizationTests.secret)
        let now = Date()
        func token(_ aud: String) -> String {
            let header = Base64URL.encode(Array(#"{"alg":"HS256"}"#.utf8))
            let claims = Base64URL.encode(Array(#"{"sub":"alice","exp":\#(Int(now.timeIntervalSince1970) + 600),"aud":\#(aud)}"#.utf8))
            return header + "." + claims + "." + Base64URL.encode(HMAC.sha256(key: Array(AuthorizationTests.secret.utf8), message: Array((header + "." + claims).utf8)))
        }
        #expect(try UserToken(token(#""com.example.a""#), app: app, now: now).subject == "alice")
        #expect(try UserToken(token(#"["com.example.b","com.example.a"]"#), app: app, now: now).subject == "alice")
        for bad in [#""com.other""#, #"["com.other"]"#, #"{"x":1}"#, #"["com.example.a",1]"#, "7"] {
            #expect(throws: ServerError.self) { try UserToken(token(bad), app: app, now: now) }
        }
    }

    @Test("A process with another master key refuses to start; secrets are sealed at rest")
    func masterKey() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("master-\(UUID().uuidString).sqlite").path
        func open(_ key: [UInt8]?) async throws -> PurchaseServer {
            var configuration = PurchaseServer.Configuration(trust: TrustStore(certificates: []), endpoints: .apple,
                                                             transport: RefusingTransport(), adminKey: "sk_admin_test_key_0000")
            configuration.secrets = try key.map { try SecretBox(key: $0) }
            return try await PurchaseServer.open(database: try SQLiteSQLDatabase(path: path), configuration: configuration)
        }
        let key = SecretBox.generateKey()
        let first = try await open(key)
        try await first.store.createApp(ServerApp(id: "com.example.a", sharedSecret: "the-shared-secret-42"), now: Date())
        let raw = try await first.store.database.transaction { db in try db.query("SELECT shared_secret FROM apps").first?.string("shared_secret") }
        #expect(raw?.hasPrefix("v1:") == true)
        #expect(try await first.store.app("com.example.a")?.sharedSecret == "the-shared-secret-42")
        await first.store.database.close()
        await #expect { _ = try await open(SecretBox.generateKey()) } throws: { ($0 as? ServerError)?.code.rawValue == "master_key_mismatch" }
        await #expect { _ = try await open(nil) } throws: { ($0 as? ServerError)?.code.rawValue == "master_key_mismatch" }
        let again = try await open(key)
        #expect(try await again.store.app("com.example.a")?.sharedSecret == "the-shared-secret-42")
        await again.store.database.close()
    }

    @Test("An app is read beside SQLite's writer: a write transaction held open does not hold up the app's reads",
          .timeLimit(.minutes(1)))
    func appReadsDoNotWaitForTheWriter() async throws {
        let scratch = try await SQLiteScratch("app-read")
        defer { scratch.remove() }
        let (database, store) = (scratch.database, scratch.store)
        try await store.createApp(ServerApp(id: "com.example.a", sharedSecret: "the-shared-secret-42"), now: Date())
        // The writer, held until the reads are done or ten seconds pass: it tells which came first. It says when it holds
        // the transaction through a stream, so no thread of the shared pool is blocked waiting for it.
        let (entered, holding) = AsyncStream<Void>.makeStream()
        let readsDone = DispatchSemaphore(value: 0)
        let writer = Task {
            try await database.transaction { db -> Bool in
                defer { holding.finish() }
                try db.run("UPDATE apps SET name = 'renamed, not committed yet' WHERE id = ?", ["com.example.a"])
                holding.yield()
                return readsDone.wait(timeout: .now() + 10) == .success
            }
        }
        defer { readsDone.signal() }  // a read that throws lets the writer go at once
        var holds = entered.makeAsyncIterator()
        try #require(await holds.next() != nil, "the write transaction never began")
        let app = try await store.app("com.example.a")
        let apps = try await store.apps()
        let cached = try await store.cachedApp("com.example.a")
        readsDone.signal()
        #expect(try await writer.value, "the reads waited for the writer's transaction to end")
        // The last commit, not the writer's change in progress.
        #expect(app?.sharedSecret == "the-shared-secret-42" && app?.name != "renamed, not committed yet")
        #expect(apps.map(\.id) == ["com.example.a"])
        #expect(cached?.id == "com.example.a")
        await database.close()
    }

    @Test("The app cache drops a read that began before a change, and what it remembers expires after its lifetime")
    func appCacheRule() {
        let start = Date(timeIntervalSince1970: 1_800_000_000)
        let old = ServerApp(id: "com.example.a", sharedSecret: "the-first-secret-000")
        var cache = AppCache()
        // A read begins (taking the generation), the app changes meanwhile, the read ends: not remembered.
        let readBegan = cache.generation
        cache.forget()
        cache.remember(old, readAt: start, generation: readBegan)
        cache.remember(all: [old], readAt: start, generation: readBegan)
        #expect(cache.app("com.example.a", at: start) == nil)
        #expect(cache.apps(at: start) == nil)
        // A read begun after the change is remembered, until its lifetime is over.
        cache.remember(old, readAt: start, generation: cache.generation)
        cache.remember(all: [old], readAt: start, generation: cache.generation)
        #expect(cache.app("com.example.a", at: start.addingTimeInterval(AppCache.lifetime - 0.001)) == old)
        #expect(cache.apps(at: start.addingTimeInterval(AppCache.lifetime - 0.001)) == [old])
        #expect(cache.app("com.example.a", at: start.addingTimeInterval(AppCache.lifetime)) == nil)
        #expect(cache.apps(at: start.addingTimeInterval(AppCache.lifetime)) == nil)
        #expect(cache.app("com.example.other", at: start) == nil)
        // A change forgets both.
        cache.forget()
        #expect(cache.app("com.example.a", at: start) == nil && cache.apps(at: start) == nil)
    }

    @Test("A changed app is what the cache gives at once, by id and by bundle id")
    func appCacheFollowsChanges() async throws {
        let scratch = try await SQLiteScratch("app-cache")
        defer { scratch.remove() }
        let store = scratch.store
        try await store.createApp(ServerApp(id: "com.example.a", sharedSecret: "the-first-secret-000"), now: Date())
        #expect(try await store.cachedApp("com.example.a")?.sharedSecret == "the-first-secret-000")
        #expect(try await store.cachedApp(forBundle: "com.example.b") == nil)
        var changed = try #require(try await store.app("com.example.a"))
        changed.sharedSecret = "the-second-secret-00"
        changed.bundleIds = ["com.example.a", "com.example.b"]
        try await store.updateApp(changed)
        #expect(try await store.cachedApp("com.example.a")?.sharedSecret == "the-second-secret-00")
        #expect(try await store.cachedApp(forBundle: "com.example.b")?.id == "com.example.a")
        try await store.createApp(ServerApp(id: "com.example.c"), now: Date())
        #expect(try await store.cachedApp(forBundle: "com.example.c")?.id == "com.example.c")
        await scratch.database.close()
    }
}

/// A transport that never reaches Apple.
struct RefusingTransport: HTTPTransport {
    func post(_ url: URL, body: [UInt8], timeout: TimeInterval) async throws -> (status: Int, contentType: String?, body: Data) {
        throw URLError(.cannotConnectToHost)
    }
}
