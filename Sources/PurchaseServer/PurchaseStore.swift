import AppStoreCrypto
import AppStoreModels
import Clocks
import Foundation
import Locking
import Storage
import Synchronization

/// The purchase server's use of its database, over SQLite or PostgreSQL: each method is one
/// transaction that asks the repositories (`Repository/`, one per table group, where every SQL
/// statement lives) and the rules (`SettlementPlan`, `EntitlementCalculator`).
public final class PurchaseStore: Sendable {
    public let database: any SQLDatabase
    /// Where new job and audit ids come from.
    let ids: any IDGenerator
    static let jobsChannel = "storekeeper_jobs"
    /// Every live API key by hash, loaded at start and refreshed every second (`refreshKeys`).
    let keyRing = Locked(KeyRing())
    /// Seals shared secrets, Server API private keys and user-token secrets at rest (nil: stored as given).
    let secrets: SecretBox?
    /// Apps remembered for two seconds (`cachedApp`), and a generation that a change of an app in this process moves on
    /// once committed: an app read before that is not remembered, so no read that began before the change keeps it out of
    /// date (another process's change shows within the two seconds).
    private let appCache = Locked(AppCache())
    /// Whether `users.app_user_id` sorts by code point, once asked (the customer search's prefix range relies on it).
    let userIdOrder = Locked<Bool?>(nil)
    /// Each app's product mappings as a user view reads them, remembered for two seconds (dropped here at once
    /// when this process changes one; another process's change shows within the two seconds).
    private let productsCache = Locked<(entries: [String: (mappings: [String: ProductMapping], expires: ContinuousClock.Instant)],
                                        generation: Int)>(([:], 0))
    /// Uploads' intake, gathered on SQLite (`Gathering.uploads`); on PostgreSQL, gathered, the machine spent the same per
    /// receipt (lab, 2,000/s instantly), so it is not.
    let uploads: GroupCommit<VerificationJob, Void>
    /// Whether this process's worker is running with room for more jobs. New jobs are then left to it, and other
    /// processes' workers are not woken at commit (PostgreSQL `NOTIFY`): with three processes, every commit of uploads
    /// in any of them woke all three workers, and each claimed a few jobs (6,495 claims for 48,000 jobs, bench/README,
    /// twelfth round). Jobs a busy or stopped worker leaves are woken for, and the others' polls find them anyway.
    let localWorkerHasRoom = Atomic<Bool>(false)
    /// Settlement batches: on PostgreSQL two commit at once, each on its own connection (a batch waits on round trips
    /// as much as it works, so one at a time left both the server and the database half idle: 1,126 receipts/s of
    /// 1,500 offered, 1,468 with two); SQLite has one writer. Two uploads' lanes made no difference. On SQLite a batch
    /// waits for company a tenth of the time Apple took to answer its oldest settlement (`Gathering.settlements`); gathered
    /// for 10 or 25 ms, whatever Apple took, they had been no cheaper (bench/README, thirty-sixth round).
    let settlements: GroupCommit<Settlement, (JobState, SettlementResult)?>
    /// Woken when webhook events are written (the deliverer sleeps on it between passes).
    let webhookSignal = WakeSignal()
    /// Counts webhook events written, in the writing transaction (so also those rolled back): a write that saw it move
    /// while it ran wakes the deliverer after its commit (`wakingWebhooks`). Waking after every settlement and
    /// notification ran the deliverer's claim, a write transaction, for apps with no endpoint at all (68 a second of
    /// SQLite's 570 transactions a second at 900 receipts a second).
    let webhookEventsWritten = Atomic<Int>(0)
    /// Console password hashing and checks (scrypt, ~32 MB and tens of ms each): two at a time off the shared threads, 8 in flight at most.
    /// JWS headers seen and stored (`StoredJWS`, `jws_headers`).
    let jwsHeaders = JWSHeaderBook()
    /// Receipts' certificates seen in receipts that verified, and stored (`StoredReceipt`, `jws_headers`).
    let receiptCertificates = JWSHeaderBook()
    let passwordChecks = BoundedWork(label: "storekeeper.passwords", width: 2, maximumPending: 8)

    public init(database: any SQLDatabase, secrets: SecretBox? = nil, ids: any IDGenerator = RandomIDs()) {
        self.database = database
        self.secrets = secrets
        self.ids = ids
        uploads = GroupCommit(gathering: database.dialect == .sqlite ? .uploads : nil)
        settlements = database.dialect == .sqlite
            ? GroupCommit(maxBatch: Gathering.settlements.below, gathering: .settlements)
            : GroupCommit(maxBatch: 256, lanes: 2)
    }

    func apps(_ db: any SQLConnection) -> AppRepository { AppRepository(db: db, secrets: secrets) }
    func audit(_ db: any SQLConnection) -> AuditRepository { AuditRepository(db: db, ids: ids) }

    /// An app, remembered for two seconds (the worker asks once per job).
    func cachedApp(_ id: String) async throws -> ServerApp? {
        let now = Date()
        let (cached, generation) = appCache.withLock { ($0.app(id, at: now), $0.generation) }
        if let cached { return cached }
        guard let app = try await app(id) else { return nil }
        appCache.withLock { $0.remember(app, readAt: now, generation: generation) }
        return app
    }

    /// The app accepting `bundleId`, from a list remembered for two seconds (every notification asks).
    func cachedApp(forBundle bundleId: String) async throws -> ServerApp? {
        let now = Date()
        let apps: [ServerApp]
        let (cached, generation) = appCache.withLock { ($0.apps(at: now), $0.generation) }
        if let cached {
            apps = cached
        } else {
            apps = try await self.apps()
            appCache.withLock { $0.remember(all: apps, readAt: now, generation: generation) }
        }
        return apps.first { $0.bundleIds.contains(bundleId) }
    }

    /// The product mappings of `appId` remembered less than two seconds ago, or nil; and the cache's generation,
    /// to hand back to `rememberProducts` with what was read instead.
    func cachedProducts(_ appId: String) -> (mappings: [String: ProductMapping]?, generation: Int) {
        productsCache.withLock { cache in
            guard let entry = cache.entries[appId], ContinuousClock.now < entry.expires else { return (nil, cache.generation) }
            return (entry.mappings, cache.generation)
        }
    }

    /// Remembers mappings read while the cache was at `generation`; a change made since (`setProduct`) wins.
    func rememberProducts(_ mappings: [String: ProductMapping], appId: String, generation: Int) {
        productsCache.withLock { cache in
            guard cache.generation == generation else { return }
            if cache.entries.count > 1024 { cache.entries.removeAll() }
            cache.entries[appId] = (mappings, ContinuousClock.now.advanced(by: .seconds(2)))
        }
    }

    private func forgetProducts(_ appId: String) {
        productsCache.withLock { cache in
            cache.entries[appId] = nil
            cache.generation += 1
        }
    }

    /// Creates or upgrades the schema.
    public func migrate() async throws { try await database.migrate(Schema.migrations) }

    // MARK: Apps and keys

    /// Registers an app (fails if it exists).
    public func createApp(_ app: ServerApp, now: Date) async throws {
        try Self.validate(app)
        defer { forgetApps() }
        try await database.transaction { db in
            let apps = self.apps(db)
            guard try !apps.exists(app.id) else { throw ServerError(.appExists, "App \(app.id) is already registered.") }
            try apps.insert(app, now: now)
        }
    }

    /// Replaces an app's settings.
    public func updateApp(_ app: ServerApp) async throws {
        try Self.validate(app)
        defer { forgetApps() }
        let updated = try await database.transaction { db in try self.apps(db).update(app) }
        guard updated else { throw ServerError(.appNotFound, "App \(app.id) is not registered.") }
    }

    /// Drops the remembered apps once a change of one has committed (or failed), and moves the generation on.
    private func forgetApps() {
        appCache.withLock { $0.forget() }
    }

    static func validate(_ app: ServerApp) throws {
        guard !app.id.isEmpty, app.id.count <= 200, !app.bundleIds.isEmpty, app.bundleIds.allSatisfy({ !$0.isEmpty && !$0.contains(",") }) else {
            throw ServerError(.invalidApp, "An app needs an id and bundle ids (without commas).")
        }
        guard app.sandboxAllowList.allSatisfy({ !$0.contains(",") }) else {
            throw ServerError(.invalidApp, "Sandbox allow-list entries cannot contain commas.")
        }
        if let key = app.serverAPIKey, (try? PrivateKey(pem: key.privateKey)) == nil || key.keyId.isEmpty || key.issuerId.isEmpty {
            throw ServerError(.invalidServerApiKey, "serverAPIKey needs issuerId, keyId and privateKey (the .p8 PEM of an In-App Purchase key).")
        }
        if let pem = app.userTokenPublicKey, pem.utf8.count > 4096 || (try? PublicKey(pem: pem)) == nil {
            throw ServerError(.invalidUserTokenKey, "userTokenPublicKey must be a PEM EC P-256 public key.")
        }
        if let secret = app.userTokenSecret, !(16...512).contains(secret.utf8.count) {
            throw ServerError(.invalidUserTokenSecret, "userTokenSecret must be 16–512 bytes.")
        }
    }

    /// One app, or nil, as last committed: read beside SQLite's only writer, not queued behind it (on the writer when the
    /// database has no reading connections: in memory, or out of WAL mode). The cache's reads (`cachedApp`) came to 160
    /// write transactions a second at 4,500 receipts/s with Apple's latency: every job starting in the 70 ms a read
    /// waited for the writer's queue when the cache's two seconds ran out (bench/README, forty-third round).
    public func app(_ id: String) async throws -> ServerApp? {
        try await database.read { db in try self.apps(db).app(id) }
    }

    /// Every app, as last committed (read as `app(_:)` is).
    public func apps() async throws -> [ServerApp] {
        try await database.read { db in try self.apps(db).all() }
    }

    /// Seals a secret with the master key (as given when there is none).
    func seal(_ secret: String?) throws -> String? {
        guard let secret, let secrets else { return secret }
        return try secrets.seal(secret)
    }

    // MARK: Products

    /// Creates or replaces what a product grants.
    public func setProduct(appId: String, _ product: ProductMapping) async throws {
        var product = product
        guard CatalogProduct.isValidIdentifier(product.productId) else {
            throw ServerError(.invalidProductId, "Product identifier '\(product.productId)' may contain only letters, digits, periods and underscores.")
        }
        switch product.type {
        case .consumable:
            guard product.currency != nil, ProductMapping.acceptedAmounts.contains(product.amount ?? 0) else {
                throw ServerError(.invalidProduct, "A consumable credits a currency by an amount of 1…\(ProductMapping.acceptedAmounts.upperBound).")
            }
            // Stored normalised (NFC), as spends and adjustments name it: the database compares bytes, so a decomposed
            // spelling would credit a balance that no spend could reach.
            if let currency = product.currency { product.currency = try ClientIdentifier(currency, .currency).value }
        case .nonRenewing:
            guard product.entitlement != nil, ProductMapping.acceptedDurationDays.contains(product.durationDays ?? 0) else {
                throw ServerError(.invalidProduct,
                                  "A non-renewing subscription grants an entitlement for 1…\(ProductMapping.acceptedDurationDays.upperBound) days.")
            }
        default:
            guard product.entitlement != nil else { throw ServerError(.invalidProduct, "This product type grants an entitlement.") }
        }
        if let price = product.price, Decimal(string: price) == nil {
            throw ServerError(.invalidPrice, "Price '\(price)' is not a decimal number.")
        }
        forgetProducts(appId)
        let normalised = product
        try await database.transaction { db in
            let apps = self.apps(db)
            guard try apps.exists(appId) else { throw ServerError(.appNotFound, "App \(appId) is not registered.") }
            try apps.setProduct(appId: appId, normalised)
        }
        forgetProducts(appId)
    }

    /// The product mappings of an app.
    public func products(appId: String) async throws -> [ProductMapping] {
        try await database.transaction { db in try self.apps(db).products(appId: appId) }
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
        Digest.sha256.hash(key.utf8).hexString
    }
}

extension Date {
    /// Unix milliseconds, as the App Store writes them (one definition: ReceiptDate's).
    var milliseconds: Int64 { ReceiptDate.milliseconds(self) }
    init(milliseconds: Int64) { self = ReceiptDate.date(milliseconds: milliseconds) }
}

/// The apps `PurchaseStore` remembers for `lifetime`: by id, and all of them (for notifications, by bundle id). A read
/// is remembered only if no change was made since it began (`generation`, moved on by `forget()`), so a read that began
/// before a change cannot put back what the change replaced.
struct AppCache {
    static let lifetime: TimeInterval = 2
    private var byId: [String: (app: ServerApp, expires: Date)] = [:]
    private var all: (apps: [ServerApp], expires: Date)?
    /// Moved on by every change; a read takes it before it begins and hands it back to `remember`.
    private(set) var generation = 0

    /// The app remembered for `id`, unless it expired by `now`.
    func app(_ id: String, at now: Date) -> ServerApp? {
        byId[id].flatMap { now < $0.expires ? $0.app : nil }
    }

    /// Every app, if remembered and not expired by `now`.
    func apps(at now: Date) -> [ServerApp]? {
        all.flatMap { now < $0.expires ? $0.apps : nil }
    }

    /// Remembers `app`, read from `readAt` on, if nothing changed since `generation` was taken.
    mutating func remember(_ app: ServerApp, readAt: Date, generation: Int) {
        guard generation == self.generation else { return }
        byId[app.id] = (app, readAt.addingTimeInterval(Self.lifetime))
    }

    /// Remembers every app, as `remember(_:readAt:generation:)` does one.
    mutating func remember(all apps: [ServerApp], readAt: Date, generation: Int) {
        guard generation == self.generation else { return }
        all = (apps, readAt.addingTimeInterval(Self.lifetime))
    }

    /// Forgets every app (one changed) and moves the generation on.
    mutating func forget() {
        self = AppCache(generation: generation + 1)
    }

    private init(generation: Int) { self.generation = generation }
    init() {}
}
