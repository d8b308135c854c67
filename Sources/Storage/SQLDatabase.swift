import Foundation

/// A value bound to or read from SQL.
public enum SQLValue: Sendable, Equatable, CustomStringConvertible {
    case null
    case integer(Int64)
    case text(String)

    public var description: String {
        switch self {
        case .null: return "NULL"
        case .integer(let value): return String(value)
        case .text(let value): return value
        }
    }
}

extension String {
    /// Whether the text holds a NUL (U+0000), found with `memchr`: receipts are kilobytes. PostgreSQL's text cannot hold
    /// one, and C strings end at it.
    public var containsNUL: Bool {
        utf8.withContiguousStorageIfAvailable { bytes in
            bytes.baseAddress.map { memchr($0, 0, bytes.count) != nil } ?? false
        } ?? utf8.contains(0)
    }
}

/// Conversions into bound parameters.
public protocol SQLBindable {
    var sqlValue: SQLValue { get }
}

extension String: SQLBindable { public var sqlValue: SQLValue { .text(self) } }
extension Int: SQLBindable { public var sqlValue: SQLValue { .integer(Int64(self)) } }
extension Int64: SQLBindable { public var sqlValue: SQLValue { .integer(self) } }
extension Bool: SQLBindable { public var sqlValue: SQLValue { .integer(self ? 1 : 0) } }
extension SQLValue: SQLBindable { public var sqlValue: SQLValue { self } }
extension Optional: SQLBindable where Wrapped: SQLBindable {
    public var sqlValue: SQLValue { self?.sqlValue ?? .null }
}

/// One result row; columns by name.
public struct SQLRow: Sendable {
    public let columns: [String]
    public let values: [SQLValue]

    public init(columns: [String], values: [SQLValue]) {
        self.columns = columns
        self.values = values
    }

    /// The raw value of a column (NULL when absent).
    public subscript(_ name: String) -> SQLValue {
        guard let index = columns.firstIndex(of: name) else { return .null }
        return values[index]
    }

    /// A text column (integers rendered as text), or nil for NULL.
    public func string(_ name: String) -> String? {
        switch self[name] {
        case .null: return nil
        case .integer(let value): return String(value)
        case .text(let value): return value
        }
    }

    /// An integer column (PostgreSQL returns text), or nil.
    public func int(_ name: String) -> Int64? {
        switch self[name] {
        case .null: return nil
        case .integer(let value): return value
        case .text(let value): return Int64(value)
        }
    }

    /// A boolean stored as 0/1 (or PostgreSQL's t/f).
    public func bool(_ name: String) -> Bool {
        switch self[name] {
        case .integer(let value): return value != 0
        case .text(let value): return value == "1" || value == "t" || value == "true"
        case .null: return false
        }
    }
}

/// The placeholders of an `IN (…)` list, the list padded to the next power of two by repeating its last value. A
/// statement's text then takes one of a few shapes whatever its batch's size, and its prepared form is reused: with a
/// text per count, most batches prepared a statement of their own (a third of a prepare per notification, each of
/// them hundreds of thousands of instructions for a list of hundreds) and churned the cache of prepared statements.
/// A value repeated in an `IN` list changes nothing the list selects.
public enum InList {
    /// `?, ?, …` and the values to bind to them; empty for no values (the caller's `IN ()` would not parse either).
    public static func padded<Value>(_ values: [Value]) -> (marks: String, values: [Value]) {
        guard let last = values.last else { return ("", []) }
        let size = values.count == 1 ? 1 : 1 << (Int.bitWidth - (values.count - 1).leadingZeroBitCount)
        return (marks(size), values + repeatElement(last, count: size - values.count))
    }

    private static func marks(_ count: Int) -> String {
        if count <= 1024, let shape = shapes[count] { return shape }
        return Array(repeating: "?", count: count).joined(separator: ", ")
    }

    private static let shapes: [Int: String] = Dictionary(uniqueKeysWithValues: (0...10).map {
        (1 << $0, Array(repeating: "?", count: 1 << $0).joined(separator: ", "))
    })
}

/// The SQL flavour, for the few statements that differ.
public enum SQLDialect: Sendable {
    case sqlite
    case postgres

    /// `column` among `values`, as SQL with its parameters: on PostgreSQL one array parameter
    /// (`column = ANY(CAST(? AS TEXT[]))`, the same text whatever the count, so it is prepared once), elsewhere
    /// `column IN (?, …)`. For text values; callers pass a few hundred at a time, statements being limited in parameters.
    public func membership(_ column: String, in values: [String]) -> (sql: String, parameters: [any SQLBindable]) {
        switch self {
        case .postgres:
            // Each element quoted, its quotes and backslashes escaped scalar by scalar (a Character comparison would
            // miss a quote that a combining mark follows).
            var literal = String.UnicodeScalarView()
            literal.append("{")
            for (index, value) in values.enumerated() {
                if index > 0 { literal.append(",") }
                literal.append("\"")
                for scalar in value.unicodeScalars {
                    if scalar == "\"" || scalar == "\\" { literal.append("\\") }
                    literal.append(scalar)
                }
                literal.append("\"")
            }
            literal.append("}")
            return ("\(column) = ANY(CAST(? AS TEXT[]))", [String(literal)])
        case .sqlite:
            let (marks, padded) = InList.padded(values)
            return ("\(column) IN (\(marks))", padded)
        }
    }
}

/// A connection inside a transaction. Calls are synchronous: they run on the owner's own thread.
public protocol SQLConnection {
    /// Runs one statement with `?` placeholders and returns its rows.
    @discardableResult
    func query(_ sql: String, _ parameters: [any SQLBindable]) throws -> [SQLRow]

    /// Runs a statement whose rows the caller does not read. The database may hold it and send it together with
    /// the statements after it in one round trip (PostgreSQL pipelines them); it runs in order, before the next
    /// `query` returns and before the transaction commits, and its failure fails the transaction there. With
    /// `orElse`, a statement that returns no row (a `RETURNING` that matched nothing) fails with that error.
    func run(_ sql: String, _ parameters: [any SQLBindable], orElse: (any Error)?) throws

    /// Runs statements that do not depend on each other and returns each one's rows, in order; a database may
    /// send them in one round trip.
    func query(together statements: [SQLStatement]) throws -> [[SQLRow]]

    /// Adds one row to a log-like table (`INSERT INTO table (columns) VALUES (…) conflict`). The database may
    /// gather the rows of one table and write them with one statement, later, but always before the next
    /// statement that names the table and before the transaction commits. For rows that do not depend on each
    /// other, and whose `conflict` clause (if any) makes a repeated identical row change nothing: identical rows
    /// may be written once.
    func append(into table: String, columns: [String], values: [any SQLBindable], conflict: String) throws

    /// Adds one row that must be written, gathered like `append`: a row its `conflict` clause skipped fails the
    /// transaction with `orElse`, no later than the commit. Where rows are gathered (PostgreSQL) the insert returns the
    /// `key` column (one of `columns`) and a key that does not come back is the skipped row; SQLite, which writes the
    /// row at once, reads the statement's count of changes instead and does not use `key`. Identical rows may be
    /// written once.
    func append(into table: String, columns: [String], values: [any SQLBindable], conflict: String, returning key: String,
                orElse: any Error) throws

    /// Changes the row of `table` whose `keyColumn` is `key`: `UPDATE table SET assignments WHERE keyColumn = key`, each
    /// assignment `column = expression` with `?` placeholders that `values` fill in order. The database may gather the
    /// changes of one table and write them with one statement, later, but always in order, before the next statement
    /// that names the table and before the transaction commits. Values may arrive as text: an assignment to a column
    /// of another type casts its placeholder (`updated_at = CAST(? AS BIGINT)`).
    func update(_ table: String, set assignments: [String], values: [any SQLBindable], keyColumn: String, key: any SQLBindable) throws

    /// Adds `amount` to `column` of the row of `table` whose `keyColumns` are `key`, inserting the row with `amount`
    /// when there is none (`INSERT … ON CONFLICT (keyColumns) DO UPDATE SET column = column + excluded.column`). The
    /// database may gather the additions of one table and write them with one statement, later, the amounts of one
    /// row summed, but always before the next statement that names the table and before the transaction commits.
    func add(_ amount: Int64, to column: String, of table: String, keyColumns: [String], key: [any SQLBindable]) throws

    /// A small number (0 ..< 64) that transactions running at the same time are unlikely to share: spreading a hot
    /// counter over rows keyed by it lets them add to it without waiting on each other's row lock. 0 where one
    /// writer writes at a time (SQLite).
    var shard: Int64 { get }
}

/// One statement with its parameters, for `SQLConnection.query(together:)`.
public struct SQLStatement {
    public var sql: String
    public var parameters: [any SQLBindable]

    public init(_ sql: String, _ parameters: [any SQLBindable] = []) {
        self.sql = sql
        self.parameters = parameters
    }

    /// `INSERT INTO table (keyColumns, column) VALUES (?, …), … ON CONFLICT (keyColumns) DO UPDATE SET column = column +
    /// excluded.column` for `rows` rows: each adds its amount to the row of its key, or makes that row.
    public static func addition(to column: String, of table: String, keyColumns: [String], rows: Int) -> String {
        insert(into: table, columns: keyColumns + [column], rows: rows,
               conflict: "ON CONFLICT (\(keyColumns.joined(separator: ", "))) DO UPDATE SET \(column) = \(table).\(column) + excluded.\(column)")
    }

    /// `UPDATE table SET assignments WHERE keyColumn = ?`.
    public static func update(_ table: String, set assignments: [String], keyColumn: String) -> String {
        "UPDATE \(table) SET \(assignments.joined(separator: ", ")) WHERE \(keyColumn) = ?"
    }

    /// `INSERT INTO table (columns) VALUES (?, …), … conflict` for `rows` rows.
    public static func insert(into table: String, columns: [String], rows: Int, conflict: String) -> String {
        let row = "(" + Array(repeating: "?", count: columns.count).joined(separator: ", ") + ")"
        return "INSERT INTO \(table) (\(columns.joined(separator: ", "))) VALUES " + Array(repeating: row, count: rows).joined(separator: ", ")
            + (conflict.isEmpty ? "" : " " + conflict)
    }
}

extension SQLConnection {
    /// Runs the statements one after the other (databases without pipelining).
    public func query(together statements: [SQLStatement]) throws -> [[SQLRow]] {
        try statements.map { try query($0.sql, $0.parameters) }
    }

    /// Inserts the row now (databases without pipelining).
    public func append(into table: String, columns: [String], values: [any SQLBindable], conflict: String) throws {
        try run(SQLStatement.insert(into: table, columns: columns, rows: 1, conflict: conflict), values)
    }

    /// Inserts the row now and fails with `orElse` when it was not written (databases without pipelining).
    public func append(into table: String, columns: [String], values: [any SQLBindable], conflict: String, returning key: String,
                       orElse: any Error) throws {
        try run(SQLStatement.insert(into: table, columns: columns, rows: 1, conflict: conflict) + " RETURNING \(key)", values, orElse: orElse)
    }

    /// Changes the row now (databases without pipelining).
    public func update(_ table: String, set assignments: [String], values: [any SQLBindable], keyColumn: String, key: any SQLBindable) throws {
        try run(SQLStatement.update(table, set: assignments, keyColumn: keyColumn), values + [key])
    }

    /// Adds to the row now (databases without pipelining).
    public func add(_ amount: Int64, to column: String, of table: String, keyColumns: [String], key: [any SQLBindable]) throws {
        try run(SQLStatement.addition(to: column, of: table, keyColumns: keyColumns, rows: 1), key + [amount])
    }

    /// Adds one row to a log-like table, with no conflict clause.
    public func append(into table: String, columns: [String], values: [any SQLBindable]) throws {
        try append(into: table, columns: columns, values: values, conflict: "")
    }

    /// One writer at a time: every transaction can use the same row.
    public var shard: Int64 { 0 }

    /// Runs the statement now (databases without pipelining).
    public func run(_ sql: String, _ parameters: [any SQLBindable], orElse: (any Error)?) throws {
        let rows = try query(sql, parameters)
        if rows.isEmpty, let orElse { throw orElse }
    }

    /// A statement whose rows the caller does not read, with no expectation on them.
    public func run(_ sql: String, _ parameters: [any SQLBindable] = []) throws {
        try run(sql, parameters, orElse: nil)
    }

    /// Runs one statement without parameters.
    @discardableResult
    public func query(_ sql: String) throws -> [SQLRow] { try query(sql, []) }
}

/// A relational database: the embedded SQLite default or PostgreSQL.
public protocol SQLDatabase: Sendable {
    /// Which SQL flavour it speaks.
    var dialect: SQLDialect { get }
    /// Runs `body` in one transaction on a connection the database owns; commits unless it throws.
    func transaction<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T
    /// Runs `body`, which only reads, at the least cost: a transaction on SQLite (one snapshot); on PostgreSQL no
    /// BEGIN and COMMIT, each round trip its own implicit transaction (under READ COMMITTED every statement sees
    /// its own snapshot either way). Never for writes: on PostgreSQL they would commit one round trip at a time.
    func read<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T
    /// Runs `body`, which only reads and may read for long (a report over years, a list over a whole table), as `read`
    /// does; on SQLite one at a time on a connection of its own, so that short reads never wait behind it.
    func longRead<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T
    /// Statements to run (outside a transaction) when other processes should be woken, e.g. NOTIFY.
    func notify(_ channel: String) async
    /// Waits until another process notifies `channel` or `timeout` passes (on SQLite: the timeout).
    func wait(for channel: String, timeout: Duration) async
    /// Closes connections.
    func close() async
    /// Connections in use and idle, for a database with a pool (nil for one without).
    var poolStatistics: (inUse: Int, idle: Int, waiting: Int)? { get }
    /// Seconds the only writer has spent in transactions since the database was opened (SQLite; nil for a database
    /// with many writers): its rate is the share of the writer in use, which bounds what one process writes.
    var writerBusySeconds: Double? { get }
}

extension SQLDatabase {
    public var poolStatistics: (inUse: Int, idle: Int, waiting: Int)? { nil }
    public var writerBusySeconds: Double? { nil }

    public func read<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T {
        try await transaction(body)
    }

    public func longRead<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T {
        try await read(body)
    }

    /// Runs `body`, which only reads, with several statements that must see one state of the database (a page merged
    /// from several queries): on SQLite `longRead`, one transaction on a connection of its own; on PostgreSQL a
    /// read-only REPEATABLE READ transaction, where `read` and `longRead` give each statement a snapshot of its own.
    public func snapshotRead<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T {
        guard dialect == .postgres else { return try await longRead(body) }
        return try await transaction { db in
            try db.query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            return try body(db)
        }
    }
}

/// A schema migration: an ordered list of statements identified by a version.
public struct SQLMigration: Sendable {
    public let version: Int
    public let statements: [String]
    /// The only engine the statements are for (a storage setting one engine has): the others record the version
    /// and run nothing. Nil for every engine.
    public let dialect: SQLDialect?
    public init(version: Int, statements: [String], dialect: SQLDialect? = nil) {
        self.version = version
        self.statements = statements
        self.dialect = dialect
    }
}

extension SQLDatabase {
    /// The advisory lock migrations hold on PostgreSQL: any constant no other lock of the database uses ("storeke" in ASCII).
    static var migrationLock: Int64 { 0x73_746f_7265_6b65 }

    /// Applies migrations not yet recorded in `schema_migrations`, each in its own transaction. Processes starting at
    /// once take turns at each (PostgreSQL: an advisory lock): the next one finds it recorded, where running the same
    /// statements side by side could fail (`CREATE TABLE IF NOT EXISTS` in two transactions: a duplicate key in the
    /// catalog) and stop a process from starting.
    public func migrate(_ migrations: [SQLMigration]) async throws {
        _ = try await transaction { db in
            if self.dialect == .postgres { try db.query("SELECT pg_advisory_xact_lock(?)", [Self.migrationLock]) }
            try db.query("CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)")
        }
        for migration in migrations.sorted(by: { $0.version < $1.version }) {
            try await transaction { db in
                if self.dialect == .postgres { try db.query("SELECT pg_advisory_xact_lock(?)", [Self.migrationLock]) }
                let done = try db.query("SELECT version FROM schema_migrations WHERE version = ?", [migration.version])
                guard done.isEmpty else { return }
                if migration.dialect == nil || migration.dialect == self.dialect {
                    for statement in migration.statements { try db.query(statement) }
                }
                try db.query("INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?) ON CONFLICT DO NOTHING",
                             [migration.version, Int64(Date().timeIntervalSince1970 * 1000)])
            }
        }
    }
}
