import AppStoreCrypto
import AppStoreModels
import Foundation
import Locking
import Storage

/// The SQL of `jws_headers`: each JWS header a stored JWS names (`StoredJWS`), by its SHA-256. Rows are never changed
/// or deleted, so a digest once committed names its header for good, in every process.
struct JWSHeaderRepository {
    let db: any SQLConnection
    let dialect: SQLDialect

    /// Adds headers not yet stored (another process may have added one first: that row is the same).
    func add(_ headers: [(digest: String, header: String)]) throws {
        for (digest, header) in headers {
            _ = try db.query("INSERT INTO jws_headers (digest, header) VALUES (?, ?) ON CONFLICT (digest) DO NOTHING", [digest, header])
        }
    }

    /// The headers stored under these digests (those not stored are missing from the answer).
    func headers(_ digests: [String]) throws -> [String: String] {
        guard !digests.isEmpty else { return [:] }
        let (condition, parameters) = dialect.membership("digest", in: digests)
        var found: [String: String] = [:]
        for row in try db.query("SELECT digest, header FROM jws_headers WHERE " + condition, parameters) {
            if let digest = row.string("digest"), let header = row.string("header") { found[digest] = header }
        }
        return found
    }
}

/// This process's memory of JWS headers (or of receipts' certificates, `StoredReceipt`): the digest of each header seen
/// (so a notification's header is hashed once, not per notification), and which are known to be in `jws_headers` (so
/// they are not written again), for a minute at a time: a database restored or failed over beneath a running process
/// gets them again within that minute. Bounded: past `capacity` headers, or for a header longer than `maximumLength`, a
/// header gets no digest and its JWS is stored with it. Headers come from notifications whose envelope verified, and
/// receipts' certificates from receipts whose chain verified and that carry exactly that chain, in order (Apple's
/// signing keys, a few a year, three parts each), so the bound is not reached in use.
final class JWSHeaderBook: Sendable {
    static let capacity = 64
    /// A JWS header's Base64url at its longest (`JWS.maximumHeaderLength` bytes).
    static let maximumHeaderLength = (JWS.maximumHeaderLength * 4 + 2) / 3
    static let knownFor: Duration = .seconds(60)
    private struct Entry {
        let header: [UInt8]
        let digest: String
        var storedAt: ContinuousClock.Instant?
    }
    private let entries = Locked<[Entry]>([])
    private let now: @Sendable () -> ContinuousClock.Instant
    /// The longest header given a digest.
    let maximumLength: Int

    init(maximumLength: Int = JWSHeaderBook.maximumHeaderLength, now: @escaping @Sendable () -> ContinuousClock.Instant = { ContinuousClock.now }) {
        self.maximumLength = maximumLength
        self.now = now
    }

    /// The header's SHA-256 in lowercase hex; nil for a header too long, or once `capacity` others are known. Found by
    /// comparing bytes (a few headers, kilobytes each: cheaper than hashing them for a dictionary).
    func digest(_ header: ArraySlice<UInt8>) -> String? {
        guard header.count <= maximumLength else { return nil }
        if let known = entries.withLock({ $0.first { $0.header.hasSameBytes(as: header) }?.digest }) { return known }
        let digest = Digest.sha256.hash(header).hexString
        return entries.withLock { entries in
            if let known = entries.first(where: { $0.header.hasSameBytes(as: header) }) { return known.digest }
            guard entries.count < Self.capacity else { return nil }
            entries.append(Entry(header: Array(header), digest: digest))
            return digest
        }
    }

    /// Whether no header has a digest yet.
    var isEmpty: Bool { entries.withLock { $0.isEmpty } }

    /// The digest of a header already given one (`digest`); nil for any other, which this does not add.
    func knownDigest(_ header: ArraySlice<UInt8>) -> String? {
        guard header.count <= maximumLength else { return nil }
        return entries.withLock { $0.first { $0.header.hasSameBytes(as: header) }?.digest }
    }

    /// The headers of these digests, those given one (in the digests' order).
    func headers(_ digests: [String]) -> [(digest: String, header: String)] {
        entries.withLock { entries in
            digests.compactMap { digest in
                entries.first { $0.digest == digest }.map { (digest, String(decoding: $0.header, as: UTF8.self)) }
            }
        }
    }

    /// The headers of these digests (those a stored form names) not known to be stored, with their text, by digest.
    func unstored(_ digests: [String]) -> [(digest: String, header: String)] {
        guard !digests.isEmpty else { return [] }
        let now = now()
        return entries.withLock { entries in
            digests.compactMap { digest in
                entries.first { $0.digest == digest && !($0.storedAt.map { now - $0 < Self.knownFor } ?? false) }
                    .map { (digest, String(decoding: $0.header, as: UTF8.self)) }
            }
        }.sorted { $0.digest < $1.digest }
    }

    /// Notes headers as stored (their transaction committed).
    func stored(_ digests: [String]) {
        guard !digests.isEmpty else { return }
        let now = now()
        entries.withLock { entries in
            for index in entries.indices where digests.contains(entries[index].digest) { entries[index].storedAt = now }
        }
    }
}

extension PurchaseStore {
    /// `jws` as stored (`StoredJWS`): the headers this process knows replaced by their digests. A header not known to be
    /// in `jws_headers` is added first, in a transaction of its own, in the digests' order: the write that then stores
    /// the text touches no shared row for it, so processes adding the same headers (PostgreSQL) wait on each other only
    /// there, never inside their batches of other rows. Rows there never change, so one added for a JWS whose own write
    /// fails afterwards is only unused.
    func storedJWS(_ jws: String, carried: [String] = [], decodedPayload: [UInt8]? = nil) async throws -> String {
        let (text, digests) = StoredJWS.compactNaming(jws, carried: carried, decodedPayload: decodedPayload, digest: jwsHeaders.digest)
        let missing = jwsHeaders.unstored(digests)
        if !missing.isEmpty {
            let dialect = database.dialect
            try await database.transaction { db in try JWSHeaderRepository(db: db, dialect: dialect).add(missing) }
            jwsHeaders.stored(missing.map(\.digest))
        }
        return text
    }

    /// An uploaded app receipt as stored (`StoredReceipt`): its certificates named by their digest when a receipt with
    /// the same ones verified before in this process (`learnCertificates`), else nil (stored as it came). The part is
    /// written with the upload, in its transaction (`insert(_:_:)`).
    func storedReceipt(_ receipt: String) -> String? {
        guard !receiptCertificates.isEmpty else { return nil }  // nothing learnt yet: not worth decoding the receipt
        let (text, digest) = StoredReceipt.compact(receipt, digest: receiptCertificates.knownDigest)
        return digest == nil ? nil : text
    }

    /// Writes the parts that these new jobs' stored receipts name, in the transaction that writes the jobs: a receipt
    /// stored without its certificates is never committed without them, whatever the database lost or another process
    /// wrote before (a failover, a restore). One statement per part (a batch of uploads names one to three); a part
    /// already there is left as it is.
    func addReceiptParts(of jobs: [VerificationJob], _ db: any SQLConnection) throws {
        let digests = Set(jobs.compactMap { $0.storedReceipt.flatMap(StoredReceipt.digest(of:)) })
        guard !digests.isEmpty else { return }
        try JWSHeaderRepository(db: db, dialect: database.dialect).add(receiptCertificates.headers(digests.sorted()))
    }

    /// Remembers the certificates of a receipt whose chain verified and that carries exactly that chain, in order
    /// (`InspectedReceipt.certificatesAreChain`), so that later uploads with the same ones are stored without them. Only
    /// such receipts teach it: an upload's own certificates could be anything, and each one remembered takes a place
    /// (`JWSHeaderBook.capacity`) and, once an upload names it, a row.
    func learnCertificates(of receipt: String) {
        for part in StoredReceipt.parts(of: receipt) { _ = receiptCertificates.digest(Array(part.utf8)[...]) }
    }

    /// The compact JWS a stored text stands for, its headers read in `db`; `internal_error` if one is missing.
    func expandedJWS(_ stored: String, _ db: any SQLConnection) throws -> String {
        let digests = StoredJWS.headerDigests(of: stored)
        let headers = try JWSHeaderRepository(db: db, dialect: database.dialect).headers(digests)
        guard let jws = StoredJWS.expand(stored, header: { headers[$0] }) else {
            throw ServerError(.internalError, "A stored JWS names a header this database does not hold.")
        }
        return jws
    }

    /// One recorded notification with the `signedPayload` Apple sent, byte for byte; `notification_not_found` if none.
    func recordedNotification(_ uuid: String) async throws -> RecordedNotification {
        let notFound = ServerError(.notificationNotFound, "No notification \(uuid.utf8.count <= 64 ? uuid : "with an id that long") is recorded.")
        guard uuid.utf8.count <= 64 else { throw notFound }
        return try await database.longRead { db in
            guard let found = try NotificationRepository(db: db).find(uuid) else { throw notFound }
            var notification = found.0
            notification.signedPayload = try self.expandedJWS(found.1, db)
            return notification
        }
    }
}
