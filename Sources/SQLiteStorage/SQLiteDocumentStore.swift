import Foundation
import Storage

/// The embedded default `DocumentStore`: one SQLite file in WAL mode.
public final class SQLiteDocumentStore: DocumentStore {
    let database: SQLiteDatabase

    /// Opens or creates the store at `path`.
    public init(path: String) throws {
        database = try SQLiteDatabase(path: path)
        try database.runSync { db in
            try db.execute("""
            CREATE TABLE IF NOT EXISTS documents (
                collection TEXT NOT NULL,
                id TEXT NOT NULL,
                body BLOB NOT NULL,
                PRIMARY KEY (collection, id)
            ) WITHOUT ROWID
            """)
        }
    }

    public func apply(_ writes: [DocumentWrite]) async throws {
        guard !writes.isEmpty else { return }
        try await database.run { db in
            try db.execute("BEGIN IMMEDIATE")
            do {
                for write in writes {
                    switch write {
                    case .put(let collection, let id, let body):
                        try db.query("INSERT OR REPLACE INTO documents (collection, id, body) VALUES (?, ?, ?)", [.text(collection), .text(id), .blob(body)])
                    case .delete(let collection, let id):
                        try db.query("DELETE FROM documents WHERE collection = ? AND id = ?", [.text(collection), .text(id)])
                    }
                }
                try db.execute("COMMIT")
            } catch {
                try? db.execute("ROLLBACK")
                throw error
            }
        }
    }

    public func documents(in collection: String) async throws -> [StoredDocument] {
        try await database.run { db in
            try db.query("SELECT id, body FROM documents WHERE collection = ? ORDER BY id", [.text(collection)]).compactMap { row in
                guard case .text(let id) = row[0] else { return nil }
                switch row[1] {
                case .blob(let body): return StoredDocument(id: id, body: body)
                case .text(let text): return StoredDocument(id: id, body: Data(text.utf8))
                default: return nil
                }
            }
        }
    }

    public func document(in collection: String, id: String) async throws -> Data? {
        try await database.run { db in
            guard let row = try db.query("SELECT body FROM documents WHERE collection = ? AND id = ?", [.text(collection), .text(id)]).first else { return nil }
            if case .blob(let body) = row[0] { return body }
            if case .text(let text) = row[0] { return Data(text.utf8) }
            return nil
        }
    }
}
