import AppStoreCrypto
import AppStoreModels
import Foundation
import Locking
@testable import PurchaseServer
import Storage
import StorekeeperTesting
import Testing

/// JWS stored with their headers named by digest (`StoredJWS`, `jws_headers`): the same bytes come back.
@Suite("Stored JWS", .serialized)
struct StoredJWSTests {
    /// Digests as the server makes them, remembering each header's text to expand with.
    final class Headers {
        var byDigest: [String: String] = [:]
        func digest(_ header: ArraySlice<UInt8>) -> String? {
            let digest = Digest.sha256.hash(header).hexString
            byDigest[digest] = String(decoding: header, as: UTF8.self)
            return digest
        }
        func header(_ digest: String) -> String? { byDigest[digest] }
    }

    static func carried(_ jws: String) throws -> [String] {
        let data = try JWS(compact: jws).payloadJSON()["data"]
        return ["signedTransactionInfo", "signedRenewalInfo"].compactMap { data?[$0]?.text }
    }

    @Test("Apple's real notification keeps one certificate chain of three, and its signed transaction none: both come back byte for byte")
    func realAppleData() throws {
        let headers = Headers()
        let notification = try RealAppleJWSTests.jws("j04-")
        let stored = StoredJWS.compact(notification, carried: try Self.carried(notification), digest: headers.digest)
        #expect(stored.hasPrefix("~"))
        #expect(StoredJWS.expand(stored, header: headers.header) == notification)
        // 18,495 characters, of which the chain in three headers is about 16 KB.
        #expect(notification.utf8.count > 18_000 && stored.utf8.count < 4_000)
        #expect(StoredJWS.headerDigests(of: stored) == [Digest.sha256.hash(notification.split(separator: ".")[0].utf8).hexString])

        let transaction = try RealAppleJWSTests.jws("j05")
        let compacted = StoredJWS.compact(transaction, digest: headers.digest)
        #expect(compacted.utf8.count < transaction.utf8.count / 4)
        #expect(StoredJWS.expand(compacted, header: headers.header) == transaction)
        // An envelope carrying nothing known keeps its payload in Base64url.
        #expect(compacted.split(separator: ".")[1] == transaction.split(separator: ".")[1])
    }

    @Test("What cannot be compacted exactly is stored as it came, or with only its own header named")
    func fallbacks() throws {
        let headers = Headers()
        let notification = try RealAppleJWSTests.jws("j04-")
        // No digest for its header: as it came.
        #expect(StoredJWS.compact(notification, carried: try Self.carried(notification), digest: { _ in nil }) == notification)
        // Not a compact JWS: as it came.
        for text in ["", "abc", "a.b", "a.b.c.d", "~", "~.~.~", "a.b~.c", "a.b.c~"] {
            #expect(StoredJWS.compact(text, digest: headers.digest) == text)
        }
        // A payload with a `~` of its own keeps its Base64url.
        let nested = try JWS.sign(payload: Array(#"{"a":1}"#.utf8), key: TestSupport.jwsAuthority.leafKey, chain: TestSupport.jwsAuthority.chain)
        let tilde = try JWS.sign(payload: Array(#"{"note":"x~y","data":{"signedTransactionInfo":"\#(nested)"}}"#.utf8),
                                 key: TestSupport.jwsAuthority.leafKey, chain: TestSupport.jwsAuthority.chain)
        let stored = StoredJWS.compact(tilde, carried: [nested], digest: headers.digest)
        #expect(stored.split(separator: ".")[1] == tilde.split(separator: ".")[1])
        #expect(StoredJWS.expand(stored, header: headers.header) == tilde)
        // A payload that is not UTF-8 (a byte 0xFF in a string) keeps its Base64url: as text it would come back changed.
        let notUTF8 = try JWS.sign(payload: Array(#"{"note":""#.utf8) + [0xFF] + Array(#"","data":{"signedTransactionInfo":"\#(nested)"}}"#.utf8),
                                   key: TestSupport.jwsAuthority.leafKey, chain: TestSupport.jwsAuthority.chain)
        let binary = StoredJWS.compact(notUTF8, carried: [nested], digest: headers.digest)
        #expect(binary.hasPrefix("~") && binary.split(separator: ".")[1] == notUTF8.split(separator: ".")[1])
        #expect(StoredJWS.expand(binary, header: headers.header) == notUTF8)
        // A carried header as long as its mark (65 bytes) is still named: the text keeps its length, not its bytes.
        let short = "eyJ" + String(repeating: "a", count: 62)
        let carrier = "\(short).e30.AAAA"
        let sameLength = "eyJhbGciOiJFUzI1NiJ9.\(Base64URL.encode(Array(#"{"data":{"signedTransactionInfo":"\#(carrier)"}}"#.utf8))).AAAA"
        let named = StoredJWS.compact(sameLength, carried: [carrier], digest: headers.digest)
        #expect(named.split(separator: ".")[1].hasPrefix("~"))
        #expect(StoredJWS.expand(named, header: headers.header) == sameLength)
        // A carried JWS its payload does not hold as such (escaped) leaves the payload as it came.
        let escaped = try JWS.sign(payload: Array(#"{"data":{"signedTransactionInfo":"\#(nested.replacingOccurrences(of: ".", with: "\\u002e"))"}}"#.utf8),
                                   key: TestSupport.jwsAuthority.leafKey, chain: TestSupport.jwsAuthority.chain)
        let kept = StoredJWS.compact(escaped, carried: [nested], digest: headers.digest)
        #expect(kept.split(separator: ".")[1] == escaped.split(separator: ".")[1])
        #expect(StoredJWS.expand(kept, header: headers.header) == escaped)
    }

    @Test("A stored form naming an unknown header, or not one compact writes, expands to nothing; text without ~ to itself")
    func unknownAndMalformed() throws {
        let headers = Headers()
        let notification = try RealAppleJWSTests.jws("j04-")
        let stored = StoredJWS.compact(notification, carried: try Self.carried(notification), digest: headers.digest)
        #expect(StoredJWS.expand(stored, header: { _ in nil }) == nil)
        #expect(StoredJWS.expand(notification, header: { _ in nil }) == notification)
        let digest = String(repeating: "a", count: 64)
        for text in ["~", "~\(digest)", "~\(digest).", "~\(digest).p", "~\(digest).p.s~", "~\(digest).p~.s", "~\(digest.uppercased()).p.s",
                     "~\(digest).~{\"~\(digest)\"}.s", "~\(digest).~{\"~\(digest.dropLast())x.\"}.s", "~\(digest).~{\"a~\"}.s",
                     "~\(digest).~~\(digest).s"] {
            #expect(StoredJWS.expand(text, header: { _ in "h" }) == nil, "\(text)")
        }
        #expect(StoredJWS.expand("~\(digest).p.s", header: { $0 == digest ? "h" : nil }) == "h.p.s")
        #expect(StoredJWS.expand("~\(digest).~{\"~\(digest).x\"}.s", header: { $0 == digest ? "h" : nil })
                == "h.\(Base64URL.encode(Array("{\"h.x\"}".utf8))).s")
    }

    @Test("Random payloads carrying JWS (repeated, under other headers, beside quotes and escapes) come back byte for byte; corrupted forms never trap")
    func randomRoundTrips() throws {
        var random = SplitMix64(state: 0x5EED_0033)
        let headers = Headers()
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        func segment(_ length: Int) -> String { String((0..<length).map { _ in alphabet[random.below(alphabet.count)] }) }
        let nestedHeaders = (0..<3).map { _ in "eyJ" + segment(40 + random.below(200)) }
        for round in 0..<500 {
            let carried = (0..<random.below(4)).map { _ in "\(nestedHeaders[random.below(3)]).\(segment(random.below(300))).\(segment(86))" }
            var fields: [String] = []
            for (index, jws) in carried.enumerated() { fields.append(#""k\#(index)":"\#(jws)""#) }
            for _ in 0..<random.below(4) {
                let values = [#""\"q\"""#, #""\\""#, "12", "null", #""a.b""#, #""\u00e9""#, #""\#(nestedHeaders[0])""#, #""\#(nestedHeaders[1]).""#]
                fields.append(#""f\#(fields.count)":\#(values[random.below(values.count)])"#)
            }
            fields.shuffle(using: &random)
            let payload = "{" + fields.joined(separator: ",") + "}"
            let jws = "\(nestedHeaders[random.below(3)]).\(Base64URL.encode(Array(payload.utf8))).\(segment(86))"
            let stored = StoredJWS.compact(jws, carried: carried, digest: headers.digest)
            #expect(stored.hasPrefix("~"))
            // The digests it names are those the stored text holds (the ones written to `jws_headers`).
            let named = StoredJWS.compactNaming(jws, carried: carried, digest: headers.digest).digests, held = StoredJWS.headerDigests(of: stored)
            #expect(named.first == held.first && named.count == held.count && Set(named) == Set(held))
            #expect(StoredJWS.expand(stored, header: headers.header) == jws, "round \(round)")
            // One byte changed anywhere: nil or some text, never a trap.
            var bytes = Array(stored.utf8)
            let index = random.below(bytes.count)
            bytes[index] = [UInt8(ascii: "~"), UInt8(ascii: "."), UInt8(ascii: "\""), UInt8(ascii: "a"), 0, 0xff][random.below(6)]
            _ = StoredJWS.expand(String(decoding: bytes, as: UTF8.self), header: headers.header)
            _ = StoredJWS.headerDigests(of: String(decoding: bytes, as: UTF8.self))
            _ = StoredJWS.expand(String(decoding: bytes.prefix(random.below(bytes.count)), as: UTF8.self), header: headers.header)
        }
    }

    @Test("A notification is stored with its chain named once, read back as Apple sent it, and not listed with it", arguments: Engine.available)
    func storedNotification(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine)
        defer { Task { await world.stop() } }
        let (_, genuine) = try await NotificationTests.coinsBoughtByAlice(world)
        let uuid = try #require(try JWS(compact: genuine).payloadJSON()["notificationUUID"]?.text)
        let (status, _) = try await NotificationTests.post(world, genuine)
        #expect(status == 200)
        // Another under the same chain, ignored (an environment the server does not take): stored the same way.
        let ignored = try NotificationTests.signed(["notificationType": "TEST", "notificationUUID": UUID().uuidString, "version": "2.0",
                                                    "signedDate": Int64(Date().timeIntervalSince1970 * 1000),
                                                    "data": ["bundleId": "com.example.coins", "environment": "Xcode"]])
        #expect(try await NotificationTests.post(world, ignored).1["outcome"] as? String == "ignored")

        let admin = ["Authorization": "Bearer \(ServerWorld.adminKey)"]
        let (read, one) = try await world.client.json(.get, "/admin/v1/notifications/\(uuid)", headers: admin)
        #expect(read == 200)
        #expect(one["signedPayload"] as? String == genuine)
        #expect(one["notificationType"] as? String == "ONE_TIME_CHARGE" && one["state"] as? String == "queued")
        let ignoredUUID = try #require(try JWS(compact: ignored).payloadJSON()["notificationUUID"]?.text)
        #expect(try await world.client.json(.get, "/admin/v1/notifications/\(ignoredUUID)", headers: admin).1["signedPayload"] as? String == ignored)
        let (_, list) = try await world.client.send(.get, "/admin/v1/notifications", headers: admin).jsonArray()
        #expect(list.count == 2 && list.allSatisfy { $0["signedPayload"] == nil })

        let rows = try await world.server.store.database.transaction { db in
            (try db.query("SELECT notification_uuid, signed_payload FROM apple_notifications"), try db.query("SELECT digest, header FROM jws_headers"))
        }
        let stored = try #require(rows.0.first { $0.string("notification_uuid") == uuid }?.string("signed_payload"))
        #expect(stored.hasPrefix("~") && stored.utf8.count * 3 < genuine.utf8.count)
        // The emulator signs the envelope and its transaction under one chain: one header for both notifications.
        #expect(rows.1.count == 1)
        #expect(rows.1.first?.string("header") == String(genuine.split(separator: ".")[0]))

        for missing in ["00000000-0000-0000-0000-000000000000", String(repeating: "x", count: 10_000)] {
            let (status, body) = try await world.client.json(.get, "/admin/v1/notifications/\(missing)", headers: admin)
            #expect(status == 404 && AuthorizationTests.code(body) == "notification_not_found")
        }
        #expect(try await world.client.json(.get, "/admin/v1/notifications/\(uuid)").0 == 401)
    }

    @Test("Headers are added once across stores on one database, at once from many, and read back; a store trusts them stored for a minute",
          arguments: Engine.available)
    func headersAcrossStores(engine: Engine) async throws {
        let database = try await engine.makeDatabase()
        try await database.migrate(Schema.migrations)
        let notification = try RealAppleJWSTests.jws("j04-"), transaction = try RealAppleJWSTests.jws("j05")
        // Eight processes' stores storing the same JWS at once (on PostgreSQL, on connections of their own).
        let texts = try await withThrowingTaskGroup(of: String.self) { group in
            for index in 0..<8 {
                group.addTask {
                    let store = PurchaseStore(database: database)
                    return index % 2 == 0 ? try await store.storedJWS(notification, carried: try Self.carried(notification))
                                          : try await store.storedJWS(transaction)
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(texts.allSatisfy { $0.hasPrefix("~") })
        let reader = PurchaseStore(database: database)
        for text in texts {
            let expanded = try await database.transaction { db in try reader.expandedJWS(text, db) }
            #expect(expanded == notification || expanded == transaction)
        }
        // One row per distinct header (Apple's sandbox notification of 2024 and transaction of 2025 share their chain).
        let distinct = Set(([notification, transaction] + (try Self.carried(notification))).map { $0.split(separator: ".")[0] })
        #expect(try await database.transaction { db in try db.query("SELECT COUNT(*) AS n FROM jws_headers").first?.int("n") } == Int64(distinct.count))
        // A text stored before this form existed reads as it is.
        #expect(try await database.transaction { db in try reader.expandedJWS(transaction, db) } == transaction)
    }

    @Test("The header book hashes a header once, writes it until stored, trusts that for a minute, and is bounded")
    func headerBook() throws {
        let clock = Locked(ContinuousClock.now)
        let book = JWSHeaderBook(now: { clock.withLock { $0 } })
        let header = Array(try RealAppleJWSTests.jws("j05").split(separator: ".")[0].utf8)
        let digest = try #require(book.digest(header[...]))
        #expect(book.digest(header[...]) == digest && digest == Digest.sha256.hash(header).hexString)
        let stored = "~\(digest).e30.AAAA"
        #expect(book.unstored(StoredJWS.headerDigests(of: stored)).map(\.digest) == [digest])
        #expect(book.unstored(StoredJWS.headerDigests(of: stored)).first?.header == String(decoding: header, as: UTF8.self))
        book.stored([digest])
        #expect(book.unstored(StoredJWS.headerDigests(of: stored)).isEmpty)
        clock.withLock { $0 += .seconds(61) }
        #expect(book.unstored(StoredJWS.headerDigests(of: stored)).map(\.digest) == [digest])
        // Too long for a JWS header, or past the capacity: no digest (stored as it came).
        #expect(book.digest(Array(repeating: UInt8(ascii: "A"), count: JWSHeaderBook.maximumHeaderLength + 1)[...]) == nil)
        for index in 1..<JWSHeaderBook.capacity { #expect(book.digest(Array("eyJ\(index)".utf8)[...]) != nil) }
        #expect(book.digest(Array("eyJfull".utf8)[...]) == nil)
        #expect(book.digest(header[...]) == digest)
    }
}
