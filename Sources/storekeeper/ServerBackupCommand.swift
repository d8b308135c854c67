import Foundation
import SQLiteStorage

/// `storekeeper server backup`
struct ServerBackupCommand: Command {
    static let abstract = "Copy the SQLite database into a new file, consistently, while the server runs (PostgreSQL: use pg_dump)."
    static let help = """
    FILE [--data DIR]

      --data DIR   The server's data directory (default ./.storekeeper); the database is DIR/server.sqlite.

    Secrets in the copy stay sealed with the master key (DIR/master-key or STOREKEEPER_MASTER_KEY): keep that key apart from the backups.
    """
    let file: String
    let data: String

    init(_ arguments: inout Arguments) throws {
        data = try arguments.option("data") ?? "./.storekeeper"
        file = try arguments.single("FILE")
    }

    func run() async throws {
        let path = URL(fileURLWithPath: data).appendingPathComponent("server.sqlite").path
        guard FileManager.default.fileExists(atPath: path) else { throw CommandFailure(description: "no database at \(path)") }
        try SQLiteDatabase(path: path).backup(to: file)
        say("backed up \(path) to \(file)")
    }
}
