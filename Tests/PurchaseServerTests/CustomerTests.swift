@testable import AppStoreEmulator
import Foundation
import HTTP
@testable import PurchaseServer
import StorekeeperTesting
import Testing

/// What support does: find a customer, read their timeline, grant and revoke promotional entitlements,
/// adjust balances, delete a customer on request.
@Suite("Customer tools", .serialized)
struct CustomerTests {
    static let admin = ["Authorization": "Bearer \(ServerWorld.adminKey)"]

    static func entitlement(_ view: [String: Any], _ id: String) -> [String: Any]? {
        (view["entitlements"] as? [[String: Any]])?.first { $0["id"] as? String == id }
    }

    @Test("A promotional entitlement is granted for a while, shows as promotional, expires, is revoked, and each change is announced",
          arguments: Engine.available)
    func promotional(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let receiver = try WebhookReceiver()
        defer { Task { await receiver.server.shutdown(grace: .zero) } }
        _ = try await WebhookTests.addEndpoint(world, "com.example.magazine", url: receiver.url)
        let path = "/admin/v1/apps/com.example.magazine/users/carol/entitlements/magazine"
        let (status, granted) = try await world.client.json(.post, path, json: ["durationDays": 30, "reason": "sorry for the outage"], headers: Self.admin)
        #expect(status == 200)
        let grant = try #require(Self.entitlement(granted, "magazine"))
        #expect(grant["source"] as? String == "promotional" && grant["active"] as? Bool == true)
        let expires = try #require(grant["expiresDate"] as? Int64)
        #expect(abs(expires - (world.server.clock.now().milliseconds + 30 * 86_400_000)) < 5000)
        // The app sees it too.
        #expect(Self.entitlement(try await world.user("com.example.magazine", "carol"), "magazine")?["active"] as? Bool == true)

        for bad in [["durationDays": 0, "reason": "x"], ["durationDays": 36_501, "reason": "x"], ["durationDays": 3, "expiresDate": expires, "reason": "x"],
                    ["expiresDate": 1000, "reason": "x"], ["durationDays": 3, "reason": ""], ["durationDays": 3, "reason": "bad\u{0}"]] as [[String: Any]] {
            #expect(try await world.client.json(.post, path, json: bad, headers: Self.admin).0 == 400, "\(bad)")
        }
        _ = try await world.emulator.advanceTime(by: 31 * 86_400)
        #expect(Self.entitlement(try await world.user("com.example.magazine", "carol"), "magazine")?["active"] as? Bool == false)

        let (regranted, _) = try await world.client.json(.post, path, json: ["reason": "lifetime, for the beta testers"], headers: Self.admin)
        #expect(regranted == 200)
        #expect(Self.entitlement(try await world.user("com.example.magazine", "carol"), "magazine")?["active"] as? Bool == true)
        let (revoked, after) = try await world.client.json(.delete, path, json: ["reason": "beta over"], headers: Self.admin)
        #expect(revoked == 200 && Self.entitlement(after, "magazine") == nil)
        #expect(try await world.client.json(.delete, path, headers: Self.admin).0 == 404)

        try await receiver.wait(for: 3)
        let events = receiver.events.values.sorted { ($0["sequence"] as? Int ?? 0) < ($1["sequence"] as? Int ?? 0) }
        #expect(events.map { $0["type"] as? String } == ["ENTITLEMENT_GRANTED", "ENTITLEMENT_GRANTED", "ENTITLEMENT_REVOKED"])
        #expect(events.map { $0["reason"] as? String } == ["sorry for the outage", "lifetime, for the beta testers", "beta over"])
        #expect(events.allSatisfy { $0["entitlement"] as? String == "magazine" && $0["appUserId"] as? String == "carol" })
    }

    @Test("Balance adjustments: once per key, never below zero, audited with the reason", arguments: Engine.available)
    func adjustments(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        func adjust(_ amount: Int64, key: String, reason: String = "goodwill") async throws -> (Int, [String: Any]) {
            try await world.client.json(.post, "/admin/v1/apps/com.example.coins/users/dave/balances/coins/adjust",
                                        json: ["amount": amount, "reason": reason], headers: Self.admin.merging(["Idempotency-Key": key]) { $1 })
        }
        let (first, body) = try await adjust(50, key: "a1")
        #expect(first == 200 && body["balance"] as? Int64 == 50 && body["replayed"] as? Bool == false)
        let (again, replay) = try await adjust(50, key: "a1")
        #expect(again == 200 && replay["balance"] as? Int64 == 50 && replay["replayed"] as? Bool == true)
        #expect(try await adjust(70, key: "a1").0 == 409)    // the key, reused for another amount
        #expect(try await adjust(-60, key: "a2").0 == 409)   // below zero
        #expect(try await adjust(-20, key: "a3").1["balance"] as? Int64 == 30)
        #expect(try await adjust(0, key: "a4").0 == 400)
        #expect(try await adjust(.min, key: "a6").0 == 400)    // abs(Int64.min) would trap
        #expect(try await adjust(.max, key: "a7").0 == 400)
        #expect(try await adjust(-5, key: "a5", reason: "").0 == 400)
        #expect(try await world.client.json(.post, "/admin/v1/apps/com.example.coins/users/dave/balances/coins/adjust",
                                            json: ["amount": 5, "reason": "no key"], headers: Self.admin).0 == 400)
        #expect((try await world.user("com.example.coins", "dave")["balances"] as? [String: Any])?["coins"] as? Int64 == 30)
        let audit = try await world.server.store.auditEvents(appId: "com.example.coins", appUserId: "dave")
        #expect(audit.filter { $0["kind"] == "balance_adjusted" }.count == 2)
        #expect(audit.allSatisfy { $0["kind"] != "balance_adjusted" || ($0["detail"] ?? "").contains("goodwill") })
    }

    @Test("Search by user id prefix, transaction id and original transaction id; the timeline pages through everything once",
          arguments: Engine.available)
    func searchAndTimeline(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        if engine == .postgres {
            // Byte order (C) lets the search seek a range around the prefix; a linguistic collation (Slovak's, where "ch" is
            // one letter after "h") does not: a user id that starts with the prefix can sort past that range, so only LIKE
            // may decide there. The search below runs under Slovak's.
            func order(_ collation: String) async throws -> Bool {
                try await world.server.store.database.transaction { db in
                    try db.run("ALTER TABLE users ALTER COLUMN app_user_id TYPE TEXT COLLATE \"\(collation)\"", [])
                    return try CustomerRepository.idsSortByCodePoint(db, dialect: .postgres)
                }
            }
            #expect(try await order("C"))
            #expect(try await order("ucs_basic"))
            #expect(try await !order("en-x-icu"))
            #expect(try await !order("sk-x-icu"))
        }
        let (bought, receipt) = try await world.buy("com.example.coins", "Nada.JPYF02")
        _ = try await world.upload("com.example.coins", user: "alice_100%", receipt: receipt)
        _ = try await world.upload("com.example.coins", user: "alice_100%", receipt: receipt)
        _ = try await world.emulator.refund(transactionId: bought.id)
        let refunded = try await world.emulator.appReceipt(bundleId: "com.example.coins", deviceId: world.device, refresh: true)!.base64EncodedString()
        _ = try await world.upload("com.example.coins", user: "alice_100%", receipt: refunded)
        _ = try await world.client.json(.post, "/admin/v1/apps/com.example.coins/users/alicia/balances/coins/adjust",
                                        json: ["amount": 5, "reason": "welcome", "idempotencyKey": "w"], headers: Self.admin)

        func search(_ query: String) async throws -> [String] {
            let response = try await world.client.send(.get, "/admin/v1/apps/com.example.coins/customers?query=" +
                                                       (query.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? query), headers: Self.admin)
            #expect(response.status == .ok)
            let list = (try JSONSerialization.jsonObject(with: response.body)) as? [[String: Any]] ?? []
            return list.map { "\($0["appUserId"] ?? "") \($0["matchedBy"] ?? "")" }
        }
        _ = try await world.client.json(.post, "/admin/v1/apps/com.example.coins/users/chris/balances/coins/adjust",
                                        json: ["amount": 1, "reason": "welcome", "idempotencyKey": "c"], headers: Self.admin)
        #expect(try await search("c") == ["chris appUserId"])
        #expect(try await search("ali") == ["alice_100% appUserId", "alicia appUserId"])
        #expect(try await search("alice_") == ["alice_100% appUserId"])   // _ is not a wildcard
        #expect(try await search("alice_100%") == ["alice_100% appUserId"])
        #expect(try await search("alice_1%") == [])                      // a literal %, not "anything"
        #expect(try await search("a%") == [])                             // nor is %
        #expect(try await search(bought.id) == ["alice_100% transactionId"])
        #expect(try await search("nobody") == [])
        #expect(try await world.client.send(.get, "/admin/v1/apps/com.example.coins/customers?query=", headers: Self.admin).status.code == 400)

        let user = "alice_100%".addingPercentEncoding(withAllowedCharacters: .alphanumerics)!
        let (_, whole) = try await world.client.json(.get, "/admin/v1/apps/com.example.coins/users/\(user)/timeline?limit=500", headers: Self.admin)
        let all = try #require(whole["items"] as? [[String: Any]])
        let kinds = all.compactMap { $0["kind"] as? String }
        #expect(kinds.contains("purchase") && kinds.contains("refund") && kinds.filter { $0 == "verification" }.count == 3 && kinds.contains("audit"))
        let times = all.compactMap { $0["at"] as? Int64 }
        #expect(times == times.sorted(by: >))
        var paged: [String] = []
        var cursor: String?
        repeat {
            let target = "/admin/v1/apps/com.example.coins/users/\(user)/timeline?limit=2" + (cursor.map { "&cursor=\($0)" } ?? "")
            let (status, page) = try await world.client.json(.get, target, headers: Self.admin)
            #expect(status == 200)
            paged += (page["items"] as? [[String: Any]] ?? []).map { "\($0["kind"] ?? "") \($0["id"] ?? "")" }
            cursor = page["next"] as? String
        } while cursor != nil && paged.count < 100
        #expect(paged == all.map { "\($0["kind"] ?? "") \($0["id"] ?? "")" })
        #expect(try await world.client.json(.get, "/admin/v1/apps/com.example.coins/users/\(user)/timeline?cursor=x", headers: Self.admin).0 == 400)
    }

    @Test("Deleting a customer leaves a tombstone: nothing of them is found, the ledger's amounts and the revenue report stay", arguments: Engine.available)
    func deletion(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let (_, receipt) = try await world.buy("com.example.football", "GoldenGlobe")
        _ = try await world.upload("com.example.football", user: "erin@example.com", receipt: receipt)
        let window = (from: Date(timeIntervalSince1970: 0), to: Date(timeIntervalSince1970: 4_000_000_000))
        let before = try await world.server.store.revenue(appId: "com.example.football", from: window.from, to: window.to, group: [])
        let (status, body) = try await world.client.json(.delete, "/admin/v1/apps/com.example.football/users/erin@example.com", headers: Self.admin)
        #expect(status == 200)
        let tombstone = try #require(body["tombstone"] as? String)
        #expect(tombstone.hasPrefix("deleted-") && !tombstone.contains("erin"))
        let after = try await world.server.store.revenue(appId: "com.example.football", from: window.from, to: window.to, group: [])
        #expect(after.totals == before.totals && after.rows == before.rows)
        let view = try await world.user("com.example.football", "erin@example.com")
        #expect((view["entitlements"] as? [Any])?.isEmpty == true && (view["transactions"] as? [Any])?.isEmpty == true)
        let rows = try await world.server.store.database.transaction { db in
            try db.query("SELECT app_user_id FROM ledger WHERE app_id = 'com.example.football'").compactMap { $0.string("app_user_id") }
        }
        #expect(rows == [tombstone])
        let jobs = try await world.server.store.database.transaction { db in
            try db.query("SELECT r.receipt_data AS receipt_data, j.app_user_id AS app_user_id FROM verification_jobs j LEFT JOIN verification_receipts r ON r.job_id = j.id WHERE j.app_id = 'com.example.football'")
                .map { ($0.string("receipt_data") ?? "", $0.string("app_user_id") ?? "") }
        }
        #expect(!jobs.isEmpty && jobs.allSatisfy { $0.0.isEmpty && $0.1 == tombstone })
        #expect(try await world.client.json(.delete, "/admin/v1/apps/com.example.football/users/erin@example.com", headers: Self.admin).0 == 404)
    }

    @Test("An anonymous user merged into a logged-in one: purchases and balances follow; a public key needs both users' tokens",
          arguments: [ReplayPolicy.reject, .share])
    func alias(policy: ReplayPolicy) async throws {
        let world = try await ServerWorld.make(.sqlite, policies: { $0.replayPolicy = policy })
        defer { Task { await world.stop() } }
        let (_, gloves) = try await world.buy("com.example.football", "ProtectiveGloves")
        _ = try await world.upload("com.example.football", user: "anon-1", receipt: gloves)
        let (bottleRecord, bottle) = try await world.buy("com.example.football", "EnergyBottle")
        _ = try await world.upload("com.example.football", user: "anon-1", receipt: bottle)
        let secret = ["Authorization": "Bearer \(world.keys["com.example.football"]!)"]
        let (status, body) = try await world.client.json(.post, "/v1/users/grace/alias", json: ["alias": "anon-1"], headers: secret)
        #expect(status == 200, "\(body)")
        #expect((body["transferred"] as? [String])?.count == 2)
        let grace = try await world.user("com.example.football", "grace")
        #expect(grace.entitlementIds.contains("protective_gloves"))
        #expect((grace["balances"] as? [String: Any])?["energy_bottles"] as? Int64 == 1)
        let anonymous = try await world.user("com.example.football", "anon-1")
        #expect(anonymous.entitlementIds.contains("protective_gloves") == (policy == .share))
        #expect(((anonymous["balances"] as? [String: Any]) ?? [:]).isEmpty)
        #expect(try await world.client.json(.post, "/v1/users/grace/alias", json: ["alias": "grace"], headers: secret).0 == 400)
        // The bottle's credit moved with the merge, so its refund takes it back from grace, not from the retired id.
        _ = try await world.emulator.refund(transactionId: bottleRecord.id)
        let refunded = try await world.emulator.appReceipt(bundleId: "com.example.football", deviceId: world.device, refresh: true)!.base64EncodedString()
        _ = try await world.upload("com.example.football", user: "grace", receipt: refunded)
        let after = try await world.user("com.example.football", "grace")
        #expect((after["balances"] as? [String: Any])?["energy_bottles"] as? Int64 == 0 && after["flagged"] as? Bool == false)
        #expect(try await world.user("com.example.football", "anon-1")["flagged"] as? Bool == false)
        let publicKey = try await world.server.store.createKey(appId: "com.example.football", label: nil, kind: .public, now: Date())
        let (refused, _) = try await world.client.json(.post, "/v1/users/grace/alias", json: ["alias": "anon-2"],
                                                       headers: ["Authorization": "Bearer \(publicKey)"])
        #expect(refused == 401 || refused == 403)
    }
}
