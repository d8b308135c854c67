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
        let digest = try #require(StoredReceipt.digest(of: stored))
        let bytes = Array(stored.utf8)
        // Cut before the digest's end, before the part's place, or with the place's dot gone; a digest not in hex.
        for broken in [String(decoding: bytes[..<66], as: UTF8.self), String(decoding: bytes[..<67], as: UTF8.self),
                       "~R" + digest + ".AB", "~R" + digest + "." + String(repeating: "A", count: 400),
                       "~R" + digest.uppercased() + ".A.B", "~R" + digest.dropLast() + ".A.B"] {
            #expect(StoredReceipt.expand(broken, part: headers.header) == nil)
        }
        // With the place's dot, what a form names is put back, whatever is around it.
        #expect(StoredReceipt.expand("~R" + digest + "..", part: headers.header) == headers.header(digest))
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
        #expect(server.store.storedReceipt(foreign) == nil)

        // The same receipt with its certificates reordered still verifies (the field is not signed), and teaches nothing.
        let (_, first) = try await world.buy("com.example.coins", "Nada.JPYF01")
        var der = try #require(ReceiptDecoder.base64Decode(first))
        guard case .app(_, let signed) = try ReceiptDecoder.decode(der) else { Issue.record("not an app receipt"); return }
        let certificates = signed.certificates, field = try #require(SignedData.certificatesRange(inDER: der))
        #expect(certificates.count == 3)
        der.replaceSubrange((field.upperBound - certificates.map(\.count).reduce(0, +))..<field.upperBound,
                            with: certificates[0] + certificates[2] + certificates[1])
        let reordered = Data(der).base64EncodedString()
        _ = try await server.submit(appId: "com.example.coins", appUserId: "alice", receiptData: reordered, kind: .purchase)
        let reorderedClaim = try await server.store.claim(owner: "worker", limit: 10, lease: 30, now: Date())
        #expect(await server.engine.process(try #require(reorderedClaim.first), owner: "worker") == .verified)
        #expect(server.store.storedReceipt(reordered) == nil && server.store.storedReceipt(first) == nil)

        // Nothing learnt yet: the first receipt is stored as it came.
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

        // The database lost the part (a restore of an older copy): the job is not rejected, and keeps its receipt. The
        // next upload that names the part (here the same receipt, sent again) writes it again, with itself.
        let (_, fourth) = try await world.buy("com.example.coins", "Nada.JPYF01")
        let fourthJob = try await server.submit(appId: "com.example.coins", appUserId: "alice", receiptData: fourth, kind: .purchase)
        let fourthStored = try #require(try await rawReceipt(fourthJob.id))
        let lost = try #require(StoredReceipt.digest(of: fourthStored))
        try await server.store.database.transaction { db in try db.run("DELETE FROM jws_headers WHERE digest = ?", [lost]) }
        let stranded = try await server.store.claim(owner: "worker", limit: 10, lease: 30, now: Date())
        #expect(stranded.map(\.id) == [fourthJob.id])
        #expect(await server.engine.process(try #require(stranded.first), owner: "worker") == nil)
        #expect(try await server.store.job(fourthJob.id)?.state == .verifying)
        #expect(try await rawReceipt(fourthJob.id)?.hasPrefix("~R") == true)
        #expect(try await server.store.receipt(of: fourthJob.id) != fourth)
        _ = try await server.submit(appId: "com.example.coins", appUserId: "alice", receiptData: fourth, kind: .purchase)
        #expect(try await server.store.receipt(of: fourthJob.id) == fourth)
    }

    @Test("Only certificates that are the signer's chain, in order, ending at a trusted root and nothing else, are learnt")
    func chainOrder() throws {
        let receipt = try Self.real("r04")
        let bytes = try #require(ReceiptDecoder.base64Decode(receipt))
        guard case .app(let decoded, let signed) = try ReceiptDecoder.decode(bytes) else { Issue.record("not an app receipt"); return }
        let signer = try signed.signerCertificate()
        let pem = String(decoding: try TestSupport.fixtureNamed(prefix: "apple-inc-root-ca", suffix: ".pem", in: "../certs"), as: UTF8.self)
        let roots = try Certificate.parsePEM(pem)
        let date = try #require(decoded.creationDate)
        let chain = signed.certificates
        func learnt(_ certificates: [[UInt8]]) -> Bool { ReceiptInspector.isChain(certificates, signer: signer, roots: roots, at: date) }
        #expect(chain.count == 3)
        #expect(learnt(chain))
        // Its root altered in a byte its verification does not read (the trusted one is used), left out, or not trusted.
        var altered = chain
        altered[2][altered[2].count - 1] ^= 1
        #expect(!learnt(altered))
        #expect(!learnt(Array(chain.prefix(2))))
        #expect(!ReceiptInspector.isChain(chain, signer: signer, roots: [], at: date))
        // Reordered, repeated, with others beside, or empty.
        #expect(!learnt([chain[0], chain[2], chain[1]]))
        #expect(!learnt([chain[1], chain[0], chain[2]]))
        #expect(!learnt(chain + [chain[2]]))
        #expect(!learnt([chain[0], chain[1], [0x30, 0x00], chain[2]]))
        #expect(!learnt([]))
    }
}
