import Storage

/// Rows a transaction inserts or changes one at a time, gathered so that each table's rows of one shape are written
/// with one statement: a multi-row `INSERT`, or an `UPDATE … FROM (VALUES …)` for rows changed by their key. A value:
/// the connection decides when to take them (before a statement that names the table, before the commit), and the
/// order of a table's writes is kept (a change of another shape starts a new group after the ones before it). The
/// table must not be changed by anything that does not name it (no trigger, foreign key or view reaches it): the
/// server's schema has none.
///
/// Within a group, rows under a conflict clause and changed rows are written in key order (their first values), so
/// that two transactions writing overlapping rows lock them in the same order; other inserts keep their order.
struct GatheredWrites {
    /// One statement's worth of gathered writes: its SQL with `?` placeholders, its parameters, and for rows that must
    /// be written the key each row's insert returns, with its error.
    struct Statement {
        var sql: String
        var texts: [String?]
        var mustWrite: [(key: String?, error: any Error)]?
    }

    private enum Shape: Equatable {
        /// `INSERT INTO table (columns) VALUES … conflict`, returning `key` when rows must be written.
        case insert(columns: [String], conflict: String, key: String?)
        /// `UPDATE table SET assignments WHERE keyColumn = ?`, each assignment with its own `?` placeholders.
        case update(assignments: [String], keyColumn: String)
        /// `INSERT INTO table (keyColumns, column) VALUES … ON CONFLICT (keyColumns) DO UPDATE SET column = column + …`,
        /// one row per key with the amounts added to it summed.
        case add(keyColumns: [String], column: String)

        /// Whether its rows are written in key order: they may wait on rows other transactions write.
        var locksInKeyOrder: Bool {
            switch self {
            case .insert(_, let conflict, _): return !conflict.isEmpty
            case .update, .add: return true
            }
        }
    }

    private struct Group {
        let table: String
        let shape: Shape
        var rows: [[String?]] = []
        var errors: [any Error] = []
        /// Rows inserted under a conflict clause (identical ones are written once); keys of rows changed.
        var seen: Set<[String?]> = []
        /// For additions: each key's row.
        var rowOfKey: [[String?]: Int] = [:]
    }

    private var groups: [Group] = []

    /// Rows per multi-row statement, at most; fewer for wide rows (PostgreSQL takes at most 65,535 parameters).
    static let maxRowsPerStatement = 500
    static let maxParameters = 65_535

    var isEmpty: Bool { groups.isEmpty }

    /// Gathers a row to insert; identical rows under a conflict clause once. With `mustWrite`, the insert returns the
    /// row's `key` column, and the row fails with `orElse` when its key does not come back.
    mutating func insert(into table: String, columns: [String], row: [String?], conflict: String,
                         mustWrite: (key: String, orElse: any Error)?) throws {
        if let key = mustWrite?.key {
            guard let column = columns.firstIndex(of: key), row.indices.contains(column), row[column] != nil else {
                throw PostgresError.make("query_failed", "a row that must be written into \(table) needs a value for \(key)")
            }
        }
        let index = group(table, .insert(columns: columns, conflict: conflict, key: mustWrite?.key))
        // Under a conflict clause a repeated row changes nothing (DO NOTHING skips it; DO UPDATE would fail the statement).
        if !conflict.isEmpty, !groups[index].seen.insert(row).inserted { return }
        groups[index].rows.append(row)
        if let mustWrite { groups[index].errors.append(mustWrite.orElse) }
    }

    /// Gathers a change of the row whose `keyColumn` is `key`: `values` fill the assignments' `?` placeholders in
    /// order. A row changed twice is written twice, in order.
    mutating func update(_ table: String, set assignments: [String], values: [String?], keyColumn: String, key: String?) throws {
        // Placeholders are found by their `?`: an assignment with a quoted literal (which might hold one) is refused.
        guard !assignments.contains(where: { $0.contains("'") || $0.contains("\"") }),
              assignments.reduce(0, { $0 + $1.count { $0 == "?" } }) == values.count else {
            throw PostgresError.make("query_failed", "the change of \(table) needs unquoted assignments and a value for each placeholder")
        }
        var index = group(table, .update(assignments: assignments, keyColumn: keyColumn))
        if groups[index].seen.contains([key]) {
            groups.append(Group(table: table, shape: groups[index].shape))
            index = groups.count - 1
        }
        groups[index].seen.insert([key])
        groups[index].rows.append([key] + values)
    }

    /// Gathers an addition of `amount` to `column` of the row whose `keyColumns` are `key` (a new row holds `amount`).
    /// Additions to one row are summed; a sum past 64 bits is refused.
    mutating func add(_ amount: Int64, to column: String, of table: String, keyColumns: [String], key: [String?]) throws {
        guard keyColumns.count == key.count, !keyColumns.isEmpty else {
            throw PostgresError.make("query_failed", "an addition to \(table) needs a value for each key column")
        }
        let index = group(table, .add(keyColumns: keyColumns, column: column))
        guard let row = groups[index].rowOfKey[key] else {
            groups[index].rowOfKey[key] = groups[index].rows.count
            groups[index].rows.append(key + [String(amount)])
            return
        }
        let (sum, overflow) = (Int64(groups[index].rows[row][key.count] ?? "") ?? 0).addingReportingOverflow(amount)
        guard !overflow else { throw PostgresError.make("query_failed", "the additions to a row of \(table) overflow") }
        groups[index].rows[row][key.count] = String(sum)
    }

    /// The group for `table` and `shape`: the table's last group when it has that shape, else a new one after it.
    private mutating func group(_ table: String, _ shape: Shape) -> Int {
        if let last = groups.lastIndex(where: { $0.table == table }), groups[last].shape == shape { return last }
        groups.append(Group(table: table, shape: shape))
        return groups.count - 1
    }

    /// Takes the statements for the tables `sql` names (every table for nil), in the order they were first gathered.
    mutating func take(namedIn sql: String?) -> [Statement] {
        var statements: [Statement] = []
        var kept: [Group] = []
        for group in groups {
            guard sql.map({ $0.contains(group.table) }) ?? true else {
                kept.append(group)
                continue
            }
            var group = group
            if group.shape.locksInKeyOrder {
                let order = group.rows.indices.sorted { Self.precedes(group.rows[$0], group.rows[$1]) }
                group.rows = order.map { group.rows[$0] }
                if !group.errors.isEmpty { group.errors = order.map { group.errors[$0] } }
            }
            let perStatement = max(1, min(Self.maxRowsPerStatement, Self.maxParameters / max(1, group.rows.first?.count ?? 1)))
            for start in stride(from: 0, to: group.rows.count, by: perStatement) {
                let range = start..<min(start + perStatement, group.rows.count)
                statements.append(Self.statement(group, rows: group.rows[range], errors: group.errors.isEmpty ? nil : group.errors[range]))
            }
        }
        groups = kept
        return statements
    }

    /// Rows in the order of their values (NULL first), compared as PostgreSQL's "C" collation would, byte by byte.
    private static func precedes(_ left: [String?], _ right: [String?]) -> Bool {
        for (a, b) in zip(left, right) where a != b {
            guard let a else { return true }
            guard let b else { return false }
            return a.utf8.lexicographicallyPrecedes(b.utf8)
        }
        return left.count < right.count
    }

    private static func statement(_ group: Group, rows: ArraySlice<[String?]>, errors: ArraySlice<any Error>?) -> Statement {
        let texts = Array(rows.joined())
        switch group.shape {
        case .insert(let columns, let conflict, let key):
            var sql = SQLStatement.insert(into: group.table, columns: columns, rows: rows.count, conflict: conflict)
            guard let key, let keyColumn = columns.firstIndex(of: key), let errors else { return Statement(sql: sql, texts: texts) }
            sql += " RETURNING \(key)"
            return Statement(sql: sql, texts: texts, mustWrite: zip(rows, errors).map { ($0[keyColumn], $1) })
        case .add(let keyColumns, let column):
            return Statement(sql: SQLStatement.addition(to: column, of: group.table, keyColumns: keyColumns, rows: rows.count), texts: texts)
        case .update(let assignments, let keyColumn):
            // `UPDATE t SET a = v.c1, … FROM (VALUES (?, ?, …), …) AS v (c0, c1, …) WHERE t.key = v.c0`: the values are
            // text, so an assignment to another type casts its placeholder (`CAST(? AS BIGINT)`), as the caller wrote it.
            var column = 0
            let set = assignments.map { assignment in
                assignment.split(separator: "?", omittingEmptySubsequences: false).enumerated().map { index, part in
                    guard index > 0 else { return String(part) }
                    column += 1
                    return "v.c\(column)" + part
                }.joined()
            }
            let width = column + 1
            let tuple = "(" + Array(repeating: "?", count: width).joined(separator: ", ") + ")"
            let sql = "UPDATE \(group.table) SET \(set.joined(separator: ", ")) FROM (VALUES "
                + Array(repeating: tuple, count: rows.count).joined(separator: ", ")
                + ") AS v (\((0..<width).map { "c\($0)" }.joined(separator: ", "))) WHERE \(group.table).\(keyColumn) = v.c0"
            return Statement(sql: sql, texts: texts)
        }
    }
}
