import CSQLite
import Foundation
import Storage

/// The embedded default `SQLDatabase`: one SQLite file in WAL mode, one connection owned by a serial queue.
public final class SQLiteSQLDatabase: SQLDatabase {
    let database: SQLiteDatabase
    public let dialect = SQLDialect.sqlite

    /// Opens or creates the database at `path`.
    public init(path: String) throws {
        database = try SQLiteDatabase(path: path)
    }

    public func transaction<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T {
        try await database.run { db in
            try db.execute("BEGIN IMMEDIATE")
            do {
                let result = try body(SQLiteConnection(database: db))
                try db.execute("COMMIT")
                return result
            } catch {
                try? db.execute("ROLLBACK")
                throw error
            }
        }
    }

    /// Pages the connection has looked up since it was opened (see `SQLiteDatabase.pagesTouched`).
    public func pagesTouched() async throws -> Int {
        try await database.run { $0.pagesTouched }
    }

    public func notify(_ channel: String) async {}
    /// One process owns an SQLite file, so nobody else notifies: just wait out the timeout.
    public func wait(for channel: String, timeout: Duration) async {
        try? await Task.sleep(for: timeout)
    }
    public func close() async {}
}

/// Adapts the queue-owned SQLite handle to `SQLConnection` for the duration of a transaction. Row writes run at once,
/// with their texts from the connection's `SQLTextCache`.
struct SQLiteConnection: SQLConnection {
    let database: SQLiteDatabase

    func append(into table: String, columns: [String], values: [any SQLBindable], conflict: String) throws {
        try run(database.sqlTexts.insert(into: table, columns: columns, conflict: conflict), values)
    }

    func append(into table: String, columns: [String], values: [any SQLBindable], conflict: String, returning key: String,
                orElse: any Error) throws {
        try run(database.sqlTexts.insert(into: table, columns: columns, conflict: conflict, returning: key), values, orElse: orElse)
    }

    func update(_ table: String, set assignments: [String], values: [any SQLBindable], keyColumn: String, key: any SQLBindable) throws {
        try run(database.sqlTexts.update(table, set: assignments, keyColumn: keyColumn), values + [key])
    }

    func add(_ amount: Int64, to column: String, of table: String, keyColumns: [String], key: [any SQLBindable]) throws {
        try run(database.sqlTexts.addition(to: column, of: table, keyColumns: keyColumns), key + [amount])
    }

    func query(_ sql: String, _ parameters: [any SQLBindable]) throws -> [SQLRow] {
        try database.rows(sql, parameters)
    }
}
