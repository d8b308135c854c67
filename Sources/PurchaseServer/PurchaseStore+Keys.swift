import AppStoreCrypto
import Foundation
import Storage

/// The two kinds of app keys, as Stripe has them.
public enum APIKeyKind: String, Codable, Sendable, CaseIterable {
    /// `pk_…`: shipped inside the app; uploads, and reads or restores only the user of a user token.
    case `public`
    /// `sk_…`: kept on the developer's backend; acts for any user of its app.
    case secret

    /// The prefix keys of this kind start with.
    public var prefix: String { self == .public ? "pk_" : "sk_" }
}

/// A live API key as the key ring holds it (never the key itself, only its hash).
public struct APIKeyRecord: Sendable, Equatable, Codable {
    /// A stable id to name the key by (`key_` and the first 16 hex digits of its hash).
    public var id: String
    public var appId: String
    public var kind: APIKeyKind
    public var label: String?
    /// The key's last four characters, to tell keys apart in a list.
    public var hint: String?
    public var createdAt: Int64
    /// When the key stops working (Unix ms): set by revoke (now) or rotate (after a grace period).
    public var revokedAt: Int64?

    /// Whether the key works at `now` (Unix ms).
    public func isLive(at now: Int64) -> Bool { revokedAt.map { now < $0 } ?? true }

    static func id(forHash hash: String) -> String { "key_" + hash.prefix(16) }
}

/// The live keys by hash, and how many changes this process made to them: a reload that read the database before
/// one of them committed must not put back what it changed (a new key missing, a revoked one live) for a second.
struct KeyRing {
    var records: [String: APIKeyRecord] = [:]
    var changes = 0

    mutating func set(_ record: APIKeyRecord?, hash: String) {
        records[hash] = record
        changes += 1
    }
}

extension PurchaseStore {
    /// Creates an API key of `kind` for an app and returns it; only its SHA-256 is stored.
    public func createKey(appId: String, label: String?, kind: APIKeyKind = .secret, now: Date) async throws -> String {
        let key = kind.prefix + APIKey.random()
        let hash = APIKey.hash(key)
        let record = APIKeyRecord(id: APIKeyRecord.id(forHash: hash), appId: appId, kind: kind, label: label, hint: String(key.suffix(4)),
                                  createdAt: now.milliseconds, revokedAt: nil)
        try await database.transaction { db in
            guard try self.apps(db).exists(appId) else { throw ServerError(.appNotFound, "App \(appId) is not registered.") }
            try KeyRepository(db: db).insert(hash: hash, record)
        }
        keyRing.withLock { $0.set(record, hash: hash) }
        return key
    }

    /// The live key record for `key`, from memory: no database call, so the HTTP edge can ask it
    /// before reading a body. Revocations reach every process within a second (`refreshKeys`).
    public func liveKey(_ key: String, now: Date) -> APIKeyRecord? {
        guard key.utf8.count <= 128 else { return nil }
        let nowMs = now.milliseconds
        // Hashed outside the lock, which every request takes (on libmicrohttpd's threads and the pool alike):
        // held for a dictionary lookup only.
        let hash = APIKey.hash(key)
        return keyRing.withLock { $0.records[hash] }.flatMap { $0.isLive(at: nowMs) ? $0 : nil }
    }

    /// Reloads every key that has not been revoked (or whose revocation is still ahead).
    /// A change this process made while the keys were read is read again (at most three times; else the next reload).
    public func refreshKeys(now: Date) async throws {
        for _ in 0..<3 {
            let changes = keyRing.withLock { $0.changes }
            let live = try await database.transaction { db in try KeyRepository(db: db).live(now: now) }
            let replaced = keyRing.withLock { ring -> Bool in
                guard ring.changes == changes else { return false }
                ring.records = live
                return true
            }
            if replaced { return }
        }
    }

    /// Every key of an app, revoked ones included, oldest first.
    public func keys(appId: String) async throws -> [APIKeyRecord] {
        try await database.transaction { db in
            try KeyRepository(db: db).keys(appId: appId).map(\.record)
        }
    }

    /// Revokes a key of an app by id, at once or at `effective` (a rotation's grace period). Returns the record.
    @discardableResult
    public func revokeKey(appId: String, id: String, effective: Date, now: Date) async throws -> APIKeyRecord {
        let revoked = try await database.transaction { db -> (String, APIKeyRecord)? in
            let keys = KeyRepository(db: db)
            for (hash, found) in try keys.keys(appId: appId) where found.id == id {
                var record = found
                let at = min(record.revokedAt ?? .max, effective.milliseconds)
                try keys.setRevoked(hash: hash, at: at)
                record.revokedAt = at
                try self.audit(db).append(appId: appId, userId: nil, kind: "api_key_revoked",
                                          detail: ["keyId": id, "kind": record.kind.rawValue, "effectiveAt": String(at)], now: now)
                return (hash, record)
            }
            return nil
        }
        guard let (hash, record) = revoked else { throw ServerError(.keyNotFound, "App \(appId) has no key \(id).") }
        keyRing.withLock { $0.set(record.isLive(at: now.milliseconds) ? record : nil, hash: hash) }
        return record
    }

    /// Rotates a key: a new key of the same kind and label, and the old one revoked after `grace`. Returns the new key.
    public func rotateKey(appId: String, id: String, grace: TimeInterval, now: Date) async throws -> (key: String, record: APIKeyRecord) {
        guard let old = try await keys(appId: appId).first(where: { $0.id == id }), old.isLive(at: now.milliseconds) else {
            throw ServerError(.keyNotFound, "App \(appId) has no live key \(id).")
        }
        let key = try await createKey(appId: appId, label: old.label, kind: old.kind, now: now)
        try await revokeKey(appId: appId, id: id, effective: now.addingTimeInterval(max(0, grace)), now: now)
        guard let record = liveKey(key, now: now) else { throw ServerError(.internalError, "The new key is not live.") }
        return (key, record)
    }
}

extension PurchaseStore {
    /// Makes sure this process's master key is the one the database's secrets were sealed with: the first
    /// process to run stores a sealed check value; any later one with another key (or none, once secrets
    /// are sealed) refuses to start rather than read secrets as missing and overwrite them.
    public func checkMasterKey() async throws {
        let expected = "storekeeper master key check"
        let stored = try await database.transaction { db in try self.apps(db).setting("master_key_check") }
        guard let stored else {
            guard let secrets else { return }
            let sealed = try secrets.seal(expected)
            try await database.transaction { db in try self.apps(db).insertSetting("master_key_check", sealed) }
            return try await checkMasterKey()
        }
        guard let secrets, (try? secrets.open(stored)) == expected else {
            throw ServerError(.masterKeyMismatch,
                              "The database's secrets are sealed with another master key: give this process the same STOREKEEPER_MASTER_KEY (or DIR/master-key).")
        }
    }
}
