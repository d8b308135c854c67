import CSQLite
import Foundation
import Storage
import Synchronization

/// The embedded default `SQLDatabase`: one SQLite file in WAL mode, one writing connection owned by a serial queue,
/// and reading connections beside it, each on a queue of its own.
public final class SQLiteSQLDatabase: SQLDatabase {
    let database: SQLiteDatabase
    /// Where `read` runs: nil in memory or out of WAL mode, where no other connection sees the writer's data.
    private let readers: SQLiteReaders?
    public let dialect = SQLDialect.sqlite
    /// Nanoseconds the writer has spent in transactions.
    private let writerBusy = Atomic<UInt64>(0)

    /// Opens or creates the database at `path`. `readers` is how many connections `read` may open beside the writer
    /// (a write-ahead log only), at first use or at `openReaders()`.
    public init(path: String, readers: Int = SQLiteReaders.defaultCount) throws {
        database = try SQLiteDatabase(path: path)
        self.readers = database.isWriteAheadLogged && readers > 0 ? SQLiteReaders(path: path, count: readers) : nil
    }

    public func transaction<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T {
        try await database.run { [self] db in
            let started = ContinuousClock.now
            defer {
                let elapsed = started.duration(to: .now).components
                self.writerBusy.add(UInt64(max(0, elapsed.seconds)) &* 1_000_000_000 &+ UInt64(max(0, elapsed.attoseconds / 1_000_000_000)),
                               ordering: .relaxed)
            }
            return try Self.inTransaction(db, begin: "BEGIN IMMEDIATE", body)
        }
    }

    public var writerBusySeconds: Double? { Double(writerBusy.load(ordering: .relaxed)) / 1e9 }

    /// Runs `body` on a reading connection, in one deferred transaction (a snapshot of the last commit): it neither
    /// waits behind the writer's queue nor holds it up. Without readers (or when one cannot be opened), on the writer.
    public func read<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T {
        guard let (reader, index) = readers?.acquire() else { return try await transaction(body) }
        defer { readers?.release(index) }
        return try await reader.run { db in try Self.inTransaction(db, begin: "BEGIN", body) }
    }

    /// Runs `body` as `read` does, on a connection kept for long reads, one at a time: short reads never wait behind
    /// one, and at most one snapshot is held for long (the write-ahead log cannot restart past it).
    public func longRead<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T {
        guard let reader = readers?.longReader() else { return try await transaction(body) }
        return try await reader.run { db in try Self.inTransaction(db, begin: "BEGIN", body) }
    }

    private static func inTransaction<T>(_ db: SQLiteDatabase, begin: String, _ body: (any SQLConnection) throws -> T) throws -> T {
        try db.execute(begin)
        do {
            let result = try body(SQLiteConnection(database: db))
            try db.execute("COMMIT")
            return result
        } catch {
            try? db.execute("ROLLBACK")
            throw error
        }
    }

    /// Pages the writer and the readers have looked up since they were opened (see `SQLiteDatabase.pagesTouched`).
    public func pagesTouched() async throws -> Int {
        var pages = try await database.run { $0.pagesTouched }
        for reader in readers?.opened ?? [] { pages += try await reader.run { $0.pagesTouched } }
        return pages
    }

    public func notify(_ channel: String) async {}
    /// One process owns an SQLite file, so nobody else notifies: just wait out the timeout.
    public func wait(for channel: String, timeout: Duration) async {
        try? await Task.sleep(for: timeout)
    }

    /// Opens the reading connections now rather than at their first use (a server, at start); how many are open.
    @discardableResult
    public func openReaders() -> Int {
        readers?.openAll()
        return readers?.opened.count ?? 0
    }

    public func close() async {}
}

/// Adapts the queue-owned SQLite handle to `SQLConnection` for the duration of a transaction. Row writes run at once,
/// with their texts from the connection's `SQLTextCache`, and return nothing (no row is read back: `SQLiteDatabase.changes`).
struct SQLiteConnection: SQLConnection {
    let database: SQLiteDatabase

    func append(into table: String, columns: [String], values: [any SQLBindable], conflict: String) throws {
        _ = try database.changes(database.sqlTexts.insert(into: table, columns: columns, conflict: conflict), values)
    }

    /// Whether the row was written is told by SQLite's count of changes rather than by `RETURNING` the key, which made
    /// SQLite gather the returned row in a table of its own first: about an eighth of writing a ledger row (25.4–25.9
    /// against 22.0–22.8 µs of CPU per row in a lab loop of Python's `sqlite3`).
    func append(into table: String, columns: [String], values: [any SQLBindable], conflict: String, returning key: String,
                orElse: any Error) throws {
        if try database.changes(database.sqlTexts.insert(into: table, columns: columns, conflict: conflict), values) == 0 { throw orElse }
    }

    func update(_ table: String, set assignments: [String], values: [any SQLBindable], keyColumn: String, key: any SQLBindable) throws {
        _ = try database.changes(database.sqlTexts.update(table, set: assignments, keyColumn: keyColumn), values + [key])
    }

    func add(_ amount: Int64, to column: String, of table: String, keyColumns: [String], key: [any SQLBindable]) throws {
        _ = try database.changes(database.sqlTexts.addition(to: column, of: table, keyColumns: keyColumns), key + [amount])
    }

    func query(_ sql: String, _ parameters: [any SQLBindable]) throws -> [SQLRow] {
        try database.rows(sql, parameters)
    }
}

/// The reading connections of one database file, opened when first needed: short reads go to the one with the fewest
/// reads under way; long reads (`longRead`) to one of their own, whose queue takes them one at a time.
public final class SQLiteReaders: Sendable {
    /// One per core for short reads, at least two and at most four.
    public static let defaultCount = min(max(ProcessInfo.processInfo.activeProcessorCount, 2), 4)

    private struct Slot {
        var connection: SQLiteDatabase?
        var reads = 0
    }
    private let path: String
    private let slots: Mutex<[Slot]>
    private let long = Mutex<SQLiteDatabase?>(nil)

    init(path: String, count: Int) {
        self.path = path
        slots = Mutex(Array(repeating: Slot(), count: count))
    }

    /// Opens every connection not open yet, so that no read pays an open under the lock that every read takes (on the
    /// cooperative pool). One that fails is tried again at its first use; until then reads go to the others or the writer.
    func openAll() {
        slots.withLock { slots in
            for index in slots.indices where slots[index].connection == nil { slots[index].connection = try? SQLiteDatabase(readerOf: path) }
        }
        _ = longReader()
    }

    /// The connection with the fewest short reads under way (opened now if it is not yet) and its index for `release`;
    /// nil if it could not be opened (the read then runs on the writer).
    func acquire() -> (SQLiteDatabase, Int)? {
        slots.withLock { slots in
            var index = 0
            for candidate in slots.indices where slots[candidate].reads < slots[index].reads { index = candidate }
            guard let connection = slots[index].connection ?? (try? SQLiteDatabase(readerOf: path)) else { return nil }
            slots[index].connection = connection
            slots[index].reads += 1
            return (connection, index)
        }
    }

    func release(_ index: Int) {
        slots.withLock { $0[index].reads -= 1 }
    }

    /// The connection for long reads (opened now if it is not yet), or nil if it cannot be opened.
    func longReader() -> SQLiteDatabase? {
        long.withLock { long in
            if long == nil { long = try? SQLiteDatabase(readerOf: path) }
            return long
        }
    }

    /// Every connection open.
    var opened: [SQLiteDatabase] {
        slots.withLock { $0.compactMap(\.connection) } + long.withLock { $0.map { [$0] } ?? [] }
    }
}
