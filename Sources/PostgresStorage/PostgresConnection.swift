import CLibPQ
import Foundation
import Storage

/// One libpq connection with the serial queue that owns it: every call on the handle runs on that
/// queue, so blocking network I/O never happens on the cooperative thread pool.
// The handle is only touched on `queue`, which is what makes sharing the object safe.
final class PostgresConnection: @unchecked Sendable {
    let handle: OpaquePointer
    let queue: DispatchQueue
    /// Statements prepared on this connection (SQL → name): parsed and planned once, not per call.
    private var prepared: [String: String] = [:]
    private static let maxPrepared = 256

    init(url: String, label: String) throws {
        guard let handle = PQconnectdb(url) else { throw PostgresError.make("connect_failed", "cannot allocate a connection") }
        guard PQstatus(handle) == CONNECTION_OK else {
            let message = String(cString: PQerrorMessage(handle)).trimmingCharacters(in: .whitespacesAndNewlines)
            PQfinish(handle)
            throw PostgresError.make("connect_failed", "cannot connect to PostgreSQL: \(message)")
        }
        self.handle = handle
        queue = DispatchQueue(label: label)
        _ = try? execute("SET client_min_messages TO WARNING", [])
    }

    deinit { PQfinish(handle) }

    /// Runs SQL with `?` placeholders (rewritten to `$n`), parameters sent as text.
    func execute(_ sql: String, _ parameters: [SQLValue]) throws -> [SQLRow] {
        let statement = PostgresConnection.numberPlaceholders(sql)
        let texts: [String?] = parameters.map {
            switch $0 {
            case .null: return nil
            case .integer(let value): return String(value)
            case .text(let value): return value
            }
        }
        let name = try preparedName(for: sql, statement: statement, parameterCount: texts.count)
        let result: OpaquePointer? = withCStrings(texts) { pointers in
            if let name {
                PQexecPrepared(handle, name, Int32(texts.count), pointers, nil, nil, 0)
            } else {
                PQexecParams(handle, statement, Int32(texts.count), nil, pointers, nil, nil, 0)
            }
        }
        guard let result else { throw PostgresError.make("query_failed", String(cString: PQerrorMessage(handle))) }
        defer { PQclear(result) }
        switch PQresultStatus(result) {
        case PGRES_COMMAND_OK, PGRES_EMPTY_QUERY:
            return []
        case PGRES_TUPLES_OK:
            let columnCount = PQnfields(result)
            let columns = (0..<columnCount).map { String(cString: PQfname(result, $0)) }
            var rows: [SQLRow] = []
            for row in 0..<PQntuples(result) {
                var values: [SQLValue] = []
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
        default:
            let message = String(cString: PQresultErrorMessage(result)).trimmingCharacters(in: .whitespacesAndNewlines)
            let state = PQresultErrorField(result, Int32(UInt8(ascii: "C"))).map { String(cString: $0) } ?? ""
            throw PostgresError.make(state == "23505" ? "unique_violation" : "query_failed", message)
        }
    }

    /// The prepared statement's name for a data statement, preparing it on first use; nil for
    /// schema changes and once the cache is full (those run unprepared).
    private func preparedName(for sql: String, statement: String, parameterCount: Int) throws -> String? {
        if let name = prepared[sql] { return name }
        let verb = sql.prefix(7).uppercased()
        guard prepared.count < Self.maxPrepared,
              ["SELECT", "INSERT", "UPDATE", "DELETE", "WITH"].contains(where: { verb.hasPrefix($0) }) else { return nil }
        let name = "sk_\(prepared.count + 1)"
        guard let result = PQprepare(handle, name, statement, Int32(parameterCount), nil) else {
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

    var isHealthy: Bool { PQstatus(handle) == CONNECTION_OK }

    func reset() {
        PQreset(handle)
        prepared = [:]  // a new session has none
    }

    /// `?` → `$1, $2, …` outside quoted strings.
    static func numberPlaceholders(_ sql: String) -> String {
        var output = ""
        var index = 0
        var inQuote = false
        for character in sql {
            if character == "'" { inQuote.toggle() }
            if character == "?" && !inQuote {
                index += 1
                output += "$\(index)"
            } else {
                output.append(character)
            }
        }
        return output
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

    func query(_ sql: String, _ parameters: [any SQLBindable]) throws -> [SQLRow] {
        try connection.execute(sql, parameters.map(\.sqlValue))
    }
}
