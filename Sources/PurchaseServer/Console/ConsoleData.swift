import AppStoreModels
import Foundation

/// Which transactions the console lists (`/console/transactions`).
public struct TransactionFilter: Sendable, Equatable {
    public var appId: String
    /// Purchased in [from, to), Unix ms.
    public var from: Int64
    public var to: Int64
    public var productId: String?
    public var productType: ProductType?
    public var environment: String?
    /// Only refunded (true), only not refunded (false), or both.
    public var refunded: Bool?
    public var limit: Int = 500
}

/// A ledger row as the console lists it: the transaction, whose it is, and its list price.
public struct TransactionListing: Sendable, Equatable {
    public var transaction: UserView.Transaction
    public var appUserId: String
    public var price: String?
    public var currency: String?
}

extension PurchaseStore {
    /// When the oldest verification still waiting was uploaded, and when the newest Apple notification arrived (ms).
    public func queueHealth() async throws -> (oldestWaitingJob: Int64?, newestNotification: Int64?) {
        try await database.read { db in
            let health = HealthRepository(db: db)
            return (try health.oldestWaitingJob(), try health.newestNotification())
        }
    }

    public func transactions(_ filter: TransactionFilter) async throws -> [TransactionListing] {
        try await database.longRead { db in try LedgerReader(db: db).transactions(filter) }
    }
}
