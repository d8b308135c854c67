import Clocks
import AppStoreCrypto
import AppStoreModels
import Foundation
import Locking
import Storage
import Synchronization

/// The local App Store: catalog, accounts, devices, payments, receipts and verifyReceipt.
///
/// State lives in memory behind one lock; every operation runs synchronously under it and yields
/// the documents it changed, which are then written to the store before the caller gets its answer.
/// The notifications an operation causes are drafted under the lock and signed after it (an outbox:
/// `draftNotifications`, `publish`), so ECDSA signing never holds other operations up.
public final class AppStoreEmulator: Sendable {
    let state: Locked<EmulatorState>
    let store: any DocumentStore
    /// The clock; `time advance`/`time set` move it.
    public let clock: AdjustableClock
    /// Where new identifiers (notification UUIDs, fault and device ids, issuer ids) come from.
    public let ids: any IDGenerator
    /// The receipt signing chain (RSA).
    public let authority: CertificateAuthority
    /// The StoreKit 2 signing chain (ECC P-256): signed transactions, renewal info, notifications.
    public let jwsAuthority: CertificateAuthority
    /// The self-signed key and certificate that stand for Xcode's StoreKit Testing (Xcode testers' signed data).
    public let xcodeAuthority: XcodeAuthority
    let persistLock = PersistQueue()
    /// App Store Server API request budgets (in memory: a restart forgives, as an hour would).
    let rateLimiter = RateLimiter()
    /// The last signed date given to a notification (`draftNotifications`).
    let lastSignedAt = Locked(Date.distantPast)

    enum Collection {
        static let apps = "apps", usedProductIds = "used_product_ids", accounts = "accounts", devices = "devices"
        static let transactions = "transactions", chains = "chains", faults = "faults", settings = "settings", apiKeys = "api_keys"
        static let notifications = "notifications"
    }

    /// Opens the emulator over a store, loading everything it holds.
    /// `xcodeAuthority` signs the StoreKit 2 data of Xcode testers (a fresh one when not given).
    public static func open(store: any DocumentStore, authority: CertificateAuthority, jwsAuthority: CertificateAuthority,
                            xcodeAuthority: XcodeAuthority? = nil,
                            clock: AdjustableClock = AdjustableClock(), ids: any IDGenerator = RandomIDs()) async throws -> AppStoreEmulator {
        var state = EmulatorState()
        let decoder = JSONDecoder()
        for document in try await store.documents(in: Collection.apps) {
            let app = try decoder.decode(CatalogApp.self, from: document.body)
            state.apps[app.bundleId] = app
        }
        for document in try await store.documents(in: Collection.usedProductIds) {
            state.usedProductIds[document.id] = try decoder.decode(Set<String>.self, from: document.body)
        }
        for document in try await store.documents(in: Collection.accounts) {
            let account = try decoder.decode(Account.self, from: document.body)
            state.accounts[account.email.lowercased()] = account
        }
        for document in try await store.documents(in: Collection.devices) {
            let device = try decoder.decode(Device.self, from: document.body)
            state.put(device)
        }
        let records = try await store.documents(in: Collection.transactions).map { try decoder.decode(TransactionRecord.self, from: $0.body) }
        for record in records.sorted(by: { ($0.purchaseDate, $0.id) < ($1.purchaseDate, $1.id) }) { state.insert(record) }
        for document in try await store.documents(in: Collection.chains) {
            let chain = try decoder.decode(SubscriptionChain.self, from: document.body)
            state.chains[chain.originalTransactionId] = chain
        }
        for document in try await store.documents(in: Collection.faults) {
            let fault = try decoder.decode(Fault.self, from: document.body)
            state.faults[fault.id] = fault
        }
        for document in try await store.documents(in: Collection.apiKeys) {
            let key = try decoder.decode(ServerAPIKey.self, from: document.body)
            state.apiKeys[key.keyId] = key
        }
        for document in try await store.documents(in: Collection.notifications) {
            let notification = try decoder.decode(NotificationRecord.self, from: document.body)
            state.notifications[notification.notificationUUID] = notification
        }
        if let body = try await store.document(in: Collection.settings, id: "notification_urls") {
            state.notificationURLs = try decoder.decode([String: NotificationURLs].self, from: body)
        }
        if let body = try await store.document(in: Collection.settings, id: "grace_periods") {
            state.gracePeriodDays = try decoder.decode([String: Int].self, from: body)
        }
        if let body = try await store.document(in: Collection.settings, id: "mass_extensions") {
            state.massExtensions = try decoder.decode([String: MassExtension].self, from: body)
        }
        if let body = try await store.document(in: Collection.settings, id: "quirks") { state.quirks = try decoder.decode(Quirks.self, from: body) }
        if let body = try await store.document(in: Collection.settings, id: "revoked_certificates") {
            state.revokedCertificates = try decoder.decode([String: Date].self, from: body)
        }
        if let body = try await store.document(in: Collection.settings, id: "counters") { state.counters = try decoder.decode(Counters.self, from: body) }
        if let body = try await store.document(in: Collection.settings, id: "clock") {
            let offset = try decoder.decode(Double.self, from: body)
            clock.advance(by: offset - clock.currentOffset)
            state.clockOffset = offset
        }
        return AppStoreEmulator(state: state, store: store, authority: authority, jwsAuthority: jwsAuthority,
                                xcodeAuthority: try xcodeAuthority ?? XcodeAuthority.generate(), clock: clock, ids: ids)
    }

    private init(state: EmulatorState, store: any DocumentStore, authority: CertificateAuthority, jwsAuthority: CertificateAuthority,
                 xcodeAuthority: XcodeAuthority, clock: AdjustableClock, ids: any IDGenerator) {
        self.state = Locked(state)
        self.store = store
        self.authority = authority
        self.jwsAuthority = jwsAuthority
        self.xcodeAuthority = xcodeAuthority
        self.clock = clock
        self.ids = ids
    }

    /// Runs an operation under the lock, then persists what it changed before returning.
    func mutate<T: Sendable>(_ body: (inout EmulatorState, inout Changes, Date) throws -> T) async throws -> T {
        let (result, aftermath) = try mutateNow(body)
        try await aftermath.complete()
        return result
    }

    /// Runs an operation under the lock and returns with what is left to do before its result may be given out:
    /// the writes it queued and the notifications it caused (nothing, for most reads).
    func mutateNow<T>(_ body: (inout EmulatorState, inout Changes, Date) throws -> T) throws -> (T, Aftermath) {
        // The App Store records whole seconds (receipts store RFC 3339 dates without fractions).
        let now = Date(timeIntervalSince1970: clock.now().timeIntervalSince1970.rounded(.down))
        let store = self.store
        return try state.withLock { state in
            var changes = Changes()
            renewSubscriptions(&state, &changes, now: now)
            let result = try body(&state, &changes, now)
            let drafts = changes.notifications.isEmpty ? [] : draftNotifications(state, &changes, now: now)
            let writes = AppStoreEmulator.writes(for: changes, in: state)
            // Enqueued under the lock so batches reach the store in the order the operations ran.
            let pending = writes.isEmpty ? nil : persistLock.enqueue { try await store.apply(writes) }
            return (result, Aftermath(emulator: self, pending: pending, drafts: drafts))
        }
    }

    /// Reads state after processing renewals due by now; renewals found are persisted.
    func read<T: Sendable>(_ body: (EmulatorState, Date) throws -> T) async throws -> T {
        try await mutate { state, _, now in try body(state, now) }
    }

    /// Reads state after processing renewals due by now, returning with the persisting of any renewals found.
    func readNow<T>(_ body: (EmulatorState, Date) throws -> T) throws -> (T, Aftermath) {
        try mutateNow { state, _, now in try body(state, now) }
    }

    /// What an operation leaves to do after the state's lock: its writes reaching the store, then the notifications
    /// it caused signed (outside the lock) and stored. Its result is given out only once this completes.
    struct Aftermath: Sendable {
        let emulator: AppStoreEmulator
        let pending: Task<Void, any Error>?
        let drafts: [NotificationDraft]

        /// Nothing to wait for: the operation changed nothing.
        var isEmpty: Bool { pending == nil && drafts.isEmpty }

        func complete() async throws {
            try await pending?.value
            if !drafts.isEmpty { try await emulator.publish(drafts) }
        }
    }

    static func writes(for changes: Changes, in state: EmulatorState) -> [DocumentWrite] {
        // Made at the first write: most operations (every read) have none.
        var madeEncoder: JSONEncoder?
        func encoder() -> JSONEncoder {
            if let madeEncoder { return madeEncoder }
            let encoder = JSONEncoder()
            encoder.outputFormatting = .sortedKeys
            madeEncoder = encoder
            return encoder
        }
        var writes: [DocumentWrite] = []
        func put<T: Encodable>(_ collection: String, _ id: String, _ value: T?) {
            if let value, let body = try? encoder().encode(value) {
                writes.append(.put(collection: collection, id: id, body: body))
            } else {
                writes.append(.delete(collection: collection, id: id))
            }
        }
        for id in changes.apps {
            put(Collection.apps, id, state.apps[id])
            put(Collection.usedProductIds, id, state.usedProductIds[id])
        }
        for id in changes.accounts { put(Collection.accounts, id, state.accounts[id]) }
        for id in changes.devices { put(Collection.devices, id, state.devices[id]) }
        for id in changes.transactions { put(Collection.transactions, id, state.transactions[id]) }
        for id in changes.chains { put(Collection.chains, id, state.chains[id]) }
        for id in changes.faults.union(changes.deletedFaults) { put(Collection.faults, id, state.faults[id]) }
        for id in changes.apiKeys { put(Collection.apiKeys, id, state.apiKeys[id]) }
        for id in changes.notificationIds { put(Collection.notifications, id, state.notifications[id]) }
        if changes.settings || !changes.transactions.isEmpty || !changes.accounts.isEmpty {
            put(Collection.settings, "quirks", state.quirks)
            put(Collection.settings, "revoked_certificates", state.revokedCertificates)
            put(Collection.settings, "counters", state.counters)
            put(Collection.settings, "clock", state.clockOffset)
            put(Collection.settings, "notification_urls", state.notificationURLs)
            put(Collection.settings, "mass_extensions", state.massExtensions)
            put(Collection.settings, "grace_periods", state.gracePeriodDays)
        }
        return writes
    }
}

/// Serialises persistence so batches reach the store in the order their operations ran.
final class PersistQueue: Sendable {
    private let tail = Locked<Task<Void, any Error>?>(nil)

    func enqueue(_ body: @escaping @Sendable () async throws -> Void) -> Task<Void, any Error> {
        tail.withLock { tail -> Task<Void, any Error> in
            let previous = tail
            let next = Task {
                _ = await previous?.result
                try await body()
            }
            tail = next
            return next
        }
    }
}
