import Clocks
import Foundation
import SQLiteStorage
import Storage

/// Where one order stands. Each step is written before the next begins, so a crash or a network
/// failure anywhere resumes from the last written step.
public enum OrderState: String, Codable, Sendable, CaseIterable {
    /// Written before the payment is added.
    case created
    /// Ask to Buy: waiting for a parent; the approved transaction arrives later.
    case deferred
    /// The App Store charged: the transaction and its signed form are kept.
    case paid
    /// The proof (receipt or signed transaction) reached the purchase server; its verification id is kept.
    case uploaded
    /// The purchase server confirmed it (a verification id is kept).
    case verified
    /// The content is in the app (exactly once: recorded in the same database transaction).
    case delivered
    /// The transaction is finished with the App Store: nothing left to do.
    case finished
    /// The payment failed or the server refused it (the transaction, if any, is finished).
    case failed
    /// The customer cancelled.
    case cancelled

    /// Whether launch must carry this order on.
    public var isOpen: Bool { ![.finished, .failed, .cancelled].contains(self) }
}

/// One order in the journal.
public struct Order: Codable, Sendable, Equatable, Identifiable {
    public var id: String
    public var productIdentifier: String
    public var quantity: Int
    public var state: OrderState
    public var transactionIdentifier: String?
    public var signedTransaction: String?
    public var verificationId: String?
    public var lastError: String?
    public var createdAt: Date
    public var updatedAt: Date
}

/// The client order journal of seed 003, in an SQLite file: every order's progress, and the content
/// delivered (one row per order, so delivery happens exactly once).
public final class OrderJournal: Sendable {
    let database: SQLiteSQLDatabase

    static let migrations = [
        SQLMigration(version: 1, statements: [
            """
            CREATE TABLE orders (
                id TEXT PRIMARY KEY, product_id TEXT NOT NULL, quantity INTEGER NOT NULL, state TEXT NOT NULL,
                transaction_id TEXT UNIQUE, signed_transaction TEXT, verification_id TEXT, last_error TEXT,
                created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL
            )
            """,
            "CREATE TABLE deliveries (order_id TEXT PRIMARY KEY, product_id TEXT NOT NULL, quantity INTEGER NOT NULL, delivered_at INTEGER NOT NULL)",
        ]),
        // The last answer of the purchase server about the user, for working offline.
        SQLMigration(version: 2, statements: [
            "CREATE TABLE cache (name TEXT PRIMARY KEY, body TEXT NOT NULL, saved_at INTEGER NOT NULL)",
        ]),
    ]

    /// Where the journal's times and order ids come from.
    let clock: any WallClock
    let ids: any IDGenerator

    /// Opens (creating) the journal at `path`.
    public init(path: String, clock: any WallClock = SystemClock(), ids: any IDGenerator = RandomIDs()) async throws {
        self.clock = clock
        self.ids = ids
        database = try SQLiteSQLDatabase(path: path)
        try await database.migrate(Self.migrations)
    }

    public func close() async { await database.close() }

    /// Writes a new order before anything is paid.
    public func create(productIdentifier: String, quantity: Int) async throws -> Order {
        let now = clock.now()
        let order = Order(id: ids.nextString(), productIdentifier: productIdentifier, quantity: quantity, state: .created,
                          createdAt: now, updatedAt: now)
        _ = try await database.transaction { db in
            try db.query("INSERT INTO orders (id, product_id, quantity, state, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                         [order.id, order.productIdentifier, Int64(order.quantity), order.state.rawValue, Self.ms(now), Self.ms(now)])
        }
        return order
    }

    /// An order for a transaction the journal never saw (approved Ask to Buy, a lost journal): starts at `paid`.
    public func adopt(_ transaction: PaymentTransaction) async throws -> Order {
        let now = clock.now()
        let order = Order(id: ids.nextString(), productIdentifier: transaction.productIdentifier, quantity: transaction.quantity,
                          state: .paid, transactionIdentifier: transaction.transactionIdentifier, signedTransaction: transaction.signedTransaction,
                          createdAt: now, updatedAt: now)
        _ = try await database.transaction { db in
            try db.query("""
                INSERT INTO orders (id, product_id, quantity, state, transaction_id, signed_transaction, created_at, updated_at)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING
                """, [order.id, order.productIdentifier, Int64(order.quantity), order.state.rawValue, order.transactionIdentifier,
                      order.signedTransaction, Self.ms(now), Self.ms(now)])
        }
        return try await self.order(transactionIdentifier: transaction.transactionIdentifier) ?? order
    }

    /// Saves an order's new state and fields.
    public func save(_ order: Order) async throws {
        let now = clock.now()
        _ = try await database.transaction { db in
            try db.query("""
                UPDATE orders SET state = ?, transaction_id = ?, signed_transaction = ?, verification_id = ?, last_error = ?, updated_at = ?
                WHERE id = ?
                """, [order.state.rawValue, order.transactionIdentifier, order.signedTransaction, order.verificationId, order.lastError,
                      Self.ms(now), order.id])
        }
    }

    /// Delivers the order's content and marks it delivered, in one transaction: a crash leaves either both or neither.
    public func deliver(_ order: Order) async throws -> Order {
        var delivered = order
        delivered.state = .delivered
        let now = Self.ms(clock.now())
        try await database.transaction { db in
            try db.query("INSERT INTO deliveries (order_id, product_id, quantity, delivered_at) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                         [order.id, order.productIdentifier, Int64(order.quantity), now])
            try db.query("UPDATE orders SET state = ?, updated_at = ? WHERE id = ?", [OrderState.delivered.rawValue, now, order.id])
        }
        return delivered
    }

    public func orders() async throws -> [Order] {
        try await database.transaction { db in try db.query("SELECT * FROM orders ORDER BY created_at, id").map(Self.order) }
    }

    public func openOrders() async throws -> [Order] {
        try await orders().filter { $0.state.isOpen }
    }

    public func order(transactionIdentifier: String) async throws -> Order? {
        try await database.transaction { db in
            try db.query("SELECT * FROM orders WHERE transaction_id = ?", [transactionIdentifier]).first.map(Self.order)
        }
    }

    /// Units delivered per product (what the app has handed out: coins counted, unlocks flagged).
    public func deliveredCounts() async throws -> [String: Int] {
        try await database.transaction { db in
            var counts: [String: Int] = [:]
            for row in try db.query("SELECT product_id, SUM(quantity) AS units FROM deliveries GROUP BY product_id") {
                counts[row.string("product_id") ?? ""] = Int(row.int("units") ?? 0)
            }
            return counts
        }
    }

    /// Keeps a value for offline use (the last entitlements the server gave).
    public func cache(_ name: String, _ body: Data) async throws {
        let text = String(decoding: body, as: UTF8.self)
        let now = Self.ms(clock.now())
        _ = try await database.transaction { db in
            try db.query("""
                INSERT INTO cache (name, body, saved_at) VALUES (?, ?, ?)
                ON CONFLICT (name) DO UPDATE SET body = excluded.body, saved_at = excluded.saved_at
                """, [name, text, now])
        }
    }

    /// A cached value and when it was saved.
    public func cached(_ name: String) async throws -> (body: Data, savedAt: Date)? {
        try await database.transaction { db in
            try db.query("SELECT body, saved_at FROM cache WHERE name = ?", [name]).first.map {
                (Data(($0.string("body") ?? "").utf8), Date(timeIntervalSince1970: Double($0.int("saved_at") ?? 0) / 1000))
            }
        }
    }

    static func order(_ row: SQLRow) -> Order {
        Order(id: row.string("id") ?? "", productIdentifier: row.string("product_id") ?? "", quantity: Int(row.int("quantity") ?? 1),
              state: OrderState(rawValue: row.string("state") ?? "") ?? .created, transactionIdentifier: row.string("transaction_id"),
              signedTransaction: row.string("signed_transaction"), verificationId: row.string("verification_id"), lastError: row.string("last_error"),
              createdAt: Date(timeIntervalSince1970: Double(row.int("created_at") ?? 0) / 1000),
              updatedAt: Date(timeIntervalSince1970: Double(row.int("updated_at") ?? 0) / 1000))
    }

    static func ms(_ date: Date) -> Int64 { Int64((date.timeIntervalSince1970 * 1000).rounded()) }
}
