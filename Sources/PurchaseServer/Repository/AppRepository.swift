import AppStoreCrypto
import AppStoreModels
import Foundation
import Storage

/// The SQL of the `apps`, `products` and `server_settings` tables. Secrets (shared secrets, Server API
/// private keys, user-token secrets) are sealed with `secrets` on the way in and opened on the way out;
/// with no master key they are stored as given, and a sealed value that does not open reads as absent.
struct AppRepository {
    let db: any SQLConnection
    let secrets: SecretBox?

    func exists(_ id: String) throws -> Bool {
        try !db.query("SELECT id FROM apps WHERE id = ?", [id]).isEmpty
    }

    func insert(_ app: ServerApp, now: Date) throws {
        try db.query("""
            INSERT INTO apps (id, name, shared_secret, bundle_ids, replay_policy, sandbox_policy, sandbox_allow_list, quirk_21002_policy, created_at,
            app_apple_id, server_api_issuer_id, server_api_key_id, server_api_private_key, consumption_policy, user_auth, user_token_secret,
            user_token_public_key)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """, [app.id, app.name, try seal(app.sharedSecret), app.bundleIds.joined(separator: ","), app.replayPolicy.rawValue,
                  app.sandboxPolicy.rawValue, app.sandboxAllowList.joined(separator: ","), app.quirk21002Policy.rawValue, now.milliseconds,
                  app.appAppleId, app.serverAPIKey?.issuerId, app.serverAPIKey?.keyId, try seal(app.serverAPIKey?.privateKey),
                  app.consumptionPolicy.rawValue, app.userAuth.rawValue, try seal(app.userTokenSecret), app.userTokenPublicKey])
    }

    /// Replaces an app's settings; false when there is no such app.
    func update(_ app: ServerApp) throws -> Bool {
        try db.query("""
            UPDATE apps SET name = ?, shared_secret = ?, bundle_ids = ?, replay_policy = ?, sandbox_policy = ?, sandbox_allow_list = ?,
            quirk_21002_policy = ?, app_apple_id = ?, server_api_issuer_id = ?, server_api_key_id = ?, server_api_private_key = ?,
            consumption_policy = ?, user_auth = ?, user_token_secret = ?, user_token_public_key = ? WHERE id = ? RETURNING id
            """, [app.name, try seal(app.sharedSecret), app.bundleIds.joined(separator: ","), app.replayPolicy.rawValue, app.sandboxPolicy.rawValue,
                  app.sandboxAllowList.joined(separator: ","), app.quirk21002Policy.rawValue, app.appAppleId, app.serverAPIKey?.issuerId,
                  app.serverAPIKey?.keyId, try seal(app.serverAPIKey?.privateKey), app.consumptionPolicy.rawValue, app.userAuth.rawValue,
                  try seal(app.userTokenSecret), app.userTokenPublicKey, app.id]).count == 1
    }

    func app(_ id: String) throws -> ServerApp? {
        try db.query("SELECT * FROM apps WHERE id = ?", [id]).first.map(app)
    }

    func all() throws -> [ServerApp] {
        try db.query("SELECT * FROM apps ORDER BY id").map(app)
    }

    /// Creates or replaces what a product grants.
    func setProduct(appId: String, _ product: ProductMapping) throws {
        try db.query("DELETE FROM products WHERE app_id = ? AND product_id = ?", [appId, product.productId])
        try db.query("""
            INSERT INTO products (app_id, product_id, type, entitlement, currency, amount, duration_days, price, price_currency)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
            """, [appId, product.productId, product.type.rawValue, product.entitlement, product.currency, product.amount,
                  product.durationDays, product.price, product.priceCurrency])
    }

    func products(appId: String) throws -> [ProductMapping] {
        Self.products(try db.query(together: [Self.productsStatement(appId: appId)])[0])
    }

    static func productsStatement(appId: String) -> SQLStatement {
        SQLStatement("SELECT * FROM products WHERE app_id = ? ORDER BY product_id", [appId])
    }

    static func products(_ rows: [SQLRow]) -> [ProductMapping] {
        rows.map { row in
            ProductMapping(productId: row.string("product_id") ?? "", type: ProductType(rawValue: row.string("type") ?? "") ?? .consumable,
                           entitlement: row.string("entitlement"), currency: row.string("currency"), amount: row.int("amount"),
                           durationDays: row.int("duration_days"), price: row.string("price"), priceCurrency: row.string("price_currency"))
        }
    }

    /// A server-wide setting (`master_key_check`).
    func setting(_ name: String) throws -> String? {
        try db.query("SELECT value FROM server_settings WHERE name = ?", [name]).first?.string("value")
    }

    /// Stores a setting unless one is already stored (the first process wins).
    func insertSetting(_ name: String, _ value: String) throws {
        try db.query("INSERT INTO server_settings (name, value) VALUES (?, ?) ON CONFLICT DO NOTHING", [name, value])
    }

    private func seal(_ secret: String?) throws -> String? { try SecretColumns(secrets: secrets).seal(secret) }
    private func unseal(_ stored: String?) -> String? { SecretColumns(secrets: secrets).unseal(stored) }

    private func app(_ row: SQLRow) -> ServerApp {
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
}
