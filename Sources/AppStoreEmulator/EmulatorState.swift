import AppStoreModels
import Foundation

/// Counters for identifiers, persisted so ids never repeat across restarts.
struct Counters: Codable, Sendable {
    var sandboxTransaction: Int64 = 0
    var productionTransaction: Int64 = 0
    var webOrderLineItem: Int64 = 0
    var account: Int64 = 0
}

/// Everything the emulator knows; lives in memory behind a lock and is written through to storage.
struct EmulatorState: Sendable {
    /// The renewal rate of an account's subscriptions to an app: for a sandbox account the app's `.storekit` time
    /// rate when it sets one (as an Xcode test session does), else the account's own; production renews as the account does.
    /// A TestFlight tester renews at TestFlight's pace whatever the file says (TestFlight builds use no `.storekit` file).
    func renewalRate(_ account: Account, bundleId: String) -> RenewalRate {
        guard account.environment != .production, account.renewalRate != .testFlight,
              let rate = apps[bundleId]?.testSettings?.renewalRate else { return account.renewalRate }
        return rate
    }

    /// The storefront and locale a sandbox account shops in for an app: the app's `.storekit` `_storefront` and
    /// `_locale` when it sets them (SKTestSession.storefront / .locale), else the account's own.
    func shopper(_ account: Account, bundleId: String) -> Account {
        guard account.environment != .production, let settings = apps[bundleId]?.testSettings else { return account }
        var shopper = account
        if let storefront = settings.storefront, Storefront.known.contains(where: { $0.code == storefront }) { shopper.storefront = storefront }
        if let locale = settings.locale, !locale.isEmpty { shopper.locale = locale }
        return shopper
    }

    var apps: [String: CatalogApp] = [:]
    /// Product ids ever used per app: an identifier once used cannot be reused.
    var usedProductIds: [String: Set<String>] = [:]
    var accounts: [String: Account] = [:] { didSet { renewalInputsVersion &+= 1 } }
    /// Devices by id. Written through `put(_:)`, which keeps `devicesByAccount` in step.
    private(set) var devices: [String: Device] = [:]
    /// Device ids per lowercased account email: finding an account's devices must not read every device.
    private(set) var devicesByAccount: [String: Set<String>] = [:]
    /// Transactions by id. Written through `insert`, `update` and `remove`, which keep the indexes below.
    private(set) var transactions: [String: TransactionRecord] = [:]
    /// Transaction ids per "account|bundle|environment", in creation order. Written through `insert`, `update` and
    /// `remove`.
    private(set) var transactionIndex: [String: [String]] = [:]
    /// The auto-renewable ones among them, kept by the same functions: whether an account holds a
    /// subscription is asked on every verifyReceipt call, and an account of a thousand consumables holds none.
    private(set) var subscriptionIndex: [String: [String]] = [:]
    var chains: [String: SubscriptionChain] = [:] { didSet { renewalInputsVersion &+= 1 } }
    /// Bumped by every change to what decides whether a subscription is due (its chain, an auto-renewable transaction,
    /// an account): a `renewalsQuiet` of an older version no longer holds.
    private(set) var renewalInputsVersion = 0
    /// What `renewSubscriptions` found when it last walked every chain: until `until` nothing is due, as long as the
    /// inputs are still at `version`. Nil before the first walk.
    var renewalsQuiet: (version: Int, until: Date)?
    var faults: [String: Fault] = [:]
    /// In-app purchase keys for the App Store Server API, by key id.
    var apiKeys: [String: ServerAPIKey] = [:]
    /// Server Notifications V2: where each app wants them, and every one sent, by notificationUUID.
    var notificationURLs: [String: NotificationURLs] = [:]
    var notifications: [String: NotificationRecord] = [:]
    /// Billing grace period per app, in days (App Store Connect: 3, 16 or 28; absent: none).
    var gracePeriodDays: [String: Int] = [:]
    /// Mass renewal-date extensions by "productId|requestIdentifier".
    var massExtensions: [String: MassExtension] = [:]
    var quirks = Quirks()
    /// Certificates of the JWS chain the OCSP responder calls revoked ("leaf", "intermediate"), with when.
    var revokedCertificates: [String: Date] = [:]
    var counters = Counters()
    var clockOffset: TimeInterval = 0

    static func indexKey(_ account: String, _ bundle: String, _ environment: AppStoreEnvironment) -> String {
        "\(account.lowercased())|\(bundle)|\(environment.rawValue)"
    }

    /// Adds or replaces a device (a device signed in to another account leaves the first one's list).
    mutating func put(_ device: Device) {
        if let previous = devices[device.id] { devicesByAccount[previous.accountEmail.lowercased()]?.remove(device.id) }
        devices[device.id] = device
        devicesByAccount[device.accountEmail.lowercased(), default: []].insert(device.id)
    }

    /// Adds a new transaction.
    mutating func insert(_ record: TransactionRecord) { store(record) }

    /// Writes back a changed transaction (a refund, a renewal's new expiry, a revocation).
    mutating func update(_ record: TransactionRecord) { store(record) }

    /// Changes the transaction `id` in place; nothing when there is none.
    mutating func update(_ id: String, _ change: (inout TransactionRecord) -> Void) {
        guard var record = transactions[id] else { return }
        change(&record)
        store(record)
    }

    private mutating func store(_ record: TransactionRecord) {
        let key = EmulatorState.indexKey(record.accountEmail, record.bundleId, record.environment)
        if record.productType == .autoRenewable { renewalInputsVersion &+= 1 }
        if let previous = transactions.updateValue(record, forKey: record.id) {
            if previous.productType == .autoRenewable { renewalInputsVersion &+= 1 }
            // Written again: listed once, where it was, unless its account, app or environment changed or it became or
            // stopped being auto-renewable.
            guard EmulatorState.indexKey(previous.accountEmail, previous.bundleId, previous.environment) != key
                    || (previous.productType == .autoRenewable) != (record.productType == .autoRenewable) else { return }
            unlist(previous)
        }
        transactionIndex[key, default: []].append(record.id)
        if record.productType == .autoRenewable { subscriptionIndex[key, default: []].append(record.id) }
    }

    mutating func remove(_ id: String) {
        guard let record = transactions.removeValue(forKey: id) else { return }
        if record.productType == .autoRenewable { renewalInputsVersion &+= 1 }
        unlist(record)
    }

    private mutating func unlist(_ record: TransactionRecord) {
        let key = EmulatorState.indexKey(record.accountEmail, record.bundleId, record.environment)
        transactionIndex[key]?.removeAll { $0 == record.id }
        if record.productType == .autoRenewable { subscriptionIndex[key]?.removeAll { $0 == record.id } }
    }

    func transactions(account: String, bundle: String, environment: AppStoreEnvironment) -> [TransactionRecord] {
        (transactionIndex[EmulatorState.indexKey(account, bundle, environment)] ?? []).compactMap { transactions[$0] }
    }

    /// Whether one of the account's transactions for the app is an auto-renewable subscription in the purchased state.
    /// Only the account's subscriptions are looked at, their state read in place (an account of a thousand purchases is
    /// asked on every verifyReceipt call of its receipts).
    func hasPurchasedSubscription(account: String, bundle: String, environment: AppStoreEnvironment) -> Bool {
        (subscriptionIndex[EmulatorState.indexKey(account, bundle, environment)] ?? []).contains { id in
            guard let index = transactions.index(forKey: id) else { return false }
            return transactions.values[index].state == .purchased
        }
    }

    func product(_ bundle: String, _ productId: String) -> CatalogProduct? {
        apps[bundle]?.products.first { $0.productId == productId }
    }

    mutating func nextTransactionId(_ environment: AppStoreEnvironment) -> String {
        switch environment {
        case .sandbox:
            counters.sandboxTransaction += 1
            return "2000000" + String(counters.sandboxTransaction).leftPadded(9)
        case .production:
            counters.productionTransaction += 1
            return "31000" + String(counters.productionTransaction).leftPadded(10)
        }
    }

    mutating func nextWebOrderLineItemId(_ environment: AppStoreEnvironment) -> Int64 {
        counters.webOrderLineItem += 1
        return (environment == .sandbox ? 2_000_000_000_000_000 : 310_000_000_000_000) + counters.webOrderLineItem
    }
}

/// Which documents an operation touched, so only those are written.
struct Changes {
    var apps: Set<String> = []
    var accounts: Set<String> = []
    var devices: Set<String> = []
    var transactions: Set<String> = []
    var chains: Set<String> = []
    var faults: Set<String> = []
    var deletedFaults: Set<String> = []
    var apiKeys: Set<String> = []
    var notificationIds: Set<String> = []
    /// Events to report with notifications, turned into signed records before the operation commits.
    var notifications: [NotificationEvent] = []
    var settings = false
}

extension String {
    func leftPadded(_ width: Int) -> String { count >= width ? self : String(repeating: "0", count: width - count) + self }
}
