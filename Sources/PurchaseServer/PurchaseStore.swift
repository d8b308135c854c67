import AppStoreCrypto
import AppStoreModels
import Foundation
import Locking
import Storage
import Synchronization

/// Every SQL statement of the purchase server, over SQLite or PostgreSQL.
public final class PurchaseStore: Sendable {
    public let database: any SQLDatabase
    static let jobsChannel = "storekeeper_jobs"
    /// Every live API key by hash, loaded at start and refreshed every second (`refreshKeys`).
    let keyRing = Locked<[String: APIKeyRecord]>([:])
    /// Seals shared secrets, Server API private keys and user-token secrets at rest (nil: stored as given).
    let secrets: SecretBox?
    private let appCache = Locked<[String: (app: ServerApp, expires: Date)]>([:])
    private let appsCache = Locked<(apps: [ServerApp], expires: Date)?>(nil)
    let uploads = GroupCommit<VerificationJob, Void>()
    let settlements = GroupCommit<Settlement, (JobState, SettlementResult)?>(maxBatch: 256)

    public init(database: any SQLDatabase, secrets: SecretBox? = nil) {
        self.database = database
        self.secrets = secrets
    }

    /// An app, remembered for two seconds (the worker asks once per job).
    func cachedApp(_ id: String) async throws -> ServerApp? {
        let now = Date()
        if let cached = appCache.withLock({ $0[id] }), now < cached.expires { return cached.app }
        guard let app = try await app(id) else { return nil }
        appCache.withLock { $0[id] = (app, now.addingTimeInterval(2)) }
        return app
    }

    /// The app accepting `bundleId`, from a list remembered for two seconds (every notification asks).
    func cachedApp(forBundle bundleId: String) async throws -> ServerApp? {
        let now = Date()
        let apps: [ServerApp]
        if let cached = appsCache.withLock({ $0 }), now < cached.expires {
            apps = cached.apps
        } else {
            apps = try await self.apps()
            appsCache.withLock { $0 = (apps, now.addingTimeInterval(2)) }
        }
        return apps.first { $0.bundleIds.contains(bundleId) }
    }

    /// Creates or upgrades the schema.
    public func migrate() async throws { try await database.migrate(Schema.migrations) }

    // MARK: Apps and keys

    /// Registers an app (fails if it exists).
    public func createApp(_ app: ServerApp, now: Date) async throws {
        try Self.validate(app)
        appsCache.withLock { $0 = nil }
        try await database.transaction { db in
            let existing = try db.query("SELECT id FROM apps WHERE id = ?", [app.id])
            guard existing.isEmpty else { throw ServerError(409, "app_exists", "App \(app.id) is already registered.") }
            try db.query("""
                INSERT INTO apps (id, name, shared_secret, bundle_ids, replay_policy, sandbox_policy, sandbox_allow_list, quirk_21002_policy, created_at,
                app_apple_id, server_api_issuer_id, server_api_key_id, server_api_private_key, consumption_policy, user_auth, user_token_secret,
                user_token_public_key)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                """, [app.id, app.name, try self.seal(app.sharedSecret), app.bundleIds.joined(separator: ","), app.replayPolicy.rawValue,
                      app.sandboxPolicy.rawValue, app.sandboxAllowList.joined(separator: ","), app.quirk21002Policy.rawValue, now.milliseconds,
                      app.appAppleId, app.serverAPIKey?.issuerId, app.serverAPIKey?.keyId, try self.seal(app.serverAPIKey?.privateKey),
                      app.consumptionPolicy.rawValue, app.userAuth.rawValue, try self.seal(app.userTokenSecret), app.userTokenPublicKey])
        }
    }

    /// Replaces an app's settings.
    public func updateApp(_ app: ServerApp) async throws {
        appCache.withLock { $0[app.id] = nil }
        appsCache.withLock { $0 = nil }
        try Self.validate(app)
        let updated = try await database.transaction { db in
            try db.query("""
                UPDATE apps SET name = ?, shared_secret = ?, bundle_ids = ?, replay_policy = ?, sandbox_policy = ?, sandbox_allow_list = ?,
                quirk_21002_policy = ?, app_apple_id = ?, server_api_issuer_id = ?, server_api_key_id = ?, server_api_private_key = ?,
                consumption_policy = ?, user_auth = ?, user_token_secret = ?, user_token_public_key = ? WHERE id = ? RETURNING id
                """, [app.name, try self.seal(app.sharedSecret), app.bundleIds.joined(separator: ","), app.replayPolicy.rawValue, app.sandboxPolicy.rawValue,
                      app.sandboxAllowList.joined(separator: ","), app.quirk21002Policy.rawValue, app.appAppleId, app.serverAPIKey?.issuerId,
                      app.serverAPIKey?.keyId, try self.seal(app.serverAPIKey?.privateKey), app.consumptionPolicy.rawValue, app.userAuth.rawValue,
                      try self.seal(app.userTokenSecret), app.userTokenPublicKey, app.id]).count
        }
        guard updated == 1 else { throw ServerError(404, "app_not_found", "App \(app.id) is not registered.") }
    }

    static func validate(_ app: ServerApp) throws {
        guard !app.id.isEmpty, app.id.count <= 200, !app.bundleIds.isEmpty, app.bundleIds.allSatisfy({ !$0.isEmpty && !$0.contains(",") }) else {
            throw ServerError(400, "invalid_app", "An app needs an id and bundle ids (without commas).")
        }
        guard app.sandboxAllowList.allSatisfy({ !$0.contains(",") }) else {
            throw ServerError(400, "invalid_app", "Sandbox allow-list entries cannot contain commas.")
        }
        if let key = app.serverAPIKey, (try? PrivateKey(pem: key.privateKey)) == nil || key.keyId.isEmpty || key.issuerId.isEmpty {
            throw ServerError(400, "invalid_server_api_key", "serverAPIKey needs issuerId, keyId and privateKey (the .p8 PEM of an In-App Purchase key).")
        }
        if let pem = app.userTokenPublicKey, pem.utf8.count > 4096 || (try? PublicKey(pem: pem)) == nil {
            throw ServerError(400, "invalid_user_token_key", "userTokenPublicKey must be a PEM EC P-256 public key.")
        }
        if let secret = app.userTokenSecret, !(16...512).contains(secret.utf8.count) {
            throw ServerError(400, "invalid_user_token_secret", "userTokenSecret must be 16–512 bytes.")
        }
    }

    /// One app, or nil.
    public func app(_ id: String) async throws -> ServerApp? {
        try await database.transaction { db in try db.query("SELECT * FROM apps WHERE id = ?", [id]).first.map(self.app) }
    }

    /// Every app.
    public func apps() async throws -> [ServerApp] {
        try await database.transaction { db in try db.query("SELECT * FROM apps ORDER BY id").map(self.app) }
    }

    /// Seals a secret for storage with the master key (as given when there is none).
    func seal(_ secret: String?) throws -> String? {
        guard let secret, let secrets else { return secret }
        return try secrets.seal(secret)
    }

    /// Opens a stored secret; a sealed value that does not open (no or another master key) reads as absent.
    static func unseal(_ stored: String?, _ secrets: SecretBox?) -> String? {
        guard let stored else { return nil }
        guard SecretBox.isSealed(stored) else { return stored }
        return try? secrets?.open(stored)
    }

    func app(_ row: SQLRow) -> ServerApp { Self.app(row, secrets: secrets) }

    /// An app from its row; secrets are opened with `secrets` (settlement, which needs none, passes nil).
    static func app(_ row: SQLRow, secrets: SecretBox?) -> ServerApp {
        func unseal(_ stored: String?) -> String? { Self.unseal(stored, secrets) }
        func list(_ name: String) -> [String] { (row.string(name) ?? "").split(separator: ",").map(String.init) }
        return ServerApp(id: row.string("id") ?? "", name: row.string("name"), sharedSecret: unseal(row.string("shared_secret")),
                         bundleIds: list("bundle_ids"), replayPolicy: ReplayPolicy(rawValue: row.string("replay_policy") ?? "") ?? .reject,
                         sandboxPolicy: SandboxPolicy(rawValue: row.string("sandbox_policy") ?? "") ?? .allow,
                         sandboxAllowList: list("sandbox_allow_list"),
                         quirk21002Policy: Quirk21002Policy(rawValue: row.string("quirk_21002_policy") ?? "") ?? .retrySandbox,
                         appAppleId: row.int("app_apple_id"),
                         serverAPIKey: row.string("server_api_key_id").flatMap { keyId in
                             row.string("server_api_issuer_id").flatMap { issuer in
                                 unseal(row.string("server_api_private_key")).map { ServerAPICredentials(issuerId: issuer, keyId: keyId, privateKey: $0) }
                             }
                         },
                         consumptionPolicy: ConsumptionPolicy(rawValue: row.string("consumption_policy") ?? "") ?? .ignore,
                         userAuth: UserAuthPolicy(rawValue: row.string("user_auth") ?? "") ?? .required,
                         userTokenSecret: unseal(row.string("user_token_secret")), userTokenPublicKey: row.string("user_token_public_key"))
    }

    // MARK: Products

    /// Creates or replaces what a product grants.
    public func setProduct(appId: String, _ product: ProductMapping) async throws {
        guard CatalogProduct.isValidIdentifier(product.productId) else {
            throw ServerError(400, "invalid_product_id", "Product identifier '\(product.productId)' may contain only letters, digits, periods and underscores.")
        }
        switch product.type {
        case .consumable:
            guard product.currency != nil, ProductMapping.acceptedAmounts.contains(product.amount ?? 0) else {
                throw ServerError(400, "invalid_product", "A consumable credits a currency by an amount of 1…\(ProductMapping.acceptedAmounts.upperBound).")
            }
            if let currency = product.currency { _ = try ClientIdentifier(currency, .currency) }
        case .nonRenewing:
            guard product.entitlement != nil, ProductMapping.acceptedDurationDays.contains(product.durationDays ?? 0) else {
                throw ServerError(400, "invalid_product",
                                  "A non-renewing subscription grants an entitlement for 1…\(ProductMapping.acceptedDurationDays.upperBound) days.")
            }
        default:
            guard product.entitlement != nil else { throw ServerError(400, "invalid_product", "This product type grants an entitlement.") }
        }
        if let price = product.price, Decimal(string: price) == nil {
            throw ServerError(400, "invalid_price", "Price '\(price)' is not a decimal number.")
        }
        try await database.transaction { db in
            guard try !db.query("SELECT id FROM apps WHERE id = ?", [appId]).isEmpty else {
                throw ServerError(404, "app_not_found", "App \(appId) is not registered.")
            }
            try db.query("DELETE FROM products WHERE app_id = ? AND product_id = ?", [appId, product.productId])
            try db.query("""
                INSERT INTO products (app_id, product_id, type, entitlement, currency, amount, duration_days, price, price_currency)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                """, [appId, product.productId, product.type.rawValue, product.entitlement, product.currency, product.amount,
                      product.durationDays, product.price, product.priceCurrency])
        }
    }

    /// The product mappings of an app.
    public func products(appId: String) async throws -> [ProductMapping] {
        try await database.transaction { db in try Self.products(db, appId: appId) }
    }

    static func products(_ db: any SQLConnection, appId: String) throws -> [ProductMapping] {
        try db.query("SELECT * FROM products WHERE app_id = ? ORDER BY product_id", [appId]).map { row in
            ProductMapping(productId: row.string("product_id") ?? "", type: ProductType(rawValue: row.string("type") ?? "") ?? .consumable,
                           entitlement: row.string("entitlement"), currency: row.string("currency"), amount: row.int("amount"),
                           durationDays: row.int("duration_days"), price: row.string("price"), priceCurrency: row.string("price_currency"))
        }
    }

    /// Appends an audit event.
    static func audit(_ db: any SQLConnection, appId: String, userId: String?, kind: String, detail: [String: String], now: Date) throws {
        var json = JSONBuffer(capacity: 128)
        json.object { json in
            for (name, value) in detail.sorted(by: { $0.key < $1.key }) { json.field(name, value) }
        }
        let body = String(decoding: json.bytes, as: UTF8.self)
        try db.query("INSERT INTO audit_events (id, app_id, app_user_id, kind, detail, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                     [UUID().uuidString.lowercased(), appId, userId, kind, body, now.milliseconds])
    }
}

/// API keys: random, shown once, stored as SHA-256.
public enum APIKey {
    /// 32 random bytes as hex.
    public static func random() -> String {
        var generator = SystemRandomNumberGenerator()
        return (0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) }.hexString
    }

    /// The stored form of a key.
    public static func hash(_ key: String) -> String {
        Digest.sha256.hash(Array(key.utf8)).hexString
    }
}

extension Date {
    /// Unix milliseconds, as the App Store writes them (one definition: ReceiptDate's).
    var milliseconds: Int64 { ReceiptDate.milliseconds(self) }
    init(milliseconds: Int64) { self = ReceiptDate.date(milliseconds: milliseconds) }
}
