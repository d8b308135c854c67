import AppStoreCrypto
import Clocks
import Foundation
@testable import PurchaseServer
import StorekeeperTesting
import Testing

@Suite("Client-chosen identifiers")
struct IdentifierTests {
    @Test("The rule: NFC, 1–256 bytes, no control characters", arguments: [
        ("alice", "alice"),
        ("e\u{301}", "\u{e9}"),                      // NFD becomes NFC
        ("\u{e9}", "\u{e9}"),
        (String(repeating: "a", count: 256), String(repeating: "a", count: 256)),
        (String(repeating: "\u{e9}", count: 128), String(repeating: "\u{e9}", count: 128)),  // 256 bytes
        ("user with spaces", "user with spaces"),
    ])
    func accepted(input: String, normalised: String) throws {
        let id = try ClientIdentifier(input, .appUserId)
        #expect(Array(id.value.utf8) == Array(normalised.utf8))
    }

    @Test("Refused with invalid_user_id", arguments: [
        "", "alice\u{0}evil", "line\nbreak", "tab\there", "\u{7f}", "\u{9b}csi",
        String(repeating: "a", count: 257),
        String(repeating: "\u{e9}", count: 129),          // 129 characters but 258 bytes: bytes count, not characters
        String(repeating: "e\u{301}", count: 129),        // NFD: 387 bytes, 258 after NFC
    ])
    func refused(input: String) {
        #expect { try ClientIdentifier(input, .appUserId) } throws: { ($0 as? ServerError)?.code.rawValue == "invalid_user_id" }
    }

    @Test("Over HTTP: a NUL is refused, not truncated; NFC and NFD name one user", arguments: Engine.available)
    func overHTTP(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let key = ["Authorization": "Bearer \(world.keys["com.example.coins"]!)"]
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF01")
        let (status, body) = try await world.client.json(.post, "/v1/receipts", json: ["appUserId": "alice\u{0}evil", "receiptData": receipt], headers: key)
        #expect(status == 400)
        #expect((body["error"] as? [String: Any])?["code"] as? String == "invalid_user_id")
        let (read, _) = try await world.client.json(.get, "/v1/users/alice%00evil", headers: key)
        #expect(read == 400)
        // Nothing was granted to "alice" by the refused upload.
        #expect(try await world.user("com.example.coins", "alice").balances.isEmpty)

        let decomposed = "Jose\u{301}", composed = "Jos\u{e9}"
        let job = try await world.upload("com.example.coins", user: decomposed, receipt: receipt)
        #expect(job.state == "verified")
        let encoded = composed.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed)!
        let (_, view) = try await world.client.json(.get, "/v1/users/\(encoded)", headers: key)
        #expect(view.balances == ["coins": 20])
        #expect(Array((view["appUserId"] as? String ?? "").utf8) == Array(composed.utf8))
    }
}

@Suite("Numbers from outside never trap")
struct ArithmeticBoundsTests {
    @Test("Report dates outside 1970–9999 are 400 invalid_date", arguments: Engine.available)
    func reportDates(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let admin = ["Authorization": "Bearer \(ServerWorld.adminKey)"]
        for bad in ["9223372036854775807", "-9223372036854775808", "-1", "253402300800000", "10000-01-01", "nan"] {
            let (status, body) = try await world.client.json(.get, "/admin/v1/reports/revenue?from=\(bad)", headers: admin)
            #expect(status == 400, "from=\(bad)")
            #expect((body["error"] as? [String: Any])?["code"] as? String == "invalid_date", "from=\(bad)")
        }
        let (ok, _) = try await world.client.json(.get, "/admin/v1/reports/revenue?from=0&to=253402300799999", headers: admin)
        #expect(ok == 200)
    }

    @Test("Product amounts and durations outside their bounds are refused", arguments: [
        #"{"type": "nonRenewing", "entitlement": "pass", "durationDays": 200000000000}"#,
        #"{"type": "nonRenewing", "entitlement": "pass", "durationDays": -1}"#,
        #"{"type": "consumable", "currency": "coins", "amount": 9223372036854775807}"#,
        #"{"type": "consumable", "currency": "coins", "amount": 0}"#,
        #"{"type": "consumable", "currency": "co\u0000ins", "amount": 5}"#,
        #"{"type": "autoRenewable", "entitlement": "magazine", "price": "1e40", "priceCurrency": "USD"}"#,
        #"{"type": "autoRenewable", "entitlement": "magazine", "price": "-9.99", "priceCurrency": "USD"}"#,
        #"{"type": "autoRenewable", "entitlement": "magazine", "price": "9.9999999", "priceCurrency": "USD"}"#,
        #"{"type": "autoRenewable", "entitlement": "magazine", "price": "9.99", "priceCurrency": "U D\n"}"#,
        #"{"type": "autoRenewable", "entitlement": "magazine", "price": "9.99", "priceCurrency": "usd"}"#,
    ])
    func productBounds(json: String) async throws {
        let body = try JSONSerialization.jsonObject(with: Data(json.utf8)) as! [String: Any]
        let world = try await ServerWorld.make(.sqlite)
        defer { Task { await world.stop() } }
        let (status, answer) = try await world.client.json(.put, "/admin/v1/apps/com.example.magazine/products/com.example.magazine.weekpass", json: body,
                                                           headers: ["Authorization": "Bearer \(ServerWorld.adminKey)"])
        #expect(status == 400, "\(answer)")
    }

    @Test("A product's currency spelled decomposed credits the balance spends reach (NFC), whichever way they spell it",
          arguments: Engine.available)
    func currencyNormalised(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let (status, _) = try await world.client.json(.put, "/admin/v1/apps/com.example.coins/products/Nada.JPYF01",
                                                      json: ["type": "consumable", "currency": "e\u{301}cus", "amount": 5],
                                                      headers: ["Authorization": "Bearer \(ServerWorld.adminKey)"])
        #expect(status == 200)
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF01")
        _ = try await world.upload("com.example.coins", user: "alice", receipt: receipt)
        #expect(try await world.user("com.example.coins", "alice").balances == ["\u{e9}cus": 5])
        let key = world.keys["com.example.coins"]!
        for (index, spelling) in ["%C3%A9cus", "e%CC%81cus"].enumerated() {
            let (spent, answer) = try await world.client.json(.post, "/v1/users/alice/balances/\(spelling)/spend", json: ["amount": 2],
                                                              headers: ["Authorization": "Bearer \(key)", "Idempotency-Key": "spend-\(index)"])
            #expect(spent == 200 && answer["balance"] as? Int == 3 - 2 * index, "\(answer)")
        }
    }

    @Test("Pass windows and credits saturate instead of overflowing")
    func saturation() {
        let pass = ProductMapping(productId: "p", type: .nonRenewing, entitlement: "e", durationDays: 200_000_000_000)
        #expect(pass.passEnd(from: 1_700_000_000_000, quantity: 10) == .max)
        let week = ProductMapping(productId: "p", type: .nonRenewing, entitlement: "e", durationDays: 7)
        #expect(week.passEnd(from: 0, quantity: 2) == 14 * 86_400_000)
        #expect(ProductMapping.credit(.max, times: 2) == .max)
        #expect(ProductMapping.credit(.max, times: -2) == .min)
        #expect(ProductMapping.credit(600, times: 3) == 1800)
    }
}

@Suite("Junk fills nothing")
struct JunkStorageTests {
    @Test("A rejected upload keeps its hash, size and reason, not its bytes, and creates no user", arguments: Engine.available)
    func rejectedKeepsHashNotBytes(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let junk = Data((0..<3000).map { UInt8(truncatingIfNeeded: $0 &* 31) }).base64EncodedString()
        let job = try await world.upload("com.example.coins", user: "junk-user", receipt: junk)
        #expect(job.state == "rejected")
        let id = job["verificationId"] as? String ?? ""
        let row = try await world.server.store.database.transaction { db in
            try db.query("SELECT r.receipt_data AS receipt_data, receipt_sha256, receipt_size, reason FROM verification_jobs j LEFT JOIN verification_receipts r ON r.job_id = j.id WHERE j.id = ?", [id]).first
        }
        #expect(row != nil && row?.string("receipt_data") == nil)
        #expect(row?.string("receipt_sha256") == Digest.sha256.hash(Array(junk.utf8)).hexString)
        #expect(row?.int("receipt_size") == Int64(junk.utf8.count))
        #expect(row?.string("reason")?.isEmpty == false)
        let users = try await world.server.store.database.transaction { db in
            try db.query("SELECT app_user_id FROM users WHERE app_user_id = 'junk-user'")
        }
        #expect(users.isEmpty)
    }
}

@Suite("The look before storage")
struct ReceiptShapeTests {
    @Test("Every real Apple receipt passes the look before storage", arguments: ["r01", "r04", "r12"])
    func realReceiptsPass(prefix: String) throws {
        let text = String(decoding: try TestSupport.fixtureNamed(prefix: prefix, suffix: ".receipt.b64"), as: UTF8.self)
        #expect(ReceiptShape.rejection(of: text) == nil)
        #expect(ReceiptShape.rejection(of: "\n " + text) == nil)
    }

    @Test("The Xcode receipt passes too")
    func xcodeReceiptPasses() throws {
        let text = String(decoding: try TestSupport.fixtureNamed(prefix: "xcode", suffix: ".b64", in: "xcode"), as: UTF8.self)
        #expect(ReceiptShape.rejection(of: text) == nil)
    }

    @Test("Junk is refused before it is queued", arguments: [
        "", "=", "a", "not base64 at all!!", Data(repeating: 0, count: 300).base64EncodedString(),
        Data([0x30, 0x82, 0x01, 0x00] + Array(repeating: 0x41, count: 60)).base64EncodedString(),
        Data([0x30, 0x85, 0x06, 0x09, 0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x07, 0x02]).base64EncodedString(),
        Data([0x31, 0x80, 0x06, 0x09, 0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x07, 0x01]).base64EncodedString(),
    ])
    func junkIsRefused(text: String) {
        #expect(ReceiptShape.rejection(of: text)?.code == "malformed_receipt")
    }

    @Test("A signed transaction's look is a compact JWS: three Base64url parts; anything else, a text in this server's stored form among it, is refused before it is queued")
    func signedTransactionShape() throws {
        let genuine = try JWS.sign(payload: Array(#"{"transactionId":"1"}"#.utf8), key: TestSupport.jwsAuthority.leafKey, chain: TestSupport.jwsAuthority.chain)
        #expect(ReceiptShape.rejection(ofSignedTransaction: genuine) == nil)
        #expect(ReceiptShape.rejection(ofSignedTransaction: "a-_9.Zz0.x") == nil)
        let digest = String(repeating: "ab", count: 32)
        for junk in ["", ".", "a.b", "a.b.", ".b.c", "a..c", "a.b.c.d", "a.b.c\n", " a.b.c", "a.b=.c", "a+b.c.d", "a/b.c.d", "a.b.c\0",
                     "~\(digest).eyJ9.c2ln", "~\(digest).~{}.c2ln", "é.b.c"] {
            #expect(ReceiptShape.rejection(ofSignedTransaction: junk)?.code == "malformed_transaction", "\(junk.debugDescription)")
        }
    }

    @Test("A refused upload is answered rejected at once and never claimed", arguments: Engine.available)
    func refusedIsNeverQueued(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let job = try await world.server.submit(appId: "com.example.coins", appUserId: "junk", receiptData: "AAAA", kind: .purchase)
        #expect(job.state == .rejected && job.receiptData.isEmpty)
        let claimed = try await world.server.store.claim(owner: "test", limit: 10, lease: 30, now: world.server.clock.now())
        #expect(!claimed.contains { $0.id == job.id })
        #expect(try await world.server.store.job(job.id)?.state == .rejected)
    }
}

@Suite("Server-made identifiers and bearer tokens")
struct ServerIdentifierTests {
    @Test("Random ids are distinct version-4 UUIDs in lowercase")
    func randomIDs() {
        let ids = RandomIDs()
        var seen = Set<String>()
        for _ in 0..<10_000 {
            let id = ids.nextString()
            #expect(id.wholeMatch(of: /[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}/) != nil, "\(id)")
            seen.insert(id)
        }
        #expect(seen.count == 10_000)
        // Every bit outside version and variant varies: OR of all ids has them all set, AND none.
        let words = (0..<2_000).map { _ in ids.next().uuid }
        var any = [UInt8](repeating: 0, count: 16), all = [UInt8](repeating: 0xff, count: 16)
        for uuid in words {
            withUnsafeBytes(of: uuid) { bytes in
                for index in 0..<16 { any[index] |= bytes[index]; all[index] &= bytes[index] }
            }
        }
        #expect(any == [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x4f, 0xff, 0xbf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff])
        #expect(all == [0, 0, 0, 0, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 0])
    }

    @Test("Ordered ids are distinct version-7 UUIDs: the time in milliseconds, then random bits; a later millisecond sorts after")
    func orderedIDs() async throws {
        let ids = RandomIDs()
        let before = UInt64(Date().timeIntervalSince1970 * 1000)
        var seen = Set<String>()
        var batches: [[String]] = []
        for _ in 0..<3 {
            batches.append((0..<2_000).map { _ in ids.nextOrderedString() })
            try await Task.sleep(for: .milliseconds(3))
        }
        let after = UInt64(Date().timeIntervalSince1970 * 1000)
        for id in batches.joined() {
            #expect(id.wholeMatch(of: /[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}/) != nil, "\(id)")
            let milliseconds = try #require(UInt64(id.replacingOccurrences(of: "-", with: "").prefix(12), radix: 16))
            #expect((before...after).contains(milliseconds), "\(id)")
            seen.insert(id)
        }
        #expect(seen.count == 6_000)
        // Every id of a batch sorts before every id of the batches made milliseconds later.
        #expect(batches[0].max()! < batches[1].min()! && batches[1].max()! < batches[2].min()!)
        // The random part varies in every bit outside version and variant.
        var any = [UInt8](repeating: 0, count: 10)
        for _ in 0..<2_000 {
            withUnsafeBytes(of: ids.nextOrdered().uuid) { bytes in for index in 6..<16 { any[index - 6] |= bytes[index] } }
        }
        #expect(any == [0x7f, 0xff, 0xbf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff])
        // Generators whose ids are in order already give the same ids either way.
        let sequential = SequentialIDs()
        #expect([sequential.nextOrderedString(), sequential.nextString()] == ["00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002"])
    }

    @Test("Bearer token read from the Authorization header", arguments: [
        ("Bearer sk_live_1", "sk_live_1"), ("bearer sk_live_1", "sk_live_1"), ("BEARER sk_live_1", "sk_live_1"),
        ("Bearer   sk_live_1 \t", "sk_live_1"), ("Bearer \tsk_live_1", "sk_live_1"),
    ])
    func bearer(header: String, token: String) {
        #expect(PurchaseServerResponder.bearer(header) == token)
    }

    @Test("No bearer token", arguments: [
        "", "Bearer", "Bearer ", "Bearer  \t ", "Basic dXNlcjpwYXNz", "Bearer\tsk_live_1", "Bearer\0sk_live_1", "Bearersk_live_1",
        "Bearer " + String(repeating: "k", count: 506), "Béarer sk", "Bear",
    ])
    func noBearer(header: String) {
        #expect(PurchaseServerResponder.bearer(header) == nil)
    }

    @Test("Identifiers are written as Foundation's lowercased UUID string")
    func lowercasedUUIDs() {
        var random = SplitMix64(state: 7)
        let edges = [UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)),
                     UUID(uuid: (255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255))]
        let randoms = (0..<2_000).map { _ in
            withUnsafeBytes(of: (random.next(), random.next())) { bytes in
                UUID(uuid: (bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
                            bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]))
            }
        }
        for uuid in edges + randoms + [RandomIDs().next(), RandomIDs().nextOrdered()] {
            #expect(uuid.lowercasedString == uuid.uuidString.lowercased())
        }
        #expect(RandomIDs().nextOrderedString().count == 36)
        #expect(UUID(uuidString: RandomIDs().nextString()) != nil)
    }
}
