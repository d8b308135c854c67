import CLibPQ
import Foundation
import Storage
import Synchronization

/// One libpq connection with the serial queue that owns it: every call on the handle runs on that
/// queue, so blocking network I/O never happens on the cooperative thread pool.
// The handle is only touched on `queue`, which is what makes sharing the object safe.
final class PostgresConnection: @unchecked Sendable {
    let handle: OpaquePointer
    let queue: DispatchQueue
    /// The connection's number for spreading counters (`SQLConnection.shard`): a process numbers its connections in
    /// turn from a random start, so its pool's share none below 64, and other processes' meet them only by chance.
    let shard: Int64
    private static let shards = Atomic<Int>(Int.random(in: 0 ..< 64))
    /// Statements prepared on this connection (SQL → name): parsed and planned once, not per call.
    private var prepared: [String: String] = [:]
    private static let maxPrepared = 256
    /// Statements with more parameters are `IN` lists and multi-row inserts and updates whose size varies: each is planned for
    /// its values (PostgreSQL's unnamed statement), and none fills the cache.
    static let maxPreparedParameters = 32
    /// How long prepared statements are kept before they are prepared again. PostgreSQL keeps a statement's generic
    /// plan until the table's statistics change; one chosen while a table was nearly empty (a sequential scan) would
    /// otherwise stay while it grows, for as long as autovacuum takes to analyze it.
    static let planLifetime: Duration = .seconds(30)
    private var preparedSince = ContinuousClock.now

    init(url: String, label: String) throws {
        guard let handle = PQconnectdb(url) else { throw PostgresError.make("connect_failed", "cannot allocate a connection") }
        guard PQstatus(handle) == CONNECTION_OK else {
            let message = String(cString: PQerrorMessage(handle)).trimmingCharacters(in: .whitespacesAndNewlines)
            PQfinish(handle)
            throw PostgresError.make("connect_failed", "cannot connect to PostgreSQL: \(message)")
        }
        self.handle = handle
        queue = DispatchQueue(label: label)
        shard = Int64(UInt(bitPattern: Self.shards.wrappingAdd(1, ordering: .relaxed).oldValue) % 64)
        _ = try? execute("SET client_min_messages TO WARNING", [])
    }

    deinit { PQfinish(handle) }

    /// Statements held for the next round trip (`enqueue`), in order.
    private var pending: [Pending] = []
    private struct Pending {
        let sql: String
        let texts: [String?]
        var expectation: Expectation? = nil
    }
    /// What only this side can check of a statement's rows.
    private enum Expectation {
        /// At least one row, else this error.
        case someRow(any Error)
        /// Each of these keys among the rows' first column, else the error of the first one missing.
        case everyKey([(key: String?, error: any Error)])

        /// The error of a statement that returned no rows at all.
        var withoutRows: (any Error)? {
            switch self {
            case .someRow(let error): return error
            case .everyKey(let expected): return expected.first?.error
            }
        }

        func failure(_ result: OpaquePointer) -> (any Error)? {
            switch self {
            case .someRow(let error):
                return PQntuples(result) == 0 ? error : nil
            case .everyKey(let expected):
                // Counted, so that two rows with one key are both accounted for only if both came back.
                var returned: [String: Int] = [:]
                for row in 0..<PQntuples(result) where PQgetisnull(result, row, 0) == 0 {
                    returned[String(cString: PQgetvalue(result, row, 0)), default: 0] += 1
                }
                for (key, error) in expected {
                    guard let key, let count = returned[key], count > 0 else { return error }
                    returned[key] = count - 1
                }
                return nil
            }
        }
    }
    /// Rows inserted (`append`) and changed (`update`) one at a time, written a table at a time.
    private var gathered = GatheredWrites()

    /// Statements sent per pipeline sync: their results are small, so neither side's socket buffer fills while
    /// the other is still writing.
    static let maxPipeline = 256

    /// Runs SQL with `?` placeholders (rewritten to `$n`), parameters sent as text; statements held by `enqueue`
    /// run first, in the same round trip.
    func execute(_ sql: String, _ parameters: [SQLValue]) throws -> [SQLRow] {
        try execute(together: [(sql, parameters)])[0]
    }

    /// Holds a statement whose rows are not read, to send with others in one round trip (`flush`).
    func enqueue(_ sql: String, _ parameters: [SQLValue], orElse: (any Error)? = nil) throws {
        holdGathered(namedIn: sql)
        pending.append(Pending(sql: sql, texts: parameters.map(Self.text), expectation: orElse.map(Expectation.someRow)))
        if pending.count >= Self.maxPipeline { try flush() }
    }

    /// Sends the held statements in one pipeline and reads their results: one round trip for all of them. The
    /// first failure is thrown (PostgreSQL skips the statements after it); a statement held with an expectation on
    /// its rows (`orElse`, a row that must be written) that it did not meet throws that expectation's error.
    func flush() throws {
        guard !pending.isEmpty else { return }
        let batch = pending
        pending = []
        _ = try pipeline(batch, keepRows: false)
    }

    /// Runs independent statements in one round trip (after the held ones) and returns each one's rows.
    func execute(together statements: [(sql: String, parameters: [SQLValue])]) throws -> [[SQLRow]] {
        for statement in statements { holdGathered(namedIn: statement.sql) }
        // The held statements and these in one round trip.
        let batch = pending + statements.map { Pending(sql: $0.sql, texts: $0.parameters.map(Self.text)) }
        pending = []
        let rows = try pipeline(batch, keepRows: true)
        guard rows.count >= statements.count else { throw connectionError() }
        return Array(rows.suffix(statements.count))
    }

    /// Sends `batch` in pipeline mode with one sync and reads every result: the rows of each (when `keepRows`), or
    /// the first failure.
    private func pipeline(_ batch: [Pending], keepRows: Bool) throws -> [[SQLRow]] {
        var names: [String?] = []
        names.reserveCapacity(batch.count)
        for item in batch {
            try Self.refuseNUL(item.texts)
            names.append(try preparedName(for: item.sql, parameterCount: item.texts.count))
        }
        guard PQenterPipelineMode(handle) == 1 else { throw connectionError() }
        // A pipeline that cannot be left still holds results nobody read: the session starts again.
        defer { if PQexitPipelineMode(handle) != 1 { reset() } }
        var failure: (any Error)?
        var sent = 0
        for (item, name) in zip(batch, names) {
            let accepted = withCStrings(item.texts) { pointers in
                if let name {
                    PQsendQueryPrepared(handle, name, Int32(item.texts.count), pointers, nil, nil, 0)
                } else {
                    PQsendQueryParams(handle, Self.numberPlaceholders(item.sql), Int32(item.texts.count), nil, pointers, nil, nil, 0)
                }
            }
            guard accepted == 1 else {
                failure = connectionError()
                break
            }
            sent += 1
        }
        guard PQpipelineSync(handle) == 1 else { throw failure ?? connectionError() }
        var rows: [[SQLRow]] = []
        for item in batch.prefix(sent) {
            // Each statement's result, then a NULL that ends it.
            var answered = false
            while let result = PQgetResult(handle) {
                defer { PQclear(result) }
                answered = true
                guard failure == nil else { continue }
                switch PQresultStatus(result) {
                case PGRES_COMMAND_OK, PGRES_EMPTY_QUERY:
                    if let expectation = item.expectation { failure = expectation.withoutRows }
                    if keepRows { rows.append([]) }
                case PGRES_TUPLES_OK:
                    if let expectation = item.expectation { failure = expectation.failure(result) }
                    if keepRows { rows.append(Self.rows(of: result)) }
                case PGRES_PIPELINE_ABORTED:
                    break
                default:
                    failure = Self.error(result)
                }
            }
            if !answered && failure == nil { failure = connectionError() }
        }
        // The sync's own result closes the pipeline.
        while let result = PQgetResult(handle) {
            let status = PQresultStatus(result)
            PQclear(result)
            if status == PGRES_PIPELINE_SYNC { break }
        }
        if let failure { throw failure }
        return rows
    }

    /// PostgreSQL's text holds no NUL, and libpq takes parameters as C strings: a NUL would cut the value there without
    /// a word, so a statement with one fails instead.
    static func refuseNUL(_ texts: [String?]) throws {
        for case let text? in texts where text.containsNUL {
            throw PostgresError.make("text_with_nul", "PostgreSQL text cannot hold a NUL character (U+0000)")
        }
    }

    private static func rows(of result: OpaquePointer) -> [SQLRow] {
        let columnCount = PQnfields(result)
        let columns = (0..<columnCount).map { String(cString: PQfname(result, $0)) }
        var rows: [SQLRow] = []
        rows.reserveCapacity(Int(PQntuples(result)))
        for row in 0..<PQntuples(result) {
            var values: [SQLValue] = []
            values.reserveCapacity(Int(columnCount))
            for column in 0..<columnCount {
                if PQgetisnull(result, row, column) == 1 {
                    values.append(.null)
                } else {
                    values.append(.text(String(cString: PQgetvalue(result, row, column))))
                }
            }
            rows.append(SQLRow(columns: columns, values: values))
        }
        return rows
    }

    /// Sends whatever a body run without BEGIN left held (`read`: nothing, as it only reads).
    func finishWithoutCommit() throws {
        holdGathered(namedIn: nil)
        try flush()
    }

    /// Commits the transaction. COMMIT travels with the held statements, unless one of them carries an expectation
    /// that only this side can check (`orElse`, rows that must be written): those are sent and checked first, so a
    /// failed one is rolled back.
    func commit() throws {
        holdGathered(namedIn: nil)
        if pending.contains(where: { $0.expectation != nil }) { try flush() }
        try enqueue("COMMIT", [])
        try flush()
    }

    /// Gathers a row for a multi-row insert (identical rows once); with `mustWrite`, a row that must be written: the
    /// insert returns its key column, and a row whose key does not come back fails with its `orElse`.
    func append(into table: String, columns: [String], values: [SQLValue], conflict: String,
                mustWrite: (key: String, orElse: any Error)? = nil) throws {
        try gathered.insert(into: table, columns: columns, row: values.map(Self.text), conflict: conflict, mustWrite: mustWrite)
    }

    /// Gathers an addition to one row's column, for a multi-row upsert (additions to one row summed).
    func add(_ amount: Int64, to column: String, of table: String, keyColumns: [String], key: [SQLValue]) throws {
        try gathered.add(amount, to: column, of: table, keyColumns: keyColumns, key: key.map(Self.text))
    }

    /// Gathers a change of one row, found by its key, for a multi-row `UPDATE`.
    func update(_ table: String, set assignments: [String], values: [SQLValue], keyColumn: String, key: SQLValue) throws {
        try gathered.update(table, set: assignments, values: values.map(Self.text), keyColumn: keyColumn, key: Self.text(key))
    }

    /// Turns the gathered rows of the tables `sql` names (all of them for nil) into held statements.
    private func holdGathered(namedIn sql: String?) {
        guard !gathered.isEmpty else { return }
        for statement in gathered.take(namedIn: sql) {
            pending.append(Pending(sql: statement.sql, texts: statement.texts, expectation: statement.mustWrite.map(Expectation.everyKey)))
        }
    }

    /// Drops held statements after the transaction's body failed; false when none of the transaction reached the
    /// server (its BEGIN is still held), so there is nothing to roll back.
    func discardPending() -> Bool {
        let started = pending.first?.sql != "BEGIN"
        pending = []
        gathered = GatheredWrites()
        return started
    }

    private func connectionError() -> StorageError {
        PostgresError.make("query_failed", String(cString: PQerrorMessage(handle)).trimmingCharacters(in: .whitespacesAndNewlines))
    }

    private static func text(_ value: SQLValue) -> String? {
        switch value {
        case .null: return nil
        case .integer(let value): return String(value)
        case .text(let value): return value
        }
    }

    private static func error(_ result: OpaquePointer) -> StorageError {
        let message = String(cString: PQresultErrorMessage(result)).trimmingCharacters(in: .whitespacesAndNewlines)
        let state = PQresultErrorField(result, Int32(UInt8(ascii: "C"))).map { String(cString: $0) } ?? ""
        return PostgresError.make(state == "23505" ? "unique_violation" : "query_failed", message)
    }

    /// The prepared statement's name for a data statement, preparing it on first use; nil for
    /// schema changes and once the cache is full (those run unprepared).
    private func preparedName(for sql: String, parameterCount: Int) throws -> String? {
        if let name = prepared[sql] { return name }
        let verb = sql.prefix(7).uppercased()
        guard prepared.count < Self.maxPrepared, parameterCount <= Self.maxPreparedParameters,
              ["SELECT", "INSERT", "UPDATE", "DELETE", "WITH"].contains(where: { verb.hasPrefix($0) }) else { return nil }
        let name = "sk_\(prepared.count + 1)"
        guard let result = PQprepare(handle, name, Self.numberPlaceholders(sql), Int32(parameterCount), nil) else {
            throw PostgresError.make("query_failed", String(cString: PQerrorMessage(handle)))
        }
        defer { PQclear(result) }
        guard PQresultStatus(result) == PGRES_COMMAND_OK else {
            // The statement's own error (a prepare failure aborts the transaction, so there is no running it unprepared).
            throw PostgresError.make("query_failed", String(cString: PQresultErrorMessage(result)).trimmingCharacters(in: .whitespacesAndNewlines))
        }
        prepared[sql] = name
        return name
    }

    /// Connected, out of pipeline mode and outside a transaction: ready for the next one.
    var isHealthy: Bool {
        PQstatus(handle) == CONNECTION_OK && PQpipelineStatus(handle) == PQ_PIPELINE_OFF && PQtransactionStatus(handle) == PQTRANS_IDLE
    }

    /// Drops the prepared statements once they are older than `planLifetime` (before a transaction begins): they
    /// are prepared again on their next use, and planned against the tables as they are now.
    func refreshPlansIfStale() {
        guard !prepared.isEmpty, ContinuousClock.now - preparedSince > Self.planLifetime else { return }
        if (try? execute("DEALLOCATE ALL", [])) != nil {
            prepared = [:]
            preparedSince = ContinuousClock.now
        }
    }

    func reset() {
        PQreset(handle)
        prepared = [:]  // a new session has none
        preparedSince = ContinuousClock.now
        pending = []
        gathered = GatheredWrites()
    }

    /// `?` → `$1, $2, …` outside quoted strings.
    static func numberPlaceholders(_ sql: String) -> String {
        var output: [UInt8] = []
        output.reserveCapacity(sql.utf8.count + 64)
        var index = 0
        var inQuote = false
        for byte in sql.utf8 {
            if byte == UInt8(ascii: "'") { inQuote.toggle() }
            if byte == UInt8(ascii: "?") && !inQuote {
                index += 1
                output.append(UInt8(ascii: "$"))
                output.append(contentsOf: String(index).utf8)
            } else {
                output.append(byte)
            }
        }
        return String(decoding: output, as: UTF8.self)
    }
}

/// Calls `body` with C string pointers for optional Swift strings (nil stays NULL).
private func withCStrings<R>(_ strings: [String?], _ body: ([UnsafePointer<CChar>?]) -> R) -> R {
    var pointers: [UnsafeMutablePointer<CChar>?] = strings.map { $0.map { strdup($0) } ?? nil }
    defer { for pointer in pointers { free(pointer) } }
    return pointers.withUnsafeMutableBufferPointer { buffer in
        body(buffer.map { $0.map { UnsafePointer($0) } })
    }
}

enum PostgresError {
    static func make(_ code: String, _ message: String) -> StorageError { StorageError(code: code, message: message) }
}

/// Adapts a pooled connection to `SQLConnection` inside a transaction.
struct PostgresTransactionConnection: SQLConnection {
    let connection: PostgresConnection

    var shard: Int64 { connection.shard }

    func query(_ sql: String, _ parameters: [any SQLBindable]) throws -> [SQLRow] {
        try connection.execute(sql, parameters.map(\.sqlValue))
    }

    func run(_ sql: String, _ parameters: [any SQLBindable], orElse: (any Error)?) throws {
        try connection.enqueue(sql, parameters.map(\.sqlValue), orElse: orElse)
    }

    func query(together statements: [SQLStatement]) throws -> [[SQLRow]] {
        try connection.execute(together: statements.map { ($0.sql, $0.parameters.map(\.sqlValue)) })
    }

    func append(into table: String, columns: [String], values: [any SQLBindable], conflict: String) throws {
        try connection.append(into: table, columns: columns, values: values.map(\.sqlValue), conflict: conflict)
    }

    func append(into table: String, columns: [String], values: [any SQLBindable], conflict: String, returning key: String,
                orElse: any Error) throws {
        try connection.append(into: table, columns: columns, values: values.map(\.sqlValue), conflict: conflict, mustWrite: (key, orElse))
    }

    func add(_ amount: Int64, to column: String, of table: String, keyColumns: [String], key: [any SQLBindable]) throws {
        try connection.add(amount, to: column, of: table, keyColumns: keyColumns, key: key.map(\.sqlValue))
    }

    func update(_ table: String, set assignments: [String], values: [any SQLBindable], keyColumn: String, key: any SQLBindable) throws {
        try connection.update(table, set: assignments, values: values.map(\.sqlValue), keyColumn: keyColumn, key: key.sqlValue)
    }
}
