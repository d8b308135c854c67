import AppStoreCrypto
import Foundation
@testable import PurchaseServer
import Storage
import StorekeeperTesting
import Testing

/// App receipts stored with their certificates named by digest (`StoredReceipt`, `jws_headers`): the same characters
/// come back.
@Suite("Stored receipts")
struct StoredReceiptTests {
    static func real(_ prefix: String) throws -> String {
        String(decoding: try TestSupport.fixtureNamed(prefix: prefix, suffix: ".receipt.b64"), as: UTF8.self)
            .trimmingCharacters(in: .whitespacesAndNewlines)
    }

    @Test("Apple's real receipts are stored without their certificates and come back character for character", arguments: ["r01", "r04"])
    func realReceipts(prefix: String) throws {
        let headers = StoredJWSTests.Headers()
        let receipt = try Self.real(prefix)
        let (stored, digest) = StoredReceipt.compact(receipt, digest: headers.digest)
        #expect(stored.hasPrefix("~R"))
        #expect(digest != nil && StoredReceipt.digest(of: stored) == digest)
        #expect(StoredReceipt.expand(stored, part: headers.header) == receipt)
        // The certificates are most of a receipt with few purchases.
        #expect(Double(stored.utf8.count) < Double(receipt.utf8.count) * 0.75)
        // The part named is one of the three its certificates give, whatever the length of the purchases before them.
        let part = try #require(digest.flatMap(headers.header))
        #expect(part.utf8.count >= StoredReceipt.minimumPart)
        let parts = StoredReceipt.parts(of: receipt)
        #expect(parts.count == 3 && Set(parts).count == 3 && parts.contains(part))
    }

    @Test("A receipt that is not plain Base64 up to its certificates' end, is not PKCS#7, or whose certificates the book does not know, is stored as it came")
    func storedAsItCame() throws {
        let headers = StoredJWSTests.Headers()
        let receipt = try Self.real("r04")
        var wrapped = Array(receipt.utf8)
        wrapped.insert(UInt8(ascii: "\n"), at: 76)
        let lineBroken = String(decoding: wrapped, as: UTF8.self)
        #expect(ReceiptDecoder.base64Decode(lineBroken) != nil)
        for text in [lineBroken, "", "~R", "MIIT" + String(repeating: "A", count: 4_000), "not base64 at all", "~" + receipt] {
            let (stored, digest) = StoredReceipt.compact(text, digest: headers.digest)
            #expect(stored == text && digest == nil)
        }
        let (stored, digest) = StoredReceipt.compact(receipt, digest: { _ in nil })
        #expect(stored == receipt && digest == nil)
        // What follows the certificates is kept as it came: a trailing line break too.
        let trailing = receipt + "\n"
        let compacted = StoredReceipt.compact(trailing, digest: headers.digest).text
        #expect(compacted.hasPrefix("~R") && StoredReceipt.expand(compacted, part: headers.header) == trailing)
    }

    @Test("A compacted form whose part is unknown, or that is cut or forged, does not expand")
    func brokenForms() throws {
        let headers = StoredJWSTests.Headers()
        let receipt = try Self.real("r01")
        let stored = StoredReceipt.compact(receipt, digest: headers.digest).text
        #expect(StoredReceipt.expand(stored, part: { _ in nil }) == nil)
        let bytes = Array(stored.utf8)
        for broken in [String(decoding: bytes[..<66], as: UTF8.self), String(decoding: bytes[..<67], as: UTF8.self),
                       "~R" + String(repeating: "g", count: 64) + ".A.B", "~R" + String(repeating: "0", count: 63) + ".A.B",
                       "~R" + String(repeating: "0", count: 64) + ".AB"] {
            #expect(StoredReceipt.expand(broken, part: headers.header) == nil)
        }
    }

    @Test("Once a receipt's chain verified, later uploads with the same certificates are stored without them, and a queued one is claimed and verified whole",
          arguments: Engine.available)
    func learnedAndClaimed(engine: Engine) async throws {
        let world = try await ServerWorld.make(engine, startWorker: false)
        defer { Task { await world.stop() } }
        let server = world.server
        func rawReceipt(_ id: String) async throws -> String? {
            try await server.store.database.read { db in
                try db.query("SELECT receipt_data FROM verification_receipts WHERE job_id = ?", [id]).first?.string("receipt_data")
            }
        }
        func verify(_ receipt: String) async throws -> VerificationJob {
            let job = try await server.submit(appId: "com.example.coins", appUserId: "alice", receiptData: receipt, kind: .purchase)
            let claimed = try await server.store.claim(owner: "worker", limit: 10, lease: 30, now: Date())
            #expect(claimed.map(\.id) == [job.id])
            #expect(claimed.first?.receiptData == receipt)
            #expect(await server.engine.process(try #require(claimed.first), owner: "worker") == .verified)
            return job
        }

        // A receipt whose chain this server does not trust (Apple's, against the tests' roots) is rejected, and teaches
        // nothing: an upload's own certificates could be anything.
        let foreign = try Self.real("r04")
        let foreignJob = try await server.submit(appId: "com.example.coins", appUserId: "mallory", receiptData: foreign, kind: .purchase)
        let foreignClaim = try await server.store.claim(owner: "worker", limit: 10, lease: 30, now: Date())
        #expect(await server.engine.process(try #require(foreignClaim.first), owner: "worker") == .rejected)
        #expect(try await server.store.job(foreignJob.id)?.reason?.contains("not trusted") == true)
        #expect(try await server.store.storedReceipt(foreign) == nil)

        // Nothing verified yet: the first receipt is stored as it came.
        let (_, first) = try await world.buy("com.example.coins", "Nada.JPYF01")
        let firstJob = try await server.submit(appId: "com.example.coins", appUserId: "alice", receiptData: first, kind: .purchase)
        #expect(try await rawReceipt(firstJob.id) == first)
        let claimed = try await server.store.claim(owner: "worker", limit: 10, lease: 30, now: Date())
        #expect(await server.engine.process(try #require(claimed.first), owner: "worker") == .verified)

        // Its chain verified: the next one is stored without its certificates, and read back whole.
        let (_, second) = try await world.buy("com.example.coins", "Nada.JPYF01")
        let secondJob = try await server.submit(appId: "com.example.coins", appUserId: "alice", receiptData: second, kind: .purchase)
        let stored = try #require(try await rawReceipt(secondJob.id))
        #expect(stored.hasPrefix("~R") && Double(stored.utf8.count) < Double(second.utf8.count) * 0.75)
        #expect(try await server.store.receipt(of: secondJob.id) == second)
        let again = try await server.store.claim(owner: "worker", limit: 10, lease: 30, now: Date())
        #expect(again.first?.receiptData == second)
        #expect(await server.engine.process(try #require(again.first), owner: "worker") == .verified)

        // A third, verified through the same path; the balance counts all three purchases once each.
        _ = try await verify(try await world.buy("com.example.coins", "Nada.JPYF01").1)
        let balances = try #require(try await world.user("com.example.coins", "alice")["balances"] as? [String: Any])
        #expect(balances["coins"] as? Int64 == 60)
    }
}
