import AppStoreCrypto
import Foundation
import Locking
import Storage

/// The SQL of `jws_headers`: each JWS header a stored JWS names (`StoredJWS`), by its SHA-256. Rows are never changed
/// or deleted, so a digest once committed names its header for good, in every process.
struct JWSHeaderRepository {
    let db: any SQLConnection

    /// Adds headers not yet stored (another process may have added one first: that row is the same).
    func add(_ headers: [(digest: String, header: String)]) throws {
        for (digest, header) in headers {
            _ = try db.query("INSERT INTO jws_headers (digest, header) VALUES (?, ?) ON CONFLICT (digest) DO NOTHING", [digest, header])
        }
    }

    /// The headers stored under these digests (those not stored are missing from the answer).
    func headers(_ digests: [String]) throws -> [String: String] {
        guard !digests.isEmpty else { return [:] }
        let marks = Array(repeating: "?", count: digests.count).joined(separator: ", ")
        var found: [String: String] = [:]
        for row in try db.query("SELECT digest, header FROM jws_headers WHERE digest IN (\(marks))", digests) {
            if let digest = row.string("digest"), let header = row.string("header") { found[digest] = header }
        }
        return found
    }
}

/// This process's memory of JWS headers: the digest of each header seen (so a notification's header is hashed once,
/// not per notification), and which are known to be committed in `jws_headers` (so they are not written again).
/// Bounded: past `capacity` headers, a new one gets no digest and its JWS is stored as it came. Headers come only from
/// JWS whose chain verified (Apple's signing keys, a few a year), so the bound is never reached in use.
final class JWSHeaderBook: Sendable {
    static let capacity = 64
    private struct Entry {
        let header: [UInt8]
        let digest: String
        var committed = false
    }
    private let entries = Locked<[Entry]>([])

    /// The header's SHA-256 in lowercase hex; nil once `capacity` other headers are known. Found by comparing bytes
    /// (a few headers, kilobytes each: cheaper than hashing them for a dictionary).
    func digest(_ header: ArraySlice<UInt8>) -> String? {
        if let known = entries.withLock({ $0.first { StoredJWS.equal($0.header[...], header) }?.digest }) { return known }
        let digest = Digest.sha256.hash(header).hexString
        return entries.withLock { entries in
            if let known = entries.first(where: { StoredJWS.equal($0.header[...], header) }) { return known.digest }
            guard entries.count < Self.capacity else { return nil }
            entries.append(Entry(header: Array(header), digest: digest))
            return digest
        }
    }

    /// The headers a stored form names that are not known to be committed, with their text.
    func uncommitted(in stored: String) -> [(digest: String, header: String)] {
        let digests = StoredJWS.headerDigests(of: stored)
        guard !digests.isEmpty else { return [] }
        return entries.withLock { entries in
            digests.compactMap { digest in
                entries.first { $0.digest == digest && !$0.committed }.map { (digest, String(decoding: $0.header, as: UTF8.self)) }
            }
        }
    }

    /// Notes headers as committed (after the transaction that added them, or found them, committed).
    func committed(_ digests: [String]) {
        guard !digests.isEmpty else { return }
        entries.withLock { entries in
            for index in entries.indices where digests.contains(entries[index].digest) { entries[index].committed = true }
        }
    }
}

/// A JWS in its stored form, with the headers it names that must be added in the transaction that stores it.
struct StoredJWSText: Sendable {
    let text: String
    let newHeaders: [(digest: String, header: String)]
}

extension PurchaseStore {
    /// `jws` as stored (`StoredJWS`): headers this process knows replaced by their digests. Pass it to
    /// `addHeaders` in the transaction that writes it, and to `headersCommitted` once that transaction commits.
    func storedJWS(_ jws: String, carried: [String] = []) -> StoredJWSText {
        let text = StoredJWS.compact(jws, carried: carried, digest: jwsHeaders.digest)
        return StoredJWSText(text: text, newHeaders: jwsHeaders.uncommitted(in: text))
    }

    func addHeaders(of stored: StoredJWSText, _ db: any SQLConnection) throws {
        try JWSHeaderRepository(db: db).add(stored.newHeaders)
    }

    func headersCommitted(of stored: StoredJWSText) { jwsHeaders.committed(stored.newHeaders.map(\.digest)) }

    /// The compact JWS a stored text stands for, its headers read in `db`; `internal_error` if one is missing.
    func expandedJWS(_ stored: String, _ db: any SQLConnection) throws -> String {
        let digests = StoredJWS.headerDigests(of: stored)
        let headers = try JWSHeaderRepository(db: db).headers(digests)
        guard let jws = StoredJWS.expand(stored, header: { headers[$0] }) else {
            throw ServerError(.internalError, "A stored JWS names a header this database does not hold.")
        }
        return jws
    }
}

extension PurchaseStore {
    /// One recorded notification with the `signedPayload` Apple sent, byte for byte; `notification_not_found` if none.
    func recordedNotification(_ uuid: String) async throws -> RecordedNotification {
        try await database.longRead { db in
            guard uuid.utf8.count <= 64, var (notification, stored) = try NotificationRepository(db: db).find(uuid) else {
                throw ServerError(.notificationNotFound, "No notification \(uuid.utf8.count <= 64 ? uuid : "with an id that long") is recorded.")
            }
            notification.signedPayload = try self.expandedJWS(stored, db)
            return notification
        }
    }
}
