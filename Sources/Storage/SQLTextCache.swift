/// The SQL texts of `SQLConnection`'s row writes (`append`, `update`, `add`), kept by the parts they are made from.
///
/// A settlement writes dozens of rows through a handful of shapes. SQLite writes each row at once, and making its text
/// again from the parts every time cost more of the server than running the statement (2.8% of its samples against
/// 1.8% at 1,500 receipts/s, `bench/README.md`). Not thread-safe: each owner (an SQLite connection, used on its own
/// queue) keeps one. Shapes come from the program, not from input; the cache is emptied if it ever passes `limit`.
public struct SQLTextCache {
    private enum Kind: UInt8 { case insert, update, addition }

    private struct Shape: Hashable {
        let kind: Kind
        let table: String
        let columns: [String]
        let clause: String

        // The table and the lengths only: strings from one call site compare equal at once (same storage), and a
        // table's few shapes rarely share both lengths.
        func hash(into hasher: inout Hasher) {
            hasher.combine(kind)
            hasher.combine(table)
            hasher.combine(columns.count)
            hasher.combine(clause.utf8.count)
        }
    }

    public static let limit = 512
    private var texts: [Shape: String] = [:]

    public init() {}

    public var count: Int { texts.count }

    /// `SQLStatement.insert(into:columns:rows: 1, conflict:)`.
    public mutating func insert(into table: String, columns: [String], conflict: String) -> String {
        text(Shape(kind: .insert, table: table, columns: columns, clause: conflict)) {
            SQLStatement.insert(into: table, columns: columns, rows: 1, conflict: conflict)
        }
    }

    /// `UPDATE table SET assignments WHERE keyColumn = ?`.
    public mutating func update(_ table: String, set assignments: [String], keyColumn: String) -> String {
        text(Shape(kind: .update, table: table, columns: assignments, clause: keyColumn)) {
            SQLStatement.update(table, set: assignments, keyColumn: keyColumn)
        }
    }

    /// `SQLStatement.addition(to:of:keyColumns:rows: 1)`.
    public mutating func addition(to column: String, of table: String, keyColumns: [String]) -> String {
        text(Shape(kind: .addition, table: table, columns: keyColumns, clause: column)) {
            SQLStatement.addition(to: column, of: table, keyColumns: keyColumns, rows: 1)
        }
    }

    private mutating func text(_ shape: Shape, _ make: () -> String) -> String {
        if let text = texts[shape] { return text }
        let text = make()
        if texts.count >= Self.limit { texts.removeAll() }
        texts[shape] = text
        return text
    }
}
